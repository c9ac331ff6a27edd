"""What a generated model looks like: architecture, sizes, dtype and seed, plus named presets.

The spec is the single source of truth for the HF ``config.json``, the tensor shapes, and the GGUF
metadata, so the three can never disagree. It is pure (no torch import) so shapes can be checked
for the big preset without allocating anything.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, model_validator

__all__ = ["Arch", "DType", "TinyModelSpec", "PRESETS", "spec_from_preset", "SPECIAL_TOKENS", "CHAT_TEMPLATE"]

Arch = Literal["llama", "qwen2"]
DType = Literal["float32", "bfloat16", "float16"]

# Special tokens, in id order at the start of the vocabulary (ids 0..4).
SPECIAL_TOKENS: tuple[str, ...] = ("<pad>", "<s>", "</s>", "<|im_start|>", "<|im_end|>")
PAD, BOS, EOS, IM_START, IM_END = SPECIAL_TOKENS

# A ChatML template: short, understood by transformers, vLLM and llama.cpp (which recognises
# `<|im_start|>` and picks its built-in chatml formatter for the GGUF copy).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# Tested with vLLM's CPU attention backend, which only supports these head sizes.
SUPPORTED_HEAD_DIMS = (32, 64, 80, 96, 112, 128, 256)


class TinyModelSpec(BaseModel):
    """A decoder-only model of the Llama or Qwen2 family with random weights."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    arch: Arch = "llama"
    hidden_size: int = 128
    num_layers: int = 2
    head_dim: int = 32
    num_heads: int | None = None  # default: hidden_size // head_dim
    num_kv_heads: int | None = None  # default: half the heads (grouped-query attention), at least 1
    intermediate_size: int | None = None  # default: 3 x hidden_size
    vocab_size: int = 2048
    max_position_embeddings: int = 2048
    dtype: DType = "float32"
    seed: int = 0
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    initializer_range: float = 0.02

    @model_validator(mode="after")
    def _check(self) -> TinyModelSpec:
        def need(ok: bool, message: str) -> None:
            if not ok:
                raise ValueError(message)

        need(self.hidden_size > 0 and self.num_layers > 0, "hidden size and layer count must be positive")
        dims = ", ".join(map(str, SUPPORTED_HEAD_DIMS))
        need(
            self.head_dim in SUPPORTED_HEAD_DIMS,
            f"head dim must be one of {dims} (vLLM's CPU attention supports only these)",
        )
        if self.num_heads is None:
            need(
                self.hidden_size % self.head_dim == 0,
                f"hidden size {self.hidden_size} is not a multiple of head dim {self.head_dim}; pass the head count",
            )
        need(self.heads > 0, "the head count must be positive")
        need(
            0 < self.kv_heads <= self.heads and self.heads % self.kv_heads == 0,
            f"KV heads ({self.kv_heads}) must divide the head count ({self.heads})",
        )
        need(
            self.vocab_size >= 300,
            "vocab size must be at least 300 (256 byte tokens, the special tokens and some merges)",
        )
        need(self.max_position_embeddings >= 16, "max position embeddings must be at least 16")
        return self

    # ---- resolved sizes -----------------------------------------------------------------------
    @property
    def heads(self) -> int:
        return self.num_heads if self.num_heads is not None else self.hidden_size // self.head_dim

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads if self.num_kv_heads is not None else max(1, self.heads // 2)

    @property
    def ffn_size(self) -> int:
        return self.intermediate_size if self.intermediate_size is not None else 3 * self.hidden_size

    @property
    def attention_bias(self) -> bool:
        """Qwen2 has biases on the q/k/v projections; Llama has none."""
        return self.arch == "qwen2"

    @property
    def architecture(self) -> str:
        return {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}[self.arch]

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """HF tensor name -> shape, in a fixed order (the order weights are drawn in)."""
        h, d, q, kv, ffn = self.hidden_size, self.head_dim, self.heads, self.kv_heads, self.ffn_size
        shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (self.vocab_size, h)}
        for i in range(self.num_layers):
            p = f"model.layers.{i}."
            shapes[p + "input_layernorm.weight"] = (h,)
            shapes[p + "self_attn.q_proj.weight"] = (q * d, h)
            shapes[p + "self_attn.k_proj.weight"] = (kv * d, h)
            shapes[p + "self_attn.v_proj.weight"] = (kv * d, h)
            if self.attention_bias:
                shapes[p + "self_attn.q_proj.bias"] = (q * d,)
                shapes[p + "self_attn.k_proj.bias"] = (kv * d,)
                shapes[p + "self_attn.v_proj.bias"] = (kv * d,)
            shapes[p + "self_attn.o_proj.weight"] = (h, q * d)
            shapes[p + "post_attention_layernorm.weight"] = (h,)
            shapes[p + "mlp.gate_proj.weight"] = (ffn, h)
            shapes[p + "mlp.up_proj.weight"] = (ffn, h)
            shapes[p + "mlp.down_proj.weight"] = (h, ffn)
        shapes["model.norm.weight"] = (h,)
        shapes["lm_head.weight"] = (self.vocab_size, h)
        return shapes

    def parameter_count(self) -> int:
        total = 0
        for shape in self.tensor_shapes().values():
            n = 1
            for dim in shape:
                n *= dim
            total += n
        return total

    # ---- HF files -----------------------------------------------------------------------------
    def hf_config(self) -> dict[str, Any]:
        """``config.json``. Carries both the transformers-5 keys (``dtype``, ``rope_parameters``)
        and the older ones (``torch_dtype``, ``rope_theta``) so engines pinned to transformers 4.x
        (vLLM, SGLang) read the same model."""
        bos, eos, pad = SPECIAL_TOKENS.index(BOS), SPECIAL_TOKENS.index(EOS), SPECIAL_TOKENS.index(PAD)
        config: dict[str, Any] = {
            "architectures": [self.architecture],
            "model_type": self.arch,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.ffn_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "max_position_embeddings": self.max_position_embeddings,
            "initializer_range": self.initializer_range,
            "rms_norm_eps": self.rms_norm_eps,
            "use_cache": True,
            "tie_word_embeddings": False,
            "rope_theta": self.rope_theta,
            "rope_parameters": {"rope_theta": self.rope_theta, "rope_type": "default"},
            "attention_dropout": 0.0,
            "bos_token_id": bos,
            "eos_token_id": eos,
            "pad_token_id": pad,
            "dtype": self.dtype,
            "torch_dtype": self.dtype,
        }
        if self.arch == "llama":
            config.update({"attention_bias": False, "mlp_bias": False, "pretraining_tp": 1})
        else:
            config.update(
                {
                    "use_sliding_window": False,
                    "sliding_window": None,
                    "max_window_layers": self.num_layers,
                    "layer_types": ["full_attention"] * self.num_layers,
                }
            )
        return config

    def generation_config(self) -> dict[str, Any]:
        """``generation_config.json``: stop on end-of-text and on the chat end-of-turn token."""
        return {
            "bos_token_id": SPECIAL_TOKENS.index(BOS),
            "eos_token_id": [SPECIAL_TOKENS.index(EOS), SPECIAL_TOKENS.index(IM_END)],
            "pad_token_id": SPECIAL_TOKENS.index(PAD),
            "do_sample": False,
            "max_new_tokens": 64,
        }


# Named sizes. `tiny` loads in well under 2 s on a laptop CPU; `small` is for CPU benchmarks that
# need some compute per token; `realistic` has the shape of a ~0.4B model (hidden 1024, 24 layers,
# head dim 128 like Qwen3-0.6B) for GPU runs: memory and KV-cache arithmetic close to real models.
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(
        hidden_size=128,
        num_layers=2,
        head_dim=32,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=384,
        vocab_size=2048,
        max_position_embeddings=2048,
        dtype="float32",
    ),
    "small": dict(
        hidden_size=512,
        num_layers=4,
        head_dim=64,
        num_heads=8,
        num_kv_heads=4,
        intermediate_size=1536,
        vocab_size=8192,
        max_position_embeddings=4096,
        dtype="float32",
    ),
    "realistic": dict(
        hidden_size=1024,
        num_layers=24,
        head_dim=128,
        num_heads=16,
        num_kv_heads=8,
        intermediate_size=3072,
        vocab_size=32000,
        max_position_embeddings=32768,
        dtype="bfloat16",
        rope_theta=1000000.0,
    ),
}


def spec_from_preset(preset: str = "tiny", **overrides: Any) -> TinyModelSpec:
    """A spec from a preset with some fields replaced (``None`` overrides are ignored).

    Changing ``head_dim`` or ``hidden_size`` without giving head counts re-derives them, so
    ``--head-dim 64`` on the tiny preset gives 2 heads of 64 rather than an inconsistent model."""
    try:
        base = dict(PRESETS[preset])
    except KeyError:
        raise ValueError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}") from None
    given = {k: v for k, v in overrides.items() if v is not None}
    if ("head_dim" in given or "hidden_size" in given) and "num_heads" not in given:
        base.pop("num_heads", None)
        if "num_kv_heads" not in given:
            base.pop("num_kv_heads", None)
    if "hidden_size" in given and "intermediate_size" not in given:
        base.pop("intermediate_size", None)
    base.update(given)
    return TinyModelSpec(**base)
