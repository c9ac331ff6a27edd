"""`generate` end to end: one async function the CLI (and tests, and benchmarks) call.

    report = await run_generate(GenerateConfig(input="prompts.jsonl", output="out/", urls=[...]))

Order of work, and why:

1. lock the destination, read its job manifest;
2. fingerprint + pre-pass the input (skipped when the manifest's pre-pass is for these very bytes:
   same size and mtime, or same SHA-256; same parameters) -- rejects file, duplicate ids, totals;
3. refuse a different job in the same destination unless ``force``; with ``strict``, stop here if
   anything was rejected -- nothing has been sent yet;
4. record the run in the manifest, discard leftovers of killed runs;
5. read the ledger: committed shards are done, nothing else is;
6. stream the rest of the input to the dispatcher; rows become shards as they come;
7. on the way out (also on interrupt): commit what is buffered, write failures and the manifest.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import json
import logging
import os
import resource
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, SecretStr

from servefleet.errors import ConfigError
from servefleet.generate.client import Client
from servefleet.generate.committer import CommitFailed, Committer
from servefleet.generate.dispatch import Dispatcher, RowSink, Ticket
from servefleet.generate.endpoints import Restarter, Target, targets_from_urls, with_bench
from servefleet.generate.failfast import FailFast, FailFastPolicy, Watched
from servefleet.generate.health import HealthPolicy
from servefleet.generate.inputs import (
    N_BESIDE_SAMPLES,
    PromptRecord,
    Reject,
    RequestDefaults,
    detect_kind,
    file_sha256,
    input_stat,
    iter_pending,
    parse_raw,
)
from servefleet.generate.job import JOB_FILE, InputInfo, JobManifest, JobParams, RunRecord, new_run_id, utcnow
from servefleet.generate.ledger import SHARDS_DIR, ContentIndex, DoneSet, Ledger
from servefleet.generate.logprobs import refuse_without_logprobs
from servefleet.generate.prepass import CHECK, SEND, SKIP, Prepass, max_tokens_warning, record_digest, run_prepass
from servefleet.generate.prompt_logprobs import refuse_without_prompt_logprobs
from servefleet.generate.provenance import collect
from servefleet.generate.recorder import PROGRESS_FILE, JobRecorder
from servefleet.generate.report import JobReport, build_report
from servefleet.generate.retry import RetryPolicy
from servefleet.generate.routing import check_routes, with_models
from servefleet.generate.samples import Groups, SampleMode, choose_mode, expanded
from servefleet.generate.shards import ShardBuffer, ShardLimits, shard_schema
from servefleet.generate.sinks import Sink, open_sink
from servefleet.generate.stats import JobStats
from servefleet.http import RequestFailure
from servefleet.stopping import until_stopped

if TYPE_CHECKING:
    from servefleet.generate.metrics import JobMetrics

__all__ = ["GenerateConfig", "run_generate", "JobMismatch", "Progress", "REJECTS_FILE", "FAILURES_FILE", "REPORT_FILE"]

log = logging.getLogger(__name__)

REJECTS_FILE = "rejects.jsonl"
FAILURES_FILE = "failures.jsonl"
REPORT_FILE = "report.json"


class JobMismatch(ConfigError):
    """The destination holds the output of another job (other input or parameters)."""


class Progress(Protocol):
    def phase(self, text: str) -> None: ...

    def start(self, stats: JobStats) -> None: ...

    async def stop(self) -> None: ...


class GenerateConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    input: str
    output: str
    urls: list[str] = Field(default_factory=list)
    params: JobParams = Field(default_factory=JobParams)
    concurrency: int | None = Field(default=None, ge=1)  # None: auto
    max_running: int | None = Field(default=None, ge=1)  # capacity hint for --url servers that do not report it
    bench: list[str] = Field(default_factory=list)  # bench runs (RUN.json) of these servers: start at their best point
    max_attempts: int = Field(default=5, ge=1)
    shard_rows: int = Field(default=1000, ge=1)
    shard_bytes: int = Field(default=256 << 20, ge=1)
    shard_seconds: float = Field(default=60.0, gt=0)
    strict: bool = False
    force: bool = False
    reask_changed: bool = False  # with force: ask again the ids committed with other parameters
    request_timeout_s: float = Field(default=3600.0, gt=0)
    api_key: SecretStr | None = None
    health: HealthPolicy = Field(default_factory=HealthPolicy)
    retry_base_s: float = Field(default=0.5, ge=0)
    retry_cap_s: float = Field(default=30.0, ge=0)
    metrics_host: str = "127.0.0.1"
    metrics_port: int | None = Field(None, ge=0, le=65535)  # Prometheus metrics of the job (metrics.py); None: none
    record_interval_s: float = Field(2.0, gt=0)  # progress.json every this often, the timeline every 5x (recorder.py)
    fail_fast: FailFastPolicy = Field(
        default_factory=FailFastPolicy
    )  # --max-failure-rate, --max-length-rate (failfast.py)
    sample_mode: SampleMode = "auto"  # --samples: n=K in one request, or K requests (samples.py)

    def defaults(self) -> RequestDefaults:
        p = self.params
        return RequestDefaults(
            max_tokens=p.max_tokens,
            temperature=p.temperature,
            mode=p.mode,
            token_ids=p.token_ids,
            samples=p.samples,
            logprobs=p.logprobs,
            prompt_logprobs=p.prompt_logprobs,
        )


async def run_generate(
    config: GenerateConfig,
    *,
    targets: list[Target] | None = None,
    restarter: Restarter | None = None,
    progress: Progress | None = None,
    stop: asyncio.Event | None = None,
) -> JobReport:
    """Run (or resume) the job. ``targets``: the servers (else ``config.urls`` are probed).
    ``stop``: set it to end the run early and cleanly (what is answered is committed)."""
    if not os.path.isfile(config.input):
        raise ConfigError(f"--input {config.input}: no such file")
    t_start = time.monotonic()
    with _metrics(config) as metrics:  # a port in use is refused before anything is read
        sink = open_sink(config.output)
        try:
            with sink.lock():
                return await _run_locked(config, sink, targets, restarter, progress, stop, t_start, metrics)
        finally:
            sink.close()


def _metrics(config: GenerateConfig) -> contextlib.AbstractContextManager[JobMetrics | None]:
    if config.metrics_port is None:
        return contextlib.nullcontext()
    from servefleet.generate.metrics import JobMetrics  # prometheus_client: only when asked for

    return JobMetrics(config.metrics_host, config.metrics_port)


async def _run_locked(
    config: GenerateConfig,
    sink: Sink,
    targets: list[Target] | None,
    restarter: Restarter | None,
    progress: Progress | None,
    stop: asyncio.Event | None,
    t_start: float,
    metrics: JobMetrics | None = None,
) -> JobReport:
    params = config.params
    base = {"destination": sink.url, "input": config.input}
    manifest = await _read_manifest(sink)
    if manifest is not None and manifest.params != params and not config.force:  # fail fast, before the pre-pass
        raise JobMismatch(_mismatch_text(sink, params.differences(manifest.params)))
    source = await _read_input(config, sink, manifest, progress)  # -- 2.
    info = source.info
    _refuse_another_job(config, sink, manifest, info)  # -- 3.
    if source.spool is not None:
        await asyncio.to_thread(sink.commit_file, source.spool, REJECTS_FILE)
    files = {"rejects": f"{sink.url}/{REJECTS_FILE}"} if info.rejected else {}
    if config.strict and info.rejected:
        return JobReport(
            status="rejected",
            total=info.valid,
            records=info.valid + info.rejected,
            rejected=info.rejected,
            duplicates=info.duplicates,
            files=files,
            message=f"--strict: {info.rejected} input records rejected (see {REJECTS_FILE}); nothing was sent",
            **base,
        )
    resumed = manifest is not None
    manifest, run = await _record_run(sink, manifest, info, params)  # -- 4.
    ledger = Ledger(sink, params.format, run.run_id, info.sha256)
    resume = await _what_is_done(config, ledger, manifest, source, progress)  # -- 5.
    _give_back_memory()  # the pre-pass's hashes are gone (the plan has what the feed needs)
    stats = _new_stats(info, resume)
    if metrics is not None:
        metrics.attach(stats)
        stats.event(f"metrics: http://{metrics.host}:{metrics.port}/metrics")
    # progress.json and the run's time series beside the shards (recorder.py); the bench runs let `report` check the plan
    recorder = JobRecorder(
        sink,
        stats,
        run_id=run.run_id,
        interval_s=config.record_interval_s,
        extra={"bench": [os.path.abspath(b) for b in config.bench]},
    )
    sent = _Sent()
    failures = _FailureLog(sink)
    failing: BaseException | None = None
    try:  # -- 6.
        sent = await _send(
            config,
            targets,
            restarter,
            progress,
            stop,
            stats,
            ledger,
            resume,
            failures,
            t_start,
            recorder,
            info.models,
            on_targets=partial(_record_provenance, sink, manifest, run),
        )
        status = _status(sent.outcome, stats)
    except BaseException as exc:
        run.status = "error"
        failing = exc
        raise
    finally:  # -- 7.
        try:
            await _finish_run(sink, manifest, run, resume, stats, failures, files, sent.outcome)
        except Exception as second:
            if failing is None:
                raise  # else the cause is on its way already (a full disk fails this too)
            # one line, no traceback: the user's error is the first one, said in full by the CLI
            log.warning("finishing the run record failed too, after %s: %s", type(failing).__name__, second)
            log.debug("the second failure", exc_info=True)
        finally:
            await recorder.finish(run.status)
            if recorder.writes:
                files.update(progress=f"{sink.url}/{PROGRESS_FILE}", timeline=f"{sink.url}/{recorder.timeline_rel}")
            if isinstance(failing, CommitFailed):  # the half-written shard and what else failed to be written
                with contextlib.suppress(Exception):
                    await asyncio.to_thread(sink.discard_partial)

    remaining = max(0, info.valid - resume.done_count - stats.committed)
    message = "; ".join(m for m in (sent.message, _rejects_message(info, files)) if m) or None
    report = build_report(
        stats,
        status=status,
        run_id=run.run_id,
        resumed=resumed,
        duplicates=info.duplicates,
        remaining=remaining,
        records=info.valid + info.rejected,
        startup_s=round(sent.startup_s, 3),
        peak_rss_mb=_peak_rss_mb(),
        files=files,
        message=message,
        **base,
    )
    # The last run's report beside the shards: `servefleet plan --check DEST` reads its timings.
    await asyncio.to_thread(sink.write_bytes, REPORT_FILE, json.dumps(report.to_json(), indent=1).encode())
    return report


@dataclass
class _Input:
    """What is known of the input: its fingerprint, and the pre-pass when one was run (or the
    rejected line numbers a resume took from the rejects file instead)."""

    info: InputInfo
    prepass: Prepass | None = None
    rejected_lines: list[int] | None = None
    spool: str | None = None  # the pre-pass's rejects, to be published as REJECTS_FILE


@dataclass
class _Resume:
    plan: bytearray
    done: DoneSet
    done_count: int


@dataclass
class _Sent:
    outcome: str = "complete"
    startup_s: float = 0.0
    message: str | None = None


async def _read_manifest(sink: Sink) -> JobManifest | None:
    raw = await asyncio.to_thread(sink.read_bytes, JOB_FILE)
    return JobManifest.from_bytes(raw) if raw else None


async def _read_input(
    config: GenerateConfig, sink: Sink, manifest: JobManifest | None, progress: Progress | None
) -> _Input:
    """The input's fingerprint; the pre-pass runs unless the manifest's pre-pass is for these very bytes."""
    params = config.params
    size, mtime_ns = input_stat(config.input)
    if manifest is not None and manifest.params == params and manifest.input.size == size:
        # The same file (size and mtime), or the same bytes (touched or copied: one hashing read,
        # no parsing): the pre-pass's verdicts stand -- rejects from the rejects file.
        same = (
            manifest.input.mtime_ns == mtime_ns
            or await asyncio.to_thread(file_sha256, config.input) == manifest.input.sha256
        )
        if same:
            rejected_lines = await asyncio.to_thread(_read_reject_lines, sink, manifest.input.rejected)
            if rejected_lines is not None:
                info = manifest.input.model_copy(update={"path": config.input, "mtime_ns": mtime_ns})
                return _Input(info, rejected_lines=rejected_lines)
    if progress:
        progress.phase(f"reading {config.input} (pre-pass: fingerprint, validation, duplicate ids)")
    spool = sink.new_staging_file(".jsonl")
    refused: list[int] = []
    prepass = await asyncio.to_thread(_prepass_to_file, config.input, config.defaults(), spool, refused)
    if refused:  # before anything of the destination is written
        os.remove(spool)
        raise ConfigError(
            f"--samples {params.samples}: {len(refused):,} records carry their own 'n' (lines "
            f"{', '.join(map(str, refused[:5]))}{', ...' if len(refused) > 5 else ''}); drop 'n' from them or drop --samples"
        )
    info = InputInfo(
        path=config.input,
        kind=detect_kind(config.input),
        size=prepass.size,
        mtime_ns=prepass.mtime_ns,
        sha256=prepass.sha256,
        lines=prepass.lines,
        valid=prepass.valid,
        rejected=prepass.rejected,
        duplicates=prepass.duplicates,
        unbounded=prepass.unbounded,
        models=prepass.models,
    )
    return _Input(info, prepass=prepass, spool=spool)


def _refuse_another_job(config: GenerateConfig, sink: Sink, manifest: JobManifest | None, info: InputInfo) -> None:
    if manifest is not None:
        problems = manifest.mismatch(info, config.params)
        if problems and not config.force:
            raise JobMismatch(_mismatch_text(sink, problems))


async def _record_run(
    sink: Sink, manifest: JobManifest | None, info: InputInfo, params: JobParams
) -> tuple[JobManifest, RunRecord]:
    """Discard leftovers of killed runs and add this run to the manifest."""
    await asyncio.to_thread(sink.discard_partial)
    run = RunRecord(
        run_id=new_run_id(), input_sha256=info.sha256, forced=bool(manifest and manifest.mismatch(info, params))
    )
    if manifest is None:
        manifest = JobManifest(input=info, params=params)
    manifest.mark_killed()
    for old in manifest.runs:  # runs recorded before runs kept their parameters ran with the manifest's
        if old.params is None:
            old.params = manifest.params
    run.params = params
    await asyncio.to_thread(sink.claim, run.run_id)
    manifest = manifest.model_copy(update={"input": info, "params": params, "runs": [*manifest.runs, run]})
    await asyncio.to_thread(sink.write_bytes, JOB_FILE, manifest.to_bytes())
    return manifest, run


async def _what_is_done(
    config: GenerateConfig, ledger: Ledger, manifest: JobManifest, source: _Input, progress: Progress | None
) -> _Resume:
    """Read the ledger and mark what committed shards answer in the plan of lines to send."""
    defaults = config.defaults()
    prepass = source.prepass
    changed = frozenset(r.run_id for r in manifest.runs if r.made_with_other_params(config.params))
    scan = partial(ledger.scan, changed_runs=changed, reask_changed=config.reask_changed)
    content = ContentIndex(prepass) if prepass is not None else None
    done = await asyncio.to_thread(
        partial(scan, content=content), manifest, prepass.collisions if prepass else frozenset()
    )
    if not done.by_line and prepass is None:
        # Shards from another input version (--force): match by id, which needs the pre-pass.
        if progress:
            progress.phase("matching committed ids against the input (pre-pass)")
        prepass = await asyncio.to_thread(run_prepass, config.input, defaults, lambda r: None)
        first = done
        done = await asyncio.to_thread(
            partial(scan, manifest, prepass.collisions, by_id=True, content=ContentIndex(prepass))
        )
        done.quarantined = first.quarantined + done.quarantined
        done.superseded += first.superseded
        done.changed += first.superseded
    plan = (
        prepass.plan() if prepass is not None else _plan_from_rejects(source.info.lines, source.rejected_lines or [])
    )
    done_count = done.apply(plan, prepass)
    source.prepass = None
    done.release()
    return _Resume(plan, done, done_count)


def _new_stats(info: InputInfo, resume: _Resume) -> JobStats:
    stats = JobStats(total=info.valid, done_before=resume.done_count, rejected=info.rejected)
    stats.to_send = max(0, info.valid - resume.done_count)
    if (warning := max_tokens_warning(info.unbounded, info.valid)) is not None:
        stats.event(warning)
    if resume.done.rebuilt:
        stats.event(f"ledger: rebuilt {resume.done.rebuilt} entries of shards committed just before a crash")
    for line in resume.done.quarantined:
        stats.event(f"ledger: damaged shard {line}")
    if resume.done.superseded:
        stats.event(
            f"ledger: {resume.done.superseded:,} committed ids were made with other parameters: their shards moved to "
            "superseded/, asked again (--reask-changed)"
        )
    elif resume.done.changed:
        stats.event(
            f"ledger: {resume.done.changed:,} committed ids were made with other parameters than this run's and are kept "
            "(--reask-changed asks them again)"
        )
    if resume.done.content_superseded:
        stats.event(
            f"ledger: {resume.done.content_changed:,} committed ids now have different content (prompt or fields changed): "
            f"their shards ({resume.done.content_superseded:,} ids) moved to superseded/, asked again (--reask-changed)"
        )
    elif resume.done.content_changed:
        stats.event(
            f"ledger: {resume.done.content_changed:,} committed ids now have different content (prompt or fields changed) "
            "and are kept (--reask-changed asks them again)"
        )
    if resume.done.duplicates:
        stats.event(
            f"ledger: {resume.done.duplicates:,} ids are committed more than once (two runs wrote this destination "
            "at the same time); readers should keep one row per id"
        )
    raised = raise_open_files_limit()
    if raised:
        stats.event(
            f"open-file limit raised from {raised[0]:,} to {raised[1]:,} (one connection per request in flight)"
        )
    return stats


class _FailureLog:
    """failures.jsonl of this run, written to staging as failures happen, published at the end."""

    def __init__(self, sink: Sink) -> None:
        self.path = sink.new_staging_file(".jsonl")
        self.file = open(self.path, "w", encoding="utf-8")

    def write(self, ticket: Ticket, failure: RequestFailure) -> None:
        r = ticket.record
        self.file.write(
            json.dumps(
                {
                    "id": r.id,
                    "line": r.line,
                    "attempts": ticket.attempts,
                    "server": ticket.last_server,
                    "error": failure.describe(),
                    "retryable": failure.retryable,
                    "time": utcnow(),
                    **({"sample": r.sample} if r.sample is not None else {}),
                }
            )
            + "\n"
        )

    def close(self) -> None:
        self.file.close()


async def _send(
    config: GenerateConfig,
    targets: list[Target] | None,
    restarter: Restarter | None,
    progress: Progress | None,
    stop: asyncio.Event | None,
    stats: JobStats,
    ledger: Ledger,
    resume: _Resume,
    failures: _FailureLog,
    t_start: float,
    recorder: JobRecorder,
    ledger_models: dict[str, int] | None = None,
    on_targets: Callable[[list[Target], Client], Awaitable[None]] | None = None,
) -> _Sent:
    """Send what is not done over every server until it is answered, failed, or the run is stopped."""
    sent = _Sent()
    if stats.to_send <= 0:
        return sent
    params = config.params
    async with Client(
        request_timeout_s=config.request_timeout_s,
        logprobs_k=params.logprobs,
        prompt_logprobs_k=params.prompt_logprobs,
        api_key=config.api_key.get_secret_value() if config.api_key else None,
    ) as client:
        if targets is None:
            targets = await targets_from_urls(config.urls, client, config.max_running)
        if not targets:
            raise ConfigError("no ready servers: give --url URL or a --fleet with ready servers")
        targets = with_bench(targets, config.bench)
        targets = await with_models(targets, client)
        routed = check_routes(targets, ledger_models or {}, job_model=params.model, models=params.models)
        if on_targets is not None:
            await on_targets(targets, client)
        planned = sum(config.concurrency or t.max_running or 0 for t in targets)
        if (warning := open_files_warning(planned)) is not None:
            stats.event(warning)
        if params.logprobs is not None:
            await refuse_without_logprobs(
                targets,
                client,
                "chat" if params.mode == "chat" else "completions",
                params.logprobs,
                params.model or (params.models[0] if params.models else None),
            )
        if params.prompt_logprobs is not None:
            await refuse_without_prompt_logprobs(
                targets,
                client,
                "chat" if params.mode == "chat" else "completions",
                params.prompt_logprobs,
                params.model or (params.models[0] if params.models else None),
            )
        buffer = ShardBuffer(
            shard_schema(
                params.token_ids,
                params.store_request,
                samples=params.samples is not None,
                logprobs_k=params.logprobs,
                prompt_logprobs_k=params.prompt_logprobs,
            ),
            ShardLimits(config.shard_rows, config.shard_bytes, config.shard_seconds),
        )
        committer = Committer(ledger, buffer, stats)
        mode = choose_mode(config.sample_mode, records=stats.to_send, servers=len(targets))
        out, on_failure = _outcomes(config, committer, failures, stats, mode)
        watch = FailFast(config.fail_fast)
        if config.fail_fast.active:
            watched = Watched(out, on_failure, watch)
            out, on_failure = watched, watched.on_failure
        dispatcher = Dispatcher(
            targets,
            client=client,
            out=out,
            on_failure=on_failure,
            stats=stats,
            retry=RetryPolicy(config.max_attempts, config.retry_base_s, config.retry_cap_s),
            health=config.health,
            concurrency=config.concurrency,
            model=params.model,
            routed=routed,
            store_request=params.store_request,
            restarter=restarter,
        )
        sent.startup_s = time.monotonic() - t_start
        stats.started = time.monotonic()
        committer.start()
        recorder.start()
        if progress:
            progress.start(stats)
        try:
            with fewer_collections():
                feed = _feed(config.input, resume.plan, config.defaults(), resume.done, ledger.pending_digests)
                if params.samples is not None or params.models:
                    feed = expanded(feed, params.samples, mode, params.models)
                async with _first_of(
                    stop, committer.broken, watch.tripped
                ) as halt:  # a commit that failed for good ends the run at once
                    stopped, outcome = await until_stopped(dispatcher.run(feed), halt)
                if outcome is not None:
                    sent.outcome = outcome
            sent.outcome = "interrupted" if stopped else sent.outcome
            if watch.tripped.is_set():
                sent.outcome, sent.message = "failed_fast", watch.message()
        except Exception:
            if committer.error is None:
                raise  # else the dispatcher only saw the committer stop: the commit's error is the cause
            log.debug("the dispatcher stopped after the failed commit", exc_info=True)
        finally:
            with contextlib.suppress(Exception):
                if progress:
                    await progress.stop()
            await committer.close()
        if committer.error is not None:
            error = committer.error
            if not isinstance(error, OSError):
                raise error
            raise CommitFailed(
                ledger.sink.url,
                error.filename or committer.failed_shard,
                error,
                uncommitted=stats.done - stats.committed,
                committed=stats.committed,
            ) from error
    if sent.outcome == "stalled":
        sent.message = (
            f"no server left to send to: each was given up (not back within --give-up-after {config.health.recover_timeout_s:g}s, "
            "or its restarts failed: see the events); run the same command again when servers are ready"
        )
    return sent


async def _record_provenance(
    sink: Sink, manifest: JobManifest, run: RunRecord, targets: list[Target], client: Client
) -> None:
    """This run's servers in job.json before the first request (a killed run keeps them too)."""
    run.provenance = await collect(targets, client)
    await asyncio.to_thread(sink.write_bytes, JOB_FILE, manifest.to_bytes())


def _outcomes(
    config: GenerateConfig,
    committer: Committer,
    failures: _FailureLog,
    stats: JobStats,
    mode: Literal["n", "requests"],
) -> tuple[RowSink, Callable[[Ticket, RequestFailure], None]]:
    """Where the dispatcher's rows and final failures go: with several rows per id, through :class:`Groups`
    (an id's rows are committed together); each request of K counts in the progress."""
    samples, models = config.params.samples, len(config.params.models or ()) or 1
    per_id = (samples or 1) * models
    if per_id == 1:
        return committer, failures.write
    stats.to_send *= models * (samples or 1 if mode == "requests" else 1)
    groups = Groups(committer, failures.write, per_id)
    if samples is not None:
        stats.event(
            f"--samples {samples}: {mode} mode ({'one request of n=K per id' if mode == 'n' else 'K requests per id'})"
        )
    return groups, groups.on_failure


@contextlib.asynccontextmanager
async def _first_of(*events: asyncio.Event | None) -> AsyncIterator[asyncio.Event]:
    """An event that is set as soon as any of ``events`` is."""
    first = asyncio.Event()

    async def relay(event: asyncio.Event) -> None:
        await event.wait()
        first.set()

    relays = [asyncio.ensure_future(relay(e)) for e in events if e is not None]
    try:
        yield first
    finally:
        for task in relays:
            task.cancel()
        await asyncio.gather(*relays, return_exceptions=True)


async def _finish_run(
    sink: Sink,
    manifest: JobManifest,
    run: RunRecord,
    resume: _Resume,
    stats: JobStats,
    failures: _FailureLog,
    files: dict[str, str],
    outcome: str,
) -> None:
    """Publish failures.jsonl (or remove a stale one) and the run's end in the manifest."""
    failures.close()
    if stats.failed:
        await asyncio.to_thread(sink.commit_file, failures.path, FAILURES_FILE)
        files["failures"] = f"{sink.url}/{FAILURES_FILE}"
    else:
        os.remove(failures.path)
        await asyncio.to_thread(sink.remove, FAILURES_FILE)
    run.finished = utcnow()
    run.status = run.status if run.status == "error" else _status(outcome, stats)
    run.done_before, run.done, run.failed = resume.done_count, stats.committed, stats.failed
    sizes = await asyncio.to_thread(sink.sizes, SHARDS_DIR)  # what readers check the shards against (damage)
    manifest = manifest.model_copy(
        update={
            "shards": resume.done.shards + stats.shards,
            "rows": resume.done.rows + stats.committed,
            "shard_bytes": sum(sizes.values()),
        }
    )
    await asyncio.to_thread(sink.write_bytes, JOB_FILE, manifest.to_bytes())


def _rejects_message(info: InputInfo, files: dict[str, str]) -> str | None:
    if not info.rejected:
        return None
    return (
        f"{info.rejected:,} of {info.valid + info.rejected:,} input records rejected, never sent (see {files['rejects']}); "
        "fix them in the input and run again"
    )


def _mismatch_text(sink: Sink, problems: list[str]) -> str:
    return (
        f"{sink.url} holds another job: "
        + "; ".join(problems)
        + ". Use another --output, or --force to keep its committed ids and go on with these settings."
    )


def _status(outcome: str, stats: JobStats) -> str:
    if outcome in ("stalled", "interrupted", "failed_fast"):
        return outcome
    # a rejected record is an input record without an answer: the job is not complete (exit 1)
    return "complete" if stats.failed == 0 and stats.rejected == 0 else "incomplete"


async def _feed(
    path: str, plan: bytearray, defaults: RequestDefaults, done: DoneSet, digests: dict[int, int], chunk: int = 256
) -> AsyncIterator[PromptRecord]:
    """The records still to send, parsed in a worker thread a chunk at a time; ``digests`` gets each one's
    content digest by line (the ledger entry that commits its answer keeps it)."""
    raw_iter = iter_pending(path, plan, SKIP)
    n = len(plan)

    def next_chunk() -> list[PromptRecord]:
        out: list[PromptRecord] = []
        for line, raw in raw_iter:
            code = plan[line - 1] if line <= n else SEND
            rec = parse_raw(line, raw, defaults)
            if not isinstance(rec, PromptRecord):
                continue
            if code == CHECK and done.is_done_exact(rec.id):
                continue
            digests[line] = record_digest(raw)
            out.append(rec)
            if len(out) >= chunk:
                break
        return out

    while batch := await asyncio.to_thread(next_chunk):
        for rec in batch:
            yield rec


def _prepass_to_file(path: str, defaults: RequestDefaults, spool: str, refused: list[int] | None = None) -> Prepass:
    """``refused``: gets the lines whose reject refuses the whole job (a record's own n beside --samples)."""
    with open(spool, "w", encoding="utf-8") as f:

        def on_reject(r: Reject) -> None:
            if refused is not None and r.reason.startswith(N_BESIDE_SAMPLES):
                refused.append(r.line)
            f.write(json.dumps(r.to_json(), ensure_ascii=False) + "\n")

        return run_prepass(path, defaults, on_reject)


def _read_reject_lines(sink: Sink, expected: int) -> list[int] | None:
    """Line numbers from the rejects file, or None when it does not match the manifest."""
    data = sink.read_bytes(REJECTS_FILE) if expected else b""
    if data is None:
        return None
    lines = [json.loads(raw)["line"] for raw in data.splitlines() if raw.strip()]
    return lines if len(lines) == expected else None


def _plan_from_rejects(total_lines: int, rejected: list[int]) -> bytearray:
    plan = bytearray(total_lines)  # SEND == 0
    for line in rejected:
        if 1 <= line <= total_lines:
            plan[line - 1] = SKIP
    return plan


def _give_back_memory() -> None:
    """Return what resume planning freed to the OS before the long run (glibc keeps freed heap
    pages otherwise; elsewhere this is a no-op)."""
    gc.collect()
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6").malloc_trim(0)


def raise_open_files_limit(cap: int = 1 << 20) -> tuple[int, int] | None:
    """Soft RLIMIT_NOFILE up to the hard limit: every request in flight holds a connection, and
    the usual soft limit (1,024) would fail connects ("Too many open files") far below the
    concurrency of a few GPU servers. Returns (before, after) when it changed anything."""
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        target = cap if hard == resource.RLIM_INFINITY else min(hard, cap)
        if soft != resource.RLIM_INFINITY and soft < target:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            return soft, target
    except (ValueError, OSError):  # not allowed here: the job runs with the limit it has
        pass
    return None


FILES_RESERVE = 256  # descriptors kept for shards, logs, the event loop, probes


def open_files_warning(planned_in_flight: int, soft_limit: int | None = None) -> str | None:
    """A warning when the requests planned in flight (one socket each) do not fit the open-file
    limit: connects past it fail with "Too many open files", which looks like a dead server."""
    if soft_limit is None:
        soft_limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft_limit == resource.RLIM_INFINITY or planned_in_flight <= soft_limit - FILES_RESERVE:
        return None
    return (
        f"open-file limit {soft_limit:,} is below the {planned_in_flight:,} requests planned in flight (one socket each): "
        f"past ~{max(0, soft_limit - FILES_RESERVE):,} connects fail; raise the hard limit (`ulimit -Hn`, LimitNOFILE=) "
        "or give a lower --concurrency"
    )


# Cyclic GC while requests are in flight: each young-generation pass walks every live request's
# objects (tasks, responses, connections, waiting tickets), and with thousands in flight that was
# ~40 % of the coordinator's CPU (benchmarks/coordinator_ceiling.py, 8,192 in flight: 0.35 ->
# 0.21 ms per completion). Far fewer passes, and none over what start-up left (frozen), instead.
GC_THRESHOLDS = (50_000, 50, 100)
_gc_users: list[tuple[int, ...]] = []  # thresholds to restore, one per run in this process


@contextlib.contextmanager
def fewer_collections(thresholds: tuple[int, int, int] = GC_THRESHOLDS) -> Iterator[None]:
    """Run the block with rarer cyclic collections, start-up's objects frozen; the settings of
    before come back when the last such block in this process ends (runs may overlap in tests)."""
    if not _gc_users:
        gc.freeze()
    _gc_users.append(gc.get_threshold())
    gc.set_threshold(*thresholds)
    try:
        yield
    finally:
        before = _gc_users.pop()
        if not _gc_users:
            gc.set_threshold(*before)
            gc.unfreeze()


def _peak_rss_mb() -> float:
    """Peak resident memory of this process. On Linux from VmHWM: ``ru_maxrss`` also counts the
    parent's memory when the parent started us with vfork+exec (CPython's subprocess does)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return round(rss / (1024 * 1024) if sys.platform == "darwin" else rss / 1024, 1)
