"""`servefleet sim ...`: run the simulated engine (the same options as ``python -m servefleet.sim``).

Thin: the arguments go, untouched, to the sim's own parser (:mod:`servefleet.sim.cli_args`), which is
generated from ``SimConfig`` -- one definition of the options for both entry points, ``--help``
included. ``--dry-run`` prints the configuration's theoretical throughput curve (a table, or JSON with
``--json``) instead of serving. Serving, the output is the chosen engine's own log format by design.
"""

from __future__ import annotations

import json

import typer
from rich.console import Console
from rich.table import Table

from servefleet.sim.cli_args import parse_args
from servefleet.sim.startup import run
from servefleet.sim.theory import dry_run_report

__all__ = ["register"]

_HELP = ("Run the simulated OpenAI-compatible engine: a real SGLang/vLLM start-up log, continuous batching "
         "(realistic timing by default: a throughput peak below max running, streaming capped by the API process; "
         "--timing knee for the old model), and fault injection. Options: `servefleet sim --help`.")


def _table(report: dict) -> Table:
    cfg = report["config"]
    table = Table(title=f"sim ({cfg['style']}): prompt {report['prompt_tokens']} + output {report['output_tokens']} tokens per request")
    for col in ("concurrency", "batch", "step ms", "TTFT s", "latency s", "tok/s per request", "tok/s total", "streaming tok/s"):
        table.add_column(col, justify="right")

    def num(v: float | None, fmt: str) -> str:
        return "inf" if v is None else format(v, fmt)

    for s in report["curve"]:
        table.add_row(str(s["concurrency"]), str(s["batch"]), f"{s['step_ms']:.2f}", num(s["ttft_s"], ".3f"),
                      num(s["request_latency_s"], ".3f"), num(s["per_request_tokens_per_s"], ",.1f"),
                      num(s["output_tokens_per_s"], ",.1f"), num(s["streaming_output_tokens_per_s"], ",.1f"))
    return table


def register(app: typer.Typer) -> None:
    @app.command(
        "sim",
        help=_HELP,
        add_help_option=False,
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True, "allow_interspersed_args": False},
    )
    def sim(ctx: typer.Context) -> None:
        config, flags = parse_args(ctx.args, help_prog="servefleet sim")
        if flags.dry_run:
            report = dry_run_report(config)
            if flags.json:
                typer.echo(json.dumps(report, indent=2))
            else:
                Console().print(_table(report))
            return
        raise typer.Exit(run(config))
