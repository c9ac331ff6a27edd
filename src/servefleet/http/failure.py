"""The one failure taxonomy of every HTTP exchange servefleet makes.

::

    TransportError            raised by a transport; carries a RequestFailure (data)
     ├─ kind CONNECT          nothing answered: refused, unreachable, no route
     ├─ kind DISCONNECT       the connection broke mid-exchange: reset, closed mid-answer
     ├─ kind TIMEOUT          no (complete) answer within the timeout
     └─ kind PROTOCOL         an answer that is not HTTP (a garbled status line)
    RequestFailure(HTTP)      the server answered an error status (status_class says which)
    RequestFailure(PROTOCOL)  a 2xx whose body is not what was asked for (callers decide)

Foreign errors (aiohttp's, the OS's) are translated once, in the transport
(``aiohttp_transport.translate``), and chained with ``from``. Callers turn failures into their own
records: the probe into outcomes, ``generate`` into retries, ``bench`` into ``errors_by_kind``.
This module imports nothing heavy (no aiohttp), so any layer may name the taxonomy.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

__all__ = ["FailureKind", "RequestFailure", "TransportError", "status_class", "RETRY_STATUS"]


class FailureKind(StrEnum):
    CONNECT = "connect"  # could not connect (refused, unreachable)
    DISCONNECT = "disconnect"  # the connection broke mid-request
    TIMEOUT = "timeout"
    HTTP = "http"  # the server answered with an error status
    PROTOCOL = "protocol"  # an answer that is not a usable one (not HTTP, or a 2xx without the asked content)


# Statuses that say "try again" rather than "the request is wrong".
RETRY_STATUS = frozenset({408, 409, 425, 429})


def status_class(status: int) -> str:
    """The stable class of an error status: ``rate_limited`` (429), ``client_error`` (other 4xx),
    ``server_error`` (5xx and anything else that is not 2xx/3xx)."""
    if status == 429:
        return "rate_limited"
    if 400 <= status < 500:
        return "client_error"
    return "server_error"


@dataclass(frozen=True, slots=True)
class RequestFailure:
    kind: FailureKind
    message: str
    status: int | None = None
    retry_after_s: float | None = None

    @property
    def retryable(self) -> bool:
        """Connection trouble, timeouts, malformed answers, 408/409/425/429 and every 5xx; not
        other 4xx (the request itself is wrong: a prompt longer than the context, a bad parameter)."""
        if self.kind is FailureKind.HTTP:
            return self.status is not None and (self.status in RETRY_STATUS or self.status >= 500)
        return True

    @property
    def server_fault(self) -> bool:
        """Evidence that the server, not the request, is the problem (feeds health checks)."""
        return self.kind in (FailureKind.CONNECT, FailureKind.DISCONNECT, FailureKind.TIMEOUT)

    @property
    def overload(self) -> bool:
        """The server asks us to send less (feeds the concurrency controller)."""
        return self.kind is FailureKind.HTTP and self.status in (429, 503)

    @property
    def down(self) -> bool:
        """Nothing (usable) listens there: refused, reset, closed mid-answer."""
        return self.kind in (FailureKind.CONNECT, FailureKind.DISCONNECT)

    def describe(self) -> str:
        head = f"HTTP {self.status}" if self.status is not None else self.kind.value
        return f"{head}: {self.message}" if self.message else head


class TransportError(Exception):
    """A request that got no HTTP answer. ``failure`` is the same thing as data."""

    def __init__(self, failure: RequestFailure) -> None:
        super().__init__(failure.message)
        self.failure = failure

    @property
    def kind(self) -> FailureKind:
        return self.failure.kind
