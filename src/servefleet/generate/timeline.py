"""The job's time series: what each server did, second by second at first, in a bounded record.

Sampled from :class:`~servefleet.generate.stats.JobStats` about once a second and kept in at most
``max_buckets`` buckets per series: when they are full, neighbours are merged in pairs and the
bucket width doubles (1 s, 2 s, 4 s, ...). So the record's size does not grow with the job: 480
buckets cover 8 minutes at 1 s and a week at 34 min (2,048 s). Per bucket and server: output tokens,
answers, errors (sums), requests in flight (mean and max), the concurrency limit (last) and seconds
not in service; per bucket for the job: answered, failed, retries, output tokens, and the servers in
service (``serving``: their mean number, which an elastic job's joins and leaves change). Events (a
server joined, taken out, back, given up, restarted; the job's text events) are kept up to ``max_events`` each,
the first half and the most recent half, with the number left out.

Times are seconds since the run started (``started``, a UNIX time, places runs of one job on one
axis). Pure: no I/O, no clock (callers pass ``now``).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

from servefleet.generate.stats import JobStats

__all__ = ["Timeline", "ServerSample", "MAX_BUCKETS", "MAX_EVENTS", "TIMELINE_VERSION"]

TIMELINE_VERSION = 1
MAX_BUCKETS = 480  # even: buckets merge in pairs
MAX_EVENTS = 400

# per-server columns and how two neighbouring buckets merge
_SERVER_SUM = ("tokens", "requests", "errors", "in_flight_sum", "samples", "down_s")
_SERVER_MAX = ("in_flight_max",)
_SERVER_LAST = ("limit",)
_JOB_SUM = ("done", "failed", "retries", "tokens")


@dataclass(frozen=True)
class ServerSample:
    """One server's counters at one moment (cumulative numbers since the run started)."""

    tokens: int
    requests: int
    errors: int
    in_flight: int
    limit: int
    state: str  # up | down | gone
    restarts: int
    outages: int

    @classmethod
    def of(cls, s: Any) -> ServerSample:
        return cls(s.completion_tokens, s.requests, s.errors, s.in_flight, s.limit, s.state, s.restarts, s.outages)


class _Events:
    """The first ``cap // 2`` events and the last ``cap // 2``, with how many were left out between."""

    def __init__(self, cap: int) -> None:
        self.head: list[dict[str, Any]] = []
        self.tail: deque[dict[str, Any]] = deque(maxlen=cap - cap // 2)
        self.cap_head = cap // 2
        self.total = 0

    def add(self, event: dict[str, Any]) -> None:
        self.total += 1
        if len(self.head) < self.cap_head:
            self.head.append(event)
        else:
            self.tail.append(event)

    def to_json(self) -> dict[str, Any]:
        return {
            "items": [*self.head, *self.tail],
            "total": self.total,
            "left_out": self.total - len(self.head) - len(self.tail),
        }

    def copy(self) -> _Events:
        out = _Events.__new__(_Events)
        out.head, out.tail, out.cap_head, out.total = (
            list(self.head),
            deque(self.tail, self.tail.maxlen),
            self.cap_head,
            self.total,
        )
        return out


class Timeline:
    def __init__(
        self, started: float, *, bucket_s: float = 1.0, max_buckets: int = MAX_BUCKETS, max_events: int = MAX_EVENTS
    ) -> None:
        if max_buckets < 2 or max_buckets % 2:
            raise ValueError("max_buckets must be even and at least 2")
        self.started = started  # UNIX time of the run's start
        self.bucket_s = bucket_s
        self.max_buckets = max_buckets
        self.job: dict[str, list[float]] = {k: [] for k in _JOB_SUM}
        self.servers: dict[str, dict[str, list[float]]] = {}
        self.events = _Events(max_events)  # servers' state changes (structured)
        self.messages = _Events(max_events)  # the job's text events
        self.serving: dict[str, list[float]] = {"sum": [], "samples": []}  # servers in service (state up), per sample
        self._n = 0  # buckets so far
        self._last: dict[str, ServerSample] = {}
        self._last_job: tuple[int, int, int, int] = (0, 0, 0, 0)
        self._last_t: float | None = None
        self._events_seen = 0

    # ---- sampling -------------------------------------------------------------------------------
    def sample(self, now: float, stats: JobStats) -> None:
        """Add what changed since the previous sample (``now``: UNIX time). A change happened over
        (t - dt, t]: it is shared between the buckets that interval overlaps, in proportion (whole
        numbers, the total kept exactly), so samples that drift against the buckets' edges leave no
        spikes; what is read at an instant (in flight, the limit) goes to the bucket of t."""
        t = max(0.0, now - self.started)
        dt = t if self._last_t is None else max(0.0, t - self._last_t)
        self._last_t = t
        i = self._bucket(t)
        shares = self._shares(t - dt, t, i)
        job = (stats.done, stats.failed, stats.retries, stats.completion_tokens)
        for key, new, old in zip(_JOB_SUM, job, self._last_job, strict=True):
            _spread(self.job[key], new - old, shares)
        self._last_job = job
        first = not self._last  # nothing sampled yet: the servers present now did not join
        servers = list(stats.servers.items())
        for name, st in servers:
            if name not in self.servers and not first:
                self.events.add({"t": round(t, 3), "server": name, "kind": "join"})
            self._sample_server(name, ServerSample.of(st), t, dt, i, shares)
        self.serving["sum"][i] += sum(1 for _, st in servers if st.state == "up")
        self.serving["samples"][i] += 1
        self._take_messages(t, stats)

    def _shares(self, a: float, b: float, last: int) -> list[tuple[int, float]]:
        """(bucket, fraction) of the interval [a, b] that falls in each bucket up to ``last``."""
        w = self.bucket_s
        first = max(0, min(last, int(a // w)))
        if first == last or b <= a:
            return [(last, 1.0)]
        return [(k, (min(b, (k + 1) * w) - max(a, k * w)) / (b - a)) for k in range(first, last + 1)]

    def _sample_server(
        self, name: str, s: ServerSample, t: float, dt: float, i: int, shares: list[tuple[int, float]]
    ) -> None:
        cols = self.servers.get(name)
        if cols is None:
            cols = self.servers[name] = {k: [0.0] * self._n for k in (*_SERVER_SUM, *_SERVER_MAX, *_SERVER_LAST)}
            cols["limit"] = [float(s.limit)] * self._n
        prev = self._last.get(name)
        base = prev or ServerSample(0, 0, 0, 0, s.limit, "up", 0, 0)
        _spread(cols["tokens"], s.tokens - base.tokens, shares)
        _spread(cols["requests"], s.requests - base.requests, shares)
        _spread(cols["errors"], s.errors - base.errors, shares)
        cols["in_flight_sum"][i] += s.in_flight
        cols["samples"][i] += 1
        cols["in_flight_max"][i] = max(cols["in_flight_max"][i], s.in_flight)
        cols["limit"][i] = s.limit
        if s.state != "up":
            for k, frac in shares:
                cols["down_s"][k] += dt * frac
        self._state_events(name, base, s, t, dt)
        if s.restarts > base.restarts:
            self.events.add({"t": round(t, 3), "server": name, "kind": "restart", "count": s.restarts - base.restarts})
        self._last[name] = s

    def _state_events(self, name: str, before: ServerSample, now: ServerSample, t: float, dt: float) -> None:
        """Outages from the state and from the outage counter: a server taken out and back between two
        samples (a quick restart) shows only in the counter; it is placed in the middle of the interval."""
        was_up, is_up = before.state == "up", now.state == "up"
        seen_down = 1 if was_up and not is_up else 0
        blips = max(0, now.outages - before.outages - seen_down)
        if not was_up and (is_up or blips):
            self.events.add({"t": round(t, 3), "server": name, "kind": "back"})
        for _ in range(blips):
            self.events.add({"t": round(t - dt / 2, 3), "server": name, "kind": "outage"})
            self.events.add({"t": round(t, 3), "server": name, "kind": "back"})
        if not is_up and (was_up or blips):
            self.events.add({"t": round(t, 3), "server": name, "kind": "outage"})
        if now.state == "gone" and before.state != "gone":
            self.events.add({"t": round(t, 3), "server": name, "kind": "gone"})

    def _take_messages(self, t: float, stats: JobStats) -> None:
        fresh = min(stats.events_total - self._events_seen, len(stats.events))
        self._events_seen = stats.events_total
        for text in list(stats.events)[len(stats.events) - fresh :] if fresh > 0 else []:
            self.messages.add({"t": round(t, 3), "text": _without_elapsed(text)})

    # ---- buckets --------------------------------------------------------------------------------
    def _bucket(self, t: float) -> int:
        i = int(t // self.bucket_s)
        while i >= self.max_buckets:
            self._halve()
            i = int(t // self.bucket_s)
        while self._n <= i:
            self._append()
        return i

    def _append(self) -> None:
        self._n += 1
        for col in (*self.job.values(), *self.serving.values()):
            col.append(0.0)
        for cols in self.servers.values():
            for key, col in cols.items():
                col.append(col[-1] if key == "limit" and col else 0.0)

    def _halve(self) -> None:
        """Merge neighbours in pairs: half as many buckets, twice as wide."""
        if self._n % 2:
            self._append()
        for key, col in self.job.items():
            self.job[key] = _pairs(col, "sum")
        for key, col in self.serving.items():
            self.serving[key] = _pairs(col, "sum")
        for cols in self.servers.values():
            for key, col in cols.items():
                cols[key] = _pairs(col, "sum" if key in _SERVER_SUM else "max" if key in _SERVER_MAX else "last")
        self._n //= 2
        self.bucket_s *= 2

    # ---- output ---------------------------------------------------------------------------------
    def frozen(self) -> Timeline:
        """A copy that later samples do not change (shallow copies of the columns: a few ms for 256
        servers), so it can be encoded in another thread while sampling goes on."""
        out = Timeline.__new__(Timeline)
        out.__dict__.update(self.__dict__)
        out.job = {k: list(v) for k, v in self.job.items()}
        out.servers = {name: {k: list(v) for k, v in cols.items()} for name, cols in self.servers.items()}
        out.events, out.messages = self.events.copy(), self.messages.copy()
        out.serving = {k: list(v) for k, v in self.serving.items()}
        out._last = dict(self._last)
        return out

    def to_json(self, **extra: Any) -> dict[str, Any]:
        servers = {}
        for name, cols in self.servers.items():
            servers[name] = {
                "output_tokens": [int(v) for v in cols["tokens"]],
                "requests": [int(v) for v in cols["requests"]],
                "errors": [int(v) for v in cols["errors"]],
                "in_flight_mean": [
                    round(s / n, 2) if n else 0.0 for s, n in zip(cols["in_flight_sum"], cols["samples"], strict=True)
                ],
                "in_flight_max": [int(v) for v in cols["in_flight_max"]],
                "limit": [int(v) for v in cols["limit"]],
                "down_s": [round(v, 2) for v in cols["down_s"]],
            }
        return {
            "version": TIMELINE_VERSION,
            "started": self.started,
            "bucket_s": self.bucket_s,
            "buckets": self._n,
            "max_buckets": self.max_buckets,
            "job": {("output_tokens" if k == "tokens" else k): [int(v) for v in col] for k, col in self.job.items()},
            "serving": [
                round(s / n, 2) if n else 0.0
                for s, n in zip(self.serving["sum"], self.serving["samples"], strict=True)
            ],
            "servers": servers,
            "events": self.events.to_json(),
            "messages": self.messages.to_json(),
            **extra,
        }


def _pairs(col: list[float], how: str) -> list[float]:
    out = []
    for a, b in zip(col[0::2], col[1::2], strict=True):
        out.append(a + b if how == "sum" else max(a, b) if how == "max" else b)
    return out


def _without_elapsed(text: str) -> str:
    """JobStats.event's text without its "  12.3s " prefix (the record has its own time)."""
    head, sep, rest = text.partition("s ")
    try:
        float(head)
    except ValueError:
        return text
    return rest if sep else text


def _spread(col: list[float], amount: int, shares: list[tuple[int, float]]) -> None:
    """Add a whole ``amount`` over the buckets of ``shares``: cumulative rounding keeps the total exact."""
    if len(shares) == 1:
        col[shares[0][0]] += amount
        return
    given, cum = 0, 0.0
    for k, frac in shares:
        cum += frac
        part = round(amount * cum) - given
        col[k] += part
        given += part
    col[shares[-1][0]] += amount - given
