"""`servefleet sim ...`: run the simulated engine (the same options as ``python -m servefleet.sim``).

Thin: the arguments go, untouched, to the sim's own parser (:mod:`servefleet.sim.cli_args`), which is
generated from ``SimConfig`` -- one definition of the options for both entry points, ``--help``
included. ``--dry-run`` prints the configuration's theoretical throughput curve (a table, or JSON with
``--json``) instead of serving. Serving, the output is the chosen engine's own log format by design.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import typer

from servefleet.cli.failure import CliFailure, ErrorKind

if TYPE_CHECKING:
    from rich.table import Table

__all__ = ["register"]

_HELP = (
    "Run the simulated OpenAI-compatible engine: a real SGLang/vLLM start-up log, continuous batching "
    "(realistic timing by default: a throughput peak below max running, streaming capped by the API process; "
    "--timing knee for the old model), and fault injection. Options: `servefleet sim --help`."
)


def _table(report: dict) -> Table:
    from rich.table import Table

    cfg = report["config"]
    table = Table(
        title=f"sim ({cfg['style']}): prompt {report['prompt_tokens']} + output {report['output_tokens']} tokens per request"
    )
    for col in (
        "concurrency",
        "batch",
        "step ms",
        "TTFT s",
        "latency s",
        "tok/s per request",
        "tok/s total",
        "streaming tok/s",
    ):
        table.add_column(col, justify="right")

    def num(v: float | None, fmt: str) -> str:
        return "inf" if v is None else format(v, fmt)

    for s in report["curve"]:
        table.add_row(
            str(s["concurrency"]),
            str(s["batch"]),
            f"{s['step_ms']:.2f}",
            num(s["ttft_s"], ".3f"),
            num(s["request_latency_s"], ".3f"),
            num(s["per_request_tokens_per_s"], ",.1f"),
            num(s["output_tokens_per_s"], ",.1f"),
            num(s["streaming_output_tokens_per_s"], ",.1f"),
        )
    return table


def register(app: typer.Typer) -> None:
    @app.command(
        "sim",
        help=_HELP,
        add_help_option=False,
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True, "allow_interspersed_args": False},
    )
    def sim(ctx: typer.Context) -> None:
        # The simulator is a test double: it is imported here, by its own command, and nowhere else.
        from servefleet.sim.cli_args import parse_args

        try:
            config, flags = parse_args(ctx.args, help_prog="servefleet sim")
        except SystemExit as exc:  # argparse: --help (0), or bad options (2, its message already on stderr)
            if exc.code in (0, None):
                raise
            raise CliFailure(
                ErrorKind.USAGE,
                "the sim options were refused (argparse's message above)",
                hint="see `servefleet sim --help`",
            ) from None
        if flags.dry_run:
            from servefleet.sim.theory import dry_run_report

            report = dry_run_report(config)
            if flags.json:
                typer.echo(json.dumps(report, indent=2))
            else:
                from rich.console import Console

                Console().print(_table(report))
            return
        from servefleet.sim.startup import run

        raise typer.Exit(run(config))
