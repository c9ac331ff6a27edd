"""The real log text of each engine style: start-up timeline, capacity lines, ready, batch stats.

Strings follow upstream (SGLang ``model_runner.py`` / ``scheduler.py`` / ``memory_pool.py`` /
``http_server.py``, uvicorn; vLLM ``api_server.py``, ``core.py``, ``gpu_model_runner.py``,
``kv_cache_utils.py``, ``loggers.py``) so that the engine profiles' signatures and capacity parsers
can be tested against the sim. Timings are fractions of ``--load-time``; :mod:`.startup` plays them.
"""

from __future__ import annotations

from dataclasses import dataclass

from servefleet.sim.config import SimConfig
from servefleet.sim.logline import SG_RANK, Line, uv

__all__ = [
    "Event",
    "Memory",
    "startup_events",
    "server_up_lines",
    "ready_lines",
    "shutdown_lines",
    "sglang_batch_line",
    "vllm_stats_lines",
    "access_line",
    "API",
    "ENGINE",
]

API, ENGINE = "APIServer", "EngineCore_DP0"  # vLLM process names
_ARCH = "LlamaForCausalLM"


@dataclass(frozen=True)
class Event:
    at: float  # fraction of the load time
    lines: tuple[Line, ...]


@dataclass(frozen=True)
class Memory:
    """Plausible GPU memory figures (GB) for an 8B model on an 80 GB GPU, consistent with kv_tokens."""

    total: float
    before_load: float
    weights: float
    kv_k: float
    kv_v: float

    @classmethod
    def of(cls, cfg: SimConfig) -> Memory:
        total, before, weights = 79.19, 78.50, 15.08
        room = before - weights - 3.0
        per_token = min(131072.0, room * 2**30 / cfg.kv_tokens)  # bytes of K+V per token
        half = cfg.kv_tokens * per_token / 2 / 2**30
        return cls(total, before, weights, half, half)

    @property
    def after_load(self) -> float:
        return self.before_load - self.weights

    @property
    def after_pool(self) -> float:
        return self.after_load - self.kv_k - self.kv_v


def _bar(label: str, total: int, final_rate: str, width: int = 46) -> tuple[tuple[str, ...], str]:
    """tqdm redraws and the final state of a progress bar."""
    states = []
    for i in range(total + 1):
        pct = int(100 * i / total)
        fill = "\u2588" * (width * i // total)
        states.append(
            f"{label}: {pct:3d}%|{fill:<{width}}| {i}/{total} [00:0{min(i, 9)}<00:0{max(total - i, 0) % 10}, {final_rate}]"
        )
    return tuple(states[:-1]), states[-1]


def _shards(cfg: SimConfig, start: float, end: float) -> list[Event]:
    n = cfg.shards
    events = [
        Event(
            start,
            (
                Line(
                    f"Loading safetensors checkpoint shards:   0% Completed | 0/{n} [00:00<?, ?it/s]",
                    raw=True,
                    err=True,
                ),
            ),
        )
    ]
    for i in range(1, n + 1):
        pct = int(100 * i / n)
        at = start + (end - start) * i / n
        events.append(
            Event(
                at,
                (
                    Line(
                        f"Loading safetensors checkpoint shards: {pct:3d}% Completed | {i}/{n} "
                        f"[00:{i:02d}<00:{n - i:02d},  1.02it/s]",
                        raw=True,
                        err=True,
                    ),
                ),
            )
        )
    return events


# ---- SGLang ------------------------------------------------------------------------------------
def _sglang_server_args(cfg: SimConfig, port: int) -> str:
    spec = cfg.spec_algorithm
    steps = cfg.spec_draft_tokens if spec else None
    fields = [
        f"model_path={cfg.model!r}",
        f"tokenizer_path={cfg.model!r}",
        "tokenizer_mode='auto'",
        "skip_tokenizer_init=False",
        "load_format='auto'",
        "trust_remote_code=False",
        "dtype='auto'",
        "kv_cache_dtype='auto'",
        "quantization=None",
        f"context_length={cfg.context_length}",
        "device='cuda'",
        f"served_model_name={cfg.served_name!r}",
        "chat_template=None",
        "is_embedding=False",
        "revision=None",
        f"host={cfg.host!r}",
        f"port={port}",
        f"mem_fraction_static={cfg.mem_fraction_static}",
        f"max_running_requests={cfg.max_running}",
        f"max_total_tokens={cfg.kv_tokens}",
        "chunked_prefill_size=8192",
        "max_prefill_tokens=16384",
        "schedule_policy='fcfs'",
        "schedule_conservativeness=1.0",
        "page_size=1",
        f"tp_size={cfg.tp}",
        "pp_size=1",
        "stream_interval=1",
        f"random_seed={cfg.seed}",
        "watchdog_timeout=300",
        "log_level='info'",
        "enable_metrics=True",
        "decode_log_interval=40",
        "api_key=None",
        "dp_size=1",
        "attention_backend=None",
        "sampling_backend='flashinfer'",
        "grammar_backend='xgrammar'",
        f"speculative_algorithm={spec!r}",
        "speculative_draft_model_path=None",
        f"speculative_num_steps={steps}",
        f"speculative_eagle_topk={1 if spec else None}",
        f"speculative_num_draft_tokens={cfg.spec_draft_tokens + 1 if spec else None}",
        "disable_radix_cache=False",
        "disable_cuda_graph=False",
        "enable_torch_compile=False",
        "cuda_graph_max_bs=256",
        "enable_mixed_chunk=False",
        "disaggregation_mode='null'",
    ]
    return f"server_args=ServerArgs({', '.join(fields)})"


def _sglang_events(cfg: SimConfig, port: int) -> list[Event]:
    mem = Memory.of(cfg)
    bs = [
        b
        for b in (1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256)
        if b <= max(cfg.max_running, 1)
    ]
    redraws, final = _bar(
        f"Capturing batches (bs={bs[-1]} avail_mem={mem.after_pool - 0.4:.2f} GB)",
        len(bs),
        f"{len(bs) / 2.7:5.2f}it/s",
    )
    ev = [
        Event(0.00, (Line(_sglang_server_args(cfg, port)),)),
        Event(0.03, (Line("Using default HuggingFace chat template with detected content format: string"),)),
        Event(0.05, (Line("Attention backend not set. Use flashinfer backend by default.", SG_RANK),)),
        Event(0.06, (Line("Init torch distributed begin.", SG_RANK),)),
        Event(0.08, (Line("Init torch distributed ends. mem usage=0.00 GB", SG_RANK),)),
        Event(0.10, (Line(f"Load weight begin. avail mem={mem.before_load:.2f} GB", SG_RANK),)),
    ]
    ev += _shards(cfg, 0.11, 0.54)
    ev += [
        Event(
            0.56,
            (
                Line(
                    f"Load weight end. type={_ARCH}, dtype=torch.bfloat16, avail mem={mem.after_load:.2f} GB, "
                    f"mem usage={mem.weights:.2f} GB.",
                    SG_RANK,
                ),
            ),
        ),
        Event(
            0.60,
            (
                Line(
                    f"KV Cache is allocated. #tokens: {cfg.kv_tokens}, K size: {mem.kv_k:.2f} GB, V size: {mem.kv_v:.2f} GB",
                    SG_RANK,
                ),
            ),
        ),
        Event(0.61, (Line(f"Memory pool end. avail mem={mem.after_pool:.2f} GB", SG_RANK),)),
        Event(
            0.65,
            (
                Line(
                    f"Capture cuda graph begin. This can take up to several minutes. avail mem={mem.after_pool:.2f} GB",
                    SG_RANK,
                ),
            ),
        ),
        Event(0.66, (Line(f"Capture cuda graph bs {bs}", SG_RANK),)),
        Event(0.92, (Line(final, raw=True, err=True, redraws=redraws),)),
        Event(
            0.93,
            (
                Line(
                    f"Capture cuda graph end. Time elapsed: {max(cfg.load_time * 0.27, 0.5):.2f} s. mem usage=0.41 GB. "
                    f"avail mem={mem.after_pool - 0.41:.2f} GB.",
                    SG_RANK,
                ),
            ),
        ),
        Event(
            0.95,
            (
                Line(
                    f"max_total_num_tokens={cfg.kv_tokens}, chunked_prefill_size=8192, max_prefill_tokens=16384, "
                    f"max_running_requests={cfg.max_running}, context_len={cfg.context_length}, "
                    f"available_gpu_mem={mem.after_pool - 0.41:.2f} GB",
                    "TP0",
                ),
            ),
        ),
    ]
    return ev


# ---- vLLM --------------------------------------------------------------------------------------
def _vllm_events(cfg: SimConfig, port: int) -> list[Event]:
    mem = Memory.of(cfg)
    kv_gib = mem.kv_k + mem.kv_v
    spec = (
        f"SpeculativeConfig(method='{cfg.spec_algorithm.lower()}', model='{cfg.model}', num_spec_tokens={cfg.spec_draft_tokens})"
        if cfg.spec_algorithm
        else "None"
    )  # spec_algorithm is set exactly when cfg.speculative
    args = {
        "model_tag": cfg.model,
        "host": cfg.host,
        "port": port,
        "model": cfg.model,
        "max_model_len": cfg.context_length,
        "gpu_memory_utilization": cfg.gpu_memory_utilization,
        "max_num_seqs": cfg.max_running,
    }
    if cfg.served_model_name:
        args["served_model_name"] = [cfg.served_model_name]
    if cfg.tp > 1:
        args["tensor_parallel_size"] = cfg.tp
    captures = 67 if cfg.max_running >= 256 else max(4, min(67, cfg.max_running // 4 + 3))
    r1, f1 = _bar("Capturing CUDA graphs (mixed prefill-decode, PIECEWISE)", captures, " 19.71it/s")
    r2, f2 = _bar("Capturing CUDA graphs (decode, FULL)", max(captures // 2, 2), " 24.07it/s")
    ev = [
        Event(0.00, (Line("Automatically detected platform cuda.", src="__init__.py:216"),)),
        Event(
            0.02,
            (
                Line(f"vLLM API server version {cfg.version}", API, src="api_server.py:1839"),
                Line(f"non-default args: {args}", API, src="utils.py:233"),
            ),
        ),
        Event(
            0.05,
            (
                Line(f"Resolved architecture: {_ARCH}", API, src="model.py:547"),
                Line(f"Using max model len {cfg.context_length}", API, src="model.py:1510"),
            ),
        ),
        Event(
            0.06, (Line("Chunked prefill is enabled with max_num_batched_tokens=8192.", API, src="scheduler.py:205"),)
        ),
        Event(
            0.10,
            (
                Line(
                    f"Initializing a V1 LLM engine (v{cfg.version}) with config: model='{cfg.model}', speculative_config={spec}, "
                    f"tokenizer='{cfg.model}', skip_tokenizer_init=False, tokenizer_mode=auto, revision=None, "
                    f"trust_remote_code=False, dtype=torch.bfloat16, max_seq_len={cfg.context_length}, download_dir=None, "
                    f"load_format=auto, tensor_parallel_size={cfg.tp}, pipeline_parallel_size=1, data_parallel_size=1, "
                    f"disable_custom_all_reduce=False, quantization=None, enforce_eager=False, kv_cache_dtype=auto, "
                    f"device_config=cuda, seed={cfg.seed}, served_model_name={cfg.served_name}, enable_prefix_caching=True, "
                    f"chunked_prefill_enabled=True, pooler_config=None",
                    ENGINE,
                    src="core.py:77",
                ),
            ),
        ),
        Event(
            0.12,
            (
                Line(
                    f"rank 0 in world size {cfg.tp} is assigned as DP rank 0, PP rank 0, TP rank 0, EP rank 0",
                    ENGINE,
                    src="parallel_state.py:1208",
                ),
            ),
        ),
        Event(0.14, (Line(f"Starting to load model {cfg.model}...", ENGINE, src="gpu_model_runner.py:2602"),)),
        Event(0.15, (Line("Using Flash Attention backend on V1 engine.", ENGINE, src="cuda.py:366"),)),
    ]
    ev += _shards(cfg, 0.16, 0.50)
    ev += [
        Event(
            0.51,
            (
                Line(
                    f"Loading weights took {max(cfg.load_time * 0.34, 0.1):.2f} seconds",
                    ENGINE,
                    src="default_loader.py:267",
                ),
            ),
        ),
        Event(
            0.52,
            (
                Line(
                    f"Model loading took {mem.weights * 0.9313:.4f} GiB and {max(cfg.load_time * 0.37, 0.1):.6f} seconds",
                    ENGINE,
                    src="gpu_model_runner.py:2653",
                ),
            ),
        ),
        Event(
            0.55,
            (
                Line(
                    "Using cache directory: /root/.cache/vllm/torch_compile_cache/3b5e1f0c2a/rank_0_0/backbone for vLLM's torch.compile",
                    ENGINE,
                    src="backends.py:548",
                ),
            ),
        ),
        Event(
            0.60,
            (
                Line(
                    f"Dynamo bytecode transform time: {max(cfg.load_time * 0.05, 0.1):.2f} s",
                    ENGINE,
                    src="backends.py:559",
                ),
            ),
        ),
        Event(
            0.70,
            (
                Line(
                    f"torch.compile takes {max(cfg.load_time * 0.15, 0.1):.2f} s in total", ENGINE, src="monitor.py:34"
                ),
            ),
        ),
        Event(0.72, (Line(f"Available KV cache memory: {kv_gib * 0.9313:.2f} GiB", ENGINE, src="gpu_worker.py:298"),)),
        Event(
            0.73,
            (
                Line(f"GPU KV cache size: {cfg.kv_tokens:,} tokens", ENGINE, src="kv_cache_utils.py:1087"),
                Line(
                    f"Maximum concurrency for {cfg.context_length:,} tokens per request: {cfg.kv_tokens / cfg.context_length:.2f}x",
                    ENGINE,
                    src="kv_cache_utils.py:1091",
                ),
            ),
        ),
        Event(0.82, (Line(f1, raw=True, err=True, redraws=r1),)),
        Event(0.91, (Line(f2, raw=True, err=True, redraws=r2),)),
        Event(
            0.92, (Line("Graph capturing finished in 5 secs, took 0.55 GiB", ENGINE, src="gpu_model_runner.py:3480"),)
        ),
        Event(
            0.95,
            (
                Line(
                    f"init engine (profile, create kv cache, warmup model) took {max(cfg.load_time * 0.8, 0.1):.2f} seconds",
                    ENGINE,
                    src="core.py:210",
                ),
            ),
        ),
        Event(
            0.97,
            (
                Line(
                    f"Engine 000: vllm cache_config_info with initialization after num_gpu_blocks is: {cfg.kv_tokens // 16}",
                    API,
                    src="loggers.py:147",
                ),
                Line("Supported_tasks: ['generate']", API, src="api_server.py:1634"),
            ),
        ),
    ]
    return ev


def startup_events(cfg: SimConfig, port: int) -> list[Event]:
    """The loading timeline, in order; the ready sequence (:func:`server_up_lines`) follows at 1.0."""
    return _sglang_events(cfg, port) if cfg.style == "sglang" else _vllm_events(cfg, port)


_ROUTES = (
    "/openapi.json",
    "/docs",
    "/health",
    "/load",
    "/ping",
    "/tokenize",
    "/detokenize",
    "/v1/models",
    "/version",
    "/v1/chat/completions",
    "/v1/completions",
    "/metrics",
)


def server_up_lines(cfg: SimConfig, port: int, pid: int) -> list[Line]:
    """The HTTP server coming up (printed before readiness; SGLang's warm-up follows)."""
    url = f"http://{cfg.host}:{port}"
    if cfg.style == "sglang":
        return [
            uv(f"INFO:     Started server process [{pid}]"),
            uv("INFO:     Waiting for application startup."),
            uv("INFO:     Application startup complete."),
            uv(f"INFO:     Uvicorn running on {url} (Press CTRL+C to quit)"),
        ]
    lines = [
        Line(f"Starting vLLM API server 0 on {url}", API, src="api_server.py:1912"),
        Line("Available routes are:", API, src="launcher.py:34"),
    ]
    methods = {"/v1/chat/completions": "POST", "/v1/completions": "POST", "/tokenize": "POST", "/detokenize": "POST"}
    lines += [Line(f"Route: {r}, Methods: {methods.get(r, 'GET')}", API, src="launcher.py:42") for r in _ROUTES]
    lines += [
        uv(f"INFO:     Started server process [{pid}]", API),
        uv("INFO:     Waiting for application startup.", API),
    ]
    return lines


def ready_lines(cfg: SimConfig, port: int) -> tuple[list[Line], list[Line]]:
    """(warm-up lines printed just before readiness, the line printed at the moment of readiness)."""
    if cfg.style == "sglang":
        warm = [
            uv(f'INFO:     127.0.0.1:{_peer(port, 1)} - "GET /get_model_info HTTP/1.1" 200 OK'),
            Line(
                "Prefill batch. #new-seq: 1, #new-token: 7, #cached-token: 0, token usage: 0.00, #running-req: 0, #queue-req: 0",
                "TP0",
            ),
            uv(f'INFO:     127.0.0.1:{_peer(port, 2)} - "POST /generate HTTP/1.1" 200 OK'),
        ]
        return warm, [Line("The server is fired up and ready to roll!")]
    return [], [uv("INFO:     Application startup complete.", API)]


def shutdown_lines(cfg: SimConfig, pid: int) -> list[Line]:
    proc = None if cfg.style == "sglang" else API
    return [
        uv("INFO:     Shutting down", proc),
        uv("INFO:     Waiting for application shutdown.", proc),
        uv("INFO:     Application shutdown complete.", proc),
        uv(f"INFO:     Finished server process [{pid}]", proc),
    ]


def _peer(port: int, n: int) -> int:
    return 40000 + (port * 7 + n * 131) % 20000


def access_line(cfg: SimConfig, peer: str, method: str, path: str, status: int, reason: str) -> Line:
    return uv(
        f'INFO:     {peer} - "{method} {path} HTTP/1.1" {status} {reason}', None if cfg.style == "sglang" else API
    )


def sglang_batch_line(
    cfg: SimConfig,
    *,
    prefill: bool,
    new_seq: int,
    new_tokens: int,
    running: int,
    queued: int,
    used_tokens: int,
    gen_throughput: float,
) -> Line:
    usage = used_tokens / cfg.kv_tokens
    if prefill:
        return Line(
            f"Prefill batch. #new-seq: {new_seq}, #new-token: {new_tokens}, #cached-token: 0, token usage: {usage:.2f}, "
            f"#running-req: {running}, #queue-req: {queued}",
            "TP0",
        )
    accept = f"accept len: {float(cfg.tokens_per_step):.2f}, " if cfg.speculative else ""
    return Line(
        f"Decode batch. #running-req: {running}, #token: {used_tokens}, token usage: {usage:.2f}, {accept}"
        f"cuda graph: True, gen throughput (token/s): {gen_throughput:.2f}, #queue-req: {queued}",
        "TP0",
    )


def vllm_stats_lines(
    cfg: SimConfig,
    *,
    prompt_tps: float,
    gen_tps: float,
    running: int,
    waiting: int,
    kv_usage: float,
    accepted: int,
    drafted: int,
) -> list[Line]:
    lines = [
        Line(
            f"Engine 000: Avg prompt throughput: {prompt_tps:.1f} tokens/s, Avg generation throughput: {gen_tps:.1f} tokens/s, "
            f"Running: {running} reqs, Waiting: {waiting} reqs, GPU KV cache usage: {kv_usage * 100:.1f}%, "
            f"Prefix cache hit rate: 0.0%",
            API,
            src="loggers.py:127",
        )
    ]
    if cfg.speculative and drafted:
        rate = accepted / drafted
        lines.append(
            Line(
                f"SpecDecoding metrics: Mean acceptance length: {float(cfg.tokens_per_step):.2f}, Accepted: {accepted} tokens, "
                f"Drafted: {drafted} tokens, Avg Draft acceptance rate: {rate * 100:.1f}%",
                API,
                src="metrics.py:96",
            )
        )
    return lines
