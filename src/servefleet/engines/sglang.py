"""SGLang (sgl-project/sglang): ``python -m sglang.launch_server``.

Readiness is ``/health_generate`` (one real generation), falling back to ``/health`` on versions
without it -- never "Uvicorn running" / "Application startup complete.", which print *before* the
warm-up request that can still fail ("Initialization failed. warmup error"). The log line "The
server is fired up and ready to roll!" is evidence only.

Strings below are from sglang's ``srt/entrypoints/http_server.py`` (ready, warm-up),
``srt/entrypoints/engine.py`` (sigquit handler), ``srt/model_executor/model_runner.py`` (load,
memory pool, CUDA graphs, "Not enough memory"), ``srt/mem_cache/memory_pool.py`` (KV / Mamba cache
lines), ``srt/managers/scheduler.py`` (the ``max_total_num_tokens=`` line, "Scheduler hit an
exception") and ``srt/models/registry.py`` ("Ignore import error when loading"), across
v0.2 (2024) to v0.5.x (2026), plus real start-up logs of v0.4-0.5.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, ClassVar

from servefleet.capacity import Capacity
from servefleet.catalog import Category
from servefleet.engines import base as phase
from servefleet.engines import native_args as na
from servefleet.engines.base import (
    EngineProfile,
    LatencyMetrics,
    LaunchSpec,
    MemoryPhases,
    Probe,
    ServingMetrics,
    Signature,
    TokenizeEndpoint,
    seconds_in_year,
)
from servefleet.engines.generic import (
    as_int,
    build_signatures,
    first_model,
    log_capacity,
    to_float,
    to_int,
)

if TYPE_CHECKING:
    from servefleet.http import HttpClient

__all__ = ["SGLangEngine"]

C = Category
S = Signature

HINTS = {
    C.GPU_OOM: "lower --mem-fraction-static (CUDA graphs/activations ran out), --cuda-graph-max-bs, "
    "--context-length or --max-running-requests, or add GPUs with --tp-size",
    C.PORT_IN_USE: "choose another --port, or stop the process that holds it (SGLang also opens nearby "
    "ports for NCCL/ZMQ, so leave a gap between servers)",
    C.CONFIG_ERROR: "an SGLang argument is invalid; read the evidence line and `python -m sglang.launch_server --help`",
    C.NCCL_OR_DISTRIBUTED: "check GPU visibility and --tp-size, NCCL_DEBUG=INFO; try --disable-custom-all-reduce "
    "or NCCL_P2P_DISABLE=1 on PCIe boxes",
    C.MODEL_NOT_FOUND: "check --model-path: a local folder must hold config.json, the *.safetensors weights and the "
    "tokenizer files (or give a Hub repo id, with HF_TOKEN for a gated one)",
    C.UNSUPPORTED_MODEL: "this SGLang version does not support the architecture; upgrade sglang (and transformers) "
    "or try --model-impl transformers",
    # the boundary cases (README "Failure categories"; generic.BOUNDARY_HINTS)
    "corrupt_weights": "a *.safetensors file of --model-path is truncated or damaged (a partial download?): download "
    "the model again",
    "native_library": "a native library of sglang's kernels (sgl_kernel, flashinfer) or torch is missing or not "
    "loadable: reinstall sglang with the kernels built for this torch and CUDA",
    "cuda_on_cpu_build": "this torch build has no CUDA (SGLang needs a GPU build): install the CUDA build of torch "
    "that sglang pins, or pass --device cpu on an SGLang CPU build",
    "host_ram": "host RAM ran out (weights are staged in host memory while loading): use --load-format with less "
    "staging, fewer --tokenizer-worker-num, or a host with more memory",
    "tp_too_large": "--tp-size (times --dp-size, from --base-gpu-id) is larger than the GPUs this process can see: "
    "lower --tp-size, or widen CUDA_VISIBLE_DEVICES",
    "illegal_instruction": "a kernel died of an illegal instruction (SIGILL): try --attention-backend triton or "
    "--sampling-backend pytorch, or another sglang build",
}

OWN_SIGNATURES = (
    # ---- benign: warnings that quote errors, and notices of healthy start-ups
    S.benign(r"Ignore import error when loading "),
    S.benign(r"Setup Custom allreduce failed with .*(?:To silence this warning|--disable-custom-all-reduce)"),
    S.benign(r"Unexpected error during package walk|Failed to load legacy DeepGEMM"),
    S.benign(r"(?:Disable|Disabling) (?:piecewise )?cuda graph", re.I),
    # the advice block under "Capture cuda graph failed": "Possible solutions:\n1. set --mem-fraction-static ..."
    S.benign(r"^Possible solutions:?$|^\d\. (?:set|disable|reduce|use|lower) "),
    # http_server.py (v0.5.1x): an optional endpoint whose init failed is switched off and the server
    # starts: "OpenAI Responses API (/v1/responses) disabled: OpenAIServingResponses init failed
    # (ModuleNotFoundError: No module named 'openai_harmony')" -- seen on a healthy H200 start-up
    S.benign(r"API \(/v1/[\w/]+\) disabled: \w+ init failed"),
    # Source lines quoted in a traceback ("    raise HFValidationError(", leading blanks stripped) name
    # an exception class but are code: the message below them is the evidence (real missing-model log)
    S.benign(r"^raise [A-Za-z_][\w.]*(?:\(|$)"),
    # ---- ready (evidence; the probe decides)
    S.ready(r"The server is fired up and ready to roll!"),
    # ---- wrappers: they point at a cause above (or at the traceback below them)
    S.wrapper(r"Received sigquit from a child process"),
    S.wrapper(r"Rank \d+ scheduler is dead(?!.*Exit code: -9)"),  # "... Exit code: -9" is a SIGKILL: killed
    S.wrapper(r"\b\w+ hit an exception"),  # "Scheduler hit an exception: Traceback ...", DataParallelController
    S.wrapper(r"Initialization failed\. warmup error"),
    S.wrapper(r"Child process unexpectedly failed with an? exit code"),
    # ---- fatal, SGLang's own words
    # model_runner.py: raised when the KV pool would get <= 0 tokens (weights left no room at this fraction)
    S.fatal(
        r"Not enough memory\. Please try to increase --mem-fraction-static",
        C.GPU_OOM,
        "raise --mem-fraction-static (the weights left no room for the KV cache), or add GPUs with "
        "--tp-size, or use a smaller/quantized model",
    ),
    # kv_cache_configurator.py (v0.5.1x): the static budget is a fraction of the memory free at start-up,
    # and the loaded weights already exceed it
    S.fatal(
        r"Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static",
        C.GPU_OOM,
        "raise --mem-fraction-static above the value the message suggests (it is a fraction of the GPU "
        "memory free when this server starts, so other servers on the GPU count against it), or add GPUs "
        "with --tp-size",
    ),
    S.fatal(
        r"Capture cuda graph failed:.*(?:out of memory|OutOfMemoryError)",
        C.GPU_OOM,
        "lower --mem-fraction-static or --cuda-graph-max-bs (or --disable-cuda-graph, slow)",
    ),
    # server_args.py check_server_args: two flags that do not go together
    S.fatal(
        r"Please pass --[\w-]+ when using --[\w-]+|tp_size must be divisible by number of nodes"
        r"|is not compatible with overlap schedule",
        C.CONFIG_ERROR,
    ),
    S.fatal(
        r"User-specified context_length .* is greater than the derived context_length",
        C.CONFIG_ERROR,
        "lower --context-length to the model's limit (or set SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1)",
    ),
    S.fatal(r"SGLang only supports sm\d+ and above", C.CUDA_DRIVER, "this GPU is too old for this SGLang build"),
    S.fatal(r"Failed to get weights iterator: .*(?:not found|does not exist)", C.MODEL_NOT_FOUND),
    # ---- progress, in start-up order
    S.progress(r"Init torch distributed begin", "initialising torch.distributed"),
    S.progress(r"Load weight begin", "loading weights"),
    S.progress(
        r"(?:Loading safetensors checkpoint shards|Multi-thread loading shards|Loading pt checkpoint shards)",
        "loading weight shards",
    ),
    S.progress(r"Load weight end", "weights loaded"),
    S.progress(r"(?:KV|Mamba) Cache is allocated|Memory pool end", "allocating KV cache"),
    # 0.5.17: "Capture target prefill CUDA graph begin." / "Capturing num tokens (...)" / "... end."
    S.progress(
        r"Capture (?:target (?:prefill |decode )?)?(?:cuda|CUDA) graph begin|Capturing batches|Capture cuda graph bs"
        r"|Capturing num tokens",
        "capturing CUDA graphs",
    ),
    S.progress(r"Capture (?:target (?:prefill |decode )?)?(?:cuda|CUDA) graph end", "CUDA graphs captured"),
    S.progress(r"Compiling num tokens|torch\.compile|Compiling a graph|Capture piecewise CUDA graph", "compiling"),
    S.progress(r"max_total_num_tokens=", "scheduler started"),
    S.progress(r"Uvicorn running on|Application startup complete\.", "HTTP server up, warming up"),
    S.progress(r'"POST /generate HTTP/1\.1" 200', "warm-up request done"),
    S.progress(r"Downloading|Fetching \d+ files|Found local HF snapshot", "downloading model"),
)

_KV_TOKENS = re.compile(r"KV Cache is allocated\..*?#tokens: ([\d,]+)")
_KV_SIZES = re.compile(r"\b(K|V|KV|Cache) size: ([\d.]+) ?GB")
_SCHED_KEY = re.compile(
    r"\b(max_total_num_tokens|chunked_prefill_size|max_prefill_tokens|max_running_requests|"
    r"context_len|available_gpu_mem)=(-?[\d,.]+)"
)
_MAMBA_SIZE = re.compile(r"max_mamba_cache_size: (\d+)")
_MAMBA_PART = re.compile(r"(\w+) size: ([\d.]+) ?GB")
_SPEC_ARG = re.compile(
    r"\b(speculative_(?:algorithm|num_steps|eagle_topk|num_draft_tokens|draft_model_path))="
    r"('[^']*'|[\w.]+)"
)
_SERVED = re.compile(r"\bserved_model_name='([^']*)'")

# Flags whose values servefleet needs (server_args.py); the speculative keys are server_args' names,
# as /server_info reports them.
ARGS = na.ArgTable(
    na.Flag(("--model-path", "--model"), "model"),
    na.Flag(("--served-model-name",), "served_model_name"),
    na.Flag(("--port",), "port", na.to_int),
    na.Flag(("--host",), "host"),
    na.Flag(("--tp-size", "--tp", "--tensor-parallel-size"), "tensor_parallel_size", na.to_int),
    na.Flag(("--max-running-requests",), "max_running_requests", na.to_int),
    na.Flag(("--mem-fraction-static",), "memory_fraction", na.to_float),
    na.Flag(("--context-length",), "context_length", na.to_int),
    na.Flag(("--speculative-algorithm",), "speculative", key="speculative_algorithm"),
    na.Flag(("--speculative-num-steps",), "speculative", na.to_int, key="speculative_num_steps"),
    na.Flag(("--speculative-eagle-topk",), "speculative", na.to_int, key="speculative_eagle_topk"),
    na.Flag(("--speculative-num-draft-tokens",), "speculative", na.to_int, key="speculative_num_draft_tokens"),
    na.Flag(
        ("--speculative-draft-model-path", "--speculative-draft-model"),
        "speculative",
        key="speculative_draft_model_path",
    ),
)

_SPEC_KEYS = (
    "speculative_algorithm",
    "speculative_num_steps",
    "speculative_eagle_topk",
    "speculative_num_draft_tokens",
    "speculative_draft_model_path",
)


# Request latency histograms of SGLang's /metrics (python/sglang/srt/metrics/collector.py; served
# with --enable-metrics). Older releases named the per-token one time_per_output_token_seconds.
LATENCY_METRICS = LatencyMetrics(
    ttft=("sglang:time_to_first_token_seconds",),
    itl=("sglang:inter_token_latency_seconds", "sglang:time_per_output_token_seconds"),
    e2e=("sglang:e2e_request_latency_seconds",),
)


# Load and progress series of SGLang's /metrics (python/sglang/srt/metrics/collector.py). Speculative
# decoding shows as gauges, not counters; the info document's internal_states carry the mean too.
SERVING_METRICS = ServingMetrics(
    running=("sglang:num_running_reqs",),
    queued=("sglang:num_queue_reqs",),
    kv_usage=("sglang:token_usage",),
    generation_tokens=("sglang:generation_tokens_total",),
    prompt_tokens=("sglang:prompt_tokens_total",),
    # every finished request's prompt tokens, and those of them its radix cache held (summed over cache_source)
    prefix_looked_up=("sglang:prompt_tokens_total",),
    prefix_hits=("sglang:cached_tokens_total",),
    spec_accept_length=("sglang:spec_accept_length",),
    spec_accept_rate=("sglang:spec_accept_rate",),
)


# GET /server_info (SGLang >= 0.4.4), /get_server_info before: the server arguments, max_total_num_tokens,
# internal_states (avg_spec_accept_length, memory_usage...), version.
INFO_PATHS = ("/server_info", "/get_server_info")
# POST /tokenize: {"model", "prompt", "add_special_tokens"} -> {"tokens", "count", "max_model_len"} (vLLM's shape).
TOKENIZE = TokenizeEndpoint(
    "sglang", "prompt", fixed=(("add_special_tokens", False),), model_field="model", answer="count"
)


# A memory failure's phase: load_model (weights), init_memory_pool / profile_max_num_token (the KV
# pool, sized from what the weights left), cuda_graph_runner.py (graph capture, "Capture cuda graph
# failed: ..."), then the HTTP server's own warm-up request (_execute_server_warmup), which the
# scheduler serves: its traceback names no start-up frame, the progress label places it.
MEMORY_PHASES = MemoryPhases.of(
    frames=(
        (r"cuda_graph_runner\.py|Capture cuda graph failed", phase.CUDA_GRAPHS),
        (r"in (?:init_memory_pool|profile_max_num_token)\b", phase.KV_CACHE),
        (r"in (?:load_model|load_weights|load_weights_and_postprocess)\b", phase.AT_LOAD),
    ),
    progress=(
        ("initialising torch.distributed", phase.AT_LOAD),
        ("downloading model", phase.AT_LOAD),
        ("loading weights", phase.AT_LOAD),
        ("loading weight shards", phase.AT_LOAD),
        ("weights loaded", phase.KV_CACHE),
        ("allocating KV cache", phase.KV_CACHE),
        ("capturing CUDA graphs", phase.CUDA_GRAPHS),
        ("compiling", phase.WARMING_UP),
        ("CUDA graphs captured", phase.WARMING_UP),
        ("scheduler started", phase.WARMING_UP),
        ("HTTP server up, warming up", phase.WARMUP_REQUEST),
    ),
)


_LOG_TIME = re.compile(r"^\[\d{4}-(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)[\] ]")


class SGLangEngine(EngineProfile):
    name: ClassVar[str] = "sglang"
    # /health_generate runs one real generation; /health only says the HTTP server is up.
    probe: ClassVar[Probe] = Probe(("/health_generate", "/health"), timeout_s=5.0)
    signatures: ClassVar[tuple[Signature, ...]] = build_signatures(OWN_SIGNATURES, HINTS)
    detect: ClassVar[tuple[re.Pattern[str], ...]] = (
        re.compile(r"The server is fired up and ready to roll"),
        re.compile(r"\bsglang[./]"),
        re.compile(r"server_args=ServerArgs\("),
        re.compile(r"max_total_num_tokens=\d+, "),
        re.compile(r"Scheduler hit an exception|Received sigquit from a child process|Rank 0 scheduler is dead"),
        re.compile(r"Load weight begin\. avail mem=|Capture cuda graph begin|KV Cache is allocated\. "),
        re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d (?:DP\d+ )?TP\d+"),
    )
    # After "KV Cache is allocated" / "Memory pool end" each rank captures CUDA graphs, which take
    # memory too; with --disable-cuda-graph no such line comes and readiness is the signal.
    memory_settled: ClassVar[tuple[re.Pattern[str], ...]] = (re.compile(r"Capture cuda graph end\."),)
    memory_phases: ClassVar[MemoryPhases] = MEMORY_PHASES
    memory_flag: ClassVar[str | None] = "--mem-fraction-static"
    supports_ignore_eos: ClassVar[bool] = True
    models_owner: ClassVar[str | None] = "sglang"
    info_keys: ClassVar[tuple[str, ...]] = ("internal_states", "max_total_num_tokens")  # /server_info
    metrics_prefix: ClassVar[str | None] = "sglang:"
    arg_table: ClassVar[na.ArgTable] = ARGS
    latency_metrics: ClassVar[LatencyMetrics | None] = LATENCY_METRICS
    serving_metrics: ClassVar[ServingMetrics] = SERVING_METRICS
    info_paths: ClassVar[tuple[str, ...]] = INFO_PATHS
    tokenize: ClassVar[TokenizeEndpoint | None] = TOKENIZE

    # ---- launch ---------------------------------------------------------------------------------
    def build_argv(self, spec: LaunchSpec) -> list[str]:
        """``python -m sglang.launch_server --model-path M --host H --port P [--tp-size N]
        [--served-model-name S] EXTRA...``; ``spec.command`` replaces the launcher (e.g.
        ``["sglang", "serve"]`` or another interpreter). Flags the user already passed in the
        extra args are not added twice; extra args are never rewritten."""
        native = self.launch_args(spec)
        argv = list(spec.command) or [spec.python, "-m", "sglang.launch_server"]
        if "model" not in native:
            argv += ["--model-path", spec.model]
        if "host" not in native:
            argv += ["--host", spec.host]
        if "port" not in native:
            argv += ["--port", spec.port_arg]
        if spec.gpus and len(spec.gpus) > 1 and "tensor_parallel_size" not in native:
            argv += ["--tp-size", str(len(spec.gpus))]
        if spec.served_model_name and "served_model_name" not in native:
            argv += ["--served-model-name", spec.served_model_name]
        return argv + list(spec.extra_args)

    # ---- log --------------------------------------------------------------------------------------
    def log_time(self, line: str) -> float | None:
        """srt/utils' ``[YYYY-MM-DD HH:MM:SS]`` / ``[... TP0]`` line prefix."""
        m = _LOG_TIME.search(line)
        return seconds_in_year(*(int(g) for g in m.groups())) if m else None

    def capacity_from_line(self, line: str) -> Capacity | None:
        if "max_total_num_tokens=" in line:
            kv = dict(_SCHED_KEY.findall(line))
            extra: dict[str, float | None] = {
                k: to_int(kv[k]) for k in ("chunked_prefill_size", "max_prefill_tokens") if k in kv
            }
            if "available_gpu_mem" in kv:
                extra["available_gpu_mem_gib"] = to_float(kv["available_gpu_mem"])
            return log_capacity(
                kv_cache_tokens=to_int(kv.get("max_total_num_tokens")),
                max_running_requests=to_int(kv.get("max_running_requests")),
                context_length=to_int(kv.get("context_len")),
                extra=extra,
            )
        if "KV Cache is allocated" in line:
            match = _KV_TOKENS.search(line)
            sizes = [float(v) for _, v in _KV_SIZES.findall(line)]
            return log_capacity(
                kv_cache_tokens=to_int(match.group(1)) if match else None,
                kv_cache_gib=round(sum(sizes), 4) if sizes else None,  # per GPU, SGLang's GB = 2**30 bytes
            )
        if "Mamba Cache is allocated" in line:
            mamba: dict[str, Any] = {}
            if match := _MAMBA_SIZE.search(line):
                mamba["max_mamba_cache_size"] = int(match.group(1))
            for name, gib in _MAMBA_PART.findall(line):
                mamba[f"{name}_gib"] = float(gib)
            return log_capacity(mamba_cache=mamba)
        if "server_args=ServerArgs(" in line:
            spec = {k: _literal(v) for k, v in _SPEC_ARG.findall(line)}
            spec = {k: v for k, v in spec.items() if v is not None}
            served = _SERVED.search(line)
            return log_capacity(
                speculative=spec if spec.get("speculative_algorithm") else {},
                served_model=served.group(1) if served else None,
            )
        return None

    # ---- endpoints --------------------------------------------------------------------------------
    async def capacity_from_server(self, client: HttpClient, base_url: str) -> Capacity:
        """``GET /server_info`` (SGLang >= 0.4.4), else the older ``/get_server_info``; ``/v1/models``
        for the served name and ``max_model_len`` when ``context_length`` was not set explicitly."""
        base = base_url.rstrip("/")
        info: Any = None
        for path in self.info_paths:
            info = await client.get_json(base + path)
            if isinstance(info, dict):
                break
        facts: dict[str, Any] = {}
        sources: dict[str, str] = {}
        if isinstance(info, dict):
            facts = parse_server_info(info)
            sources = {k: f"endpoint:{path}" for k in facts}
        models = await client.get_json(base + "/v1/models")
        first = first_model(models)
        if first:
            if "served_model" not in facts and first.get("id"):
                facts["served_model"], sources["served_model"] = first["id"], "endpoint:/v1/models"
            if "context_length" not in facts and as_int(first.get("max_model_len")):
                facts["context_length"] = as_int(first.get("max_model_len"))
                sources["context_length"] = "endpoint:/v1/models"
        if not facts:
            return Capacity()
        return Capacity(**facts, source=sources)


def parse_server_info(info: dict[str, Any]) -> dict[str, Any]:
    """Capacity facts from a ``/server_info`` (or ``/get_server_info``) document.

    The document is the server arguments flattened at the top, plus ``max_total_num_tokens``,
    ``internal_states`` (one per DP rank: ``effective_max_running_requests_per_dp``,
    ``memory_usage.token_capacity``...) and ``version``; older versions lack some keys."""
    states = info.get("internal_states")
    state: dict[str, Any] = states[0] if isinstance(states, list) and states and isinstance(states[0], dict) else {}
    memory: dict[str, Any] = state["memory_usage"] if isinstance(state.get("memory_usage"), dict) else {}
    facts: dict[str, Any] = {}

    kv = (
        as_int(info.get("max_total_num_tokens"))
        or as_int(state.get("max_total_num_tokens"))
        or as_int(memory.get("token_capacity"))
    )
    if kv:
        facts["kv_cache_tokens"] = kv
    dp = as_int(info.get("dp_size")) or 1
    per_dp = as_int(state.get("effective_max_running_requests_per_dp"))
    if per_dp:
        facts["max_running_requests"] = per_dp * dp
    else:
        running = as_int(state.get("max_running_requests")) or as_int(info.get("max_running_requests"))
        if running:
            facts["max_running_requests"] = running
    context = as_int(info.get("context_length")) or as_int(state.get("context_len"))
    if context:
        facts["context_length"] = context
    kv_gib = memory.get("kvcache")
    if isinstance(kv_gib, (int, float)) and not isinstance(kv_gib, bool) and kv_gib > 0:
        facts["kv_cache_gib"] = float(kv_gib)
    algo = info.get("speculative_algorithm") or state.get("speculative_algorithm")
    if algo:
        facts["speculative"] = {
            k: info.get(k, state.get(k)) for k in _SPEC_KEYS if info.get(k, state.get(k)) is not None
        }
    mamba = {k: v for k, v in {**info, **state}.items() if k == "max_mamba_cache_size" and v is not None}
    mamba.update({f"memory_usage.{k}": v for k, v in memory.items() if "mamba" in k})
    if mamba:
        facts["mamba_cache"] = mamba
    if isinstance(info.get("version"), str):
        facts["engine_version"] = info["version"]
    if isinstance(info.get("served_model_name"), str):
        facts["served_model"] = info["served_model_name"]
    extra = {
        k: info[k]
        for k in ("tp_size", "dp_size", "max_req_input_len", "chunked_prefill_size", "max_prefill_tokens")
        if info.get(k) is not None
    }
    if per_dp:
        extra["max_running_requests_per_dp"] = per_dp
    if extra:
        facts["extra"] = extra
    return facts


def _literal(text: str) -> Any:
    if text.startswith("'"):
        return text.strip("'")
    if text == "None":
        return None
    return to_int(text) if to_int(text) is not None else text
