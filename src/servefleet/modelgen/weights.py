"""Random weights for a spec, drawn deterministically from its seed.

Each tensor gets its own generator seeded from (seed, tensor name), so a tensor's values do not
depend on the order or number of the others (adding a layer keeps the first layers identical).
Linear weights are N(0, initializer_range), norms are ones and biases zeros — the same recipe
transformers uses for fresh models, so activations stay in a sane range and generation is stable.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

from servefleet.modelgen.spec import TinyModelSpec

if TYPE_CHECKING:
    import torch

__all__ = ["random_weights", "torch_dtype"]


def torch_dtype(name: str) -> torch.dtype:
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def _tensor_seed(seed: int, name: str) -> int:
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def random_weights(spec: TinyModelSpec) -> dict[str, torch.Tensor]:
    """HF tensor name -> tensor in ``spec.dtype`` (contiguous, ready for safetensors)."""
    import torch

    dtype = torch_dtype(spec.dtype)
    tensors: dict[str, torch.Tensor] = {}
    for name, shape in spec.tensor_shapes().items():
        if name.endswith("norm.weight"):
            t = torch.ones(shape, dtype=torch.float32)
        elif name.endswith(".bias"):
            t = torch.zeros(shape, dtype=torch.float32)
        else:
            gen = torch.Generator().manual_seed(_tensor_seed(spec.seed, name))
            t = torch.empty(shape, dtype=torch.float32).normal_(0.0, spec.initializer_range, generator=gen)
        tensors[name] = t.to(dtype).contiguous()
    return tensors
