"""What each layer of a model keeps per request: a per-token KV cache, a bounded sliding window,
or a fixed recurrent state (Mamba / linear attention). Read from a Hugging Face ``config.json``.

Architectures are told apart by the fields they carry, not by name, so new models of a known
family work without a table update:

- ``layer_types`` (Gemma 2/3, Qwen3-Next, recent configs): "full_attention", "sliding_attention",
  "linear_attention", "mamba".
- ``layers_block_type`` / ``hybrid_override_pattern`` (Nemotron-H): mamba, attention, mlp/moe blocks.
- ``attn_layer_period`` / ``attn_layer_offset`` (Jamba): attention every N layers, Mamba elsewhere.
- ``mamba_d_ssm`` / ``mamba_n_heads`` (Falcon-H1): every layer has both attention and a Mamba mixer.
- ``state_size`` + ``num_heads`` without attention heads (Mamba-2): all layers recurrent.
- ``sliding_window`` alone (Mistral v0.1): every attention layer is windowed.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

__all__ = ["LayerKind", "LayerPlan", "layer_plan", "dtype_bytes"]


class LayerKind(StrEnum):
    FULL = "full_attention"
    SLIDING = "sliding_attention"
    LINEAR = "linear_attention"  # gated delta net / linear attention: fixed state per request
    MAMBA = "mamba"
    NONE = "none"  # MLP- or MoE-only block: no cache at all


_DTYPE_BYTES = {
    "float32": 4,
    "fp32": 4,
    "float": 4,
    "bfloat16": 2,
    "bf16": 2,
    "float16": 2,
    "fp16": 2,
    "half": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "int8": 1,
}


def dtype_bytes(name: str | None, default: int = 2) -> int:
    if not name:
        return default
    key = str(name).removeprefix("torch.").lower()
    if key not in _DTYPE_BYTES:
        raise ValueError(f"unknown dtype {name!r}; known: {', '.join(sorted(_DTYPE_BYTES))}")
    return _DTYPE_BYTES[key]


@dataclass(frozen=True)
class LayerPlan:
    kinds: tuple[LayerKind, ...]
    # Falcon-H1 style: attention and Mamba in the same layer (both caches per layer).
    parallel_mamba: bool = False

    def count(self, kind: LayerKind) -> int:
        return sum(1 for k in self.kinds if k == kind)


def _text_config(config: dict[str, Any]) -> dict[str, Any]:
    # Multimodal configs keep the language model under text_config / llm_config.
    for key in ("text_config", "llm_config", "language_config"):
        sub = config.get(key)
        if isinstance(sub, dict) and sub.get("num_hidden_layers"):
            return {**sub, "_parent": config}
    return config


def layer_plan(config: dict[str, Any]) -> LayerPlan:
    cfg = _text_config(config)
    n = int(cfg.get("num_hidden_layers") or cfg.get("n_layer") or cfg.get("num_layers") or 0)

    if isinstance(cfg.get("layer_types"), list) and cfg["layer_types"]:
        kinds = []
        for t in cfg["layer_types"]:
            t = str(t).lower()
            if t in ("full_attention", "attention", "global", "full"):
                kinds.append(LayerKind.FULL)
            elif "sliding" in t or t in ("local", "chunked_attention"):
                kinds.append(LayerKind.SLIDING)
            elif "linear" in t:
                kinds.append(LayerKind.LINEAR)
            elif "mamba" in t or t == "ssm":
                kinds.append(LayerKind.MAMBA)
            else:
                kinds.append(LayerKind.NONE)
        return LayerPlan(tuple(kinds))

    pattern = cfg.get("hybrid_override_pattern")
    if isinstance(pattern, str) and pattern:
        # Nemotron-H: M = Mamba-2, * = attention, - = MLP, E = MoE.
        table = {"M": LayerKind.MAMBA, "*": LayerKind.FULL}
        return LayerPlan(tuple(table.get(c, LayerKind.NONE) for c in pattern))
    if isinstance(cfg.get("layers_block_type"), list) and cfg["layers_block_type"]:
        table = {
            "mamba": LayerKind.MAMBA,
            "linear_attention": LayerKind.MAMBA,
            "attention": LayerKind.FULL,
            "full_attention": LayerKind.FULL,
        }
        return LayerPlan(tuple(table.get(str(t).lower(), LayerKind.NONE) for t in cfg["layers_block_type"]))

    if "attn_layer_period" in cfg and "attn_layer_offset" in cfg:  # Jamba
        period, offset = int(cfg["attn_layer_period"]), int(cfg["attn_layer_offset"])
        return LayerPlan(tuple(LayerKind.FULL if i % period == offset else LayerKind.MAMBA for i in range(n)))

    if "mamba_d_ssm" in cfg or "mamba_n_heads" in cfg:  # Falcon-H1: parallel hybrid
        return LayerPlan((LayerKind.FULL,) * n, parallel_mamba=True)

    if not cfg.get("num_attention_heads") and (cfg.get("state_size") or cfg.get("ssm_state_size")):
        return LayerPlan((LayerKind.MAMBA,) * n)  # pure Mamba / Mamba-2

    if cfg.get("sliding_window") and cfg.get("use_sliding_window", True) is not False:
        # Mistral v0.1 style: every layer windowed. Qwen2 carries sliding_window but
        # use_sliding_window=false (and max_window_layers) — then it is full attention.
        return LayerPlan((LayerKind.SLIDING,) * n)
    return LayerPlan((LayerKind.FULL,) * n)
