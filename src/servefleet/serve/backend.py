"""One server behind the gateway: what it serves, its limit, its health, its counters.

The pieces are generate's own: the limit is a :class:`~servefleet.generate.concurrency.ConcurrencyController`
(from the server's capacity, then measured), health is :class:`~servefleet.generate.health.Health` and
:class:`~servefleet.generate.health.ProgressWatch` (a hung engine: requests in flight, nothing moves),
the server's own load is read by :class:`~servefleet.generate.server_load.LoadWatch`. Only the
bookkeeping of this gateway lives here.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from servefleet.generate.concurrency import ConcurrencyController, Window
from servefleet.generate.endpoints import Target
from servefleet.generate.health import Health, HealthPolicy, ProgressWatch, ServerState
from servefleet.generate.server_load import LoadWatch, LoadWindow
from servefleet.generate.stats import RateMeter

__all__ = ["Backend", "Attempt", "controller_for"]


def controller_for(target: Target, concurrency: int | None) -> ConcurrencyController:
    if concurrency is not None:
        return ConcurrencyController.fixed(concurrency)
    return ConcurrencyController.auto(
        target.max_running,
        bench_concurrency=target.bench_concurrency,
        bench_tps=target.bench_tps,
        bench_note=target.bench_note,
        graph_batch=target.graph_batch,
    )


@dataclass(eq=False)
class Attempt:
    """One request sent to one server. ``started``: bytes of its answer reached the client (then it
    is never retried elsewhere)."""

    backend: Backend
    started: bool = False
    response: web.StreamResponse | None = None  # the client's stream, once prepared


@dataclass(eq=False)
class Backend:
    target: Target
    models: tuple[str, ...]
    controller: ConcurrencyController
    health: Health
    load: LoadWatch = field(default_factory=LoadWatch)
    progress: ProgressWatch = field(default_factory=ProgressWatch)
    in_flight: int = 0  # slots taken (by the router), including requests still being written back
    attempts: dict[asyncio.Task[Any], Attempt] = field(default_factory=dict)  # requests at the server now
    requests: int = 0  # answered (any HTTP status)
    errors: int = 0  # failed attempts: no answer, or an error status
    tokens: RateMeter = field(default_factory=RateMeter)
    latency_sum_s: float = 0.0
    answers: int = 0  # evidence of progress
    probing: bool = False
    hung: bool = False
    held: str | None = None  # stopped or drained by the user: no new requests, never restarted
    last_overload: float = 0.0
    window_start: float = 0.0
    window_tokens: float = 0.0
    ticks: int = 0
    saturated_ticks: int = 0
    watch: asyncio.Task[None] | None = None  # its LoadWatch

    @classmethod
    def create(cls, target: Target, models: tuple[str, ...], concurrency: int | None, policy: HealthPolicy) -> Backend:
        now = time.monotonic()
        return cls(
            target,
            models,
            controller_for(target, concurrency),
            Health(policy, last_answer=now),
            progress=ProgressWatch(last_progress=now),
            window_start=now,
        )

    @property
    def name(self) -> str:
        return self.target.name

    @property
    def limit(self) -> int:
        return self.controller.limit

    @property
    def up(self) -> bool:
        return self.health.state is ServerState.UP

    @property
    def usable(self) -> bool:
        return self.health.state is ServerState.UP and self.held is None

    def mean_latency_s(self) -> float:
        return self.latency_sum_s / self.requests if self.requests else 0.0

    def answered(self, tokens: float, latency_s: float, now: float) -> None:
        self.health.answered(now)
        self.requests += 1
        self.answers += 1
        self.latency_sum_s += latency_s
        if tokens:
            self.tokens.add(tokens, now)
            self.window_tokens += tokens

    def progress_marks(self) -> tuple[float | None, ...]:
        latest = self.load.latest()
        return (*(latest.marks() if latest is not None else (None, None, None)), float(self.answers))

    def window_due(self, now: float, minimum_s: float) -> bool:
        span = now - self.window_start
        wanted = (
            minimum_s
            if self.controller.phase == "ramp"
            else self.controller.window_factor() * max(5 * minimum_s, 3 * self.mean_latency_s())
        )
        return span >= wanted

    def measure(self, now: float) -> Window:
        """The window just ended: tok/s by the server's counter when it has one, else by our answers."""
        span = max(1e-6, now - self.window_start)
        load = self.load.window(self.window_start, now) if self.load.available else LoadWindow()
        saturated = self.ticks > 0 and self.saturated_ticks >= 0.8 * self.ticks
        return Window.of(self.window_tokens / span, load, saturated=saturated)

    def cut_short(self, now: float, minimum_s: float) -> Window | None:
        """The window so far, when the step being tried already reads far below the best one request lifetime in
        (by the server's own counter); None otherwise (as generate's dispatcher does). Only the cut window carries
        lifetimes: the gateway's ramp windows are not sized in them, and the ramp does not judge windows under two."""
        return self.controller.cut_short(
            now - self.window_start,
            self.mean_latency_s(),
            minimum_s,
            lambda: len(self.load.between(self.window_start, now)),
            bool(self.load.available),
            lambda: self.measure(now),
        )

    def new_window(self, now: float) -> None:
        self.window_start, self.window_tokens, self.ticks, self.saturated_ticks = now, 0.0, 0, 0

    def restarted(self, target: Target, concurrency: int | None) -> None:
        """Back in service (restarted or answering again): what was learned of the old engine is stale."""
        now = time.monotonic()
        self.target = target
        self.controller = controller_for(target, concurrency)
        self.load.reset()
        self.progress.reset(now)
        self.hung = False
        self.new_window(now)
        self.health.put_back(now)
