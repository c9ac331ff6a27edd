"""`servefleet plan` and `servefleet capacity` through the CLI, on runs written with the bench schema."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from servefleet.bench.result import BenchConfig, Environment, Point, Run, Stat, Target, save_run
from servefleet.capacity import Capacity
from servefleet.cli.main import app

runner = CliRunner()


def _run(path, label, curve, cap=None):
    points = [
        Point(
            concurrency=c,
            requests=100,
            successful=100,
            errors=0,
            duration_s=10.0,
            requests_per_s=10.0,
            input_tokens=1000,
            output_tokens=int(t * 10),
            output_tokens_per_s=t,
            total_tokens_per_s=t * 1.1,
            ttft_ms=Stat(),
            tpot_ms=Stat(),
            itl_ms=Stat(),
            e2e_ms=Stat(),
            achieved_concurrency=float(c),
            client_bound=False,
        )
        for c, t in curve
    ]
    run = Run(
        created_at="2026-11-30T00:00:00Z",
        target=Target(label=label, base_url="http://127.0.0.1:1"),
        config=BenchConfig(concurrency=[c for c, _ in curve]),
        environment=Environment(servefleet_version="0", python="3.11", platform="linux", hostname="h"),
        capacity=Capacity(max_running_requests=cap) if cap else None,
        points=points,
    )
    save_run(run, path)
    return path


def test_plan_ranks_and_reads_the_cap(tmp_path):
    spec = _run(tmp_path / "mtp.json", "mtp", [(1, 70.0), (4, 234.0), (16, 400.0)], cap=4)
    plain = _run(tmp_path / "plain.json", "plain", [(1, 26.7), (16, 350.0), (64, 600.0)])
    res = runner.invoke(
        app,
        [
            "plan",
            "--bench",
            str(spec),
            "--bench",
            str(plain),
            "--prompts",
            "902087",
            "--output-tokens-mean",
            "1800",
            "--gpus",
            "1,8,64",
            "--json",
            "--plot",
            str(tmp_path / "p.png"),
        ],
    )
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    first = out["plans"]["1"]
    assert [r["name"] for r in first] == ["plain", "mtp"]
    assert first[1]["best_concurrency"] == 4  # the 16-point is above the cap read from capacity
    assert out["plans"]["64"][0]["makespan_s"] < first[0]["makespan_s"] / 50
    assert out["recommendation"].startswith("use plain at concurrency 64")
    assert (tmp_path / "p.png").stat().st_size > 1000
    for r in first + out["plans"]["64"]:  # the predicted tail: held from the queue emptying, what release returns
        tail = r["tail"]
        assert tail["makespan_s"] == pytest.approx(r["makespan_s"])
        assert tail["held_server_s"] == pytest.approx(r["replicas"] * (tail["makespan_s"] - tail["queue_empty_s"]))
        assert 0 <= tail["released_server_s"] < tail["held_server_s"]


def test_plan_sample_mean_and_gpus_per_replica(tmp_path):
    run = _run(tmp_path / "tp2.json", "tp2", [(8, 800.0)])
    sample = tmp_path / "sample.jsonl"
    sample.write_text("\n".join(json.dumps({"usage": {"completion_tokens": n}}) for n in (100, 300)) + "\nnot json\n")
    res = runner.invoke(
        app, ["plan", "--bench", f"{run}:2", "--prompts", "1000", "--sample", str(sample), "--gpus", "4", "--json"]
    )
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    row = out["plans"]["4"][0]
    assert row["replicas"] == 2 and row["gpus"] == 4
    assert "mean output length 200.0 tokens from 2 records" in out["notes"][0]


def test_plan_errors_are_clear(tmp_path):
    res = runner.invoke(
        app, ["plan", "--bench", str(tmp_path / "missing.json"), "--prompts", "10", "--output-tokens-mean", "5"]
    )
    assert res.exit_code == 3 and "no such bench run" in res.output
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    res = runner.invoke(app, ["plan", "--bench", str(bad), "--prompts", "10", "--output-tokens-mean", "5"])
    assert res.exit_code == 3 and "not a servefleet bench RUN.json" in res.output
    res = runner.invoke(app, ["plan", "--bench", str(bad), "--prompts", "10"])
    assert res.exit_code == 3 and "exactly one of" in res.output


def test_capacity_json_contract(tmp_path):
    (tmp_path / "config.json").write_text(
        json.dumps(
            {
                "hidden_size": 4096,
                "num_hidden_layers": 32,
                "num_attention_heads": 32,
                "num_key_value_heads": 8,
                "intermediate_size": 14336,
                "vocab_size": 128256,
            }
        )
    )
    res = runner.invoke(
        app, ["capacity", "--model", str(tmp_path), "--gpu-mem", "96GiB", "--context-len", "8192", "--json"]
    )
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    for key in (
        "weight_bytes",
        "kv_bytes_per_token",
        "state_bytes_per_request",
        "kv_tokens",
        "max_running_requests",
        "assumptions",
    ):
        assert key in out
    assert out["kv_bytes_per_token"] == 131072 and out["state_bytes_per_request"] == 0
    assert out["assumptions"]["mem_fraction"] == 0.9


def test_plan_and_capacity_tables_on_the_terminal(tmp_path):
    """Without --json: the plan table per GPU count and the recommendation; the memory model table."""
    spec = _run(tmp_path / "mtp.json", "mtp", [(1, 70.0), (4, 234.0), (16, 400.0)], cap=4)
    plain = _run(tmp_path / "plain.json", "plain", [(1, 26.7), (16, 350.0), (64, 600.0)])
    res = CliRunner().invoke(
        app,
        [
            "plan",
            "--bench",
            str(spec),
            "--bench",
            str(plain),
            "--prompts",
            "902087",
            "--output-tokens-mean",
            "1800",
            "--gpus",
            "8",
        ],
        env={"COLUMNS": "200"},
    )
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.split())
    assert "902,087 prompts x 1,800 output tokens on 8 GPU(s)" in text and "GPU-hours" in text
    assert "recommendation: use plain at concurrency 64" in text and "sooner than mtp" in text
    assert "tail: " in text and "server-hours idle or draining" in text and "--release-tail returns about" in text
    assert (
        "small, the plan's replicas drain nearly together" in text
    )  # 902,087 answers of one length: they end together
    (tmp_path / "config.json").write_text(
        json.dumps(
            {
                "hidden_size": 4096,
                "num_hidden_layers": 32,
                "num_attention_heads": 32,
                "num_key_value_heads": 8,
                "intermediate_size": 14336,
                "vocab_size": 128256,
            }
        )
    )
    res = CliRunner().invoke(
        app,
        ["capacity", "--model", str(tmp_path), "--gpu-mem", "96GiB", "--context-len", "8192"],
        env={"COLUMNS": "200"},
    )
    assert res.exit_code == 0, res.output
    assert "memory model" in res.output and "131,072" in res.output  # KV bytes per token
