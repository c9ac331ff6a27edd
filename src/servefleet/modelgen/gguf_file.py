"""Write the model as one GGUF file for llama.cpp, with the `gguf` package, from the same tensors.

llama.cpp's own HF -> GGUF converter identifies tokenizers by hashing a test encoding against a list
of known upstream models, so it rejects a tokenizer trained here. The file is therefore written
directly: the architecture's hyper-parameters, the byte-level BPE vocabulary and merges as a
``gpt2`` tokenizer with the pre-tokenizer whose split the HF tokenizer uses (``gpt-2`` / ``qwen2``),
special-token ids, the chat template, and every tensor under its GGUF name.

Two layout facts, as in the upstream converter: for ``llama`` the q/k projection rows are
re-ordered from the HF rotary layout (halves) to GGUF's interleaved pairs, so both formats compute
the same function; ``qwen2`` uses the NeoX rotary layout in GGUF too and needs no re-ordering.
One-dimensional tensors (norms, biases) are stored as F32, as llama.cpp expects.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from servefleet.modelgen.spec import BOS, CHAT_TEMPLATE, EOS, IM_END, PAD, TinyModelSpec
from servefleet.modelgen.tokenizer import GGUF_PRE, TrainedTokenizer

if TYPE_CHECKING:
    import gguf
    import numpy as np
    import torch

__all__ = ["write_gguf", "gguf_tensor_name"]


def _permute_rotary(weight: torch.Tensor, n_head: int) -> torch.Tensor:
    """HF rotary layout (first half / second half of each head) -> GGUF's interleaved pairs."""
    rows = weight.shape[0]
    return weight.reshape(n_head, 2, rows // n_head // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def gguf_tensor_name(spec: TinyModelSpec, hf_name: str) -> str:
    """The GGUF name of an HF tensor (``model.layers.0.self_attn.q_proj.weight`` -> ``blk.0.attn_q.weight``)."""
    import gguf

    arch = {"llama": gguf.MODEL_ARCH.LLAMA, "qwen2": gguf.MODEL_ARCH.QWEN2}[spec.arch]
    name = gguf.get_tensor_name_map(arch, spec.num_layers).get_name(hf_name, try_suffixes=(".weight", ".bias"))
    if name is None:  # pragma: no cover - a gguf package that lost a mapping
        raise RuntimeError(f"gguf has no name for tensor {hf_name!r} of {spec.arch}")
    return name


def _as_array(tensor: torch.Tensor, one_dim_f32: bool) -> tuple[np.ndarray, gguf.GGMLQuantizationType | None]:
    import gguf
    import torch

    if one_dim_f32 or tensor.dtype == torch.float32:
        return tensor.to(torch.float32).numpy(), None
    if tensor.dtype == torch.float16:
        return tensor.numpy(), None
    # bfloat16: numpy has no such dtype; hand over the raw bytes and name the type.
    return tensor.contiguous().view(torch.uint8).numpy(), gguf.GGMLQuantizationType.BF16


def write_gguf(path: Path, spec: TinyModelSpec, weights: dict[str, torch.Tensor], trained: TrainedTokenizer) -> None:
    import gguf

    arch = spec.arch
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(f"servefleet tiny {arch}")
    writer.add_file_type(
        {
            "float32": gguf.LlamaFileType.ALL_F32,
            "float16": gguf.LlamaFileType.MOSTLY_F16,
            "bfloat16": gguf.LlamaFileType.MOSTLY_BF16,
        }[spec.dtype]
    )
    writer.add_context_length(spec.max_position_embeddings)
    writer.add_embedding_length(spec.hidden_size)
    writer.add_block_count(spec.num_layers)
    writer.add_feed_forward_length(spec.ffn_size)
    writer.add_head_count(spec.heads)
    writer.add_head_count_kv(spec.kv_heads)
    writer.add_key_length(spec.head_dim)
    writer.add_value_length(spec.head_dim)
    writer.add_rope_dimension_count(spec.head_dim)
    writer.add_rope_freq_base(spec.rope_theta)
    writer.add_layer_norm_rms_eps(spec.rms_norm_eps)
    writer.add_vocab_size(spec.vocab_size)

    # Tokenizer: GPT-2 style byte-level BPE. Special tokens are control tokens.
    special = set(trained.special_ids.values())
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(GGUF_PRE[arch])
    writer.add_token_list(trained.vocab)
    writer.add_token_types(
        [gguf.TokenType.CONTROL if i in special else gguf.TokenType.NORMAL for i in range(len(trained.vocab))]
    )
    writer.add_token_merges(trained.merges)
    writer.add_bos_token_id(trained.special_ids[BOS])
    writer.add_eos_token_id(trained.special_ids[EOS])
    writer.add_pad_token_id(trained.special_ids[PAD])
    writer.add_eot_token_id(trained.special_ids[IM_END])
    writer.add_add_bos_token(trained.add_bos)
    writer.add_add_eos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)

    for hf_name, tensor in weights.items():
        if arch == "llama" and hf_name.endswith("self_attn.q_proj.weight"):
            tensor = _permute_rotary(tensor, spec.heads)
        elif arch == "llama" and hf_name.endswith("self_attn.k_proj.weight"):
            tensor = _permute_rotary(tensor, spec.kv_heads)
        data, raw_dtype = _as_array(tensor, one_dim_f32=tensor.dim() == 1)
        writer.add_tensor(gguf_tensor_name(spec, hf_name), data, raw_dtype=raw_dtype)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
