"""Bad input is refused by the models themselves (so the library and the CLI refuse the same
things), with messages that name the option and the allowed range."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from pydantic import ValidationError

from servefleet.bench.result import BenchConfig
from servefleet.errors import ConfigError
from servefleet.fleet.loader import load_fleet_file
from servefleet.fleet.state import StateStore
from servefleet.generate.runner import GenerateConfig
from servefleet.plan.memory import MemoryAssumptions
from servefleet.plan.planner import JobSpec
from servefleet.validation import build, option_error


@pytest.mark.parametrize(
    ("factory", "fields", "fragment"),
    [
        (JobSpec, {"prompts": -5, "output_tokens_mean": 100}, "--prompts must be greater than or equal to 1 (got -5)"),
        (
            JobSpec,
            {"prompts": 5, "output_tokens_mean": -100},
            "--output-tokens-mean must be greater than 0 (got -100)",
        ),
        (JobSpec, {"prompts": 5, "output_tokens_mean": float("nan")}, "--output-tokens-mean"),
        (MemoryAssumptions, {"gpu_mem_bytes": 1 << 30, "tp": 0}, "--tp must be greater than or equal to 1 (got 0)"),
        (
            MemoryAssumptions,
            {"gpu_mem_bytes": 1 << 30, "mem_fraction": 3},
            "--mem-fraction must be less than or equal to 1 (got 3)",
        ),
        (MemoryAssumptions, {"gpu_mem_bytes": 1 << 30, "mem_fraction": 0}, "--mem-fraction must be greater than 0"),
        (MemoryAssumptions, {"gpu_mem_bytes": 0}, "--gpu-mem must be greater than 0"),
        (BenchConfig, {"input_len": -5}, "--input-len must be greater than or equal to 1 (got -5)"),
        (BenchConfig, {"concurrency": [1, 0, 4]}, "--concurrency must be greater than or equal to 1 (got 0)"),
        (BenchConfig, {"request_rates": [2.0, -1.0]}, "--request-rate"),
        (BenchConfig, {"input_len_range": 1.5}, "--input-len-range must be less than 1"),
        (
            GenerateConfig,
            {"input": "in.jsonl", "output": "out", "concurrency": 0},
            "--concurrency must be greater than or equal to 1 (got 0)",
        ),
        (
            GenerateConfig,
            {"input": "in.jsonl", "output": "out", "params": {"max_tokens": 0}},
            "--max-tokens must be greater than or equal to 1",
        ),
    ],
)
def test_models_refuse_out_of_range_values(factory, fields, fragment) -> None:
    flags = {
        "mem_fraction": "--mem-fraction",
        "gpu_mem_bytes": "--gpu-mem",
        "request_rates": "--request-rate",
        "params.max_tokens": "--max-tokens",
    }
    with pytest.raises(ConfigError) as info:
        build(factory, flags, **fields)
    assert fragment in str(info.value)


def test_every_problem_is_named_at_once() -> None:
    with pytest.raises(ValidationError) as info:
        JobSpec(prompts=0, output_tokens_mean=-1)
    msg = str(option_error(info.value))
    assert "--prompts" in msg and "--output-tokens-mean" in msg


def test_good_values_pass_unchanged() -> None:
    job = build(JobSpec, None, prompts=902_087, output_tokens_mean=1800)
    assert (job.prompts, job.output_tokens_mean) == (902_087, 1800.0)
    assert JobSpec(10, 100) == job.__class__(prompts=10, output_tokens_mean=100)  # positional use still works


def test_server_named_like_the_state_index_is_refused(tmp_path: Path) -> None:
    # a server called "fleet" would write its record over the state folder's fleet.json
    path = tmp_path / "f.toml"
    path.write_text(
        textwrap.dedent("""
        [[servers]]
        name = "fleet"
        engine = "vllm"
        model = "m"
        port = 30000
    """)
    )
    with pytest.raises(ConfigError) as info:
        load_fleet_file(path)
    msg = str(info.value)
    assert "f.toml" in msg and '"fleet" is reserved' in msg
    assert StateStore.INDEX == "fleet.json"


@pytest.fixture
def listener():
    """A port that accepts connections and lets the test see whether anything connected."""
    import socket

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    sock.setblocking(False)
    yield sock
    sock.close()


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (
            ["plan", "--bench", "RUN.json", "--prompts", "-5", "--output-tokens-mean", "10"],
            "--prompts must be greater than or equal to 1",
        ),
        (
            ["plan", "--bench", "RUN.json", "--prompts", "5", "--output-tokens-mean", "-100"],
            "--output-tokens-mean must be greater than 0",
        ),
        (
            ["plan", "--bench", "RUN.json", "--prompts", "5", "--output-tokens-mean", "100", "--gpus", "-4"],
            "--gpus must be",
        ),
        (
            [
                "plan",
                "--bench",
                "RUN.json",
                "--prompts",
                "5",
                "--output-tokens-mean",
                "100",
                "--gpus-per-replica",
                "0",
            ],
            "--gpus-per-replica",
        ),
        (["capacity", "--tp", "0", "--url", "URL"], "--tp"),
        (["capacity", "--mem-fraction", "3", "--url", "URL"], "--mem-fraction must be less than or equal to 1"),
        (
            ["bench", "--url", "URL", "-c", "1", "-n", "4", "--input-len", "-5"],
            "--input-len must be greater than or equal to 1",
        ),
        (["bench", "--url", "URL", "-c", "1", "--duration", "-3"], "--duration must be greater than 0"),
        (["generate", "--input", "IN", "--output", "OUT", "--url", "URL", "--concurrency", "0"], "--concurrency"),
        (
            ["generate", "--input", "IN", "--output", "OUT", "--url", "URL", "--max-tokens", "0"],
            "--max-tokens must be greater than or equal to 1",
        ),
    ],
)
def test_the_cli_refuses_bad_values_before_contacting_anything(args, fragment, listener, tmp_path: Path) -> None:
    import json

    from typer.testing import CliRunner

    from servefleet.cli.main import app

    inp = tmp_path / "in.jsonl"
    inp.write_text('{"id": "1", "prompt": "hi"}\n')
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    argv = [{"URL": url, "IN": str(inp), "OUT": str(tmp_path / "out")}.get(a, a) for a in args] + ["--json"]
    res = CliRunner().invoke(app, argv)
    assert res.exit_code == 3, res.stdout + res.stderr
    error = json.loads(res.stdout)["error"]
    assert error["kind"] == "usage" and fragment in error["message"], error
    with pytest.raises(BlockingIOError):  # no connection is waiting: the server was never contacted
        listener.accept()
    assert not (tmp_path / "out").exists()  # nothing written either


def test_a_fleet_with_a_server_named_fleet_is_refused_by_up(tmp_path: Path) -> None:
    import json

    from typer.testing import CliRunner

    from servefleet.cli.main import app

    fleet = tmp_path / "f.toml"
    fleet.write_text('[[servers]]\nname = "fleet"\nport = 1\nengine = "sim"\nmodel = "m"\n')
    res = CliRunner().invoke(app, ["up", str(fleet), "--json"])
    assert res.exit_code == 3
    error = json.loads(res.stdout)["error"]
    assert error["kind"] == "config" and '"fleet" is reserved' in error["message"]
