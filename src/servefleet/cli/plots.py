"""PNG plots with matplotlib's Agg backend (no display needed): bench runs and plan makespans.

Bench runs (``compare``, and ``bench`` with several targets):

* throughput vs concurrency (or request rate): total output tok/s of each configuration, the
  curve whose knee and plateau decide how many requests to run at once;
* latency vs throughput: per-request median inter-token latency and TTFT against the output
  tok/s each point achieved — the trade the job pays for its throughput.

Client-bound points are drawn hollow so a curve that flattens because of the client is not
mistaken for the server's plateau.

``plan --plot``: the makespan of each configuration against the number of GPUs.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # after choosing the backend
from matplotlib.figure import Figure

from servefleet.bench.result import Run
from servefleet.plan.planner import ConfigCurve, JobSpec, plan_job

__all__ = ["plot_throughput", "plot_latency", "latency_figure", "write_plots", "plot_makespan"]


def _x(run: Run) -> tuple[list[float], str]:
    if run.config.mode == "rate":
        return [p.request_rate or 0.0 for p in run.points], "request rate (req/s)"
    return [float(p.concurrency or 0) for p in run.points], "concurrency"


def _scatter_bound(ax, xs, ys, bound, color) -> None:
    hx = [x for x, b in zip(xs, bound, strict=True) if b]
    hy = [y for y, b in zip(ys, bound, strict=True) if b]
    if hx:
        ax.scatter(hx, hy, s=70, facecolors="white", edgecolors=color, zorder=3, linewidths=1.5)


def plot_throughput(runs: list[Run], path: str | Path) -> Path:
    fig, ax = plt.subplots(figsize=(7.5, 4.8), dpi=110)
    xlabel = "concurrency"
    for run in runs:
        xs, xlabel = _x(run)
        ys = [p.output_tokens_per_s for p in run.points]
        (line,) = ax.plot(xs, ys, marker="o", label=run.target.label)
        _scatter_bound(ax, xs, ys, [p.client_bound for p in run.points], line.get_color())
    if xlabel == "concurrency" and any(len(r.points) > 1 for r in runs):
        ax.set_xscale("log", base=2)
        levels = sorted({p.concurrency for r in runs for p in r.points if p.concurrency})
        ax.set_xticks(levels, [str(c) for c in levels])
        ax.minorticks_off()
    ax.set_xlabel(xlabel)
    ax.set_ylabel("output tokens/s")
    ax.set_title("Throughput vs " + xlabel.split(" (")[0])
    ax.grid(True, alpha=0.3)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    return _save(fig, path)


def plot_latency(runs: list[Run], path: str | Path) -> Path:
    return _save(latency_figure(runs), path)


def latency_figure(runs: list[Run]) -> Figure:
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.5), dpi=110)
    for run in runs:
        xs = [p.output_tokens_per_s for p in run.points]
        # the mean: exact from an engine's histogram too, where its p50 is only as fine as a bucket
        itl = [p.itl_ms.mean if p.itl_ms.mean is not None else p.tpot_ms.mean for p in run.points]
        ttft = [p.ttft_ms.p50 for p in run.points]
        e2e = [p.e2e_ms.p50 for p in run.points]
        if all(v is None for v in itl):  # non-streamed runs: end-to-end latency instead
            itl, ttft = e2e, [None] * len(xs)
        # each point keeps its own label: a point without a latency (all its requests failed) is left out
        pts = [(p, x, y) for p, x, y in zip(run.points, xs, itl, strict=True) if y is not None]
        if pts:
            ax1.plot([x for _, x, _ in pts], [y for _, _, y in pts], marker="o", label=run.target.label)
            for p, x, y in pts:
                if p.concurrency is not None and run.config.mode != "rate":
                    ax1.annotate(str(p.concurrency), (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
        xy = [(x, y) for x, y in zip(xs, ttft, strict=True) if y is not None]
        if xy:
            ax2.plot([x for x, _ in xy], [y for _, y in xy], marker="o", label=run.target.label)
    ax1.set_xlabel("output tokens/s")
    ax1.set_ylabel("inter-token latency mean (ms)")
    ax1.set_title("Per-token latency vs throughput")
    ax2.set_xlabel("output tokens/s")
    ax2.set_ylabel("time to first token p50 (ms)")
    ax2.set_title("TTFT vs throughput")
    for ax in (ax1, ax2):
        ax.grid(True, alpha=0.3)
        ax.set_ylim(bottom=0)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    return fig


def write_plots(runs: list[Run], out_dir: str | Path, prefix: str = "compare") -> list[Path]:
    out_dir = Path(out_dir)
    return [
        plot_throughput(runs, out_dir / f"{prefix}-throughput.png"),
        plot_latency(runs, out_dir / f"{prefix}-latency.png"),
    ]


def plot_makespan(configs: list[ConfigCurve], job: JobSpec, gpu_counts: list[int], path: Path) -> Path:
    xs = sorted(set(gpu_counts) | {1, 2, 4, 8, 16, 32, 64})
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for cfg in configs:
        ys = [plan_job([cfg], job, g)[0].makespan_s / 3600 for g in xs]
        ax.plot(xs, ys, marker="o", label=cfg.name)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("GPUs")
    ax.set_ylabel("makespan (hours)")
    ax.set_title(f"{job.prompts:,} prompts x {job.output_tokens_mean:,.0f} tokens")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    return _save(fig, path, dpi=110)


def _save(fig: Figure, path: str | Path, dpi: float | None = None) -> Path:
    """Lay the figure out, write it as PNG (its folder made if needed) and free it."""
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi if dpi is not None else "figure")
    plt.close(fig)
    return path
