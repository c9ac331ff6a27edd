"""`servefleet bench` (concurrency or request-rate sweeps) and `servefleet compare` (runs side by side).

Thin: parse the options into a :class:`BenchConfig`, call :func:`run_bench` per target, save
RUN.json, render with rich. Several targets (``--url`` repeated, or ``--fleet --servers a,b``)
run one after another with the same sweep and end with the comparison table and plots.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from servefleet.cli.exitcodes import ExitCode
from servefleet.cli.failure import CliFailure, ErrorKind, kind_for_exit_code
from servefleet.errors import ConfigError, HostUnreachable, ServefleetError

if TYPE_CHECKING:  # the bench modules are imported when a command runs
    from servefleet.bench.compare import Comparison
    from servefleet.bench.result import BenchConfig, Run
    from servefleet.bench.sweep import BenchTarget

# Tables are wide (a dozen columns): when the output is not a terminal (a log, a pipe), do not
# squeeze them into rich's 80-column default; COLUMNS still wins where it is set.
console = Console(width=None if sys.stdout.isatty() or "COLUMNS" in os.environ else 200)
err = Console(stderr=True, soft_wrap=True)


def _fail(msg: str, code: ExitCode = ExitCode.USAGE) -> CliFailure:
    """The failure to raise; the root group prints it (and, with --json, the JSON error document)."""
    return CliFailure(kind_for_exit_code(code), msg)


def _numbers(text: str, kind: type, name: str) -> list:
    try:
        values = [kind(x) for x in re.split(r"[,\s]+", text.strip()) if x]
    except ValueError:
        raise _fail(f"{name} must be comma-separated numbers, got {text!r}") from None
    if not values or any(v <= 0 for v in values):
        raise _fail(f"{name} needs positive numbers, got {text!r}")
    return values


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_") or "run"


async def _fleet_targets(fleet_file: str, servers: list[str] | None):
    from servefleet.bench.sweep import BenchTarget
    from servefleet.fleet.core import Fleet

    async with Fleet.discover(fleet_file) as fleet:
        known = list(fleet.spec.names)
        unknown = [n for n in servers or [] if n not in known]
        if unknown:
            raise ServefleetError(
                f"no server named {', '.join(unknown)} in {fleet_file} (its servers: {', '.join(known)})"
            )
        ready = {e.name: e for e in await fleet.ready_endpoints()}
        names = servers or known
    missing = [n for n in names if n not in ready]
    if missing:
        raise ServefleetError(f"not ready in the fleet: {', '.join(missing)} (see `servefleet status`)")
    return [
        BenchTarget(
            base_url=ready[n].base_url,
            label=n,
            model=ready[n].served_model,
            engine=ready[n].engine or None,
            capacity=ready[n].capacity,
        )
        for n in names
    ]


def bench(
    url: Annotated[
        list[str] | None, typer.Option("--url", help="Server base URL (repeat for several; each is run in turn).")
    ] = None,
    fleet: Annotated[
        str | None, typer.Option("--fleet", help="Fleet file: benchmark its ready servers (with --servers).")
    ] = None,
    servers: Annotated[
        str | None, typer.Option("--servers", help="Fleet servers to run, comma-separated (default: all).")
    ] = None,
    label: Annotated[
        list[str] | None, typer.Option("--label", help="Name of each --url's configuration in results (same order).")
    ] = None,
    model: Annotated[
        str | None, typer.Option("--model", help="Model name to request (default: the first in /v1/models).")
    ] = None,
    engine: Annotated[str | None, typer.Option("--engine", help="Engine of the server (default: detected).")] = None,
    concurrency: Annotated[
        str | None, typer.Option("--concurrency", "-c", help="Fixed-concurrency sweep, e.g. 1,4,16,64,256.")
    ] = None,
    request_rate: Annotated[
        str | None, typer.Option("--request-rate", help="Poisson request-rate sweep (req/s), e.g. 1,2,4.")
    ] = None,
    max_concurrency: Annotated[
        int | None, typer.Option("--max-concurrency", help="In-flight cap in request-rate mode.")
    ] = None,
    requests: Annotated[int | None, typer.Option("--requests", "-n", help="Measured requests per point.")] = None,
    duration: Annotated[
        float | None,
        typer.Option(
            "--duration",
            help="Seconds per point (instead of --requests). The rate is taken "
            "from the point's steady part (after the first wave of answers, before the "
            "drain); a point whose steady part was under 2 request lifetimes runs again longer (at most "
            "4x --duration, with a note). Give it 5 or more lifetimes: "
            "on the sim 5 s points (10 lifetimes) read within 0.5% of 20 s ones "
            "(benchmarks/results/bench_modes.md); at 256 output tokens and C=512 on an "
            "H200 a lifetime is ~4.5 s, so 25 s.",
        ),
    ] = None,
    warmup: Annotated[
        int | None,
        typer.Option("--warmup", help="Unmeasured warm-up requests per point (default: one per connection)."),
    ] = None,
    input_len: Annotated[int, typer.Option("--input-len", help="Prompt tokens of random prompts.")] = 128,
    output_len: Annotated[
        int | None, typer.Option("--output-len", help="Output tokens (max_tokens) per request.")
    ] = None,
    input_len_range: Annotated[
        float, typer.Option("--input-len-range", help="Vary prompt length uniformly by +-this fraction.")
    ] = 0.0,
    output_len_range: Annotated[
        float, typer.Option("--output-len-range", help="Vary output length uniformly by +-this fraction.")
    ] = 0.0,
    dataset: Annotated[
        Path | None,
        typer.Option("--dataset", help="JSONL/Parquet of real prompts (prompt|text|messages[, max_tokens])."),
    ] = None,
    tokenizer: Annotated[
        str | None,
        typer.Option(
            "--tokenizer", help="Local tokenizer folder for exact prompt lengths (default: the server's /tokenize)."
        ),
    ] = None,
    api: Annotated[str, typer.Option("--api", help="chat or completions.")] = "chat",
    stream: Annotated[
        bool,
        typer.Option(
            "--stream/--no-stream",
            help="Stream the answers. Default: no, the way a batch job runs "
            "(a server's API process can cap streamed throughput far below what it generates); "
            "TTFT/TPOT then come from the engine's /metrics histograms. --stream: client-side "
            "latency, for latency work.",
        ),
    ] = False,
    ignore_eos: Annotated[
        bool | None,
        typer.Option(
            "--ignore-eos/--no-ignore-eos",
            help="Ask for exactly --output-len tokens (default: where the engine supports it).",
        ),
    ] = None,
    temperature: Annotated[float | None, typer.Option("--temperature", help="Sampling temperature to send.")] = None,
    extra_body: Annotated[
        str | None, typer.Option("--extra-body", help="JSON object merged into every request body.")
    ] = None,
    workers: Annotated[
        str,
        typer.Option(
            "--workers",
            help="Client processes: a number, or auto (one per 64 concurrent requests, at most one per core).",
        ),
    ] = "auto",
    api_key_env: Annotated[
        str, typer.Option("--api-key-env", help="Environment variable holding the API key (never written anywhere).")
    ] = "OPENAI_API_KEY",
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds one request may take.")] = 600.0,
    seed: Annotated[int, typer.Option("--seed", help="Seed of prompts, lengths and arrivals.")] = 0,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out", "-o", help="RUN.json to write (several targets: OUT-<label>.json each, plus compare plots)."
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the run(s) as JSON.")] = False,
) -> None:
    """Measure throughput and latency of one or more servers across concurrency levels or request rates."""
    _check_sweep_kind(concurrency, request_rate, requests, duration, api)
    if not url and not fleet:
        raise _fail("give --url URL (repeatable) or --fleet FILE")
    config = _bench_config(
        concurrency=concurrency,
        request_rate=request_rate,
        max_concurrency=max_concurrency,
        requests=requests,
        duration=duration,
        warmup=warmup,
        input_len=input_len,
        output_len=output_len,
        input_len_range=input_len_range,
        output_len_range=output_len_range,
        dataset=dataset,
        api=api,
        stream=stream,
        ignore_eos=ignore_eos,
        temperature=temperature,
        extra_body=extra_body,
        workers=workers,
        seed=seed,
        timeout=timeout,
    )
    _check_paths(tokenizer, dataset, out)
    targets = _bench_targets(url, fleet, servers, label, model, engine, api_key=os.environ.get(api_key_env) or None)
    runs, paths = _run_targets(targets, config, tokenizer=tokenizer, out=out, quiet=as_json)
    comparison = _compare_targets(runs, paths, out)
    if as_json:
        payload = [r.model_dump(mode="json") for r in runs]
        print(
            json.dumps(
                payload[0]
                if len(payload) == 1
                else {"runs": payload, "comparison": comparison.model_dump() if comparison else None},
                indent=2,
            )
        )
        return
    if comparison is not None:
        _print_comparison(comparison)
    if any(p.successful == 0 for r in runs for p in r.points):
        raise typer.Exit(int(ExitCode.FAILED))


def _check_sweep_kind(
    concurrency: str | None, request_rate: str | None, requests: int | None, duration: float | None, api: str
) -> None:
    """Which sweep: one of --concurrency / --request-rate, one of --requests / --duration, a known API."""
    if (concurrency is None) == (request_rate is None):
        raise _fail("give exactly one of --concurrency LIST or --request-rate LIST")
    if (requests is None) == (duration is None):
        raise _fail("give exactly one of --requests N or --duration S")
    if api not in ("chat", "completions"):
        raise _fail(f"--api must be chat or completions, got {api!r}")


def _bench_config(
    *,
    concurrency: str | None,
    request_rate: str | None,
    max_concurrency: int | None,
    requests: int | None,
    duration: float | None,
    warmup: int | None,
    input_len: int,
    output_len: int | None,
    input_len_range: float,
    output_len_range: float,
    dataset: Path | None,
    api: str,
    stream: bool,
    ignore_eos: bool | None,
    temperature: float | None,
    extra_body: str | None,
    workers: str,
    seed: int,
    timeout: float,
) -> BenchConfig:
    """The sweep the options ask for, checked before any server is contacted."""
    from pydantic import ValidationError

    from servefleet.bench.result import BenchConfig
    from servefleet.validation import option_error

    if dataset is None and output_len is None:
        output_len = 128
    levels = (
        _numbers(concurrency, int, "--concurrency")
        if concurrency
        else _numbers(request_rate or "", float, "--request-rate")
    )
    extra = _extra_body(extra_body)
    n_workers = _workers(workers, int((max_concurrency or 256) if request_rate else max(levels)))
    try:
        return BenchConfig(
            mode="rate" if request_rate else "concurrency",
            concurrency=levels if concurrency else [],
            request_rates=levels if request_rate else [],
            max_concurrency=max_concurrency,
            requests=requests,
            duration_s=duration,
            warmup=warmup,
            input_len=None if dataset else input_len,
            output_len=output_len,
            input_len_range=input_len_range,
            output_len_range=output_len_range,
            dataset=str(dataset) if dataset else None,
            api=api,
            stream=stream,
            ignore_eos=ignore_eos,
            temperature=temperature,
            extra_body=extra,
            workers=n_workers,
            seed=seed,
            timeout_s=timeout,
        )
    except ValidationError as exc:  # the model's own range checks, worded with the option names
        raise _fail(str(option_error(exc))) from None


def _extra_body(text: str | None) -> dict:
    """--extra-body: a JSON object merged into every request body."""
    if not text:
        return {}
    try:
        extra = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _fail(f"--extra-body is not JSON: {exc.msg}") from None
    if not isinstance(extra, dict):
        raise _fail("--extra-body must be a JSON object")
    return extra


def _workers(text: str, max_load: int) -> int:
    """--workers: a number, or auto (from the largest load of the sweep)."""
    from servefleet.bench.sweep import auto_workers

    if text == "auto":
        return auto_workers(max_load)
    if text.isdigit() and int(text) >= 1:
        return int(text)
    raise _fail(f"--workers must be a positive number or auto, got {text!r}")


def _bench_targets(
    url: list[str] | None,
    fleet: str | None,
    servers: str | None,
    label: list[str] | None,
    model: str | None,
    engine: str | None,
    *,
    api_key: str | None,
) -> list[BenchTarget]:
    """The servers to run: the fleet's ready ones (``--fleet``, ``--servers``), else each ``--url``."""
    from servefleet.bench.sweep import BenchTarget

    try:
        if fleet:
            targets = asyncio.run(_fleet_targets(fleet, [s for s in (servers or "").split(",") if s] or None))
        else:
            labels = list(label or [])
            targets = [
                BenchTarget(base_url=u, label=labels[i] if i < len(labels) else None, model=model, engine=engine)
                for i, u in enumerate(url or [])
            ]
        for t in targets:
            t.api_key = api_key
            if model and not t.model:
                t.model = model
    except (ConfigError, HostUnreachable):
        raise  # reported by the root group with its own kind and exit code
    except ServefleetError as exc:
        raise _fail(str(exc)) from None
    return targets


def _run_targets(
    targets: list[BenchTarget], config: BenchConfig, *, tokenizer: str | None, out: Path | None, quiet: bool
) -> tuple[list[Run], list[str]]:
    """Each target's sweep in turn: its RUN.json saved (``OUT-<label>.json`` for several), its table shown."""
    from servefleet.bench.result import save_run
    from servefleet.cli.bench_view import run_table

    runs: list[Run] = []
    paths: list[str] = []
    for target in targets:
        run = _run_one(target, config, tokenizer=tokenizer, quiet=quiet)
        runs.append(run)
        if out is not None:
            path = (
                out
                if len(targets) == 1
                else out.with_name(f"{out.stem}-{_slug(run.target.label)}{out.suffix or '.json'}")
            )
            paths.append(str(save_run(run, path)))
        if not quiet:
            console.print(run_table(run))
            if paths:
                console.print(f"wrote {paths[-1]}")
    return runs, paths


def _run_one(target: BenchTarget, config: BenchConfig, *, tokenizer: str | None, quiet: bool) -> Run:
    """One target's sweep, with a line per finished point on stderr unless ``quiet``."""
    from servefleet.bench.pool import loop_factory
    from servefleet.bench.sweep import ServerUnreachable, run_bench
    from servefleet.cli.bench_view import point_line

    if not quiet:
        levels = config.concurrency or config.request_rates
        err.print(
            f"[bold]bench[/] {target.label or target.base_url}: {len(levels)} points, "
            f"{f'{config.requests} requests' if config.requests else f'{config.duration_s:g}s'} each, "
            f"{'streaming' if config.stream else 'non-streaming'}, {config.workers} client process(es)"
        )
    try:
        with asyncio.Runner(loop_factory=loop_factory()) as runner:  # asyncio, or SERVEFLEET_EVENT_LOOP=uvloop
            return runner.run(
                run_bench(
                    target,
                    config,
                    tokenizer=tokenizer,
                    on_point=None if quiet else (lambda p: err.print("  " + point_line(p))),
                    on_note=None if quiet else (lambda m: err.print(f"  [dim]note: {m}[/]")),
                )
            )
    except ServerUnreachable as exc:
        raise _fail(str(exc), ExitCode.UNREACHABLE) from None
    except ConfigError as exc:  # the user's workload or paths, found before any point ran
        raise CliFailure(ErrorKind.CONFIG, str(exc)) from None
    except ServefleetError as exc:
        raise _fail(str(exc), ExitCode.FAILED) from None


def _check_paths(tokenizer: str | None, dataset: Path | None, out: Path | None) -> None:
    """The user's paths, before any server is asked: a sweep of minutes must not end in a traceback."""

    def bad(message: str) -> CliFailure:
        return CliFailure(ErrorKind.CONFIG, message)

    if tokenizer is not None and not Path(tokenizer).exists():
        raise bad(f"--tokenizer {tokenizer}: no such folder (give a local tokenizer folder; nothing is downloaded)")
    if dataset is not None and not dataset.is_file():
        raise bad(f"--dataset {dataset}: {'a folder, not a file' if dataset.is_dir() else 'no such file'}")
    if out is None:
        return
    folder = out.parent if str(out.parent) else Path(".")
    if out.is_dir():
        raise bad(f"--out {out} is a folder; give the RUN.json file to write")
    try:  # the run's folder is made as it always was; one that cannot be made is the user's to fix
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise bad(
            f"--out {out}: cannot make the folder {folder} ({exc.strerror or exc}); choose a folder you can write to"
        ) from None
    try:  # the one way to know (a read-only mount, a folder of another user; root passes permission bits)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".servefleet-write-test-"):
            pass
    except OSError as exc:
        raise bad(
            f"--out {out}: cannot write in {folder} ({exc.strerror or exc}); choose a folder you can write to"
        ) from None


def _compare_targets(runs: list[Run], paths: list[str], out: Path | None) -> Comparison | None:
    """Several targets: the comparison of their runs, with plots next to ``--out``; one: None."""
    from servefleet.bench.compare import compare_runs
    from servefleet.cli.plots import write_plots

    if len(runs) < 2:
        return None
    comparison = compare_runs(runs, paths or None)
    if out is not None:
        comparison.plots = [str(p) for p in write_plots(runs, out.parent, prefix=f"{out.stem}-compare")]
    return comparison


def _print_comparison(comparison: Comparison) -> None:
    from servefleet.cli.bench_view import compare_table

    console.print(compare_table(comparison))
    for p in comparison.plots:
        console.print(f"plot: {p}")


def compare(
    runs: Annotated[list[Path], typer.Argument(help="RUN.json files; the first is the reference.")],
    out_dir: Annotated[
        Path | None, typer.Option("--out-dir", help="Folder for the PNG plots (default: next to the first run).")
    ] = None,
    prefix: Annotated[str, typer.Option("--prefix", help="File name prefix of the plots.")] = "compare",
    no_plots: Annotated[bool, typer.Option("--no-plots", help="Table only.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the comparison as JSON.")] = False,
) -> None:
    """Configurations side by side: throughput at each concurrency, best points, ratios, and plots."""
    from pydantic import ValidationError

    from servefleet.bench.compare import compare_runs
    from servefleet.bench.result import load_run
    from servefleet.cli.plots import write_plots

    loaded = []
    for path in runs:
        try:
            loaded.append(load_run(path))
        except FileNotFoundError:
            raise CliFailure(ErrorKind.CONFIG, f"{path}: no such file") from None
        except (ValidationError, json.JSONDecodeError) as exc:
            raise CliFailure(
                ErrorKind.CONFIG, f"{path}: not a servefleet bench RUN.json ({str(exc).splitlines()[0]})"
            ) from None
    comparison = compare_runs(loaded, [str(p) for p in runs])
    if not no_plots:
        folder = out_dir if out_dir is not None else runs[0].parent
        comparison.plots = [str(p) for p in write_plots(loaded, folder, prefix=prefix)]
    if as_json:
        print(comparison.model_dump_json(indent=2))
        return
    _print_comparison(comparison)


def register(app: typer.Typer) -> None:
    app.command("bench")(bench)
    app.command("compare")(compare)
