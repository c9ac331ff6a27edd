"""One failure contract for every command: a stable error kind, its exit code, and one JSON shape.

A command raises :class:`CliFailure` (or lets a servefleet error, a click usage error or Ctrl-C
through); the root group in ``cli/main.py`` turns it, once for every command, into

- ``error: MESSAGE`` (and ``hint: ...``) on stderr, and
- whenever ``--json`` was given, one document on stdout::

      {"ok": false, "error": {"kind": "usage", "message": "...", "hint": "..." or null, "exit_code": 3}}

  (``command`` and, where known, ``details`` are added). A success payload never has ``"ok": false``.

Kinds are stable names scripts may branch on (README, "Exit codes and errors"). Nothing heavy is
imported here: this module runs on every command's error path, start-up included.
"""

from __future__ import annotations

import json
import sys
from enum import StrEnum
from typing import Any

from servefleet.cli.exitcodes import ExitCode
from servefleet.errors import (
    CommandError,
    ConfigError,
    EngineError,
    HostUnreachable,
    LaunchError,
    OptionError,
    ServefleetError,
    StateError,
)

__all__ = [
    "ErrorKind",
    "CliFailure",
    "failure_from_exception",
    "kind_for_exit_code",
    "error_document",
    "outcome_document",
    "report_failure",
]


class ErrorKind(StrEnum):
    USAGE = "usage"  # bad arguments or option values (argument parsing included)
    CONFIG = "config"  # a fleet file, input file or setting that cannot be used as written (or is missing)
    UNREACHABLE = "unreachable"  # a host or server could not be reached at all
    STATE = "state"  # a state record is missing, corrupt, or another server's
    LAUNCH = "launch"  # a server process could not be started
    COMMAND = "command"  # a command on a host ran and failed
    FAILED = "failed"  # the operation ran and failed
    TIMEOUT = "timeout"  # timed out or stalled
    INTERRUPTED = "interrupted"  # Ctrl-C or SIGTERM
    INTERNAL = "internal"  # a bug in servefleet: the traceback follows on stderr


EXIT_CODES: dict[ErrorKind, ExitCode] = {
    ErrorKind.USAGE: ExitCode.USAGE,
    ErrorKind.CONFIG: ExitCode.USAGE,
    ErrorKind.UNREACHABLE: ExitCode.UNREACHABLE,
    ErrorKind.STATE: ExitCode.FAILED,
    ErrorKind.LAUNCH: ExitCode.FAILED,
    ErrorKind.COMMAND: ExitCode.FAILED,
    ErrorKind.FAILED: ExitCode.FAILED,
    ErrorKind.TIMEOUT: ExitCode.TIMEOUT,
    ErrorKind.INTERRUPTED: ExitCode.INTERRUPTED,
    ErrorKind.INTERNAL: ExitCode.FAILED,
}


def kind_for_exit_code(code: int) -> ErrorKind:
    """The plain kind of an exit code, for a command that only knows the code it wants."""
    plain: dict[int, ErrorKind] = {
        ExitCode.USAGE: ErrorKind.USAGE,
        ExitCode.UNREACHABLE: ErrorKind.UNREACHABLE,
        ExitCode.TIMEOUT: ErrorKind.TIMEOUT,
        ExitCode.INTERRUPTED: ErrorKind.INTERRUPTED,
    }
    return plain.get(code, ErrorKind.FAILED)  # an int that is not one of these codes: failed


class CliFailure(Exception):
    """A command cannot do what was asked; rendered once, by the root group."""

    def __init__(self, kind: ErrorKind, message: str, *, hint: str | None = None, **details: Any) -> None:
        super().__init__(message)
        self.kind = ErrorKind(kind)
        self.message = message
        self.hint = hint
        self.details = details

    @property
    def exit_code(self) -> int:
        return int(EXIT_CODES[self.kind])


# Most specific first: the first class an exception is an instance of gives its kind.
_SERVEFLEET_KINDS: tuple[tuple[type[ServefleetError], ErrorKind], ...] = (
    (OptionError, ErrorKind.USAGE),  # an option out of range (validation.option_error), before ConfigError: a subclass
    (ConfigError, ErrorKind.CONFIG),
    (EngineError, ErrorKind.USAGE),  # an unknown engine name, from --engine or a fleet file
    (HostUnreachable, ErrorKind.UNREACHABLE),
    (CommandError, ErrorKind.COMMAND),
    (StateError, ErrorKind.STATE),
    (LaunchError, ErrorKind.LAUNCH),
)


def failure_from_exception(exc: BaseException) -> CliFailure | None:
    """The failure an exception stands for, or None for an unexpected one (a bug)."""
    if isinstance(exc, CliFailure):
        return exc
    if isinstance(exc, ServefleetError):
        kind = next((k for cls, k in _SERVEFLEET_KINDS if isinstance(exc, cls)), ErrorKind.FAILED)
        return CliFailure(kind, str(exc))
    if isinstance(exc, KeyboardInterrupt):
        return CliFailure(ErrorKind.INTERRUPTED, "interrupted")
    pydantic = sys.modules.get("pydantic")  # never imported here: an exception of it means it is loaded
    if pydantic is not None and isinstance(exc, pydantic.ValidationError):
        from servefleet.validation import option_error

        return CliFailure(ErrorKind.USAGE, str(option_error(exc)))
    return None


def error_document(failure: CliFailure, command: str | None = None) -> dict[str, Any]:
    error: dict[str, Any] = {
        "kind": failure.kind.value,
        "message": failure.message,
        "hint": failure.hint,
        "exit_code": failure.exit_code,
    }
    if command:
        error["command"] = command
    if failure.details:
        error["details"] = failure.details
    return {"ok": False, "error": error}


def outcome_document(payload: dict[str, Any], *, exit_code: int, message: str, command: str) -> dict[str, Any]:
    """A command's ``--json`` result: as it is on success (exit 0); on an outcome that is a failure
    (generate incomplete, up with a failed server, status with a down one, plan --check outside its
    tolerance) the same payload in the failure shape, ``"ok": false`` and ``error`` first."""
    if exit_code == 0:
        return payload
    failure = CliFailure(kind_for_exit_code(exit_code), message)
    document = error_document(failure, command)
    document["error"]["exit_code"] = int(exit_code)  # the code the process exits with (130, say, for interrupted)
    return {**document, **payload}


def report_failure(
    failure: CliFailure, *, as_json: bool, command: str | None = None, stderr_text: bool = True
) -> None:
    """Print the failure: the JSON document on stdout when ``as_json``, the words on stderr."""
    if as_json:
        sys.stdout.write(json.dumps(error_document(failure, command), default=str) + "\n")
        sys.stdout.flush()
    if stderr_text:
        sys.stderr.write(f"error: {failure.message}\n")
        if failure.hint:
            sys.stderr.write(f"hint: {failure.hint}\n")
        sys.stderr.flush()
