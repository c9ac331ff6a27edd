"""`generate` on the terminal: the live progress of a running job and its final report.

The live view is a rich panel refreshed a few times a second: done/total, output tokens/s (over
the last 10 s and on average), ETA, retries, failures, and one line per server (state,
in-flight/limit, its own tokens/s, and where its limit comes from: bench, capacity or search, with
the controller's last decision). It reads :class:`JobStats` only; on a terminal that is not a TTY
it prints a one-line status every ``plain_interval_s`` instead. It is the job's ``Progress``
(``servefleet.generate.runner``): the job calls it and never imports it.

``render_report`` prints the :class:`JobReport` the job returns.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from servefleet.generate.report import JobReport
from servefleet.generate.stats import JobStats

__all__ = ["ProgressView", "format_eta", "render_report"]


def format_eta(seconds: float | None) -> str:
    if seconds is None:
        return "--"
    seconds = int(seconds)
    d, rem = divmod(seconds, 86400)
    h, rem = divmod(rem, 3600)
    m, s = divmod(rem, 60)
    if d:
        return f"{d}d{h:02d}h{m:02d}m"
    if h:
        return f"{h}h{m:02d}m{s:02d}s"
    return f"{m}m{s:02d}s"


class ProgressView:
    """Start with :meth:`start` once the job knows its totals; :meth:`phase` before that."""

    def __init__(
        self, console: Console | None = None, *, refresh_per_s: float = 4.0, plain_interval_s: float = 10.0
    ) -> None:
        self.console = console or Console(stderr=True)
        self.refresh_per_s = refresh_per_s
        self.plain_interval_s = plain_interval_s
        self._stats: JobStats | None = None
        self._live: Live | None = None
        self._task: asyncio.Task[None] | None = None
        self._shown_events = 0

    def phase(self, text: str) -> None:
        self.console.print(f"[dim]{text}[/dim]")

    def start(self, stats: JobStats) -> None:
        self._stats = stats
        if self.console.is_terminal:
            self._live = Live(
                self.render(), console=self.console, refresh_per_second=self.refresh_per_s, transient=False
            )
            self._live.start()
        self._task = asyncio.ensure_future(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._live is not None:
            self._live.update(self.render())
            self._live.stop()
            self._live = None

    async def _loop(self) -> None:
        last_plain = time.monotonic()
        while True:
            await asyncio.sleep(1.0 / self.refresh_per_s)
            if self._live is not None:
                self._live.update(self.render())
            elif time.monotonic() - last_plain >= self.plain_interval_s:
                last_plain = time.monotonic()
                self.console.print(self.plain_line(), highlight=False)
            self._print_events()

    def _print_events(self) -> None:
        st = self._stats
        if st is None:
            return
        fresh = min(st.events_total - self._shown_events, len(st.events))
        self._shown_events = st.events_total
        for e in list(st.events)[len(st.events) - fresh :] if fresh > 0 else []:
            self.console.print(f"[yellow]{e}[/yellow]", highlight=False)

    def plain_line(self) -> str:
        st = self._stats
        assert st is not None
        servers = "; ".join(
            f"{s.name} {s.state} {s.in_flight}/{s.limit} ({s.limit_source})" for s in st.servers.values()
        )
        return (
            f"generate: {st.done_before + st.done:,}/{st.total:,} done, {st.instant_tps():,.0f} tok/s now, "
            f"{st.avg_tps():,.0f} avg, ETA {format_eta(st.eta_s())}, retries {st.retries:,}, failed {st.failed:,}"
            + (f" | {servers}" if servers else "")
        )

    def render(self) -> Group:
        st = self._stats
        assert st is not None
        done = st.done_before + st.done
        bar = ProgressBar(total=max(1, st.total), completed=done, width=40)
        head = Text.assemble(
            (f"{done:,}/{st.total:,}", "bold"),
            f"  {100 * done / max(1, st.total):5.1f}%   ",
            (f"{st.instant_tps():,.0f} tok/s", "cyan"),
            f" now, {st.avg_tps():,.0f} avg   ",
            f"ETA {format_eta(st.eta_s())}   retries {st.retries:,}   ",
            (f"failed {st.failed:,}", "red" if st.failed else ""),
            f"   shards {st.shards:,}",
            f"   {membership_text(st.width, st.membership)}" if st.membership else "",
        )
        table = Table(box=None, padding=(0, 2), show_header=True, header_style="dim")
        for col in ("server", "state", "in flight", "tok/s", "requests", "errors", "limit: why"):
            table.add_column(col, justify="left" if col in ("server", "state", "limit: why") else "right")
        for s in st.servers.values():
            style = {"up": "green", "down": "yellow", "gone": "red"}.get(s.state, "")
            why = f"{s.limit_source}: {s.limit_reason}" if s.limit_reason else s.limit_source
            table.add_row(
                s.name,
                Text(s.state, style=style),
                f"{s.in_flight}/{s.limit}",
                f"{s.meter.rate():,.0f}",
                f"{s.requests:,}",
                f"{s.errors:,}",
                Text(why, style="dim", overflow="ellipsis", no_wrap=True),
            )
        return Group(Group(bar, head), table)


_STYLE = {
    "complete": "bold green",
    "incomplete": "bold yellow",
    "interrupted": "bold yellow",
    "stalled": "bold red",
    "rejected": "bold red",
}


def membership_text(width: int | None, counts: dict[str, int]) -> str:
    """An elastic job's servers: ``3 in service, joins 2, leaves 0, replacements 1, releases 0``."""
    parts = [] if width is None else [f"{width} in service"]
    return ", ".join(parts + [f"{k} {v:,}" for k, v in counts.items()])


def render_report(report: JobReport, console: Console) -> None:
    records = max(report.records, report.total + report.rejected)  # every input record, the rejected ones too
    head = Text.assemble(
        (f"{report.status}", _STYLE.get(report.status, "bold")),
        f"  {report.done_before + report.committed:,}/{records:,} input records committed",
        f" ({report.committed:,} in this run, {report.done_before:,} before)",
        (
            f", {report.rejected:,} rejected ({report.files.get('rejects', 'rejects.jsonl')})"
            if report.rejected
            else "",
            "red",
        ),
    )
    summary = Table.grid(padding=(0, 2))
    summary.add_column(style="dim")
    summary.add_column()
    summary.add_row("destination", report.destination)
    summary.add_row(
        "output tokens",
        f"{report.completion_tokens:,}  ({report.output_tokens_per_s:,.1f} tok/s over {report.wall_s:,.1f}s)",
    )
    summary.add_row(
        "failed / retries",
        f"{report.failed:,} / {report.retries:,}"
        + (f"  (re-queued from dead servers: {report.requeued:,})" if report.requeued else ""),
    )
    summary.add_row(
        "rejected input",
        f"{report.rejected:,}" + (f" ({report.duplicates:,} duplicate ids)" if report.duplicates else ""),
    )
    summary.add_row("remaining", f"{report.remaining:,}")
    summary.add_row("shards", f"{report.shards:,} committed in this run")
    if report.membership:
        summary.add_row("servers", membership_text(None, report.membership))
    for label, path in report.files.items():
        summary.add_row(label, path)
    if report.message:
        summary.add_row("note", report.message)
    for s in report.servers:
        if s.state_reason:
            summary.add_row(s.name, f"{s.state}: {s.state_reason}")
    table = Table(title="servers", title_justify="left", expand=False)
    for col in (
        "server",
        "state",
        "requests",
        "errors",
        "tok/s",
        "latency",
        "limit",
        "outages",
        "restarts",
        "limit: why",
    ):
        table.add_column(
            col, justify="left" if col in ("server", "state", "limit: why") else "right", no_wrap=col != "limit: why"
        )
    for s in report.servers:
        table.add_row(
            s.name,
            s.state,
            f"{s.requests:,}",
            f"{s.errors:,}",
            f"{s.output_tokens_per_s:,.1f}",
            f"{s.mean_latency_s:.2f}s",
            str(s.final_concurrency),
            str(s.outages),
            str(s.restarts),
            f"{s.limit_source}: {s.limit_reason}" if s.limit_reason else s.limit_source,
        )
    parts: list[Any] = [head, summary]
    if report.servers:
        parts.append(table)
    console.print(Group(*parts))


def render_preview(report, console: Console) -> None:
    """``generate --preview``: each record's request as sent, and its answer."""
    import json as _json

    failed = sum(1 for r in report.rows if r.error)
    console.print(
        Text.assemble(
            (report.status, "bold red" if failed else "bold green"),
            f"  {len(report.rows)} records sent, {failed} failed; nothing committed",
        )
    )
    for r in report.rows:
        console.print(Text(f"--- id {r.id} (line {r.line}) -> {r.server} /{r.endpoint}", style="bold"))
        console.print(Text("request: " + _json.dumps(r.request, ensure_ascii=False)[:1000], style="dim"))
        if r.error:
            console.print(Text(f"error: {r.error}", style="red"))
        else:
            console.print(
                Text(
                    f"finish_reason={r.finish_reason} prompt_tokens={r.prompt_tokens} completion_tokens={r.completion_tokens}"
                )
            )
            console.print(Text(r.text or ""))
