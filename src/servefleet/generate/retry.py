"""What to do after a request failed: retry (after how long), or give the prompt up.

Failures are data (:class:`RequestFailure`), classified once by the client. Retried: connection
errors, dropped connections, timeouts, malformed responses, 408/409/425/429 and every 5xx. Not
retried: other 4xx (the request itself is wrong -- a prompt longer than the context, a bad
parameter): the prompt goes straight to the failures file.

Backoff is exponential with full jitter (a uniform draw below ``base * 2**(attempt-1)``, capped), so
a fleet-wide hiccup does not turn into synchronised waves of retries; a server's ``Retry-After`` is
honoured when it asks for longer.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from enum import StrEnum

__all__ = ["FailureKind", "RequestFailure", "RetryPolicy", "Decision"]


class FailureKind(StrEnum):
    CONNECT = "connect"  # could not connect (refused, unreachable)
    DISCONNECT = "disconnect"  # the connection broke mid-request
    TIMEOUT = "timeout"
    HTTP = "http"  # the server answered with an error status
    PROTOCOL = "protocol"  # a 2xx answer that is not a usable completion


_RETRY_STATUS = frozenset({408, 409, 425, 429})


@dataclass(frozen=True)
class RequestFailure:
    kind: FailureKind
    message: str
    status: int | None = None
    retry_after_s: float | None = None

    @property
    def retryable(self) -> bool:
        if self.kind is FailureKind.HTTP:
            return self.status is not None and (self.status in _RETRY_STATUS or self.status >= 500)
        return True

    @property
    def server_fault(self) -> bool:
        """Evidence that the server, not the prompt, is the problem (feeds health checks)."""
        return self.kind in (FailureKind.CONNECT, FailureKind.DISCONNECT, FailureKind.TIMEOUT)

    @property
    def overload(self) -> bool:
        """The server asks us to send less (feeds the concurrency controller)."""
        return self.kind is FailureKind.HTTP and self.status in (429, 503)

    def describe(self) -> str:
        head = f"HTTP {self.status}" if self.status is not None else self.kind.value
        return f"{head}: {self.message}" if self.message else head


@dataclass(frozen=True)
class Decision:
    retry: bool
    delay_s: float = 0.0


@dataclass
class RetryPolicy:
    max_attempts: int = 5
    base_s: float = 0.5
    cap_s: float = 30.0
    rng: random.Random | None = None

    def decide(self, failure: RequestFailure, attempts: int) -> Decision:
        """``attempts``: how many times this prompt has been sent, the failed one included."""
        if not failure.retryable or attempts >= self.max_attempts:
            return Decision(False)
        return Decision(True, self.backoff(attempts, failure.retry_after_s))

    def backoff(self, attempts: int, retry_after_s: float | None = None) -> float:
        rng = self.rng or random
        ceiling = min(self.cap_s, self.base_s * (2 ** max(0, attempts - 1)))
        delay = rng.uniform(0, ceiling)
        if retry_after_s is not None:
            delay = max(delay, min(retry_after_s, self.cap_s))
        return delay
