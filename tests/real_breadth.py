"""The breadth scenarios of issue 16: every failure class real engines show, provoked on the real engines.

Each scenario is a server of a real fleet launched by `servefleet up` (the ``up`` scenarios of
tests/real_engines.py), with a broken model folder, a broken install or a bad argument.
scripts/record-real-engine-logs.py ``--set breadth`` records them as fixtures (tests/fixtures/logs/real/);
tests/test_real_logs_recorded.py checks `diagnose` on the recorded logs without any engine.

A model *variant* is built from the tiny model (``servefleet model tiny``) next to it: a folder
without weights, a truncated weights file, an unknown architecture... ``prepare`` callables return
the extra environment of a scenario (a broken ``LLAMA_CPP_LIB_PATH``) after setting up what it points at.
Classes an engine cannot show are listed in tests/fixtures/logs/real/README.md with the reason.
"""

from __future__ import annotations

import json
import shutil
import struct
from collections.abc import Callable
from pathlib import Path

from real_engines import Scenario

__all__ = ["BREADTH", "VARIANTS", "heldout", "TRANSFORMERS_ARGS", "TRANSFORMERS_ENV", "build_variant"]

GGUF = "model.gguf"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt")


def _copy(tiny: Path, dest: Path) -> Path:
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(tiny, dest)
    return dest


def _no_weights(tiny: Path, dest: Path) -> Path:
    folder = _copy(tiny, dest)
    for f in [*folder.glob("*.safetensors"), *folder.glob("*.gguf")]:
        f.unlink()
    return folder


def _no_tokenizer(tiny: Path, dest: Path) -> Path:
    folder = _copy(tiny, dest)
    for name in TOKENIZER_FILES:
        (folder / name).unlink(missing_ok=True)
    return folder


def _empty(tiny: Path, dest: Path) -> Path:
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    return dest


def _file_for_folder(tiny: Path, dest: Path) -> Path:
    """A file where the engine wants a model folder (config.json of a good model)."""
    return _copy(tiny, dest) / "config.json"


def _folder_for_file(tiny: Path, dest: Path) -> Path:
    """A folder where llama.cpp wants a .gguf file (the model folder itself)."""
    return _copy(tiny, dest)


def _weights(folder: Path) -> Path:
    found = sorted(folder.glob("*.safetensors")) or sorted(folder.glob("*.gguf"))
    assert found, folder
    return found[0]


def _truncated(gguf: bool) -> Callable[[Path, Path], Path]:
    """A partial download: the weights file cut at 60 %."""

    def make(tiny: Path, dest: Path) -> Path:
        folder = _copy(tiny, dest)
        weights = folder / GGUF if gguf else _weights(folder)
        data = weights.read_bytes()
        weights.write_bytes(data[: len(data) * 6 // 10])
        return weights if gguf else folder

    return make


def _corrupt(gguf: bool) -> Callable[[Path, Path], Path]:
    """A damaged file: its first 64 bytes overwritten (safetensors' header length, GGUF's magic)."""

    def make(tiny: Path, dest: Path) -> Path:
        folder = _copy(tiny, dest)
        weights = folder / GGUF if gguf else _weights(folder)
        data = bytearray(weights.read_bytes())
        data[:64] = b"\xa5" * 64
        weights.write_bytes(bytes(data))
        return weights if gguf else folder

    return make


def _unknown_architecture(tiny: Path, dest: Path) -> Path:
    """config.json's ``architectures`` names a class that does not exist (model_type stays llama)."""
    folder = _copy(tiny, dest)
    config = json.loads((folder / "config.json").read_text())
    config["architectures"] = ["FancyNetForCausalLM"]
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder


def _unknown_model_type(tiny: Path, dest: Path) -> Path:
    folder = _copy(tiny, dest)
    config = json.loads((folder / "config.json").read_text())
    config.update(model_type="fancynet", architectures=["FancyNetForCausalLM"])
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder


def _gguf_unknown_architecture(tiny: Path, dest: Path) -> Path:
    """The GGUF's ``general.architecture`` value renamed (same length, so every offset holds)."""
    folder = _copy(tiny, dest)
    path = folder / GGUF
    data = bytearray(path.read_bytes())
    key = b"general.architecture"
    at = data.find(struct.pack("<Q", len(key)) + key)
    assert at > 0, "no general.architecture key"
    value_at = at + 8 + len(key) + 4  # key, then the value type (uint32), then the string
    length = struct.unpack_from("<Q", data, value_at)[0]
    start = value_at + 8
    assert bytes(data[start : start + length]) == b"llama", bytes(data[start : start + length])
    data[start : start + length] = b"fancy"
    path.write_bytes(bytes(data))
    return path


def _odd_head_size(tiny: Path, dest: Path) -> Path:
    """A model with head size 48, which vLLM's CPU attention does not support (the tiny model's
    spec refuses it, so it is built past the check)."""
    from servefleet.modelgen import build_tiny_model, spec_from_preset

    base = spec_from_preset("tiny")
    spec = type(base).model_construct(
        **{**base.model_dump(), "hidden_size": 96, "head_dim": 48, "num_heads": 2, "num_kv_heads": 1, "seed": 3}
    )
    if dest.exists():
        shutil.rmtree(dest)
    build_tiny_model(dest, spec, force=True)
    return dest


def _no_config(tiny: Path, dest: Path) -> Path:
    folder = _copy(tiny, dest)
    (folder / "config.json").unlink()
    return folder


def _corrupt_config(tiny: Path, dest: Path) -> Path:
    folder = _copy(tiny, dest)
    (folder / "config.json").write_text('{"architectures": ["LlamaForCausalLM"], "hidden_size": 128,')  # cut short
    return folder


def _empty_gguf(tiny: Path, dest: Path) -> Path:
    folder = _copy(tiny, dest)
    (folder / GGUF).write_bytes(b"")
    return folder / GGUF


VARIANTS: dict[str, Callable[[Path, Path], Path]] = {
    "no_config": _no_config,
    "corrupt_config": _corrupt_config,
    "empty_gguf": _empty_gguf,
    "no_weights": _no_weights,
    "no_tokenizer": _no_tokenizer,
    "empty": _empty,
    "file_for_folder": _file_for_folder,
    "folder_for_file": _folder_for_file,
    "truncated_safetensors": _truncated(False),
    "corrupt_safetensors": _corrupt(False),
    "truncated_gguf": _truncated(True),
    "corrupt_gguf": _corrupt(True),
    "unknown_architecture": _unknown_architecture,
    "unknown_model_type": _unknown_model_type,
    "gguf_unknown_architecture": _gguf_unknown_architecture,
    "odd_head_size": _odd_head_size,
}


def build_variant(name: str, tiny: Path) -> Path:
    """The model path of variant ``name``, built from the tiny model folder into a sibling folder."""
    return VARIANTS[name](tiny, tiny.parent / "variants" / name)


# ---- broken native installs (llama-cpp-python loads libllama.so from LLAMA_CPP_LIB_PATH) ------------
def _lib_dir(tiny: Path, name: str) -> Path:
    folder = tiny.parent / "libs" / name
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    return folder


def _no_library(tiny: Path) -> dict[str, str]:
    return {"LLAMA_CPP_LIB_PATH": str(_lib_dir(tiny, "empty"))}


def _library_without_dependency_env(python: Path) -> Callable[[Path], dict[str, str]]:
    def prepare(tiny: Path) -> dict[str, str]:
        libs = sorted(python.parent.parent.glob("lib/python*/site-packages/llama_cpp/lib"))
        assert libs, f"no llama_cpp/lib next to {python}"
        folder = _lib_dir(tiny, "no-ggml")
        shutil.copy2(libs[0] / "libllama.so", folder / "libllama.so")
        return {"LLAMA_CPP_LIB_PATH": str(folder)}

    return prepare


# ---- the scenarios -----------------------------------------------------------------------------------
TRANSFORMERS_ARGS = ("--device", "cpu")
TRANSFORMERS_ENV = {"HF_HUB_OFFLINE": "1"}
BIG_AS = ("prlimit", f"--as={6 * 2**30}")  # a memory cap well below what the scenario asks for


def breadth(engine: str, python: Path | None = None) -> tuple[Scenario, ...]:
    """The breadth scenarios of ``engine`` (``python``: the engine's interpreter, for ones that copy
    files out of its install)."""
    S = Scenario
    mnf, cfg = "model_not_found", "config_error"
    if engine == "vllm":
        return (
            S(
                "vllm",
                "no_weights",
                "up",
                "failed",
                mnf,
                "Cannot find any model weights with",
                hint="*.safetensors",
                model_variant="no_weights",
                why="a model folder with config.json and the tokenizer but no weight files",
            ),
            S(
                "vllm",
                "no_tokenizer",
                "up",
                "failed",
                mnf,
                "Couldn't instantiate the backend tokenizer",
                hint="tokenizer.json",
                model_variant="no_tokenizer",
                why="a model folder with config.json and weights but no tokenizer files",
            ),
            S(
                "vllm",
                "empty_folder",
                "up",
                "failed",
                mnf,
                "Invalid repository ID or local directory specified",
                hint="config.json",
                model_variant="empty",
                why="an empty model folder",
            ),
            S(
                "vllm",
                "file_for_folder",
                "up",
                "failed",
                mnf,
                "Invalid repository ID or local directory specified",
                hint="config.json",
                model_variant="file_for_folder",
                why="--model names config.json, a file, where a model folder is expected",
            ),
            S(
                "vllm",
                "truncated_weights",
                "up",
                "failed",
                mnf,
                "Error while deserializing header",
                hint="--model folder",
                model_variant="truncated_safetensors",
                why="model.safetensors cut at 60 % (a partial download)",
            ),
            S(
                "vllm",
                "corrupt_weights",
                "up",
                "failed",
                mnf,
                "Error while deserializing header",
                hint="--model folder",
                model_variant="corrupt_safetensors",
                why="model.safetensors with its header overwritten",
            ),
            S(
                "vllm",
                "unknown_architecture",
                "up",
                "failed",
                "unsupported_model",
                "Model architectures ['FancyNetForCausalLM'] are not supported",
                hint="--model-impl transformers",
                model_variant="unknown_architecture",
                why="config.json's architectures names a class that does not exist",
            ),
            # head size 48 is not in the CPU backend's list, yet 0.32 serves it (and answers the smoke request)
            S(
                "vllm",
                "odd_head_size",
                "up",
                "ready",
                None,
                "Application startup complete.",
                model_variant="odd_head_size",
                why="head size 48, outside the CPU attention backend's list: 0.32 serves it all the same",
            ),
            # CUDA on the CPU build: 0.32 has no --device flag, and a CUDA-only attention backend is
            # replaced ("Cannot use AttentionBackendEnum.FLASH_ATTN backend on CPU."): no failure to show
            S(
                "vllm",
                "cuda_backend_on_cpu",
                "up",
                "ready",
                None,
                "Application startup complete.",
                args=("--attention-backend", "FLASH_ATTN"),
                why="a CUDA-only attention backend asked of the CPU build: it says so and falls back to its own",
            ),
            S(
                "vllm",
                "tp_too_large",
                "up",
                "failed",
                cfg,
                "Not enough allowed NUMA nodes",
                hint="--tensor-parallel-size",
                args=("--tensor-parallel-size", "4"),
                why="tensor parallel 4 on a host with 2 CPUs and one NUMA node",
            ),
            S(
                "vllm",
                "kv_cache_too_large",
                "up",
                "failed",
                "gpu_oom",
                "on kv cache allocation is less than requested memory",
                hint="VLLM_CPU_KVCACHE_SPACE",
                env={"VLLM_CPU_KVCACHE_SPACE": "4096"},
                why="a 4 TiB KV cache (VLLM_CPU_KVCACHE_SPACE) asked of a host with 24 GiB",
            ),
            S(
                "vllm",
                "host_ram_exhausted",
                "up",
                "failed",
                "gpu_oom",
                "DefaultCPUAllocator: can't allocate memory",
                hint="VLLM_CPU_KVCACHE_SPACE",
                env={"VLLM_CPU_KVCACHE_SPACE": "8"},
                command_prefix=BIG_AS,
                why="an 8 GiB KV cache under a 6 GiB address-space limit: the allocation fails",
            ),
            S(
                "vllm",
                "bad_choice",
                "up",
                "failed",
                cfg,
                "argument --dtype: invalid choice",
                hint="vllm serve --help",
                args=("--dtype", "float99"),
                why="a choice argument with a value not among its choices",
            ),
            S(
                "vllm",
                "bad_json",
                "up",
                "failed",
                cfg,
                "argument --speculative-config/-sc",
                hint="vllm serve --help",
                args=("--speculative-config", "{bad json"),
                why="a JSON argument that is not JSON",
            ),
            S(
                "vllm",
                "unknown_flag",
                "up",
                "failed",
                cfg,
                "unrecognized arguments: --bogus-flag",
                hint="vllm serve --help",
                args=("--bogus-flag",),
                why="a flag vLLM does not have",
            ),
            S(
                "vllm",
                "conflicting_flags",
                "up",
                "failed",
                cfg,
                "are mutually exclusive",
                hint="vllm serve --help",
                args=(
                    "--spec-tokens",
                    "2",
                    "--speculative-config",
                    '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 2}',
                ),
                why="--spec-tokens and the same key in --speculative-config",
            ),
            S(
                "vllm",
                "first_request_bf16",
                "up",
                "failed",
                "other",
                "died unexpectedly (exit code: -4)",
                hint="--dtype float32",
                args=("--dtype", "bfloat16"),
                why="bfloat16 on an AMX CPU: the worker dies of SIGILL on the first request now and then; the smoke "
                "request of `up` turns that into a start-up verdict",
            ),
        )
    if engine == "llamacpp":
        return (
            S(
                "llamacpp",
                "folder_for_file",
                "up",
                "failed",
                mnf,
                "failed to read magic",
                hint="--model",
                model_variant="folder_for_file",
                why="--model names the model folder where a .gguf file is expected",
            ),
            S(
                "llamacpp",
                "truncated_gguf",
                "up",
                "failed",
                mnf,
                "data is not within the file bounds",
                hint="GGUF file",
                model_variant="truncated_gguf",
                why="model.gguf cut at 60 % (a partial download)",
            ),
            S(
                "llamacpp",
                "corrupt_gguf",
                "up",
                "failed",
                mnf,
                "invalid magic characters",
                hint="GGUF file",
                model_variant="corrupt_gguf",
                why="model.gguf with its magic and header overwritten",
            ),
            S(
                "llamacpp",
                "unknown_architecture",
                "up",
                "failed",
                "unsupported_model",
                "unknown model architecture: 'fancy'",
                hint="general.architecture",
                model_variant="gguf_unknown_architecture",
                why="general.architecture names an architecture llama.cpp lacks",
            ),
            S(
                "llamacpp",
                "no_native_library",
                "up",
                "failed",
                "import_error",
                "Shared library with base name 'llama' not found",
                hint="LLAMA_CPP_LIB_PATH",
                prepare=_no_library,
                why="LLAMA_CPP_LIB_PATH names a folder without libllama.so",
            ),
            S(
                "llamacpp",
                "library_without_dependency",
                "up",
                "failed",
                "import_error",
                "libggml.so.0: cannot open shared object file",
                hint="LLAMA_CPP_LIB_PATH",
                prepare=_library_without_dependency_env(python) if python else None,
                why="LLAMA_CPP_LIB_PATH names a folder with libllama.so but not the libggml it links against",
            ),
            S(
                "llamacpp",
                "gpu_layers_on_cpu",
                "up",
                "ready",
                None,
                "Uvicorn running on",
                args=("--n_gpu_layers", "-1"),
                why="all layers asked on a GPU of the CPU-only build: llama.cpp ignores it and serves from the CPU",
            ),
            S(
                "llamacpp",
                "bad_choice",
                "up",
                "failed",
                cfg,
                "Input should be 'ram' or 'disk'",
                hint="llama_cpp.server --help",
                args=("--cache", "true", "--cache_type", "floppy"),
                why="a choice setting (cache_type: ram or disk) with another value",
            ),
            S(
                "llamacpp",
                "bad_json",
                "up",
                "failed",
                cfg,
                "argument --chat_template_kwargs",
                hint="llama_cpp.server --help",
                args=("--chat_template_kwargs", "{bad json"),
                why="a JSON argument that is not JSON",
            ),
            S(
                "llamacpp",
                "unknown_flag",
                "up",
                "failed",
                cfg,
                "unrecognized arguments: --bogus_flag",
                hint="llama_cpp.server --help",
                args=("--bogus_flag", "1"),
                why="a flag llama-cpp-python's server does not have",
            ),
            S(
                "llamacpp",
                "conflicting_flags",
                "up",
                "failed",
                cfg,
                "must be set for hf-autotokenizer",
                hint="--hf_pretrained_model_name_or_path",
                args=("--chat_format", "hf-autotokenizer"),
                why="--chat_format hf-autotokenizer without the --hf_pretrained_model_name_or_path it needs",
            ),
            S(
                "llamacpp",
                "host_ram_exhausted",
                "up",
                "failed",
                "gpu_oom",
                "ggml_aligned_malloc: insufficient memory",
                hint="--n_ctx",
                args=("--n_ctx", str(2**22)),
                command_prefix=("prlimit", f"--as={2 * 2**30}"),
                why="a 2 GiB KV buffer under a 2 GiB address-space limit (the model and Python need some too)",
            ),
        )
    if engine == "transformers":
        return (
            S(
                "transformers",
                "ready",
                "up",
                "ready",
                None,
                "Uvicorn running on",
                why="a healthy start-up through `up`",
            ),
            S(
                "transformers",
                "no_weights",
                "up",
                "failed",
                mnf,
                "no file named model.safetensors",
                hint="weight",
                model_variant="no_weights",
                why="a model folder with config.json and the tokenizer but no weight files",
            ),
            S(
                "transformers",
                "no_tokenizer",
                "up",
                "failed",
                mnf,
                "Unrecognized processing class",
                hint="tokenizer.json",
                model_variant="no_tokenizer",
                why="a model folder with config.json and weights but no tokenizer files",
            ),
            S(
                "transformers",
                "empty_folder",
                "up",
                "failed",
                mnf,
                "Unrecognized processing class",
                hint="or is empty",
                model_variant="empty",
                why="an empty model folder",
            ),
            S(
                "transformers",
                "file_for_folder",
                "up",
                "failed",
                mnf,
                "Repo id must be in the form",
                hint="repo id",
                model_variant="file_for_folder",
                why="the model argument names config.json, a file, where a model folder is expected",
            ),
            S(
                "transformers",
                "truncated_weights",
                "up",
                "failed",
                mnf,
                "incomplete metadata, file not fully covered",
                hint="*.safetensors",
                model_variant="truncated_safetensors",
                why="model.safetensors cut at 60 % (a partial download)",
            ),
            S(
                "transformers",
                "corrupt_weights",
                "up",
                "failed",
                mnf,
                "header too large",
                hint="*.safetensors",
                model_variant="corrupt_safetensors",
                why="model.safetensors with its header overwritten",
            ),
            S(
                "transformers",
                "unknown_architecture",
                "up",
                "failed",
                "unsupported_model",
                "has no attribute FancyNetForCausalLM",
                hint="architectures",
                model_variant="unknown_architecture",
                why="architectures names a class that does not exist: transformers serve looks the class up by that name",
            ),
            S(
                "transformers",
                "unknown_model_type",
                "up",
                "failed",
                "unsupported_model",
                "does not recognize this architecture",
                hint="upgrade transformers",
                model_variant="unknown_model_type",
                why="config.json's model_type is not one transformers knows",
            ),
            S(
                "transformers",
                "cuda_on_cpu",
                "up",
                "failed",
                "cuda_driver",
                "Torch not compiled with CUDA enabled",
                hint="--device cpu",
                args=("--device", "cuda"),
                why="--device cuda with a CPU-only torch",
            ),
            S(
                "transformers",
                "kv_cache_too_large",
                "up",
                "failed",
                "gpu_oom",
                "MemoryError: Memory footprint",
                hint="--cb-num-blocks",
                args=("--continuous-batching", "--cb-num-blocks", "10000000"),
                command_prefix=BIG_AS,
                why="a continuous-batching KV cache of 10 M blocks: transformers allocates it on the first request, so the "
                "smoke request of `up` is what fails (a start-up verdict, not a failed job)",
            ),
            S(
                "transformers",
                "bad_number",
                "up",
                "failed",
                cfg,
                "Invalid value for '--cb-num-blocks'",
                hint="transformers serve --help",
                args=("--cb-num-blocks", "abc"),
                why="a number argument with a word",
            ),
            S(
                "transformers",
                "bad_choice",
                "up",
                "failed",
                cfg,
                "Invalid value for '--reasoning'",
                hint="transformers serve --help",
                args=("--reasoning", "maybe"),
                why="a choice argument (on, off, auto) with another value",
            ),
            S(
                "transformers",
                "bad_json",
                "up",
                "failed",
                cfg,
                "json.loads(chat_template_kwargs)",
                hint="--chat-template-kwargs",
                args=("--chat-template-kwargs", "{bad json"),
                why="a JSON argument that is not JSON",
            ),
            S(
                "transformers",
                "unknown_flag",
                "up",
                "failed",
                cfg,
                "No such option '--bogus-flag'",
                hint="transformers serve --help",
                args=("--bogus-flag",),
                why="a flag transformers serve does not have",
            ),
        )
    raise ValueError(f"no breadth scenarios for {engine!r}")


# Held out: more failures of the same classes, labelled before they were first diagnosed, to measure how
# the signatures tuned on the scenarios above do on runs they were not tuned on
# (benchmarks/diagnose_accuracy.py --set heldout). Their logs are tests/fixtures/logs/real/heldout/.
def heldout(engine: str) -> tuple[Scenario, ...]:
    S = Scenario
    mnf, cfg = "model_not_found", "config_error"
    if engine == "vllm":
        return (
            S(
                "vllm",
                "no_config",
                "up",
                "failed",
                mnf,
                None,
                model_variant="no_config",
                why="weights and tokenizer, no config.json",
            ),
            S(
                "vllm",
                "corrupt_config",
                "up",
                "failed",
                mnf,
                None,
                model_variant="corrupt_config",
                why="a config.json cut short",
            ),
            S(
                "vllm",
                "bad_max_model_len",
                "up",
                "failed",
                cfg,
                None,
                args=("--max-model-len", "lots"),
                why="a word for a length",
            ),
            S(
                "vllm",
                "quantization_mismatch",
                "up",
                "failed",
                cfg,
                None,
                args=("--quantization", "awq"),
                why="--quantization awq for a model that is not AWQ-quantized",
            ),
        )
    if engine == "llamacpp":
        return (
            S(
                "llamacpp",
                "empty_gguf",
                "up",
                "failed",
                mnf,
                None,
                model_variant="empty_gguf",
                why="a zero-byte model.gguf",
            ),
            S(
                "llamacpp",
                "bad_threads",
                "up",
                "failed",
                cfg,
                None,
                args=("--n_threads", "many"),
                why="a word for a number",
            ),
            S(
                "llamacpp",
                "bad_bool",
                "up",
                "failed",
                cfg,
                None,
                args=("--embedding", "perhaps"),
                why="a bool setting with a word",
            ),
        )
    if engine == "transformers":
        return (
            S(
                "transformers",
                "no_config",
                "up",
                "failed",
                mnf,
                None,
                model_variant="no_config",
                why="weights and tokenizer, no config.json",
            ),
            S(
                "transformers",
                "corrupt_config",
                "up",
                "failed",
                mnf,
                None,
                model_variant="corrupt_config",
                why="a config.json cut short",
            ),
            S(
                "transformers",
                "bad_attention",
                "up",
                "failed",
                cfg,
                None,
                args=("--attn-implementation", "warp-speed"),
                why="an attention implementation that does not exist",
            ),
        )
    raise ValueError(f"no held-out scenarios for {engine!r}")


BREADTH = {name: breadth(name) for name in ("vllm", "llamacpp", "transformers")}
