"""The memory model against published architectures (configs written here, nothing downloaded),
with expected numbers computed by hand in the comments."""

from __future__ import annotations

import json
import struct

import pytest

from servefleet.errors import ConfigError
from servefleet.plan.memory import GIB, MemoryAssumptions, estimate_memory, load_config, parse_bytes

LLAMA3_8B = {  # meta-llama/Meta-Llama-3-8B config.json fields
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "intermediate_size": 14336,
    "vocab_size": 128256,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
QWEN2_7B = {  # Qwen/Qwen2-7B: GQA 28/4, sliding_window present but disabled
    "hidden_size": 3584,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "intermediate_size": 18944,
    "vocab_size": 152064,
    "sliding_window": 131072,
    "use_sliding_window": False,
}
MISTRAL_7B_V01 = {  # every layer windowed to 4096
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "intermediate_size": 14336,
    "vocab_size": 32000,
    "sliding_window": 4096,
}
JAMBA_MINI = {  # Jamba layout: attention at layers 4, 12, 20, 28 (period 8, offset 4), Mamba-1 elsewhere
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "intermediate_size": 14336,
    "vocab_size": 65536,
    "attn_layer_period": 8,
    "attn_layer_offset": 4,
    "expert_layer_period": 2,
    "expert_layer_offset": 1,
    "num_experts": 16,
    "mamba_d_state": 16,
    "mamba_d_conv": 4,
    "mamba_expand": 2,
}


def _assume(**kw):
    base = dict(gpu_mem_bytes=80 * GIB, mem_fraction=0.9, overhead_bytes_per_gpu=GIB, context_len=8192)
    base.update(kw)
    return MemoryAssumptions(**base)


def test_dense_llama_gqa_hand_computed():
    est = estimate_memory(LLAMA3_8B, _assume())
    # 32 layers x 8 KV heads x 128 head dim x (K and V) x 2 bytes = 131,072 bytes per token
    assert est.kv_bytes_per_token == 32 * 8 * 128 * 2 * 2 == 131072
    assert est.state_bytes_per_request == 0
    # Llama-3-8B has 8.03 B parameters -> ~16.06 GB in bf16
    assert est.weight_bytes == pytest.approx(16.06e9, rel=0.01)
    budget = int(80 * GIB * 0.9) - est.weight_bytes - GIB
    assert est.kv_tokens == budget // 131072
    assert est.max_running_requests == budget // (131072 * 8192)


def test_tensor_parallel_splits_weights_and_heads():
    one = estimate_memory(LLAMA3_8B, _assume())
    two = estimate_memory(LLAMA3_8B, _assume(tp=2))
    assert two.kv_bytes_per_token == one.kv_bytes_per_token  # same bytes, spread over 2 GPUs
    budget2 = int(80 * GIB * 0.9) - one.weight_bytes // 2 - GIB
    assert two.kv_tokens == budget2 // (131072 // 2)
    assert two.kv_tokens > 2 * one.kv_tokens  # weights also halve per GPU


def test_kv_heads_replicated_when_fewer_than_gpus():
    est = estimate_memory(QWEN2_7B, _assume(tp=8))
    # 4 KV heads on 8 GPUs: each GPU still holds one whole head -> 8 x (28 x 1 x 128 x 2 x 2)
    assert est.kv_bytes_per_token == 8 * 28 * 1 * 128 * 2 * 2
    assert any("replicated" in n for n in est.notes)
    assert est.layers == {"full_attention": 28}  # use_sliding_window=false -> full attention


def test_sliding_window_caps_per_request_tokens():
    est = estimate_memory(MISTRAL_7B_V01, _assume(context_len=32768))
    assert est.sliding_window == 4096
    per_token = 32 * 8 * 128 * 2 * 2
    budget = int(80 * GIB * 0.9) - est.weight_bytes - GIB
    # a 32k-token request holds only 4096 tokens in each windowed layer
    assert est.max_running_requests == budget // (per_token * 4096)


def test_hybrid_mamba_attention_state_per_request():
    est = estimate_memory(JAMBA_MINI, _assume(gpu_mem_bytes=141 * GIB, context_len=4096))
    assert est.layers == {"full_attention": 4, "mamba": 28}
    assert est.kv_bytes_per_token == 4 * 8 * 128 * 2 * 2  # only the 4 attention layers
    d_inner = 2 * 4096
    conv = 3 * d_inner * 2  # (d_conv - 1) x d_inner x bf16
    ssm = d_inner * 16 * 2  # d_inner x d_state x bf16
    assert est.state_bytes_per_request == 28 * (conv + ssm)
    budget = int(141 * GIB * 0.9) - est.weight_bytes - GIB
    per_request = 4096 * est.kv_bytes_per_token + est.state_bytes_per_request
    assert est.max_running_requests == budget // per_request


def test_qwen3_next_linear_attention_layers():
    cfg = {
        "hidden_size": 2048,
        "num_hidden_layers": 4,
        "num_attention_heads": 16,
        "num_key_value_heads": 2,
        "head_dim": 256,
        "intermediate_size": 5120,
        "vocab_size": 151936,
        "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"],
        "linear_num_key_heads": 16,
        "linear_num_value_heads": 32,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "linear_conv_kernel_dim": 4,
    }
    est = estimate_memory(cfg, _assume())
    assert est.kv_bytes_per_token == 1 * 2 * 256 * 2 * 2
    conv = 3 * (2 * 16 * 128 + 32 * 128) * 2
    rec = 32 * 128 * 128 * 2
    assert est.state_bytes_per_request == 3 * (conv + rec)


def test_speculative_draft_costs_memory():
    plain = estimate_memory(LLAMA3_8B, _assume())
    mtp = estimate_memory(LLAMA3_8B, _assume(spec="mtp:1"))
    assert mtp.weight_bytes > plain.weight_bytes
    assert mtp.kv_bytes_per_token == plain.kv_bytes_per_token * 33 // 32  # one more attention layer
    assert mtp.max_running_requests <= plain.max_running_requests
    assert estimate_memory(LLAMA3_8B, _assume(spec="ngram")).kv_tokens == plain.kv_tokens


def test_weights_that_do_not_fit():
    est = estimate_memory(LLAMA3_8B, _assume(gpu_mem_bytes=8 * GIB))
    assert est.kv_tokens == 0 and est.max_running_requests == 0
    assert any("do not fit" in n for n in est.notes)


def test_safetensors_header_sizes_are_used(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(LLAMA3_8B))
    header = json.dumps({"w": {"dtype": "BF16", "shape": [1000, 500], "data_offsets": [0, 1_000_000]}}).encode()
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 16)
    cfg, folder = load_config(tmp_path)
    est = estimate_memory(cfg, _assume(), folder)
    assert est.weight_bytes == 1_000_000
    assert est.assumptions.weight_source == "safetensors"


@pytest.mark.parametrize(
    "text,expected", [("96GiB", 96 * GIB), ("80GB", 80 * 10**9), ("141g", 141 * GIB), ("1024", 1024)]
)
def test_parse_bytes(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("bad", ["", "GiB", "12 parsecs"])
def test_parse_bytes_rejects(bad):
    with pytest.raises(ConfigError):
        parse_bytes(bad)


def test_missing_config_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="no config.json"):
        load_config(tmp_path)
