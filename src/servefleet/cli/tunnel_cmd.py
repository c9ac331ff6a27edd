"""`servefleet tunnel NAME`: expose a (remote) fleet server on a local port until interrupted."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from typing import Annotated

import typer
from rich.console import Console

from servefleet.cli.fleet_cmds import FleetOpt, JsonOpt, _run
from servefleet.fleet import Fleet
from servefleet.fleet.tunnel import keep_open, open_tunnel


def tunnel(
    name: Annotated[str, typer.Argument(help="The server to expose.")],
    local_port: Annotated[int | None, typer.Option("--local-port", help="Local port to listen on (default: a free one).")] = None,
    fleet_file: FleetOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Forward a local port to a server of the fleet (over the host's SSH connection) and keep it
    open until Ctrl-C. Prints the URL first, so scripts can read one line and go."""

    async def go() -> None:
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        if task is not None:  # SIGTERM closes the forward and the SSH master cleanly too
            loop.add_signal_handler(signal.SIGTERM, task.cancel)
        async with Fleet.discover(fleet_file) as fleet:
            t = await open_tunnel(fleet, name, local_port)
            if as_json:
                sys.stdout.write(json.dumps(t.to_json()) + "\n")
            else:
                Console(highlight=False).print(f"{t.name}: {t.url} -> {t.remote} on {t.host}  (Ctrl-C to close)", soft_wrap=True)
            sys.stdout.flush()
            try:
                await keep_open(fleet, t)
            except asyncio.CancelledError:
                pass

    try:
        _run(go)
    except typer.Exit as exc:
        if exc.exit_code == 130:  # Ctrl-C is how a tunnel ends
            raise typer.Exit(0) from None
        raise


def register(app: typer.Typer) -> None:
    app.command("tunnel", short_help="Forward a local port to a fleet server over its host's SSH connection, until Ctrl-C.")(tunnel)
