"""Why a benchmark could not run."""

from __future__ import annotations

from servefleet.errors import ServefleetError

__all__ = ["BenchError", "ServerUnreachable"]


class BenchError(ServefleetError):
    """The benchmark could not run (the server refused every form of request, ...)."""


class ServerUnreachable(BenchError):
    """Nothing answered at the target URL."""
