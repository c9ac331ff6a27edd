"""Turn measured throughput-vs-concurrency curves into a makespan for a whole job.

For each configuration: the best concurrency within its cap (max running requests), the
steady-state throughput of one replica there, and the makespan of N prompts on G GPUs. The tail
is simulated, not ignored: when the queue runs dry the last requests of each replica finish at
falling concurrency (each faster per request, the replica slower in total) — this is what makes a
fast-per-request configuration win a tiny job even when it loses a large one.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Annotated

import pydantic
from pydantic import Field

__all__ = [
    "Curve",
    "ConfigCurve",
    "JobSpec",
    "PlanRow",
    "PointSample",
    "TailModel",
    "plan_job",
    "prefix_hit_rate_of",
    "simulate_makespan",
    "steady_curve",
    "tail_model",
]


@dataclass(frozen=True)
class Curve:
    """Output tokens/s of one replica at each measured concurrency (sorted, interpolated linearly;
    flat beyond the last measured point — a conservative extrapolation)."""

    concurrency: tuple[int, ...]
    output_tps: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.concurrency or len(self.concurrency) != len(self.output_tps):
            raise ValueError("a curve needs at least one (concurrency, throughput) point")
        pairs = sorted(zip(self.concurrency, self.output_tps, strict=True))
        object.__setattr__(self, "concurrency", tuple(p[0] for p in pairs))
        object.__setattr__(self, "output_tps", tuple(p[1] for p in pairs))

    def total(self, c: float) -> float:
        """Replica throughput at concurrency c (c may be fractional inside the tail)."""
        xs, ys = self.concurrency, self.output_tps
        if c <= 0:
            return 0.0
        if c <= xs[0]:
            # below the first point, per-request speed is at least that at xs[0]
            return ys[0] * c / xs[0]
        if c >= xs[-1]:
            return ys[-1]
        i = bisect.bisect_left(xs, c)
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        return y0 + (y1 - y0) * (c - x0) / (x1 - x0)

    def per_request(self, c: float) -> float:
        return self.total(c) / c if c > 0 else 0.0


@dataclass(frozen=True)
class ConfigCurve:
    name: str
    curve: Curve
    gpus_per_replica: int = 1
    max_running: int | None = None  # the server's cap (from capacity facts)
    measured_mode: str = "non-streaming"  # how the bench run's answers came (a batch job does not stream)
    caveats: tuple[str, ...] = ()  # what the plan from this run rests on that bench did not measure well
    prefix_cache_hit_rate: float | None = None  # share of the bench's prompt tokens the engine had cached

    def best(self) -> tuple[int, float, list[str]]:
        """(best concurrency, its throughput, notes) within the cap."""
        notes: list[str] = []
        cap = self.max_running or math.inf
        points = [(c, t) for c, t in zip(self.curve.concurrency, self.curve.output_tps, strict=True) if c <= cap]
        if not points:
            c0 = self.curve.concurrency[0]
            notes.append(
                f"every measured concurrency is above the cap {self.max_running}; using {self.max_running} scaled from {c0}"
            )
            c = int(cap)
            return c, self.curve.total(c), notes
        c, t = max(points, key=lambda p: p[1])
        if self.max_running and self.curve.concurrency[-1] < self.max_running:
            notes.append(
                f"measured only up to concurrency {self.curve.concurrency[-1]} (cap {self.max_running}); "
                "throughput beyond it is assumed flat (conservative)"
            )
        return c, t, notes


def prefix_hit_rate_of(told: Iterable[tuple[float, int]]) -> float | None:
    """One prefix-cache hit rate from several (rate, requests) measurements, weighted by their requests
    (None: none with a request told one)."""
    pairs = [(rate, n) for rate, n in told if n > 0]
    requests = sum(n for _, n in pairs)
    return sum(rate * n for rate, n in pairs) / requests if requests else None


@pydantic.dataclasses.dataclass(frozen=True)
class JobSpec:
    """The job to plan; refused (pydantic.ValidationError) unless both are positive."""

    prompts: Annotated[int, Field(ge=1)]
    output_tokens_mean: Annotated[float, Field(gt=0, allow_inf_nan=False)]


@dataclass
class PlanRow:
    name: str
    best_concurrency: int
    replica_tps: float
    tps_per_gpu: float
    gpus: int
    replicas: int
    makespan_s: float
    gpu_hours: float
    cost: float | None
    notes: list[str] = field(default_factory=list)
    caveats: list[str] = field(default_factory=list)  # the configuration's (ConfigCurve.caveats)


def _drain(curve: Curve, remaining: list[float]) -> float:
    """Seconds for one replica to finish requests with these remaining token counts, no new
    arrivals: all run at once, each at the per-request speed of the current concurrency."""
    remaining = sorted(remaining)
    t = 0.0
    done = 0.0  # tokens already produced by every still-running request since the drain began
    n = len(remaining)
    for i, r in enumerate(remaining):
        k = n - i
        speed = curve.per_request(k)
        if speed <= 0:
            return math.inf
        t += (r - done) / speed
        done = r
    return t


def simulate_makespan(curve: Curve, concurrency: int, replicas: int, job: JobSpec) -> float:
    """Makespan of ``job`` on ``replicas`` identical replicas, each kept at ``concurrency``.

    Steady state: every replica runs ``concurrency`` requests, a new one starting as one ends, so
    at any moment their remaining work is spread evenly over (0, M]. Once the queue is empty the
    replica drains those. A job too small to fill the slots starts everything at once."""
    m = job.output_tokens_mean
    slots = concurrency * replicas
    if replicas <= 0 or job.prompts <= 0:
        return 0.0 if job.prompts <= 0 else math.inf
    if job.prompts <= slots:
        per_replica = math.ceil(job.prompts / replicas)
        return _drain(curve, [m] * per_replica)
    # Tokens left in flight when the queue empties: the even spread sums to c * M / 2 per replica.
    spread = _spread(m, concurrency)
    steady_tokens = job.prompts * m - _tail_tokens(m, slots)
    steady_s = steady_tokens / (curve.total(concurrency) * replicas)
    return steady_s + _drain(curve, spread)


def _spread(m: float, concurrency: int) -> list[float]:
    """Remaining tokens of the requests in flight when the last one starts (the drain's input)."""
    return [m * (j + 1) / concurrency for j in range(concurrency)]


def _tail_tokens(m: float, slots: int) -> float:
    """Tokens the steady phase leaves to the drain (the same accounting in both directions:
    :func:`simulate_makespan` predicts with it, :func:`steady_curve` inverts with it)."""
    return slots * m / 2


@dataclass(frozen=True)
class TailModel:
    """The tail of a predicted job, from the last prompt going out (``queue_empty_s``) to its end."""

    queue_empty_s: float
    makespan_s: float
    finish_s: tuple[float, ...]  # each replica's last answer

    @property
    def held_server_s(self) -> float:
        """Server-seconds from the queue emptying to the end, every replica held (no --release-tail)."""
        return len(self.finish_s) * (self.makespan_s - self.queue_empty_s)

    @property
    def released_server_s(self) -> float:
        """What --release-tail returns: each replica given back once its own last answer is in."""
        return sum(self.makespan_s - f for f in self.finish_s)

    def to_json(self) -> dict[str, float]:
        return {
            "queue_empty_s": self.queue_empty_s,
            "makespan_s": self.makespan_s,
            "held_server_s": self.held_server_s,
            "released_server_s": self.released_server_s,
            "first_replica_done_s": min(self.finish_s, default=0.0),
        }


def tail_model(curve: Curve, concurrency: int, replicas: int, job: JobSpec) -> TailModel:
    """When each replica of :func:`simulate_makespan`'s model answers its last request.

    That model drains every replica from the same spread, as if each had just started a request
    when the queue emptied. In fact the ``concurrency * replicas`` slots start one after another,
    so at that moment the slots' remaining work is spread over (0, M] in that many steps, dealt
    to the replicas in turn: replica r holds M (r + 1 + R k) / (c R). The replica that took the
    last prompt holds simulate_makespan's spread and ends the job; the others end up to one step
    of the drain sooner. A job too small to fill the slots deals its prompts out unevenly
    (some replicas get one fewer) and starts everything at once. Every answer is M tokens long,
    so the replicas end close together: what release saves in a real job comes mostly from the
    spread of answer lengths, which this model does not see."""
    m, c, r_n = job.output_tokens_mean, concurrency, replicas
    if r_n <= 0:
        return TailModel(0.0, math.inf, ())
    if job.prompts <= c * r_n:
        counts = [job.prompts // r_n + (1 if r < job.prompts % r_n else 0) for r in range(r_n)]
        finish = tuple(_drain(curve, [m] * k) if k else 0.0 for k in counts)
        return TailModel(0.0, max(finish), finish)
    steady_s = (job.prompts * m - _tail_tokens(m, c * r_n)) / (curve.total(c) * r_n)
    finish = tuple(steady_s + _drain(curve, [m * (r + 1 + r_n * k) / (c * r_n) for k in range(c)]) for r in range(r_n))
    return TailModel(steady_s, max(finish), finish)


@dataclass(frozen=True)
class PointSample:
    """One closed-loop bench point as measured: ``requests`` answered by ``concurrency`` users in
    ``duration_s`` (first start to last end), ``output_tokens`` in all."""

    concurrency: int
    requests: int
    output_tokens: float
    duration_s: float
    deadline_s: float | None = None  # a --duration point: no request started after this (from the first start)


def steady_curve(points: list[PointSample], rounds: int = 4) -> Curve:
    """The steady-state throughput behind finite bench points.

    A bench point is itself a small job: its users start together, and once the last request has
    gone out (the request count or the deadline is reached) the ones in flight finish at falling
    concurrency. Its tokens/s (tokens over first start to last end) therefore includes one drain,
    and a point of a few seconds reads several percent under what the server sustains while it is
    kept full -- which is what a long ``generate`` sees. Feeding that figure to
    :func:`simulate_makespan`, which adds the job's own tail, would count the drain twice and predict
    a long job too slow by the same few percent.

    So each point is inverted through the same model the planner predicts with: its tokens are
    ``T * steady time + tail tokens``, solved for T. A ``--duration`` point knows its steady time:
    the deadline, after which nothing new started (the drain is whatever came after it). A
    ``--requests`` point does not: its duration is ``steady + drain``, the drain timed with the
    per-request speeds of the curve being solved for, so this iterates a few rounds (it converges
    quickly: the drain is a small part of a point). A point never reads below what was measured,
    and one that never filled its users (N <= c) is left as measured."""
    if not points:
        raise ValueError("a curve needs at least one point")
    raw = [p.output_tokens / p.duration_s if p.duration_s > 0 else 0.0 for p in points]
    conc = tuple(p.concurrency for p in points)
    curve = Curve(conc, tuple(raw))
    for _ in range(rounds):
        tps = []
        for p, measured in zip(points, raw, strict=True):
            value = measured
            if p.requests > p.concurrency and p.duration_s > 0 and p.output_tokens > 0:
                m = p.output_tokens / p.requests
                if p.deadline_s and 0 < p.deadline_s < p.duration_s:
                    steady_s = p.deadline_s
                else:
                    steady_s = p.duration_s - _drain(curve, _spread(m, p.concurrency))
                if steady_s > 0:
                    value = max(measured, (p.output_tokens - _tail_tokens(m, p.concurrency)) / steady_s)
            tps.append(value)
        curve = Curve(conc, tuple(tps))
    return curve


def plan_job(configs: list[ConfigCurve], job: JobSpec, gpus: int, gpu_hour_cost: float | None = None) -> list[PlanRow]:
    """One row per configuration, ranked by makespan (soonest first)."""
    rows = []
    for cfg in configs:
        conc, tps, notes = cfg.best()
        replicas = gpus // cfg.gpus_per_replica
        if replicas == 0:
            notes = notes + [f"needs {cfg.gpus_per_replica} GPUs per replica; only {gpus} given"]
            makespan = math.inf
        else:
            # a tiny job may do better below the throughput-optimal concurrency: try each measured one
            candidates = [c for c in cfg.curve.concurrency if c <= (cfg.max_running or math.inf)] or [conc]
            best = min(candidates + [conc], key=lambda c: simulate_makespan(cfg.curve, c, replicas, job))
            makespan = simulate_makespan(cfg.curve, best, replicas, job)
            if best != conc:
                notes = notes + [
                    f"for this job size concurrency {best} finishes sooner than the peak-throughput {conc}"
                ]
                conc, tps = best, cfg.curve.total(best)
        used = replicas * cfg.gpus_per_replica
        gpu_hours = makespan * used / 3600 if math.isfinite(makespan) else math.inf
        rows.append(
            PlanRow(
                name=cfg.name,
                best_concurrency=conc,
                replica_tps=tps,
                tps_per_gpu=tps / cfg.gpus_per_replica,
                gpus=used,
                replicas=replicas,
                makespan_s=makespan,
                gpu_hours=gpu_hours,
                cost=gpu_hours * gpu_hour_cost if gpu_hour_cost is not None and math.isfinite(gpu_hours) else None,
                notes=notes,
                caveats=list(cfg.caveats),
            )
        )
    rows.sort(key=lambda r: r.makespan_s)
    return rows
