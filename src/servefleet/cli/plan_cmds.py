"""`servefleet capacity` (memory model, and what a live server reports) and `servefleet plan`."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path
from typing import Annotated

import typer

from servefleet.cli.exitcodes import ExitCode
from servefleet.cli.failure import CliFailure, ErrorKind, failure_from_exception, kind_for_exit_code
from servefleet.errors import ServefleetError


class _LazyConsole:
    """rich's Console, made on first use: `plan --json` and the error paths never load rich."""

    _console = None

    def __getattr__(self, name: str):
        if self._console is None:
            from rich.console import Console

            self._console = Console()
        return getattr(self._console, name)


console = _LazyConsole()


def _fail(msg: str, code: ExitCode = ExitCode.USAGE) -> CliFailure:
    """The failure to raise; the root group prints it (and, with --json, the JSON error document)."""
    return CliFailure(kind_for_exit_code(code), msg)


async def _live_capacity(url: str, engine: str) -> dict:
    from servefleet.engines.registry import get_engine
    from servefleet.http import FailureKind, HttpClient, Timeout, TransportError

    async with HttpClient() as client:
        try:  # any HTTP answer (404 included) proves the server is there; the engine's reads say nothing when it is not
            await client.get(url.rstrip("/") + "/", timeout=Timeout(10.0))
        except TransportError as exc:
            if exc.kind is not FailureKind.PROTOCOL:  # refused, dropped, timed out: nobody answers HTTP there
                raise CliFailure(
                    ErrorKind.UNREACHABLE,
                    f"--url {url}: no answer ({exc.failure.message})",
                    hint="is the server running, and on that port?",
                ) from None
        cap = await get_engine(engine).capacity_from_server(client, url.rstrip("/"))
    return cap.model_dump(exclude_defaults=True)


def capacity(
    model: Annotated[
        Path | None, typer.Option("--model", help="Local model folder or its config.json (nothing is downloaded).")
    ] = None,
    gpu_mem: Annotated[str, typer.Option("--gpu-mem", help="Memory of one GPU, e.g. 80GiB, 141GiB.")] = "80GiB",
    tp: Annotated[int, typer.Option("--tp", min=1, help="Tensor-parallel GPUs per server.")] = 1,
    mem_fraction: Annotated[
        float, typer.Option("--mem-fraction", help="--mem-fraction-static (SGLang) / --gpu-memory-utilization (vLLM).")
    ] = 0.9,
    context_len: Annotated[
        int,
        typer.Option("--context-len", min=1, help="Tokens per request (prompt + output) for max running requests."),
    ] = 4096,
    spec: Annotated[
        str | None, typer.Option("--spec", help="Speculative draft: mtp[:N], draft:PATH, eagle:PATH or ngram.")
    ] = None,
    dtype: Annotated[
        str | None,
        typer.Option(
            "--dtype", help="Weight dtype (default: the model's torch_dtype from config.json, else bfloat16)."
        ),
    ] = None,
    kv_dtype: Annotated[
        str | None, typer.Option("--kv-dtype", help="KV-cache dtype (default: the weight dtype), e.g. fp8.")
    ] = None,
    overhead: Annotated[
        str,
        typer.Option("--overhead", help="Per-GPU memory outside the fraction's budget (CUDA context, activations)."),
    ] = "1GiB",
    url: Annotated[
        str | None, typer.Option("--url", help="A running server: also show what its engine reports.")
    ] = None,
    engine: Annotated[str, typer.Option("--engine", help="Engine of --url.")] = "sglang",
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Predict KV-cache tokens and max running requests from a model's config.json, before launching
    anything; with --url, compare with what the running engine reports."""
    from servefleet.cli.plan_view import memory_table
    from servefleet.plan.memory import MemoryAssumptions, estimate_memory, load_config, model_dtype, parse_bytes
    from servefleet.validation import build

    if model is None and url is None:
        raise _fail("give --model PATH (predict) and/or --url URL (read a running server)")
    try:
        # every option is checked (the model's ranges) before a server is asked or a file read
        assumptions = build(
            MemoryAssumptions,
            None,
            gpu_mem_bytes=parse_bytes(gpu_mem),
            tp=tp,
            mem_fraction=mem_fraction,
            overhead_bytes_per_gpu=parse_bytes(overhead),
            weight_dtype=dtype or "bfloat16",
            kv_dtype=kv_dtype or dtype or "bfloat16",
            state_dtype=dtype or "bfloat16",
            context_len=context_len,
            spec=spec,
        )
        est = None
        if model is not None:
            cfg, folder = load_config(model)
            declared = model_dtype(cfg) if dtype is None else None
            if declared is not None:  # a float32 model's weights and cache take twice bfloat16's bytes
                assumptions = assumptions.model_copy(
                    update={"weight_dtype": declared, "kv_dtype": kv_dtype or declared, "state_dtype": declared}
                )
            est = estimate_memory(cfg, assumptions, folder)
        reported = asyncio.run(_live_capacity(url, engine)) if url else None
    except ServefleetError as exc:
        raise failure_from_exception(exc) or _fail(str(exc)) from None
    except ValueError as exc:
        raise _fail(str(exc)) from None
    if as_json:
        out = est.model_dump() if est else {}
        if reported is not None:
            out["reported"] = reported
        print(json.dumps(out, indent=2))
        return
    if est:
        console.print(memory_table(est, reported))
        for note in est.notes:
            console.print(f"  note: {note}")
        a = est.assumptions
        console.print(
            f"  assumptions: {a.gpu_mem_bytes / 2**30:.0f} GiB x fraction {a.mem_fraction}, tp {a.tp}, weights {a.weight_dtype} "
            f"(from {a.weight_source}), KV {a.kv_dtype}, {a.overhead_bytes_per_gpu / 2**30:.2f} GiB overhead per GPU"
        )
    elif reported is not None:
        console.print_json(data=reported)


def plan(
    bench: Annotated[
        list[str],
        typer.Option("--bench", help="A bench RUN.json per configuration; RUN.json:G for G GPUs per replica."),
    ],
    prompts: Annotated[int | None, typer.Option("--prompts", help="Prompts in the job.")] = None,
    output_tokens_mean: Annotated[
        float | None, typer.Option("--output-tokens-mean", help="Mean output tokens per prompt.")
    ] = None,
    sample: Annotated[
        Path | None,
        typer.Option("--sample", help="JSONL/Parquet of real outputs to take the mean output length from."),
    ] = None,
    gpus: Annotated[
        str | None,
        typer.Option(
            "--gpus",
            help="GPU counts to plan for, comma-separated (the first is ranked); default 1, with --check the job's servers.",
        ),
    ] = None,
    gpus_per_replica: Annotated[
        int, typer.Option("--gpus-per-replica", min=1, help="GPUs per server unless RUN.json:G says otherwise.")
    ] = 1,
    max_running: Annotated[
        int | None, typer.Option("--max-running", min=1, help="Override the cap read from the runs' capacity facts.")
    ] = None,
    gpu_hour_cost: Annotated[
        float | None, typer.Option("--gpu-hour-cost", min=0.0, help="Price of one GPU-hour.")
    ] = None,
    plot: Annotated[Path | None, typer.Option("--plot", help="Write a PNG of makespan against GPUs.")] = None,
    check: Annotated[
        str | None,
        typer.Option(
            "--check",
            metavar="DEST",
            help="A `generate` destination (a folder or s3://bucket/prefix): compare the plan with what it measured.",
        ),
    ] = None,
    report: Annotated[
        Path | None,
        typer.Option("--report", help="With --check: a saved `generate --json` report (times the sending alone)."),
    ] = None,
    concurrency: Annotated[
        int | None,
        typer.Option(
            "--concurrency",
            min=1,
            help="With --check: the concurrency the job ran at (default: the planner's choice).",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Which measured configuration, at what concurrency, finishes the job soonest on G GPUs, with an ETA.
    With --check DEST (a folder or s3://bucket/prefix): how far the plan was from what `generate` measured there."""
    if check is not None:
        _check(bench, check, report, gpus, gpus_per_replica, max_running, concurrency, as_json)
        return
    if prompts is None:
        raise _fail("give --prompts N (or --check DEST to compare a plan with a job `generate` ran)")
    gpus = gpus or "1"
    from servefleet.cli.plan_view import plan_table, recommendation, tail_line
    from servefleet.cli.plots import plot_makespan
    from servefleet.plan.planner import JobSpec, plan_job, tail_model
    from servefleet.plan.runs import curve_from_run, mode_warnings, parse_bench_arg, sample_output_mean
    from servefleet.validation import build

    try:
        if (output_tokens_mean is None) == (sample is None):
            raise _fail("give exactly one of --output-tokens-mean M or --sample FILE")
        notes = []
        if sample is not None:
            output_tokens_mean, n = sample_output_mean(sample)
            notes.append(f"mean output length {output_tokens_mean:,.1f} tokens from {n:,} records of {sample}")
        job = build(JobSpec, None, prompts=prompts, output_tokens_mean=output_tokens_mean)
        counts = _gpu_counts(gpus)
        configs = []
        for arg in bench:
            path, g = parse_bench_arg(arg)
            configs.append(curve_from_run(path, g or gpus_per_replica, max_running))
    except ServefleetError as exc:  # a ConfigError (a missing or bad file) is config, as in every command
        raise failure_from_exception(exc) or _fail(str(exc)) from None
    warnings = mode_warnings(configs)
    modes = {c.name: c.measured_mode for c in configs}
    results = {g: plan_job(configs, job, g, gpu_hour_cost) for g in counts}
    plot_path = plot_makespan(configs, job, counts, plot) if plot else None
    curves = {c.name: c.curve for c in configs}

    def tail(r):  # the predicted tail: what --release-tail would return
        return tail_model(curves[r.name], r.best_concurrency, r.replicas, job) if math.isfinite(r.makespan_s) else None

    if as_json:

        def row(r):
            t = tail(r)
            return {
                **r.__dict__,
                "makespan_s": r.makespan_s if math.isfinite(r.makespan_s) else None,
                "gpu_hours": r.gpu_hours if math.isfinite(r.gpu_hours) else None,
                "measured_mode": modes.get(r.name),
                "tail": t.to_json() if t is not None else None,
            }

        print(
            json.dumps(
                {
                    "job": {"prompts": prompts, "output_tokens_mean": output_tokens_mean},
                    "plans": {str(g): [row(r) for r in rows] for g, rows in results.items()},
                    "recommendation": recommendation(results[counts[0]]),
                    "plot": str(plot_path) if plot_path else None,
                    "notes": notes,
                    "warnings": warnings,
                    "caveats": {c.name: list(c.caveats) for c in configs if c.caveats},
                },
                indent=2,
            )
        )
        return
    for warning in warnings:
        console.print(f"[bold yellow]warning:[/] {warning}")
    for config in configs:
        for caveat in config.caveats:
            console.print(f"[bold yellow]caveat:[/] {config.name}: {caveat}")
    for g, rows in results.items():
        console.print(plan_table(rows, job, g))
        for r in rows:
            for note in r.notes:
                console.print(f"  {r.name}: {note}")
    console.print(f"[bold]recommendation:[/] {recommendation(results[counts[0]])}")
    best = results[counts[0]][0] if results[counts[0]] else None
    if best is not None and (t := tail(best)) is not None:
        console.print(f"  {tail_line(best, t)}")
    for note in notes:
        console.print(f"  note: {note}")
    if plot_path:
        console.print(f"plot: {plot_path}")


def _gpu_counts(text: str) -> list[int]:
    """--gpus: comma-separated positive integers."""
    try:
        counts = [int(g) for g in text.split(",") if g.strip()]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise _fail(f"--gpus must be comma-separated integers of at least 1, got {text!r}")
    return counts


def _check(
    bench: list[str],
    dest: str,
    report: Path | None,
    gpus: str | None,
    gpus_per_replica: int,
    max_running: int | None,
    concurrency: int | None,
    as_json: bool,
) -> None:
    from servefleet.cli.plan_view import check_table
    from servefleet.plan.check import check_plan, measure_job, pick_config
    from servefleet.plan.runs import curve_from_run, mode_warnings, model_of_run, parse_bench_arg

    try:
        measured = measure_job(dest, report)
        configs = []
        for arg in bench:
            path, g = parse_bench_arg(arg)
            configs.append((curve_from_run(path, g or gpus_per_replica, max_running), model_of_run(path)))
        g = _gpu_counts(gpus)[0] if gpus else None
        result = check_plan(pick_config(configs, measured), measured, gpus=g, concurrency=concurrency)
        warnings = mode_warnings([c for c, _ in configs])
    except (
        ServefleetError
    ) as exc:  # a ConfigError (a missing or bad file) is config, as in every command; no catch-all ValueError
        raise failure_from_exception(exc) or _fail(str(exc)) from None
    if as_json:
        from servefleet.cli.failure import outcome_document

        print(
            json.dumps(
                outcome_document(
                    {**result.to_json(), "warnings": warnings},
                    exit_code=0 if result.within else int(ExitCode.FAILED),
                    message=result.verdict(),
                    command="plan",
                ),
                indent=2,
            )
        )
    else:
        for warning in warnings:
            console.print(f"[bold yellow]warning:[/] {warning}")
        console.print(check_table(result))
        style = "green" if result.within else "red"
        console.print(f"[bold {style}]verdict:[/] {result.verdict()}")
        for c in result.against_bench:  # the job's own rate where it held a benched concurrency
            console.print(
                f"  server vs bench: {c.held.server} at concurrency {c.held.concurrency}: {c.held.output_tps:,.0f} "
                f"tok/s over {c.held.seconds:,.0f} s of the job, {c.benched_tps:,.0f} benched ({c.error_pct:+.0f}%)"
            )
        for caveat in result.caveats:
            console.print(f"  [bold yellow]caveat:[/] {caveat}")
        for note in result.notes:
            console.print(f"  note: {note}")
    if not result.within:  # the check ran, and the plan missed: exit 1 (the verdict and --json say by how much)
        raise typer.Exit(int(ExitCode.FAILED))


def register(app: typer.Typer) -> None:
    app.command(
        "capacity",
        short_help="Predict KV-cache tokens and max running requests from a model's config.json; with --url, compare with the engine.",
    )(capacity)
    app.command(
        "plan",
        short_help="Which measured configuration, at what concurrency, finishes the job soonest on G GPUs; --check compares with a run.",
    )(plan)
