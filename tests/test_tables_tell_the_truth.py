"""Small lies in the tables (issue 24 item 15), each against what the thing really is."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from servefleet.cli.main import app

runner = CliRunner()
LLAMA_8B = {
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "intermediate_size": 14336,
    "vocab_size": 128256,
}


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


def test_plan_check_outside_tolerance_is_in_the_failure_shape(tmp_path: Path) -> None:
    from test_plan_check import bench_run, make_job_dir

    job = make_job_dir(
        tmp_path / "out", valid=1000, runs=[(0.0, 505.0, "complete")], rows={"a": [100] * 500, "b": [100] * 500}
    )
    fast = bench_run(tmp_path / "fast.json", [(1, 80.0), (4, 200.0)], cap=4)  # promises twice what the job measured
    res = runner.invoke(app, ["plan", "--check", str(job), "--bench", str(fast), "--json"])
    assert res.exit_code == 1
    doc = json.loads(res.stdout)
    assert doc["ok"] is False and doc["error"]["exit_code"] == 1 and doc["error"]["kind"] == "failed"
    assert doc["error"]["message"].startswith("off by more than 10%") and doc["within_tolerance"] is False
    ok = runner.invoke(
        app,
        [
            "plan",
            "--check",
            str(job),
            "--bench",
            str(bench_run(tmp_path / "r.json", [(1, 40.0), (4, 100.0)], cap=4)),
            "--json",
        ],
    )
    assert ok.exit_code == 0 and "ok" not in json.loads(ok.stdout)  # success payloads never carry "ok"


def test_outcome_document_keeps_the_payload_and_the_exit_code() -> None:
    from servefleet.cli.failure import outcome_document

    payload = {"status": "incomplete", "failed": 3}
    assert outcome_document(payload, exit_code=0, message="x", command="generate") is payload
    doc = outcome_document(payload, exit_code=130, message="the job ended interrupted", command="generate")
    assert list(doc)[:2] == ["ok", "error"] and doc["status"] == "incomplete"
    assert doc["error"] == {
        "kind": "interrupted",
        "message": "the job ended interrupted",
        "hint": None,
        "exit_code": 130,
        "command": "generate",
    }


def test_status_labels_the_process_group_not_a_pid() -> None:
    from rich.console import Console

    from servefleet.cli.fleet_view import status_table
    from servefleet.fleet import Liveness, ServerStatus

    st = ServerStatus(name="a", engine="sim", port=8000, pid=4242, state=Liveness.READY)
    console = Console(width=200, record=True)
    console.print(status_table("f", [st]))
    header = console.export_text().splitlines()[1:4]
    assert any("pgid" in line for line in header) and not any(" pid " in line for line in header), header
    assert st.to_json()["pgid"] == 4242


def test_generate_incomplete_json_is_in_the_failure_shape(tmp_path: Path) -> None:
    import subprocess
    import sys

    from conftest import SimProcess

    sim = SimProcess(
        "--load-time", "0", "--model", "m", "--style", "vllm", "--error-rate", "1.0", log_path=tmp_path / "sim.log"
    ).start()
    try:
        sim.wait_ready(timeout=120)
        inp = tmp_path / "in.jsonl"
        inp.write_text('{"id": "a", "prompt": "hi"}\n{"id": "b", "prompt": "yo"}\n')
        res = subprocess.run(
            [
                sys.executable,
                "-m",
                "servefleet.cli.main",
                "generate",
                "-i",
                str(inp),
                "-o",
                str(tmp_path / "out"),
                "--url",
                sim.url,
                "--max-attempts",
                "1",
                "--max-tokens",
                "4",
                "--json",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        sim.stop()
    assert res.returncode == 1, res.stderr
    doc = json.loads(res.stdout)
    assert doc["ok"] is False and doc["error"] == {
        "kind": "failed",
        "message": "the job ended incomplete",
        "hint": None,
        "exit_code": 1,
        "command": "generate",
    }
    assert doc["status"] == "incomplete"  # the report itself is all there
