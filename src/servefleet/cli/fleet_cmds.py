"""`servefleet up | down | status | logs | restart`: a thin edge over ``servefleet.fleet.Fleet``.

Each command parses its arguments, runs one coroutine of the library and renders the result
(rich tables on a terminal, plain lines otherwise, ``--json`` for scripts). Exit codes are in
``exitcodes.py``: 0 all ready, 1 a server failed, 2 stalled or timed out, 3 bad fleet file or
arguments, 4 host unreachable.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.live import Live

from servefleet.catalog import State
from servefleet.cli.common import FleetOpt, JsonOpt, open_fleet, run_coroutine
from servefleet.cli.exitcodes import ExitCode
from servefleet.cli.failure import outcome_document
from servefleet.cli.fleet_view import (
    UpProgress,
    down_table,
    failure_notes,
    status_notes,
    status_table,
    up_json,
    up_table,
)
from servefleet.errors import ConfigError, ServefleetError
from servefleet.fleet import Fleet, Liveness, ServerStatus, StartOutcome
from servefleet.verify.verdict import Verdict

TimeoutOpt = Annotated[
    float | None, typer.Option("--timeout", help="Overall cap in seconds (default: the fleet file's).")
]
StallOpt = Annotated[
    float | None,
    typer.Option("--stall", help="Seconds without log or probe progress before a server counts as stalled."),
]
NoSmokeOpt = Annotated[
    bool, typer.Option("--no-smoke", help="Skip the one-token request before calling a server ready.")
]
GraceOpt = Annotated[float, typer.Option("--grace", help="Seconds between SIGTERM and SIGKILL.")]
KeepFailedOpt = Annotated[
    bool,
    typer.Option(
        "--keep-failed",
        help="Leave a server found failed running (to inspect it); by default its whole process group is stopped.",
    ),
]


def _console() -> Console:
    console = Console(highlight=False)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        # Piped or captured: rich would assume 80 columns and squeeze the log paths out.
        console = Console(highlight=False, width=200)
    return console


def _status_exit_code(statuses: list[ServerStatus]) -> ExitCode:
    """`status`: 0 every server shown is ready; 1 any is down (dead, not launched, stale) or failed;
    2 otherwise, when some are still loading or no longer answer (unresponsive)."""
    states = {st.state for st in statuses}
    if states & {Liveness.DEAD, Liveness.FAILED, Liveness.STALE, Liveness.NOT_LAUNCHED}:
        return ExitCode.FAILED
    if states - {Liveness.READY}:
        return ExitCode.TIMEOUT
    return ExitCode.OK


def _exit_code(verdicts: dict[str, Verdict]) -> ExitCode:
    states = {v.state for v in verdicts.values()}
    if State.FAILED in states:
        return ExitCode.FAILED
    if states - {State.READY}:
        return ExitCode.TIMEOUT
    return ExitCode.OK


def _split_names(values: list[str] | None) -> list[str] | None:
    names = [n.strip() for v in values or [] for n in v.split(",") if n.strip()]
    return names or None


def _print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


def _print_outcome(data: dict[str, Any], code: int, message: str, command: str) -> None:
    """The command's JSON; a failed outcome in the failure shape (``"ok": false``, ``error``) around it."""
    _print_json(outcome_document(data, exit_code=code, message=message, command=command))


def _not_ready(verdicts: dict[str, Verdict]) -> str:
    bad = [
        f"{n} ({v.state.value}{': ' + v.category.value if v.category else ''})"
        for n, v in verdicts.items()
        if v.state is not State.READY
    ]
    return "not ready: " + ", ".join(bad) if bad else "ready"


async def _up_and_render(
    fleet: Fleet,
    names: list[str] | None,
    *,
    timeout: float | None,
    stall: float | None,
    smoke: bool | None,
    wait: bool,
    as_json: bool,
    restart: str | None = None,
    grace: float = 15.0,
    keep_failed: bool = False,
) -> ExitCode:
    """Shared by `up` and `restart`: start, wait with live output, render the end table."""
    console = _console()
    async with fleet:
        outcomes: dict[str, StartOutcome]
        if restart is not None:  # the library's restart, its wait shown live below
            relaunch = await fleet.relaunch(restart, grace_s=grace)
            if relaunch.failure is not None:
                raise ServefleetError(relaunch.failure)
            if not as_json:
                console.print(f"{restart}: {relaunch.stopped.message}")
            outcomes = relaunch.outcomes
        else:
            outcomes = await fleet.start(names)
        engines = {n: fleet.spec.server(n).engine for n in outcomes}
        plain = as_json or not console.is_terminal
        warn = Console(stderr=True, highlight=False) if as_json else console
        for name, o in outcomes.items():
            for holder in o.gpu_holders:  # before it loads: a memory failure there would be why
                warn.print(f"warning: {name}: {holder}", style="yellow", markup=False, soft_wrap=True)
        if not wait:  # servers sharing a GPU still start in turn: return once all are launched
            await fleet.launch_queued(outcomes, timeout_s=timeout)
        if not as_json and (plain or not wait):
            for name, o in outcomes.items():
                where = f" (pgid {o.record.pgid}, log {o.record.log_path})" if o.record and o.verdict is None else ""
                console.print(f"{name}: {o.action.value}{where}{': ' + o.message if o.message else ''}", markup=False)
        if not wait:
            verdicts = {
                n: (o.verdict or Verdict(state=State.LAUNCHING, message=o.message)) for n, o in outcomes.items()
            }
            blocked = any(o.verdict is not None for o in outcomes.values())
            code = ExitCode.FAILED if blocked else ExitCode.OK
            if as_json:
                _print_outcome(up_json(fleet.name, outcomes, verdicts, engines), code, _not_ready(verdicts), "up")
            return code

        progress = UpProgress(
            Console(stderr=True, highlight=False) if as_json else console, outcomes, engines, plain=plain
        )
        kwargs: dict[str, Any] = {
            "timeout_s": timeout,
            "stall_s": stall,
            "smoke": smoke,
            "keep_failed": keep_failed,
            "grace_s": grace,
        }
        if plain:  # JSON mode: progress lines go to stderr, stdout carries only the document
            verdicts = await fleet.wait(outcomes, on_update=progress.on_update, **kwargs)
        else:
            with Live(progress, console=console, refresh_per_second=8, transient=True):
                verdicts = await fleet.wait(outcomes, on_update=progress.on_update, **kwargs)
        code = _exit_code(verdicts)
        if as_json:
            _print_outcome(
                up_json(fleet.name, outcomes, verdicts, engines),
                code,
                _not_ready(verdicts),
                "restart" if restart else "up",
            )
        else:
            console.print(up_table(outcomes, verdicts, engines))
            console.print(failure_notes(outcomes, verdicts))
        return code


def up(
    fleet_file: Annotated[
        Path | None, typer.Argument(metavar="FLEET.toml", help="Fleet file (default: ./servefleet.toml); or --fleet.")
    ] = None,
    fleet_opt: FleetOpt = None,
    only: Annotated[
        list[str] | None, typer.Option("--only", help="Only these servers (repeat, or comma-separated).")
    ] = None,
    timeout: TimeoutOpt = None,
    stall: StallOpt = None,
    no_smoke: NoSmokeOpt = False,
    no_wait: Annotated[
        bool,
        typer.Option(
            "--no-wait",
            help="Launch (or adopt) and return without waiting for readiness (servers sharing a GPU are still launched in turn).",
        ),
    ] = False,
    keep_failed: KeepFailedOpt = False,
    grace: GraceOpt = 15.0,
    as_json: JsonOpt = False,
) -> None:
    r"""Launch every server of a fleet detached (adopting ones already running) and wait until all are ready.

    Servers on one host that share a GPU (overlapping `gpus`; without `gpus`, any GPU of a host that has a GPU driver) start one after another in fleet-file order: the next once the previous one's memory has settled (its KV cache and CUDA graphs allocated: a log line each engine declares, else readiness), or it failed and was stopped. Servers on different GPUs start in parallel. `start_shared_gpu = "together"` in \[fleet] starts them all at once.

    A server found failed is stopped (its whole process group) unless --keep-failed.
    """  # noqa: E501 - typer help: one paragraph per line (a raw string, so no backslash continuation)
    if fleet_file is not None and fleet_opt is not None and fleet_file != fleet_opt:
        raise ConfigError(f"up: two fleet files given, {fleet_file} and --fleet {fleet_opt}: pass one")
    given = fleet_opt if fleet_opt is not None else fleet_file  # positional or --fleet, like every other command
    smoke = False if no_smoke else None
    code = run_coroutine(
        lambda: _up_and_render(
            open_fleet(given),
            _split_names(only),
            timeout=timeout,
            stall=stall,
            smoke=smoke,
            wait=not no_wait,
            as_json=as_json,
            grace=grace,
            keep_failed=keep_failed,
        )
    )
    raise typer.Exit(code)


def restart(
    name: Annotated[str, typer.Argument(help="Server to restart.")],
    fleet_file: FleetOpt = None,
    grace: GraceOpt = 15.0,
    timeout: TimeoutOpt = None,
    stall: StallOpt = None,
    no_smoke: NoSmokeOpt = False,
    keep_failed: KeepFailedOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Stop one server (if running) and start it again from the fleet file; wait until ready.

    If a server sharing its GPU is still starting, it starts once that one's memory has settled (as in `up`). Found failed, it is stopped unless --keep-failed.
    """
    smoke = False if no_smoke else None
    code = run_coroutine(
        lambda: _up_and_render(
            open_fleet(fleet_file),
            None,
            timeout=timeout,
            stall=stall,
            smoke=smoke,
            wait=True,
            as_json=as_json,
            restart=name,
            grace=grace,
            keep_failed=keep_failed,
        )
    )
    raise typer.Exit(code)


def down(
    names: Annotated[
        list[str] | None, typer.Argument(metavar="[NAME]...", help="Servers to stop (default: all).")
    ] = None,
    fleet_file: FleetOpt = None,
    grace: GraceOpt = 15.0,
    as_json: JsonOpt = False,
) -> None:
    """Stop servers: SIGTERM to the whole process group, SIGKILL after the grace period; confirm the port is free.

    The stop is the user's: a running `generate --fleet` re-queues its requests to them (no outage counted) and does not restart them (`up` or `restart` of a server lifts that); `down` names the jobs that were using them. To let their requests finish first: `servefleet drain`.
    """  # noqa: E501 - typer help: one paragraph per line

    async def go():
        async with open_fleet(fleet_file) as fleet:
            using = fleet.jobs.live()  # before: a job parks a stopped server within moments
            results = await fleet.down(_split_names(names), grace_s=grace, by_user="down")
            return results, [j for j in using if any(j.uses(n) for n in results)]

    results, jobs = run_coroutine(go)
    code = ExitCode.OK if all(r.ok for r in results.values()) else ExitCode.FAILED
    if as_json:
        failed = ", ".join(f"{n} ({r.message})" for n, r in results.items() if not r.ok)
        _print_outcome(
            {
                "servers": [
                    {
                        "name": n,
                        "was_running": r.was_running,
                        "signal": r.signal,
                        "port_free": r.port_free,
                        "port_holder_pid": r.port_holder_pid,
                        "ok": r.ok,
                        "message": r.message,
                    }
                    for n, r in results.items()
                ],
                "jobs": [
                    {"pid": j.pid, "host": j.host, "output": j.output, "servers": [n for n in results if j.uses(n)]}
                    for j in jobs
                ],
            },
            code,
            f"not stopped: {failed}",
            "down",
        )
    else:
        console = _console()
        console.print(down_table(results))
        for job in jobs:
            used = ", ".join(n for n in results if job.uses(n))
            console.print(
                f"in use by {job.describe()}: {used} -- it re-queues their requests and does not restart them",
                markup=False,
                soft_wrap=True,
            )
    raise typer.Exit(code)


def status(
    names: Annotated[
        list[str] | None, typer.Argument(metavar="[NAME]...", help="Servers to show (default: all).")
    ] = None,
    fleet_file: FleetOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Show each server: state (ready / loading / unresponsive / hung / failed / dead (exit code) / not launched), pid, uptime, capacity, log."""

    async def go():
        async with open_fleet(fleet_file) as fleet:
            statuses = await fleet.status(_split_names(names))
            marks = {st.name: m.describe() for st in statuses if (m := fleet.store.stop_mark(st.name)) is not None}
            return fleet.name, statuses, marks

    name, statuses, marks = run_coroutine(go)
    code = _status_exit_code(statuses)
    if as_json:
        bad = ", ".join(f"{s.name} ({s.state.value})" for s in statuses if s.state is not Liveness.READY)
        _print_outcome(
            {"fleet": name, "servers": [{**s.to_json(), "stopped_by_user": marks.get(s.name)} for s in statuses]},
            code,
            f"not ready: {bad}",
            "status",
        )
    else:
        console = _console()
        console.print(status_table(name, statuses))
        console.print(status_notes(statuses))
        for server, why in marks.items():  # a drained server may still be ready: say why no job uses it
            console.print(
                f"{server}: {why}; no generate job uses it until `servefleet up` or `restart` of it",
                markup=False,
                soft_wrap=True,
            )
    raise typer.Exit(code)


def logs(
    name: Annotated[str, typer.Argument(help="Server whose log to show.")],
    fleet_file: FleetOpt = None,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing new lines (Ctrl-C to stop).")] = False,
    lines: Annotated[int, typer.Option("-n", "--lines", help="How many of the last lines to show.")] = 50,
    as_json: JsonOpt = False,
) -> None:
    """Show the end of a server's log (all attempts, each after a `==== servefleet launch ... ====` line)."""

    def emit(line: str) -> None:
        if as_json:
            sys.stdout.write(json.dumps({"server": name, "line": line}) + "\n")
        else:
            sys.stdout.write(line + "\n")
        sys.stdout.flush()

    async def go() -> None:
        async with open_fleet(fleet_file) as fleet:
            try:
                path, tail, size = await fleet.tail(name, lines)
            except FileNotFoundError:
                _, path = await fleet.log_location(name)
                raise ConfigError(
                    f"{name}: no log yet at {path} (the server was never launched: `servefleet up`)"
                ) from None
            for line in tail:
                emit(line)
            if follow:
                async for line in fleet.follow(name, size):
                    emit(line)

    run_coroutine(go, quiet_interrupt=True)


def register(app: typer.Typer) -> None:
    app.command("up")(up)
    app.command("down")(down)
    app.command("status")(status)
    app.command("logs")(logs)
    app.command("restart")(restart)
