"""Small lies in the tables (issue 24 item 15), each against what the thing really is."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from servefleet.cli.main import app

runner = CliRunner()
LLAMA_8B = {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
            "intermediate_size": 14336, "vocab_size": 128256}


def _capacity(folder: Path, *extra: str) -> dict:
    res = runner.invoke(app, ["capacity", "--model", str(folder), "--gpu-mem", "96GiB", "--json", *extra])
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


def test_capacity_of_a_float32_model_says_float32_and_counts_its_bytes(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({**LLAMA_8B, "torch_dtype": "float32"}))
    out = _capacity(tmp_path)
    assert out["assumptions"]["weight_dtype"] == "float32" and out["assumptions"]["kv_dtype"] == "float32"
    assert out["kv_bytes_per_token"] == 2 * 131072  # 4 bytes a value, not bfloat16's 2
    forced = _capacity(tmp_path, "--dtype", "bfloat16")  # the user's word wins over the config's
    assert forced["assumptions"]["weight_dtype"] == "bfloat16" and forced["kv_bytes_per_token"] == 131072
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_8B))  # no dtype declared: bfloat16, as before
    assert _capacity(tmp_path)["assumptions"]["weight_dtype"] == "bfloat16"
