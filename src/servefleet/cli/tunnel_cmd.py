"""`servefleet tunnel NAME`: expose a (remote) fleet server on a local port until interrupted."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from typing import Annotated

import typer
from rich.console import Console

from servefleet.cli.common import FleetOpt, JsonOpt, run_coroutine
from servefleet.fleet import Fleet
from servefleet.fleet.tunnel import keep_open, open_tunnel
from servefleet.stopping import until_stopped


def tunnel(
    name: Annotated[str, typer.Argument(help="The server to expose.")],
    local_port: Annotated[
        int | None, typer.Option("--local-port", help="Local port to listen on (default: a free one).")
    ] = None,
    fleet_file: FleetOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Forward a local port to a server of the fleet (over the host's SSH connection) and keep it
    open until Ctrl-C. Prints the URL first, so scripts can read one line and go."""

    async def go() -> None:
        # Ctrl-C and SIGTERM set an event rather than cancel the task: the forward and the SSH
        # master are then closed by ordinary code, within a bound, whatever was running.
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        fleet = Fleet.discover(fleet_file)
        try:
            stopped, t = await until_stopped(open_tunnel(fleet, name, local_port), stop)
            if stopped or t is None:
                return
            if as_json:
                sys.stdout.write(json.dumps(t.to_json()) + "\n")
            else:
                Console(highlight=False).print(
                    f"{t.name}: {t.url} -> {t.remote} on {t.host}  (Ctrl-C to close)", soft_wrap=True
                )
            sys.stdout.flush()
            await until_stopped(keep_open(fleet, t), stop)
        finally:
            try:
                await asyncio.wait_for(fleet.close(), CLOSE_TIMEOUT_S)
            except TimeoutError:
                Console(stderr=True).print(
                    f"closing the SSH connection took over {CLOSE_TIMEOUT_S:.0f}s; left to ssh's own timeouts"
                )

    run_coroutine(go)


CLOSE_TIMEOUT_S = 20.0  # close() cancels forwards and exits masters, 10 s bound per ssh -O call


def register(app: typer.Typer) -> None:
    app.command(
        "tunnel", short_help="Forward a local port to a fleet server over its host's SSH connection, until Ctrl-C."
    )(tunnel)
