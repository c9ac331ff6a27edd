"""One benchmark run of one server: discover it, build the workload, run every point.

``run_bench`` is the single entry point the CLI calls. Before any point it asks the server
what it is (``/v1/models``, ``/version``, ``/server_info``, ``/metrics``), builds prompts and
encodes their bodies, and sends one *probe* request to learn which request options the server
accepts: continuous usage in streams (exact tokens per chunk), ``ignore_eos`` (controlled output
lengths) — each dropped, with a note, if the server refuses it — and whether it reports usage
at all (if not, the text is kept and counted after each point). Then, per point: scrape the
server, warm up, scrape its latency histograms, run the load (in-process or over worker
processes), scrape again, and aggregate.

Non-streaming is the default (``BenchConfig.stream``): a batch job does not stream, and a server's
API process that sends one event per token can cap streaming far below what the engine generates
(H200, vLLM 0.26: 18-19k streamed against 28-34k tok/s). A non-streaming point's latencies come
from the engine's own histograms where its profile names them (``EngineProfile.latency_metrics``);
``--stream`` measures them at the client, for latency work.
"""

from __future__ import annotations

import asyncio
import datetime as _dt
import json
import math
import os
import platform
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import psutil

from servefleet import __version__
from servefleet.bench.client import EndpointConfig, OpenAIBackend, PreparedRequest, RequestRecord
from servefleet.bench.histograms import first_histogram
from servefleet.bench.latency_sample import SAMPLE_REQUESTS, StreamedSample
from servefleet.bench.loadgen import ShareJob, split_share
from servefleet.bench.metrics import summarize
from servefleet.bench.pool import InProcessRunner, ProcessRunner, Runner, Share, loop_factory
from servefleet.bench.result import BenchConfig, Environment, Point, Run, ServerLatency, Stat, Target
from servefleet.bench.selfcheck import judge
from servefleet.bench.server_metrics import GEN_TOKENS, ServerWatcher, fetch_server_info, summarize_server
from servefleet.bench.steady import counter_rate
from servefleet.bench.workload import (
    LocalTokenizer, Prompt, TokenCounter, WordCounter, encode_bodies, find_server_tokenizer, load_dataset,
    random_prompts,
)
from servefleet.capacity import Capacity
from servefleet.engines.base import LatencyMetrics
from servefleet.errors import ServefleetError

__all__ = ["BenchTarget", "BenchError", "ServerUnreachable", "run_bench", "auto_workers", "MIN_PER_WORKER", "MAX_PROMPTS"]

MIN_PER_WORKER = 32  # fewer concurrent requests than this per worker process is not worth a process
PER_WORKER = 64  # auto mode: one worker process per this many concurrent requests (one process
# streams ~1-2k req/s of 128 tokens before its core is full: benchmarks/client_overhead.py)
MAX_PROMPTS = 4096  # distinct prompts built per run; beyond that they are reused
WARMUP_MAX_TOKENS = 16
PROBE_RETRIES = 5


class BenchError(ServefleetError):
    """The benchmark could not run (the server refused every form of request, ...)."""


class ServerUnreachable(BenchError):
    """Nothing answered at the target URL."""


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
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _environment() -> Environment:
    factory = loop_factory()
    return Environment(
        servefleet_version=__version__, python=platform.python_version(), platform=platform.platform(),
        hostname=socket.gethostname(), cpu_count=os.cpu_count(), aiohttp_version=aiohttp.__version__,
        event_loop="uvloop" if factory else "asyncio",
    )


async def _get_json(session: aiohttp.ClientSession, url: str) -> Any:
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=10)) as resp:
            if resp.status != 200:
                return None
            return await resp.json(content_type=None)
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
        return None


async def _discover(session: aiohttp.ClientSession, target: BenchTarget) -> tuple[str | None, str | None, str | None, dict]:
    """(model, engine, engine_version, server_info) from the server's own endpoints."""
    base = target.base_url.rstrip("/")
    try:
        async with session.get(base + "/v1/models", timeout=aiohttp.ClientTimeout(total=10)) as resp:
            models = await resp.json(content_type=None) if resp.status == 200 else None
    except (aiohttp.ClientConnectorError, asyncio.TimeoutError) as exc:
        raise ServerUnreachable(f"{base}: no answer ({exc or type(exc).__name__})") from exc
    except (aiohttp.ClientError, ValueError):
        models = None
    model = target.model
    owner = None
    if isinstance(models, dict) and models.get("data"):
        first = models["data"][0]
        if model is None:
            model = first.get("id")
        owner = str(first.get("owned_by") or "").lower()
    info = await fetch_server_info(session, base) or {}
    engine, version = target.engine, None
    metrics_text = ""
    try:
        async with session.get(base + "/metrics", timeout=aiohttp.ClientTimeout(total=10)) as resp:
            if resp.status == 200:
                metrics_text = await resp.text()
    except (aiohttp.ClientError, asyncio.TimeoutError, UnicodeDecodeError):
        pass
    if engine is None:
        if owner in ("vllm", "sglang", "llamacpp", "tgi"):  # /v1/models says whose it is
            engine = owner
        elif info and ("internal_states" in info or "max_total_num_tokens" in info):
            engine = "sglang"
        elif "vllm:" in metrics_text:
            engine = "vllm"
        elif "sglang:" in metrics_text:
            engine = "sglang"
        elif "llamacpp:" in metrics_text:
            engine = "llamacpp"
        elif "tgi_" in metrics_text:
            engine = "tgi"
    if info.get("version"):
        version = str(info["version"])
    else:
        got = await _get_json(session, base + "/version")
        if isinstance(got, dict) and got.get("version"):
            version = str(got["version"])
    return model, engine, version, info


async def _capacity(session: aiohttp.ClientSession, target: BenchTarget, engine: str | None) -> Capacity | None:
    cap = target.capacity
    if engine:
        try:
            from servefleet.engines.registry import get_engine  # noqa: PLC0415 - engines load lazily

            found = await get_engine(engine).capacity_from_server(session, target.base_url.rstrip("/"))
        except Exception:  # noqa: BLE001 - capacity is a nice-to-have; never fail a bench on it
            found = None
        if found is not None and not found.is_empty():
            cap = found if cap is None else cap.merge(found)
    return cap


def _trim_info(info: dict[str, Any]) -> dict[str, Any]:
    keep = ("version", "model_path", "served_model_name", "max_total_num_tokens", "max_running_requests",
            "context_length", "speculative_algorithm", "speculative_num_steps", "speculative_num_draft_tokens",
            "tp_size", "dp_size", "chunked_prefill_size", "mem_fraction_static", "internal_states")
    return {k: info[k] for k in keep if k in info}


async def _probe(endpoint: EndpointConfig, body: dict[str, Any], options: dict[str, Any],
                 note: Callable[[str], None]) -> tuple[dict[str, Any], RequestRecord]:
    """Send one short request, dropping options the server refuses; returns the accepted options."""
    opts = dict(options)
    drops = [("stream_options", "continuous_usage_stats"), ("ignore_eos", None), ("stream_options", None)]
    backend = OpenAIBackend(endpoint)
    await backend.open(1)
    transient = 0
    try:
        while True:
            req = PreparedRequest(index=-1, body=json.dumps({**body, **opts}).encode(), input_tokens=None, max_tokens=body["max_tokens"])
            rec = await backend.send(req)
            if rec.ok:
                return opts, rec
            if rec.error_kind == "connection":
                raise ServerUnreachable(f"{endpoint.base_url}: {rec.error}")
            if rec.error_kind in ("server_error", "rate_limited", "disconnected") and transient < PROBE_RETRIES:
                transient += 1  # a server that fails some requests (the sweep counts those) may pass
                await asyncio.sleep(0.05 * transient)
                continue
            if rec.error_kind != "client_error" or not drops:
                raise BenchError(f"probe request to {endpoint.url} failed: {rec.error_kind}: {rec.error}")
            key, sub = drops.pop(0)
            if key not in opts:
                continue
            if sub is None:
                note(f"server refused '{key}' ({rec.error}); sent without it")
                opts.pop(key)
            elif isinstance(opts[key], dict) and sub in opts[key]:
                note(f"server refused '{key}.{sub}' ({rec.error}); sent without it")
                opts[key] = {k: v for k, v in opts[key].items() if k != sub}
    finally:
        await backend.close()


def _shares(config: BenchConfig, level: int | float, workers: int, requests: list[PreparedRequest],
            warmup: list[PreparedRequest], point_index: int) -> list[Share]:
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
            concurrency=conc[i], rate=(float(level) / k) if rate_mode else None, requests=counts[i],
            duration_s=config.duration_s, seed=config.seed * 1000 + point_index * 16 + i,
        )
        nwarm = warm_counts[i] or 0
        shares.append(Share(job=job, requests=requests[i::k], warmup=warmup[w0:w0 + nwarm],
                            warmup_concurrency=max(1, conc[i] or nwarm or 1)))
        w0 += nwarm
    return shares


async def run_bench(
    target: BenchTarget, config: BenchConfig, *, tokenizer: str | None = None,
    on_point: Callable[[Point], None] | None = None, on_note: Callable[[str], None] | None = None,
) -> Run:
    """Run every point of ``config`` against ``target``; returns the whole run (not yet saved)."""
    notes: list[str] = []

    def note(msg: str) -> None:
        notes.append(msg)
        if on_note:
            on_note(msg)

    levels: Sequence[int | float] = config.request_rates if config.mode == "rate" else config.concurrency
    if not levels:
        raise BenchError("no points: give --concurrency or --request-rate")
    if not config.requests and not config.duration_s:
        raise BenchError("give --requests N or --duration S per point")
    headers = dict(target.headers)
    if target.api_key:
        headers["Authorization"] = f"Bearer {target.api_key}"
    base = target.base_url.rstrip("/")
    async with aiohttp.ClientSession(headers=headers) as session:
        model, engine, version, info = await _discover(session, target)
        capacity = await _capacity(session, target, engine)
        if capacity is not None and version and not capacity.engine_version:
            capacity = capacity.model_copy(update={"engine_version": version})

        # ---- workload ---------------------------------------------------------------------------
        counter: TokenCounter
        if tokenizer:
            counter = LocalTokenizer(tokenizer)
        else:
            counter = await find_server_tokenizer(session, base, model) or WordCounter()
        if not counter.exact:
            note("no /tokenize on the server and no --tokenizer: prompt lengths are approximate (words)")
        per_point = config.requests or max(256, 4 * int(config.max_concurrency or max(levels)))
        warm_counts = [_warmup_count(config, level) for level in levels]
        want = min(MAX_PROMPTS, len(levels) * per_point + sum(warm_counts))
        if config.dataset:
            prompts: list[Prompt] = load_dataset(config.dataset, want, config.output_len, seed=config.seed)
        else:
            assert config.input_len and config.output_len
            prompts = await random_prompts(want, config.input_len, config.output_len, counter,
                                           input_range=config.input_len_range, output_range=config.output_len_range,
                                           seed=config.seed)

        # ---- what the server accepts ------------------------------------------------------------
        api_path = "/v1/chat/completions" if config.api == "chat" else "/v1/completions"
        endpoint = EndpointConfig(base_url=base, path=api_path, stream=config.stream,
                                  headers=tuple(headers.items()), timeout_s=config.timeout_s)
        ignore_eos = config.ignore_eos
        if ignore_eos is None:
            ignore_eos = True
            if engine:
                try:
                    from servefleet.engines.registry import get_engine  # noqa: PLC0415

                    ignore_eos = bool(get_engine(engine).supports_ignore_eos) or engine in ("sim", "vllm", "sglang", "llamacpp")
                except ServefleetError:
                    pass
        options: dict[str, Any] = dict(config.extra_body)
        if ignore_eos:
            options["ignore_eos"] = True
        if config.temperature is not None:
            options["temperature"] = config.temperature
        if config.stream:
            options["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
        probe_body = encode_bodies(prompts[:1], api=config.api, model=model, stream=config.stream, options={},
                                   max_tokens=4)[0]
        options, probe = await _probe(endpoint, json.loads(probe_body.body), options, note)
        if probe.completion_tokens is None:
            note("the server reports no token usage: output tokens are counted from the text after each point")
            endpoint = EndpointConfig(**{**endpoint.__dict__, "keep_text": True})
        elif config.stream and probe.chunk_tokens is None:
            note("no per-chunk usage in streams: tokens per chunk are shared out by text size (totals stay exact)")
        run_config = config.model_copy(update={"ignore_eos": "ignore_eos" in options})

        bodies = encode_bodies(prompts, api=config.api, model=model, stream=config.stream, options=options)

        # ---- load -------------------------------------------------------------------------------
        max_load = int(config.max_concurrency or 0) if config.mode == "rate" else int(max(levels))
        workers = max(1, config.workers)
        runner: Runner
        # Connections: one per concurrent request (0 = no cap: open loop without --max-concurrency).
        if workers == 1:
            runner = InProcessRunner(endpoint, max_load)
        else:
            runner = ProcessRunner(endpoint, math.ceil(max_load / workers) + 1 if max_load else 0, workers)
        watcher = ServerWatcher(base, session)
        latency_names = _latency_metrics(engine)
        sample_bodies = encode_bodies(prompts[:SAMPLE_REQUESTS], api=config.api, model=model, stream=True,
                                      options={**options, "stream_options": {"include_usage": True}})
        use_sample = not config.stream and latency_names is None
        if use_sample:
            note(f"engine {engine or 'unknown'} publishes no latency histograms servefleet knows: TTFT/TPOT of each "
                 f"point from {SAMPLE_REQUESTS} streamed requests sent one at a time beside its load")
        points: list[Point] = []
        await runner.start()
        try:
            start = 0
            for index, level in enumerate(levels):
                warm_n = warm_counts[index]
                chunk = [bodies[(start + j) % len(bodies)] for j in range(per_point + warm_n)]
                start += per_point + warm_n
                warm = [_shorten(r) for r in chunk[:warm_n]]
                shares = _shares(run_config, level, runner.workers, chunk[warm_n:], warm, index)
                before = await watcher.scrape()
                warm_metrics: dict[str, float] = {}
                sample = StreamedSample(endpoint, sample_bodies) if use_sample else None

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
                counted = await _count_texts(records, counter) if endpoint.keep_text and counter.exact else {}
                metrics = summarize(records, counted=(lambda r: counted.get(id(r))) if counted else None,
                                    concurrency=None if config.mode == "rate" else int(level))
                check = judge(loads, host_cpu)
                server = summarize_server(before, after, samples, capacity.max_running_requests if capacity else None)
                fields = metrics.fields()
                window = fields["steady"]
                if window is not None and records:
                    t0 = min((r.start for r in records if r.ok and not r.warmup), default=0.0)  # as steady_window's
                    gen = [(t, v) for t, v in zip(sample_times, (_gen_tokens(s) for s in samples)) if v is not None]
                    window.server_output_tokens_per_s = counter_rate(gen, t0 + window.start_s, t0 + window.end_s)
                server_latency = _server_latency(latency_names, warm_metrics, after.metrics)
                fields.update(_latencies(fields, server_latency, streamed=config.stream,
                                         sample=summarize(sampled).fields() if sampled else None))
                if not config.stream and server_latency is None and not use_sample:
                    use_sample = True  # the profile names histograms this server does not publish
                    note(f"no latency histograms on {base}/metrics: TTFT/TPOT of the next points from "
                         f"{SAMPLE_REQUESTS} streamed requests beside the load")
                point = Point(
                    concurrency=(config.max_concurrency if config.mode == "rate" else int(level)),
                    request_rate=float(level) if config.mode == "rate" else None,
                    client_bound=bool(check.reasons), client=check, server=server, server_latency=server_latency,
                    **fields,
                )
                points.append(point)
                if on_point:
                    on_point(point)
        finally:
            await runner.close()

    return Run(
        created_at=_now(),
        target=Target(label=target.label or _label(base, model), base_url=base, model=model, engine=engine,
                      engine_version=version),
        config=run_config.model_copy(update={"workers": workers}),
        capacity=capacity,
        server_info=_trim_info(info),
        workload={
            "source": config.dataset or "random",
            "prompts": len(prompts),
            "input_tokens_counted_by": counter.name,
            "input_tokens_mean": _mean([p.input_tokens for p in prompts]),
            "output_tokens_requested_mean": _mean([p.output_tokens for p in prompts]),
            "request_options": options,
        },
        environment=_environment(),
        measured_mode="streaming" if config.stream else "non-streaming",
        points=points,
        notes=notes,
    )


def _latency_metrics(engine: str | None) -> LatencyMetrics | None:
    """The engine profile's latency histogram names (None: unknown engine, or it has none)."""
    if not engine:
        return None
    try:
        from servefleet.engines.registry import get_engine  # noqa: PLC0415 - engines load lazily

        return get_engine(engine).latency_metrics
    except ServefleetError:
        return None


def _gen_tokens(sample: dict[str, float]) -> float | None:
    for name in GEN_TOKENS:
        if name in sample:
            return sample[name]
    return None


def _server_latency(names: LatencyMetrics | None, warm: dict[str, float], after: dict[str, float]) -> ServerLatency | None:
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


def _latencies(fields: dict[str, Any], server: ServerLatency | None, *, streamed: bool,
               sample: dict[str, Any] | None = None) -> dict[str, Any]:
    """TTFT/TPOT/ITL of a point and where each came from: the client's own timing when it streamed,
    else the engine's histograms (TPOT from ITL's mean when the engine has no per-request TPOT),
    else a small streamed sample sent beside the load."""
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
        if got is not None:
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
    return PreparedRequest(index=-1 - req.index, body=json.dumps(body, separators=(",", ":")).encode(),
                           input_tokens=req.input_tokens, max_tokens=body["max_tokens"])


async def _count_texts(records: list[RequestRecord], counter: TokenCounter) -> dict[int, int]:
    todo = [r for r in records if r.ok and r.completion_tokens is None and r.text is not None]
    if not todo:
        return {}
    counts = await counter.count([r.text or "" for r in todo])
    return {id(r): c for r, c in zip(todo, counts)}


def _mean(values: list[int | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def _label(base_url: str, model: str | None) -> str:
    host = base_url.split("://", 1)[-1]
    return f"{model}@{host}" if model else host
