"""llama.cpp: the native ``llama-server`` (ggml-org/llama.cpp) and llama-cpp-python's server.

Which one runs is decided by the launch command (``command`` in the fleet file):

- default, or any command that is not Python: native, ``llama-server -m M --host H --port P [--alias S]``
  (``command = ["/opt/llama.cpp/build/bin/llama-server"]`` picks a binary);
- a command that names ``llama_cpp.server`` or is just a Python interpreter: llama-cpp-python,
  ``python3 -m llama_cpp.server --model M --host H --port P [--model_alias S]``
  (``command = ["python3", "-m", "llama_cpp.server"]`` or ``command = ["/venv/bin/python"]``).

Readiness: ``/health`` (native: 503 "Loading model" then 200; it answers before the model is loaded,
which is why it is a probe and not a socket check), else ``/v1/models`` (llama-cpp-python has no
``/health``). Strings are from ``tools/server/server.cpp`` (and ``examples/server`` before 2025:
"couldn't bind HTTP server socket", "exiting due to HTTP server error", "HTTP server is listening",
"server is listening on", "model loaded", "all slots are idle"), ``src/llama-model-loader.cpp`` /
``llama.cpp`` ("error loading model", "unknown model architecture"), ``ggml-cuda`` ("cudaMalloc
failed: out of memory"), ``common/arg.cpp`` ("error: invalid argument"), llama-cpp-python's
``llama_cpp/_internals.py`` ("Failed to load model from file"), and uvicorn.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import PurePath
from typing import TYPE_CHECKING, Any, ClassVar

from servefleet.capacity import Capacity
from servefleet.catalog import Category
from servefleet.engines import native_args as na
from servefleet.engines.base import EngineProfile, LaunchSpec, Probe, ServingMetrics, Signature, TokenizeEndpoint
from servefleet.engines.generic import as_int, build_signatures, first_model, log_capacity

if TYPE_CHECKING:
    from servefleet.http import HttpClient

__all__ = ["LlamaCppEngine"]

C = Category
S = Signature

HINTS = {
    C.GPU_OOM: "lower -ngl/--n-gpu-layers (keep some layers on the CPU), -c/--ctx-size or -np/--parallel, "
    "or use a smaller quantization",
    C.PORT_IN_USE: "choose another --port, or stop the process that holds it (often an older llama-server)",
    C.CONFIG_ERROR: "a llama.cpp server argument is invalid or was removed; read the evidence line and `llama-server --help` "
    "(llama-cpp-python: `python -m llama_cpp.server --help`)",
    C.MODEL_NOT_FOUND: "check the -m/--model path: it must be a readable, complete .gguf file (the GGUF carries its tokenizer)",
    C.UNSUPPORTED_MODEL: "this llama.cpp build does not know the model architecture (the GGUF's general.architecture); "
    "update llama.cpp (or llama-cpp-python) or re-convert the GGUF",
    C.IMPORT_ERROR: "llama-server is not on PATH (set command in the fleet file) or llama-cpp-python is not installed",
    # the boundary cases (README "Failure categories"; generic.BOUNDARY_HINTS)
    "corrupt_weights": "the .gguf file is truncated or damaged (a partial download?): download or convert it again",
    "native_library": "llama-cpp-python could not load libllama.so or a libggml*.so it links against: unset "
    "LLAMA_CPP_LIB_PATH or point it at a folder with all of llama_cpp/lib, or reinstall llama-cpp-python",
    "cuda_on_cpu_build": "this llama.cpp build is CPU-only: drop -ngl/--n-gpu-layers (--n_gpu_layers) or install a CUDA build",
    "host_ram": "host RAM (or the memory limit of the process) ran out: lower -c/--ctx-size (--n_ctx) or use "
    "--mmap so the weights are not copied",
    "tp_too_large": "-mg/--main-gpu or -ts/--tensor-split names more GPUs than this process can see: fix them, or widen "
    "CUDA_VISIBLE_DEVICES",
    "illegal_instruction": "llama.cpp died of an illegal instruction: the build uses CPU instructions (AVX-512, AMX) this "
    "CPU lacks; rebuild with GGML_NATIVE=OFF or install a portable wheel",
}

OWN_SIGNATURES = (
    # ---- benign
    S.benign(r"no usable GPU found, --gpu-layers option will be ignored"),
    S.benign(r"^DEPRECATED: "),
    # ggml-cuda: "ggml_cuda_init: failed to initialize CUDA: no CUDA-capable device is detected" -- llama.cpp
    # goes on with the CPU backend, so the server still starts: a warning, not a failure.
    S.benign(r"ggml_cuda_init: failed to initialize"),
    # Source lines quoted in a traceback name an exception class but are code: llama-cpp-python 0.3.36 with
    # a missing file quotes '    raise ValueError(f"Model path does not exist: {model_path}")' just above
    # the message line "ValueError: Model path does not exist: /m/x.gguf" that is the evidence.
    S.benign(r"^raise [A-Za-z_][\w.]*(?:\(|$)"),
    # ---- ready (evidence; the probe decides). Native: "main: server is listening on http://127.0.0.1:8080 -
    # starting the main loop" (newer: "srv  llama_server: listening on http://..."), then "all slots are idle".
    S.ready(r"\bserver is listening on \S+|llama_server: listening on http|update_slots: all slots are idle"),
    # llama-cpp-python (uvicorn): "Uvicorn running on http://..." is printed once the socket is bound (a
    # failed bind prints "[Errno 98] error while attempting to bind" instead), after the model loaded.
    S.ready(r"Uvicorn running on https?://\S+"),
    # ---- wrappers: consequences printed after the cause
    S.wrapper(r"exiting due to (?:HTTP server|model loading) error"),
    S.wrapper(r"load_model: failed to load model|\bfailed to load model '"),
    # ---- fatal, llama.cpp's own words (ggml-cuda / ggml-backend allocation failures first)
    S.fatal(r"couldn't bind HTTP server socket", C.PORT_IN_USE),
    # ggml-cpu: the first line of a KV cache (or weights) too large for the memory the process may use,
    # above "failed to allocate CPU buffer of size N" / "failed to allocate buffer for kv cache" (real, 0.3.36).
    S.fatal(
        r"ggml_aligned_malloc: insufficient memory|failed to allocate buffer for kv cache",
        C.GPU_OOM,
        "the KV cache (or the weights) does not fit in memory: lower -c/--ctx-size (--n_ctx), -np/--parallel, "
        "or use a smaller quantization",
    ),
    S.fatal(
        r"cudaMalloc failed: out of memory|failed to allocate \w+ buffer|unable to allocate \w+ buffer"
        r"|ggml_backend_\w+_buffer_type_alloc_buffer: allocating .* failed|out of device memory"
        r"|ErrorOutOfDeviceMemory|hipMalloc failed",
        C.GPU_OOM,
    ),
    # llama-cpp-python's loader (llama_cpp/_ctypes_extensions.py), LLAMA_CPP_LIB_PATH naming a folder
    # without libllama ("FileNotFoundError: Shared library with base name 'llama' not found") or with one
    # that does not load ("RuntimeError: Failed to load shared library '...': libggml.so.0: cannot open ...")
    S.fatal(
        r"Shared library with base name '\w+' not found|Failed to load shared library '",
        C.IMPORT_ERROR,
        HINTS["native_library"],
    ),
    # a folder (or an empty file) where a .gguf file is expected: "gguf_init_from_reader: failed to read magic"
    S.fatal(
        r"gguf_init_from_\w+: failed to read magic",
        C.MODEL_NOT_FOUND,
        "llama.cpp found no GGUF header there: --model (-m) must name a complete .gguf file, not a folder",
    ),
    # llama-cpp-python server (server/model.py): a chat format that needs a second setting
    S.fatal(
        r"must be set for hf-autotokenizer|must be set for hf-tokenizer-config",
        C.CONFIG_ERROR,
        "--chat_format hf-autotokenizer needs --hf_pretrained_model_name_or_path (hf-tokenizer-config needs "
        "--hf_tokenizer_config_path): pass it, or choose another --chat_format",
    ),
    S.fatal(
        r"failed to open GGUF file|gguf_init_from_file: failed to|llama_load_model_from_file: failed to load model"
        r"|Model path does not exist|Failed to load model from file",
        C.MODEL_NOT_FOUND,
    ),
    S.fatal(
        r"unknown model architecture|error loading model architecture|unknown pre-tokenizer type", C.UNSUPPORTED_MODEL
    ),
    # boundary: a truncated or damaged file is model_not_found (README); it must come before the
    # llama-cpp-python "Failed to load model from file" line it precedes
    S.fatal(
        r"model is corrupted or incomplete|data is not within the file bounds|invalid magic characters"
        r"|tensor '.*' has wrong shape|failed to read tensor (?:info|data)|failed to read key-value pairs",
        C.MODEL_NOT_FOUND,
        "the GGUF file is truncated, corrupted or for another converter version; re-download or re-convert it",
    ),
    S.fatal(
        r"(?:^|\s)error: invalid argument: |error while handling argument|(?:^|\s)error: unknown argument: "
        r"|(?:^|\s)error: failed to parse|quantized V cache requires flash_attn|Unsupported cache type",
        C.CONFIG_ERROR,
    ),
    S.fatal(r"error loading model: ", C.OTHER, "llama.cpp could not load the model; read the evidence line"),
    # ---- progress, in start-up order
    S.progress(r"HTTP server is listening, hostname|binding port", "HTTP server up, loading model"),
    S.progress(
        r"main: loading model|load_model: loading model|llama_model_loader: loaded meta data"
        r"|llama_model_load_from_file",
        "loading model",
    ),
    S.progress(r"load_tensors: |llm_load_tensors: |loading model tensors", "loading weights"),
    S.progress(
        r"llama_context: |llama_new_context_with_model: |llama_kv_cache|llama_init_from_model", "allocating KV cache"
    ),
    S.progress(r"warming up the model", "warming up"),
    S.progress(r"initializing slots|new slot", "initialising slots"),
    S.progress(r"main: model loaded|llama_server: model loaded|chat template", "model loaded"),
    # llama-cpp-python (uvicorn): startup complete is printed before the port is bound
    S.progress(
        r"Application startup complete\.|Started server process|Waiting for application startup",
        "HTTP server starting",
    ),
)

# Flags whose values servefleet needs. Native llama-server (common/arg.cpp): -c is the context of
# all slots together (each of the -np slots gets its share unless --kv-unified).
NATIVE_ARGS = na.ArgTable(
    na.Flag(("-m", "--model"), "model"),
    na.Flag(("-a", "--alias"), "served_model_name"),
    na.Flag(("--port",), "port", na.to_int),
    na.Flag(("--host",), "host"),
    na.Flag(("-np", "--parallel"), "max_running_requests", na.to_int),
    na.Flag(("-c", "--ctx-size"), "context_length", na.to_int),
    na.Flag(("-md", "--model-draft"), "speculative", key="draft_model"),
    na.Flag(("--draft-max", "--draft", "--draft-n"), "speculative", na.to_int, key="draft_max"),
)
# llama-cpp-python (llama_cpp/server/settings.py: pydantic fields as snake_case flags)
PYTHON_ARGS = na.ArgTable(
    na.Flag(("--model",), "model"),
    na.Flag(("--model_alias",), "served_model_name"),
    na.Flag(("--port",), "port", na.to_int),
    na.Flag(("--host",), "host"),
    na.Flag(("--n_ctx",), "context_length", na.to_int),
    na.Flag(("--draft_model",), "speculative", key="draft_model"),
    na.Flag(("--draft_model_num_pred_tokens",), "speculative", na.to_int, key="num_pred_tokens"),
)

_SLOTS = re.compile(r"initializing slots, n_slots = (\d+)")
_SLOT_CTX = re.compile(r"new slot,? n_ctx(?:_slot)? = (\d+)")
_CTX = re.compile(r"\b(?:llama_context|llama_new_context_with_model): n_ctx\s+= (\d+)")
# "llama_context: n_ctx_seq             = 1024" (per sequence), "llama_context: n_seq_max             = 1"
_CTX_SEQ = re.compile(r"\bllama_context: n_ctx_seq\s+= (\d+)")
_SEQ_MAX = re.compile(r"\bllama_context: n_seq_max\s+= (\d+)")
_KV_SIZE = re.compile(r"llama_kv_cache\w*: +size = +([\d.]+) MiB \( *(\d+) cells")
# "build: 6895 (4341dc8bc) with cc ...", "version: 5678 (4df29be)", "version: 0.1.0-dev (build 1, commit 4df29be)"
_BUILD = re.compile(
    r"(?:^|\s)(?:build|version): (?P<n>\d+) \((?P<c>[0-9a-f]+)\)"
    r"|^version: \S+ \(build (?P<n2>\d+), commit (?P<c2>[0-9a-f]+)\)"
)
_PARALLEL = re.compile(r"n_parallel is set to auto, using n_parallel = (\d+)")


# Native llama-server's POST /tokenize: {"content", "add_special"} -> {"tokens": [...]}. (llama-cpp-python's
# server has /extras/tokenize instead, counting with the BOS token: not used.)
# Load and progress series of llama-server's /metrics (served with --metrics).
SERVING_METRICS = ServingMetrics(
    running=("llamacpp:requests_processing",),
    queued=("llamacpp:requests_deferred",),
    kv_usage=("llamacpp:kv_cache_usage_ratio",),
    generation_tokens=("llamacpp:tokens_predicted_total",),
    prompt_tokens=("llamacpp:prompt_tokens_total",),
)
TOKENIZE = TokenizeEndpoint("llamacpp", "content", fixed=(("add_special", False),), answer="tokens")


class LlamaCppEngine(EngineProfile):
    name: ClassVar[str] = "llamacpp"
    probe: ClassVar[Probe] = Probe(("/health", "/v1/models"))
    signatures: ClassVar[tuple[Signature, ...]] = build_signatures(OWN_SIGNATURES, HINTS)
    detect: ClassVar[tuple[re.Pattern[str], ...]] = (
        re.compile(r"llama_model_loader: |llama_context: |llama_new_context_with_model: |llm_load_tensors: "),
        re.compile(r"\bllama_server\b|llama-server|main: HTTP server is listening|couldn't bind HTTP server socket"),
        re.compile(r"\bggml_\w+: |\bgguf_\w+: "),
        re.compile(r"^srv +\w+: |^slot +\w+: "),
        re.compile(r"llama_cpp\.server|llama_cpp/"),
        # llama-cpp-python's argparse usage (an argument error prints nothing else): its snake_case flags
        re.compile(r"\[--n_gpu_layers N_GPU_LAYERS\]|\[--model_alias MODEL_ALIAS\]"),
    )
    memory_flag: ClassVar[str | None] = "--n-gpu-layers"
    # The KV cache and compute buffers are allocated when the context is created, just before the
    # HTTP server starts: readiness is the memory-settled signal.
    memory_settled: ClassVar[tuple[re.Pattern[str], ...]] = ()
    # Native llama-server honours `ignore_eos` (tools/server: params_from_json_cmpl); llama-cpp-python
    # accepts it without effect (its pydantic request models drop unknown fields).
    supports_ignore_eos: ClassVar[bool] = True
    models_owner: ClassVar[str | None] = "llamacpp"
    metrics_prefix: ClassVar[str | None] = "llamacpp:"
    arg_table: ClassVar[na.ArgTable] = NATIVE_ARGS
    tokenize: ClassVar[TokenizeEndpoint | None] = TOKENIZE
    serving_metrics: ClassVar[ServingMetrics] = SERVING_METRICS

    def arg_table_for(self, command: Sequence[str] = ()) -> na.ArgTable:
        return PYTHON_ARGS if is_python_server(list(command)) else NATIVE_ARGS

    # ---- launch ---------------------------------------------------------------------------------
    def build_argv(self, spec: LaunchSpec) -> list[str]:
        """Native ``llama-server`` or llama-cpp-python, chosen by ``spec.command`` (module docstring).

        llama.cpp offloads to every visible GPU itself (``CUDA_VISIBLE_DEVICES`` from ``gpus``), so no
        tensor-parallel flag is added; ``-ngl``, ``-c``, ``-np``... go in the extra args untouched."""
        native = self.launch_args(spec)
        command = list(spec.command) or ["llama-server"]
        if is_python_server(command):
            if "llama_cpp.server" not in command:
                command += ["-m", "llama_cpp.server"]
            argv = [*command] if "model" in native else [*command, "--model", spec.model]
            alias_flag = "--model_alias"
        else:
            argv = [*command] if "model" in native else [*command, "-m", spec.model]
            alias_flag = "--alias"
        if "host" not in native:
            argv += ["--host", spec.host]
        if "port" not in native:
            argv += ["--port", spec.port_arg]
        if spec.served_model_name and "served_model_name" not in native:
            argv += [alias_flag, spec.served_model_name]
        return argv + list(spec.extra_args)

    # ---- log --------------------------------------------------------------------------------------
    def capacity_from_line(self, line: str) -> Capacity | None:
        if match := _SLOTS.search(line):
            return log_capacity(max_running_requests=int(match.group(1)))
        if match := _PARALLEL.search(line):
            return log_capacity(max_running_requests=int(match.group(1)))
        if match := _SLOT_CTX.search(line):
            return log_capacity(context_length=int(match.group(1)))  # per slot
        if match := _KV_SIZE.search(line):
            return log_capacity(
                kv_cache_tokens=int(match.group(2)), kv_cache_gib=round(float(match.group(1)) / 1024, 4)
            )
        if match := _CTX.search(line):
            return log_capacity(kv_cache_tokens=int(match.group(1)))  # n_ctx = KV cells over all slots
        if match := _CTX_SEQ.search(line):
            return log_capacity(context_length=int(match.group(1)))
        if match := _SEQ_MAX.search(line):
            return log_capacity(max_running_requests=int(match.group(1)))  # sequences decoded together
        if match := _BUILD.search(line):
            number, commit = match["n"] or match["n2"], match["c"] or match["c2"]
            return log_capacity(engine_version=f"b{number}-{commit}")  # the form /props calls build_info
        return None

    # ---- endpoints --------------------------------------------------------------------------------
    async def capacity_from_server(self, client: HttpClient, base_url: str) -> Capacity:
        """Native ``GET /props``: ``default_generation_settings.n_ctx`` (per slot; older builds put
        ``n_ctx`` at the top level), ``total_slots``, ``build_info``, ``model_alias``/``model_path``.
        llama-cpp-python has no ``/props``: ``/v1/models`` gives the served name only."""
        base = base_url.rstrip("/")
        props = await client.get_json(base + "/props")
        facts: dict[str, Any] = {}
        if isinstance(props, dict):
            settings = props.get("default_generation_settings")
            settings = settings if isinstance(settings, dict) else {}
            n_ctx = as_int(settings.get("n_ctx")) or as_int(props.get("n_ctx"))
            if n_ctx:
                facts["context_length"] = n_ctx
            slots = as_int(props.get("total_slots"))
            if slots:
                facts["max_running_requests"] = slots
            if isinstance(props.get("build_info"), str):
                facts["engine_version"] = props["build_info"]
            alias = props.get("model_alias")
            if isinstance(alias, str) and alias:
                facts["served_model"] = alias
            if isinstance(props.get("model_path"), str):
                facts["extra"] = {"model_path": props["model_path"]}
        sources = {k: "endpoint:/props" for k in facts}
        if "served_model" not in facts:
            model = first_model(await client.get_json(base + "/v1/models"))
            if model and isinstance(model.get("id"), str):
                facts["served_model"], sources["served_model"] = model["id"], "endpoint:/v1/models"
        return Capacity(**facts, source=sources) if facts else Capacity()


def is_python_server(command: list[str]) -> bool:
    """Whether a launch command runs llama-cpp-python rather than the native ``llama-server``."""
    if "llama_cpp.server" in command:
        return True
    return len(command) == 1 and re.fullmatch(r"python(?:\d+(?:\.\d+)?)?", PurePath(command[0]).name) is not None
