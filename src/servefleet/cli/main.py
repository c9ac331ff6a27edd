"""The `servefleet` command: a thin layer that parses arguments, calls one function of the
layers below and renders the result.

Start-up is part of the interface (scripts call `diagnose` and `wait` in loops), so nothing is
imported before it is needed: :data:`COMMANDS` is a plain table of name, module and one-line help;
``servefleet --help`` lists it without importing any command module, and a command's module
(with its ``register(app)``) is imported only when that command runs or its own ``--help`` is
asked for. Heavy libraries (aiohttp, psutil, the fleet layer, the simulator) are imported inside
the command functions that use them.

The contract of every command is kept here, once: usage errors exit 3 (click's own is 2, which
servefleet gives to "timeout or stalled"), and any failure becomes ``error: ...`` on stderr plus,
with ``--json``, the one JSON error document of :mod:`servefleet.cli.failure` on stdout.
"""

from __future__ import annotations

import importlib
from typing import Any, NamedTuple

import typer
from typer import _click as click  # typer's vendored click: its exceptions are the ones raised
from typer.core import TyperCommand, TyperGroup

from servefleet.cli.exitcodes import ExitCode
from servefleet.cli.failure import CliFailure, ErrorKind, failure_from_exception, report_failure

__all__ = ["app", "main", "COMMANDS", "CommandRow"]


class CommandRow(NamedTuple):
    module: str  # imported when the command runs; it has ``register(app)``
    short_help: str  # the line in `servefleet --help` (the module is not imported to show it)
    exits: str  # the command's exit codes, shown at the end of its --help (README: "Exit codes and errors")


_UP_EXITS = "0 all ready, 1 a server failed, 2 stalled or timed out, 3 bad fleet file or arguments, 4 host unreachable"

# Order here is the order in --help. A new command: one row (its module, its line in --help, its exit codes),
# and a module whose register(app) adds a command of that name.
COMMANDS: dict[str, CommandRow] = {
    "up": CommandRow(
        "servefleet.cli.fleet_cmds",
        "Launch every server of a fleet detached (adopting ones already running) and wait until all are ready.",
        _UP_EXITS,
    ),
    "down": CommandRow(
        "servefleet.cli.fleet_cmds",
        "Stop servers: SIGTERM to the whole process group, SIGKILL after the grace period; confirm the port is free.",
        "0 all stopped, 1 a server could not be stopped or its port is still held, 3 bad fleet file or arguments, 4 host unreachable",
    ),
    "status": CommandRow(
        "servefleet.cli.fleet_cmds",
        "Show each server: state (ready / loading / unresponsive / hung / failed / dead (exit code) / not launched), pid, uptime, capacity, log.",
        "0 every server shown is ready, 1 any is down (dead, not launched, stale) or failed, 2 the rest ready but some still loading "
        "unresponsive or hung, 3 bad fleet file or arguments, 4 host unreachable",
    ),
    "drain": CommandRow(
        "servefleet.cli.drain_cmd",
        "Drain servers: running generate jobs send them nothing new and finish their requests; "
        "then each is stopped (--keep: left running, unused).",
        "0 drained (and stopped, or kept), 1 a server could not be stopped, 2 a job still had requests on it at --timeout "
        "(left running, drained), 3 bad fleet file or arguments, 4 host unreachable",
    ),
    "logs": CommandRow(
        "servefleet.cli.fleet_cmds",
        "Show the end of a server's log (all attempts, each after a `==== servefleet launch ... ====` line).",
        "0 shown (or -f ended by Ctrl-C), 3 no such server, no log yet, or bad arguments, 4 host unreachable",
    ),
    "restart": CommandRow(
        "servefleet.cli.fleet_cmds",
        "Stop one server (if running) and start it again from the fleet file; wait until ready.",
        _UP_EXITS,
    ),
    "tunnel": CommandRow(
        "servefleet.cli.tunnel_cmd",
        "Forward a local port to a fleet server over its host's SSH connection, until Ctrl-C.",
        "0 closed by Ctrl-C, 1 the forward failed, 3 bad fleet file or arguments, 4 host unreachable",
    ),
    "diagnose": CommandRow(
        "servefleet.cli.verify_cmds",
        "Classify a server log: ready, still loading, or failed -- with the root cause line.",
        "0 ready or still loading, 1 failed, 3 no such file, unreadable, or bad arguments",
    ),
    "wait": CommandRow(
        "servefleet.cli.verify_cmds",
        "Wait for a server started by anything: ready (0), failed (1), or stalled / timed out (2).",
        "0 ready, 1 failed, 2 stalled or timed out, 3 bad arguments, 130 interrupted",
    ),
    "bench": CommandRow(
        "servefleet.cli.bench_cmds",
        "Measure throughput and latency of one or more servers across concurrency levels or request rates.",
        "0 measured, 1 a point had no successful request or the server refused the benchmark, 3 bad arguments or fleet, "
        "4 server unreachable",
    ),
    "compare": CommandRow(
        "servefleet.cli.bench_cmds",
        "Configurations side by side: throughput at each concurrency, best points, ratios, and plots.",
        "0 compared, 3 a file is missing or not a bench RUN.json, or bad arguments",
    ),
    "generate": CommandRow(
        "servefleet.cli.generate_cmd",
        "Send every prompt of --input to the ready servers and write the answers as sharded Parquet/JSONL; resumable, exactly once.",
        "0 complete, 1 incomplete (prompts in failures.jsonl, or input records in rejects.jsonl) or a commit failed (the disk "
        "is full), 2 stalled (every server given up: --give-up-after), 3 bad arguments, input or fleet, 4 host unreachable, "
        "130 interrupted by Ctrl-C, SIGTERM or SIGHUP (what was answered is committed; run it again to resume)",
    ),
    "serve": CommandRow(
        "servefleet.cli.serve_cmd",
        "Serve the fleet's ready servers as one OpenAI-compatible URL (least-loaded, back-pressure, restarts).",
        "0 stopped by SIGTERM or Ctrl-C (requests in flight finished within --grace), 3 bad arguments or fleet, no server ready, "
        "a non-loopback --host without --api-key, or the port taken, 4 a --url unreachable",
    ),
    "progress": CommandRow(
        "servefleet.cli.progress_cmd",
        "Done/remaining, rate, ETA and per-server state of a generate job, from its destination (any terminal).",
        "0 shown (--watch: the job ended complete), 1 --watch: it ended incomplete, 2 --watch: stalled, "
        "3 DEST holds no job or bad arguments, 130 interrupted",
    ),
    "report": CommandRow(
        "servefleet.cli.report_cmd",
        "One self-contained HTML report of a generate job (DEST) or of bench runs (RUN.json ...).",
        "0 written, 3 nothing to report at the source, or bad arguments",
    ),
    "capacity": CommandRow(
        "servefleet.cli.plan_cmds",
        "Predict KV-cache tokens and max running requests from a model's config.json; with --url, compare with the engine.",
        "0 predicted, 3 bad arguments or model config, 4 --url unreachable",
    ),
    "plan": CommandRow(
        "servefleet.cli.plan_cmds",
        "Which measured configuration, at what concurrency, finishes the job soonest on G GPUs; --check compares with a run.",
        "0 planned (--check: the prediction was within its tolerance), 1 --check: the prediction missed its tolerance, "
        "3 bad arguments, runs or destination",
    ),
    "tune": CommandRow(
        "servefleet.cli.tune_cmd",
        "Measure engine configurations on the job's own prompts and rank them by predicted makespan; --then-generate runs the job.",
        "0 a winner (--then-generate: the job complete and the plan within its tolerance), 1 no candidate measured, the job "
        "incomplete or the plan off, 3 bad space file, fleet, input or arguments (nothing launched)",
    ),
    "sim": CommandRow(
        "servefleet.cli.sim_cmd",
        "Run the simulated OpenAI-compatible engine (real SGLang/vLLM start-up logs, continuous batching, fault injection). Options: `servefleet sim --help`.",
        "0 stopped, 3 bad options, otherwise the simulated engine's own exit code (a simulated failure)",
    ),
    "model": CommandRow(
        "servefleet.cli.model_cmd",
        "Build models locally for tests, demos and benchmarks (random weights, a tokenizer trained here).",
        "0 built, 3 bad arguments or a folder that holds something else",
    ),
}

_JSON_ERRORS = (
    'With --json, an error prints {"ok": false, "error": {"kind": ..., "message": ..., "hint": ..., "exit_code": ...}} '
    "on stdout (README: Exit codes and errors)."
)

_LISTING = "servefleet.listing"  # ctx.meta key: the group's --help is being drawn
_JSON = "servefleet.json"  # ctx.meta key: --json was on the command line


def _wants_json(args: list[str]) -> bool:
    """Whether --json was given; read from the raw arguments, so that it holds for errors raised
    while parsing them too (before any command has seen its own --json)."""
    head = args[: args.index("--")] if "--" in args else args
    return "--json" in head


class LazyGroup(TyperGroup):
    """The root group: commands from :data:`COMMANDS`, their modules imported on first use;
    usage errors exit 3, and every failure is reported through :func:`report_failure`."""

    _loaded: dict[str, Any] = {}  # module name -> {command name: click command}

    def list_commands(self, ctx: Any) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        row = COMMANDS.get(cmd_name)
        if row is None:
            return None
        if ctx.meta.get(_LISTING):  # the command list: a stub that carries the short help only
            return TyperCommand(cmd_name, short_help=row.short_help, rich_markup_mode=self.rich_markup_mode)
        return _load(row.module, self.rich_markup_mode)[cmd_name]

    def format_help(self, ctx: Any, formatter: Any) -> None:
        ctx.meta[_LISTING] = True
        try:
            super().format_help(ctx, formatter)
        finally:
            ctx.meta.pop(_LISTING, None)

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        try:
            return self._click_resolve_command(ctx, args)
        except click.exceptions.UsageError as exc:  # "No such command": suggest from the table
            from difflib import get_close_matches

            matches = get_close_matches(args[0], list(COMMANDS)) if args else []
            if matches:
                exc.message = f"{exc.message.rstrip('.')}. Did you mean {', '.join(repr(m) for m in matches)}?"
            raise

    def make_context(self, info_name: str | None, args: list[str], parent: Any = None, **extra: Any) -> Any:
        as_json = _wants_json(list(args))
        try:
            ctx = super().make_context(info_name, args, parent=parent, **extra)
        except click.exceptions.UsageError as exc:  # `servefleet --bogus`, or no arguments at all
            _usage_error(exc, as_json, command=None)
            raise
        ctx.meta[_JSON] = as_json
        return ctx

    def invoke(self, ctx: Any) -> Any:
        as_json = bool(ctx.meta.get(_JSON))
        command = ctx._protected_args[0] if ctx._protected_args else None  # typer's own name for it
        command = command if command in COMMANDS else None
        try:
            return super().invoke(ctx)
        except (typer.Exit, typer.Abort):
            raise
        except click.exceptions.UsageError as exc:
            _usage_error(exc, as_json, command)
            raise  # click prints its usage block and the message on stderr, and exits exc.exit_code
        except BaseException as exc:  # every failure of every command is reported here, once
            failure = failure_from_exception(exc)
            if failure is None:
                if as_json and isinstance(exc, Exception):
                    report_failure(
                        CliFailure(
                            ErrorKind.INTERNAL,
                            f"{type(exc).__name__}: {exc}",
                            hint="a bug in servefleet: please report it with the traceback below",
                        ),
                        as_json=True,
                        command=command,
                        stderr_text=False,
                    )
                raise  # a bug (or SystemExit): the traceback is the report
            report_failure(failure, as_json=as_json, command=command)
            raise typer.Exit(failure.exit_code) from None


def _usage_error(exc: Any, as_json: bool, command: str | None) -> None:
    exc.exit_code = int(ExitCode.USAGE)
    if as_json and not isinstance(exc, click.exceptions.NoArgsIsHelpError):
        path = exc.ctx.command_path if exc.ctx is not None else "servefleet"
        failure = CliFailure(ErrorKind.USAGE, exc.format_message(), hint=f"see `{path} --help`")
        report_failure(failure, as_json=True, command=command, stderr_text=False)


def _load(module_name: str, rich_markup_mode: Any) -> dict[str, Any]:
    """Import a command module and build its click commands (once per process)."""
    commands = LazyGroup._loaded.get(module_name)
    if commands is None:
        holder = typer.Typer(rich_markup_mode=rich_markup_mode)
        importlib.import_module(module_name).register(holder)
        group = typer.main.get_group(holder)
        commands = LazyGroup._loaded[module_name] = dict(group.commands)
        for name, command in commands.items():
            row = COMMANDS.get(name)
            if row is not None:
                for shown in (command, *getattr(command, "commands", {}).values()):  # a group's subcommands too
                    shown.epilog = f"Exit codes: {row.exits}. {_JSON_ERRORS}"
    return commands


app = typer.Typer(
    name="servefleet",
    cls=LazyGroup,
    help="Launch, verify, benchmark and drive fleets of LLM inference servers (SGLang, vLLM, llama.cpp, transformers).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _print_version(value: bool) -> None:
    if value:
        from servefleet import __version__

        typer.echo(f"servefleet {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", help="Print servefleet's version and exit.", is_eager=True, callback=_print_version
    ),
    verbose: bool = typer.Option(
        False,
        "--verbose",
        "-v",
        help="Log what servefleet does (DEBUG) on stderr; SERVEFLEET_LOG=debug|info|warning does the same for any command.",
    ),
) -> None:
    # A callback also makes typer build a group (LazyGroup) although no command is registered up front.
    from servefleet import logsetup

    try:
        logsetup.configure(verbose=verbose)
    except ValueError as exc:  # a bad SERVEFLEET_LOG
        raise CliFailure(ErrorKind.USAGE, str(exc)) from None


def main() -> None:
    app()


if __name__ == "__main__":
    main()
