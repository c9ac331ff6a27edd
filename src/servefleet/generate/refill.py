"""Spreading a refill after the concurrency limit is lowered.

Work of one length (the same prompt and output lengths, closed loop) runs in waves: requests sent
together prefill together, decode in lockstep and end together. When the limit is lowered, the old
setting's requests drain and the free slots open all at once; sent at once, the new batch is one
synchronised wave, and each time it ends the engine idles while a whole batch is answered and sent
again. On the H200 (vLLM 0.26, max running 1024) 564 in flight in such waves gave 14-17k tok/s where
512 reached by a ramp (staggered) gave 22-26k: the controller read the wave, not the setting, and went
back to 1127 (benchmarks/results/gpu/2026-12-02-issue25). So after a lowering the first free slots are
filled over half a request lifetime (the lifetime measured before the change, which is longer than
the new one), not at once; the starts, and with them the ends, stay spread.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Refill", "SPREAD"]

SPREAD = 0.5  # of the last measured request lifetime


@dataclass
class Refill:
    armed: bool = False
    start: float | None = None  # the first free slot after the drain
    sent: int = 0

    def arm(self) -> None:
        """The limit was lowered: the next refill is spread."""
        self.armed, self.start, self.sent = True, None, 0

    def allows(self, now: float, in_flight: int, limit: int, lifetime_s: float) -> bool:
        """Whether one more request may be sent now (the caller still checks ``in_flight < limit``)."""
        if not self.armed or in_flight >= limit:
            return True
        if self.start is None:
            self.start = now
        spread = SPREAD * lifetime_s
        span = now - self.start
        if spread <= 0 or span >= spread:
            self.armed = False
            return True
        return self.sent < 1 + limit * span / spread

    def sent_one(self) -> None:
        if self.armed and self.start is not None:
            self.sent += 1

    @property
    def pacing(self) -> bool:
        return self.armed and self.start is not None
