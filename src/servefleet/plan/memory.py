"""A memory model: from a model's config.json (and its safetensors headers when present), how many
KV-cache tokens and how many running requests a GPU budget allows — before launching anything.

All figures are per replica (one server on ``tp`` GPUs). Per GPU, weights are split ``tp`` ways and
each GPU caches ``ceil(kv_heads / tp)`` KV heads for every token (heads are replicated when there
are fewer than GPUs; an MLA latent cache is replicated on every GPU). The token capacity of the
replica is the per-GPU budget divided by the per-GPU bytes of one token.

Per request, a model can also hold a fixed state that does not grow with the sequence:
Mamba/SSM and linear-attention layers (conv + recurrent state). Sliding-window layers hold at most
``window`` tokens each. ``max_running_requests`` at a context length L is the budget divided by
what one request of L tokens needs.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from servefleet.errors import ConfigError
from servefleet.plan.layers import LayerKind, _text_config, dtype_bytes, layer_plan

__all__ = [
    "MemoryAssumptions",
    "MemoryEstimate",
    "load_config",
    "estimate_memory",
    "weight_bytes_from_config",
    "parse_bytes",
]

GIB = 1024**3
_SUFFIX = {
    "": 1,
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": GIB,
    "tib": 1024**4,
    "k": 1024,
    "m": 1024**2,
    "g": GIB,
}


def parse_bytes(text: str | int | float) -> int:
    """'96GiB', '80GB', '141g', 1e9 -> bytes."""
    if isinstance(text, int | float):
        return int(text)
    s = text.strip().lower().replace(" ", "")
    num = s.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = s[len(num) :]
    if unit not in _SUFFIX or not num:
        raise ConfigError(f"cannot read a size from {text!r}; write e.g. 96GiB, 80GB or 141g")
    return int(float(num) * _SUFFIX[unit])


class MemoryAssumptions(BaseModel):
    gpu_mem_bytes: int = Field(gt=0)
    tp: int = Field(default=1, ge=1)
    mem_fraction: float = Field(
        default=0.9, gt=0, le=1
    )  # SGLang --mem-fraction-static / vLLM --gpu-memory-utilization
    overhead_bytes_per_gpu: int = Field(
        default=GIB, ge=0
    )  # CUDA context, activations, graphs not covered by the fraction
    weight_dtype: str = "bfloat16"
    kv_dtype: str = "bfloat16"
    state_dtype: str = "bfloat16"
    context_len: int = Field(default=4096, ge=1)
    spec: str | None = None  # "mtp:N", "draft:PATH", "ngram", "eagle:PATH"
    weight_source: str = "architecture"


class MemoryEstimate(BaseModel):
    weight_bytes: int  # whole replica (all GPUs), draft included
    kv_bytes_per_token: int  # whole replica: what one cached token costs across its GPUs
    state_bytes_per_request: int  # fixed per-request state (Mamba/linear attention); 0 for pure attention
    sliding_window: int | None = None
    kv_tokens: int
    max_running_requests: int
    layers: dict[str, int]
    assumptions: MemoryAssumptions
    notes: list[str] = []


def model_dtype(config: dict[str, Any]) -> str | None:
    """The weight dtype a model's config.json declares (``torch_dtype``, newer ``dtype``), if one known."""
    for cfg in (_text_config(config), config):
        for key in ("torch_dtype", "dtype"):
            name = cfg.get(key)
            if isinstance(name, str):
                try:
                    dtype_bytes(name)
                except ValueError:
                    continue
                return name.removeprefix("torch.")
    return None


def load_config(path: str | Path) -> tuple[dict[str, Any], Path | None]:
    """A config dict from a model folder or a config.json file (the folder is returned for weights)."""
    p = Path(path).expanduser()
    folder = p if p.is_dir() else None
    file = p / "config.json" if p.is_dir() else p
    if not file.is_file():
        raise ConfigError(
            f"{file}: no config.json here; pass a local model folder or its config.json (nothing is downloaded)"
        )
    try:
        return json.loads(file.read_text()), folder
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{file}: not valid JSON ({exc})") from exc


def _safetensors_bytes(folder: Path) -> int | None:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        total = json.loads(index.read_text()).get("metadata", {}).get("total_size")
        if total:
            return int(total)
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        return None
    total = 0
    for f in files:  # header only: 8-byte length + JSON with data_offsets
        with f.open("rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
        total += sum(v["data_offsets"][1] - v["data_offsets"][0] for k, v in header.items() if k != "__metadata__")
    return total


def _head_dim(cfg: dict[str, Any]) -> int:
    return int(cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"])


def weight_bytes_from_config(cfg: dict[str, Any], nbytes: int) -> int:
    """Parameter count from the architecture (dense or MoE), times bytes per parameter."""
    cfg = _text_config(cfg)
    h, vocab = int(cfg["hidden_size"]), int(cfg.get("vocab_size", 32000))
    plan = layer_plan(cfg)
    params = vocab * h * (1 if cfg.get("tie_word_embeddings") else 2)
    heads = int(cfg.get("num_attention_heads") or 0)
    kv_heads = int(cfg.get("num_key_value_heads") or heads or 0)
    inter = int(cfg.get("intermediate_size") or 4 * h)
    n_experts = int(cfg.get("num_experts") or cfg.get("n_routed_experts") or cfg.get("num_local_experts") or 0)
    moe_inter = int(cfg.get("moe_intermediate_size") or inter)
    shared = int(cfg.get("n_shared_experts") or (1 if cfg.get("shared_expert_intermediate_size") else 0))
    block_typed = bool(cfg.get("hybrid_override_pattern") or cfg.get("layers_block_type"))
    pure_ssm = not heads
    for i, kind in enumerate(plan.kinds):
        if kind in (LayerKind.FULL, LayerKind.SLIDING) and heads:
            d = _head_dim(cfg)
            params += h * heads * d * 2 + h * kv_heads * d * 2
        elif kind in (LayerKind.MAMBA, LayerKind.LINEAR):
            d_inner = int(cfg.get("mamba_expand") or cfg.get("expand") or 2) * h
            params += 3 * h * d_inner  # in/out projections dominate
        # Feed-forward: every layer of a classic decoder; only the MLP/MoE blocks of a block-typed
        # hybrid (Nemotron-H); none in a pure SSM.
        has_ffn = (kind is LayerKind.NONE) if block_typed else not pure_ssm
        if has_ffn:
            if n_experts and _is_moe_layer(cfg, i):
                params += n_experts * 3 * h * moe_inter + shared * 3 * h * moe_inter + h * n_experts
            else:
                params += 3 * h * inter
        params += 2 * h
    return params * nbytes


def _is_moe_layer(cfg: dict[str, Any], i: int) -> bool:
    if "expert_layer_period" in cfg:  # Jamba: experts every N layers
        return i % int(cfg["expert_layer_period"]) == int(cfg.get("expert_layer_offset", 0))
    if i in (cfg.get("mlp_only_layers") or []):  # Qwen-MoE family
        return False
    return i >= int(cfg.get("first_k_dense_replace") or 0)  # DeepSeek: first k layers dense


def _recurrent_state_bytes(cfg: dict[str, Any], kind: LayerKind, conv_b: int, ssm_b: int) -> int:
    h = int(cfg["hidden_size"])
    if kind is LayerKind.LINEAR:  # gated delta net (Qwen3-Next)
        nk, nv = int(cfg["linear_num_key_heads"]), int(cfg["linear_num_value_heads"])
        dk, dv = int(cfg["linear_key_head_dim"]), int(cfg["linear_value_head_dim"])
        kernel = int(cfg.get("linear_conv_kernel_dim", 4))
        return (kernel - 1) * (2 * nk * dk + nv * dv) * conv_b + nv * dk * dv * ssm_b
    # Mamba-2 (heads) or Mamba-1 (d_inner x d_state)
    expand = int(cfg.get("mamba_expand") or cfg.get("expand") or 2)
    d_state = int(cfg.get("mamba_d_state") or cfg.get("ssm_state_size") or cfg.get("state_size") or 16)
    d_conv = int(cfg.get("mamba_d_conv") or cfg.get("conv_kernel") or 4)
    n_heads = (
        cfg.get("mamba_n_heads")
        or cfg.get("mamba_num_heads")
        or (cfg.get("num_heads") if not cfg.get("num_attention_heads") else None)
    )
    if n_heads:
        head_dim = int(cfg.get("mamba_d_head") or cfg.get("mamba_head_dim") or cfg.get("head_dim") or 64)
        groups = int(cfg.get("mamba_n_groups") or cfg.get("n_groups") or 1)
        d_inner = int(n_heads) * head_dim
        return (d_conv - 1) * (d_inner + 2 * groups * d_state) * conv_b + int(n_heads) * head_dim * d_state * ssm_b
    d_inner = expand * h
    return (d_conv - 1) * d_inner * conv_b + d_inner * d_state * ssm_b


def _spec_extra(spec: str | None, cfg: dict[str, Any], wb: int) -> tuple[int, int, str | None]:
    """(extra weight bytes, extra full-attention layers' worth of KV per token, note) for a draft."""
    if not spec or spec in ("ngram", "none"):
        return 0, 0, None
    kind, _, arg = spec.partition(":")
    if kind == "mtp":
        n = int(arg or cfg.get("num_nextn_predict_layers") or 1)
        h = int(cfg["hidden_size"])
        layer_w = weight_bytes_from_config(
            {**cfg, "num_hidden_layers": 1, "layer_types": None, "vocab_size": 0, "tie_word_embeddings": True}, wb
        )
        return n * (layer_w + 2 * h * h * wb), n, f"MTP: {n} extra decoder layer(s), embeddings shared"
    if kind in ("draft", "eagle"):
        dcfg, dfolder = load_config(arg)
        w = (_safetensors_bytes(dfolder) if dfolder else None) or weight_bytes_from_config(dcfg, wb)
        return w, int(_text_config(dcfg).get("num_hidden_layers", 1)), f"draft model {arg}"
    raise ConfigError(f"--spec {spec!r}: use mtp[:N], draft:PATH, eagle:PATH or ngram")


def estimate_memory(
    config: dict[str, Any], assumptions: MemoryAssumptions, folder: Path | None = None
) -> MemoryEstimate:
    a = assumptions
    cfg = _text_config(config)
    notes: list[str] = []
    plan = layer_plan(cfg)
    wb = dtype_bytes(a.weight_dtype)
    kvb = dtype_bytes(a.kv_dtype)
    tp = max(1, a.tp)

    weights = _safetensors_bytes(folder) if folder else None
    if weights is not None:
        a = a.model_copy(update={"weight_source": "safetensors"})
    else:
        weights = weight_bytes_from_config(cfg, wb)
    draft_w, draft_layers, note = _spec_extra(a.spec, cfg, wb)
    if note:
        notes.append(note)
    weights += draft_w

    # Per-GPU bytes of one token in one full-attention layer.
    if cfg.get("kv_lora_rank"):  # MLA: one latent vector + rope key, same on every GPU
        per_layer_gpu = (int(cfg["kv_lora_rank"]) + int(cfg.get("qk_rope_head_dim", 64))) * kvb
        notes.append("MLA latent cache, replicated on every tensor-parallel GPU")
    elif cfg.get("num_attention_heads"):
        kv_heads = int(cfg.get("num_key_value_heads") or cfg["num_attention_heads"])
        per_layer_gpu = math.ceil(kv_heads / tp) * _head_dim(cfg) * 2 * kvb
        if kv_heads < tp:
            notes.append(f"{kv_heads} KV heads on {tp} GPUs: heads are replicated")
    else:
        per_layer_gpu = 0
    n_full = plan.count(LayerKind.FULL) + draft_layers
    n_slide = plan.count(LayerKind.SLIDING)
    window = int(cfg["sliding_window"]) if n_slide and cfg.get("sliding_window") else None

    ssm_b = dtype_bytes(cfg.get("mamba_ssm_cache_dtype") or a.state_dtype)
    conv_b = dtype_bytes(a.state_dtype)
    recurrent = [k for k in plan.kinds if k in (LayerKind.MAMBA, LayerKind.LINEAR)]
    if plan.parallel_mamba:
        recurrent = [LayerKind.MAMBA] * len(plan.kinds)
    state_gpu = sum(_recurrent_state_bytes(cfg, k, conv_b, ssm_b) for k in recurrent) // tp

    budget_gpu = int(a.gpu_mem_bytes * a.mem_fraction) - weights // tp - a.overhead_bytes_per_gpu
    full_tok_gpu = n_full * per_layer_gpu
    slide_tok_gpu = n_slide * per_layer_gpu
    token_gpu = full_tok_gpu + slide_tok_gpu
    if budget_gpu <= 0:
        notes.append("weights do not fit in the memory budget: use more GPUs (tp) or a larger fraction")
        kv_tokens = max_running = 0
    else:
        ctx = a.context_len
        per_request = full_tok_gpu * ctx + slide_tok_gpu * min(ctx, window or ctx) + state_gpu
        max_running = int(budget_gpu // per_request) if per_request else 0
        kv_budget = budget_gpu - max_running * state_gpu if state_gpu else budget_gpu
        kv_tokens = int(kv_budget // token_gpu) if token_gpu else 0
    if window:
        notes.append(f"{n_slide} sliding-window layers hold at most {window} tokens per request")
    layers = {k.value: plan.count(k) for k in LayerKind if plan.count(k)}
    return MemoryEstimate(
        weight_bytes=weights,
        kv_bytes_per_token=token_gpu * tp,
        state_bytes_per_request=state_gpu * tp,
        sliding_window=window,
        kv_tokens=kv_tokens,
        max_running_requests=max_running,
        layers=layers,
        assumptions=a,
        notes=notes,
    )
