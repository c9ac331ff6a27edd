"""Check a plan against reality: what the planner predicts for a job that `generate` has run.

The measurement comes from the destination itself -- a local folder or object storage
(``s3://bucket/prefix``), read through generate's own sink -- so a finished, partial or killed job can be
checked without having kept anything else: ``job.json`` (the runs, their start and end times) and
the committed shards (every row names its server and its completion tokens). A saved
``servefleet generate --json`` report (``--report FILE``, or ``report.json`` at the destination) is used
for the wall time when given: it excludes the pre-pass and server probing, which the manifest's run
times include.

The prediction is the planner's own: the bench run's curve, at the concurrency the planner picks
(or the one given), on as many replicas as servers answered the job, for the job's prompt count and
its *measured* mean output length -- so a wrong guess of the output length is not blamed on the
throughput model. The job's timeline (``timeline/*.json``) gives each server's own rate at every
concurrency it held (``held.py``); where that concurrency was benched, the two are compared, and a miss
says whether the server itself ran slower or faster than benched or as benched (then the cause is the
model: the ramp, the limit's changes, the tail).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from servefleet.errors import ConfigError
from servefleet.plan.held import BenchComparison, HeldRate, against_bench, held_rates
from servefleet.plan.planner import ConfigCurve, JobSpec, prefix_hit_rate_of, simulate_makespan

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from servefleet.generate.sinks import Sink

__all__ = [
    "ServerMeasure",
    "Measured",
    "Metric",
    "CheckResult",
    "measure_job",
    "check_plan",
    "pick_config",
    "TOLERANCE_PCT",
]

TOLERANCE_PCT = 10.0
PREFIX_GAP = 0.10  # a bench and a job whose prompts' prefix-cache hit rates differ by more did different prefill
JOB_FILE = "job.json"  # servefleet.generate.job.JOB_FILE (not imported: keeps plan free of generate's deps)
REPORT_FILE = "report.json"  # servefleet.generate.runner.REPORT_FILE, written by generate beside the shards
TIMELINE_DIR = "timeline"  # servefleet.generate.recorder.TIMELINE_DIR
SHARDS_PER_READ = 8  # shards fetched together (object storage: in parallel); bounds memory to 8 shards


@dataclass(frozen=True)
class ServerMeasure:
    name: str
    requests: int
    completion_tokens: int


@dataclass(frozen=True)
class Measured:
    job_dir: str
    status: str  # the last run's status
    complete: bool  # every valid input id is committed
    prompts_total: int  # valid ids in the input
    prompts_measured: int  # rows committed by the timed runs
    completion_tokens: int
    wall_s: float
    runs: int
    servers: tuple[ServerMeasure, ...]
    model: str | None
    wall_source: str  # "report" or "manifest"
    held: tuple[HeldRate, ...] = ()  # each server's settled rate at each concurrency it held (the timelines)
    prefix_cache: tuple[tuple[str, float], ...] = ()  # (server, share of its prompt tokens it had cached): report.json

    def prefix_hit_rate(self) -> float | None:
        """The job's prefix-cache hit rate over the servers that told it, weighted by their answers."""
        rates = dict(self.prefix_cache)
        return prefix_hit_rate_of((rates[s.name], s.requests) for s in self.servers if s.name in rates)

    @property
    def mean_output_tokens(self) -> float:
        return self.completion_tokens / self.prompts_measured if self.prompts_measured else 0.0


@dataclass(frozen=True)
class Metric:
    name: str
    predicted: float
    measured: float

    @property
    def error_pct(self) -> float:
        """(predicted - measured) / measured, in percent: positive = the plan said more."""
        return (self.predicted - self.measured) / self.measured * 100 if self.measured else math.inf


@dataclass
class CheckResult:
    measured: Measured
    configuration: str
    concurrency: int
    gpus_per_replica: int
    replicas: int
    steady_replica_tps: float
    metrics: list[Metric]
    notes: list[str] = field(default_factory=list)
    caveats: list[str] = field(default_factory=list)  # what the prediction rests on that was not measured well
    against_bench: list[BenchComparison] = field(default_factory=list)  # the job's rate where it held a benched C
    prefix_cache: tuple[float | None, float | None] = (None, None)  # hit rates: (the bench's, the job's)

    @property
    def makespan(self) -> Metric:
        return next(m for m in self.metrics if m.name == "makespan_s")

    @property
    def within(self) -> bool:
        """The makespan is what the plan promises; throughput errors are its mirror image."""
        return abs(self.makespan.error_pct) <= TOLERANCE_PCT

    def verdict(self) -> str:
        m = self.makespan
        err = m.error_pct
        if abs(err) <= TOLERANCE_PCT:
            head = f"within {TOLERANCE_PCT:.0f}%"
        else:
            head = f"off by more than {TOLERANCE_PCT:.0f}%"
        if abs(err) < 0.05:
            way = "exact"
        elif err < 0:
            way = f"the plan was optimistic: it predicted {-err:.1f}% less time than the job took"
        else:
            way = f"the plan was pessimistic: it predicted {err:.1f}% more time than the job took"
        why = self.cause() if abs(err) > TOLERANCE_PCT else None
        return f"{head}: {way}" + (f"; {why}" if why else "")

    def cause(self) -> str | None:
        """Why the miss: the server against its bench where the job held a benched concurrency longest (its
        own speed, or as benched: the model's share), and the prompts' prefix-cache hits in each."""
        said = [why for why in (self._server_speed(), self._prefix_cache()) if why]
        return "; ".join(said) or None

    def _server_speed(self) -> str | None:
        if not self.against_bench:
            return None
        top = self.against_bench[0]
        h, err = top.held, top.error_pct
        where = (
            f"at concurrency {h.concurrency} {h.server} gave {h.output_tps:,.0f} tok/s over {h.seconds:,.0f} s "
            f"of the job against {top.benched_tps:,.0f} benched"
        )
        if abs(err) <= TOLERANCE_PCT:
            return f"the server ran as benched ({where}): the miss is the job's ramp, its limit changes or its tail"
        way = "slower" if err < 0 else "faster"
        return (
            f"the server itself ran {abs(err):.0f}% {way} than benched ({where}): the miss is the server's speed "
            "during the job, not the plan's model (another load on the host, other clocks, other prompts: "
            "bench it again where the job runs)"
        )

    def _prefix_cache(self) -> str | None:
        bench, job = self.prefix_cache
        if bench is None or job is None or abs(bench - job) < PREFIX_GAP:
            return None
        more = "more" if job < bench else "less"
        return (
            f"the engine found {bench:.0%} of the bench's prompt tokens in its prefix cache and {job:.0%} of the "
            f"job's: the job had {more} prefill to do per answer (prompts that repeat or share prefixes, sent in "
            "another order: a sample drawn from the whole job brings a repeat closer than the job does)"
        )

    def to_json(self) -> dict[str, Any]:
        meas = self.measured
        return {
            "job_dir": meas.job_dir,
            "status": meas.status,
            "complete": meas.complete,
            "configuration": self.configuration,
            "concurrency": self.concurrency,
            "gpus_per_replica": self.gpus_per_replica,
            "replicas": self.replicas,
            "gpus": self.replicas * self.gpus_per_replica,
            "prompts_total": meas.prompts_total,
            "prompts_measured": meas.prompts_measured,
            "output_tokens_mean": round(meas.mean_output_tokens, 3),
            "steady_replica_tps": round(self.steady_replica_tps, 3),
            "wall_source": meas.wall_source,
            "metrics": {
                m.name: {
                    "predicted": round(m.predicted, 3),
                    "measured": round(m.measured, 3),
                    "error_pct": round(m.error_pct, 2),
                }
                for m in self.metrics
            },
            "servers": [asdict(s) for s in meas.servers],
            "within_tolerance": self.within,
            "tolerance_pct": TOLERANCE_PCT,
            "verdict": self.verdict(),
            "against_bench": [c.to_json() for c in self.against_bench],
            "prefix_cache_hit_rate": {
                "bench": None if self.prefix_cache[0] is None else round(self.prefix_cache[0], 4),
                "job": None if self.prefix_cache[1] is None else round(self.prefix_cache[1], 4),
            },
            "notes": list(self.notes),
            "caveats": list(self.caveats),
        }


# ---- measuring -------------------------------------------------------------------------------------


def _parse_time(text: str | None) -> dt.datetime | None:
    if not text:
        return None
    try:
        return dt.datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=dt.UTC)
    except ValueError:
        return None


def _shard_rows(name: str, data: bytes) -> list[tuple[str, int, str | None]]:
    """(server, completion tokens, model) of every row of one committed shard."""
    if name.endswith(".parquet"):
        # From an Arrow buffer, in this thread: pq.read_table (and any Python file object) start Arrow's
        # thread pools, whose workers still alive at interpreter exit abort the process now and then
        # ("terminate called without an active exception", exit -6, apache/arrow#34314): seen in the
        # demo after plan --check had printed its verdict.
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = pq.ParquetFile(pa.BufferReader(data)).read(
            columns=["server", "completion_tokens", "model"], use_threads=False
        )
        return list(
            zip(
                table.column("server").to_pylist(),
                (t or 0 for t in table.column("completion_tokens").to_pylist()),
                table.column("model").to_pylist(),
                strict=True,
            )
        )
    rows = []
    for raw in data.splitlines():
        if raw.strip():
            obj = json.loads(raw)
            rows.append((obj.get("server") or "?", obj.get("completion_tokens") or 0, obj.get("model")))
    return rows


def _ledger_last_commit(sink: Sink) -> dict[str, dt.datetime]:
    """The last commit time of each run, from the ledger entries (for a run that never finished)."""
    last: dict[str, dt.datetime] = {}
    names = [f"ledger/{n}" for n in sink.list("ledger") if n.endswith(".json")]
    for data in sink.read_many(names).values():
        try:
            entry = json.loads(data)
        except json.JSONDecodeError:
            log.warning("a ledger entry of the job is not JSON; skipped for the last-commit times")
            continue
        when = _parse_time(entry.get("committed"))
        run = entry.get("run_id")
        if when and run and (run not in last or when > last[run]):
            last[run] = when
    return last


def measure_job(dest: str | Path, report: Path | None = None) -> Measured:
    """What `generate` measured at ``dest``: a local folder, or an object-storage URL (``s3://...``)."""
    dest = str(dest)
    from servefleet.generate.sinks import open_existing_sink

    sink = open_existing_sink(dest)
    try:
        return _measure(sink, dest, report)
    except OSError as exc:  # object storage unreachable, access denied...
        raise ConfigError(f"{dest}: cannot read the destination: {exc}") from exc
    finally:
        sink.close()


def _measure(sink: Sink, dest: str, report: Path | None) -> Measured:
    manifest_data = sink.read_bytes(JOB_FILE)
    if manifest_data is None:
        raise ConfigError(
            f"{dest}: no {JOB_FILE}, so not the destination of a `servefleet generate` run; nothing to check"
        )
    try:
        manifest = json.loads(manifest_data)
        valid = int(manifest["input"]["valid"])
        runs = list(manifest.get("runs") or [])
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"{dest}/{JOB_FILE}: not a generate job manifest ({exc})") from None

    per_server: dict[str, list[int]] = {}
    models: dict[str, int] = {}
    shards = [
        f"shards/{n}" for n in sink.list("shards") if n.startswith("part-") and n.endswith((".parquet", ".jsonl"))
    ]
    # a few shards at a time: a large job's shards hold gigabytes of text, of which three columns are read
    for first in range(0, len(shards), SHARDS_PER_READ):
        for name, data in sorted(sink.read_many(shards[first : first + SHARDS_PER_READ]).items()):
            try:
                shard_rows = _shard_rows(name, data)
            except Exception as exc:  # a damaged shard (ArrowInvalid, bad JSON): name it, not a traceback
                raise ConfigError(
                    f"{dest}/{name}: damaged shard, cannot be read ({type(exc).__name__}: {str(exc)[:200]}); "
                    "run the same `servefleet generate` again: it moves the shard to quarantine/ and asks "
                    "its ids again"
                ) from None
            for server, tokens, model in shard_rows:
                acc = per_server.setdefault(server or "?", [0, 0])
                acc[0] += 1
                acc[1] += int(tokens)
                if model:
                    models[model] = models.get(model, 0) + 1
    rows = sum(a[0] for a in per_server.values())
    if rows == 0:
        raise ConfigError(f"{dest}: no committed shards yet, so nothing measured to check the plan against")

    timed_runs = 0
    wall = 0.0
    last_commit = None
    for run in runs:
        start = _parse_time(run.get("started"))
        end = _parse_time(run.get("finished"))
        if end is None:  # killed or still running: its last committed shard is when it was last seen working
            last_commit = last_commit if last_commit is not None else _ledger_last_commit(sink)
            end = last_commit.get(run.get("run_id", ""))
        if start and end and end > start:
            wall += (end - start).total_seconds()
            timed_runs += 1
    source = "manifest"
    prefix_cache: tuple[tuple[str, float], ...] = ()
    if report is not None:
        try:
            report_text: bytes | None = Path(report).read_bytes()
        except FileNotFoundError:
            raise ConfigError(
                f"{report}: no such report (save one with `servefleet generate ... --json > FILE`)"
            ) from None
        report_name = str(report)
    else:
        report_text, report_name = sink.read_bytes(REPORT_FILE), f"{dest}/{REPORT_FILE}"
    if report_text is not None:
        try:
            report_data = json.loads(report_text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{report_name}: not a generate --json report ({exc})") from None
        if not isinstance(report_data, dict) or "wall_s" not in report_data:
            raise ConfigError(f"{report_name}: not a generate --json report (no wall_s)")
        # one run's report cannot time a resumed job; the manifest times every run
        if len(runs) <= 1 and report_data.get("wall_s"):
            wall = float(report_data["wall_s"])
            source = "report"
        prefix_cache = _prefix_rates(report_data)
    if wall <= 0:
        raise ConfigError(f"{dest}: the job's runs have no start and end times to measure a wall time from")
    last = runs[-1] if runs else {}
    return Measured(
        job_dir=dest,
        status=str(last.get("status", "unknown")),
        complete=rows >= valid,
        prompts_total=valid,
        prompts_measured=rows,
        completion_tokens=sum(a[1] for a in per_server.values()),
        wall_s=wall,
        runs=len(runs),
        servers=tuple(ServerMeasure(name, a[0], a[1]) for name, a in sorted(per_server.items())),
        model=max(models, key=lambda m: models[m]) if models else None,
        wall_source=source,
        held=tuple(held_rates(_timelines(sink))),
        prefix_cache=prefix_cache,
    )


def _prefix_rates(report: dict[str, Any]) -> tuple[tuple[str, float], ...]:
    """Each server's prefix-cache hit rate over the job, as the report gives it (older reports: none)."""
    out = []
    for server in report.get("servers") or []:
        rate = server.get("prefix_cache_hit_rate") if isinstance(server, dict) else None
        if isinstance(rate, int | float) and isinstance(server.get("name"), str):
            out.append((server["name"], float(rate)))
    return tuple(out)


def _timelines(sink: Sink) -> list[dict[str, Any]]:
    """Every run's timeline; one that cannot be read only leaves its rates out (they explain, not measure)."""
    names = [f"{TIMELINE_DIR}/{n}" for n in sink.list(TIMELINE_DIR) if n.endswith(".json")]
    out = []
    for name, data in sorted(sink.read_many(names).items()):
        try:
            doc = json.loads(data)
        except json.JSONDecodeError:
            log.warning("%s: not JSON; its rates are left out of the check", name)
            continue
        if isinstance(doc, dict):
            out.append(doc)
    return out


# ---- predicting and comparing ----------------------------------------------------------------------


def _same_model(a: str | None, b: str | None) -> bool:
    if not a or not b:
        return True  # unknown on one side: nothing to contradict
    a, b = _without_revision(a.rstrip("/")), _without_revision(b.rstrip("/"))
    return a == b or a.rsplit("/", 1)[-1] == b.rsplit("/", 1)[-1]


def _without_revision(name: str) -> str:
    """``/models/tiny@main`` -> ``/models/tiny``: `transformers serve` answers with the model it was
    given plus ``@revision`` (Hub ids cannot hold an ``@``), where bench recorded the name it asked for."""
    head, at, rev = name.rpartition("@")
    return head if at and head and rev and "/" not in rev else name


def pick_config(
    configs: list[tuple[ConfigCurve, str | None]], measured: Measured
) -> ConfigCurve | dict[str, ConfigCurve]:
    """The bench run (curve, model it measured) that matches the job's model; one must. Several
    match when the job ran on a fleet of several configurations: then each server that answered
    it takes the run named after it (`bench --fleet` labels a run with its server's name), and
    the result is server name -> curve."""
    matching = [c for c, model in configs if _same_model(model, measured.model)]
    if not matching:
        seen = ", ".join(f"{c.name} ({m})" for c, m in configs)
        raise ConfigError(
            f"configuration mismatch: the job was served by model {measured.model!r} but the bench runs "
            f"measured {seen}; pass the bench run of the configuration that ran the job"
        )
    if len(matching) == 1:
        return matching[0]
    by_name = {c.name: c for c in matching}
    servers = [s.name for s in measured.servers]
    unmatched = [name for name in servers if name not in by_name]
    if unmatched:
        raise ConfigError(
            f"{len(matching)} bench runs match the job ({', '.join(c.name for c in matching)}) but none is "
            f"named after server(s) {', '.join(unmatched)}: give one --bench (the configuration that ran "
            "the job), or one per server, made by `servefleet bench --fleet` (runs named after the servers)"
        )
    return {name: by_name[name] for name in servers}


def check_plan(
    config: ConfigCurve | dict[str, ConfigCurve],
    measured: Measured,
    *,
    gpus: int | None = None,
    concurrency: int | None = None,
) -> CheckResult:
    """Predict what ``measured`` did with the planner's model and compare."""
    if isinstance(config, dict):
        if gpus is not None or concurrency is not None:
            raise ConfigError(
                "--gpus and --concurrency apply to a job of one configuration; this one ran on "
                f"{len(config)} servers of their own ({', '.join(config)})"
            )
        return check_mixed(config, measured)
    notes: list[str] = []
    servers = len(measured.servers)
    replicas = (gpus // config.gpus_per_replica) if gpus else servers
    if replicas <= 0:
        raise ConfigError(
            f"--gpus {gpus} is fewer than the {config.gpus_per_replica} GPUs one replica of {config.name} needs"
        )
    if gpus is None:
        notes.append(
            f"{servers} server(s) answered the job: planned as {replicas} replica(s) of {config.gpus_per_replica} GPU(s)"
        )
    caveats = list(config.caveats)
    others = [s.name for s in measured.servers if s.name != config.name]
    if servers > 1 and others:
        caveats.append(
            f"one bench run ({config.name}) for a job {servers} servers answered ({', '.join(s.name for s in measured.servers)}): "
            "every one is assumed to be that configuration; if they differ, give one --bench per server "
            "(`servefleet bench --fleet` names each run after its server)"
        )
    best_c, _, best_notes = config.best()
    notes.extend(best_notes)
    conc = concurrency or best_c
    if concurrency is None:
        notes.append(
            f"concurrency {conc}: the planner's choice for this configuration (give --concurrency for a job run at a fixed one)"
        )
    mean = measured.mean_output_tokens
    steady = config.curve.total(conc)
    if measured.complete:
        predicted_s = simulate_makespan(config.curve, conc, replicas, JobSpec(measured.prompts_measured, mean))
    else:
        # a partial job has not reached its tail: compare steady-state time for the rows it did
        predicted_s = measured.prompts_measured * mean / (steady * replicas)
        full = simulate_makespan(config.curve, conc, replicas, JobSpec(measured.prompts_total, mean))
        eta = measured.wall_s * measured.prompts_total / measured.prompts_measured
        notes.append(
            f"partial job ({measured.prompts_measured:,}/{measured.prompts_total:,} prompts): compared without the tail; "
            f"whole job predicted {full:,.0f} s, at the measured pace {eta:,.0f} s"
        )
    tokens = measured.completion_tokens
    gpus_used = replicas * config.gpus_per_replica
    metrics = [
        Metric("output_tps_per_gpu", tokens / predicted_s / gpus_used, tokens / measured.wall_s / gpus_used),
        Metric("output_tps_per_server", tokens / predicted_s / replicas, tokens / measured.wall_s / servers),
        Metric("makespan_s", predicted_s, measured.wall_s),
    ]
    if measured.wall_source == "manifest":
        notes.append(
            "wall time from the job manifest's run times (includes probing the servers); "
            "a saved `generate --json` report (--report) times the sending alone"
        )
    return CheckResult(
        measured=measured,
        configuration=config.name,
        concurrency=conc,
        gpus_per_replica=config.gpus_per_replica,
        replicas=replicas,
        steady_replica_tps=steady,
        metrics=metrics,
        notes=notes,
        caveats=caveats,
        against_bench=against_bench(measured.held, config.curve),
        prefix_cache=(config.prefix_cache_hit_rate, measured.prefix_hit_rate()),
    )


def check_mixed(curves: dict[str, ConfigCurve], measured: Measured) -> CheckResult:
    """The plan for a job that ran on servers of different configurations, one curve each: every
    server at its best concurrency; the job shared out in proportion to their steady rates (as
    generate's dispatch does, keeping each server full), its makespan the slowest share's."""
    notes = [
        f"{len(curves)} servers of their own configuration: each at its best bench point, the prompts shared "
        "in proportion to their rates"
    ]
    best = {name: c.best() for name, c in curves.items()}
    for name, (_, _, more) in best.items():
        notes.extend(f"{name}: {n}" for n in more)
    rates = {name: curves[name].curve.total(b[0]) for name, b in best.items()}
    total_rate = sum(rates.values())
    mean = measured.mean_output_tokens
    prompts = measured.prompts_measured
    if measured.complete:
        predicted_s = max(
            simulate_makespan(curves[n].curve, best[n][0], 1, JobSpec(max(1, round(prompts * r / total_rate)), mean))
            for n, r in rates.items()
        )
    else:
        predicted_s = prompts * mean / total_rate
        notes.append(
            f"partial job ({measured.prompts_measured:,}/{measured.prompts_total:,} prompts): compared without the tail"
        )
    for server in measured.servers:
        share = rates[server.name] / total_rate
        notes.append(
            f"{server.name} ({curves[server.name].name}): concurrency {best[server.name][0]}, "
            f"{rates[server.name]:,.0f} tok/s steady; planned {share:.0%} of the tokens, answered "
            f"{server.completion_tokens / max(1, measured.completion_tokens):.0%}"
        )
    gpus_used = sum(curves[n].gpus_per_replica for n in curves)
    tokens = measured.completion_tokens
    metrics = [
        Metric("output_tps_per_gpu", tokens / predicted_s / gpus_used, tokens / measured.wall_s / gpus_used),
        Metric(
            "output_tps_per_server",
            tokens / predicted_s / len(curves),
            tokens / measured.wall_s / len(measured.servers),
        ),
        Metric("makespan_s", predicted_s, measured.wall_s),
    ]
    if measured.wall_source == "manifest":
        notes.append(
            "wall time from the job manifest's run times (includes probing the servers); "
            "a saved `generate --json` report (--report) times the sending alone"
        )
    return CheckResult(
        measured=measured,
        configuration=" + ".join(curves),
        concurrency=sum(b[0] for b in best.values()),
        gpus_per_replica=max(1, gpus_used // len(curves)),
        replicas=len(curves),
        steady_replica_tps=total_rate / len(curves),
        metrics=metrics,
        notes=notes,
        caveats=[f"{name}: {c}" for name, curve in curves.items() for c in curve.caveats],
        against_bench=sorted(
            (
                c
                for n, cfg in curves.items()
                for c in against_bench([h for h in measured.held if h.server == n], cfg.curve)
            ),
            key=lambda c: -c.held.seconds,
        ),
    )
