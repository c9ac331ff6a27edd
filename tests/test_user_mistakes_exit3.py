"""bench and generate: user mistakes are exit 3 with the path or the limit named, before any point runs (issue 24
item 13): a tokenizer path that is not there or not a tokenizer, an --out folder that cannot be
written, prompts longer than the server's context."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import SimProcess
from servefleet.cli.main import app

runner = CliRunner()
CLOSED = "http://127.0.0.1:9"  # discard port: nothing listens; a command that asked it would exit 4


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    proc = SimProcess(
        "--load-time",
        "0",
        "--model",
        "ctx",
        "--style",
        "vllm",
        "--max-model-len",
        "64",
        log_path=tmp_path_factory.mktemp("sim") / "sim.log",
    ).start()
    yield proc.wait_ready(timeout=180)
    proc.stop()


def _bench(url: str, *extra: str):
    return runner.invoke(
        app,
        [
            "bench",
            "--url",
            url,
            "-c",
            "2",
            "-n",
            "4",
            "--input-len",
            "10",
            "--output-len",
            "8",
            "--api",
            "completions",
            *extra,
        ],
    )


def test_a_tokenizer_that_is_not_there_is_named_before_the_server_is_asked() -> None:
    res = _bench(CLOSED, "--tokenizer", "/nonexistent/tok")
    assert res.exit_code == 3, res.output
    assert "--tokenizer /nonexistent/tok: no such folder" in res.output


def test_a_folder_that_is_not_a_tokenizer_is_exit_3(sim, tmp_path: Path) -> None:
    res = _bench(sim.url, "--tokenizer", str(tmp_path))
    assert res.exit_code == 3, res.output
    assert f"--tokenizer {tmp_path}: not a tokenizer folder" in res.output
    assert "Traceback" not in res.output


def test_an_out_folder_that_cannot_be_written_is_refused_first(tmp_path: Path) -> None:
    if os.geteuid() == 0:  # root passes permission bits: a folder the kernel lets nobody create files in
        folder = Path("/proc")
    else:
        folder = tmp_path / "ro"
        folder.mkdir()
        folder.chmod(0o555)
    res = _bench(CLOSED, "--out", str(folder / "RUN.json"))
    assert res.exit_code == 3, res.output
    assert f"--out {folder / 'RUN.json'}: cannot write in {folder}" in res.output
    unmakeable = _bench(
        CLOSED, "--out", str(folder / "no" / "RUN.json")
    )  # a run's folder is made, unless it cannot be
    assert unmakeable.exit_code == 3 and f"cannot make the folder {folder / 'no'}" in unmakeable.output, (
        unmakeable.output
    )


def test_prompts_longer_than_the_servers_context_are_refused_before_any_point(sim) -> None:
    res = runner.invoke(
        app,
        [
            "bench",
            "--url",
            sim.url,
            "-c",
            "2",
            "-n",
            "4",
            "--input-len",
            "60",
            "--output-len",
            "16",
            "--api",
            "completions",
        ],
    )
    assert res.exit_code == 3, res.output
    assert (
        "do not fit the context" in res.output and "(64 tokens)" in res.output and "60 input + 16 output" in res.output
    )
    assert "ignore_eos" not in res.output and "concurrency 2:" not in res.output  # no point ran


def test_generate_into_a_folder_that_cannot_be_written_is_exit_3(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        out = Path("/proc") / "servefleet-job"
    else:
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o555)
        out = ro / "job"
    inp = tmp_path / "in.jsonl"
    inp.write_text('{"id": "a", "prompt": "hi"}\n')
    res = runner.invoke(app, ["generate", "-i", str(inp), "-o", str(out), "--url", CLOSED, "--model", "m"])
    assert res.exit_code == 3, res.output
    assert f"--output {out}: cannot write there" in res.output
