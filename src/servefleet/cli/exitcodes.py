"""Stable exit codes of the CLI (scripts depend on them; README: "Exit codes and errors").

Which failure gets which code is decided once, in :mod:`servefleet.cli.failure`; usage errors from
argument parsing are turned from click's 2 into 3 by the root group in :mod:`servefleet.cli.main`."""

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0  # ready / success
    FAILED = 1  # a server failed (diagnosed), or a job ended with failures
    TIMEOUT = 2  # timed out or stalled
    USAGE = 3  # bad arguments or configuration, argument parsing included
    UNREACHABLE = 4  # a host could not be reached
    INTERRUPTED = 130
