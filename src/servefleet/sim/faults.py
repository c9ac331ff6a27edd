"""Per-request faults: 5xx and 429 answers and slow requests, drawn from a seeded generator.

Draws happen in request-arrival order, one generator per server, so a run with the same ``--seed``
and the same request order injects the same faults (and the share over many requests converges on
the configured rate).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from servefleet.sim.config import SimConfig

__all__ = ["Draw", "RequestFaults"]


@dataclass(frozen=True)
class Draw:
    status: int | None  # answer this status instead of serving (500 / 429), or None
    slow_s: float  # delay before the request is admitted


class RequestFaults:
    def __init__(self, config: SimConfig) -> None:
        self._cfg = config
        self._rng = random.Random(config.seed)
        self.active = bool(config.error_rate or config.rate_limit_rate or config.slow_rate)

    def draw(self) -> Draw:
        if not self.active:
            return Draw(None, 0.0)
        cfg = self._cfg
        u = self._rng.random()
        status = None
        if u < cfg.error_rate:
            status = 500
        elif u < cfg.error_rate + cfg.rate_limit_rate:
            status = 429
        slow = cfg.slow_ms / 1000.0 if cfg.slow_rate and self._rng.random() < cfg.slow_rate else 0.0
        return Draw(status, slow)
