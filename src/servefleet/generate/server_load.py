"""What a server says about its own load while the job runs: its Prometheus ``/metrics``, read once a second.

Two uses: the concurrency controller measures output tokens/s by the server's own counter (smooth,
where our answers arrive in lumps of a whole completion) and sees whether the server queues; the
health check sees whether the engine still makes progress (a hung engine core behind a live API
process still answers ``/health`` and ``/metrics``, but its counters stop).

Metric names are the engines' own, kept in each engine profile (``EngineProfile.serving_metrics``)
and read by ``bench`` too: generated tokens, prompt tokens, engine steps (prefill chunks included),
running and waiting requests. The server's engine is not known here, so every engine's names are
tried (``engines.registry.serving_metrics``).
A server without ``/metrics`` yields nothing; callers fall back on our own answers.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from servefleet.bench.server_metrics import first_present, parse_prometheus
from servefleet.engines.registry import serving_metrics
from servefleet.generate.stats import PrefixTally
from servefleet.http import HttpClient, Timeout

__all__ = ["LATELY", "LoadSample", "LoadWatch", "LoadWindow", "sample_from_text"]

LATELY = 3  # scrapes: the server's queue "now", for a window judged before its end


@dataclass(frozen=True, slots=True)
class LoadSample:
    t: float
    generation_tokens: float | None
    prompt_tokens: float | None
    steps: float | None
    running: float | None
    waiting: float | None
    prefix_looked_up: float | None = None  # prompt tokens looked up in the prefix cache (counter)
    prefix_hits: float | None = None  # of them, found there

    def marks(self) -> tuple[float | None, ...]:
        """Counters that move while the engine works (any change is progress)."""
        return (self.generation_tokens, self.prompt_tokens, self.steps)


@dataclass(frozen=True, slots=True)
class LoadWindow:
    """What a server's own counters and gauges say of one window; None where it does not say (or too few scrapes)."""

    tps: float | None = None  # generated tokens/s
    waiting: float | None = None  # the fewest waiting: a queue that never emptied (a burst being admitted empties it)
    running: float | None = None  # the most running
    # the fewest waiting over the window's last LATELY scrapes: the queue now, whatever the window's start saw (the
    # requests of a raise reach the engine's queue a second or two after the window began)
    waiting_lately: float | None = None


def sample_from_text(text: str, t: float) -> LoadSample | None:
    """One scrape; None when it holds none of the metrics read here."""
    m = parse_prometheus(text)
    n = serving_metrics()  # built once (cached), not per scrape
    s = LoadSample(
        t,
        first_present(m, n.generation_tokens),
        first_present(m, n.prompt_tokens),
        first_present(m, n.steps),
        first_present(m, n.running),
        first_present(m, n.queued),
        first_present(m, n.prefix_looked_up),
        first_present(m, n.prefix_hits),
    )
    if s.generation_tokens is None and s.running is None:
        return None
    return s


class LoadWatch:
    """Scrapes one server's ``/metrics`` every ``interval_s`` and keeps the last ``keep_s`` seconds.
    Gives up after the first scrapes find no metrics (``available`` False)."""

    def __init__(self, interval_s: float = 1.0, keep_s: float = 600.0, prefix: PrefixTally | None = None) -> None:
        self.interval_s = interval_s
        self.prefix = prefix if prefix is not None else PrefixTally()
        self.samples: deque[LoadSample] = deque(maxlen=max(8, int(keep_s / interval_s)))
        self.available: bool | None = None  # None: not known yet
        self._misses = 0

    async def run(self, client: HttpClient, base_url: Callable[[], str]) -> None:
        """Until cancelled; ``base_url`` is asked before each scrape (a restarted server may move)."""
        timeout = Timeout(max(2.0, 3 * self.interval_s))
        while self.available is not False:
            sample = await self._scrape(client, base_url(), timeout)
            if sample is not None:
                self.add(sample)
                self.available, self._misses = True, 0
            elif self.available is None:
                self._misses += 1
                if self._misses >= 3:
                    self.available = False
            await asyncio.sleep(self.interval_s)

    async def last(self, client: HttpClient, base_url: str) -> None:
        """One more scrape as the job ends: the counters' moves since the last one once a second count too
        (a short job's whole prefix-cache tally is in them)."""
        if self.available:
            sample = await self._scrape(client, base_url, Timeout(2.0))
            if sample is not None:
                self.add(sample)

    async def _scrape(self, client: HttpClient, base_url: str, timeout: Timeout) -> LoadSample | None:
        sent = time.monotonic()
        text = await client.get_text(base_url.rstrip("/") + "/metrics", timeout=timeout)
        # the counters are of some moment between asking and hearing: the midpoint
        # (on a busy host a scrape can take a good part of a second)
        return sample_from_text(text, (sent + time.monotonic()) / 2) if text is not None else None

    def add(self, sample: LoadSample) -> None:
        """One scrape. The prefix-cache counters' increase since the last one goes to the job's tally
        (none after a reset: a restarted server's counters start again from zero)."""
        last = self.samples[-1] if self.samples else None
        if last is not None and last.prefix_looked_up is not None and sample.prefix_looked_up is not None:
            self.prefix.add(
                sample.prefix_looked_up - last.prefix_looked_up,
                (sample.prefix_hits or 0.0) - (last.prefix_hits or 0.0),
            )
        self.samples.append(sample)

    def reset(self) -> None:
        """The server was restarted: its counters start again from zero."""
        self.samples.clear()

    def latest(self) -> LoadSample | None:
        return self.samples[-1] if self.samples else None

    def between(self, t0: float, t1: float) -> list[LoadSample]:
        return [s for s in self.samples if t0 <= s.t <= t1]

    def window(self, t0: float, t1: float) -> LoadWindow:
        """What the scrapes between ``t0`` and ``t1`` say (:class:`LoadWindow`)."""
        inside = self.between(t0, t1)
        if len(inside) < 2:
            return LoadWindow()
        a, b = inside[0], inside[-1]
        tps = None
        if a.generation_tokens is not None and b.generation_tokens is not None and b.t > a.t:
            tps = max(0.0, b.generation_tokens - a.generation_tokens) / (b.t - a.t)
        waiting = [s.waiting for s in inside if s.waiting is not None]
        running = [s.running for s in inside if s.running is not None]
        return LoadWindow(
            tps,
            min(waiting) if waiting else None,
            max(running) if running else None,
            min(waiting[-LATELY:]) if waiting else None,
        )
