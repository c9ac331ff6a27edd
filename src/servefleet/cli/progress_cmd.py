"""`servefleet progress DEST`: watch a `generate` job from any terminal or machine, from what it
writes at its destination (a folder or ``s3://bucket/prefix``)."""

from __future__ import annotations

import json
import sys
import time
from typing import Annotated, Any

import typer
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from servefleet.cli.exitcodes import ExitCode
from servefleet.cli.failure import CliFailure, ErrorKind

HELP = """Show how far a `servefleet generate` job is: done / remaining, output tokens/s now and on
average, ETA, each server's state, concurrency and rate, and the last events. Read only from what the
job writes at DEST (a folder or s3://bucket/prefix: progress.json every 2 s, job.json), so it works
from another terminal or machine, while the job runs and after it ended.

State: running, starting (pre-pass or probing servers), complete, incomplete (failures), interrupted,
stalled, error, stale (a running job that stopped writing for 30 s or more by this machine's clock:
it was probably killed; generate again resumes it), or damaged (a finished job whose shards are not what it
committed, or that hold ids twice: generate again checks them, quarantines the damaged ones and asks their ids again). Done: answered
while the run sends, committed (in published shards, what survives a kill) once it does not.
Remaining: prompts not answered yet (while running, the failed ones are not counted: this run does not send them again; a resumed run does).
Exit code: 0, or 3 when DEST holds no job. With --watch: refresh until the job ends, then
exit as generate did (0 complete, 1 incomplete, stale or damaged, 2 stalled, 130 interrupted)."""

_ENDED = {
    "complete": ExitCode.OK,
    "incomplete": ExitCode.FAILED,
    "error": ExitCode.FAILED,
    "stale": ExitCode.FAILED,
    "damaged": ExitCode.FAILED,
    "stalled": ExitCode.TIMEOUT,
    "interrupted": ExitCode.INTERRUPTED,
    "rejected": ExitCode.FAILED,
}
_STYLE = {
    "running": "bold cyan",
    "starting": "bold",
    "complete": "bold green",
    "stale": "bold red",
    "damaged": "bold red",
    "stalled": "bold red",
    "error": "bold red",
    "incomplete": "bold yellow",
    "interrupted": "bold yellow",
}


def register(app: typer.Typer) -> None:
    app.command(
        "progress",
        help=HELP,
        short_help="Done/remaining, rate, ETA and per-server state of a generate job, from its destination (any terminal).",
    )(progress)


def progress(
    dest: Annotated[str, typer.Argument(help="the job's --output: a folder or s3://bucket/prefix")],
    watch: Annotated[bool, typer.Option("--watch", "-f", help="refresh until the job ends")] = False,
    interval: Annotated[
        float, typer.Option("--interval", min=0.2, help="seconds between refreshes with --watch")
    ] = 2.0,
    json_out: Annotated[
        bool, typer.Option("--json", help="print JSON (with --watch: one object per line, per refresh)")
    ] = False,
) -> None:
    from servefleet.errors import ConfigError
    from servefleet.generate.job_record import progress_of, read_job

    def read() -> dict[str, Any]:
        try:
            return progress_of(read_job(dest, timelines=False, failures=False))
        except ConfigError as exc:  # not a job (yet): the one error shape, exit 3
            raise CliFailure(ErrorKind.CONFIG, str(exc)) from None

    view = read()
    if not watch:
        _show(view, json_out)
        raise typer.Exit(int(ExitCode.OK))
    if json_out or not Console().is_terminal:
        while True:
            _show(view, json_out)
            if _ended(view):
                break
            time.sleep(interval)
            view = read()
    else:
        with Live(render(view), console=Console(), refresh_per_second=4) as live:
            while not _ended(view):
                time.sleep(interval)
                view = read()
                live.update(render(view))
    raise typer.Exit(int(_ENDED.get(view["state"], ExitCode.FAILED)))


def _ended(view: dict[str, Any]) -> bool:
    return view["state"] not in ("running", "starting")


def _show(view: dict[str, Any], json_out: bool) -> None:
    if json_out:
        sys.stdout.write(json.dumps(view) + "\n")
        sys.stdout.flush()
    else:
        Console().print(render(view))


def _eta(seconds: float | None) -> str:
    from servefleet.cli.generate_view import format_eta

    return format_eta(seconds)


def _rates(view: dict[str, Any]) -> list[Any]:
    avg = f"{view.get('output_tokens_per_s_avg') or 0:,.0f} tok/s avg   "
    if view.get("output_tokens_per_s_now") is None:  # the job is not sending
        return [avg]
    return [(f"{view['output_tokens_per_s_now']:,.0f} tok/s", "cyan"), " now, " + avg]


def render(view: dict[str, Any]) -> Group:
    total = int(view.get("total") or 0)
    done = int(view.get("done") or 0)
    state = view["state"]
    head = Text.assemble(
        (state, _STYLE.get(state, "bold")),
        f"  {done:,}/{total:,} done  {100 * done / max(1, total):5.1f}%   ",
        f"committed {int(view['committed']):,}   " if view.get("committed") not in (None, done) else "",
        f"remaining {int(view.get('remaining') or 0):,}   ",
        *_rates(view),
        f"ETA {_eta(view.get('eta_s'))}   retries {int(view.get('retries') or 0):,}   ",
        (f"failed {int(view.get('failed') or 0):,}", "red" if view.get("failed") else ""),
    )
    parts: list[Any] = [head]
    where = f"{view['destination']}  run {view.get('run_id')} ({view.get('runs')} run(s))"
    if view.get("updated_s_ago") is not None:
        where += f"  updated {view['updated_s_ago']:.0f}s ago, this run sent for {_eta(view.get('elapsed_s'))}"
    parts.append(Text(where, style="dim"))
    if view.get("note"):
        parts.append(Text(view["note"], style="yellow"))
    if view.get("membership"):  # an elastic job: servers joined, left, replaced, released
        from servefleet.cli.generate_view import membership_text

        parts.append(Text("servers: " + membership_text(view.get("width"), view["membership"])))
    if view.get("servers"):
        table = Table(box=None, padding=(0, 2), header_style="dim")
        for col in ("server", "state", "in flight", "tok/s", "requests", "errors", "restarts", "limit: why"):
            table.add_column(col, justify="left" if col in ("server", "state", "limit: why") else "right")
        for s in view["servers"]:
            why = f"{s['limit_source']}: {s['limit_reason']}" if s.get("limit_reason") else s.get("limit_source", "")
            table.add_row(
                s["name"],
                Text(s["state"], style={"up": "green", "down": "yellow", "gone": "red"}.get(s["state"], "")),
                f"{s['in_flight']}/{s['limit']}",
                f"{s['output_tokens_per_s']:,.0f}",
                f"{s['requests']:,}",
                f"{s['errors']:,}",
                str(s["restarts"]),
                Text(why, style="dim", overflow="ellipsis", no_wrap=True),
            )
        parts.append(table)
    for e in (view.get("events") or [])[-8:]:
        parts.append(Text(e, style="yellow"))
    return Group(*parts)
