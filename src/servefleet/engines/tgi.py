"""Text Generation Inference (huggingface/text-generation-inference): ``text-generation-launcher``.

Mostly for diagnosing logs (TGI is in maintenance mode upstream), but launchable too. The launcher
(Rust) downloads weights, starts one Python shard per GPU, then the router; its own lines look like
``2025-01-01T00:00:00.000000Z  INFO text_generation_launcher: Starting shard rank=0``. A shard that
dies is reported as "Shard complete standard error output:" followed by the Python traceback, then
"Error: ShardCannotStart" -- wrappers around the traceback's last line. Strings are from
``launcher/src/main.rs``, ``router/src/server.rs`` ("Connected", "Failed to bind to"),
``backends/v3/src/lib.rs`` ("Warming up model", "Setting max batch total tokens to",
"Not enough memory to handle") and ``server/text_generation_server`` ("Error when initializing model",
"Not enough memory to handle N prefill tokens"), TGI v1.x-v3.x.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, ClassVar

from servefleet.capacity import Capacity
from servefleet.catalog import Category
from servefleet.engines import native_args as na
from servefleet.engines.base import EngineProfile, LaunchSpec, Probe, ServingMetrics, Signature, TokenizeEndpoint
from servefleet.engines.generic import as_int, build_signatures, log_capacity

if TYPE_CHECKING:
    from servefleet.http import HttpClient

__all__ = ["TGIEngine"]

C = Category
S = Signature

HINTS = {
    C.GPU_OOM: "lower --max-batch-prefill-tokens / --max-total-tokens / --max-input-tokens, or "
    "--cuda-memory-fraction, or add GPUs with --num-shard",
    C.PORT_IN_USE: "choose another --port (and --master-port / --shard-uds-path if two launchers share a host)",
    C.CONFIG_ERROR: "a launcher argument is invalid; read the evidence line and `text-generation-launcher --help`",
    C.IMPORT_ERROR: "text-generation-server / text-generation-router is not installed in the launcher's PATH",
    C.MODEL_NOT_FOUND: "check --model-id: a Hub repo id (HF_TOKEN for a private or gated one) or a local folder the "
    "launcher can read",
    # the boundary cases (README "Failure categories"; generic.BOUNDARY_HINTS)
    "corrupt_weights": "a *.safetensors file of --model-id is truncated or damaged (a partial download?): remove it "
    "from HUGGINGFACE_HUB_CACHE and let the launcher download it again",
    "native_library": "a kernel library of the shard (flash-attn, exllama, vllm kernels) is missing or not loadable: "
    "use the TGI image built for this GPU",
    "cuda_on_cpu_build": "this TGI/torch build has no CUDA: run the CUDA image, or the CPU image without GPU flags",
    "host_ram": "host RAM ran out while a shard loaded the weights: give the container more memory, or use more "
    "shards (--num-shard) so each loads less",
    "tp_too_large": "--num-shard is larger than the GPUs the launcher can see: lower --num-shard, or widen CUDA_VISIBLE_DEVICES",
    "illegal_instruction": "a shard died of an illegal instruction (SIGILL): the image's kernels need a newer CPU/GPU; "
    "use another image",
}

OWN_SIGNATURES = (
    # ---- ready (evidence; /health decides)
    S.ready(r"text_generation_router(?:::server)?:.*\bConnected\s*$"),
    # ---- wrappers: the cause is in the shard's stderr dump / the traceback around them
    S.wrapper(
        r"Shard complete standard error output|Shard \d+ failed to start|Error when initializing model"
        r"|Shard \d+ crashed|Webserver Crashed|Shard status channel disconnected"
    ),
    S.wrapper(
        r"^Error: (?:ShardCannotStart|ShardFailed|ShardDisconnected|WebserverFailed|WebserverCannotStart|DownloadError)"
    ),
    S.wrapper(r"Download encountered an error|Unable to warmup the Python model shards"),
    # ---- fatal, TGI's own words
    S.fatal(r"Not enough memory to handle", C.GPU_OOM),
    S.fatal(r"Failed to bind to ", C.PORT_IN_USE),
    S.fatal(
        r"Shard process was signaled to shutdown with signal 9|Download process was signaled to shutdown with signal 9",
        C.KILLED,
    ),
    # other signals of a shard: SIGSEGV (11) and SIGBUS (7: a /dev/shm too small for NCCL in a container);
    # SIGILL (4) is the shared illegal-instruction rule (generic)
    S.fatal(
        r"signaled to shutdown with signal 7\b",
        C.OTHER,
        "a shard died of SIGBUS: in a container /dev/shm is usually too small for NCCL: run with --shm-size 1g "
        "(or NCCL_SHM_DISABLE=1)",
    ),
    S.fatal(
        r"signaled to shutdown with signal 11\b",
        C.OTHER,
        "a shard crashed in native code (SIGSEGV): try another TGI image or --dtype / --quantize setting",
    ),
    S.fatal(r"text-generation-(?:server|router) not found in PATH", C.IMPORT_ERROR),
    S.fatal(
        r"Unsupported model type |requires Flash Attention enabled models|quantization is not supported for AutoModel",
        C.UNSUPPORTED_MODEL,
        "TGI cannot serve this model (type, quantization, or no flash-attention kernel for "
        "this GPU); try another engine",
    ),
    S.fatal(
        r"sharded is not supported for|Sharding is currently not supported",
        C.CONFIG_ERROR,
        "this model cannot be sharded by TGI: use --num-shard 1 (one GPU)",
    ),
    S.fatal(
        r"not enough cuda devices|NotEnoughCUDADevices",
        C.CONFIG_ERROR,
        "--num-shard is larger than the visible GPUs; set CUDA_VISIBLE_DEVICES or lower --num-shard",
    ),
    S.fatal(r"^Error: ArgumentValidation\(|Invalid argument: ", C.CONFIG_ERROR),
    # ---- progress, in start-up order
    S.progress(
        r"Starting check and download process|Starting download process|Download file:|Downloaded ",
        "downloading model",
    ),
    S.progress(r"Successfully downloaded weights", "weights downloaded"),
    S.progress(r"Starting shard|Waiting for shard to be ready", "loading weights"),
    S.progress(r"Shard ready in", "shards ready"),
    S.progress(r"Starting Webserver|Warming up model", "warming up"),
    S.progress(r"Setting max batch total tokens to", "warm-up done"),
)

# Flags whose values servefleet needs (launcher/src/main.rs, clap: `--x v` and `--x=v`).
ARGS = na.ArgTable(
    na.Flag(("--model-id",), "model"),
    na.Flag(("--served-model-name",), "served_model_name"),  # newer launchers; default: the model id
    na.Flag(("-p", "--port"), "port", na.to_int),
    na.Flag(("--hostname",), "host"),
    na.Flag(("--num-shard",), "tensor_parallel_size", na.to_int),
    na.Flag(("--max-concurrent-requests",), "max_running_requests", na.to_int),
    na.Flag(("--cuda-memory-fraction",), "memory_fraction", na.to_float),
    na.Flag(("--max-total-tokens",), "context_length", na.to_int),
    na.Flag(("--speculate",), "speculative", na.to_int, key="speculate"),
)

_MAX_BATCH = re.compile(r"Setting max batch total tokens to (\d+)")


# The router's POST /tokenize: {"inputs"} -> [{"id", "text", "start", "stop"}, ...].
# Load series of TGI's router /metrics (its batch is the running requests).
SERVING_METRICS = ServingMetrics(running=("tgi_batch_current_size",), queued=("tgi_queue_size",))
TOKENIZE = TokenizeEndpoint("tgi", "inputs", answer="list")


class TGIEngine(EngineProfile):
    name: ClassVar[str] = "tgi"
    probe: ClassVar[Probe] = Probe(("/health",))
    signatures: ClassVar[tuple[Signature, ...]] = build_signatures(OWN_SIGNATURES, HINTS)
    detect: ClassVar[tuple[re.Pattern[str], ...]] = (
        re.compile(r"text_generation_(?:launcher|router|server)|text-generation-(?:launcher|router|server)"),
        re.compile(r"Error: ShardCannotStart|Shard complete standard error output"),
    )
    memory_flag: ClassVar[str | None] = "--cuda-memory-fraction"
    supports_ignore_eos: ClassVar[bool] = False
    models_owner: ClassVar[str | None] = "tgi"
    metrics_prefix: ClassVar[str | None] = "tgi_"
    arg_table: ClassVar[na.ArgTable] = ARGS
    tokenize: ClassVar[TokenizeEndpoint | None] = TOKENIZE
    serving_metrics: ClassVar[ServingMetrics] = SERVING_METRICS

    def build_argv(self, spec: LaunchSpec) -> list[str]:
        """``text-generation-launcher --model-id M --hostname H --port P [--num-shard N] EXTRA...``."""
        native = self.launch_args(spec)
        argv = [*(spec.command or ("text-generation-launcher",))]
        if "model" not in native:
            argv += ["--model-id", spec.model]
        if "host" not in native:
            argv += ["--hostname", spec.host]
        if "port" not in native:
            argv += ["--port", spec.port_arg]
        if spec.gpus and len(spec.gpus) > 1 and "tensor_parallel_size" not in native:
            argv += ["--num-shard", str(len(spec.gpus))]
        return argv + list(spec.extra_args)

    def capacity_from_line(self, line: str) -> Capacity | None:
        if match := _MAX_BATCH.search(line):
            # the batch token budget found by the warm-up: TGI's KV-cache capacity in tokens
            return log_capacity(kv_cache_tokens=int(match.group(1)))
        return None

    async def capacity_from_server(self, client: HttpClient, base_url: str) -> Capacity:
        """``GET /info``: ``max_batch_total_tokens`` (older versions), ``max_total_tokens`` (the
        per-request context), ``max_concurrent_requests``, ``version``, ``model_id``."""
        info = await client.get_json(base_url.rstrip("/") + "/info")
        if not isinstance(info, dict):
            return Capacity()
        facts: dict[str, Any] = {}
        if as_int(info.get("max_batch_total_tokens")):
            facts["kv_cache_tokens"] = as_int(info["max_batch_total_tokens"])
        if as_int(info.get("max_total_tokens")):
            facts["context_length"] = as_int(info["max_total_tokens"])
        if as_int(info.get("max_concurrent_requests")):
            facts["max_running_requests"] = as_int(info["max_concurrent_requests"])
        if isinstance(info.get("version"), str):
            facts["engine_version"] = info["version"]
        if isinstance(info.get("model_id"), str):
            facts["served_model"] = info["model_id"]
        extra = {
            k: info[k]
            for k in (
                "max_input_tokens",
                "max_input_length",
                "max_batch_prefill_tokens",
                "max_waiting_tokens",
                "model_dtype",
                "model_device_type",
            )
            if info.get(k) is not None
        }
        if extra:
            facts["extra"] = extra
        return Capacity(**facts, source={k: "endpoint:/info" for k in facts}) if facts else Capacity()
