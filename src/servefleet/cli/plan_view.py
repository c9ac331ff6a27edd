"""`plan`, `plan --check` and `capacity` on the terminal: rich tables and the plain-language
recommendation (the PNG plot is in ``plots``)."""

from __future__ import annotations

import math

from rich.table import Table

from servefleet.plan.check import TOLERANCE_PCT, CheckResult
from servefleet.plan.memory import MemoryEstimate
from servefleet.plan.planner import JobSpec, PlanRow, TailModel

__all__ = ["fmt_duration", "plan_table", "recommendation", "tail_line", "memory_table", "check_table"]


def fmt_duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "never"
    if seconds >= 86400:
        return f"{seconds / 86400:.1f} d"
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.1f} s"


def plan_table(rows: list[PlanRow], job: JobSpec, gpus: int) -> Table:
    title = f"{job.prompts:,} prompts x {job.output_tokens_mean:,.0f} output tokens on {gpus} GPU(s)"
    table = Table(title=title)
    for col in (
        "rank",
        "configuration",
        "concurrency",
        "tok/s per replica",
        "tok/s per GPU",
        "replicas",
        "makespan",
        "GPU-hours",
        "cost",
    ):
        table.add_column(col, justify="left" if col == "configuration" else "right")
    for i, r in enumerate(rows, 1):
        table.add_row(
            str(i),
            r.name,
            str(r.best_concurrency),
            f"{r.replica_tps:,.0f}",
            f"{r.tps_per_gpu:,.0f}",
            str(r.replicas),
            fmt_duration(r.makespan_s),
            f"{r.gpu_hours:,.1f}" if math.isfinite(r.gpu_hours) else "-",
            f"{r.cost:,.2f}" if r.cost is not None else "-",
        )
    return table


def recommendation(rows: list[PlanRow]) -> str:
    if not rows or not math.isfinite(rows[0].makespan_s):
        return "no configuration can run this job on the GPUs given"
    best = rows[0]
    text = f"use {best.name} at concurrency {best.best_concurrency}: finishes in {fmt_duration(best.makespan_s)}"
    if len(rows) > 1 and math.isfinite(rows[1].makespan_s):
        other = rows[1]
        ratio = other.makespan_s / best.makespan_s
        text += (
            f", {ratio:.2f}x sooner than {other.name} ({fmt_duration(other.makespan_s)}), because it sustains "
            f"{best.tps_per_gpu:,.0f} tok/s per GPU against {other.tps_per_gpu:,.0f}"
        )
    if best.caveats:
        text += f" (with {len(best.caveats)} caveat(s) about its bench run: " + "; ".join(best.caveats) + ")"
    return text


def tail_line(row: PlanRow, tail: TailModel) -> str:
    """What the tail holds and what --release-tail would return, in server-hours (replica-hours)."""
    held, back = tail.held_server_s / 3600, tail.released_server_s / 3600
    total = row.replicas * tail.makespan_s / 3600
    pct = 100 * back / total if total > 0 else 0.0
    text = (
        f"tail: {_hours(held)} server-hours idle or draining from the last prompt going out to the end ({row.replicas} replica(s) x "
        f"{fmt_duration(tail.makespan_s - tail.queue_empty_s)}); --release-tail returns about {_hours(back)} server-hours "
        f"({pct:.2g}% of the job's {_hours(total)})"
    )
    if pct < 1:
        text += (
            ": small, the plan's replicas drain nearly together (every answer at the mean length); a real job's saving "
            "comes from the spread of answer lengths (servefleet report DEST shows it)"
        )
    return text


def _hours(h: float) -> str:
    return f"{h:,.0f}" if h >= 10 else f"{h:.2f}" if h >= 0.1 else f"{h:.4f}"


def memory_table(est: MemoryEstimate, reported: dict | None = None) -> Table:
    table = Table(title="memory model" + (" vs what the engine reported" if reported else ""))
    table.add_column("fact")
    table.add_column("predicted", justify="right")
    if reported:
        table.add_column("engine reported", justify="right")
    rows = [
        ("weights", f"{est.weight_bytes / 2**30:,.2f} GiB", None),
        ("KV bytes per token", f"{est.kv_bytes_per_token:,}", None),
        ("state bytes per request", f"{est.state_bytes_per_request:,}", None),
        ("KV-cache tokens", f"{est.kv_tokens:,}", (reported or {}).get("kv_cache_tokens")),
        (
            f"max running requests @ {est.assumptions.context_len:,} tokens",
            f"{est.max_running_requests:,}",
            (reported or {}).get("max_running_requests"),
        ),
    ]
    for fact, predicted, seen in rows:
        cells = [fact, predicted]
        if reported:
            cells.append(f"{seen:,}" if isinstance(seen, int) else "-")
        table.add_row(*cells)
    return table


_CHECK_LABELS = {
    "output_tps_per_gpu": "output tok/s per GPU",
    "output_tps_per_server": "output tok/s per server",
    "makespan_s": "makespan",
}


def check_table(result: CheckResult) -> Table:
    m = result.measured
    title = (
        f"{result.configuration}: plan vs {m.job_dir} ({m.prompts_measured:,}/{m.prompts_total:,} prompts, "
        f"{m.mean_output_tokens:,.1f} output tokens mean, {result.replicas} replica(s) at concurrency {result.concurrency})"
    )
    table = Table(title=title)
    for col in ("", "predicted", "measured", "error"):
        table.add_column(col, justify="left" if not col else "right")
    for metric in result.metrics:
        fmt = (lambda v: f"{v:,.1f} s") if metric.name == "makespan_s" else (lambda v: f"{v:,.1f}")
        err = metric.error_pct
        style = "green" if abs(err) <= TOLERANCE_PCT else "red"
        table.add_row(
            _CHECK_LABELS.get(metric.name, metric.name),
            fmt(metric.predicted),
            fmt(metric.measured),
            f"[{style}]{err:+.1f}%[/]",
        )
    return table
