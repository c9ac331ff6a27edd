"""What to do after a request failed: retry (after how long), or give the prompt up.

Failures are data (:class:`~servefleet.http.RequestFailure`, the HTTP layer's one taxonomy, which
also says what is retryable). Retried: connection errors, dropped connections, timeouts, malformed
responses, 408/409/425/429 and every 5xx. Not retried: other 4xx (the request itself is wrong -- a
prompt longer than the context, a bad parameter): the prompt goes straight to the failures file.

Backoff is exponential with full jitter (a uniform draw below ``base * 2**(attempt-1)``, capped), so
a fleet-wide hiccup does not turn into synchronised waves of retries; a server's ``Retry-After`` is
honoured when it asks for longer.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from servefleet.http import RequestFailure

__all__ = ["RetryPolicy", "Decision"]


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
