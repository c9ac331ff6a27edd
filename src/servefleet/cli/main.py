"""The `servefleet` command: a thin layer that parses arguments, calls one function of the
layers below and renders the result. Each command group lives in its own module with a
``register(app)`` function."""

from __future__ import annotations

import importlib

import typer

app = typer.Typer(
    name="servefleet",
    help="Launch, verify, benchmark and drive fleets of LLM inference servers (SGLang, vLLM, llama.cpp, transformers).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# Order here is the order in --help.
_COMMAND_MODULES = (
    "servefleet.cli.fleet_cmds",  # up, down, status, logs, restart
    "servefleet.cli.tunnel_cmd",  # tunnel
    "servefleet.cli.verify_cmds",  # wait, diagnose
    "servefleet.cli.bench_cmds",  # bench, compare
    "servefleet.cli.generate_cmd",  # generate
    "servefleet.cli.progress_cmd",  # progress
    "servefleet.cli.report_cmd",  # report
    "servefleet.cli.plan_cmds",  # capacity, plan
    "servefleet.cli.sim_cmd",  # sim
    "servefleet.cli.model_cmd",  # model tiny
)

for _name in _COMMAND_MODULES:
    importlib.import_module(_name).register(app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
