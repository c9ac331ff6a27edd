"""Configurations side by side: throughput at each concurrency, each run's best point, ratios.

The first run is the reference: every other run's throughput is also shown as a ratio of the
reference's at the same concurrency (and best against best). ``compare_runs`` returns plain data
(what ``--json`` prints); the CLI renders it (``servefleet.cli.bench_view.compare_table``).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from servefleet.bench.result import Run

__all__ = ["RunSummary", "Comparison", "compare_runs"]


class RunSummary(BaseModel):
    model_config = ConfigDict(extra="forbid")

    label: str
    engine: str | None = None
    path: str | None = None
    output_tokens_per_s: dict[str, float | None] = Field(default_factory=dict)  # level -> tok/s
    best_level: str | None = None
    best_output_tokens_per_s: float | None = None
    best_per_request_tokens_per_s: float | None = None
    best_ttft_p50_ms: float | None = None
    best_itl_p50_ms: float | None = None
    ratio_best: float | None = None  # best / reference best
    ratio: dict[str, float | None] = Field(default_factory=dict)  # level -> tok/s / reference tok/s
    client_bound_levels: list[str] = Field(default_factory=list)
    max_running_requests: int | None = None


class Comparison(BaseModel):
    model_config = ConfigDict(extra="forbid")

    levels: list[str]
    level_kind: str  # "concurrency" or "rate"
    runs: list[RunSummary]
    plots: list[str] = Field(default_factory=list)


def _level(p, rate: bool) -> str:
    return f"{p.request_rate:g}" if rate else str(p.concurrency)


def compare_runs(runs: list[Run], paths: list[str] | None = None) -> Comparison:
    if not runs:
        raise ValueError("nothing to compare")
    rate = all(r.config.mode == "rate" for r in runs)
    levels: list[str] = []
    for run in runs:
        for p in run.points:
            lv = _level(p, rate)
            if lv not in levels:
                levels.append(lv)
    levels.sort(key=float)
    summaries = []
    ref_tp: dict[str, float | None] = {}
    ref_best: float | None = None
    for i, run in enumerate(runs):
        tp: dict[str, float | None] = {lv: None for lv in levels}
        bound = []
        for p in run.points:
            lv = _level(p, rate)
            tp[lv] = p.output_tokens_per_s
            if p.client_bound:
                bound.append(lv)
        best = run.best_point()
        s = RunSummary(
            label=run.target.label,
            engine=run.target.engine,
            path=(paths[i] if paths else None),
            output_tokens_per_s=tp,
            client_bound_levels=bound,
            max_running_requests=run.capacity.max_running_requests if run.capacity else None,
        )
        if best is not None:
            s.best_level = _level(best, rate)
            s.best_output_tokens_per_s = best.output_tokens_per_s
            s.best_per_request_tokens_per_s = best.output_tokens_per_s_per_request.mean
            s.best_ttft_p50_ms = best.ttft_ms.p50
            s.best_itl_p50_ms = best.itl_ms.p50
        if i == 0:
            ref_tp, ref_best = tp, s.best_output_tokens_per_s
        s.ratio = {lv: (t / r) if (t := tp[lv]) is not None and (r := ref_tp.get(lv)) else None for lv in levels}
        if s.best_output_tokens_per_s is not None and ref_best:
            s.ratio_best = s.best_output_tokens_per_s / ref_best
        summaries.append(s)
    return Comparison(levels=levels, level_kind="rate" if rate else "concurrency", runs=summaries)
