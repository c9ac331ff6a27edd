"""Standard ``logging`` for servefleet: what the library did not show (a failing info endpoint,
a capacity line it could not read, a garbled SSH batch answer, a fallback taken) is logged, not
swallowed.

Every module logs to ``logging.getLogger(__name__)``; nothing is written until ``configure`` is
called (the CLI calls it), so a library user keeps Python's defaults. Level: ``--verbose`` (DEBUG)
or ``SERVEFLEET_LOG`` (``debug``, ``info``, ``warning``, ``error``); the default is WARNING on
stderr. ``add_state_file`` also writes DEBUG records to ``servefleet.log`` in a fleet's state
folder (0600, rotated at 5 MB), so a failed ``up`` leaves its trace there even without
``--verbose``. A filter blanks what looks like a credential before any handler sees it."""

from __future__ import annotations

import logging
import os
import re
import sys
from pathlib import Path

__all__ = ["ENV_VAR", "LOG_FILE", "configure", "add_state_file", "redact"]

ENV_VAR = "SERVEFLEET_LOG"
LOG_FILE = "servefleet.log"
_ROOT = "servefleet"
_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# Bearer tokens, api keys and passwords in headers, argv or JSON; and the password of a URL's userinfo
_SECRET = re.compile(
    r"(?i)(authorization[\"']?\s*[:=]\s*[\"']?(?:bearer\s+)?|bearer\s+|api[_-]?key[\"']?\s*[:=]\s*[\"']?|"
    r"--api-key[= ]|password[\"']?\s*[:=]\s*[\"']?|token[\"']?\s*[:=]\s*[\"']?)([^\s\"'&,}]+)"
)
_URL_PASSWORD = re.compile(r"(://[^/\s:@]+:)([^\s/@]+)(@)")


def redact(text: str) -> str:
    """``text`` with every value that looks like a credential replaced by ``***``."""
    text = _URL_PASSWORD.sub(lambda m: m.group(1) + "***" + m.group(3), text)
    return _SECRET.sub(lambda m: m.group(1) + "***", text)


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is when a record comes (a test runner swaps it)."""

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr
        super().emit(record)


class _RedactFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        cleaned = redact(message)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        return True


def _level_from_env() -> int | None:
    raw = os.environ.get(ENV_VAR, "").strip().upper()
    if not raw:
        return None
    level = logging.getLevelName(raw)
    if not isinstance(level, int):
        raise ValueError(f"{ENV_VAR}={os.environ[ENV_VAR]!r}: use debug, info, warning or error")
    return level


def configure(verbose: bool = False) -> logging.Logger:
    """Log servefleet's records to stderr at DEBUG (``verbose``), ``$SERVEFLEET_LOG``, or WARNING.
    Idempotent: a second call only changes the level."""
    logger = logging.getLogger(_ROOT)
    env_level = _level_from_env()
    level = logging.DEBUG if verbose else (env_level if env_level is not None else logging.WARNING)
    stderr = next((h for h in logger.handlers if isinstance(h, _StderrHandler)), None)
    if stderr is None:
        stderr = _StderrHandler()
        stderr.setFormatter(logging.Formatter(_FORMAT))
        stderr.addFilter(_RedactFilter())
        logger.addHandler(stderr)
    stderr.setLevel(level)
    has_state_file = any(getattr(h, "servefleet_state_file", False) for h in logger.handlers)
    logger.setLevel(
        logging.DEBUG if has_state_file else level
    )  # a foreign handler (a test's capture) does not lower it
    logger.propagate = False
    return logger


def add_state_file(state_dir: str | Path) -> Path | None:
    """Also write DEBUG records to ``STATE_DIR/servefleet.log``; None when the folder cannot be
    written (logging must never be why a command fails)."""
    logger = logging.getLogger(_ROOT)
    path = Path(state_dir) / LOG_FILE
    for h in list(logger.handlers):
        if isinstance(h, logging.FileHandler) and getattr(h, "servefleet_state_file", False):
            if Path(h.baseFilename) == path.resolve():
                return path
            logger.removeHandler(h)  # another fleet's folder, from an earlier command in this process
            h.close()
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.close(fd)
        from logging.handlers import (
            RotatingFileHandler,
        )  # here, not at import: diagnose's start-up does not pay for it

        handler = RotatingFileHandler(path, maxBytes=5 << 20, backupCount=1)
    except OSError:
        return None
    handler.servefleet_state_file = True  # type: ignore[attr-defined]  # one state file at a time: a command works on one fleet
    handler.setLevel(logging.DEBUG)
    handler.setFormatter(logging.Formatter(_FORMAT))
    handler.addFilter(_RedactFilter())
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    return path
