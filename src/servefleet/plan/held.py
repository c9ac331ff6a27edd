"""What each server gave at each concurrency it held during a job, from the job's timeline, and how
that compares with the bench run the plan used.

A plan's miss has two kinds of cause: the model (the ramp, the tail, the limit's changes, a bench that
measured the wrong thing) or the server itself running at another speed during the job than when it
was benched (another load on the host, other clocks, other prompts). Only the second shows as a
difference *at the same concurrency*: so, per server, the stretches of the timeline where the
concurrency limit stayed put, without the transient after each change (two request lifetimes, by
Little's law from the stretch's own in-flight count and answers) and without buckets where the
server was not full (the ramp, the drain, an outage), give the job's own rate at that concurrency.

Non-streamed answers land in the bucket where they finish, so a rate needs several lifetimes of
buckets: a stretch shorter than ``MIN_LIFETIMES`` lifetimes or ``MIN_BUCKETS`` buckets is left out.
Pure: the timeline JSON that ``generate`` writes (``timeline/RUN_ID.json``) in, data out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from servefleet.plan.planner import Curve

__all__ = ["HeldRate", "BenchComparison", "held_rates", "against_bench", "SETTLE_LIFETIMES"]

SETTLE_LIFETIMES = 2.0  # after a change of limit, the answers in flight still carry the old one's pace
MIN_LIFETIMES = 3.0
MIN_BUCKETS = 5
FULL = 0.9  # a bucket counts when its mean in flight is at least this share of the limit


@dataclass(frozen=True)
class HeldRate:
    server: str
    concurrency: int
    seconds: float  # settled, full buckets at this limit (all stretches of it)
    output_tps: float
    lifetime_s: float  # mean request lifetime over those buckets (Little's law)


@dataclass(frozen=True)
class BenchComparison:
    held: HeldRate
    benched_tps: float

    @property
    def error_pct(self) -> float:
        """(job - bench) / bench, in percent: negative = the server ran slower in the job."""
        return (self.held.output_tps - self.benched_tps) / self.benched_tps * 100 if self.benched_tps else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "server": self.held.server,
            "concurrency": self.held.concurrency,
            "seconds": round(self.held.seconds, 1),
            "job_tps": round(self.held.output_tps, 1),
            "benched_tps": round(self.benched_tps, 1),
            "error_pct": round(self.error_pct, 2),
        }


def held_rates(timelines: Iterable[Mapping[str, Any]]) -> list[HeldRate]:
    """Per server and concurrency limit, the job's settled rate (every run's timeline together)."""
    acc: dict[tuple[str, int], list[float]] = {}  # tokens, seconds, in-flight x seconds, answers
    for tl in timelines:
        width = float(tl.get("bucket_s") or 1.0)
        for name, cols in (tl.get("servers") or {}).items():
            for limit, buckets in _stretches(cols):
                kept = _settled(buckets, limit, width, cols)
                if kept is None:
                    continue
                a = acc.setdefault((name, limit), [0.0, 0.0, 0.0, 0.0])
                for i in kept:
                    a[0] += cols["output_tokens"][i]
                    a[1] += width
                    a[2] += cols["in_flight_mean"][i] * width
                    a[3] += cols["requests"][i]
    out = []
    for (name, limit), (tokens, seconds, inflight_s, answers) in sorted(acc.items()):
        if seconds > 0 and answers > 0:
            out.append(HeldRate(name, limit, seconds, tokens / seconds, inflight_s / answers))
    return out


def against_bench(held: Iterable[HeldRate], curve: Curve) -> list[BenchComparison]:
    """The held rates at concurrencies inside the bench's measured range (the curve is only
    extrapolated beyond it), longest-held first."""
    lo, hi = curve.concurrency[0], curve.concurrency[-1]
    rows = [BenchComparison(h, curve.total(h.concurrency)) for h in held if lo <= h.concurrency <= hi]
    return sorted(rows, key=lambda r: -r.held.seconds)


def _stretches(cols: Mapping[str, list[Any]]) -> list[tuple[int, list[int]]]:
    """Runs of consecutive buckets with one limit and no time out of service."""
    limits, down = cols.get("limit") or [], cols.get("down_s") or []
    out: list[tuple[int, list[int]]] = []
    for i, limit in enumerate(limits):
        if limit <= 0 or (i < len(down) and down[i] > 0):
            out.append((0, []))  # a break
            continue
        if out and out[-1][0] == limit and out[-1][1] and out[-1][1][-1] == i - 1:
            out[-1][1].append(i)
        else:
            out.append((int(limit), [i]))
    return [(limit, idx) for limit, idx in out if idx]


def _settled(buckets: list[int], limit: int, width: float, cols: Mapping[str, list[Any]]) -> list[int] | None:
    """The stretch's full buckets after its transient, or None when too few are left to read a rate."""
    full = [i for i in buckets if cols["in_flight_mean"][i] >= FULL * limit]
    answers = sum(cols["requests"][i] for i in full)
    if not full or answers == 0:
        return None
    lifetime = sum(cols["in_flight_mean"][i] for i in full) * width / answers
    skip = buckets[0] + SETTLE_LIFETIMES * lifetime / width
    kept = [i for i in full if i >= skip]
    if len(kept) < MIN_BUCKETS or len(kept) * width < MIN_LIFETIMES * lifetime:
        return None
    return kept
