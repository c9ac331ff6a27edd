"""One ready candidate measured in the job's mode: the job's own sampled prompts (their lengths and
``max_tokens``, no ``ignore_eos``), non-streaming, at concurrencies found by measurement -- from a
start, doubled while output tokens/s still grow by ``GROWTH`` and the server's max running is not
passed -- each point a ``servefleet bench`` point, all of them one RUN.json.

A point whose steady part (bench's window between the ramp and the drain) is under
``MIN_LIFETIMES`` request lifetimes is measured again, longer: a closed-loop point of ``k x C``
requests holds about ``k - 2`` lifetimes of steady time, so ``2 x C`` holds none, and its rate is
mostly the first wave's prefill and the drain. On the H200 every point of ``2 x C`` was unsteady
(0.2-1.4 s of steady time) and the second candidate's predicted makespan was 23 % off the real
job's. The new count gives the missing lifetimes with half a wave to spare, at most
``MAX_PER_CONCURRENCY x C``; later points of the candidate start at the same multiple of their
concurrency. Each lengthening is said in the run's notes.

A job sends each prompt once; a prompt sent again finds its prefix in the engine's cache and costs no
prefill. So every point (its warm-up included) takes the sample's next prompts, none the server has
seen: point after point, lengthened ones too, through the sample in order. Only a sample smaller than
what the points send wraps around, and the run's notes say by how much (give a larger ``--sample``).
The candidates each start at the sample's beginning, on a fresh server: they see the same prompts."""

from __future__ import annotations

import math
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servefleet.bench.result import BenchConfig, Point, Run
from servefleet.bench.steady import MIN_LIFETIMES
from servefleet.bench.sweep import BenchTarget, auto_workers, run_bench
from servefleet.capacity import Capacity

__all__ = ["Ladder", "Measurement", "measure", "merge_runs", "longer_requests", "GROWTH", "MAX_PER_CONCURRENCY"]

GROWTH = 1.05  # a doubling that gains less than 5 % output tokens/s has found the knee
MAX_PER_CONCURRENCY = 8  # a lengthened point sends at most this many times its concurrency


@dataclass(frozen=True)
class Ladder:
    start: int = 8
    point_requests: int = 32
    per_concurrency: int = 4  # measured requests per point: this many times its concurrency, at least point_requests
    max_concurrency: int = 4096
    cap: int | None = None  # the server's max running requests

    def first(self) -> int:
        return max(1, min(self.start, self.cap or self.start, self.max_concurrency))

    def next(self, c: int) -> int | None:
        limit = min(self.cap or self.max_concurrency, self.max_concurrency)
        if c >= limit:
            return None
        return min(c * 2, limit)

    def requests(self, c: int) -> int:
        return max(self.point_requests, self.per_concurrency * c)


@dataclass
class Measurement:
    runs: list[Run] = field(default_factory=list)
    measured_s: float = 0.0
    stopped: str | None = None  # why the ladder stopped before its knee (early stop, budget)

    @property
    def points(self) -> list[Point]:
        return [p for r in self.runs for p in r.points]


async def measure(
    target: BenchTarget,
    sample: Path,
    api: str,
    ladder: Ladder,
    *,
    options: dict[str, Any] | None = None,
    seed: int = 0,
    stop_after: Callable[[list[Point]], str | None] | None = None,
    on_point: Callable[[Point], None] | None = None,
    time_left: Callable[[], float] | None = None,
) -> Measurement:
    """Measure up the ladder; ``stop_after(points)`` may end it after any point with a reason;
    ``time_left()``: seconds of the budget left (a lengthening that would not fit is not made, and said)."""
    got = Measurement()
    pool = _Prompts(sample)
    extra = dict(options or {})
    ignore_eos = bool(extra.pop("ignore_eos", False))  # the job's records say; else as a job runs: answers end at EOS
    temperature = extra.pop("temperature", None)
    per_c = 0.0  # after a lengthening: requests per unit of concurrency that gave a steady part

    async def point(c: int, requests: int) -> Run:
        warmup = c  # one per connection, as bench's default; given here so that the slice holds them too
        dataset = pool.take(requests + warmup)
        config = BenchConfig(
            concurrency=[c],
            requests=requests,
            warmup=warmup,
            dataset=str(dataset),
            api=api,
            ignore_eos=ignore_eos,
            temperature=temperature,
            extra_body=extra,
            workers=auto_workers(c),
            seed=seed,
        )
        t0 = time.monotonic()
        try:
            run = await run_bench(target, config)
        finally:
            dataset.unlink(missing_ok=True)
        got.measured_s += time.monotonic() - t0
        return run

    c: int | None = ladder.first()
    while c is not None:
        requests = max(ladder.requests(c), math.ceil(per_c * c))
        run = await point(c, requests)
        more = longer_requests(run.points[-1], requests) if run.points else None
        if more is not None and time_left is not None and run.points[-1].duration_s * more / requests > time_left():
            run = run.model_copy(
                update={"notes": [*run.notes, f"concurrency {c}: too short to be steady, not lengthened (budget)"]}
            )
            more = None
        if more is not None:
            short = run.points[-1]
            run = await point(c, more)
            per_c = more / c
            said = f"{short.steady.end_s - short.steady.start_s:.1f} s" if short.steady else "none"
            run = run.model_copy(
                update={
                    "notes": [
                        *run.notes,
                        f"concurrency {c}: measured again with {more} requests: {requests} gave a steady part of "
                        f"{said}, under {MIN_LIFETIMES:g} request lifetimes",
                    ]
                }
            )
        got.runs.append(run)
        if on_point and run.points:
            on_point(run.points[-1])
        points = got.points
        if len(points) >= 2 and points[-1].output_tokens_per_s < GROWTH * max(
            p.output_tokens_per_s for p in points[:-1]
        ):
            break  # the knee: throughput stopped growing
        if stop_after is not None:
            got.stopped = stop_after(points)
            if got.stopped:
                break
        c = ladder.next(c)
    if pool.wrapped and got.runs:
        note = (
            f"the sample's {pool.size:,} prompts served {pool.sent:,} requests (warm-ups included): prompts were sent "
            "again, and a repeat's prefix is in the engine's cache (a job sends each prompt once); "
            f"give --sample {pool.sent:,} or more"
        )
        got.runs[-1] = got.runs[-1].model_copy(update={"notes": [*got.runs[-1].notes, note]})
    return got


class _Prompts:
    """The sample's records, handed out in order, each point a slice of its own (a file bench reads)."""

    def __init__(self, sample: Path) -> None:
        self.path = sample
        self.lines = [ln for ln in sample.read_text(encoding="utf-8").splitlines(keepends=True) if ln.strip()]
        self.size = len(self.lines)
        self.sent = 0

    @property
    def wrapped(self) -> bool:
        return self.sent > self.size

    def take(self, n: int) -> Path:
        picked = [self.lines[(self.sent + i) % self.size] for i in range(n)] if self.size else []
        self.sent += n
        fd, name = tempfile.mkstemp(prefix=f"{self.path.stem}-point-", suffix=".jsonl", dir=self.path.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.writelines(ln if ln.endswith("\n") else ln + "\n" for ln in picked)
        return Path(name)


def longer_requests(point: Point, requests: int) -> int | None:
    """The request count that gives ``point``'s concurrency a steady part of ``MIN_LIFETIMES`` lifetimes
    (each further ``C`` requests of a closed loop add about one lifetime, one wave), with half a wave to
    spare; None when the point was steady, unknown, or already at the cap."""
    c = point.concurrency
    if not c or point.steady is None or point.steady.steady or point.successful <= 0 or point.duration_s <= 0:
        return None
    life = point.achieved_concurrency * point.duration_s / point.successful  # mean request lifetime
    if life <= 0:
        return None
    have = max(0.0, point.steady.end_s - point.steady.start_s)
    waves = (MIN_LIFETIMES * life - have) / life + 0.5
    more = min(requests + math.ceil(waves * c), MAX_PER_CONCURRENCY * c)
    return more if more > requests else None


def merge_runs(runs: list[Run], capacity: Capacity | None) -> Run:
    """The points of one candidate's per-point runs as one RUN.json (what `plan` and `generate --bench` read)."""
    first = runs[0]
    levels = [p.concurrency for r in runs for p in r.points if p.concurrency]
    config = first.config.model_copy(
        update={
            "concurrency": levels,
            "requests": max(r.config.requests or 0 for r in runs) or None,
            "workers": max(r.config.workers for r in runs),
        }
    )
    notes = list(dict.fromkeys(n for r in runs for n in r.notes))
    return first.model_copy(
        update={
            "tool": "servefleet tune",
            "config": config,
            "points": [p for r in runs for p in r.points],
            "notes": notes,
            "capacity": first.capacity or capacity,
        }
    )
