"""`servefleet wait` and `servefleet diagnose`: the verification loop from the command line.

Thin: parse, call ``wait_for_server`` / ``diagnose_file``, render. ``render_verdict`` is shared with
the fleet commands, which show the same failure details under their tables.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import typer

from servefleet.catalog import State
from servefleet.cli.exitcodes import ExitCode
from servefleet.cli.failure import CliFailure, ErrorKind
from servefleet.engines.registry import engine_names, get_engine
from servefleet.errors import EngineError

if TYPE_CHECKING:  # imported where used: `diagnose --json` loads neither rich nor aiohttp
    from rich.console import Console
    from rich.text import Text

    from servefleet.capacity import Capacity
    from servefleet.engines.base import EngineProfile
    from servefleet.verify.verdict import Verdict

__all__ = ["register", "render_verdict", "exit_code_for", "capacity_text"]

_STYLE = {
    State.READY: "bold green",
    State.FAILED: "bold red",
    State.STALLED: "bold yellow",
    State.LOADING: "cyan",
    State.LAUNCHING: "cyan",
    State.UNKNOWN: "bold yellow",
}


def exit_code_for(verdict: Verdict) -> ExitCode:
    """0 ready (or, for a log, still loading), 1 failed, 2 stalled or timed out, 3 not a server log."""
    if verdict.state is State.UNKNOWN:
        return ExitCode.USAGE
    if verdict.state is State.FAILED:
        return ExitCode.FAILED
    if verdict.state is State.STALLED:
        return ExitCode.TIMEOUT
    return ExitCode.OK


def capacity_text(capacity: Capacity) -> str:
    """``kv_cache_tokens 262,144 · max_running_requests 64 · ...`` (empty when nothing is known)."""
    parts = []
    for key, value in capacity.model_dump(exclude_defaults=True, exclude={"source", "extra"}).items():
        if isinstance(value, dict):
            value = ", ".join(f"{k}={v}" for k, v in value.items())
        elif isinstance(value, int):
            value = f"{value:,}"
        parts.append(f"{key} {value}")
    return " · ".join(parts)


def render_verdict(verdict: Verdict, console: Console, *, source: str | None = None) -> None:
    """The final verdict: state and category, evidence with its line number, excerpt, hint, capacity."""
    from rich.console import Group
    from rich.text import Text

    head = Text()
    head.append(verdict.state.value, style=_STYLE.get(verdict.state, ""))
    if verdict.category is not None:
        head.append(f": {verdict.category.value}", style="bold")
        if verdict.phase:  # a memory failure: where in start-up
            head.append(f" {verdict.phase}")
    if verdict.engine:
        head.append(f"  ({verdict.engine})", style="dim")
    if verdict.elapsed_s is not None:
        head.append(f"  after {verdict.elapsed_s:.2f}s")
    if verdict.exit_code is not None:
        head.append(f"  exit code {verdict.exit_code}")
    if source:
        head.append(f"  {source}", style="dim")
    lines: list[Text] = [head]
    if verdict.message:
        lines.append(Text(verdict.message))
    if verdict.evidence is not None:
        ev = Text(f"evidence, line {verdict.evidence.line_no}: ", style="bold")
        ev.append(verdict.evidence.text, style="red" if verdict.state is State.FAILED else "")
        lines.append(ev)
    if verdict.excerpt:
        start = verdict.excerpt_start or (verdict.evidence.line_no if verdict.evidence else 1)
        width = len(str(start + len(verdict.excerpt)))
        for i, text in enumerate(verdict.excerpt):
            no = start + i
            mark = ">" if verdict.evidence is not None and no == verdict.evidence.line_no else " "
            row = Text(f"  {mark} {no:>{width}} │ ", style="dim")
            row.append(text, style="bold" if mark == ">" else "")
            lines.append(row)
    if verdict.hint and verdict.state is not State.READY:
        lines.append(Text("hint: ", style="bold").append(verdict.hint))
    if verdict.skipped:
        lines.append(Text(verdict.skipped, style="dim"))
    cap = capacity_text(verdict.capacity)
    if cap:
        lines.append(Text("capacity: ", style="bold").append(cap))
    elif verdict.progress and verdict.state is not State.READY:
        lines.append(Text(f"last progress: {verdict.progress}"))
    console.print(Group(*lines), soft_wrap=False, overflow="fold")


class _LiveLine:
    """The one-line live status; elapsed time ticks at each refresh, not at each update."""

    def __init__(self, started: float) -> None:
        self.started = started
        self.verdict: Verdict | None = None

    def __rich__(self) -> Text:
        from rich.text import Text

        v = self.verdict
        text = Text()
        state = v.state if v is not None else State.LAUNCHING
        text.append(f"{state.value:<9}", style=_STYLE.get(state, ""))
        text.append(f" {time.monotonic() - self.started:6.1f}s")
        if v is not None and v.progress:
            text.append(f"  {v.progress}", style="bold")
        if v is not None and v.message:
            text.append(f"  {v.message}", style="yellow")
        elif v is not None and v.last_line:
            text.append(f"  │ {v.last_line}", style="dim")
        text.no_wrap = True
        text.overflow = "ellipsis"
        return text


def _rich_console(**kwargs: Any) -> Console:
    from rich.console import Console

    return Console(**kwargs)


def _fail_usage(message: str, json_out: bool, kind: ErrorKind = ErrorKind.USAGE) -> None:
    """Raise the failure; the root group prints it (and, with --json, the JSON error document)."""
    raise CliFailure(kind, message)


def _engine_or_none(name: str, json_out: bool) -> EngineProfile | None:
    if name.lower() == "auto":
        return None
    try:
        return get_engine(name)
    except EngineError as exc:
        _fail_usage(str(exc), json_out)
        raise AssertionError("unreachable") from exc


def register(app: typer.Typer) -> None:
    engines_help = "auto|" + "|".join(engine_names())

    @app.command("diagnose")
    def diagnose(
        logfile: Path = typer.Argument(..., help="a finished or partial log of any server"),
        engine: str = typer.Option("auto", "--engine", help=f"engine whose signatures apply: {engines_help}"),
        json_out: bool = typer.Option(False, "--json", help="print the verdict as JSON"),
    ) -> None:
        """Classify a server log: ready, still loading, or failed -- with the root cause line.

        A log of any size: beyond 4 MB only its start-up, its end and the windows around its first
        fatal block are read (the rest is scanned for error and ready lines at disk speed); the
        verdict says what was read. Exit 0 ready or loading, 1 failed, 3 when the file cannot be read or is not
        a recognised server log (state "unknown": binary, a document, or no line any engine prints)."""
        from servefleet.verify.bounded import diagnose_local_file

        profile = _engine_or_none(engine, json_out)
        if not logfile.exists():
            _fail_usage(f"log file {logfile} does not exist (is the path right?)", json_out, ErrorKind.CONFIG)
        if logfile.is_dir():
            _fail_usage(f"{logfile} is a folder, not a log file", json_out, ErrorKind.CONFIG)
        try:  # bounded: a big log is read at its start, its end and around its first fatal block
            verdict = diagnose_local_file(logfile, profile)
        except OSError as exc:
            _fail_usage(f"cannot read {logfile}: {exc.strerror or exc}", json_out, ErrorKind.CONFIG)
            raise
        if json_out:
            print(json.dumps(verdict.to_json()))
        else:
            from rich.console import Console

            render_verdict(verdict.model_copy(update={"elapsed_s": None}), Console(), source=str(logfile))
        raise typer.Exit(int(exit_code_for(verdict)))

    @app.command("wait")
    def wait(
        url: str = typer.Option(..., "--url", help="base URL of the server, e.g. http://127.0.0.1:30000"),
        log: Path | None = typer.Option(None, "--log", help="the server's log file, followed as it grows"),
        pid: int | None = typer.Option(
            None,
            "--pid",
            help="the server's pid: its death is the server's death (even when its group, e.g. a shell's, lives on); its process group "
            "must hold the port",
        ),
        engine: str = typer.Option("auto", "--engine", help=f"{engines_help} (auto: detect from the log)"),
        model: str | None = typer.Option(
            None, "--model", help="served model name /v1/models must list (identity without --pid)"
        ),
        timeout: float = typer.Option(1800.0, "--timeout", min=0.0, help="overall cap in seconds"),
        stall: float = typer.Option(
            300.0, "--stall", min=0.0, help="fail when neither the log nor the probe moved for this long"
        ),
        no_smoke: bool = typer.Option(
            False, "--no-smoke", help="do not send the one-token smoke request before calling it ready"
        ),
        json_out: bool = typer.Option(False, "--json", help="print the verdict as JSON"),
    ) -> None:
        """Wait for a server started by anything: ready (0), failed (1), or stalled / timed out (2)."""
        from servefleet.verify.machine import message_shape
        from servefleet.verify.waiter import WaitTarget, wait_for_server

        profile = _engine_or_none(engine, json_out)
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            _fail_usage(f"--url {url!r} is not an http(s) URL such as http://127.0.0.1:30000", json_out)
        pgid = None
        if pid is not None:
            try:
                pgid = os.getpgid(pid)
            except ProcessLookupError:
                _fail_usage(f"no process with pid {pid} (has it exited already?)", json_out)
        target = WaitTarget(
            base_url=url, engine=profile, log_path=str(log) if log else None, pgid=pgid, pid=pid, served_model=model
        )
        err = None if json_out else _rich_console(stderr=True)  # --json: rich is never imported (start-up)
        live_line = _LiveLine(time.monotonic())
        use_live = err is not None and err.is_terminal
        last_shape: list[object] = [None]

        def on_update(verdict: Verdict) -> None:
            live_line.verdict = verdict
            if use_live or json_out:
                return
            shape = (verdict.state, verdict.progress, message_shape(verdict.message))
            if shape != last_shape[0] and verdict.state in (State.LAUNCHING, State.LOADING):
                last_shape[0] = shape
                words = [f"[{time.monotonic() - live_line.started:7.2f}s]", verdict.state.value]
                words += [w for w in (verdict.progress, verdict.message) if w]
                print(" · ".join(words), file=sys.stderr, flush=True)

        import asyncio

        async def run() -> Verdict:
            return await wait_for_server(
                target, timeout_s=timeout, stall_s=stall, smoke=not no_smoke, on_update=on_update
            )

        try:
            if use_live:
                from rich.live import Live

                with Live(live_line, console=err, refresh_per_second=8, transient=True):
                    verdict = asyncio.run(run())
            else:
                verdict = asyncio.run(run())
        except KeyboardInterrupt:
            raise typer.Exit(int(ExitCode.INTERRUPTED)) from None
        if json_out:
            print(json.dumps(verdict.to_json()))
        else:
            render_verdict(verdict, _rich_console(), source=url)
        raise typer.Exit(int(exit_code_for(verdict)))
