"""`servefleet model tiny`: the spec, the locally trained tokenizer, the folder, the GGUF copy.

The folder must load with transformers' Auto classes (what `transformers serve`, vLLM and SGLang
do), be byte-identical for one seed, never be left half-written, and its GGUF copy must compute the
same function (checked by reading it back with transformers' GGUF loader: same tokens, same logits).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from servefleet.cli.main import app
from servefleet.errors import ConfigError
from servefleet.modelgen import MARKER_FILE, TinyModelSpec, build_tiny_model, spec_from_preset
from servefleet.modelgen import builder as builder_module
from servefleet.modelgen import tokenizer as tokenizer_module

HF_FILES = {
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    MARKER_FILE,
}


def digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("m") / "llama"
    build_tiny_model(path, spec_from_preset("tiny", seed=1), gguf=True)
    return path


@pytest.fixture(scope="module")
def qwen2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("m") / "qwen2"
    build_tiny_model(path, spec_from_preset("tiny", arch="qwen2", head_dim=64, seed=1), gguf=True)
    return path


# ---- the spec -------------------------------------------------------------------------------------
def test_tiny_preset_is_the_documented_shape() -> None:
    spec = spec_from_preset("tiny")
    assert (spec.hidden_size, spec.num_layers, spec.heads, spec.kv_heads, spec.head_dim, spec.vocab_size) == (
        128,
        2,
        4,
        2,
        32,
        2048,
    )
    assert spec.parameter_count() < 1_000_000


def test_realistic_preset_config_shape_without_building() -> None:
    spec = spec_from_preset("realistic")
    config = spec.hf_config()
    assert {
        k: config[k]
        for k in (
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "intermediate_size",
            "vocab_size",
            "dtype",
        )
    } == {
        "hidden_size": 1024,
        "num_hidden_layers": 24,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "intermediate_size": 3072,
        "vocab_size": 32000,
        "dtype": "bfloat16",
    }
    shapes = spec.tensor_shapes()
    assert shapes["model.layers.23.self_attn.q_proj.weight"] == (16 * 128, 1024)  # head_dim x heads != hidden
    assert shapes["model.layers.0.self_attn.k_proj.weight"] == (8 * 128, 1024)
    assert 350_000_000 < spec.parameter_count() < 500_000_000


def test_head_dim_override_rederives_the_heads() -> None:
    spec = spec_from_preset("tiny", head_dim=64)
    assert (spec.heads, spec.kv_heads, spec.heads * spec.head_dim) == (2, 1, 128)
    assert spec_from_preset("tiny", hidden_size=256).heads == 8


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"head_dim": 48}, "head dim must be one of"),
        ({"num_heads": 4, "num_kv_heads": 3}, "must divide"),
        ({"hidden_size": 100}, "not a multiple of head dim"),
        ({"vocab_size": 100}, "vocab size must be at least"),
    ],
)
def test_invalid_specs_are_refused(fields: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TinyModelSpec(**fields)


def test_qwen2_config_has_biases_and_full_attention_layers() -> None:
    spec = spec_from_preset("tiny", arch="qwen2")
    assert "model.layers.0.self_attn.q_proj.bias" in spec.tensor_shapes()
    assert spec.hf_config()["layer_types"] == ["full_attention", "full_attention"]
    assert "model.layers.0.self_attn.q_proj.bias" not in spec_from_preset("tiny").tensor_shapes()


# ---- the folder -----------------------------------------------------------------------------------
def test_folder_has_every_file_and_no_leftovers(llama: Path) -> None:
    assert {p.name for p in llama.iterdir()} == HF_FILES | {"model.gguf"}
    assert not [p for p in llama.parent.iterdir() if ".building-" in p.name]
    assert all(p.stat().st_mode & 0o044 == 0o044 for p in llama.iterdir())  # readable by an engine's user
    marker = json.loads((llama / MARKER_FILE).read_text())
    assert marker["spec"]["seed"] == 1


@pytest.mark.parametrize("which", ["llama", "qwen2"])
def test_folder_loads_and_generates_with_transformers(which: str, request: pytest.FixtureRequest) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = request.getfixturevalue(which)
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    assert type(model).__name__ == ("LlamaForCausalLM" if which == "llama" else "Qwen2ForCausalLM")
    assert len(tok) == model.config.vocab_size == 2048
    assert (tok.bos_token, tok.eos_token, tok.pad_token) == ("<s>", "</s>", "<pad>")
    text = "Hello world, the model server is ready: 42."
    ids = tok(text)["input_ids"]
    assert (ids[0] == tok.bos_token_id) is (which == "llama")  # Llama adds <s>, Qwen2 does not
    assert tok.decode(ids, skip_special_tokens=True) == text  # byte-level: lossless
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    out = model.generate(**tok("The engine", return_tensors="pt"), max_new_tokens=5, do_sample=False)
    assert out.shape[1] > len(tok("The engine")["input_ids"])
    assert torch.isfinite(model(out).logits).all()


def test_same_seed_same_bytes_other_seed_other_weights(tmp_path: Path, llama: Path) -> None:
    again = build_tiny_model(tmp_path / "again", spec_from_preset("tiny", seed=1), gguf=True)
    assert digests(Path(again.path)) == digests(llama)
    other = digests(Path(build_tiny_model(tmp_path / "other", spec_from_preset("tiny", seed=2)).path))
    first = digests(llama)
    assert other["model.safetensors"] != first["model.safetensors"]
    assert other["tokenizer.json"] == first["tokenizer.json"]  # the tokenizer does not depend on the seed


def test_destination_rules(tmp_path: Path) -> None:
    spec = spec_from_preset("tiny", vocab_size=300, num_layers=1)
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="not empty; pass --force"):
        build_tiny_model(foreign, spec)
    with pytest.raises(ConfigError, match="was not built by"):
        build_tiny_model(foreign, spec, force=True)
    assert (foreign / "notes.txt").read_text() == "mine"

    ours = tmp_path / "ours"
    build_tiny_model(ours, spec)
    with pytest.raises(ConfigError, match="pass --force"):
        build_tiny_model(ours, spec)
    build_tiny_model(ours, spec.model_copy(update={"seed": 5}), force=True)
    assert json.loads((ours / MARKER_FILE).read_text())["spec"]["seed"] == 5


def test_a_failed_build_leaves_the_old_folder_and_no_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = spec_from_preset("tiny", vocab_size=300, num_layers=1)
    dest = tmp_path / "m"
    build_tiny_model(dest, spec)
    before = digests(dest)

    def boom(_spec: TinyModelSpec) -> dict:
        raise RuntimeError("disk full")

    monkeypatch.setattr(builder_module, "random_weights", boom)
    with pytest.raises(RuntimeError, match="disk full"):
        build_tiny_model(dest, spec.model_copy(update={"seed": 9}), force=True)
    assert digests(dest) == before
    assert [p.name for p in tmp_path.iterdir()] == ["m"]


def test_vocabulary_is_padded_to_the_exact_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """A corpus with few distinct pairs runs out of merges: reserved tokens fill the vocabulary."""
    monkeypatch.setattr(tokenizer_module, "corpus_lines", lambda vocab_size: iter(["abab abab"] * 50))
    trained = tokenizer_module.train_tokenizer(spec_from_preset("tiny", vocab_size=400))
    assert len(trained.vocab) == 400 == trained.tokenizer.get_vocab_size()
    assert "<|reserved_0|>" in trained.special_ids and trained.vocab[-1].startswith("<|reserved_")
    assert "" not in trained.vocab


# ---- the GGUF copy --------------------------------------------------------------------------------
@pytest.mark.parametrize(("which", "pre"), [("llama", "gpt-2"), ("qwen2", "qwen2")])
def test_gguf_metadata_and_tensors(which: str, pre: str, request: pytest.FixtureRequest) -> None:
    import gguf

    path = request.getfixturevalue(which)
    reader = gguf.GGUFReader(path / "model.gguf")
    fields = {
        name: field.contents()
        for name, field in reader.fields.items()
        if name not in ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.merges")
    }
    assert fields["general.architecture"] == which
    assert fields[f"{which}.block_count"] == 2 and fields[f"{which}.embedding_length"] == 128
    assert fields[f"{which}.attention.key_length"] == (32 if which == "llama" else 64)
    assert (fields["tokenizer.ggml.model"], fields["tokenizer.ggml.pre"]) == ("gpt2", pre)
    assert (fields["tokenizer.ggml.bos_token_id"], fields["tokenizer.ggml.eos_token_id"]) == (1, 2)
    assert "<|im_start|>" in fields["tokenizer.chat_template"]
    assert len(reader.fields["tokenizer.ggml.tokens"].data) == 2048
    names = {t.name for t in reader.tensors}
    assert {"token_embd.weight", "output.weight", "output_norm.weight", "blk.1.ffn_down.weight"} <= names
    assert ("blk.0.attn_q.bias" in names) is (which == "qwen2")


def test_gguf_computes_what_the_hf_folder_computes(llama: Path) -> None:
    """transformers reads GGUF back (undoing llama's q/k re-ordering): same tokens, same logits."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    hf_tok, gguf_tok = (
        AutoTokenizer.from_pretrained(llama),
        AutoTokenizer.from_pretrained(llama, gguf_file="model.gguf"),
    )
    text = "Hello world, the model server is ready. def foo(x): return 42"
    ids = hf_tok(text)["input_ids"]
    assert gguf_tok(text)["input_ids"] == ids
    hf = AutoModelForCausalLM.from_pretrained(llama)
    from_gguf = AutoModelForCausalLM.from_pretrained(llama, gguf_file="model.gguf")
    with torch.no_grad():
        diff = (hf(torch.tensor([ids])).logits - from_gguf(torch.tensor([ids])).logits).abs().max().item()
    assert diff < 1e-5


# llama.cpp (llama-cpp-python, the cached real-engine environment) evaluates the GGUF; it prints
# one JSON line: its tokens and its logits for every position.
_LLAMA_CPP_EVAL = """
import json, sys
from llama_cpp import Llama
llm = Llama(model_path=sys.argv[1], n_ctx=128, logits_all=True, verbose=False)
tokens = llm.tokenize(sys.argv[2].encode(), add_bos=True, special=False)
llm.eval(tokens)
print(json.dumps({"tokens": tokens, "logits": [list(map(float, row)) for row in llm.scores[: len(tokens)]]}))
"""


@pytest.mark.engine
@pytest.mark.parametrize("which", ["llama", "qwen2"])
def test_llama_cpp_computes_what_transformers_computes(which: str, request: pytest.FixtureRequest) -> None:
    """The real consumer of the GGUF: same tokens as the HF tokenizer, logits equal to float noise
    (q/k re-ordering, rotary style, tokenizer split and special tokens all agree)."""
    import subprocess

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from real_engines import engine_python

    python = engine_python("llamacpp")
    path = request.getfixturevalue(which)
    text = "Hello world, the model server is ready. def foo(x): return 42"
    done = subprocess.run(
        [str(python), "-c", _LLAMA_CPP_EVAL, str(path / "model.gguf"), text],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    ids = AutoTokenizer.from_pretrained(path)(text)["input_ids"]
    assert got["tokens"] == ids
    with torch.no_grad():
        expected = AutoModelForCausalLM.from_pretrained(path)(torch.tensor([ids])).logits[0]
    assert (expected - torch.tensor(got["logits"])).abs().max().item() < 1e-2


def test_bf16_gguf_is_written_as_bf16(tmp_path: Path) -> None:
    import gguf

    build_tiny_model(
        tmp_path / "bf16", spec_from_preset("tiny", dtype="bfloat16", num_layers=1, vocab_size=300), gguf=True
    )
    types = {t.name: t.tensor_type for t in gguf.GGUFReader(tmp_path / "bf16" / "model.gguf").tensors}
    assert types["blk.0.attn_q.weight"] == gguf.GGMLQuantizationType.BF16
    assert types["blk.0.attn_norm.weight"] == gguf.GGMLQuantizationType.F32  # 1-D tensors stay F32


# ---- the command ----------------------------------------------------------------------------------
def test_cli_builds_and_reports_json(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app,
        [
            "model",
            "tiny",
            str(tmp_path / "m"),
            "--arch",
            "qwen2",
            "--layers",
            "1",
            "--vocab",
            "300",
            "--seed",
            "3",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["arch"] == "qwen2" and report["seed"] == 3 and report["gguf_path"] is None
    assert set(report["files"]) == HF_FILES


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--head-dim", "48"], "head dim must be one of"),
        (["--kv-heads", "3"], "must divide"),
    ],
)
def test_cli_usage_errors_exit_3(tmp_path: Path, args: list[str], message: str) -> None:
    result = CliRunner().invoke(app, ["model", "tiny", str(tmp_path / "m"), *args, "--json"])
    assert result.exit_code == 3
    assert message in json.loads(result.stdout)["error"]["message"]
    assert not (tmp_path / "m").exists()


def test_cli_refuses_a_non_empty_folder(tmp_path: Path) -> None:
    (tmp_path / "x").write_text("keep")
    result = CliRunner().invoke(app, ["model", "tiny", str(tmp_path), "--json"])
    assert result.exit_code == 3 and "pass --force" in json.loads(result.stdout)["error"]["message"]
