"""What the commands that drive a fleet share (`up`, `down`, `status`, `logs`, `restart`, `tunnel`):
the ``--fleet`` and ``--json`` options, and running one coroutine of the library with its errors
left to the root group (``cli/main.py``), which gives each its stable exit code."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from rich.console import Console

from servefleet.cli.exitcodes import ExitCode

__all__ = ["FleetOpt", "JsonOpt", "open_fleet", "run_coroutine"]

if TYPE_CHECKING:
    from servefleet.fleet import Fleet

T = TypeVar("T")

FleetOpt = Annotated[
    Path | None,
    typer.Option("--fleet", help="Fleet file (default: ./servefleet.toml, or the only fleet under ./.servefleet)."),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")]


def run_coroutine(make: Callable[[], Coroutine[Any, Any, T]], *, quiet_interrupt: bool = False) -> T:
    """Run one coroutine. A servefleet error goes up to the root group (cli/main.py), which prints it
    and exits with its stable code (ConfigError 3, HostUnreachable 4, the others 1)."""
    try:
        return asyncio.run(make())
    except KeyboardInterrupt:
        if quiet_interrupt:  # `logs -f`: Ctrl-C is how it ends
            raise typer.Exit(ExitCode.OK) from None
        Console(stderr=True).print(
            "interrupted; launched servers keep running (`servefleet status`, `servefleet down`)"
        )
        raise typer.Exit(ExitCode.INTERRUPTED) from None


def open_fleet(given: Path | None) -> Fleet:
    """The fleet of ``--fleet`` (or the one found here), with servefleet's DEBUG log also written to
    its state folder (``servefleet.log``), so a command that went wrong leaves its trace there."""
    from servefleet import logsetup
    from servefleet.fleet import Fleet

    fleet = Fleet.discover(given)
    logsetup.add_state_file(fleet.spec.state_dir)
    return fleet
