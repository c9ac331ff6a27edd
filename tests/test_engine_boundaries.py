"""The boundary cases of README "Failure categories" get one category in every engine profile, with a
hint of the engine's own (generic.BOUNDARY_HINTS names the cases; each profile's HINTS its words)."""

from __future__ import annotations

import importlib

import pytest

from servefleet.engines.generic import BOUNDARY_HINTS
from servefleet.engines.registry import get_engine
from servefleet.verify.classify import match_signature

ENGINES = ("vllm", "sglang", "llamacpp", "transformers", "tgi")
MODULES = {"vllm": "vllm", "sglang": "sglang", "llamacpp": "llamacpp", "transformers": "transformers", "tgi": "tgi"}

# (a line as an engine prints it, the boundary key, the category every engine must give it)
CASES = [
    (
        "safetensors_rust.SafetensorError: Error while deserializing header: HeaderTooLarge",
        "corrupt_weights",
        "model_not_found",
    ),
    (
        "safetensors_rust.SafetensorError: Error while deserializing header: MetadataIncompleteBuffer",
        "corrupt_weights",
        "model_not_found",
    ),
    ("AssertionError: Torch not compiled with CUDA enabled", "cuda_on_cpu_build", "cuda_driver"),
    (
        "OSError: libggml.so.0: cannot open shared object file: No such file or directory",
        "native_library",
        "import_error",
    ),
    (
        "ImportError: /venv/lib/python3.11/site-packages/vllm/_C.abi3.so: undefined symbol: _ZN3c104cuda9SetDeviceEi",
        "native_library",
        "import_error",
    ),
    ("Illegal instruction (core dumped)", "illegal_instruction", "other"),
    ("Fatal Python error: Illegal instruction", "illegal_instruction", "other"),
    ("[2026-11-30 10:00:36] Exit code: -4", "illegal_instruction", "other"),
    (
        "2024-03-06T17:53:31.052444Z ERROR shard-manager: text_generation_launcher: Shard process was signaled to shutdown "
        "with signal 4 rank=0",
        "illegal_instruction",
        "other",
    ),
    ("torch.AcceleratorError: CUDA error: invalid device ordinal", "tp_too_large", "config_error"),
    (
        "RuntimeError: [enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you tried to "
        "allocate 8589934592 bytes. Error code 12 (Cannot allocate memory)",
        "host_ram",
        "gpu_oom",
    ),
]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize(("line", "key", "category"), CASES)
def test_boundary_case_has_one_category_and_the_engines_hint(engine: str, line: str, key: str, category: str) -> None:
    sig = match_signature(line, get_engine(engine).signatures)
    assert sig is not None and sig.category is not None and sig.category.value == category, (engine, line, sig)
    hints = importlib.import_module(f"servefleet.engines.{MODULES[engine]}").HINTS
    assert sig.hint == hints.get(key, BOUNDARY_HINTS[key])


@pytest.mark.parametrize("engine", ENGINES)
def test_every_engine_words_every_boundary_case(engine: str) -> None:
    """A profile without its own words for a case would fall back to the generic hint: every engine has them."""
    hints = importlib.import_module(f"servefleet.engines.{MODULES[engine]}").HINTS
    assert set(BOUNDARY_HINTS) <= set(hints)
