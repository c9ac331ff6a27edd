"""Engine-independent log signatures and small parsing helpers shared by the engine profiles.

Every engine runs on the same stack (Python, PyTorch, CUDA, NCCL, the Hugging Face hub, argparse,
uvicorn), so the same root causes print the same text whichever engine hosts them. They live here
once; each profile calls :func:`build_signatures` with its own signatures and its engine-native
hints, and gets one ordered tuple back:

1. BENIGN lines (the engine's, then these): a shield, matched first, so a warning that quotes an
   error (``Ignore import error when loading ...: No module named ...``) never fails a server;
2. the engine's own READY / PROGRESS / FATAL / WRAPPER signatures (most specific first);
3. the generic FATAL / WRAPPER signatures below, hinted with the engine's flag names;
4. a last-resort FATAL (category ``other``) for a Python exception line nothing else explained,
   so a traceback is never mistaken for a clean log.

The first signature that matches a line wins. Strings come from upstream sources (named in the
comments) and are searched, not anchored at a log header, because per-process prefixes and level
headers differ per engine and version.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from servefleet.capacity import Capacity
from servefleet.catalog import DEFAULT_HINTS, Category
from servefleet.engines.base import SignalKind, Signature

__all__ = [
    "build_signatures",
    "merge_signatures",
    "generic_signatures",
    "GENERIC_BENIGN",
    "BOUNDARY_HINTS",
    "BOUNDARY_KEYS",
    "FALLBACK",
    "to_int",
    "to_float",
    "log_capacity",
    "as_int",
    "first_model",
    "has_flag",
]

C = Category
fatal, wrapper, benign = Signature.fatal, Signature.wrapper, Signature.benign

# ---- BENIGN: alarming words in lines that are not failures ----------------------------------
GENERIC_BENIGN: tuple[Signature, ...] = (
    # Log-level headers: vLLM "WARNING 05-14 08:25:39 [x.py:1]", uvicorn "WARNING:  ...", SGLang >= 0.5
    # "WARNING model_config.py:1098: ...", TGI "WARN text_generation_launcher: ...". A warning is
    # not a failure; the fatal error that may follow prints on its own line.
    benign(r"^(?:\d[\d:.,TZ-]*\s+)?(?:WARNING|WARN)\b"),
    # llama.cpp >= b6xxx "<elapsed> W <component> ..." and its plain "warning: ..." lines
    benign(r"^\d+\.\d+\.\d+\.\d+ W "),
    benign(r"^warning: "),
    # Python warnings: "launch_server.py:51: UserWarning: ...", "FutureWarning", "DeprecationWarning"
    benign(r"^\S+:\d+: \w*Warning: "),
    benign(r"^\s*warnings\.warn\("),
    benign(r"\b(?:DeprecationWarning|FutureWarning|PendingDeprecationWarning)\b"),
    benign(r"^(?!.*(?:Error|Exception): ).*\bis deprecated\b", re.IGNORECASE),
    # transformers / torch notices seen in healthy SGLang and vLLM start-ups
    benign(r"`torch_dtype` is deprecated"),
    benign(r"Failed to get GPU memory capacity from nvidia-smi"),
    # c10 warnings: "[W socket.cpp:464] [c10d] The server socket has failed to bind to [::]:29500" when
    # IPv6 is off (an IPv4 bind follows), "[rank0]:[W1024 ...] ProcessGroupNCCL.cpp:1496] Warning:
    # WARNING: process group has NOT been destroyed ..." at exit: warnings, not failures.
    benign(r"^(?:\[rank\d+\]:)?\[W\d*\s"),
    # Source lines quoted in a traceback ("    raise ValueError(f\"Unsupported model type {model_type}\")", leading
    # blanks stripped) name an exception class or quote a message, but are code: the message below is the evidence
    benign(r"^raise [A-Za-z_][\w.]*(?:\(|$)"),
)

# ---- the last resort ---------------------------------------------------------------------------
# The final line of a Python traceback ("AssertionError: fp8 tensor core is not supported",
# "torch.AcceleratorError: CUDA error: ..."), anywhere after a log header. Capitalised class names
# ending in Error/Exception only: "CUDA error:" / "ERROR:" / "Error(" are not matched.
FALLBACK: tuple[Signature, ...] = (
    fatal(
        r"(?:^|[\s\]:|])(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception)(?::\s|:$|$)",
        C.OTHER,
        "an unrecognised exception ended the start-up; read the evidence line and the traceback above it",
    ),
    # "Fatal Python error: Segmentation fault", "Segmentation fault (core dumped)"
    fatal(
        r"Segmentation fault|Fatal Python error|core dumped|SIGSEGV|SIGABRT",
        C.OTHER,
        "the process crashed in native code; try another build/version of the engine or its kernels",
    ),
)


# ---- boundary cases (README "Failure categories"): one category each, whatever the engine -----------
# A failure that could be put in two categories is put in one, the same in every profile; the hint
# is the engine's own (its profile's HINTS under these keys), else these words.
BOUNDARY_HINTS: dict[str, str] = {
    # a truncated or damaged weights file is a model that is not (all) there: model_not_found
    "corrupt_weights": "a weights file is truncated or damaged (a partial download?): download the model again "
    "and check its size and checksum",
    # a shared library missing or not loadable is a broken install: import_error
    "native_library": "a native library of the engine is missing or cannot be loaded (a broken install, or a "
    "library path that points elsewhere): reinstall the engine or fix the library path",
    # CUDA asked of a CPU-only build: the build has no such device: cuda_driver
    "cuda_on_cpu_build": "this build has no CUDA: use its CPU device, or install a CUDA build of the engine and torch",
    # SIGILL: a crash in native code like a segfault (other); the process, not the machine, is at fault
    "illegal_instruction": "the process died of an illegal instruction (SIGILL) in native code: a kernel uses CPU "
    "instructions (AVX-512, AMX) that fail here; choose a portable dtype or kernel, or another build",
    # host RAM (or the process's address-space limit) exhausted at an allocation: gpu_oom, as a KV cache
    # that does not fit -- memory for the model and its cache, whichever device holds it
    "host_ram": "host RAM (or the memory limit of the process) ran out at an allocation: ask for a smaller KV "
    "cache or context, or raise the limit",
    # more ranks/shards than the host has devices for ("CUDA error: invalid device ordinal"): config_error
    "tp_too_large": "the tensor-parallel size is larger than the GPUs this process can see: lower it, or widen "
    "CUDA_VISIBLE_DEVICES",
}
BOUNDARY_KEYS = tuple(BOUNDARY_HINTS)


def generic_signatures(hints: Mapping[Category | str, str] | None = None) -> tuple[Signature, ...]:
    """The engine-independent FATAL/WRAPPER signatures, hinted with ``hints`` (engine-native: keyed by
    category, and by the boundary keys of ``BOUNDARY_HINTS``)."""
    h = dict(hints or {})

    def f(
        regex: str, category: Category, flags: int = 0, hint: str | None = None, key: str | None = None
    ) -> Signature:
        if key is not None:
            hint = h.get(key) or BOUNDARY_HINTS[key]
        return fatal(regex, category, hint or h.get(category), flags)

    return (
        # -- wrappers that point elsewhere (the cause is above, or in the traceback below)
        # pydantic: "pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig";
        # the message is on the following "  Value error, ..." line.
        wrapper(r"\bValidationError: \d+ validation errors? for "),
        # -- port in use. Python: "OSError: [Errno 98] Address already in use"; asyncio/uvicorn (llama-cpp-
        # python, transformers serve, SGLang): "[Errno 98] error while attempting to bind on address
        # ('127.0.0.1', 8000): address already in use"; zmq: "zmq.error.ZMQError: Address already in use
        # (addr='tcp://127.0.0.1:29236')"; torch TCPStore: "... code: -98, name: EADDRINUSE"; Rust (TGI):
        # "Address already in use (os error 98)"; macOS errno 48.
        f(
            r"\[Errno (?:98|48)\]|Address already in use|address already in use|\bEADDRINUSE\b|os error 98",
            C.PORT_IN_USE,
        ),
        # -- GPU out of memory. torch: "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate
        # 2.00 GiB. GPU 0 has a total capacity of ..."; "RuntimeError: CUDA error: out of memory";
        # ROCm: "HIP out of memory"; cuBLAS: "CUBLAS_STATUS_ALLOC_FAILED".
        f(
            r"\bOutOfMemoryError\b|CUDA out of memory|HIP out of memory|CUDA error: out of memory"
            r"|CUBLAS_STATUS_ALLOC_FAILED|cudaErrorMemoryAllocation",
            C.GPU_OOM,
        ),
        # boundary: host RAM exhausted (c10/core/impl/alloc_cpu.cpp; numpy's MemoryError, ggml's is llama.cpp's own)
        f(
            r"DefaultCPUAllocator: (?:can't allocate memory|not enough memory)|^(?:numpy\.core\._exceptions\._ArrayMemoryError"
            r"|MemoryError)\b",
            C.GPU_OOM,
            key="host_ram",
        ),
        # -- CUDA driver / device visibility (torch and CUDA runtime strings)
        f(r"CUDA driver version is insufficient for CUDA runtime version", C.CUDA_DRIVER),
        f(
            r"no CUDA-capable device is detected|No CUDA GPUs are available",
            C.CUDA_DRIVER,
            hint="no GPU is visible to the process; check CUDA_VISIBLE_DEVICES and nvidia-smi",
        ),
        f(
            r"Found no NVIDIA driver on your system|NVIDIA driver on your system is too old"
            r"|NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver",
            C.CUDA_DRIVER,
        ),
        # boundary: a rank set to a GPU index the process cannot see -- more ranks than GPUs
        f(r"CUDA error: invalid device ordinal|cudaErrorInvalidDevice\b", C.CONFIG_ERROR, key="tp_too_large"),
        # boundary: CUDA asked of a CPU-only torch (torch/cuda/__init__.py)
        f(r"Torch not compiled with CUDA enabled", C.CUDA_DRIVER, key="cuda_on_cpu_build"),
        f(
            r"libcuda\.so[.\d]*: cannot open shared object file|CUDA driver initialization failed"
            r"|cudaErrorInsufficientDriver|cudaErrorNoDevice"
            r"|forward compatibility was attempted on non supported HW|system has unsupported display driver",
            C.CUDA_DRIVER,
        ),
        # -- NCCL / torch.distributed. torch: "torch.distributed.DistBackendError: NCCL error in: ...
        # ncclUnhandledCudaError: Call to CUDA function failed."; pynccl: "RuntimeError: NCCL error: ...";
        # "ProcessGroupNCCL ... Watchdog caught collective operation timeout".
        f(
            r"\bNCCL error\b|\bnccl\w*Error\b|ncclUnhandledCudaError|ncclSystemError|ncclInternalError"
            r"|ncclInvalidUsage|ncclRemoteError|ProcessGroupNCCL.*(?:timeout|error|abort)|DistBackendError"
            r"|DistNetworkError|DistStoreError|Gloo connectFullMesh failed",
            C.NCCL_OR_DISTRIBUTED,
            re.IGNORECASE,
        ),
        # -- model not found / unreadable (huggingface_hub and transformers strings, v4.4x-v5.x)
        f(r"is not a local folder and is not a valid model identifier", C.MODEL_NOT_FOUND),
        f(
            r"Client Error: .*for url: https://huggingface\.co/api/models/|Cannot find any model weights with",
            C.MODEL_NOT_FOUND,
        ),
        f(
            r"Repository Not Found for url|RepositoryNotFoundError|RevisionNotFoundError"
            r"|is not a valid git identifier \(branch name, tag name or commit id\)",
            C.MODEL_NOT_FOUND,
        ),
        f(
            r"Repo id must be in the form 'repo_name' or 'namespace/repo_name'|Repo id must use alphanumeric chars"
            r"|\bHFValidationError\b",
            C.MODEL_NOT_FOUND,
            hint="the model was taken as a Hugging Face repo id: a local folder that does not exist (check the path)",
        ),
        f(
            r"Cannot find the requested files in the disk cache and outgoing traffic has been disabled"
            r"|Cannot find an appropriate cached snapshot folder|offline mode is enabled"
            r"|We couldn't connect to '.*' to load the files, and couldn't find them in the cached files"
            r"|LocalEntryNotFoundError|Cannot access file since 'local_files_only=True'",
            C.MODEL_NOT_FOUND,
            hint="offline (HF_HUB_OFFLINE=1) and the model is not in the cache: fix the local path or download it first",
        ),
        f(
            r"GatedRepoError|Access to model .* is restricted|You are trying to access a gated repo",
            C.MODEL_NOT_FOUND,
            hint="a gated repo: accept its licence on the Hub and set HF_TOKEN for the server",
        ),
        f(
            r"does not appear to have a file named|does not appear to have files named|Error no file named"
            r"|no file named (?:pytorch_model|model\.safetensors|config\.json)",
            C.MODEL_NOT_FOUND,
            hint="the model folder lacks weight or config files; check the path and that the download finished",
        ),
        # tokenizer: "Can't load tokenizer for 'x'"; a missing tokenizer.json on a sentencepiece model shows up
        # as "... requires the SentencePiece library but it was not found in your environment" (install
        # sentencepiece) -- usually the local folder is incomplete, not the library missing.
        f(
            r"Can't load tokenizer for|requires the SentencePiece library but it was not found|install sentencepiece"
            r"|Couldn't instantiate the backend tokenizer from one of"
            r"|Cannot instantiate this tokenizer from a slow version",
            C.MODEL_NOT_FOUND,
            hint="the tokenizer could not be loaded: check the folder has tokenizer.json/tokenizer_config.json "
            "(a 'sentencepiece' complaint usually means the tokenizer files are missing)",
        ),
        # boundary: a truncated or damaged weights file. safetensors (Rust): "safetensors_rust.SafetensorError:
        # Error while deserializing header: HeaderTooLarge" / "MetadataIncompleteBuffer" / "incomplete
        # metadata, file not fully covered"; torch's zip reader on a cut pytorch_model.bin.
        f(
            r"Error while deserializing header|\bSafetensorError\b|\bHeaderTooLarge\b|\bMetadataIncompleteBuffer\b"
            r"|InvalidHeaderDeserialization|incomplete metadata, file not fully covered"
            r"|PytorchStreamReader failed reading zip archive|failed finding central directory",
            C.MODEL_NOT_FOUND,
            key="corrupt_weights",
        ),
        # transformers' config loader (every engine loads config.json with it): a config.json that is not JSON
        # ("OSError: It looks like the config file at '.../config.json' is not a valid JSON file.", below the
        # JSONDecodeError it re-raises) or none at all / one without model_type ("Unrecognized model in X.
        # Should have a `model_type` key in its config.json") -- the model folder is incomplete, not unsupported
        f(
            r"It looks like the config file at '.*' is not a valid JSON file",
            C.MODEL_NOT_FOUND,
            hint="the model's config.json is not valid JSON (cut short or damaged): download the model again",
        ),
        f(
            r"Unrecognized model in .*Should have a `model_type` key",
            C.MODEL_NOT_FOUND,
            hint="the model folder has no config.json, or one without model_type: check the path and that the download finished",
        ),
        # -- unsupported model (transformers 4.x/5.x, vLLM registry)
        f(
            r"Transformers does not recognize this architecture|does not recognize this architecture"
            r"|model type `?[\w.-]+`? (?:is )?not supported|Unrecognized model in\b"
            r"|Model architectures \[.*\] are not supported|are not supported for now\. Supported architectures"
            r"|is not supported in-tree anymore|and is not supported anymore",
            C.UNSUPPORTED_MODEL,
        ),
        # -- configuration / arguments. argparse: "api_server.py: error: unrecognized arguments: --x",
        # "error: argument --max-model-len: invalid int value: 'x'", "error: argument --dtype: invalid choice:
        # 'x' (choose from ...)", "error: the following arguments are required: --model-path".
        f(
            r"\berror: unrecognized arguments\b|\berror: argument [-\w/, ]+: |\berror: the following arguments are required"
            r"|\berror: ambiguous option\b|\berror: invalid choice\b",
            C.CONFIG_ERROR,
        ),
        # pydantic message lines: "  Value error, Invalid value ... [type=value_error, input_value=..."
        f(
            r"^\s*Value error, |\[type=\w+_error\b|^\s*(?:Input should be|Field required|Extra inputs are not permitted)\b",
            C.CONFIG_ERROR,
        ),
        # two flags that do not go together (vLLM arg_utils: "--spec-tokens and --speculative-config['...'] are
        # mutually exclusive"; argparse groups say "not allowed with argument", matched above)
        f(r"\bare mutually exclusive\b", C.CONFIG_ERROR),
        f(
            r"must be divisible by tensor parallel size|is not divisible by",
            C.CONFIG_ERROR,
            hint="the tensor-parallel size must divide the model's head counts; choose another number of GPUs",
        ),
        # boundary: a shared library missing or not loadable (dlopen's words; libcuda is cuda_driver, above)
        f(
            r"cannot open shared object file|undefined symbol: |wrong ELF class|invalid ELF header",
            C.IMPORT_ERROR,
            key="native_library",
        ),
        # -- imports and missing programs
        f(
            r"\b(?:ModuleNotFoundError|ImportError): |(?:^|: )No module named \S+|cannot import name '\w+' from"
            r"|undefined symbol: |GLIBC_[\d.]+' not found|version `GLIBCXX_[\d.]+' not found"
            r"|error while loading shared libraries: ",
            C.IMPORT_ERROR,
        ),
        # the launch itself: the detach wrapper's sh reports a missing program ("sh: 5: llama-server: not
        # found", bash "sh: line 5: x: command not found"), and build tools missing for JIT kernels.
        f(
            r"^(?:/bin/)?(?:sh|bash|dash): (?:line )?\d+: (?:exec: )?\S+: "
            r"(?:command not found|not found|No such file or directory|Permission denied)|No such file or directory: '(?:ninja|nvcc|gcc|g\+\+|cc)'|Failed to find C compiler"
            r"|Ninja is required",
            C.IMPORT_ERROR,
            hint="a program the server needs (the engine itself, ninja, nvcc or a C compiler) is not on PATH",
        ),
        # -- killed: the shell's "Killed" / "sh: line 1: 4242 Killed  python3 ...", an exit by SIGKILL
        f(
            r"^Killed(?:\s|$)|\s\d+\s+Killed(?:\s|$)|\bExit code: -9\b|\bsignal 9\b|\bSIGKILL\b|Out of memory: Killed process"
            r"|oom-kill",
            C.KILLED,
        ),
        # boundary: SIGILL. A shell prints "Illegal instruction (core dumped)", Python's faulthandler
        # "Fatal Python error: Illegal instruction"; a multiprocessing parent "exitcode=-4"/"signal 4".
        # SGLang's "Exit code: -4" under "Rank 0 scheduler is dead"; TGI's "Shard process was signaled to
        # shutdown with signal 4"
        f(
            r"Illegal instruction|\bSIGILL\b|\bExit code: -4\b|\bexitcode=-4\b|\(exit code: -4\)|signaled to shutdown with signal 4\b",
            C.OTHER,
            key="illegal_instruction",
        ),
        # -- CUDA faults at start-up (category other, but a useful hint)
        f(
            r"CUDA error: an illegal memory access|device-side assert triggered|CUDA error: unspecified launch failure"
            r"|no kernel image is available for execution on the device",
            C.OTHER,
            hint="a CUDA kernel failed: a GPU/architecture not supported by this build, or an engine bug; "
            "try disabling CUDA graphs or another attention backend",
        ),
    )


def build_signatures(
    specific: Iterable[Signature], hints: Mapping[Category | str, str] | None = None
) -> tuple[Signature, ...]:
    """Order an engine's signatures with the generic ones: BENIGN first, then engine, generic, fallback."""
    specific = tuple(_engine_hinted(s, hints or {}) for s in specific)
    own_benign = tuple(s for s in specific if s.kind is SignalKind.BENIGN)
    own_rest = tuple(s for s in specific if s.kind is not SignalKind.BENIGN)
    return own_benign + GENERIC_BENIGN + own_rest + generic_signatures(hints) + FALLBACK


def _engine_hinted(sig: Signature, hints: Mapping[Category | str, str]) -> Signature:
    """An engine's own signature that carries only the generic hint of its category gets the engine's
    hint for that category (its flag names), as the generic signatures do."""
    if sig.category is not None and sig.hint == DEFAULT_HINTS[sig.category] and sig.category in hints:
        return replace(sig, hint=hints[sig.category])
    return sig


def merge_signatures(tuples: Iterable[Iterable[Signature]]) -> tuple[Signature, ...]:
    """Several engines' signature tuples as one, for a log whose engine is not known.

    Concatenating them would put the first engine's generic and last-resort signatures before the
    next engine's own shields and specifics; this keeps the layering across engines: every BENIGN
    first, then every engine-specific signature (in engine order), then the generic ones, then the
    last resort. Duplicates (same pattern) keep their first occurrence."""
    generic = {s.pattern.pattern for s in generic_signatures()}
    last = {s.pattern.pattern for s in FALLBACK}
    layers: tuple[list[Signature], ...] = ([], [], [], [])
    seen: set[tuple[str, int]] = set()
    for sigs in tuples:
        for sig in sigs:
            key = (sig.pattern.pattern, sig.pattern.flags)
            if key in seen:
                continue
            seen.add(key)
            text = sig.pattern.pattern
            layer = 0 if sig.kind is SignalKind.BENIGN else 3 if text in last else 2 if text in generic else 1
            layers[layer].append(sig)
    return tuple(s for layer in layers for s in layer)


# ---- numbers -------------------------------------------------------------------------------------
def to_int(text: str | None) -> int | None:
    """``"1,390,112"`` / ``"1_390_112"`` / ``"1390112"`` -> 1390112; anything else -> None."""
    if text is None:
        return None
    cleaned = text.strip().replace(",", "").replace("_", "")
    try:
        return int(cleaned)
    except ValueError:
        try:
            value = float(cleaned)
        except ValueError:
            return None
        return int(value) if value.is_integer() else None


def to_float(text: str | None) -> float | None:
    """``"339.38x"`` / ``"1,024.5"`` -> float; anything else -> None."""
    if text is None:
        return None
    try:
        return float(text.strip().replace(",", "").rstrip("xX"))
    except ValueError:
        return None


def as_int(value: Any) -> int | None:
    """An int from a JSON value (int, integral float, or a numeric string); None otherwise."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value) if value.is_integer() else None
    if isinstance(value, str):
        return to_int(value)
    return None


def has_flag(args: Sequence[str], *names: str) -> bool:
    """Whether engine args already carry one of the flags (``--x V`` or ``--x=V``)."""
    return any(a == n or a.startswith(n + "=") for a in args for n in names)


def log_capacity(**facts: Any) -> Capacity | None:
    """A Capacity from facts found in one log line; ``source`` marks each fact as coming from the log.

    ``None`` values and empty dicts are dropped; nothing left means None (no capacity fact)."""
    present = {k: v for k, v in facts.items() if v is not None and v != {}}
    if not present:
        return None
    return Capacity(**present, source={k: "log" for k in present})


def first_model(models: Any) -> dict[str, Any] | None:
    """The first entry of an OpenAI ``/v1/models`` answer, or None."""
    data = models.get("data") if isinstance(models, dict) else None
    if isinstance(data, list) and data and isinstance(data[0], dict):
        return data[0]
    return None
