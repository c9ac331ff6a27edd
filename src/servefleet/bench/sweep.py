"""One benchmark run of one server: discover it, build the workload, run every point.

``run_bench`` is the single entry point the CLI calls. Before any point it asks the server
what it is (``discovery.py``: ``/v1/models``, ``/version``, ``/server_info``, ``/metrics``), builds
prompts and encodes their bodies, and sends one *probe* request (``negotiate.py``) to learn which
request options the server accepts: continuous usage in streams (exact tokens per chunk),
``ignore_eos`` (controlled output lengths) — each dropped, with a note, if the server refuses it —
and whether it reports usage at all (if not, the text is kept and counted after each point). Then,
per point (``_measure_point``): scrape the server, warm up, scrape its latency histograms, run the
load (in-process or over worker processes), scrape again, and aggregate.

Non-streaming is the default (``BenchConfig.stream``): a batch job does not stream, and a server's
API process that sends one event per token can cap streaming far below what the engine generates
(H200, vLLM 0.26: 18-19k streamed against 28-34k tok/s). A non-streaming point's latencies come
from the engine's own histograms where its profile names them (``EngineProfile.latency_metrics``);
``--stream`` measures them at the client, for latency work.
"""

from __future__ import annotations

import datetime as _dt
import importlib.metadata
import json
import math
import os
import platform
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import psutil

from servefleet import __version__
from servefleet.bench.client import EndpointConfig, PreparedRequest, RequestRecord
from servefleet.bench.discovery import ServerFacts, discover
from servefleet.bench.errors import BenchError, ServerUnreachable
from servefleet.bench.histograms import first_histogram
from servefleet.bench.latency_sample import SAMPLE_REQUESTS, StreamedSample
from servefleet.bench.loadgen import ShareJob, split_share
from servefleet.bench.metrics import summarize
from servefleet.bench.negotiate import negotiate, requested_options
from servefleet.bench.pool import InProcessRunner, ProcessRunner, Runner, Share, loop_factory
from servefleet.bench.result import BenchConfig, Environment, Point, Run, ServerLatency, Stat, Target
from servefleet.bench.selfcheck import WorkerLoad, judge
from servefleet.bench.server_metrics import ServerWatcher, Snapshot, summarize_server
from servefleet.bench.steady import MIN_LIFETIMES, counter_rate
from servefleet.bench.workload import (
    LocalTokenizer,
    Prompt,
    TokenCounter,
    WordCounter,
    encode_bodies,
    find_server_tokenizer,
    load_dataset,
    random_prompts,
)
from servefleet.capacity import Capacity
from servefleet.engines.base import LatencyMetrics
from servefleet.engines.registry import info_paths, serving_metrics
from servefleet.errors import ConfigError, ServefleetError
from servefleet.http import HttpClient

__all__ = [
    "BenchTarget",
    "BenchError",
    "ServerUnreachable",
    "run_bench",
    "auto_workers",
    "MIN_PER_WORKER",
    "MAX_PROMPTS",
]

MIN_PER_WORKER = 32  # fewer concurrent requests than this per worker process is not worth a process
PER_WORKER = 64  # auto mode: one worker process per this many concurrent requests (one process
# streams ~1-2k req/s of 128 tokens before its core is full: benchmarks/client_overhead.py)
MAX_PROMPTS = 4096  # distinct prompts built per run; beyond that they are reused
WARMUP_MAX_TOKENS = 16
LENGTHEN_CAP = 4.0  # a --duration point too short for a steady part runs again at most this many times as long


@dataclass
class BenchTarget:
    base_url: str
    label: str | None = None
    model: str | None = None
    engine: str | None = None
    api_key: str | None = None
    capacity: Capacity | None = None  # already known (e.g. from a fleet's state)
    headers: dict[str, str] = field(default_factory=dict)


def auto_workers(max_concurrency: int, cpus: int | None = None) -> int:
    """Worker processes for a sweep: one per ``PER_WORKER`` concurrent requests, at most one per core."""
    cpus = cpus or os.cpu_count() or 1
    return max(1, min(cpus, math.ceil(max_concurrency / PER_WORKER)))


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


def _environment() -> Environment:
    factory = loop_factory()
    return Environment(
        servefleet_version=__version__,
        python=platform.python_version(),
        platform=platform.platform(),
        hostname=socket.gethostname(),
        cpu_count=os.cpu_count(),
        aiohttp_version=importlib.metadata.version("aiohttp"),
        event_loop="uvloop" if factory else "asyncio",
    )


def _shares(
    config: BenchConfig,
    level: int | float,
    workers: int,
    requests: list[PreparedRequest],
    warmup: list[PreparedRequest],
    point_index: int,
) -> list[Share]:
    rate_mode = config.mode == "rate"
    load = (config.max_concurrency or 256) if rate_mode else int(level)
    k = max(1, min(workers, load // MIN_PER_WORKER if load >= MIN_PER_WORKER else 1))
    conc = split_share(config.max_concurrency if rate_mode else int(level), k)
    counts = split_share(config.requests, k)
    warm_counts = split_share(len(warmup), k)
    shares = []
    w0 = 0
    for i in range(k):
        job = ShareJob(
            concurrency=conc[i],
            rate=(float(level) / k) if rate_mode else None,
            requests=counts[i],
            duration_s=config.duration_s,
            seed=config.seed * 1000 + point_index * 16 + i,
        )
        nwarm = warm_counts[i] or 0
        shares.append(
            Share(
                job=job,
                requests=requests[i::k],
                warmup=warmup[w0 : w0 + nwarm],
                warmup_concurrency=max(1, conc[i] or nwarm or 1),
            )
        )
        w0 += nwarm
    return shares


class _Notes:
    """The run's notes, each also passed to ``on_note`` as it comes."""

    def __init__(self, on_note: Callable[[str], None] | None) -> None:
        self.all: list[str] = []
        self._on_note = on_note

    def __call__(self, msg: str) -> None:
        self.all.append(msg)
        if self._on_note:
            self._on_note(msg)


@dataclass
class _Sweep:
    """Everything the points of one run share, settled before the first point."""

    config: BenchConfig  # as run: ignore_eos as accepted by the server
    levels: Sequence[int | float]
    per_point: int  # measured requests of each point
    warm_counts: list[int]  # warm-up requests of each point
    base: str
    server: ServerFacts
    counter: TokenCounter
    prompts: list[Prompt]
    endpoint: EndpointConfig
    options: dict[str, Any]
    bodies: list[PreparedRequest]
    note: _Notes
    latency_names: LatencyMetrics | None = None
    sample_bodies: list[PreparedRequest] = field(default_factory=list)
    use_sample: bool = False  # TTFT/TPOT from a streamed sample beside the load
    said_coarse: bool = False  # the note on percentiles the engine's buckets cannot place, given once


async def run_bench(
    target: BenchTarget,
    config: BenchConfig,
    *,
    tokenizer: str | None = None,
    on_point: Callable[[Point], None] | None = None,
    on_note: Callable[[str], None] | None = None,
) -> Run:
    """Run every point of ``config`` against ``target``; returns the whole run (not yet saved)."""
    note = _Notes(on_note)
    levels = _levels(config)
    headers = _headers(target)
    async with HttpClient(headers=headers) as client:
        server = await discover(client, target)
        sweep = await _prepare(client, target, config, levels, headers, server, tokenizer, note)
        watcher = ServerWatcher(sweep.base, client, info_paths=info_paths(server.engine))
        points = await _run_points(sweep, watcher, on_point)
    return _assemble(target, sweep, points)


def _levels(config: BenchConfig) -> Sequence[int | float]:
    levels: Sequence[int | float] = config.request_rates if config.mode == "rate" else config.concurrency
    if not levels:
        raise BenchError("no points: give --concurrency or --request-rate")
    if not config.requests and not config.duration_s:
        raise BenchError("give --requests N or --duration S per point")
    return levels


def _headers(target: BenchTarget) -> dict[str, str]:
    headers = dict(target.headers)
    if target.api_key:
        headers["Authorization"] = f"Bearer {target.api_key}"
    return headers


async def _prepare(
    client: HttpClient,
    target: BenchTarget,
    config: BenchConfig,
    levels: Sequence[int | float],
    headers: dict[str, str],
    server: ServerFacts,
    tokenizer: str | None,
    note: _Notes,
) -> _Sweep:
    """The workload and what the server accepts: prompts, the negotiated options, encoded bodies."""
    base = target.base_url.rstrip("/")
    counter = await _token_counter(client, base, server.model, server.engine, tokenizer, note)
    per_point = config.requests or max(256, 4 * int(config.max_concurrency or max(levels)))
    warm_counts = [_warmup_count(config, level) for level in levels]
    prompts = await _prompts(config, min(MAX_PROMPTS, len(levels) * per_point + sum(warm_counts)), counter)
    _check_context(prompts, server.capacity.context_length if server.capacity else None, base)

    api_path = "/v1/chat/completions" if config.api == "chat" else "/v1/completions"
    endpoint = EndpointConfig(
        base_url=base, path=api_path, stream=config.stream, headers=tuple(headers.items()), timeout_s=config.timeout_s
    )
    probe_body = encode_bodies(
        prompts[:1], api=config.api, model=server.model, stream=config.stream, options={}, max_tokens=4
    )[0]
    accepted = await negotiate(endpoint, json.loads(probe_body.body), requested_options(config, server.engine), note)
    if accepted.probe.completion_tokens is None:
        note("the server reports no token usage: output tokens are counted from the text after each point")
        endpoint = EndpointConfig(**{**endpoint.__dict__, "keep_text": True})
    elif config.stream and accepted.probe.chunk_tokens is None:
        note("no per-chunk usage in streams: tokens per chunk are shared out by text size (totals stay exact)")
    options = accepted.options
    sweep = _Sweep(
        config=config.model_copy(update={"ignore_eos": "ignore_eos" in options}),
        levels=levels,
        per_point=per_point,
        warm_counts=warm_counts,
        base=base,
        server=server,
        counter=counter,
        prompts=prompts,
        endpoint=endpoint,
        options=options,
        note=note,
        bodies=encode_bodies(prompts, api=config.api, model=server.model, stream=config.stream, options=options),
        latency_names=_latency_metrics(server.engine),
    )
    _plan_latency_sample(sweep)
    return sweep


def _check_context(prompts: list[Prompt], context: int | None, base: str) -> None:
    """Refuse, before any request, prompts whose input plus max_tokens pass the server's context: each
    would be refused (or cut short), and the sweep would take minutes to say so, blaming something else."""
    if not context:
        return
    over = [p for p in prompts if p.input_tokens is not None and p.input_tokens + p.output_tokens > context]
    if over:
        worst = max(over, key=lambda p: (p.input_tokens or 0) + p.output_tokens)
        raise ConfigError(
            f"{len(over):,} of {len(prompts):,} prompts do not fit the context of {base} ({context:,} tokens): "
            f"up to {worst.input_tokens:,} input + {worst.output_tokens:,} output tokens; lower --input-len "
            "or --output-len (with their --*-len-range) so that their sum stays within it"
        )


async def _token_counter(
    client: HttpClient, base: str, model: str | None, engine: str | None, tokenizer: str | None, note: _Notes
) -> TokenCounter:
    counter: TokenCounter
    if tokenizer:
        counter = LocalTokenizer(tokenizer)
    else:
        counter = await find_server_tokenizer(client, base, model, engine) or WordCounter()
    if not counter.exact:
        note("no /tokenize on the server and no --tokenizer: prompt lengths are approximate (words)")
    return counter


async def _prompts(config: BenchConfig, want: int, counter: TokenCounter) -> list[Prompt]:
    if config.dataset:
        return load_dataset(config.dataset, want, config.output_len, seed=config.seed)
    if not (config.input_len and config.output_len):
        raise BenchError("give --dataset, or --input-len and --output-len")
    return await random_prompts(
        want,
        config.input_len,
        config.output_len,
        counter,
        input_range=config.input_len_range,
        output_range=config.output_len_range,
        seed=config.seed,
    )


def _plan_latency_sample(sweep: _Sweep) -> None:
    """A non-streaming run on an engine without known latency histograms measures TTFT/TPOT from
    a few streamed requests sent one at a time beside each point's load."""
    config = sweep.config
    sweep.sample_bodies = encode_bodies(
        sweep.prompts[:SAMPLE_REQUESTS],
        api=config.api,
        model=sweep.server.model,
        stream=True,
        options={**sweep.options, "stream_options": {"include_usage": True}},
    )
    sweep.use_sample = not config.stream and sweep.latency_names is None
    if sweep.use_sample:
        sweep.note(
            f"engine {sweep.server.engine or 'unknown'} publishes no latency histograms servefleet knows: TTFT/TPOT of each "
            f"point from {SAMPLE_REQUESTS} streamed requests sent one at a time beside its load"
        )


def _runner(sweep: _Sweep) -> Runner:
    """In-process or over worker processes; one connection per concurrent request (0 = no cap:
    open loop without --max-concurrency)."""
    config = sweep.config
    max_load = int(config.max_concurrency or 0) if config.mode == "rate" else int(max(sweep.levels))
    workers = max(1, config.workers)
    if workers == 1:
        return InProcessRunner(sweep.endpoint, max_load)
    return ProcessRunner(sweep.endpoint, math.ceil(max_load / workers) + 1 if max_load else 0, workers)


async def _run_points(sweep: _Sweep, watcher: ServerWatcher, on_point: Callable[[Point], None] | None) -> list[Point]:
    """Every point in order, each on its own slice of the encoded bodies."""
    runner = _runner(sweep)
    points: list[Point] = []
    await runner.start()
    try:
        start = 0
        for index, level in enumerate(sweep.levels):
            warm_n = sweep.warm_counts[index]
            chunk = [sweep.bodies[(start + j) % len(sweep.bodies)] for j in range(sweep.per_point + warm_n)]
            start += sweep.per_point + warm_n
            point = await _measure_point(
                sweep,
                runner,
                watcher,
                index,
                level,
                warm=[_shorten(r) for r in chunk[:warm_n]],
                measured=chunk[warm_n:],
            )
            points.append(point)
            if on_point:
                on_point(point)
    finally:
        await runner.close()
    return points


@dataclass
class _Measured:
    """What one point's load and the scrapes around it gave, before aggregation."""

    records: list[RequestRecord]
    loads: list[WorkerLoad]  # per worker: its event-loop lag and CPU
    host_cpu: float
    before: Snapshot  # before the warm-up
    warm_metrics: dict[str, float]  # /metrics right after the warm-up
    samples: list[dict[str, float]]  # /metrics sampled during the load
    sample_times: list[float]
    after: Snapshot  # after the load
    sampled: list[RequestRecord]  # the streamed latency sample beside the load


async def _measure_point(
    sweep: _Sweep,
    runner: Runner,
    watcher: ServerWatcher,
    index: int,
    level: int | float,
    *,
    warm: list[PreparedRequest],
    measured: list[PreparedRequest],
) -> Point:
    """One point: scrape, warm up, scrape the histograms, run the load, scrape again, aggregate. A
    point of ``--duration`` whose steady part was under :data:`MIN_LIFETIMES` request lifetimes runs
    again, longer (at most :data:`LENGTHEN_CAP` x ``--duration``), and a note says so."""
    got = await _load_point(
        sweep, runner, watcher, _shares(sweep.config, level, runner.workers, measured, warm, index)
    )
    point = await _aggregate(sweep, level, got)
    longer = longer_duration(sweep.config, point)
    if longer is None:
        return point
    reason = point.steady.reason if point.steady is not None else "no steady part"
    sweep.note(
        f"C={point.concurrency}: {reason}: ran it again for {longer:.0f} s instead of {sweep.config.duration_s:g} s "
        f"(at most {LENGTHEN_CAP:g}x --duration)"
    )
    config = sweep.config.model_copy(update={"duration_s": longer})
    got = await _load_point(sweep, runner, watcher, _shares(config, level, runner.workers, measured, [], index))
    return await _aggregate(sweep, level, got)


def longer_duration(config: BenchConfig, point: Point) -> float | None:
    """How long to run a ``--duration`` point again whose steady part was too short (None: it was
    long enough, or it is not a duration point). The ramp lasts about one request lifetime (the
    first wave of answers), so the steady part needs ``MIN_LIFETIMES`` + 1 of them more than it had."""
    window = point.steady
    if config.duration_s is None or config.requests or window is None or window.steady:
        return None
    life = max(window.start_s, 0.1)  # the ramp: one lifetime of the first wave
    had = max(0.0, window.end_s - window.start_s)
    longer = min(LENGTHEN_CAP * config.duration_s, config.duration_s + (MIN_LIFETIMES + 1) * life - had)
    return longer if longer > config.duration_s * 1.05 else None


async def _load_point(sweep: _Sweep, runner: Runner, watcher: ServerWatcher, shares: list[Share]) -> _Measured:
    before = await watcher.scrape()
    warm_metrics: dict[str, float] = {}
    sample = StreamedSample(sweep.endpoint, sweep.sample_bodies) if sweep.use_sample else None

    async def after_warmup() -> None:
        warm_metrics.update(await watcher.scrape_metrics())
        psutil.cpu_percent(None)
        watcher.start_sampling()
        if sample is not None:
            sample.start()

    records, loads = await runner.run_point(shares, on_warm=after_warmup)
    sampled = await sample.stop() if sample is not None else []
    host_cpu = psutil.cpu_percent(None)
    samples = await watcher.stop_sampling()
    sample_times = list(watcher.sample_times)
    after = await watcher.scrape()
    return _Measured(records, loads, host_cpu, before, warm_metrics, samples, sample_times, after, sampled)


async def _aggregate(sweep: _Sweep, level: int | float, got: _Measured) -> Point:
    """The point's numbers: client-side metrics, the server's counters and histograms, the self-check."""
    config, records = sweep.config, got.records
    counted = await _count_texts(records, sweep.counter) if sweep.endpoint.keep_text and sweep.counter.exact else {}
    metrics = summarize(
        records,
        counted=(lambda r: counted.get(id(r))) if counted else None,
        concurrency=None if config.mode == "rate" else int(level),
    )
    capacity = sweep.server.capacity
    server = summarize_server(got.before, got.after, got.samples, capacity.max_running_requests if capacity else None)
    fields = metrics.fields()
    window = fields["steady"]
    if window is not None and records:
        t0 = min((r.start for r in records if r.ok and not r.warmup), default=0.0)  # as steady_window's
        gen = [
            (t, v)
            for t, v in zip(got.sample_times, (_gen_tokens(s) for s in got.samples), strict=True)
            if v is not None
        ]
        window.server_output_tokens_per_s = counter_rate(gen, t0 + window.start_s, t0 + window.end_s)
    server_latency = _server_latency(sweep.latency_names, got.warm_metrics, got.after.metrics)
    fields.update(
        _latencies(
            fields,
            server_latency,
            streamed=config.stream,
            sample=summarize(got.sampled).fields() if got.sampled else None,
        )
    )
    if not config.stream and server_latency is None and not sweep.use_sample:
        sweep.use_sample = True  # the profile names histograms this server does not publish
        sweep.note(
            f"no latency histograms on {sweep.base}/metrics: TTFT/TPOT of the next points from "
            f"{SAMPLE_REQUESTS} streamed requests beside the load"
        )
    coarse = _coarse(server_latency)
    if not config.stream and coarse and not sweep.use_sample and not sweep.said_coarse:
        # Not a streamed sample beside the load here: its requests would land in the same histograms and
        # counters, and the point's means and throughput would no longer be the measured requests' alone.
        sweep.said_coarse = True
        sweep.note(
            f"the engine's {', '.join(coarse)} histogram buckets are too coarse for their percentiles (they fell in "
            "the first or the open last bucket): means stay exact (sum/count), percentiles are shown as their "
            "bucket (<10, >2,500); --stream times every request on the client"
        )
    check = judge(got.loads, got.host_cpu)
    return Point(
        concurrency=(config.max_concurrency if config.mode == "rate" else int(level)),
        request_rate=float(level) if config.mode == "rate" else None,
        client_bound=bool(check.reasons),
        client=check,
        server=server,
        server_latency=server_latency,
        **fields,
    )


def _assemble(target: BenchTarget, sweep: _Sweep, points: list[Point]) -> Run:
    server, prompts = sweep.server, sweep.prompts
    return Run(
        created_at=_now(),
        target=Target(
            label=target.label or _label(sweep.base, server.model),
            base_url=sweep.base,
            model=server.model,
            engine=server.engine,
            engine_version=server.version,
        ),
        config=sweep.config.model_copy(update={"workers": max(1, sweep.config.workers)}),
        capacity=server.capacity,
        server_info=server.trimmed_info(),
        workload={
            "source": sweep.config.dataset or "random",
            "prompts": len(prompts),
            "input_tokens_counted_by": sweep.counter.name,
            "input_tokens_mean": _mean([p.input_tokens for p in prompts]),
            "output_tokens_requested_mean": _mean([p.output_tokens for p in prompts]),
            "request_options": sweep.options,
        },
        environment=_environment(),
        measured_mode="streaming" if sweep.config.stream else "non-streaming",
        points=points,
        notes=sweep.note.all,
    )


def _latency_metrics(engine: str | None) -> LatencyMetrics | None:
    """The engine profile's latency histogram names (None: unknown engine, or it has none)."""
    if not engine:
        return None
    try:
        from servefleet.engines.registry import get_engine

        return get_engine(engine).latency_metrics
    except ServefleetError:
        return None


def _gen_tokens(sample: dict[str, float]) -> float | None:
    for name in serving_metrics().generation_tokens:
        if name in sample:
            return sample[name]
    return None


def _server_latency(
    names: LatencyMetrics | None, warm: dict[str, float], after: dict[str, float]
) -> ServerLatency | None:
    """The engine's latency histograms over the measured requests (after warm-up .. after the point)."""
    if names is None or not after:
        return None
    out = ServerLatency()
    for key, candidates in (("ttft", names.ttft), ("tpot", names.tpot), ("itl", names.itl), ("e2e", names.e2e)):
        hist = first_histogram(after, candidates)
        if hist is None:
            continue
        got = hist.minus(first_histogram(warm, (hist.name,)))
        if got.count > 0:
            setattr(out, f"{key}_ms", got.stat())
            out.metrics[key] = hist.name
    return out if out.metrics else None


def _coarse(server: ServerLatency | None) -> list[str]:
    """The latencies whose percentiles the engine's histogram buckets could not place."""
    if server is None:
        return []
    return [
        key.upper()
        for key in ("ttft", "tpot", "itl")
        if (got := getattr(server, f"{key}_ms")) is not None and got.coarse
    ]


def _latencies(
    fields: dict[str, Any], server: ServerLatency | None, *, streamed: bool, sample: dict[str, Any] | None = None
) -> dict[str, Any]:
    """TTFT/TPOT/ITL of a point and where each came from: the client's own timing when it streamed,
    else the engine's histograms (TPOT from ITL's mean when the engine has no per-request TPOT;
    percentiles its buckets were too coarse for from the streamed sample when there is one), else a
    small streamed sample sent beside the load."""
    source: dict[str, str] = {}
    out: dict[str, Any] = {"latency_source": source}
    for key in ("ttft", "tpot", "itl"):
        client: Stat = fields[f"{key}_ms"]
        if streamed and client.n:
            source[key] = "client"
            continue
        if not streamed and server is None and sample is not None and sample[f"{key}_ms"].n:
            out[f"{key}_ms"] = sample[f"{key}_ms"]
            source[key] = f"client:streamed sample of {sample['successful']}"
            continue
        got = getattr(server, f"{key}_ms", None) if server is not None else None
        metric = server.metrics.get(key) if server is not None else None
        if got is None and key == "tpot" and server is not None and server.itl_ms is not None:
            got, metric = Stat(mean=server.itl_ms.mean, n=server.itl_ms.n), server.metrics["itl"] + " (mean)"
        timed: Stat | None = sample[f"{key}_ms"] if sample is not None else None
        if got is not None and got.coarse and timed is not None and timed.n:
            # the exact mean from the engine; the percentiles its buckets could not place, from client timing
            out[f"{key}_ms"] = got.model_copy(
                update={"p50": timed.p50, "p90": timed.p90, "p99": timed.p99, "resolution_ms": {}}
            )
            source[key] = f"server:{metric} (mean); client:streamed sample of {sample['successful']} (percentiles)"  # type: ignore[index]
        elif got is not None:
            out[f"{key}_ms"] = got
            source[key] = f"server:{metric}"
        else:
            source[key] = "none"
    return out


def _warmup_count(config: BenchConfig, level: int | float) -> int:
    """Warm-up requests of a point: as asked, else one per connection the point will use."""
    if config.warmup is not None:
        return config.warmup
    if config.mode == "rate":
        return min(int(config.max_concurrency or 16), 16)
    return int(level)


def _shorten(req: PreparedRequest) -> PreparedRequest:
    """A warm-up copy of a request with a small max_tokens: opens connections, costs little."""
    body = json.loads(req.body)
    body["max_tokens"] = min(body.get("max_tokens", WARMUP_MAX_TOKENS), WARMUP_MAX_TOKENS)
    return PreparedRequest(
        index=-1 - req.index,
        body=json.dumps(body, separators=(",", ":")).encode(),
        input_tokens=req.input_tokens,
        max_tokens=body["max_tokens"],
    )


async def _count_texts(records: list[RequestRecord], counter: TokenCounter) -> dict[int, int]:
    todo = [r for r in records if r.ok and r.completion_tokens is None and r.text is not None]
    if not todo:
        return {}
    counts = await counter.count([r.text or "" for r in todo])
    return {id(r): c for r, c in zip(todo, counts, strict=True)}


def _mean(values: list[int | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def _label(base_url: str, model: str | None) -> str:
    host = base_url.split("://", 1)[-1]
    return f"{model}@{host}" if model else host
