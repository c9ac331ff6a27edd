"""Read what the planner plans from: bench runs (RUN.json) and samples of real output lengths."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from pydantic import ValidationError

from servefleet.bench.result import Point, Run, load_run
from servefleet.errors import ConfigError
from servefleet.plan.planner import ConfigCurve, Curve, PointSample, prefix_hit_rate_of, steady_curve

log = logging.getLogger(__name__)

__all__ = ["curve_from_run", "mode_warnings", "model_of_run", "parse_bench_arg", "sample_output_mean"]

_TOKEN_FIELDS = ("output_tokens", "completion_tokens", "num_output_tokens")


def parse_bench_arg(arg: str) -> tuple[Path, int | None]:
    """``RUN.json`` or ``RUN.json:GPUS`` (GPUs per replica of that configuration)."""
    path = Path(arg)
    if not path.exists() and ":" in arg:
        head, _, tail = arg.rpartition(":")
        if tail.isdigit():
            return Path(head), int(tail)
    return path, None


def curve_from_run(path: Path, gpus_per_replica: int = 1, max_running: int | None = None) -> ConfigCurve:
    try:
        run: Run = load_run(path)
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such bench run (make one with `servefleet bench ... --out {path}`)") from None
    except (ValidationError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path}: not a servefleet bench RUN.json ({str(exc).splitlines()[0]})") from exc
    points = [p for p in run.points if p.concurrency and p.successful > 0]
    if not points:
        raise ConfigError(f"{path}: no fixed-concurrency point with successful requests to plan from")
    caveats: list[str] = []
    if run.config.mode == "concurrency":
        # fewer requests than users: the point never had its concurrency in flight, so it measured a lower one
        short = [p for p in points if p.requests < (p.concurrency or 0)]
        if short:
            said = ", ".join(f"concurrency {p.concurrency} with {p.requests} request(s)" for p in short)
            if len(short) == len(points):
                raise ConfigError(
                    f"{path}: no point reached its concurrency ({said}); measure again with at least as many "
                    "requests per point as its concurrency (`servefleet bench -n`, or --duration)"
                )
            caveats.append(f"{len(short)} point(s) left out: they never reached their concurrency ({said})")
            points = [p for p in points if p not in short]
    unsteady = [p for p in points if p.steady is not None and not p.steady.steady]
    if unsteady:
        said = ", ".join(
            f"{p.concurrency} (steady window {max(0.0, p.steady.end_s - p.steady.start_s):.1f} s)"
            for p in unsteady
            if p.steady is not None
        )
        caveats.append(
            f"{len(unsteady)} point(s) bench marked unsteady, at concurrency {said}: their throughput is "
            "estimated from the whole span through the drain model, not measured steady; make those points "
            "longer (more requests, or --duration)"
        )
    deadline = run.config.duration_s if run.config.mode == "concurrency" and not run.config.requests else None
    cap = max_running
    if cap is None and run.capacity is not None:
        cap = run.capacity.max_running_requests
    # Steady-state throughput: a point's measured steady window where it had one (bench keeps ramp and
    # drain out of it); else the point inverted through the drain model (see steady_curve).
    levels = [p.concurrency for p in points if p.concurrency]  # all of them (filtered above); typed int
    inverted = steady_curve(
        [
            PointSample(c, p.successful, p.output_tokens, p.duration_s, deadline)
            for c, p in zip(levels, points, strict=True)
        ]
    )
    tps = [
        p.output_tokens_per_s if p.steady is not None and p.steady.steady else inverted.total(c)
        for c, p in zip(levels, points, strict=True)
    ]
    return ConfigCurve(
        name=run.target.label,
        curve=Curve(tuple(levels), tuple(tps)),
        gpus_per_replica=gpus_per_replica,
        max_running=cap,
        measured_mode=run.measured_mode or "non-streaming",
        caveats=tuple(caveats),
        prefix_cache_hit_rate=_prefix_hit_rate(points),
    )


def _prefix_hit_rate(points: list[Point]) -> float | None:
    """The points' prefix-cache hit rate, weighted by their requests (None: the server did not say)."""
    return prefix_hit_rate_of(
        (p.server.prefix_cache_hit_rate, p.successful)
        for p in points
        if p.server is not None and p.server.prefix_cache_hit_rate is not None
    )


def mode_warnings(configs: list[ConfigCurve]) -> list[str]:
    """What to say when the runs were not measured the way a batch job runs (non-streaming)."""
    streamed = [c.name for c in configs if c.measured_mode == "streaming"]
    if not streamed:
        return []
    again = "measure them again with `servefleet bench --no-stream` (the default)"
    if len(streamed) == len(configs):
        return [
            f"planned from streaming runs only ({', '.join(streamed)}): a batch job does not stream, and a server's "
            "API process sending one event per token can cap streamed throughput far below what it generates "
            f"(H200: 18-19k streamed vs 28-34k tok/s), more so for plain decoding than speculative; {again}"
        ]
    return [
        f"streaming runs ({', '.join(streamed)}) mixed with non-streaming ones: their throughputs are not "
        f"comparable and the streamed ones are under-rated; {again}"
    ]


def model_of_run(path: Path) -> str | None:
    """The model a bench run measured (to match it with the job it is checked against)."""
    try:
        run = load_run(path)
    except (FileNotFoundError, ValidationError, json.JSONDecodeError) as exc:
        log.info("%s: model of the bench run unknown (%s)", path, type(exc).__name__)
        return None
    return run.target.model


def _tokens_of(record: dict) -> float | None:
    for key in _TOKEN_FIELDS:
        if isinstance(record.get(key), int | float):
            return float(record[key])
    for nest in ("usage", "response"):
        sub = record.get(nest)
        if isinstance(sub, dict):
            found = _tokens_of(sub) or _tokens_of(sub.get("body") or {})
            if found is not None:
                return found
    return None


def sample_output_mean(path: Path) -> tuple[float, int]:
    """Mean output tokens over a JSONL or Parquet sample (records with usage.completion_tokens,
    output_tokens, ...). Returns (mean, records used)."""
    if not path.exists():
        raise ConfigError(f"{path}: sample file not found")
    values: list[float] = []
    if path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        # from an Arrow buffer, in this thread: Arrow's pools can abort the process at exit (plan/check.py)
        table = pq.ParquetFile(pa.BufferReader(path.read_bytes())).read(use_threads=False)
        for name in _TOKEN_FIELDS:
            if name in table.column_names:
                values = [float(v) for v in table.column(name).to_pylist() if v is not None]
                break
    else:
        with path.open() as fh:
            for line in fh:
                line = line.strip()
                if not line:
                    continue
                try:
                    found = _tokens_of(json.loads(line))
                except json.JSONDecodeError:
                    log.debug("%s: a line that is not JSON skipped", path)
                    continue
                if found is not None:
                    values.append(found)
    if not values:
        raise ConfigError(f"{path}: no output token counts found (fields tried: {', '.join(_TOKEN_FIELDS)}, usage.*)")
    return sum(values) / len(values), len(values)
