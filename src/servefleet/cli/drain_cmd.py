"""`servefleet drain NAME...`: running jobs stop sending to a server, finish its in-flight
requests, then it is stopped (or, with --keep, left running but unused). fleet/drain.py does it."""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer
from rich.console import Console

from servefleet.cli.common import FleetOpt, JsonOpt, open_fleet, run_coroutine
from servefleet.cli.exitcodes import ExitCode

SHORT = "Drain servers: running generate jobs send them nothing new and finish their requests; then each is stopped (--keep: left running, unused)."


def drain(
    names: Annotated[list[str], typer.Argument(metavar="NAME...", help="Servers to drain.")],
    fleet_file: FleetOpt = None,
    keep: Annotated[
        bool,
        typer.Option(
            "--keep",
            help="Leave the servers running once drained; no job sends to them until `servefleet up`/`restart` of them.",
        ),
    ] = False,
    timeout: Annotated[
        float, typer.Option("--timeout", min=0.0, help="Seconds to wait for the jobs' in-flight requests to finish.")
    ] = 600.0,
    grace: Annotated[float, typer.Option("--grace", help="Seconds between SIGTERM and SIGKILL.")] = 15.0,
    as_json: JsonOpt = False,
) -> None:
    """Drain servers (Slurm's `drain`): every `generate --fleet` job using one stops sending to it, lets its in-flight requests finish and parks it, without counting an outage or restarting it; then the server is stopped (SIGTERM to its process group, as `down`).

    With --keep it stays running, marked drained: no job sends to it until `servefleet up` or `restart` of that server. A job that has not finished its requests on it within --timeout leaves it running and marked (still no new requests): exit 2; run `drain` again to wait more, or `down` to stop it now (its requests are then re-queued).
    """  # noqa: E501 - typer help: one paragraph per line
    from servefleet.fleet.drain import drain as drain_servers

    err = Console(stderr=True, highlight=False)

    def waiting(using: dict[str, list[str]]) -> None:
        for name, jobs in using.items():
            err.print(
                f"{name}: waiting for {', '.join(jobs)} to finish its requests on it", markup=False, soft_wrap=True
            )

    async def go():
        async with open_fleet(fleet_file) as fleet:
            return await drain_servers(
                fleet, list(dict.fromkeys(names)), keep=keep, timeout_s=timeout, grace_s=grace, on_wait=waiting
            )

    results = run_coroutine(go)
    rows = []
    for name, r in results.items():
        if r.still_using:
            outcome = f"still in use by {', '.join(r.still_using)} after {timeout:g}s: left running, drained (no new requests)"
        elif r.stopped is None:
            outcome = "drained; left running (--keep): no job sends to it until `servefleet up` of it"
        else:
            outcome = f"drained; {r.stopped.message}"
        rows.append(
            {
                "name": name,
                "ok": r.ok,
                "jobs": r.jobs,
                "still_using": r.still_using,
                "stopped": r.stopped is not None and r.stopped.ok,
                "message": outcome,
            }
        )
    if as_json:
        sys.stdout.write(json.dumps({"servers": rows}, indent=2) + "\n")
    else:
        out = Console(highlight=False)
        for row in rows:
            used = f" (was used by {', '.join(row['jobs'])})" if row["jobs"] else ""
            out.print(f"{row['name']}: {row['message']}{used}", markup=False, soft_wrap=True)
    if any(r.still_using for r in results.values()):
        raise typer.Exit(ExitCode.TIMEOUT)
    raise typer.Exit(ExitCode.OK if all(r.ok for r in results.values()) else ExitCode.FAILED)


def register(app: typer.Typer) -> None:
    app.command("drain", short_help=SHORT)(drain)
