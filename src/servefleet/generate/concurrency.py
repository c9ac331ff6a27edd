"""How many requests to keep in flight at one server: fixed, or adapted (``--concurrency auto``).

Auto, when the server's capacity is known (max running requests, from the verification loop or
the engine's info endpoint): keep ``max_running`` plus a little headroom in flight. The engine
decodes at most ``max_running`` at once; a few more waiting in its queue mean a finished request's
slot is refilled at the very next step, without waiting for our next request to cross the network.

Auto, when it is not known: a gradient search on measured output throughput. Start at
:data:`START`, multiply by 1.5 while each step raises tokens/s by more than 5%, settle at the best
limit plus headroom when it stops paying; probe upwards again every so often (the server may have
been busy with another client).

Both back off multiplicatively when the server says it is overloaded (429/503) and climb back
additively (AIMD), never above the ceiling that triggered the back-off until a later probe shows the
room is back. Measurements are taken only over windows in which the server was kept saturated,
and the first window after a change is skipped (requests in flight span both settings).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

__all__ = ["ConcurrencyController", "START", "headroom"]

START = 8
GAIN = 1.05  # a step must raise throughput by 5% to count
GROW = 1.5
SHRINK = 0.7
REPROBE_WINDOWS = 20


def headroom(n: int) -> int:
    """Requests queued beyond the engine's batch: 10%, at least 2."""
    return max(2, math.ceil(n * 0.1))


@dataclass
class ConcurrencyController:
    limit: int
    mode: Literal["fixed", "capacity", "search"]
    ceiling: int = 4096
    floor: int = 1
    best_tps: float = 0.0
    best_limit: int = 0
    settled: bool = False
    _settle: int = 0
    _windows: int = 0
    _target: int = 0  # capacity mode: where additive increase climbs back to
    history: list[tuple[int, float]] = field(default_factory=list)

    @classmethod
    def fixed(cls, n: int) -> "ConcurrencyController":
        return cls(limit=max(1, n), mode="fixed")

    @classmethod
    def auto(cls, max_running: int | None, *, ceiling: int = 4096) -> "ConcurrencyController":
        if max_running:
            target = min(ceiling, max_running + headroom(max_running))
            return cls(limit=target, mode="capacity", ceiling=ceiling, _target=target, settled=True)
        return cls(limit=min(START, ceiling), mode="search", ceiling=ceiling)

    # ---- signals --------------------------------------------------------------------------------
    def on_overload(self) -> bool:
        """A 429/503 from the server. Returns whether the limit changed."""
        if self.mode == "fixed" or self._settle:
            return False  # one back-off per window: a burst of 429s is one signal
        new = max(self.floor, int(self.limit * SHRINK))
        if new == self.limit:
            return False
        self.ceiling = self.limit
        self.limit = new
        self._settle = 1
        return True

    def observe(self, tokens_per_s: float, saturated: bool) -> bool:
        """One measurement window ended. Returns whether the limit changed."""
        if self.mode == "fixed":
            return False
        if self._settle:
            self._settle -= 1
            return False
        if not saturated:
            return False
        self._windows += 1
        self.history.append((self.limit, tokens_per_s))
        if self.mode == "capacity" or self.settled:
            return self._steady(tokens_per_s)
        return self._search(tokens_per_s)

    # ---- internals ------------------------------------------------------------------------------
    def _set(self, n: int) -> bool:
        n = max(self.floor, min(self.ceiling, n))
        if n == self.limit:
            return False
        self.limit = n
        self._settle = 1
        return True

    def _search(self, tps: float) -> bool:
        if tps > self.best_tps * GAIN or self.best_limit == 0:
            self.best_tps, self.best_limit = tps, self.limit
            if self.limit >= self.ceiling:
                self.settled = True
                return False
            return self._set(math.ceil(self.limit * GROW))
        # No gain from the last step: the knee is behind us.
        self.settled = True
        self._windows = 0
        return self._set(self.best_limit + headroom(self.best_limit))

    def _steady(self, tps: float) -> bool:
        if self.mode == "capacity":
            if self.limit < self._target:  # additive increase after an overload back-off
                if self.ceiling < self._target and self._windows % REPROBE_WINDOWS == 0:
                    self.ceiling = self._target
                return self._set(self.limit + 1)
            return False
        if self._windows >= REPROBE_WINDOWS and self.limit < 4096:
            # Probe upwards again: reopen the ceiling a little and search from here.
            self._windows = 0
            self.settled = False
            self.best_tps = tps  # best_limit stays: the settled limit is best_limit + headroom
            self.ceiling = max(self.ceiling, math.ceil(self.limit * GROW))
            return self._set(math.ceil(self.limit * GROW))
        return False
