"""Failure scripts: the text an engine prints when it fails, where in start-up, and how it exits.

Each style module (:mod:`.failures_sglang`, :mod:`.failures_vllm`) maps every
:class:`~servefleet.catalog.Category` to one or more real failure texts (``--fail-variant`` picks
one): traceback lines, then the fatal line, then the wrapper lines real engines add after the cause
("Received sigquit from a child process", "Engine core initialization failed. See root cause
above"). The exit is realistic too: SGLang's launcher SIGKILLs its own process tree after a child
fails (``kill_process_tree``), so its status is "killed by signal 9" *with* a fatal line in the log;
argparse exits 2; vLLM's API server exits 1, or 0 after an engine died under a running server.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType

from servefleet.catalog import Category
from servefleet.sim.config import SimConfig
from servefleet.sim.logline import Line

__all__ = [
    "Failure",
    "Frame",
    "traceback_text",
    "torch_oom",
    "ARCH",
    "CUDA_TAIL",
    "startup_failure",
    "after_ready_failure",
    "first_request_crash",
    "variants",
    "SIGKILL_SELF",
]

SIGKILL_SELF = None  # Failure.exit_code meaning "the process SIGKILLs itself"
ARCH = "SimMambaForCausalLM"  # the architecture the "unsupported model" texts name
CUDA_TAIL = (
    "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.\n"
    "For debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
    "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n"
)


def torch_oom() -> str:
    """torch's CUDA out-of-memory message (torch >= 2.4 wording)."""
    return (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 896.00 MiB. GPU 0 has a total capacity of 79.19 GiB "
        "of which 512.81 MiB is free. Including non-PyTorch memory, this process has 78.68 GiB memory in use. Of the allocated "
        "memory 77.21 GiB is allocated by PyTorch, and 31.45 MiB is reserved by PyTorch but unallocated. If reserved but "
        "unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  "
        "See documentation for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
    )


@dataclass(frozen=True)
class Failure:
    lines: tuple[Line, ...]
    at: float  # natural point in the start-up, as a fraction of --load-time
    exit_code: int | None  # None: SIGKILL itself
    before_log: bool = False  # happens before the first log line (argparse, imports)
    kill_children: bool = True  # False: the children outlive it (the OOM killer takes one process)
    prelude: tuple[Line, ...] = ()  # after-ready failures: printed as the server comes up, before --fail-delay


# (file, line number, function, source line or None)
Frame = tuple[str, int, str, str | None]


def traceback_text(frames: Sequence[Frame], final: str, head: str = "Traceback (most recent call last):") -> str:
    """A Python traceback: the head, each frame as Python prints it, then the exception line(s)."""
    out = [head]
    for file, no, func, code in frames:
        out.append(f'  File "{file}", line {no}, in {func}')
        if code:
            out.append(f"    {code}")
    out.append(final)
    return "\n".join(out)


def _module(style: str) -> ModuleType:
    if style == "sglang":
        from servefleet.sim import failures_sglang

        return failures_sglang
    from servefleet.sim import failures_vllm

    return failures_vllm


def variants(style: str, category: Category) -> int:
    """How many texts the style has for the category (``--fail-variant`` is taken modulo this)."""
    return len(_module(style).STARTUP[category])


def startup_failure(cfg: SimConfig, category: Category, port: int) -> Failure:
    table = _module(cfg.style).STARTUP[category]
    return table[cfg.fail_variant % len(table)](cfg, port)


def after_ready_failure(cfg: SimConfig, category: Category, port: int) -> Failure:
    """A failure once the HTTP server is up (SGLang's warm-up, a vLLM engine dying under the server)."""
    return _module(cfg.style).after_ready(cfg, category, port)


def first_request_crash(cfg: SimConfig, port: int) -> Failure:
    """The text of a server that passed start-up and dies on its first request (a CUDA fault)."""
    return _module(cfg.style).first_request(cfg, port)
