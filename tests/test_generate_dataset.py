"""What a dataset job needs (issue 29): --preview, fail-fast, bad-input refusals, --samples, provenance,
models, logprobs -- the CLI in a subprocess against simulated engines."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import pytest

from conftest import PYTHON, SimProcess
from parquet_read import read_parquet

INSTANT_SIM = ("--load-time", "0", "--decode-ms", "0", "--decode-ms-per-running", "0", "--prefill-ms-per-1k-tokens", "0")


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory):
    log = tmp_path_factory.mktemp("sim") / "sim.log"
    proc = SimProcess(*INSTANT_SIM, "--max-running", "16", log_path=log).start().wait_ready()
    yield proc
    proc.stop()


def write_prompts(path: Path, n: int, **extra) -> Path:
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"id": f"p{i}", "prompt": f"prompt {i}", **extra}) + "\n")
    return path


def cli(*args: str, timeout: float = 120) -> tuple[int, dict | None, str]:
    proc = subprocess.run([PYTHON, "-m", "servefleet.cli.main", "generate", *args, "--json"], capture_output=True, text=True, timeout=timeout)
    try:
        doc = json.loads(proc.stdout)
    except ValueError:
        doc = None
    return proc.returncode, doc, proc.stderr


def tree_digest(root: Path) -> dict[str, str]:
    """Every file under ``root`` and its content hash: what "nothing committed was touched" compares."""
    if not root.exists():
        return {}
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()}


def rows_of(out: Path, columns: list[str] | None = None) -> list[dict]:
    rows: list[dict] = []
    for shard in sorted((out / "shards").glob("*.parquet")):
        rows.extend(read_parquet(shard, columns=columns).to_pylist())
    return rows


# ---- --preview -----------------------------------------------------------------------------------


def test_preview_sends_n_records_shows_requests_and_answers_and_commits_nothing(sim, tmp_path):
    src = write_prompts(tmp_path / "in.jsonl", 20)
    out = tmp_path / "out"
    rc, doc, err = cli("-i", str(src), "-o", str(out), "--url", sim.url, "--max-tokens", "5", "--preview", "3")
    assert rc == 0, err[-2000:]
    assert doc["status"] == "preview" and doc["committed"] == 0
    assert [r["id"] for r in doc["rows"]] == ["p0", "p1", "p2"]
    for r in doc["rows"]:
        assert r["request"]["max_tokens"] == 5 and r["request"]["prompt"].startswith("prompt ")  # the body as the job sends it
        assert r["finish_reason"] in ("stop", "length") and r["completion_tokens"] >= 1 and r["text"]
    assert not out.exists()  # the destination is not even created


def test_preview_shows_a_failing_request_and_exits_1(sim, tmp_path):
    src = write_prompts(tmp_path / "in.jsonl", 3)
    rc, doc, err = cli("-i", str(src), "-o", str(tmp_path / "out"), "--url", sim.url, "--max-tokens", "100000000", "--preview", "2")
    assert rc == 1, err[-2000:]
    assert doc["status"] == "preview_failed" and all("maximum context length" in r["error"] for r in doc["rows"])


def test_preview_larger_than_the_input_is_refused_with_exit_3_and_touches_nothing(sim, tmp_path):
    src = write_prompts(tmp_path / "in.jsonl", 4)
    out = tmp_path / "out"
    rc, _, err = cli("-i", str(src), "-o", str(out), "--url", sim.url, "--max-tokens", "3")
    assert rc == 0, err[-2000:]
    before = tree_digest(out)
    rc, doc, err = cli("-i", str(src), "-o", str(out), "--url", sim.url, "--max-tokens", "3", "--preview", "5")
    assert rc == 3, err[-2000:]
    assert "--preview 5" in json.dumps(doc) + err and "only 4 valid records" in json.dumps(doc) + err
    assert tree_digest(out) == before


# ---- fail-fast -----------------------------------------------------------------------------------


def test_every_request_failing_stops_the_job_within_the_first_answers_with_exit_1(sim, tmp_path):
    """A broken request (here: max_tokens beyond the context, what a wrong template or setting gives: HTTP 400
    for every record) stops after --fail-fast-after answers, not after the whole input."""
    src = write_prompts(tmp_path / "in.jsonl", 2000)
    rc, doc, err = cli("-i", str(src), "-o", str(tmp_path / "out"), "--url", sim.url, "--max-tokens", "100000000",
                       "--concurrency", "2", "--max-failure-rate", "0.5", "--fail-fast-after", "10")
    assert rc == 1, err[-2000:]
    report = doc["report"] if "report" in doc else doc
    assert report["status"] == "failed_fast"
    assert 10 <= report["failed"] <= 10 + 2  # M answers, plus what was in flight when it stopped
    assert "--max-failure-rate" in report["message"] and "maximum context length" in report["message"] and "--preview" in report["message"]


def test_answers_cut_at_max_tokens_stop_the_job_with_a_hint(sim, tmp_path):
    src = write_prompts(tmp_path / "in.jsonl", 2000)
    rc, doc, err = cli("-i", str(src), "-o", str(tmp_path / "out"), "--url", sim.url, "--max-tokens", "1", "--concurrency", "2",
                       "--max-length-rate", "0.9", "--fail-fast-after", "10", "--shard-rows", "5")
    assert rc == 1, err[-2000:]
    report = doc["report"] if "report" in doc else doc
    assert report["status"] == "failed_fast" and report["done"] <= 12
    assert "finish_reason=length" in report["message"] and "--max-tokens too small" in report["message"]


def test_a_healthy_job_with_fail_fast_set_completes(sim, tmp_path):
    src = write_prompts(tmp_path / "in.jsonl", 60)
    rc, doc, err = cli("-i", str(src), "-o", str(tmp_path / "out"), "--url", sim.url, "--max-tokens", "8",
                       "--max-failure-rate", "0.1", "--max-length-rate", "0.99", "--fail-fast-after", "10")
    assert rc == 0, err[-2000:]
    report = doc["report"] if "report" in doc else doc
    assert report["status"] == "complete" and report["committed"] == 60


def test_a_fail_fast_share_out_of_range_is_a_usage_error(tmp_path):
    src = write_prompts(tmp_path / "in.jsonl", 3)
    rc, doc, err = cli("-i", str(src), "-o", str(tmp_path / "out"), "--url", "http://127.0.0.1:9", "--max-failure-rate", "1.5")
    assert rc == 3 and "--max-failure-rate" in json.dumps(doc) + err
    assert not (tmp_path / "out").exists()
