"""What the commands that drive a fleet share (`up`, `down`, `status`, `logs`, `restart`, `tunnel`):
the ``--fleet`` and ``--json`` options, and running one coroutine of the library with its errors
turned into a message and a stable exit code (``exitcodes.py``)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, TypeVar

import typer
from rich.console import Console

from servefleet.cli.exitcodes import ExitCode
from servefleet.errors import ConfigError, HostUnreachable, ServefleetError

__all__ = ["FleetOpt", "JsonOpt", "print_error", "run_coroutine"]

T = TypeVar("T")

FleetOpt = Annotated[
    Path | None,
    typer.Option("--fleet", help="Fleet file (default: ./servefleet.toml, or the only fleet under ./.servefleet)."),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")]


def print_error(message: str) -> None:
    Console(stderr=True, highlight=False).print(f"[bold red]error:[/] {message}", soft_wrap=True)


def run_coroutine(make: Callable[[], Awaitable[T]], *, quiet_interrupt: bool = False) -> T:
    """Run one coroutine; translate servefleet errors into messages and stable exit codes."""
    try:
        return asyncio.run(make())
    except ConfigError as exc:
        print_error(str(exc))
        raise typer.Exit(ExitCode.USAGE) from None
    except HostUnreachable as exc:
        print_error(str(exc))
        raise typer.Exit(ExitCode.UNREACHABLE) from None
    except ServefleetError as exc:
        print_error(str(exc))
        raise typer.Exit(ExitCode.FAILED) from None
    except KeyboardInterrupt:
        if quiet_interrupt:  # `logs -f`: Ctrl-C is how it ends
            raise typer.Exit(ExitCode.OK) from None
        Console(stderr=True).print("interrupted; launched servers keep running (`servefleet status`, `servefleet down`)")
        raise typer.Exit(ExitCode.INTERRUPTED) from None
