"""Counters of a running job, shared by the dispatcher (writes), the progress view and the report
(read). Plain numbers, no I/O; rates over a sliding window for the "instant" figures."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

__all__ = ["RateMeter", "ServerStats", "JobStats", "PrefixTally", "LIFETIME_WEIGHT"]

LIFETIME_WEIGHT = 0.05  # weight of one answer in the recent latency (about the last 20 answers)
SPREAD_ANSWERS = 64  # answers whose latencies say whether requests end together (closed-loop waves) or apart


class RateMeter:
    """Rate of a growing counter over the last ``window_s`` seconds, in buckets of ``bucket_s``
    (memory does not grow with the event rate)."""

    def __init__(self, window_s: float = 10.0, bucket_s: float = 0.25) -> None:
        self.window_s = window_s
        self.bucket_s = bucket_s
        self.total = 0.0
        self._buckets: deque[list[float]] = deque()  # [bucket start, amount]
        self._first: float | None = None

    def add(self, amount: float, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        self.total += amount
        if self._first is None:
            self._first = now
        if self._buckets and now - self._buckets[-1][0] < self.bucket_s:
            self._buckets[-1][1] += amount
        else:
            self._buckets.append([now, amount])
        self._trim(now)

    def _trim(self, now: float) -> None:
        while self._buckets and self._buckets[0][0] < now - self.window_s:
            self._buckets.popleft()

    def rate(self, now: float | None = None) -> float:
        now = time.monotonic() if now is None else now
        self._trim(now)
        return self._rate(now, self._buckets)

    def peek_rate(self, now: float | None = None) -> float:
        """The same, without changing anything: safe from another thread (the metrics server's)."""
        now = time.monotonic() if now is None else now
        buckets = [b for b in list(self._buckets) if b[0] >= now - self.window_s]  # list(): one C call under the GIL
        return self._rate(now, buckets)

    def _rate(self, now: float, buckets: Iterable[list[float]]) -> float:
        if self._first is None:
            return 0.0
        span = min(self.window_s, now - self._first)
        if span < 0.5:  # too little history to say
            return 0.0
        return sum(b[1] for b in buckets) / span


@dataclass
class PrefixTally:
    """The job's prompt tokens one server looked up in its prefix cache and found there, summed from its
    counters' increases between scrapes (so a restart, counters from zero, loses nothing before it)."""

    looked_up: float = 0.0
    hits: float = 0.0

    def add(self, looked_up: float, hits: float) -> None:
        if looked_up > 0:  # a counter that went down is a restarted server: nothing to add
            self.looked_up += looked_up
            self.hits += min(looked_up, max(0.0, hits))

    def hit_rate(self) -> float | None:
        return self.hits / self.looked_up if self.looked_up > 0 else None


@dataclass
class ServerStats:
    name: str
    base_url: str
    state: str = "up"
    state_reason: str = ""  # why a server is out for good (a crash loop, stopped by the user)
    limit: int = 0
    limit_source: str = ""  # why this limit: fixed | bench | capacity | search
    limit_reason: str = ""  # the controller's last decision
    in_flight: int = 0
    requests: int = 0
    errors: int = 0
    completion_tokens: int = 0
    prompt_tokens: int = 0
    latency_sum_s: float = 0.0
    recent_latency_s: float = (
        0.0  # moving mean of the last few dozen answers: a request's lifetime at the current limit
    )
    outages: int = 0
    restarts: int = 0
    meter: RateMeter = field(default_factory=RateMeter)
    recent_latencies: deque[float] = field(default_factory=lambda: deque(maxlen=SPREAD_ANSWERS))
    prefix_cache: PrefixTally = field(default_factory=PrefixTally)  # from the server's /metrics

    def mean_latency_s(self) -> float:
        return self.latency_sum_s / self.requests if self.requests else 0.0

    def add_latency(self, latency_s: float) -> None:
        """One answer's latency. The job's mean is dominated by the first (small-batch, fast) requests;
        the recent mean follows the lifetime at the limit in force, which sets how long a window must be."""
        self.latency_sum_s += latency_s
        self.recent_latencies.append(latency_s)
        self.recent_latency_s = (
            latency_s
            if self.requests <= 1
            else self.recent_latency_s + LIFETIME_WEIGHT * (latency_s - self.recent_latency_s)
        )

    def lifetime_s(self) -> float:
        """A request's lifetime now (seconds from sending to its answer; 0 before the first answer)."""
        return self.recent_latency_s if self.requests else 0.0

    def latency_spread(self) -> float | None:
        """How far the recent answers' latencies differ (standard deviation / mean; None before 8 answers).
        Uniform work (every request alike) ends in waves: near 0. A dataset's lengths spread it to 0.5 or more."""
        xs = self.recent_latencies
        if len(xs) < 8:
            return None
        # plain floats: statistics.pstdev (exact fractions) took 74 us for 64 answers, this 5 us, on every dispatcher tick
        mean = sum(xs) / len(xs)
        return (sum((x - mean) ** 2 for x in xs) / len(xs)) ** 0.5 / mean if mean > 0 else None


@dataclass
class JobStats:
    total: int = 0  # valid ids in the input
    done_before: int = 0  # committed by earlier runs
    to_send: int = 0  # what this run set out to do
    done: int = 0  # answered in this run (committed or about to be)
    committed: int = 0  # rows of this run in committed shards
    failed: int = 0
    retries: int = 0
    requeued: int = 0
    rejected: int = 0
    completion_tokens: int = 0
    prompt_tokens: int = 0
    shards: int = 0
    started: float = field(default_factory=time.monotonic)
    servers: dict[str, ServerStats] = field(default_factory=dict)
    events: deque[str] = field(default_factory=lambda: deque(maxlen=200))
    events_total: int = 0  # events ever recorded (the deque keeps the last 200)
    meter: RateMeter = field(default_factory=RateMeter)
    # an elastic job (generate/membership.py): joins, leaves, replacements, releases, handovers so far
    membership: dict[str, int] = field(default_factory=dict)
    width: int | None = None  # servers taking requests now (None: not counted, a job of fixed servers)

    def elapsed_s(self, now: float | None = None) -> float:
        return (time.monotonic() if now is None else now) - self.started

    def avg_tps(self, now: float | None = None) -> float:
        e = self.elapsed_s(now)
        return self.completion_tokens / e if e > 0 else 0.0

    def instant_tps(self, now: float | None = None) -> float:
        return self.meter.rate(now)

    def remaining(self) -> int:
        return max(0, self.to_send - self.done - self.failed)

    def eta_s(self, now: float | None = None) -> float | None:
        """Remaining requests at the recent request rate (None until there is one, and while no
        server is up: nothing is served, so no rate of before says when it will end)."""
        e = self.elapsed_s(now)
        if self.done == 0 or e <= 0:
            return None
        if self.servers and not any(s.state == "up" for s in self.servers.values()):
            return None
        return self.remaining() / (self.done / e)

    def event(self, text: str) -> None:
        self.events.append(f"{self.elapsed_s():7.1f}s {text}")
        self.events_total += 1
