"""The final summary of a run: a pydantic model (``--json``) and a rich rendering."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from servefleet.generate.stats import JobStats

__all__ = ["ServerReport", "JobReport", "build_report", "render_report"]


class ServerReport(BaseModel):
    name: str
    base_url: str
    state: str
    requests: int
    errors: int
    completion_tokens: int
    prompt_tokens: int
    output_tokens_per_s: float
    mean_latency_s: float
    final_concurrency: int
    limit_source: str = ""  # fixed | bench | capacity | search
    limit_reason: str = ""  # the concurrency controller's last decision
    outages: int
    restarts: int


class JobReport(BaseModel):
    status: str  # complete | incomplete | stalled | interrupted | rejected
    destination: str
    input: str
    run_id: str | None = None
    resumed: bool = False
    total: int = 0  # valid ids in the input
    rejected: int = 0
    duplicates: int = 0
    done_before: int = 0
    to_send: int = 0
    done: int = 0
    committed: int = 0
    failed: int = 0
    retries: int = 0
    requeued: int = 0
    remaining: int = 0  # valid ids not in any committed shard after this run
    shards: int = 0
    completion_tokens: int = 0
    prompt_tokens: int = 0
    wall_s: float = 0.0
    output_tokens_per_s: float = 0.0
    startup_s: float = 0.0  # from the start until the first request could go out
    peak_rss_mb: float | None = None
    servers: list[ServerReport] = Field(default_factory=list)
    events: list[str] = Field(default_factory=list)
    files: dict[str, str] = Field(default_factory=dict)
    message: str | None = None

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


def build_report(stats: JobStats, **fields: Any) -> JobReport:
    wall = stats.elapsed_s()
    servers = [
        ServerReport(
            name=s.name, base_url=s.base_url, state=s.state, requests=s.requests, errors=s.errors,
            completion_tokens=s.completion_tokens, prompt_tokens=s.prompt_tokens,
            output_tokens_per_s=round(s.completion_tokens / wall, 2) if wall > 0 else 0.0,
            mean_latency_s=round(s.mean_latency_s(), 4), final_concurrency=s.limit,
            limit_source=s.limit_source, limit_reason=s.limit_reason, outages=s.outages, restarts=s.restarts,
        )
        for s in stats.servers.values()
    ]
    return JobReport(
        total=stats.total, done_before=stats.done_before, to_send=stats.to_send, done=stats.done,
        committed=stats.committed, failed=stats.failed, retries=stats.retries, requeued=stats.requeued,
        rejected=stats.rejected, shards=stats.shards, completion_tokens=stats.completion_tokens,
        prompt_tokens=stats.prompt_tokens, wall_s=round(wall, 3),
        output_tokens_per_s=round(stats.completion_tokens / wall, 2) if wall > 0 else 0.0,
        servers=servers, events=list(stats.events), **fields,
    )


_STYLE = {"complete": "bold green", "incomplete": "bold yellow", "interrupted": "bold yellow", "stalled": "bold red", "rejected": "bold red"}


def render_report(report: JobReport, console: Console) -> None:
    head = Text.assemble(
        (f"{report.status}", _STYLE.get(report.status, "bold")),
        f"  {report.done_before + report.committed:,}/{report.total:,} ids committed",
        f" ({report.committed:,} in this run, {report.done_before:,} before)",
    )
    summary = Table.grid(padding=(0, 2))
    summary.add_column(style="dim")
    summary.add_column()
    summary.add_row("destination", report.destination)
    summary.add_row("output tokens", f"{report.completion_tokens:,}  ({report.output_tokens_per_s:,.1f} tok/s over {report.wall_s:,.1f}s)")
    summary.add_row("failed / retries", f"{report.failed:,} / {report.retries:,}" + (f"  (re-queued from dead servers: {report.requeued:,})" if report.requeued else ""))
    summary.add_row("rejected input", f"{report.rejected:,}" + (f" ({report.duplicates:,} duplicate ids)" if report.duplicates else ""))
    summary.add_row("remaining", f"{report.remaining:,}")
    summary.add_row("shards", f"{report.shards:,} committed in this run")
    for label, path in report.files.items():
        summary.add_row(label, path)
    if report.message:
        summary.add_row("note", report.message)
    table = Table(title="servers", title_justify="left", expand=False)
    for col in ("server", "state", "requests", "errors", "tok/s", "latency", "limit", "outages", "restarts", "limit: why"):
        table.add_column(col, justify="left" if col in ("server", "state", "limit: why") else "right", no_wrap=col != "limit: why")
    for s in report.servers:
        table.add_row(s.name, s.state, f"{s.requests:,}", f"{s.errors:,}", f"{s.output_tokens_per_s:,.1f}",
                      f"{s.mean_latency_s:.2f}s", str(s.final_concurrency), str(s.outages), str(s.restarts),
                      f"{s.limit_source}: {s.limit_reason}" if s.limit_reason else s.limit_source)
    parts: list[Any] = [head, summary]
    if report.servers:
        parts.append(table)
    console.print(Group(*parts))
