"""One ready candidate measured in the job's mode: the job's own sampled prompts (their lengths and
``max_tokens``, no ``ignore_eos``), non-streaming, at concurrencies found by measurement -- from a
start, doubled while output tokens/s still grow by ``GROWTH`` and the server's max running is not
passed -- each point a ``servefleet bench`` point, all of them one RUN.json."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servefleet.bench.result import BenchConfig, Point, Run
from servefleet.bench.sweep import BenchTarget, auto_workers, run_bench
from servefleet.capacity import Capacity

__all__ = ["Ladder", "Measurement", "measure", "merge_runs", "GROWTH"]

GROWTH = 1.05  # a doubling that gains less than 5 % output tokens/s has found the knee


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
) -> Measurement:
    """Measure up the ladder; ``stop_after(points)`` may end it after any point with a reason."""
    got = Measurement()
    extra = dict(options or {})
    ignore_eos = bool(extra.pop("ignore_eos", False))  # the job's records say; else as a job runs: answers end at EOS
    temperature = extra.pop("temperature", None)
    c: int | None = ladder.first()
    while c is not None:
        config = BenchConfig(
            concurrency=[c],
            requests=ladder.requests(c),
            dataset=str(sample),
            api=api,
            ignore_eos=ignore_eos,
            temperature=temperature,
            extra_body=extra,
            workers=auto_workers(c),
            seed=seed,
        )
        t0 = time.monotonic()
        run = await run_bench(target, config)
        got.measured_s += time.monotonic() - t0
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
    return got


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
