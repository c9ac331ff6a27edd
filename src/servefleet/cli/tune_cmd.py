"""`servefleet tune`: the candidates of a space file measured on the job's own prompts and ranked by
predicted makespan; `--then-generate`: the winner on every server, the job, and the plan checked."""

from __future__ import annotations

import asyncio
import json
import math
import sys
from pathlib import Path
from typing import Annotated

import typer

from servefleet.cli.exitcodes import ExitCode
from servefleet.cli.failure import CliFailure, ErrorKind, failure_from_exception
from servefleet.errors import ServefleetError


def _usage(msg: str) -> CliFailure:
    return CliFailure(ErrorKind.USAGE, msg)


def tune(
    fleet: Annotated[
        Path,
        typer.Option(
            "--fleet", help="Base fleet file: its server (--server, default the first) is what each candidate varies."
        ),
    ],
    space: Annotated[
        Path,
        typer.Option(
            "--space", help="Space file (TOML): \\[\\[candidate]] tables and/or a \\[grid] of engine-native args."
        ),
    ],
    input: Annotated[
        Path, typer.Option("--input", "-i", help="The job's prompts (JSONL or Parquet, as for generate).")
    ],
    sample: Annotated[
        int,
        typer.Option(
            "--sample",
            min=1,
            help="Prompts drawn from --input to measure on (their real lengths and max_tokens); each point sends prompts"
            " of its own, none twice (a repeat would find its prefix cached), so give at least what the points send.",
        ),
    ] = 10_000,
    gpus: Annotated[
        str,
        typer.Option(
            "--gpus", help="GPU counts to predict the whole job's makespan for, comma-separated (the first ranks)."
        ),
    ] = "1",
    budget: Annotated[
        str | None,
        typer.Option(
            "--budget",
            metavar="DURATION",
            help="Wall time of the search (90s, 30m, 1h); what does not fit is skipped, and said.",
        ),
    ] = None,
    server: Annotated[
        str | None, typer.Option("--server", help="The base server of --fleet (default: its first).")
    ] = None,
    max_tokens: Annotated[
        int | None,
        typer.Option(
            "--max-tokens", min=1, help="max_tokens of records without one (the job's default, as for generate)."
        ),
    ] = None,
    out: Annotated[
        Path,
        typer.Option(
            "--out",
            "-o",
            help="Folder for the sample, each candidate's fleet file and RUN.json, the winner's fleet file, plots.",
        ),
    ] = Path("tune-out"),
    seed: Annotated[int, typer.Option("--seed", help="Seed of the sample and of the bench points.")] = 0,
    plot: Annotated[
        bool, typer.Option("--plot/--no-plot", help="Write throughput, latency and makespan plots (PNG) into --out.")
    ] = True,
    then_generate: Annotated[
        bool,
        typer.Option(
            "--then-generate",
            help="Then relaunch the winner on every server of --fleet, run the job to --output "
            "(starting at the tune's best point) and check the plan against it.",
        ),
    ] = False,
    output: Annotated[
        str | None,
        typer.Option("--output", help="With --then-generate: the job's destination (a folder or s3://bucket/prefix)."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Which engine configuration finishes this job soonest on these GPUs: each candidate launched as a
    temporary server (in turn), verified, measured on a sample of the job's own prompts (non-streaming, at
    concurrencies found by measurement), stopped; ranked by the planner's predicted makespan. A failed
    candidate is a row with its category and evidence. --then-generate: then the job itself."""
    from rich.console import Console

    from servefleet.cli.generate_cmd import parse_duration
    from servefleet.cli.plan_cmds import _gpu_counts
    from servefleet.tune.search import TuneRequest, prepare, run_tune

    err = Console(stderr=True)
    budget_s = None
    if budget is not None:
        budget_s = parse_duration(budget)
        if budget_s is None or budget_s <= 0:
            raise _usage(f"--budget {budget!r}: expected a duration above 0 such as 90s, 30m or 1h")
    if then_generate and not output:
        raise _usage("--then-generate needs --output DEST (where the job's shards go)")
    if output and not then_generate:
        raise _usage("--output is the job's destination: give it with --then-generate")
    counts = tuple(_gpu_counts(gpus))
    request = TuneRequest(
        fleet=fleet,
        space=space,
        input=input,
        out=out.expanduser().resolve(),  # the candidates' fleet files name their state folder under it
        sample=sample,
        gpus=counts,
        budget_s=budget_s,
        server=server,
        max_tokens=max_tokens,
        seed=seed,
    )
    try:
        prep = prepare(request)  # every refusal (exit 3) before anything is launched
        result = asyncio.run(run_tune(prep, on_event=lambda m: err.print(f"[dim]tune:[/] {m}")))
    except ServefleetError as exc:
        raise failure_from_exception(exc) or CliFailure(ErrorKind.FAILED, str(exc)) from None
    _finish(prep, result, plot)
    then = None
    if then_generate and result.winner is not None and result.winner_fleet:
        from servefleet.tune.then import then_generate as run_then

        gpr = next(cf.gpus_per_replica for cf in prep.fleets if cf.candidate.name == result.winner.name)
        try:
            then = asyncio.run(
                run_then(
                    Path(result.winner_fleet),
                    Path(result.winner.run or ""),
                    gpr,
                    input=input,
                    output=output or "",
                    max_tokens=max_tokens,
                    on_event=lambda m: err.print(f"[dim]tune:[/] {m}"),
                )
            )
        except ServefleetError as exc:
            raise failure_from_exception(exc) or CliFailure(ErrorKind.FAILED, str(exc)) from None
    code = _exit_code(result, then, then_generate)
    if as_json:
        doc = result.to_json()
        if then_generate:
            doc["then"] = then.to_json() if then is not None else None
        if code:
            from servefleet.cli.failure import outcome_document

            doc = outcome_document(doc, exit_code=code, message=_failure_message(result, then), command="tune")
        sys.stdout.write(json.dumps(doc, indent=2, default=str) + "\n")
    else:
        _render(result, then, Console())
    if code:
        raise typer.Exit(code)


def _finish(prep, result, plot: bool) -> None:
    """The winner's fleet file and the plots."""
    from servefleet.tune.candidates import winner_fleet

    winner = result.winner
    if winner is not None:
        cand = next(cf.candidate for cf in prep.fleets if cf.candidate.name == winner.name)
        result.winner_fleet = str(
            winner_fleet(prep.base, cand, prep.request.out / "winner.toml", prep.request.out / "winner-state")
        )
    runs = [r.run for r in result.rows if r.run]
    if plot and runs:
        try:
            from servefleet.bench.result import load_run
            from servefleet.cli.plots import write_plots

            paths = write_plots([load_run(r) for r in runs], prep.request.out, prefix="tune")
            result.plot = str(paths[0])
            if result.output_tokens_mean:
                from servefleet.cli.plots import plot_makespan
                from servefleet.plan.planner import JobSpec
                from servefleet.plan.runs import curve_from_run

                gpr = {cf.candidate.name: cf.gpus_per_replica for cf in prep.fleets}
                curves = [curve_from_run(Path(r.run), gpr[r.name]) for r in result.rows if r.run]
                plot_makespan(
                    curves,
                    JobSpec(prompts=result.prompts, output_tokens_mean=result.output_tokens_mean),
                    result.gpus,
                    prep.request.out / "tune-makespan.png",
                )
        except ImportError as exc:  # matplotlib is optional
            result.notes.append(f"no plots: {exc}")


def _exit_code(result, then, asked: bool) -> int:
    if result.winner is None:
        return int(ExitCode.FAILED)
    if asked:
        if then is None or then.report.status != "complete":
            return int(ExitCode.FAILED)
        if then.check is not None and not then.check.within:
            return int(ExitCode.FAILED)
    return 0


def _failure_message(result, then) -> str:
    if result.winner is None:
        return "no candidate was measured: every one failed or was skipped"
    if then is None:
        return "the job was not run"
    if then.report.status != "complete":
        return f"the job ended {then.report.status}"
    return f"plan --check: {then.check.verdict() if then.check else then.check_error}"


def _render(result, then, console) -> None:
    from rich.table import Table

    from servefleet.cli.plan_view import fmt_duration

    title = f"{result.prompts:,} prompts (measured on {result.sample:,})" + (
        f", {result.output_tokens_mean:,.0f} output tokens each on average" if result.output_tokens_mean else ""
    )
    table = Table(title=title)
    for col in (
        "rank",
        "candidate",
        *[f"makespan {g} GPU" for g in result.gpus],
        f"GPU-h ({result.gpus[0]})",
        "tok/s",
        "best conc.",
        "ready",
        "KV tokens",
        "max running",
        "accept.",
        "outcome",
    ):
        table.add_column(col, justify="left" if col in ("candidate", "outcome") else "right")
    for i, r in enumerate(result.rows, 1):
        spans = {p.gpus: p for p in r.predictions}
        first = spans.get(result.gpus[0])
        if r.outcome == "failed":
            what = f"failed: {r.category}: {r.evidence or ''}"
        elif r.outcome in ("skipped", "stopped_early") or r.reason:
            what = f"{r.outcome.replace('_', ' ')}: {r.reason}"
        else:
            what = "measured"
        accept = (
            f"{r.acceptance:.2f}"
            if r.acceptance is not None
            else (f"{r.accept_length:.2f} tok/step" if r.accept_length else "-")
        )
        table.add_row(
            str(i),
            r.name,
            *[fmt_duration(spans[g].makespan_s) if g in spans else "-" for g in result.gpus],
            f"{first.gpu_hours:,.2f}" if first and math.isfinite(first.gpu_hours) else "-",
            f"{r.output_tps:,.0f}" if r.output_tps else "-",
            str(r.best_concurrency or "-"),
            f"{r.time_to_ready_s:.1f} s" if r.time_to_ready_s is not None else "-",
            f"{r.kv_tokens:,}" if r.kv_tokens else "-",
            str(r.max_running or "-"),
            accept,
            what,
        )
    console.print(table)
    ran = [r.name for r in result.rows if r.outcome != "skipped"]
    skipped = [r.name for r in result.rows if r.outcome == "skipped"]
    console.print(f"ran: {', '.join(ran) or 'none'}" + (f"; skipped: {', '.join(skipped)}" if skipped else ""))
    console.print(
        f"wall {result.wall_s:.1f} s, of which measuring {result.measured_s:.1f} s (overhead {100 * result.overhead_share:.0f} %)"
    )
    if result.winner is not None:
        console.print(
            f"[bold]winner:[/] {result.winner.name}  fleet file: {result.winner_fleet}  RUN.json: {result.winner.run}"
        )
    for note in result.notes:
        console.print(f"  note: {note}")
    if then is not None:
        console.print(f"[bold]job:[/] {then.report.status} on {', '.join(then.servers)}")
        if then.check is not None:
            style = "green" if then.check.within else "red"
            console.print(f"[bold {style}]plan --check:[/] {then.check.verdict()}")
        elif then.check_error:
            console.print(f"plan --check: {then.check_error}")


def register(app: typer.Typer) -> None:
    app.command(
        "tune",
        short_help="Measure engine configurations on the job's own prompts and rank them by predicted makespan; --then-generate runs the job.",
    )(tune)
