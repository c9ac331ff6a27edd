"""The tune: every candidate launched as a temporary server (on one GPU in turn: one launch, its
measurement, its stop, then the next; candidates on GPUs of their own in lanes beside each other),
verified, measured in the job's mode on the sample, and ranked by the planner's predicted makespan of
the whole job.

Stopping early: after its first measurement (two points) and each one after, a candidate whose
*optimistic* makespan -- its throughput assumed to keep growing at its last doubling's rate up to its
max running -- is still ``margin`` behind the best candidate measured so far is stopped: more points
cannot make it win. Within ``--budget``: a candidate whose launch and first measurement would not fit
in what is left is skipped, and one that reaches the budget while measuring stops there; the result
says which ran and which did not.

Everything that can be refused is refused by :func:`prepare`, before anything is launched.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from servefleet.bench.result import Point, save_run
from servefleet.bench.sweep import BenchTarget
from servefleet.catalog import State
from servefleet.errors import ConfigError, ServefleetError
from servefleet.fleet import Fleet
from servefleet.plan.planner import ConfigCurve, Curve, JobSpec, plan_job
from servefleet.plan.runs import curve_from_run
from servefleet.tune.candidates import BaseFleet, CandidateFleet, candidate_fleets, load_base
from servefleet.tune.measure import Ladder, Measurement, measure, merge_runs
from servefleet.tune.result import CandidateRow, Prediction, TuneResult
from servefleet.tune.sample import JobSample, sample_job
from servefleet.tune.space import Space, load_space

__all__ = ["TuneRequest", "Prepared", "prepare", "run_tune"]

Event = Callable[[str], None]


@dataclass(frozen=True)
class TuneRequest:
    fleet: Path
    space: Path
    input: Path
    out: Path
    sample: int = 10_000  # every point takes prompts of its own (measure.py): room for a ladder of them
    gpus: tuple[int, ...] = (1,)
    budget_s: float | None = None
    server: str | None = None
    max_tokens: int | None = None
    seed: int = 0


@dataclass
class Prepared:
    request: TuneRequest
    space: Space
    base: BaseFleet
    fleets: list[CandidateFleet]
    sample: JobSample
    startup_s: float | None  # expected seconds to ready of one candidate (the space's, else the base's last start)
    notes: list[str] = field(default_factory=list)


def _recorded_startup(base: BaseFleet) -> float | None:
    """The base server's last time to ready, from its fleet's state (a previous `up`)."""
    try:
        from servefleet.fleet.state import StateStore

        record = StateStore(base.spec.state_dir).load(base.server)
    except (OSError, ValueError, ServefleetError):
        return None
    if record is None or record.ready_at is None:
        return None
    return max(0.0, (record.ready_at - record.launched_at).total_seconds())


def prepare(request: TuneRequest) -> Prepared:
    """Every check that needs nothing launched: the space, each candidate against the base, the budget,
    the input. Raises ConfigError (exit 3) naming the candidate and the key."""
    space = load_space(request.space)
    base = load_base(request.fleet, request.server)
    request.out.mkdir(parents=True, exist_ok=True)
    fleets = candidate_fleets(base, space.candidates, request.out)
    _check_lane_ports(fleets)
    startup = space.settings.startup_s if space.settings.startup_s is not None else _recorded_startup(base)
    if request.budget_s is not None:
        if request.budget_s <= 0:
            raise ConfigError(f"--budget {request.budget_s:g}s: must be above 0")
        if startup is not None and request.budget_s < startup:
            source = (
                "[tune] startup in the space file"
                if space.settings.startup_s is not None
                else "the base server's last start"
            )
            raise ConfigError(
                f"--budget {request.budget_s:g}s is below one candidate's start-up ({startup:g} s, {source}): "
                "not one candidate could be measured; raise --budget"
            )
    sample = sample_job(
        request.input, request.sample, request.out / "sample.jsonl", max_tokens=request.max_tokens, seed=request.seed
    )
    return Prepared(request, space, base, fleets, sample, startup, notes=list(sample.notes))


def _best_point(points: list[Point]) -> Point | None:
    return max(points, key=lambda p: p.output_tokens_per_s, default=None)


def _mean_output(points: list[Point]) -> float | None:
    done = sum(p.successful for p in points)
    return sum(p.output_tokens for p in points) / done if done else None


def _optimistic(points: list[Point], cap: int | None, max_concurrency: int) -> Curve:
    """The curve measured so far, extended as if throughput kept growing at its last doubling's rate up
    to the server's max running (an upper bound: real curves only bend down)."""
    levels = [p.concurrency or 1 for p in points]
    tps = [p.output_tokens_per_s for p in points]
    top = cap or max_concurrency
    if len(points) >= 2 and tps[-2] > 0 and levels[-1] < top:
        rate = max(1.0, tps[-1] / tps[-2]) ** (1 / max(1e-9, math.log2(levels[-1] / levels[-2])))
        levels.append(top)
        tps.append(tps[-1] * rate ** math.log2(top / levels[-2]))
    return Curve(tuple(levels), tuple(tps))


def _makespan(curve: Curve, cap: int | None, gpr: int, prompts: int, mean_out: float, gpus: int) -> float:
    rows = plan_job(
        [ConfigCurve("c", curve, gpus_per_replica=gpr, max_running=cap)],
        JobSpec(prompts=prompts, output_tokens_mean=mean_out),
        gpus,
    )
    return rows[0].makespan_s


class _Clock:
    def __init__(self, budget_s: float | None, now: Callable[[], float]) -> None:
        self.now = now
        self.t0 = now()
        self.budget_s = budget_s

    @property
    def elapsed(self) -> float:
        return self.now() - self.t0

    def left(self) -> float:
        return math.inf if self.budget_s is None else self.budget_s - self.elapsed


def _lanes(fleets: list[CandidateFleet]) -> list[list[CandidateFleet]]:
    """Candidates that share a GPU (or give none: the base's) run in turn, in the space's order; a lane of
    candidates on GPUs of their own (``gpus`` in the candidate) runs beside the others."""
    lanes: dict[tuple[str, tuple[int, ...] | None], list[CandidateFleet]] = {}
    for cf in fleets:
        server = cf.spec.servers[0]
        lanes.setdefault((server.host, server.gpus), []).append(cf)
    groups = list(lanes.values())
    merged: list[list[CandidateFleet]] = []
    for group in groups:  # lanes whose GPU sets overlap (or one without gpus on the same host) are one lane
        gpus = {g for cf in group for g in (cf.spec.servers[0].gpus or ())}
        host = group[0].spec.servers[0].host
        for lane in merged:
            other = {g for cf in lane for g in (cf.spec.servers[0].gpus or ())}
            same_host = lane[0].spec.servers[0].host == host
            if same_host and (not gpus or not other or gpus & other):
                lane.extend(group)
                break
        else:
            merged.append(list(group))
    return merged


def _check_lane_ports(fleets: list[CandidateFleet]) -> None:
    """Candidates measured at the same time (lanes on GPUs of their own) cannot share a port."""
    problems = []
    seen: dict[tuple[str, int], tuple[int, str]] = {}
    for index, lane in enumerate(_lanes(fleets)):
        for cf in lane:
            server = cf.spec.servers[0]
            other = seen.setdefault((server.host, server.port), (index, cf.candidate.name))
            if other[0] != index:
                problems.append(
                    f'candidate "{cf.candidate.name}": port: {server.port} is also that of candidate "{other[1]}", which is '
                    "measured at the same time on other GPUs; give one of them a port of its own (port = N)"
                )
    if problems:
        raise ConfigError("\n".join(problems))


class _Search:
    """The state the candidates share: the budget's clock, launch costs, the best so far."""

    def __init__(self, prep: Prepared, say: Event, clock: _Clock) -> None:
        self.prep, self.say, self.clock = prep, say, clock
        self.costs: list[float] = []  # seconds of each candidate's launch and first measurement
        self.best: tuple[float, str] | None = None  # (predicted makespan, name) of the best measured so far
        self.measured_s = 0.0

    async def lane(self, fleets: list[CandidateFleet], rows: dict[str, CandidateRow]) -> None:
        for cf in fleets:
            await self.one(cf, rows[cf.candidate.name])

    async def one(self, cf: CandidateFleet, row: CandidateRow) -> None:
        prep, clock, say = self.prep, self.clock, self.say
        req, settings, cand = prep.request, prep.space.settings, cf.candidate
        # the latest candidate's launch and first measurement: later starts are often faster (the engine's caches are warm)
        estimate = self.costs[-1] if self.costs else (prep.startup_s or 0.0)
        if clock.left() < estimate or clock.left() <= 0:
            row.outcome = "skipped"
            row.reason = f"budget: {max(0.0, clock.left()):.0f} s left of {req.budget_s:g} s; a candidate takes ~{estimate:.0f} s"
            say(f"{cand.name}: skipped ({row.reason})")
            return
        t_start = clock.now()
        row.started_s = clock.elapsed
        say(f"{cand.name}: launching")
        async with Fleet(cf.spec) as fleet:
            try:
                timeout = min(cf.spec.timeout, max(1.0, clock.left()))
                verdict = (await fleet.up(timeout_s=timeout))[cand.name]
                row.time_to_ready_s = verdict.elapsed_s
                if verdict.state != State.READY:
                    row.outcome = "failed"
                    row.category = verdict.category.value if verdict.category else verdict.state.value
                    row.evidence = (
                        verdict.evidence.text if verdict.evidence else (verdict.message or verdict.last_line)
                    )
                    row.reason = verdict.hint
                    say(f"{cand.name}: {row.category}: {row.evidence}")
                    return
                endpoints = [e for e in await fleet.ready_endpoints() if e.name == cand.name]
                if not endpoints:
                    row.outcome, row.category, row.evidence = (
                        "failed",
                        "other",
                        "ready, then no longer answering before its measurement",
                    )
                    return
                ep = endpoints[0]
                row.kv_tokens, row.max_running = ep.capacity.kv_cache_tokens, ep.capacity.max_running_requests
                ladder = Ladder(
                    settings.start_concurrency,
                    settings.point_requests,
                    settings.per_concurrency,
                    settings.max_concurrency,
                    ep.capacity.max_running_requests,
                )
                m = await self.measure(cf, ep, ladder, t_start)
            except (
                ServefleetError
            ) as exc:  # a server lost mid-measurement, a refused benchmark: this candidate's result
                row.outcome, row.category, row.evidence = "failed", "other", str(exc).splitlines()[0]
                say(f"{cand.name}: failed while measuring: {row.evidence}")
                return
            finally:
                # its own server only: the candidates of other lanes share the state folder
                await fleet.down([cand.name], grace_s=15.0)
                row.ended_s = clock.elapsed
        self.record(cf, row, m, ep.capacity)

    def record(self, cf: CandidateFleet, row: CandidateRow, m: Measurement, capacity) -> None:
        req = self.prep.request
        self.measured_s += m.measured_s
        row.measured_s = m.measured_s
        if not m.runs or not m.points:
            row.outcome, row.category, row.evidence = "failed", "other", "no point measured"
            return
        path = save_run(merge_runs(m.runs, capacity), req.out / "runs" / f"{cf.candidate.name}.json")
        row.run = str(path)
        row.concurrencies = [p.concurrency or 0 for p in m.points]
        if m.stopped:
            row.reason = m.stopped
            if not m.stopped.startswith("budget"):
                row.outcome = "stopped_early"
        bp = _best_point(m.points)
        if bp is not None:
            row.best_concurrency, row.output_tps = bp.concurrency, bp.output_tokens_per_s
            if bp.server is not None:
                row.acceptance, row.accept_length = bp.server.spec_acceptance_rate, bp.server.spec_accept_length
                row.prefix_cache_hit_rate = hit = bp.server.prefix_cache_hit_rate
                if hit is not None and hit >= CACHED_NOTE:
                    row.notes.append(
                        f"the engine found {hit:.0%} of the sample's prompt tokens in its prefix cache (no prefill "
                        "for them): the prompts share prefixes, and a job that meets them in another order (the "
                        "sample is drawn from all of it) may find fewer and run slower; `plan --check` compares both"
                    )
        mean_out = _mean_output(m.points)
        if row.outcome == "measured" and mean_out:
            curve = curve_from_run(path, cf.gpus_per_replica).curve
            mk = _makespan(
                curve, row.max_running, cf.gpus_per_replica, self.prep.sample.records, mean_out, req.gpus[0]
            )
            if self.best is None or mk < self.best[0]:
                self.best = (mk, cf.candidate.name)
        self.say(
            f"{cf.candidate.name}: {row.outcome}, best {row.output_tps or 0:,.0f} tok/s at concurrency {row.best_concurrency}"
        )

    async def measure(self, cf: CandidateFleet, ep, ladder: Ladder, t_start: float) -> Measurement:
        prep, clock = self.prep, self.clock
        req, settings = prep.request, prep.space.settings
        target = BenchTarget(
            base_url=ep.base_url,
            label=cf.candidate.name,
            model=ep.served_model,
            engine=ep.engine or None,
            capacity=ep.capacity,
        )

        def stop_after(points: list[Point]) -> str | None:
            if len(points) == 2 or (len(points) == 1 and ladder.next(points[0].concurrency or 1) is None):
                self.costs.append(clock.now() - t_start)
            if clock.left() <= 0:
                return f"budget: {req.budget_s:g} s reached during its measurement (after {len(points)} point(s))"
            mean_out = _mean_output(points)
            best = self.best
            if best is None or len(points) < 2 or not mean_out:
                return None
            optimistic = _makespan(
                _optimistic(points, ladder.cap, ladder.max_concurrency),
                ladder.cap,
                cf.gpus_per_replica,
                prep.sample.records,
                mean_out,
                req.gpus[0],
            )
            if optimistic > best[0] * (1 + settings.margin):
                return (
                    f"behind after {len(points)} measurement(s): even growing as its last doubling did, its makespan would be "
                    f"{optimistic:,.0f} s against {best[0]:,.0f} s of {best[1]}"
                )
            return None

        return await measure(
            target,
            prep.sample.path,
            prep.sample.api,
            ladder,
            options=prep.sample.options,
            seed=req.seed,
            stop_after=stop_after,
            time_left=clock.left,
            on_point=lambda p: self.say(
                f"{cf.candidate.name}: concurrency {p.concurrency}: {p.output_tokens_per_s:,.0f} tok/s"
            ),
        )


async def run_tune(
    prep: Prepared, on_event: Event | None = None, now: Callable[[], float] = time.monotonic
) -> TuneResult:
    """Every candidate: in turn on one GPU, lanes of candidates on GPUs of their own beside each other
    (``now``: the budget's clock)."""
    clock = _Clock(prep.request.budget_s, now)
    search = _Search(prep, on_event or (lambda _msg: None), clock)
    rows = {
        cf.candidate.name: CandidateRow(
            name=cf.candidate.name, outcome="measured", args=list(cf.spec.servers[0].args), fleet=str(cf.path)
        )
        for cf in prep.fleets
    }
    lanes = _lanes(prep.fleets)
    if len(lanes) > 1:
        prep.notes.append(
            f"{len(lanes)} lanes of candidates on GPUs of their own, measured at the same time: "
            + "; ".join(", ".join(cf.candidate.name for cf in lane) for lane in lanes)
        )
    await asyncio.gather(*(search.lane(lane, rows) for lane in lanes))
    return _rank(prep, list(rows.values()), clock.elapsed, search.measured_s)


CACHED_NOTE = 0.2  # a best point whose prompt tokens were this much cached gets a note: the job may find fewer
_ORDER = {"measured": 0, "stopped_early": 1, "failed": 2, "skipped": 3}


def _rank(prep: Prepared, rows: list[CandidateRow], wall_s: float, measured_s: float) -> TuneResult:
    """Predicted makespan of the whole job per GPU count, every candidate on the same output length
    (the mean the sample's answers had over all candidates measured)."""
    req = prep.request
    tokens = requests = 0.0
    curves: dict[str, tuple[ConfigCurve, int | None]] = {}
    gpr = {cf.candidate.name: cf.gpus_per_replica for cf in prep.fleets}
    for row in rows:
        if row.run is None:
            continue
        from servefleet.bench.result import load_run

        run = load_run(row.run)
        tokens += sum(p.output_tokens for p in run.points)
        requests += sum(p.successful for p in run.points)
        curves[row.name] = (curve_from_run(Path(row.run), gpr[row.name]), row.max_running)
    mean_out = tokens / requests if requests else None
    notes = list(prep.notes)
    if mean_out:
        job = JobSpec(prompts=prep.sample.records, output_tokens_mean=mean_out)
        for row in rows:
            if row.name not in curves:
                continue
            config, _ = curves[row.name]
            for g in req.gpus:
                plan = plan_job([config], job, g)[0]
                row.predictions.append(
                    Prediction(g, plan.replicas, plan.makespan_s, plan.gpu_hours, plan.best_concurrency)
                )
            row.notes += [n for n in plan_job([config], job, req.gpus[0])[0].notes]
            row.notes += list(config.caveats)
    rows.sort(key=lambda r: (_ORDER[r.outcome], r.first_makespan))
    skipped = [r.name for r in rows if r.outcome == "skipped"]
    if skipped:
        notes.append(
            f"the budget cut the search: {len(skipped)} of {len(rows)} candidate(s) not run ({', '.join(skipped)})"
        )
    return TuneResult(
        rows=rows,
        prompts=prep.sample.records,
        sample=prep.sample.sampled,
        output_tokens_mean=mean_out,
        gpus=list(req.gpus),
        budget_s=req.budget_s,
        wall_s=wall_s,
        measured_s=measured_s,
        out_dir=str(req.out),
        notes=notes,
    )
