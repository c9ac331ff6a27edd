"""State records: one JSON file per launched server in the fleet's state folder.

State lives in plain files, not in memory, so that a second terminal, a CLI that crashed, or a
new process can adopt running servers instead of relaunching them. Files are written atomically
(temporary file + rename) with mode 0600; values of environment variables whose names look like
secrets (``*KEY*``, ``*TOKEN*``, ``*SECRET*``, ``*PASSWORD*``) and the values of argv flags named
like them (``--api-key X``) are never written.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
import time
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from servefleet.errors import StateError
from servefleet.fleet.spec import RESERVED_SERVER_NAME
from servefleet.hosts.atomic_write import write_atomically

log = logging.getLogger(__name__)

__all__ = [
    "ServerState",
    "StopMark",
    "StateStore",
    "MASK",
    "is_secret_name",
    "mask_env",
    "mask_argv",
    "spec_hash",
    "utcnow",
]

MASK = "***"
STATE_VERSION = 1
_SECRET_ENV = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL", re.IGNORECASE)
# Flags are matched on their last word only, so `--max-total-tokens 4096` stays readable while
# `--api-key`, `--hf-token`, `--admin-password` are masked.
_SECRET_FLAG = re.compile(r"(key|token|secret|password|passwd|credentials?)$", re.IGNORECASE)


def utcnow() -> datetime:
    return datetime.now(UTC)


def is_secret_name(name: str) -> bool:
    """Whether an environment variable name looks like it holds a secret."""
    return bool(_SECRET_ENV.search(name))


def mask_env(env: Mapping[str, str]) -> dict[str, str]:
    return {k: (MASK if is_secret_name(k) else v) for k, v in env.items()}


def mask_argv(argv: Sequence[str], secrets: Iterable[str] = ()) -> list[str]:
    """``argv`` with values of secret-looking flags and any known secret value replaced."""
    values = sorted({s for s in secrets if s and len(s) >= 4}, key=len, reverse=True)
    out: list[str] = []
    mask_next = False
    for arg in argv:
        if mask_next:
            out.append(MASK)
            mask_next = False
            continue
        if arg.startswith("-") and not arg.startswith("---"):
            flag, eq, _ = arg.lstrip("-").partition("=")
            if _SECRET_FLAG.search(flag.replace("_", "-")):
                if eq:
                    out.append(arg.split("=", 1)[0] + "=" + MASK)
                else:
                    out.append(arg)
                    mask_next = True
                continue
        for value in values:
            arg = arg.replace(value, MASK)
        out.append(arg)
    return out


def spec_hash(payload: Mapping[str, Any]) -> str:
    """A short stable digest of what defines a launch (argv, env, cwd): a changed spec is noticed.
    Secret values enter the digest but never the file."""
    blob = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


class ServerState(BaseModel):
    """What servefleet knows about one launched server. Written at launch, updated with the
    verdict of each wait, removed by ``down``."""

    model_config = ConfigDict(extra="ignore")

    version: int = STATE_VERSION
    fleet: str
    name: str
    engine: str
    host: str  # the fleet's host name ("local", or a [hosts.NAME])
    port: int
    bind: str = "127.0.0.1"
    pgid: int
    unit: str | None = None  # the transient systemd --user unit, when launched with systemd-run
    argv: list[str]  # masked
    env: dict[str, str] = Field(default_factory=dict)  # what servefleet added; masked
    cwd: str | None = None
    log_path: str
    status_path: str
    log_offset: int = 0  # where this launch's output starts in the (appended) log
    launched_at: datetime
    spec_hash: str
    served_model: str | None = None
    probe_paths: list[str] = Field(default_factory=list)
    ready_at: datetime | None = None
    last_verdict: dict[str, Any] | None = None
    verdict_at: datetime | None = None
    # The siblings on its GPU this launch waited for (start_order.Settled.to_json), in order.
    started_after: list[dict[str, Any]] = Field(default_factory=list)
    after_failure: str | None = None  # what `up` did with it after a failed verdict ("stopped", ...)

    def to_bytes(self) -> bytes:
        return (self.model_dump_json(indent=2) + "\n").encode()


class StopMark(BaseModel):
    """``stopped/<name>.json``: the user stopped (``down``) or drained (``drain``) this server.

    An explicit stop wins over a running job: ``generate --fleet`` reads the mark, drains the server
    (its in-flight requests re-queued or let finish, no outage counted) and does not restart it.
    ``up`` and ``restart`` of the server remove the mark (the user starts it again)."""

    model_config = ConfigDict(extra="ignore")

    name: str
    command: str  # "down" | "drain"
    at: datetime
    keep: bool = False  # drain --keep: left running, but no job sends to it

    def describe(self) -> str:
        what = "drained" if self.command == "drain" else "stopped"
        return f"{what} by the user (servefleet {self.command} at {self.at:%Y-%m-%d %H:%M:%S} UTC)"


class StateStore:
    """The fleet's local state folder: ``<name>.json`` records, ``stopped/<name>.json`` marks,
    ``jobs/`` (the jobs using the fleet: fleet/jobs.py), ``logs/`` and ``run/``.

    ``fleet.json`` remembers which fleet file the folder belongs to, so commands run without
    ``--fleet`` can find it again.
    """

    INDEX = f"{RESERVED_SERVER_NAME}.json"  # a server may not take this name (spec.py refuses it)

    def __init__(self, state_dir: Path) -> None:
        self.dir = Path(state_dir)

    def path_for(self, name: str) -> Path:
        return self.dir / f"{name}.json"

    def _ensure_dir(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)

    def load(self, name: str) -> ServerState | None:
        path = self.path_for(name)
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        return self._parse(path, raw, name)

    @staticmethod
    def _parse(path: Path, raw: bytes, name: str | None = None) -> ServerState:
        try:
            record = ServerState.model_validate_json(raw)
        except ValidationError as exc:
            raise StateError(
                f"{path}: corrupt state record ({exc.error_count()} problems); remove it if no server runs"
            ) from exc
        if name is not None and record.name != name:
            raise StateError(f"{path}: state record belongs to server {record.name!r}, not {name!r}")
        return record

    def save(self, record: ServerState) -> Path:
        self._ensure_dir()
        path = self.path_for(record.name)
        _atomic_write(path, record.to_bytes())
        return path

    def remove(self, name: str) -> None:
        try:
            self.path_for(name).unlink()
        except FileNotFoundError:
            pass

    def _mark_path(self, name: str) -> Path:
        return self.dir / "stopped" / f"{name}.json"

    def mark_stopped(self, mark: StopMark) -> None:
        (self.dir / "stopped").mkdir(parents=True, exist_ok=True, mode=0o700)
        _atomic_write(self._mark_path(mark.name), (mark.model_dump_json(indent=2) + "\n").encode())

    def stop_mark(self, name: str) -> StopMark | None:
        """The user's stop of this server, if it stands (a local file read: cheap enough per failure)."""
        try:
            return StopMark.model_validate_json(self._mark_path(name).read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, ValidationError) as exc:
            log.warning("%s: unreadable stop mark, taken as stopped (%s)", self._mark_path(name), exc)
            return StopMark(name=name, command="down", at=utcnow())

    def clear_stop_mark(self, name: str) -> None:
        self._mark_path(name).unlink(missing_ok=True)

    def names(self) -> list[str]:
        """Names of every server with a record (including ones no longer in the fleet file)."""
        if not self.dir.is_dir():
            return []
        return sorted(p.stem for p in self.dir.glob("*.json") if p.name != self.INDEX)

    @contextlib.asynccontextmanager
    async def lock(self, timeout_s: float = 60.0) -> AsyncIterator[None]:
        """Hold the folder's lock (``flock`` on ``.lock``) so that two ``up`` runs at once do not
        both launch a server: the second waits, then finds the record and adopts."""
        self._ensure_dir()
        fd = os.open(self.dir / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            deadline = time.monotonic() + timeout_s
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise StateError(
                            f"{self.dir}: another servefleet process holds the fleet's lock for over {timeout_s:g}s"
                        ) from None
                    await asyncio.sleep(0.05)
            yield
        finally:
            os.close(fd)  # closing the descriptor releases the lock

    def write_index(self, fleet_name: str, fleet_file: Path) -> None:
        self._ensure_dir()
        data = {"fleet": fleet_name, "fleet_file": str(fleet_file)}
        _atomic_write(self.dir / self.INDEX, (json.dumps(data, indent=2) + "\n").encode())

    @classmethod
    def read_index(cls, state_dir: Path) -> dict[str, str] | None:
        try:
            data = json.loads((Path(state_dir) / cls.INDEX).read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            log.warning("%s: unreadable state index, ignored (%s)", Path(state_dir) / cls.INDEX, exc)
            return None
        return data if isinstance(data, dict) and "fleet_file" in data else None


def _atomic_write(path: Path, data: bytes, mode: int = 0o600) -> None:
    write_atomically(str(path), data, mode, str(path.with_name(f".{path.name}.tmp.{os.getpid()}")))
