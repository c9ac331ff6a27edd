"""`servefleet report DEST` (a generate job) or `servefleet report RUN.json ...` (bench runs): one
self-contained HTML file to look at."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from servefleet.cli.exitcodes import ExitCode
from servefleet.cli.failure import CliFailure, ErrorKind

HELP = """Write one self-contained HTML report (no network: inline SVG, CSS and a few lines of script).

servefleet report DEST (a generate --output: a folder or s3://bucket/prefix): output tokens/s over time per
server, concurrency per server (in flight and the limit), outages and restarts on the same time axis,
failures, every run of the job, and the plan's prediction against the measured makespan when a plan is
known (--bench RUN.json, or the --bench runs generate was given). Read only from the destination, so it
works while the job runs too. Default --out: DEST/report.html (./report.html for object storage).

servefleet report RUN.json [RUN.json ...] (servefleet bench runs): throughput and latency (end-to-end,
TTFT, TPOT) against concurrency, side by side. Default --out: ./bench-report.html.

Exit code: 0 written, 3 bad input (not a job, not a bench run)."""


def register(app: typer.Typer) -> None:
    app.command(
        "report",
        help=HELP,
        short_help="One self-contained HTML report of a generate job (DEST) or of bench runs (RUN.json ...).",
    )(report)


def report(
    sources: Annotated[
        list[str], typer.Argument(help="a generate destination (folder or s3://...), or bench RUN.json files")
    ],
    out: Annotated[Path | None, typer.Option("--out", "-o", help="the HTML file to write")] = None,
    bench: Annotated[
        list[Path] | None,
        typer.Option(
            "--bench",
            help="with DEST: the bench run of the configuration that ran the job (its plan is checked against the run)",
        ),
    ] = None,
    json_out: Annotated[
        bool, typer.Option("--json", help="print where the report was written (and what it holds) as JSON")
    ] = False,
) -> None:
    from servefleet.errors import ServefleetError

    try:
        if all(s.endswith(".json") and os.path.isfile(s) for s in sources):
            if bench:
                raise _Usage("--bench goes with a job destination, not with RUN.json files")
            html, summary, default = _bench(sources)
        elif len(sources) == 1:
            html, summary, default = _job(sources[0], bench or [])
        else:
            raise _Usage("give one generate destination, or one or more bench RUN.json files")
    except _Usage as exc:
        raise CliFailure(ErrorKind.USAGE, str(exc)) from None
    except ServefleetError as exc:
        raise CliFailure(ErrorKind.CONFIG, str(exc)) from None
    path = out or default
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(html, encoding="utf-8")
    tmp.replace(path)
    if json_out:
        sys.stdout.write(
            json.dumps({"status": "ok", "out": str(path.resolve()), "bytes": len(html.encode()), **summary}) + "\n"
        )
    else:
        Console().print(f"report: {path} ({len(html.encode()) / 1024:,.0f} KB)", highlight=False)
        for note in summary.get("notes", []):
            Console().print(f"  note: {note}", highlight=False)
    raise typer.Exit(int(ExitCode.OK))


class _Usage(Exception):
    pass


def _job(dest: str, bench: list[Path]) -> tuple[str, dict[str, Any], Path]:
    from servefleet.cli.report_html import job_html, provenance_of
    from servefleet.generate.job_record import job_series, progress_of, read_job

    record = read_job(dest)
    series = job_series(record)
    view = progress_of(record)
    notes: list[str] = []
    if not series["runs"]:
        notes.append("no time series yet: the job has not started sending (or was run by a servefleet without one)")
    paths = [str(p) for p in bench] or _bench_of_job(record.timelines)
    plan, plan_note = None, None
    if paths:
        plan, plan_note = _plan_check(dest, paths)
        if plan_note:
            notes.append(plan_note)
    else:
        plan_note = "no plan known: give --bench RUN.json (the bench run of the configuration that ran the job)"
    tail = _tail(record.timelines)
    html = job_html(
        series, view, plan=plan, plan_note=plan_note, failures=record.failures, manifest=record.manifest, tail=tail
    )
    local = "://" not in dest or dest.startswith("file://")
    default = Path(dest.removeprefix("file://")).expanduser() / "report.html" if local else Path("report.html")
    summary = {
        "kind": "generate",
        "destination": record.destination,
        "state": view["state"],
        "runs": len(series["runs"]),
        "servers": sorted(series["servers"]),
        "plan": plan is not None,
        "tail": tail,
        "notes": notes,
        "provenance": provenance_of((record.manifest or {}).get("runs") or []),
    }
    return html, summary, default


def _tail(timelines: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Idle and released server-seconds at the tail of the run that completed the job (None before)."""
    from servefleet.generate.tail import tail_of_timeline

    last = next((t for t in reversed(timelines) if t.get("started") is not None), None)
    if last is None or last.get("status") != "complete":
        return None
    return {"run_id": last.get("run_id"), **tail_of_timeline(last)}


def _bench_of_job(timelines: list[dict[str, Any]]) -> list[str]:
    """The bench runs generate was started from (--bench), when they are still where they were."""
    for tl in reversed(timelines):
        paths = [p for p in tl.get("bench") or [] if os.path.isfile(p)]
        if paths:
            return paths
    return []


def _plan_check(dest: str, paths: list[str]) -> tuple[dict[str, Any] | None, str | None]:
    from servefleet.errors import ServefleetError
    from servefleet.plan.check import check_plan, measure_job, pick_config
    from servefleet.plan.runs import curve_from_run, model_of_run

    try:
        measured = measure_job(dest)
        configs = [(curve_from_run(Path(p)), model_of_run(Path(p))) for p in paths]
        return check_plan(pick_config(configs, measured), measured).to_json(), None
    except (ServefleetError, OSError, ValueError) as exc:
        return None, f"plan check not possible: {exc}"


def _bench(paths: list[str]) -> tuple[str, dict[str, Any], Path]:
    from pydantic import ValidationError

    from servefleet.bench.result import Run
    from servefleet.cli.report_html import bench_html
    from servefleet.errors import ConfigError

    runs: list[dict[str, Any]] = []
    for p in paths:
        try:
            run = Run.model_validate_json(Path(p).read_bytes())
        except (ValidationError, ValueError) as exc:
            raise ConfigError(f"{p}: not a servefleet bench RUN.json ({str(exc).splitlines()[0]})") from None
        data = _bench_data(run, p)
        taken = {r["label"] for r in runs}
        if data["label"] in taken:  # two runs of one server: tell them apart by their file
            data["label"] = f"{data['label']} ({Path(p).stem})"
        runs.append(data)
    summary = {"kind": "bench", "runs": [r["label"] for r in runs], "notes": []}
    return bench_html(runs), summary, Path("bench-report.html")


def _bench_data(run: Any, path: str) -> dict[str, Any]:
    def stat(p: Any, name: str, q: str) -> float | None:
        own = getattr(p, name)
        if own is not None and own.n:
            return getattr(own, q)
        server = getattr(p.server_latency, name, None) if p.server_latency is not None else None
        return getattr(server, q) if server is not None else None

    points = [
        {
            "concurrency": p.concurrency,
            "output_tokens_per_s": p.output_tokens_per_s,
            "requests_per_s": p.requests_per_s,
            "ttft_p50_ms": stat(p, "ttft_ms", "p50"),
            "tpot_p50_ms": stat(p, "tpot_ms", "p50"),
            "tpot_mean_ms": stat(p, "tpot_ms", "mean"),
            "e2e_p50_ms": stat(p, "e2e_ms", "p50"),
            "e2e_p99_ms": stat(p, "e2e_ms", "p99"),
            "errors": p.errors,
            "client_bound": p.client_bound,
        }
        for p in sorted(run.points, key=lambda p: p.concurrency or 0)
        if p.concurrency
    ]
    best = run.best_point()
    return {
        "label": run.label,
        "path": path,
        "mode": run.measured_mode,
        "model": run.target.model,
        "points": points,
        "best_tps": best.output_tokens_per_s if best else 0.0,
        "best_concurrency": best.concurrency if best else None,
    }
