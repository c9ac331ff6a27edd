"""`servefleet generate`: the bulk job over every ready server, resumable, exactly once."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, NoReturn

import typer

from servefleet.cli.exitcodes import ExitCode
from servefleet.cli.failure import CliFailure, kind_for_exit_code
from servefleet.errors import ConfigError

HELP = """Send every prompt of --input to the servers and write the answers to --output as
sharded Parquet (or JSONL). Run the same command again to resume: ids in committed shards are
skipped, nothing is asked twice. Input: JSONL in the OpenAI batch format ({custom_id, body}) or
{id, prompt|messages, ...}, or Parquet with the same columns.

--output holds: job.json (the manifest: input fingerprint, parameters, runs, shard counts), shards/part-RUN-SEQ.parquet (the answers: one row per prompt with id, line, \
text, reasoning, finish_reason, prompt_tokens, completion_tokens, model, server, attempts, latency_s), ledger/part-RUN-SEQ.json (each shard's commit record: its ids and \
lines), rejects.jsonl (bad input lines, with line numbers), failures.jsonl (prompts that failed every attempt, with the last error), report.json (this run's report, as \
--json prints it; `servefleet plan --check` reads it), progress.json (a snapshot every 2 s: `servefleet progress DEST` reads it from any terminal) and \
timeline/RUN_ID.json (the run's time series, bounded to 480 buckets per series: `servefleet report DEST` draws it). Every file and column: docs/output.md."""


def register(app: typer.Typer) -> None:
    short = "Send every prompt of --input to the ready servers and write the answers as sharded Parquet/JSONL; resumable, exactly once."
    app.command("generate", help=HELP, short_help=short)(generate)


def generate(
    input: Annotated[Path, typer.Option("--input", "-i", help="JSONL or Parquet file of prompts")],
    output: Annotated[
        str, typer.Option("--output", "-o", help="folder or s3://bucket/prefix for shards and the job manifest")
    ],
    fleet: Annotated[
        Path | None, typer.Option("--fleet", help="fleet file: use its ready servers, restart them when they die")
    ] = None,
    url: Annotated[list[str] | None, typer.Option("--url", help="OpenAI-compatible server (repeatable)")] = None,
    max_tokens: Annotated[
        int | None, typer.Option("--max-tokens", help="default max_tokens for records without one")
    ] = None,
    temperature: Annotated[
        float | None, typer.Option("--temperature", help="default temperature for records without one")
    ] = None,
    chat: Annotated[
        bool | None,
        typer.Option(
            "--chat/--completions", help="endpoint for 'prompt' records (default: messages->chat, prompt->completions)"
        ),
    ] = None,
    model: Annotated[
        str | None, typer.Option("--model", help="model name to request (default: each server's served model)")
    ] = None,
    concurrency: Annotated[
        str, typer.Option("--concurrency", help="requests in flight per server: auto or a number")
    ] = "auto",
    max_running: Annotated[
        int | None, typer.Option("--max-running", help="capacity hint for --url servers that do not report theirs")
    ] = None,
    bench: Annotated[
        list[Path] | None,
        typer.Option(
            "--bench",
            help="a `servefleet bench` RUN.json of these servers (repeatable): auto concurrency starts at its best point, then "
            "verifies by measured tokens/s",
        ),
    ] = None,
    hang_after: Annotated[
        float,
        typer.Option(
            "--hang-after",
            min=1.0,
            help="seconds without progress (server's token counters, our answers) with requests in flight before a "
            "server counts as hung, at least; grows to 3x the mean latency",
        ),
    ] = 60.0,
    give_up_after: Annotated[
        str,
        typer.Option(
            "--give-up-after",
            metavar="DURATION",
            help=(
                "how long a server that stopped answering (or a fleet server being restarted) may take to come back before it is given up for this run "
                "(90s, 10m, 1h; a plain number: seconds); with every server given up the job ends stalled (exit 2)"
            ),
        ),
    ] = "10m",
    max_restarts: Annotated[
        int | None,
        typer.Option(
            "--max-restarts",
            min=0,
            help="--fleet: restarts of one server within --restart-window before it is taken out "
            "for good (a crash loop) \\[default: the fleet file's max_restarts, 3]",
        ),
    ] = None,
    restart_window: Annotated[
        float | None,
        typer.Option(
            "--restart-window",
            min=1.0,
            help="--fleet: seconds of the sliding window --max-restarts counts in "
            "\\[default: the fleet file's restart_window, 600]",
        ),
    ] = None,
    max_attempts: Annotated[
        int, typer.Option("--max-attempts", min=1, help="attempts per prompt before it goes to failures.jsonl")
    ] = 5,
    backoff_base: Annotated[
        float, typer.Option("--backoff-base", min=0.0, help="seconds: retry n waits a random time below base*2^(n-1)")
    ] = 0.5,
    backoff_max: Annotated[
        float, typer.Option("--backoff-max", min=0.0, help="seconds: cap of one retry's wait")
    ] = 30.0,
    shard_rows: Annotated[int, typer.Option("--shard-rows", min=1, help="rows per shard")] = 1000,
    shard_seconds: Annotated[
        float, typer.Option("--shard-seconds", min=0.1, help="commit a partial shard after this long")
    ] = 60.0,
    shard_mb: Annotated[
        float, typer.Option("--shard-mb", min=0.001, help="commit a shard once its rows hold about this many MB")
    ] = 256.0,
    fmt: Annotated[str, typer.Option("--format", help="parquet (zstd) or jsonl")] = "parquet",
    token_ids: Annotated[
        bool, typer.Option("--token-ids", help="ask for output token ids (vLLM return_token_ids) and store them")
    ] = False,
    store_request: Annotated[bool, typer.Option("--store-request", help="store each request body in its row")] = False,
    request_timeout: Annotated[float, typer.Option("--request-timeout", help="seconds one request may take")] = 3600.0,
    strict: Annotated[
        bool, typer.Option("--strict", help="stop before sending anything if any input record is rejected")
    ] = False,
    force: Annotated[
        bool, typer.Option("--force", help="go on in a destination made with another input or parameters")
    ] = False,
    reask_changed: Annotated[
        bool,
        typer.Option(
            "--reask-changed",
            help="with --force: ask again the committed ids made with other "
            "parameters (--max-tokens, --temperature, ...) or whose input record changed "
            "(prompt or fields); their shards move to superseded/",
        ),
    ] = False,
    api_key: Annotated[
        str | None,
        typer.Option(
            "--api-key",
            envvar="SERVEFLEET_API_KEY",
            show_default=False,
            help="bearer token for the servers (env SERVEFLEET_API_KEY)",
        ),
    ] = None,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            "--metrics-port",
            min=0,
            max=65535,
            help="serve Prometheus metrics of the job on this port (/metrics: prompts done, tokens, "
            "errors, retries, per-server in flight, rate and concurrency limit); 0: any free "
            "port, named in the events",
        ),
    ] = None,
    metrics_host: Annotated[
        str, typer.Option("--metrics-host", help="address for --metrics-port (0.0.0.0 exposes it to the network)")
    ] = "127.0.0.1",
    detach: Annotated[
        bool,
        typer.Option(
            "--detach",
            help="run the job in a session of its own: it outlives this terminal or SSH session; returns once it "
            "is sending (or with its exit code if it ended first); follow it with `servefleet progress DEST -f`",
        ),
    ] = False,
    log: Annotated[Path, typer.Option("--log", help="with --detach: where the job's output goes (appended)")] = Path(
        "servefleet-generate.log"
    ),
    watch_interval: Annotated[
        float,
        typer.Option(
            "--watch-interval",
            min=0.05,
            help="--fleet: seconds between looks at the fleet while the job runs: a server that "
            "becomes ready joins (after up's verification), a dead one of a counted template "
            "(count = N) is replaced",
        ),
    ] = 5.0,
    release_tail: Annotated[
        bool,
        typer.Option(
            "--release-tail",
            help="--fleet: once the prompts left cannot keep every server busy, stop the servers "
            "the job would leave idle (their GPUs go back to the cluster)",
        ),
    ] = False,
    handover_margin: Annotated[
        str | None,
        typer.Option(
            "--handover-margin",
            metavar="DURATION",
            help=(
                "--fleet, Slurm servers with a time limit: once a job has less time left than its server took to get ready plus this margin, submit a "
                "successor job and hand the server over to it once it is ready (90s, 10m; must be shorter than the hosts' time limit)"
            ),
        ),
    ] = None,
    down_after: Annotated[
        bool,
        typer.Option(
            "--down-after", help="--fleet: stop the whole fleet (every job, every process) once the job is complete"
        ),
    ] = False,
    models: Annotated[
        str | None,
        typer.Option(
            "--models",
            metavar="A,B",
            help="send every record to each of these models (one row per (id, model)); "
            "each must be served by a server of the fleet (LoRA adapters count)",
        ),
    ] = None,
    logprobs: Annotated[
        int | None,
        typer.Option(
            "--logprobs",
            metavar="K",
            help="store each answer's token logprobs and the top K alternatives "
            "(0-20) as compact columns (token ids int32, logprobs float32)",
        ),
    ] = None,
    prompt_logprobs: Annotated[
        int | None,
        typer.Option(
            "--prompt-logprobs",
            metavar="K",
            help="store each prompt token's logprob and the top K "
            "alternatives (0-20) as compact columns (vLLM's prompt_logprobs)",
        ),
    ] = None,
    samples: Annotated[
        int | None,
        typer.Option(
            "--samples",
            metavar="K",
            help="K answers per record, one row per (id, sample) with a `sample` column; "
            "each sample's seed from (id, k)",
        ),
    ] = None,
    sample_mode: Annotated[
        str,
        typer.Option(
            "--sample-mode",
            help="--samples: n (one request of n=K: shared prefill), requests (K requests: spread "
            "over servers) or auto (n, unless fewer records than servers)",
        ),
    ] = "auto",
    max_failure_rate: Annotated[
        float | None,
        typer.Option(
            "--max-failure-rate",
            metavar="P",
            help="stop (exit 1, with examples and a hint) when more than this share "
            "(0-1) of answers failed: over the first --fail-fast-after answers, then a "
            "rolling window",
        ),
    ] = None,
    max_length_rate: Annotated[
        float | None,
        typer.Option(
            "--max-length-rate",
            metavar="P",
            help="the same for the share of answers cut at max_tokens (finish_reason=length)",
        ),
    ] = None,
    fail_fast_after: Annotated[
        int, typer.Option("--fail-fast-after", metavar="M", help="answers before the first fail-fast verdict")
    ] = 20,
    fail_fast_window: Annotated[
        int, typer.Option("--fail-fast-window", metavar="W", help="then judged over the last W answers")
    ] = 200,
    preview: Annotated[
        int | None,
        typer.Option(
            "--preview",
            metavar="N",
            help="send the first N records as the job would, show the requests and the answers "
            "(finish reason, tokens), commit nothing; exit 1 when one failed",
        ),
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="print the report as JSON")] = False,
) -> None:
    from pydantic import ValidationError
    from rich.console import Console

    from servefleet.cli.generate_view import ProgressView, render_report
    from servefleet.generate.health import HealthPolicy
    from servefleet.generate.job import JobParams
    from servefleet.generate.runner import GenerateConfig
    from servefleet.validation import option_error

    err = Console(stderr=True)
    if (fleet is None) == (not url):
        _fail(err, json_out, "give either --fleet FILE or --url URL (one or more)", ExitCode.USAGE)
    for flag, given in (
        ("--release-tail", release_tail),
        ("--down-after", down_after),
        ("--handover-margin", handover_margin is not None),
    ):
        if given and fleet is None:
            _fail(
                err,
                json_out,
                f"{flag}: only servers of a --fleet can be stopped; --url servers are not servefleet's to stop",
                ExitCode.USAGE,
            )
    margin_s = None if handover_margin is None else parse_duration(handover_margin)
    if handover_margin is not None:
        if margin_s is None or margin_s <= 0:
            _fail(
                err,
                json_out,
                f"--handover-margin {handover_margin!r}: expected a duration above 0 such as 90s or 10m",
                ExitCode.USAGE,
            )
        from servefleet.fleet.loader import load_fleet_file
        from servefleet.generate.handover import margin_problem

        if (
            fleet is not None
            and margin_s is not None
            and (problem := margin_problem(margin_s, load_fleet_file(fleet).hosts.values()))
        ):
            _fail(err, json_out, problem, ExitCode.USAGE)  # before anything is read, sent or submitted
    if fmt not in ("parquet", "jsonl"):
        _fail(err, json_out, f"--format {fmt!r}: expected parquet or jsonl", ExitCode.USAGE)
    conc: int | None = None
    if concurrency != "auto":
        try:
            conc = int(concurrency)
        except ValueError:
            conc = 0
        if conc < 1:  # not an assert: those are gone under `python -O`
            _fail(err, json_out, f"--concurrency {concurrency!r}: expected auto or a positive number", ExitCode.USAGE)
    give_up_s = parse_duration(give_up_after)
    if give_up_s is None or give_up_s <= 0:
        _fail(
            err,
            json_out,
            f"--give-up-after {give_up_after!r}: expected a duration above 0 such as 90s, 10m or 1h",
            ExitCode.USAGE,
        )
    mode = "auto" if chat is None else ("chat" if chat else "completions")
    model_list = tuple(m.strip() for m in (models or "").split(",") if m.strip()) or None
    if models is not None and (model_list is None or len(set(model_list)) != len(model_list)):
        _fail(err, json_out, f"--models {models!r}: expected distinct model names separated by commas", ExitCode.USAGE)
    if model_list and model:
        _fail(
            err,
            json_out,
            "--model and --models exclude each other: --models sends every record to each model",
            ExitCode.USAGE,
        )
    if logprobs is not None and not 0 <= logprobs <= 20:
        _fail(err, json_out, f"--logprobs {logprobs}: expected 0 to 20 alternatives per token", ExitCode.USAGE)
    if prompt_logprobs is not None and not 0 <= prompt_logprobs <= 20:
        _fail(
            err,
            json_out,
            f"--prompt-logprobs {prompt_logprobs}: expected 0 to 20 alternatives per prompt token",
            ExitCode.USAGE,
        )
    if samples is not None and samples < 1:
        _fail(err, json_out, f"--samples {samples}: expected at least 1 answer per record", ExitCode.USAGE)
    if sample_mode not in ("auto", "n", "requests"):
        _fail(err, json_out, f"--sample-mode {sample_mode!r}: expected auto, n or requests", ExitCode.USAGE)
    for flag, rate in (("--max-failure-rate", max_failure_rate), ("--max-length-rate", max_length_rate)):
        if rate is not None and not 0 <= rate < 1:
            _fail(
                err,
                json_out,
                f"{flag} {rate:g}: expected a share from 0 to below 1 (0.5: stop when more than half)",
                ExitCode.USAGE,
            )
    if fail_fast_after < 1 or fail_fast_window < 1:
        _fail(err, json_out, "--fail-fast-after and --fail-fast-window: expected at least 1 answer", ExitCode.USAGE)
    from servefleet.generate.failfast import FailFastPolicy

    try:
        config = GenerateConfig(
            input=str(input),
            output=output,
            urls=list(url or []),
            params=JobParams(
                model=model,
                max_tokens=max_tokens,
                temperature=temperature,
                mode=mode,
                token_ids=token_ids,
                store_request=store_request,
                format=fmt,
                samples=samples,
                models=model_list,
                logprobs=logprobs,
                prompt_logprobs=prompt_logprobs,
            ),
            concurrency=conc,
            max_running=max_running,
            bench=[str(b) for b in bench or []],
            health=HealthPolicy(hang_min_s=hang_after, recover_timeout_s=give_up_s),
            max_attempts=max_attempts,
            retry_base_s=backoff_base,
            retry_cap_s=backoff_max,
            shard_rows=shard_rows,
            shard_bytes=int(shard_mb * 2**20),
            shard_seconds=shard_seconds,
            strict=strict,
            force=force,
            reask_changed=reask_changed,
            request_timeout_s=request_timeout,
            api_key=api_key,
            metrics_host=metrics_host,
            metrics_port=metrics_port,
            fail_fast=FailFastPolicy(max_failure_rate, max_length_rate, fail_fast_after, fail_fast_window),
            sample_mode=sample_mode,
        )
    except ValidationError as exc:  # the model's own range checks, worded with the option names
        _fail(err, json_out, str(option_error(exc)), ExitCode.USAGE)
    if preview is not None:
        _preview(config, fleet, preview, json_out)
    if detach:
        _detach(output, log, json_out, err)
    progress = _SaysWhenSending(ProgressView(err))
    # a ConfigError (exit 3), an unreachable host (4) or another servefleet error (1) is reported by the root group
    elastic = _Elastic(watch_interval, release_tail, down_after, margin_s)
    report = asyncio.run(_run(config, fleet, progress, restart_limit=(max_restarts, restart_window), elastic=elastic))
    code = _exit_code(report.status)
    try:
        if json_out:
            from servefleet.cli.failure import outcome_document

            document = outcome_document(
                report.to_json(), exit_code=code, message=f"the job ended {report.status}", command="generate"
            )
            sys.stdout.write(json.dumps(document, indent=2) + "\n")
            sys.stdout.flush()
        else:
            render_report(report, Console())
    except OSError:  # the terminal closed under the run (SIGHUP): the report is at DEST, and the exit code stands
        _drop_stdout()
    raise typer.Exit(code)


def _preview(config, fleet_file: Path | None, n: int, json_out: bool) -> NoReturn:
    from rich.console import Console

    from servefleet.cli.generate_view import render_preview
    from servefleet.generate.preview import first_records, run_preview

    records = first_records(config.input, n, config.defaults())  # too few records: exit 3 before any server is asked

    async def go():
        if fleet_file is None:
            return await run_preview(config, n, records=records)
        from servefleet.fleet import Fleet
        from servefleet.generate.endpoints import targets_from_fleet

        async with Fleet.load(fleet_file) as fleet:
            targets = await targets_from_fleet(fleet)
            if not targets:
                raise ConfigError(f"no server of {fleet_file} is ready; start them with `servefleet up {fleet_file}`")
            return await run_preview(config, n, targets=targets, records=records)

    report = asyncio.run(go())
    code = ExitCode.OK if report.status == "preview" else ExitCode.FAILED
    if json_out:
        sys.stdout.write(json.dumps(report.to_json(), indent=2) + "\n")
    else:
        render_preview(report, Console())
    raise typer.Exit(code)


def _drop_stdout() -> None:
    """What is still buffered for a dead terminal goes nowhere (else the interpreter's last flush
    fails too and turns the exit code into 120)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def _detach(output: str, log: Path, json_out: bool, err) -> NoReturn:
    from servefleet.cli.detach import detach

    if not json_out:
        err.print(
            f"starting the job detached (output in {log.absolute()}); waiting until it sends",
            highlight=False,
            markup=False,
        )
    job = detach([a for a in sys.argv[1:] if a != "--detach"], str(log.absolute()))
    if not job.running:  # it ended before sending: its own exit code, and why
        sys.stderr.write(job.log_tail())
        raise typer.Exit(job.exit_code or 0)
    if json_out:
        sys.stdout.write(json.dumps({"detached": True, "pid": job.pid, "log": job.log, "destination": output}) + "\n")
    else:
        err.print(
            f"generate: running detached (pid {job.pid}), output in {job.log}\n"
            f"follow it: servefleet progress {output} -f\n"
            f"stop it (what is answered is committed): kill -TERM {job.pid}",
            highlight=False,
            markup=False,
        )
    raise typer.Exit(ExitCode.OK)


class _SaysWhenSending:
    """The progress view; once the job is sending, a detached job tells its parent (cli/detach.py)."""

    def __init__(self, view) -> None:
        self.view = view

    def phase(self, text: str) -> None:
        self.view.phase(text)

    def start(self, stats) -> None:
        from servefleet.cli.detach import say_ready

        self.view.start(stats)
        say_ready()

    async def stop(self) -> None:
        await self.view.stop()


@dataclass(frozen=True)
class _Elastic:
    """--fleet: the job's looks at the fleet (generate/membership.py) and what it stops."""

    interval_s: float = 5.0
    release_tail: bool = False
    down_after: bool = False
    handover_margin_s: float | None = None


async def _run(
    config,
    fleet_file: Path | None,
    progress,
    restart_limit: tuple[int | None, float | None] = (None, None),
    elastic: _Elastic | None = None,
):
    from dataclasses import replace

    from servefleet.generate.endpoints import targets_from_fleet
    from servefleet.generate.membership import ElasticRestarter
    from servefleet.generate.runner import run_generate

    elastic = elastic or _Elastic()

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal(sig: signal.Signals) -> None:
        stop.set()
        loop.remove_signal_handler(sig)  # a second signal takes the default way out
        with contextlib.suppress(OSError):  # SIGHUP: the terminal may be gone (EIO)
            progress.phase(f"{sig.name}: stopping; committing what is answered (again to abort)")

    # SIGHUP (the SSH session dropped, the terminal closed) ends the run as SIGTERM does: what is answered is committed
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        loop.add_signal_handler(sig, on_signal, sig)
    if fleet_file is None:
        return await run_generate(config, progress=progress, stop=stop)
    from servefleet.fleet import Fleet

    async with Fleet.load(fleet_file) as fleet:
        flags_max, flags_window = restart_limit  # a flag wins over the fleet file
        policy = replace(
            config.health,
            max_restarts=fleet.spec.max_restarts if flags_max is None else flags_max,
            restart_window_s=fleet.spec.restart_window if flags_window is None else flags_window,
        )
        config = config.model_copy(update={"health": policy})
        targets = await targets_from_fleet(fleet)
        if not targets:
            raise ConfigError(f"no server of {fleet_file} is ready; start them with `servefleet up {fleet_file}`")
        restarter = ElasticRestarter(
            fleet,
            interval_s=elastic.interval_s,
            release_tail=elastic.release_tail,
            handover_margin_s=elastic.handover_margin_s,
            max_restarts=policy.max_restarts,
            restart_window_s=policy.restart_window_s,
        )
        try:
            with restarter.recording(config.output, [t.name for t in targets]):  # `down` / `drain` read it
                report = await run_generate(config, targets=targets, restarter=restarter, progress=progress, stop=stop)
        finally:
            problems = await restarter.settle()  # servers released at the tail: stopped before we go
        notes = [*problems]
        if elastic.down_after and report.status == "complete":
            notes.append(_stopped_text(await restarter.down_all()))
        if notes:
            report.message = "; ".join(m for m in (report.message, *notes) if m)
        return report


def _stopped_text(results) -> str:
    failed = [f"{n} ({r.message})" for n, r in results.items() if not r.ok]
    done = f"--down-after: the fleet is stopped ({len(results) - len(failed)} servers)"
    return done + (f"; not stopped: {', '.join(failed)}" if failed else "")


_DURATION = re.compile(r"(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s?)?")


def parse_duration(text: str) -> float | None:
    """Seconds of ``90s``, ``10m``, ``1h30m`` or ``45`` (seconds); None when it is none of these."""
    m = _DURATION.fullmatch(text.strip().lower())
    if m is None or not any(m.groups()):
        return None
    h, mins, secs = (float(g) if g else 0.0 for g in m.groups())
    return 3600 * h + 60 * mins + secs


def _exit_code(status: str) -> int:
    return {
        "complete": ExitCode.OK,
        "incomplete": ExitCode.FAILED,
        "rejected": ExitCode.FAILED,
        "stalled": ExitCode.TIMEOUT,
        "interrupted": ExitCode.INTERRUPTED,
    }.get(status, ExitCode.FAILED)


def _fail(err: object, json_out: bool, message: str, code: int) -> NoReturn:
    """Raise the failure; the root group prints it (and, with --json, the JSON error document)."""
    raise CliFailure(kind_for_exit_code(code), message)
