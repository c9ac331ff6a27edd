"""`bench` and `compare` on the terminal: the per-point table of a run (the columns that decide a
configuration), the one-line progress of each finished point, and the comparison table."""

from __future__ import annotations

from rich.table import Table

from servefleet.bench.compare import Comparison
from servefleet.bench.result import Point, Run, Stat

__all__ = ["run_table", "point_line", "compare_table", "fmt"]


def fmt(value: float | None, digits: int = 1) -> str:
    if value is None:
        return "-"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.{digits}f}"


def _ms(s: Stat, which: str = "p50") -> str:
    """A latency; a percentile the engine's histogram buckets could not place reads as its bucket ("<10")."""
    value = getattr(s, which)
    bucket = s.resolution_ms.get(which)
    if value is None and bucket is not None:
        lower, upper = bucket
        return f">{fmt(lower, 0)}" if upper is None else f"<{fmt(upper, 0)}"
    return fmt(value)


def _errors(p: Point) -> str:
    if not p.errors:
        return "0"
    kinds = ", ".join(f"{k} {v}" for k, v in p.errors_by_kind.items())
    return f"[red]{p.errors}[/] ({kinds})"


def _server(p: Point) -> str:
    s = p.server
    if s is None:
        return "-"
    parts = []
    if s.running_max is not None:
        parts.append(f"run≤{s.running_max:.0f}")
    if s.queued_max:
        parts.append(f"queue≤{s.queued_max:.0f}")
    if s.kv_cache_usage_max is not None:
        parts.append(f"kv {100 * s.kv_cache_usage_max:.0f}%")
    if s.spec_accept_length is not None:
        parts.append(f"accept {s.spec_accept_length:.2f}")
    if s.saturated:
        parts.append("[yellow]saturated[/]")
    return " ".join(parts) or "-"


def _sources(run: Run) -> str:
    kinds = {v.split(":", 1)[0] for p in run.points for v in p.latency_source.values()}
    if kinds == {"client"}:
        return "client"
    if "server" in kinds:
        return "engine /metrics" if "client" not in kinds else "client and engine /metrics"
    return "none" if run.points else "-"


def _rate(p: Point) -> str:
    text = fmt(p.output_tokens_per_s)
    return text if p.steady is None or p.steady.steady else f"{text} [yellow](short)[/]"


def run_table(run: Run) -> Table:
    """The per-point table of one run."""
    t = run.target
    title = (
        f"{t.label} — {t.engine or 'unknown engine'}{' ' + t.engine_version if t.engine_version else ''} — "
        f"{run.measured_mode} (out tok/s: steady part; latency: {_sources(run)})"
    )
    rate_mode = run.config.mode == "rate"
    table = Table(title=title, title_justify="left", header_style="bold")
    table.add_column("rate/s" if rate_mode else "conc", justify="right")
    table.add_column("reqs", justify="right")
    table.add_column("errors", justify="left")
    table.add_column("out tok/s", justify="right", style="bold")
    table.add_column("tot tok/s", justify="right")
    table.add_column("req/s", justify="right")
    table.add_column("tok/s/req", justify="right")
    table.add_column("TTFT p50/p99 ms", justify="right")
    table.add_column("TPOT mean/p50 ms", justify="right")
    table.add_column("ITL p50/p99 ms", justify="right")
    table.add_column("E2E p50 ms", justify="right")
    table.add_column("in flight", justify="right")
    table.add_column("server", justify="left")
    table.add_column("client", justify="left")
    for p in run.points:
        level = fmt(p.request_rate, 2) if rate_mode else str(p.concurrency)
        client = "[red]client-bound[/]" if p.client_bound else "ok"
        table.add_row(
            level,
            str(p.requests),
            _errors(p),
            _rate(p),
            fmt(p.total_tokens_per_s),
            fmt(p.requests_per_s, 2),
            fmt(p.output_tokens_per_s_per_request.mean),
            f"{_ms(p.ttft_ms)}/{_ms(p.ttft_ms, 'p99')}",
            f"{_ms(p.tpot_ms, 'mean')}/{_ms(p.tpot_ms)}",
            f"{_ms(p.itl_ms, 'p50')}/{_ms(p.itl_ms, 'p99')}",
            _ms(p.e2e_ms),
            fmt(p.achieved_concurrency),
            _server(p),
            client,
        )
    return table


def point_line(p: Point) -> str:
    """One line per finished point, for progress output."""
    level = f"rate {p.request_rate:g}/s" if p.request_rate is not None else f"concurrency {p.concurrency}"
    flag = " [red]client-bound: " + "; ".join(p.client.reasons) + "[/]" if p.client_bound else ""
    errs = f", {p.errors} errors" if p.errors else ""
    if p.steady is not None and not p.steady.steady and p.steady.reason:
        flag += f" [yellow]{p.steady.reason}[/]"
    return (
        f"{level}: {fmt(p.output_tokens_per_s)} out tok/s, {fmt(p.requests_per_s, 2)} req/s, "
        f"TTFT p50 {_ms(p.ttft_ms)} ms, ITL mean {_ms(p.itl_ms, 'mean')} p50 {_ms(p.itl_ms)} ms ({p.requests} requests{errs}){flag}"
    )


def compare_table(comp: Comparison) -> Table:
    """Rows: configurations. Columns: output tok/s at each level (ratio to the first run), best point."""
    table = Table(
        title="output tokens/s by " + ("request rate" if comp.level_kind == "rate" else "concurrency"),
        title_justify="left",
        header_style="bold",
    )
    table.add_column("configuration")
    for lv in comp.levels:
        table.add_column(("rate " if comp.level_kind == "rate" else "c=") + lv, justify="right")
    table.add_column("best", justify="right", style="bold")
    table.add_column("at", justify="right")
    table.add_column("tok/s/req @best", justify="right")
    table.add_column("vs first", justify="right")
    for i, s in enumerate(comp.runs):
        cells = []
        for lv in comp.levels:
            v = s.output_tokens_per_s.get(lv)
            if v is None:
                cells.append("-")
                continue
            text = fmt(v)
            if i > 0 and s.ratio.get(lv) is not None:
                text += f" ({s.ratio[lv]:.2f}x)"
            if lv in s.client_bound_levels:
                text += " [red]*[/]"
            cells.append(text)
        table.add_row(
            s.label,
            *cells,
            fmt(s.best_output_tokens_per_s),
            s.best_level or "-",
            fmt(s.best_per_request_tokens_per_s),
            "1.00x" if i == 0 else (f"{s.ratio_best:.2f}x" if s.ratio_best else "-"),
        )
    if any(s.client_bound_levels for s in comp.runs):
        table.caption = "[red]*[/] the client, not the server, was the limit at that point"
    return table
