"""Stable exit codes of the CLI (scripts depend on them)."""

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0  # ready / success
    FAILED = 1  # a server failed (diagnosed), or a job ended with failures
    TIMEOUT = 2  # timed out or stalled
    USAGE = 3  # bad arguments or configuration (typer itself uses 2 for parse errors)
    UNREACHABLE = 4  # a host could not be reached
    INTERRUPTED = 130
