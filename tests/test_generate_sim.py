"""generate as users run it: the CLI in a subprocess, against simulated engines in subprocesses.

SIGKILL at random moments and resume; a server of a managed fleet crashing mid-job; error storms;
bad input; a 200k-line input in bounded memory."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

from conftest import FAST_SIM, INSTANT_SIM, PYTHON, SimProcess, free_port, wait_until
from parquet_read import read_parquet


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory):
    log = tmp_path_factory.mktemp("sim") / "sim.log"
    proc = SimProcess(*FAST_SIM, "--max-running", "16", log_path=log).start().wait_ready()
    yield proc
    proc.stop()


def write_prompts(path: Path, n: int, *, pad: int = 0) -> Path:
    filler = "x" * pad
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"id": f"p{i}", "prompt": f"prompt {i} {filler}"}) + "\n")
    return path


def generate_argv(src: Path, out: Path | str, *target: str, extra: tuple[str, ...] = ()) -> list[str]:
    return [
        PYTHON,
        "-m",
        "servefleet.cli.main",
        "generate",
        "-i",
        str(src),
        "-o",
        str(out),
        *target,
        "--max-tokens",
        "4",
        "--json",
        *extra,
    ]


def run_cli(argv: list[str], *, timeout: float = 120, env: dict[str, str] | None = None) -> tuple[int, dict, str]:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
    try:
        report = json.loads(proc.stdout)
    except ValueError:
        raise AssertionError(
            f"no JSON report (rc {proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
        ) from None
    return proc.returncode, report, proc.stderr


def committed_ids(out: Path) -> list[str]:
    ids: list[str] = []
    for shard in sorted((out / "shards").glob("*")):
        assert shard.name.startswith("part-") and shard.suffix == ".parquet", f"not a committed shard: {shard.name}"
        ids.extend(read_parquet(shard, columns=["id"]).column("id").to_pylist())  # whole and readable
    return ids


def shard_count(out: Path) -> int:
    d = out / "shards"
    return len(os.listdir(d)) if d.is_dir() else 0


# ---- kill at any moment, resume, exactly once ----------------------------------------------------


@pytest.mark.parametrize("seed", [11, 22, 33])
def test_sigkill_at_random_moments_then_resume_answers_every_id_exactly_once(sim, tmp_path, seed):
    rng = random.Random(seed)
    n = 300
    src = write_prompts(tmp_path / "in.jsonl", n)
    out = tmp_path / "out"
    argv = generate_argv(src, out, "--url", sim.url, extra=("--shard-rows", "15", "--shard-seconds", "0.2"))
    kills = 0
    for _ in range(2):
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if rng.random() < 0.3:
            # early: once the run is recorded, before (or while) anything is committed
            wait_until(
                lambda proc=proc: (out / "job.json").exists() or proc.poll() is not None, timeout=60, what="job.json"
            )
        else:
            goal = shard_count(out) + rng.randint(1, 6)
            wait_until(
                lambda proc=proc, goal=goal: shard_count(out) >= goal or proc.poll() is not None,
                timeout=60,
                what=f"{goal} shards",
            )
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            kills += 1
        proc.wait(timeout=30)
        ids = committed_ids(out)
        assert len(ids) == len(set(ids)), "a killed run left an id committed twice"
    assert kills >= 1
    rc, report, err = run_cli(argv)
    assert rc == 0 and report["status"] == "complete", err[-2000:]
    assert report["resumed"] and report["done_before"] + report["committed"] == n and report["remaining"] == 0
    ids = committed_ids(out)
    assert sorted(ids) == sorted(f"p{i}" for i in range(n))
    assert not list((out / ".staging").glob("*")) if (out / ".staging").exists() else True
    ledger = {p.stem for p in (out / "ledger").glob("*.json")}
    assert ledger == {p.stem for p in (out / "shards").glob("*.parquet")}  # every shard has its entry again


# ---- a managed server crashes mid-job ------------------------------------------------------------


def test_a_crashing_fleet_server_is_restarted_and_reused_without_losing_prompts(tmp_path):
    """A fleet of one server that dies (SIGKILL) after 120 answers: the job can only finish if the
    server is restarted through the fleet layer and used again."""
    port = free_port()
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(f"""
[fleet]
name = "gen"
timeout = 60
stall = 30
smoke = false

[[servers]]
name = "crashy"
engine = "sim"
model = "sim-7b"
port = {port}
args = {json.dumps([*FAST_SIM, "--max-running", "8", "--crash-after", "120", "--crash-mode", "kill"])}
""")
    servefleet = [PYTHON, "-m", "servefleet.cli.main"]
    up = subprocess.run([*servefleet, "up", str(fleet)], capture_output=True, text=True, timeout=120)
    assert up.returncode == 0, up.stdout + up.stderr
    try:
        src = write_prompts(tmp_path / "in.jsonl", 200)
        rc, report, err = run_cli(generate_argv(src, tmp_path / "out", "--fleet", str(fleet)), timeout=180)
    finally:
        subprocess.run([*servefleet, "down", "--fleet", str(fleet)], capture_output=True, timeout=120)
    assert rc == 0 and report["status"] == "complete", err[-3000:]
    crashy = report["servers"][0]
    assert crashy["outages"] == 1 and crashy["restarts"] == 1 and crashy["state"] == "up"
    assert crashy["requests"] == 200 and report["requeued"] + report["retries"] >= 1
    assert any("crashy: back in service" in e for e in report["events"])
    assert sorted(committed_ids(tmp_path / "out")) == sorted(f"p{i}" for i in range(200))


# ---- error storms ---------------------------------------------------------------------------------


def test_429_and_500_storms_from_the_sim_are_retried(tmp_path):
    storm = (
        SimProcess(
            *FAST_SIM,
            "--max-running",
            "16",
            "--error-rate",
            "0.25",
            "--rate-limit-rate",
            "0.25",
            "--seed",
            "3",
            log_path=tmp_path / "storm.log",
        )
        .start()
        .wait_ready()
    )
    try:
        src = write_prompts(tmp_path / "in.jsonl", 300)
        rc, report, err = run_cli(
            generate_argv(
                src,
                tmp_path / "out",
                "--url",
                storm.url,
                extra=("--max-attempts", "40", "--backoff-base", "0.01", "--backoff-max", "0.05"),
            )
        )
    finally:
        storm.stop()
    assert rc == 0 and report["status"] == "complete", err[-2000:]
    assert report["failed"] == 0 and report["retries"] > 100
    assert report["servers"][0]["errors"] == report["retries"]
    assert sorted(committed_ids(tmp_path / "out")) == sorted(f"p{i}" for i in range(300))


# ---- bad input ------------------------------------------------------------------------------------


def _requests_served(sim: SimProcess) -> float:
    with urllib.request.urlopen(sim.url + "/metrics", timeout=5) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith("vllm:request_success_total"):
                return float(line.rsplit(" ", 1)[1])
    raise AssertionError("no request counter in /metrics")


def test_bad_lines_and_duplicates_go_to_the_rejects_file_and_strict_sends_nothing(sim, tmp_path):
    src = tmp_path / "in.jsonl"
    lines = [
        json.dumps({"id": "a", "prompt": "one"}),
        "{broken",
        json.dumps({"id": "b"}),
        json.dumps({"id": "a", "prompt": "dup"}),
        "",
        json.dumps(
            {"custom_id": "c", "url": "/v1/chat/completions", "body": {"messages": [{"role": "user", "content": "x"}]}}
        ),
        json.dumps(["not", "an", "object"]),
    ]
    src.write_text("\n".join(lines) + "\n")
    before = _requests_served(sim)
    rc, report, _ = run_cli(generate_argv(src, tmp_path / "strict", "--url", sim.url, extra=("--strict",)))
    assert rc == 1 and report["status"] == "rejected" and report["rejected"] == 4
    assert _requests_served(sim) == before  # --strict: nothing was sent
    assert not (tmp_path / "strict" / "shards").exists()
    rc, report, _ = run_cli(generate_argv(src, tmp_path / "out", "--url", sim.url))
    # every valid record answered, but 4 of the 6 records never were: not complete, exit 1 (as --help says)
    assert rc == 1 and report["status"] == "incomplete" and report["committed"] == 2 and report["duplicates"] == 1
    assert report["records"] == 6 and report["rejected"] == 4 and report["failed"] == 0
    assert "4 of 6 input records rejected" in report["message"] and report["files"]["rejects"] in report["message"]
    rejects = [json.loads(x) for x in (tmp_path / "out" / "rejects.jsonl").read_text().splitlines()]
    assert sorted((r["line"], r["reason"].split(":")[0].split(" (")[0]) for r in rejects) == [
        (2, "invalid JSON"),
        (3, "no 'prompt' or 'messages'"),
        (4, "duplicate id"),
        (7, "a record must be a JSON object, not list"),
    ]
    assert sorted(committed_ids(tmp_path / "out")) == ["a", "c"]
    # the same command again: nothing left to send, still not complete; the summary names the rejects
    argv = [a for a in generate_argv(src, tmp_path / "out", "--url", sim.url) if a != "--json"]
    again = subprocess.run(argv, capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "250"})
    assert again.returncode == 1, again.stdout + again.stderr
    assert "incomplete  2/6 input records committed (0 in this run, 2 before), 4 rejected" in again.stdout
    assert str(tmp_path / "out" / "rejects.jsonl") in again.stdout
    manifest = json.loads((tmp_path / "out" / "job.json").read_text())
    assert [r["status"] for r in manifest["runs"]] == ["incomplete", "incomplete"]


# ---- a 200k-line input in bounded memory ----------------------------------------------------------


def test_a_200k_line_input_runs_in_bounded_memory(tmp_path):
    """190,000 of the input's ids are already committed (written through the ledger, as an earlier
    run would have; its job.json lost), so the run reads and checks all 200,000 lines (pre-pass),
    matches the committed lines, and sends the last 10,000. The bound is relative to a 1,000-line job
    of the same records run first on the same machine: what the process costs before any input
    (interpreter, pyarrow, and pandas when installed: pyarrow imports it on its first array, about
    35 MB) differs between machines, and an absolute bound measured that, not the streaming. Holding
    the input (about 110 MB as bytes, several times that parsed) would add more than the bound."""
    from servefleet.generate.ledger import Ledger
    from servefleet.generate.shards import OutputRow, ShardBuffer, ShardLimits, shard_schema
    from servefleet.generate.sinks import LocalSink

    n, done = 200_000, 190_000
    src = write_prompts(tmp_path / "in.jsonl", n, pad=520)
    out = tmp_path / "out"
    sha = hashlib.sha256(src.read_bytes()).hexdigest()
    run_id = "20260101T000000-0001"
    sink = LocalSink(str(out))
    ledger = Ledger(sink, "parquet", run_id, sha)
    schema = shard_schema(False, False)
    for start in range(0, done, 10_000):
        buf = ShardBuffer(schema, ShardLimits(rows=10_000))
        for i in range(start, start + 10_000):
            buf.add(OutputRow(f"p{i}", i + 1, "earlier answer", "length", 3, 4, "m", "earlier", 1, 0.1))
        ledger.commit(buf)
    small = tmp_path / "small.jsonl"
    with open(src, "rb") as f, open(small, "wb") as g:
        g.writelines(f.readline() for _ in range(1000))
    server = SimProcess(*INSTANT_SIM, "--max-running", "64", log_path=tmp_path / "sim.log").start().wait_ready()
    try:
        rc, small_report, _ = run_cli(
            generate_argv(small, tmp_path / "small-out", "--url", server.url, extra=("--shard-rows", "5000"))
        )
        assert rc == 0 and small_report["committed"] == 1000
        proc = subprocess.Popen(
            generate_argv(src, out, "--url", server.url, extra=("--shard-rows", "5000")),
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        # From outside: RSS sampled while it runs (wait4's ru_maxrss would also count this test
        # process, which vfork+exec makes the child's starting point).
        watched = psutil.Process(proc.pid)
        sampled = 0.0
        while proc.poll() is None:
            with contextlib.suppress(psutil.Error):
                sampled = max(sampled, watched.memory_info().rss / 2**20)
            time.sleep(0.05)  # a sampling period, not a synchronisation
        report = json.loads(proc.stdout.read())
        proc.stdout.close()
    finally:
        server.stop()
    assert proc.returncode == 0 and report["status"] == "complete"
    assert (report["done_before"], report["committed"], report["remaining"]) == (done, n - done, 0)
    peak_mb = report["peak_rss_mb"]  # the generator's own high-water mark (VmHWM)
    input_mb = src.stat().st_size / 2**20
    assert input_mb > 100
    assert 0 < sampled <= peak_mb + 1
    base_mb = small_report["peak_rss_mb"]
    assert peak_mb - base_mb < 0.75 * input_mb, (
        f"peak RSS {peak_mb:.0f} MB ({base_mb:.0f} MB for 1,000 lines) for a {input_mb:.0f} MB input"
    )
    ids = committed_ids(out)
    assert len(ids) == n and len(set(ids)) == n
