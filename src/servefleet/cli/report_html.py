"""The HTML reports of `servefleet report`: one self-contained file (inline CSS, inline SVG drawn here,
a few lines of inline JavaScript to hide and show series; nothing fetched), for a generate job or for
bench runs side by side. The numbers behind every chart are also embedded as JSON
(``<script type="application/json" id="report-data">``)."""

from __future__ import annotations

import datetime as dt
import html
import json
from typing import Any

from servefleet.cli.svg_chart import PALETTE, Band, Mark, Series, bar_pairs, line_chart

__all__ = ["job_html", "bench_html"]

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px auto;max-width:960px;color:#222}
h1{font-size:22px;margin:0 0 4px} h2{font-size:17px;margin:28px 0 6px;border-bottom:1px solid #ddd;padding-bottom:3px}
.sub{color:#666;margin-bottom:14px} .cards{display:flex;flex-wrap:wrap;gap:10px;margin:12px 0}
.card{border:1px solid #ddd;border-radius:6px;padding:8px 12px;min-width:120px} .card b{display:block;font-size:18px}
.card span{color:#666;font-size:12px} table{border-collapse:collapse;margin:6px 0} td,th{padding:3px 10px;border-bottom:1px solid #eee;text-align:right}
td:first-child,th:first-child{text-align:left} th{color:#555;font-weight:600} .legend{margin:2px 0 4px 70px}
.key{display:inline-block;margin-right:14px;cursor:pointer;user-select:none} .key i{display:inline-block;width:18px;height:3px;vertical-align:middle;margin-right:5px}
.key.off{opacity:.35} .tick{font-size:11px;fill:#555} .axis{font-size:12px;fill:#333} .mark{font-size:11px}
.ok{color:#2a7d2a} .bad{color:#b22} .note{color:#666;font-size:13px} .events{font:12px/1.4 ui-monospace,monospace;color:#444;max-height:260px;overflow:auto;border:1px solid \
#eee;padding:6px}
"""

# Click a legend key to hide or show its series in every chart of the page.
_JS = """
document.querySelectorAll('.key').forEach(function (key) {
  key.addEventListener('click', function () {
    var name = key.getAttribute('data-series');
    var off = key.classList.toggle('off');
    document.querySelectorAll('.key').forEach(function (k) { if (k.getAttribute('data-series') === name) k.classList.toggle('off', off); });
    document.querySelectorAll('g.series').forEach(function (g) {
      if (g.getAttribute('data-key') === name) g.style.display = off ? 'none' : '';
    });
  });
});
document.getElementById('report-data') && JSON.parse(document.getElementById('report-data').textContent);
"""


def _esc(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _page(title: str, subtitle: str, body: list[str], data: dict[str, Any]) -> str:
    blob = json.dumps(data, separators=(",", ":")).replace("</", "<\\/")
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{_esc(title)}</title>'
        f'<meta name="viewport" content="width=device-width,initial-scale=1"><style>{_CSS}</style></head><body>'
        f'<h1>{_esc(title)}</h1><div class="sub">{_esc(subtitle)}</div>{"".join(body)}'
        f'<script type="application/json" id="report-data">{blob}</script><script>{_JS}</script></body></html>\n'
    )


def _legend(names: list[str], colors: dict[str, str], extra: str = "") -> str:
    keys = "".join(
        f'<span class="key" data-series="{_esc(n)}"><i style="background:{colors[n]}"></i>{_esc(n)}</span>'
        for n in names
    )
    return f'<div class="legend">{keys}{extra}</div>'


def _cards(items: list[tuple[str, str]]) -> str:
    return (
        '<div class="cards">'
        + "".join(f'<div class="card"><b>{_esc(v)}</b><span>{_esc(k)}</span></div>' for k, v in items)
        + "</div>"
    )


def _duration(s: float | None) -> str:
    if s is None:
        return "-"
    s = float(s)
    if s < 120:
        return f"{s:.1f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.2f} h"


# ---- a generate job ---------------------------------------------------------------------------------


def job_html(
    series: dict[str, Any],
    view: dict[str, Any],
    *,
    plan: dict[str, Any] | None,
    plan_note: str | None,
    failures: dict[str, Any],
    manifest: dict[str, Any],
    tail: dict[str, Any] | None = None,
) -> str:
    names = sorted(series["servers"])
    colors = {n: PALETTE[i % len(PALETTE)] for i, n in enumerate(names)}
    x_max = max(1.0, float(series.get("x_max") or 0))
    bands = [
        Band(
            o["start_s"],
            o["end_s"],
            colors.get(o["server"], "#999"),
            f"{o['server']} out of service {o['start_s']:.1f}-{o['end_s']:.1f} s"
            + (" (still out at the end)" if o.get("open") else ""),
            attrs={"data-server": o["server"], "data-start": f"{o['start_s']:g}", "data-end": f"{o['end_s']:g}"},
        )
        for o in series["outages"]
    ]
    marks = [
        Mark(
            e["t"],
            colors.get(e["server"], "#555"),
            f"{e['kind']} {e['server']}",
            attrs={"data-server": e["server"], "data-t": f"{e['t']:g}"},
        )
        for e in series["events"]
        if e["kind"] in ("restart", "join")
    ]
    runs = series["runs"]
    marks += [
        Mark(
            r["start_s"],
            "#888",
            f"run {i + 1}" + (" (resumed)" if i else ""),
            cls="run",
            attrs={"data-run": str(r["run_id"])},
            bottom=True,
        )
        for i, r in enumerate(runs)
        if i
    ]
    srv = series["servers"]
    tps = [Series(n, srv[n]["t"], srv[n]["output_tokens_per_s"], colors[n]) for n in names]
    conc = [Series(n, srv[n]["t"], srv[n]["in_flight"], colors[n]) for n in names]
    conc += [
        Series(f"{n} limit", srv[n]["t"], srv[n]["limit"], colors[n], dash="5,4", width=1.2, key=n) for n in names
    ]
    job = series["job"]
    fail = [
        Series("failed", job.get("t", []), job.get("failed", []), "#b22", points=False),
        Series("retries", job.get("t", []), job.get("retries", []), "#ff7f0e", dash="4,3"),
    ]
    fail += [Series(f"{n} errors", srv[n]["t"], srv[n]["errors"], colors[n], width=1.0, key=n) for n in names]

    inp = manifest.get("input") or {}
    done, total = int(view.get("done") or 0), int(view.get("total") or 0)
    wall = sum(r["end_s"] - r["start_s"] for r in runs)
    tokens = sum(t["output_tokens"] for t in series.get("totals", {}).values())
    body = [
        _cards(
            [
                ("state", view.get("state", "?")),
                ("done", f"{done:,} / {total:,}"),
                ("failed", f"{int(view.get('failed') or 0):,}"),
                ("runs", str(len(manifest.get("runs") or []))),
                ("sending time", _duration(wall)),
                ("output tokens", f"{tokens:,}"),
                ("output tok/s (mean)", f"{tokens / wall:,.1f}" if wall > 0 else "-"),
            ]
        )
    ]
    if view.get("note"):
        body.append(f'<p class="bad">{_esc(view["note"])}</p>')
    legend = _legend(names, colors)
    body.append(
        "<h2>Output tokens/s per server</h2>"
        + legend
        + line_chart("tps", series=tps, x_max=x_max, y_label="output tok/s", bands=bands, marks=marks)
    )
    body.append(
        '<p class="note">Shaded: a server out of service (taken out until back); dashed lines: restarts through the '
        f"fleet, servers joining and resumed runs. Buckets of {', '.join(sorted({_duration(r['bucket_s']) for r in runs})) or '-'}.</p>"
    )
    if any(v for v in job.get("serving", []) if v is not None):  # an elastic job's width beside its throughput
        width = [Series("servers in service", job["t"], job["serving"], "#333")]
        body.append(
            '<h2>Servers in service</h2><p class="note">The servers taking requests (mean per bucket), on the time axis of the '
            "throughput above: joins, replacements and releases change it.</p>"
            + line_chart("serving", series=width, x_max=x_max, y_label="servers", bands=bands, marks=marks)
        )
    body.append(
        "<h2>Concurrency per server</h2>"
        + _legend(
            names,
            colors,
            ' <span class="note">solid: requests in flight (mean per bucket), dashed: the concurrency limit</span>',
        )
        + line_chart("concurrency", series=conc, x_max=x_max, y_label="requests in flight", bands=bands, marks=marks)
    )
    body.append(
        f"<h2>Failures</h2><p>{int(failures.get('total', 0)):,} prompts failed every attempt "
        f"in the last run (failures.jsonl; a resumed run sends them again); per bucket: prompts failed, requests retried, "
        f"each server's errors.</p>"
        + line_chart("failures", series=fail, x_max=x_max, y_label="per bucket", bands=bands, marks=marks)
    )
    if failures.get("kinds"):
        body.append(
            "<table><tr><th>error</th><th>prompts</th></tr>"
            + "".join(f"<tr><td>{_esc(k)}</td><td>{c:,}</td></tr>" for k, c in failures["kinds"])
            + "</table>"
        )
    body.append(_tail_section(tail))
    body.append(_plan_section(plan, plan_note))
    body.append(_servers_table(names, colors, series, view))
    body.append(_runs_table(runs))
    body.append(_provenance_table(manifest.get("runs") or []))
    msgs = series.get("messages") or []
    if msgs:
        body.append(
            '<h2>Events</h2><div class="events">'
            + "<br>".join(f"{m['t']:9.1f}s  {_esc(m['text'])}" for m in msgs)
            + "</div>"
        )
    subtitle = (
        f"{series['destination']} - input {inp.get('path', '?')} ({inp.get('valid', 0):,} prompts) - "
        f"written {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC"
    )
    data = {"kind": "generate", "series": series, "progress": view, "plan": plan, "failures": failures, "tail": tail}
    return _page("servefleet generate: job report", subtitle, body, data)


def _tail_section(tail: dict[str, Any] | None) -> str:
    """Idle server-seconds at the tail of the completing run, and what --release-tail gave back."""
    if tail is None:
        return ""
    rows = "".join(
        f"<tr><td>{_esc(n)}</td><td>{p['idle_s']:,.1f} s</td><td>{p['released_s']:,.1f} s</td></tr>"
        for n, p in sorted(tail["per_server"].items())
        if p["idle_s"] or p["released_s"]
    )
    return (
        f'<h2>The tail</h2><p id="tail">{tail["idle_server_s"]:,.1f} server-seconds idle at the tail (up with nothing in '
        f"flight, from a server's last request until it was released or the job ended); --release-tail gave back "
        f"{tail['released_server_s']:,.1f} server-seconds ({tail['released']} server(s) released before the job's end "
        f'at {tail["job_s"]:,.1f} s).</p><p class="note">From the timeline of run {_esc(tail.get("run_id"))}: accurate to one '
        f"bucket ({_duration(tail['bucket_s'])}) per server.</p>"
        + (
            "<table><tr><th>server</th><th>idle at the tail</th><th>given back</th></tr>" + rows + "</table>"
            if rows
            else ""
        )
    )


def _plan_section(plan: dict[str, Any] | None, note: str | None) -> str:
    if plan is None:
        return f'<h2>Plan against the run</h2><p class="note">{_esc(note or "no plan known")}</p>'
    m = plan["metrics"]["makespan_s"]
    cls = "ok" if plan["within_tolerance"] else "bad"
    rows = [("predicted makespan", m["predicted"], "#9467bd"), ("measured makespan", m["measured"], "#1f77b4")]
    notes = "".join(f"<li>{_esc(n)}</li>" for n in plan.get("notes", []))
    return (
        f"<h2>Plan against the run</h2><p>{_esc(plan['configuration'])} at concurrency {plan['concurrency']} on "
        f'{plan["replicas"]} replica(s): <b class="{cls}">{_esc(plan["verdict"])}</b> '
        f"({m['error_pct']:+.1f}% of the measured {m['measured']:,.1f} s).</p>"
        + bar_pairs("plan", rows, "s")
        + f'<ul class="note">{notes}</ul>'
    )


def _servers_table(names: list[str], colors: dict[str, str], series: dict[str, Any], view: dict[str, Any]) -> str:
    last = {s["name"]: s for s in view.get("servers") or []}
    rows = []
    for n in names:
        t = series["totals"][n]
        s = last.get(n, {})
        rows.append(
            f'<tr><td><i style="display:inline-block;width:10px;height:10px;background:{colors[n]}"></i> {_esc(n)}</td>'
            f"<td>{_esc(s.get('state', '-'))}</td><td>{t['requests']:,}</td><td>{t['output_tokens']:,}</td>"
            f"<td>{t['errors']:,}</td><td>{t['outages']}</td><td>{t['restarts']}</td><td>{s.get('limit', '-')}</td>"
            f"<td>{_esc(s.get('limit_source', ''))}</td></tr>"
        )
    return (
        "<h2>Servers</h2><table><tr><th>server</th><th>state (last run)</th><th>requests</th><th>output tokens</th>"
        "<th>errors</th><th>outages</th><th>restarts</th><th>limit</th><th>limit from</th></tr>"
        + "".join(rows)
        + "</table>"
    )


def provenance_of(manifest_runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each run's servers as job.json records them (runs of a servefleet without provenance: none)."""
    return [
        {
            "run_id": r.get("run_id"),
            "servefleet": (r.get("provenance") or {}).get("servefleet"),
            "servers": (r.get("provenance") or {}).get("servers") or [],
        }
        for r in manifest_runs
    ]


def _provenance_table(manifest_runs: list[dict[str, Any]]) -> str:
    cols = (
        "host",
        "engine",
        "engine_version",
        "model_path",
        "model_revision",
        "model_content_hash",
        "gpu_type",
        "gpu_count",
        "launch_args",
    )
    rows = []
    for run in provenance_of(manifest_runs):
        for s in run["servers"]:
            cells = "".join(
                f"<td>{_esc(' '.join(v) if isinstance(v, list) and c == 'launch_args' else ('-' if v is None else str(v)))}</td>"
                for c in cols
                for v in [s.get(c)]
            )
            rows.append(
                f"<tr><td>{_esc(str(run['run_id']))}</td><td>{_esc(str(run['servefleet']))}</td><td>{_esc(s.get('name', '?'))}</td>{cells}</tr>"
            )
    if not rows:
        return '<h2>Provenance</h2><p class="note">no run recorded its servers (made by a servefleet without provenance)</p>'
    head = "".join(f"<th>{c}</th>" for c in ("run", "servefleet", "server", *cols))
    return "<h2>Provenance: what made each run's rows</h2><table><tr>" + head + "</tr>" + "".join(rows) + "</table>"


def _runs_table(runs: list[dict[str, Any]]) -> str:
    rows = "".join(
        f"<tr><td>{_esc(r['run_id'])}</td><td>{_esc(r['status'])}</td><td>{r['start_s']:,.1f} s</td>"
        f"<td>{_duration(r['end_s'] - r['start_s'])}</td></tr>"
        for r in runs
    )
    return (
        "<h2>Runs</h2><table><tr><th>run</th><th>status</th><th>starts at</th><th>sending time</th></tr>"
        + rows
        + "</table>"
    )


# ---- bench runs side by side ------------------------------------------------------------------------


def bench_html(runs: list[dict[str, Any]]) -> str:
    """``runs``: [{"label", "path", "mode", "points": [{"concurrency", "output_tokens_per_s", "e2e_p50_ms", ...}]}]."""
    labels = [r["label"] for r in runs]
    colors = {n: PALETTE[i % len(PALETTE)] for i, n in enumerate(labels)}
    concs = [p["concurrency"] for r in runs for p in r["points"] if p["concurrency"]]
    lo, hi = (min(concs), max(concs)) if concs else (1, 2)
    log2 = hi / max(lo, 1) >= 8
    x_min = lo / 1.25 if log2 else 0.0
    x_max = hi * 1.25 if log2 else hi * 1.05

    def lines(key: str, dash: str | None = None, suffix: str = "") -> list[Series]:
        return [
            Series(
                r["label"] + suffix,
                [p["concurrency"] for p in r["points"]],
                [p.get(key) for p in r["points"]],
                colors[r["label"]],
                dash=dash,
                points=True,
                key=r["label"],
            )
            for r in runs
        ]

    body = [_cards([(r["label"], f"best {r['best_tps']:,.0f} tok/s at c={r['best_concurrency']}") for r in runs])]
    legend = _legend(labels, colors)
    common: dict[str, Any] = dict(
        x_max=x_max, x_min=x_min, x_log2=log2, x_label="concurrency (requests in flight)", time_axis=False
    )
    body.append(
        "<h2>Output tokens/s against concurrency</h2>"
        + legend
        + line_chart("bench-tps", series=lines("output_tokens_per_s"), y_label="output tok/s", **common)
    )
    body.append(
        "<h2>Latency against concurrency</h2>"
        + _legend(labels, colors, ' <span class="note">solid: end-to-end p50, dashed: p99</span>')
        + line_chart(
            "bench-e2e",
            series=lines("e2e_p50_ms") + lines("e2e_p99_ms", "5,4", " p99"),
            y_label="end-to-end latency (ms)",
            **common,
        )
    )
    body.append(
        "<h2>Time to first token against concurrency</h2>"
        + legend
        + line_chart("bench-ttft", series=lines("ttft_p50_ms"), y_label="TTFT p50 (ms)", **common)
    )
    body.append(
        "<h2>Time per output token against concurrency</h2>"
        + legend
        + line_chart("bench-tpot", series=lines("tpot_mean_ms"), y_label="TPOT mean (ms)", **common)
    )
    for r in runs:
        if not r["points"]:
            body.append(
                f'<h2>{_esc(r["label"])}</h2><p class="note">{_esc(r["path"])}: no fixed-concurrency point '
                "(a --request-rate run), so nothing to draw against concurrency</p>"
            )
            continue
        rows = "".join(
            f"<tr><td>{p['concurrency']}</td><td>{p['output_tokens_per_s']:,.1f}</td><td>{p['requests_per_s']:,.2f}</td>"
            f"<td>{_ms(p.get('ttft_p50_ms'))}</td><td>{_ms(p.get('tpot_p50_ms'))}</td><td>{_ms(p.get('e2e_p50_ms'))}</td>"
            f"<td>{_ms(p.get('e2e_p99_ms'))}</td><td>{p['errors']}</td><td>{'yes' if p['client_bound'] else ''}</td></tr>"
            for p in r["points"]
        )
        body.append(
            f'<h2>{_esc(r["label"])}</h2><p class="note">{_esc(r["path"])} - {_esc(r["mode"])}, {_esc(r.get("model") or "")}</p>'
            "<table><tr><th>concurrency</th><th>output tok/s</th><th>req/s</th><th>TTFT p50</th><th>TPOT p50</th>"
            "<th>e2e p50</th><th>e2e p99</th><th>errors</th><th>client-bound</th></tr>" + rows + "</table>"
        )
    subtitle = f"{len(runs)} run(s) - written {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC"
    return _page("servefleet bench: runs side by side", subtitle, body, {"kind": "bench", "runs": runs})


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:,.1f} ms"
