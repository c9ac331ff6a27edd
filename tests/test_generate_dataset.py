"""What a dataset job needs (issue 29): --preview, fail-fast, bad-input refusals, --samples, provenance,
models, logprobs -- the CLI in a subprocess against simulated engines."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import pytest

from conftest import INSTANT_SIM, PYTHON, SimProcess
from parquet_read import read_parquet


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
    proc = subprocess.run(
        [PYTHON, "-m", "servefleet.cli.main", "generate", *args, "--json"],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    try:
        doc = json.loads(proc.stdout)
    except ValueError:
        doc = None
    return proc.returncode, doc, proc.stderr


def tree_digest(root: Path) -> dict[str, str]:
    """Every committed file under ``root`` and its content hash: what "nothing committed was touched" compares
    (not the lock, which names its holder, nor staging)."""
    if not root.exists():
        return {}
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != ".lock" and ".staging" not in p.parts
    }


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
        assert r["request"]["max_tokens"] == 5 and r["request"]["prompt"].startswith(
            "prompt "
        )  # the body as the job sends it
        assert r["finish_reason"] in ("stop", "length") and r["completion_tokens"] >= 1 and r["text"]
    assert not out.exists()  # the destination is not even created


def test_preview_with_samples_shows_the_request_with_n_and_the_seed(sim, tmp_path):
    src = write_prompts(tmp_path / "in.jsonl", 5)
    rc, doc, err = cli(
        "-i",
        str(src),
        "-o",
        str(tmp_path / "out"),
        "--url",
        sim.url,
        "--max-tokens",
        "5",
        "--preview",
        "2",
        "--samples",
        "3",
        "--sample-mode",
        "n",
    )
    assert rc == 0, err[-2000:]
    first = doc["rows"][0]["request"]
    assert first["n"] == 3 and isinstance(first["seed"], int)


def test_preview_shows_a_failing_request_and_exits_1(sim, tmp_path):
    src = write_prompts(tmp_path / "in.jsonl", 3)
    rc, doc, err = cli(
        "-i", str(src), "-o", str(tmp_path / "out"), "--url", sim.url, "--max-tokens", "100000000", "--preview", "2"
    )
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
    rc, doc, err = cli(
        "-i",
        str(src),
        "-o",
        str(tmp_path / "out"),
        "--url",
        sim.url,
        "--max-tokens",
        "100000000",
        "--concurrency",
        "2",
        "--max-failure-rate",
        "0.5",
        "--fail-fast-after",
        "10",
    )
    assert rc == 1, err[-2000:]
    report = doc["report"] if "report" in doc else doc
    assert report["status"] == "failed_fast"
    assert 10 <= report["failed"] <= 10 + 2  # M answers, plus what was in flight when it stopped
    assert (
        "--max-failure-rate" in report["message"]
        and "maximum context length" in report["message"]
        and "--preview" in report["message"]
    )


def test_answers_cut_at_max_tokens_stop_the_job_with_a_hint(sim, tmp_path):
    src = write_prompts(tmp_path / "in.jsonl", 2000)
    rc, doc, err = cli(
        "-i",
        str(src),
        "-o",
        str(tmp_path / "out"),
        "--url",
        sim.url,
        "--max-tokens",
        "1",
        "--concurrency",
        "2",
        "--max-length-rate",
        "0.9",
        "--fail-fast-after",
        "10",
        "--shard-rows",
        "5",
    )
    assert rc == 1, err[-2000:]
    report = doc["report"] if "report" in doc else doc
    assert report["status"] == "failed_fast" and report["done"] <= 12
    assert "finish_reason=length" in report["message"] and "--max-tokens too small" in report["message"]


def test_a_healthy_job_with_fail_fast_set_completes(sim, tmp_path):
    src = write_prompts(tmp_path / "in.jsonl", 60)
    rc, doc, err = cli(
        "-i",
        str(src),
        "-o",
        str(tmp_path / "out"),
        "--url",
        sim.url,
        "--max-tokens",
        "8",
        "--max-failure-rate",
        "0.1",
        "--max-length-rate",
        "0.99",
        "--fail-fast-after",
        "10",
    )
    assert rc == 0, err[-2000:]
    report = doc["report"] if "report" in doc else doc
    assert report["status"] == "complete" and report["committed"] == 60


def test_a_fail_fast_share_out_of_range_is_a_usage_error(tmp_path):
    src = write_prompts(tmp_path / "in.jsonl", 3)
    rc, doc, err = cli(
        "-i", str(src), "-o", str(tmp_path / "out"), "--url", "http://127.0.0.1:9", "--max-failure-rate", "1.5"
    )
    assert rc == 3 and "--max-failure-rate" in json.dumps(doc) + err
    assert not (tmp_path / "out").exists()


# ---- --samples -----------------------------------------------------------------------------------


def sample_rows(out: Path) -> list[tuple[str, int, str, str]]:
    return sorted(
        (r["id"], r["sample"], r["text"], r["finish_reason"])
        for r in rows_of(out, ["id", "sample", "text", "finish_reason"])
    )


@pytest.mark.parametrize("mode", ["n", "requests"])
def test_samples_give_one_row_per_id_and_sample_with_seeds_from_the_id(sim, tmp_path, mode):
    src = write_prompts(tmp_path / "in.jsonl", 30)
    out = tmp_path / "out"
    rc, doc, err = cli(
        "-i", str(src), "-o", str(out), "--url", sim.url, "--max-tokens", "12", "--samples", "4", "--sample-mode", mode
    )
    assert rc == 0, err[-2000:]
    report = doc.get("report", doc)
    assert report["status"] == "complete" and report["committed"] == 30 and report["remaining"] == 0
    rows = sample_rows(out)
    assert sorted((i, k) for i, k, _, _ in rows) == sorted((f"p{i}", k) for i in range(30) for k in range(4))
    texts = {}
    for i, _k, text, _ in rows:
        texts.setdefault(i, set()).add(text)
    assert sum(len(t) > 1 for t in texts.values()) >= 25  # the samples of an id differ (their seeds do)
    ledger = [json.loads(p.read_text()) for p in (out / "ledger").glob("*.json")]
    assert sorted(i for e in ledger for i in e["ids"]) == sorted(
        f"p{i}" for i in range(30)
    )  # the ledger lists ids once


def test_n_k_in_one_request_and_k_requests_give_the_same_rows(sim, tmp_path):
    src = write_prompts(tmp_path / "in.jsonl", 20)
    got = {}
    for mode in ("n", "requests"):
        out = tmp_path / f"out-{mode}"
        rc, _, err = cli(
            "-i",
            str(src),
            "-o",
            str(out),
            "--url",
            sim.url,
            "--max-tokens",
            "12",
            "--samples",
            "3",
            "--sample-mode",
            mode,
        )
        assert rc == 0, err[-2000:]
        got[mode] = sample_rows(out)
    assert got["n"] == got["requests"] and len(got["n"]) == 60


@pytest.fixture(scope="module")
def slow_sim(tmp_path_factory: pytest.TempPathFactory):
    log = tmp_path_factory.mktemp("slow") / "sim.log"
    proc = (
        SimProcess(
            "--load-time",
            "0",
            "--decode-ms",
            "2",
            "--decode-ms-per-running",
            "0",
            "--prefill-ms-per-1k-tokens",
            "0",
            "--max-running",
            "8",
            log_path=log,
        )
        .start()
        .wait_ready()
    )
    yield proc
    proc.stop()


@pytest.mark.parametrize("mode", ["requests", "n"])
def test_samples_exactly_once_through_sigkill_and_resume(slow_sim, tmp_path, mode):
    import signal

    from conftest import wait_until

    n, k = 150, 4
    src = write_prompts(tmp_path / "in.jsonl", n)
    out = tmp_path / "out"
    argv = [
        PYTHON,
        "-m",
        "servefleet.cli.main",
        "generate",
        "-i",
        str(src),
        "-o",
        str(out),
        "--url",
        slow_sim.url,
        "--max-tokens",
        "6",
        "--samples",
        str(k),
        "--sample-mode",
        mode,
        "--shard-rows",
        "10",
        "--shard-seconds",
        "0.2",
        "--json",
    ]
    kills = 0

    def shards() -> int:
        return len(list((out / "shards").glob("*.parquet"))) if (out / "shards").exists() else 0

    for goal in (2, 5):
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(
            lambda proc=proc, goal=goal: shards() >= goal or proc.poll() is not None, timeout=60, what=f"{goal} shards"
        )
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            kills += 1
        proc.wait(timeout=30)
        pairs = [(i, s) for i, s, _, _ in sample_rows(out)]
        assert len(pairs) == len(set(pairs)), "a killed run left an (id, sample) committed twice"
        ids = {i for i, _ in pairs}
        assert len(pairs) == k * len(ids), "a committed id without all its samples"
    assert kills >= 1
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    report = json.loads(proc.stdout)
    report = report.get("report", report)
    assert proc.returncode == 0 and report["status"] == "complete" and report["resumed"], proc.stderr[-2000:]
    assert report["done_before"] + report["committed"] == n
    resumed = sample_rows(out)
    assert sorted((i, s) for i, s, _, _ in resumed) == sorted((f"p{i}", s) for i in range(n) for s in range(k))
    # the samples asked again after the kills are the ones an uninterrupted run gives (seeds from (id, k))
    clean = tmp_path / "clean"
    argv[argv.index(str(out))] = str(clean)
    assert subprocess.run(argv, capture_output=True, timeout=120).returncode == 0
    assert sample_rows(clean) == resumed


# ---- bad input: refused before the job starts (exit 3), nothing committed touched ----------------


@pytest.fixture
def committed_job(sim, tmp_path) -> tuple[Path, Path, dict[str, str]]:
    src = write_prompts(tmp_path / "in.jsonl", 6)
    out = tmp_path / "out"
    rc, _, err = cli("-i", str(src), "-o", str(out), "--url", sim.url, "--max-tokens", "3")
    assert rc == 0, err[-2000:]
    return src, out, tree_digest(out)


def test_samples_0_is_refused_with_exit_3(sim, committed_job):
    src, out, before = committed_job
    rc, doc, err = cli(
        "-i", str(src), "-o", str(out), "--url", sim.url, "--max-tokens", "3", "--samples", "0", "--force"
    )
    assert rc == 3 and "--samples 0" in json.dumps(doc) + err
    assert tree_digest(out) == before


def test_a_record_with_its_own_n_beside_samples_refuses_the_job(sim, committed_job, tmp_path):
    src, out, before = committed_job
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        "".join(
            json.dumps({"id": f"p{i}", "prompt": f"prompt {i}", **({"n": 2} if i == 3 else {})}) + "\n"
            for i in range(6)
        )
    )
    for dest in (out, tmp_path / "fresh"):
        rc, doc, err = cli(
            "-i", str(bad), "-o", str(dest), "--url", sim.url, "--max-tokens", "3", "--samples", "2", "--force"
        )
        text = json.dumps(doc) + err
        assert rc == 3 and "--samples 2" in text and "own 'n'" in text and "lines 4" in text, text[-2000:]
    assert tree_digest(out) == before
    assert not (tmp_path / "fresh" / "job.json").exists() and not (tmp_path / "fresh" / "shards").exists()


# ---- provenance ----------------------------------------------------------------------------------


def test_provenance_of_a_job_resumed_on_another_fleet_shows_both(slow_sim, tmp_path):
    import signal

    from conftest import wait_until

    model = tmp_path / "models" / "snapshots" / "0123abcd"
    model.mkdir(parents=True)
    (model / "config.json").write_text('{"hidden_size": 64}')
    other = SimProcess(
        "--load-time",
        "0",
        "--decode-ms",
        "0",
        "--decode-ms-per-running",
        "0",
        "--prefill-ms-per-1k-tokens",
        "0",
        "--style",
        "vllm",
        "--engine-version",
        "0.99.1-sim",
        "--model",
        str(model),
        "--served-model-name",
        "tiny-b",
        log_path=tmp_path / "b.log",
    ).start()
    src = write_prompts(tmp_path / "in.jsonl", 300)
    out = tmp_path / "out"
    argv = [
        PYTHON,
        "-m",
        "servefleet.cli.main",
        "generate",
        "-i",
        str(src),
        "-o",
        str(out),
        "--max-tokens",
        "6",
        "--shard-rows",
        "10",
        "--json",
    ]
    proc = subprocess.Popen([*argv, "--url", slow_sim.url], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_until(
        lambda: (out / "shards").exists() and any((out / "shards").glob("*.parquet")) or proc.poll() is not None,
        timeout=60,
        what="a shard",
    )
    assert proc.poll() is None, "the first run ended before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    other.wait_ready()
    try:
        done = subprocess.run([*argv, "--url", other.url], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
    finally:
        other.stop()
    runs = json.loads((out / "job.json").read_text())["runs"]
    assert [r["status"] for r in runs] == ["killed", "complete"]
    first, second = (r["provenance"] for r in runs)
    assert first["servefleet"] and second["servefleet"] and first["coordinator"]
    a, b = first["servers"][0], second["servers"][0]
    assert a["base_url"] == slow_sim.url and b["base_url"] == other.url
    assert (
        b["engine"] == "vllm"
        and b["engine_version"] == "0.99.1-sim"
        and b["model_path"] == str(model)
        and b["host"] == "127.0.0.1"
    )
    assert b["model_revision"] == "0123abcd" and b["model_content_hash"].startswith("sha256:")
    assert a["engine_version"] != b["engine_version"] and a["model_path"] != b["model_path"]
    shown = subprocess.run(
        [PYTHON, "-m", "servefleet.cli.main", "report", str(out), "--json"], capture_output=True, text=True, timeout=60
    )
    assert shown.returncode == 0, shown.stderr[-2000:]
    summary = json.loads(shown.stdout)
    summary = summary.get("summary", summary)
    assert [p["servers"][0]["engine_version"] for p in summary["provenance"]] == [a["engine_version"], "0.99.1-sim"]
    html = (out / "report.html").read_text()
    assert "0.99.1-sim" in html and "0123abcd" in html and a["engine_version"] in html


def test_a_fleet_servers_provenance_has_its_launch_engine_args_gpus_and_host():
    import asyncio
    from types import SimpleNamespace

    from servefleet.capacity import Capacity
    from servefleet.generate.endpoints import targets_from_fleet

    spec = SimpleNamespace(
        engine="vllm", model="/models/tiny", host="gpu1", gpus=(0, 1), args=("--max-num-seqs", "64")
    )
    fleet = SimpleNamespace(
        spec=SimpleNamespace(server=lambda name: spec),
        ready_endpoints=lambda: _done(
            [
                SimpleNamespace(
                    name="a",
                    base_url="http://127.0.0.1:1",
                    served_model="tiny",
                    capacity=Capacity(max_running_requests=64),  # what Endpoint.capacity is
                    engine="vllm",
                )
            ]
        ),
        record=lambda name: _done(
            SimpleNamespace(argv=["vllm", "serve", "/models/tiny", "--max-num-seqs", "64", "--api-key", "***"])
        ),
    )
    (target,) = asyncio.run(targets_from_fleet(fleet))
    assert target.launch == {
        "engine": "vllm",
        "model": "/models/tiny",
        "host": "gpu1",
        "gpus": [0, 1],
        "argv": ["vllm", "serve", "/models/tiny", "--max-num-seqs", "64", "--api-key", "***"],
    }

    from servefleet.generate.client import Client
    from servefleet.generate.provenance import collect

    async def run():
        async with Client(
            connect_timeout_s=1
        ) as client:  # nothing listens there: what the launch says is what is known
            return await collect([target], client)

    (server,) = asyncio.run(run())["servers"]
    assert (server["engine"], server["host"], server["gpu_count"], server["model_path"]) == (
        "vllm",
        "gpu1",
        2,
        "/models/tiny",
    )
    assert server["launch_args"][-1] == "***" and server["engine_version"] is None


async def _done(value):
    return value


# ---- several models ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def two_models(tmp_path_factory: pytest.TempPathFactory):
    d = tmp_path_factory.mktemp("models")
    a = SimProcess(
        *INSTANT_SIM, "--style", "vllm", "--model", "tiny-a", "--max-running", "8", log_path=d / "a.log"
    ).start()
    b = SimProcess(
        *INSTANT_SIM,
        "--style",
        "vllm",
        "--model",
        "tiny-b",
        "--lora-adapters",
        "b-lora",
        "--max-running",
        "8",
        log_path=d / "b.log",
    ).start()
    yield a.wait_ready(), b.wait_ready()
    a.stop()
    b.stop()


def test_a_two_model_fleet_routes_each_record_by_its_own_model_lora_adapters_included(two_models, tmp_path):
    a, b = two_models
    names = ["tiny-a", "tiny-b", "b-lora"]
    src = tmp_path / "in.jsonl"
    src.write_text(
        "".join(json.dumps({"id": f"p{i}", "prompt": f"prompt {i}", "model": names[i % 3]}) + "\n" for i in range(60))
    )
    out = tmp_path / "out"
    rc, doc, err = cli("-i", str(src), "-o", str(out), "--url", a.url, "--url", b.url, "--max-tokens", "5")
    assert rc == 0, err[-2000:]
    rows = {r["id"]: r for r in rows_of(out, ["id", "model", "server"])}
    assert len(rows) == 60
    for i in range(60):
        r = rows[f"p{i}"]
        assert r["model"] == names[i % 3] and r["server"] == ("url1" if i % 3 == 0 else "url2"), r


def test_models_flag_gives_one_row_per_id_and_model(two_models, tmp_path):
    a, b = two_models
    src = write_prompts(tmp_path / "in.jsonl", 25)
    out = tmp_path / "out"
    rc, doc, err = cli(
        "-i",
        str(src),
        "-o",
        str(out),
        "--url",
        a.url,
        "--url",
        b.url,
        "--max-tokens",
        "5",
        "--models",
        "tiny-a,b-lora",
        "--samples",
        "2",
    )
    assert rc == 0, err[-2000:]
    report = doc.get("report", doc)
    assert report["committed"] == 25 and report["status"] == "complete"
    got = sorted((r["id"], r["model"], r["sample"]) for r in rows_of(out, ["id", "model", "sample"]))
    assert got == sorted((f"p{i}", m, k) for i in range(25) for m in ("tiny-a", "b-lora") for k in range(2))


def test_a_record_whose_model_no_server_serves_is_refused_before_anything_is_sent(two_models, tmp_path):
    a, b = two_models
    src = tmp_path / "in.jsonl"
    src.write_text(
        "".join(
            json.dumps({"id": f"p{i}", "prompt": f"prompt {i}", "model": "tiny-a" if i != 7 else "tiny-c"}) + "\n"
            for i in range(20)
        )
    )
    out = tmp_path / "out"
    rc, doc, err = cli("-i", str(src), "-o", str(out), "--url", a.url, "--url", b.url, "--max-tokens", "5")
    text = json.dumps(doc) + err
    assert rc == 3 and "'tiny-c' (1 records)" in text and "b-lora, tiny-a, tiny-b" in text, text[-2000:]
    assert not (out / "shards").exists()
    rc, doc, err = cli(
        "-i", str(src), "-o", str(tmp_path / "out2"), "--url", a.url, "--url", b.url, "--models", "tiny-a,tiny-c"
    )
    assert rc == 3 and "--models: no server of the fleet serves tiny-c" in json.dumps(doc) + err


# ---- logprobs ------------------------------------------------------------------------------------


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_logprob_columns_round_trip_through_pyarrow(sim, tmp_path, endpoint):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from servefleet.sim.tokens import token_ids

    src = write_prompts(tmp_path / "in.jsonl", 12)
    out = tmp_path / "out"
    rc, doc, err = cli(
        "-i",
        str(src),
        "-o",
        str(out),
        "--url",
        sim.url,
        "--max-tokens",
        "9",
        "--logprobs",
        "3",
        "--chat" if endpoint == "chat" else "--completions",
    )
    assert rc == 0, err[-2000:]
    (shard,) = sorted((out / "shards").glob("*.parquet"))
    table = pq.read_table(shard)
    schema = table.schema
    assert schema.field("logprobs").type == pa.list_(pa.float32()) and schema.field(
        "logprob_token_ids"
    ).type == pa.list_(pa.int32())
    assert schema.field("top_logprobs").type == pa.list_(pa.list_(pa.float32(), 3))
    assert schema.field("top_token_ids").type == pa.list_(pa.list_(pa.int32(), 3))
    for r in table.to_pylist():
        n = r["completion_tokens"]
        assert len(r["logprobs"]) == n and len(r["top_logprobs"]) == n and all(len(t) == 3 for t in r["top_token_ids"])
        assert r["logprob_token_ids"] == token_ids(r["text"])  # the tokens the sim generated, as ids
        assert [t[0] for t in r["top_token_ids"]] == r["logprob_token_ids"]  # the chosen token is the best alternative
        assert all(abs(t[0] - lp) < 1e-6 for t, lp in zip(r["top_logprobs"], r["logprobs"], strict=True))


def test_logprobs_asked_of_a_server_that_cannot_give_them_refuse_the_job(sim, tmp_path):
    plain = SimProcess(*INSTANT_SIM, "--no-logprobs", log_path=tmp_path / "plain.log").start().wait_ready()
    try:
        src = write_prompts(tmp_path / "in.jsonl", 5)
        out = tmp_path / "out"
        rc, _, err = cli("-i", str(src), "-o", str(out), "--url", sim.url, "--max-tokens", "3", "--logprobs", "2")
        assert rc == 0, err[-2000:]
        committed = {k: v for k, v in tree_digest(out).items() if k.startswith(("shards", "ledger"))}
        more = write_prompts(tmp_path / "more.jsonl", 10)  # 5 more to send
        rc, doc, err = cli(
            "-i",
            str(more),
            "-o",
            str(out),
            "--url",
            sim.url,
            "--url",
            plain.url,
            "--max-tokens",
            "3",
            "--logprobs",
            "2",
            "--force",
        )
        text = json.dumps(doc) + err
        assert rc == 3 and "--logprobs 2: url2 answered a request asking for logprobs without them" in text, text[
            -2000:
        ]
        assert {k: v for k, v in tree_digest(out).items() if k.startswith(("shards", "ledger"))} == committed
    finally:
        plain.stop()


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_prompt_logprob_columns_round_trip_through_pyarrow(sim, tmp_path, endpoint):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from servefleet.sim.tokens import token_ids

    src = write_prompts(tmp_path / "in.jsonl", 8)
    out = tmp_path / "out"
    rc, doc, err = cli(
        "-i",
        str(src),
        "-o",
        str(out),
        "--url",
        sim.url,
        "--max-tokens",
        "4",
        "--prompt-logprobs",
        "2",
        "--chat" if endpoint == "chat" else "--completions",
    )
    assert rc == 0, err[-2000:]
    (shard,) = sorted((out / "shards").glob("*.parquet"))
    table = pq.read_table(shard)
    schema = table.schema
    assert schema.field("prompt_logprobs").type == pa.list_(pa.float32())
    assert schema.field("prompt_logprob_token_ids").type == pa.list_(pa.int32())
    assert schema.field("prompt_top_logprobs").type == pa.list_(pa.list_(pa.float32(), 2))
    assert schema.field("prompt_top_token_ids").type == pa.list_(pa.list_(pa.int32(), 2))
    assert "logprobs" not in schema.names  # answer logprobs only with --logprobs
    rows = table.to_pylist()
    assert len(rows) == 8
    for r in rows:
        n = r["prompt_tokens"] - 1  # the first prompt token has none
        assert (
            n > 0
            and len(r["prompt_logprobs"]) == n
            and len(r["prompt_top_logprobs"]) == n
            and len(r["prompt_top_token_ids"]) == n
        )
        if endpoint == "completions":
            assert r["prompt_logprob_token_ids"] == token_ids(f"prompt {r['id'][1:]}")[1:]
        for tid, lp, tops, top_ids in zip(
            r["prompt_logprob_token_ids"],
            r["prompt_logprobs"],
            r["prompt_top_logprobs"],
            r["prompt_top_token_ids"],
            strict=True,
        ):
            assert tops[0] >= tops[1] and lp <= tops[0]
            if tid in top_ids:  # the prompt token among the top 2: the same logprob there
                assert abs(tops[top_ids.index(tid)] - lp) < 1e-6


def test_prompt_logprobs_keep_the_prompt_token_apart_from_the_top_k():
    from servefleet.generate.prompt_logprobs import parse_prompt_logprobs

    raw = [
        None,
        {"9": {"logprob": -3.0, "rank": 4}, "5": {"logprob": -0.1, "rank": 1}, "6": {"logprob": -0.5, "rank": 2}},
        {"7": {"logprob": -0.2, "rank": 1}},
    ]
    got = parse_prompt_logprobs(raw, 2)
    assert got.token_ids == [9, 7] and got.logprobs == [-3.0, -0.2]
    assert (
        got.top_token_ids == [[5, 6], [7, -1]]
        and got.top_logprobs[0] == [-0.1, -0.5]
        and got.top_logprobs[1][1] != got.top_logprobs[1][1]
    )
    # the answer's prompt_token_ids name the prompt token where it is given
    assert (
        parse_prompt_logprobs(raw, 2, [1, 6, 7]).token_ids == [6, 7]
        and parse_prompt_logprobs(raw, 2, [1, 6, 7]).logprobs[0] == -0.5
    )
    assert parse_prompt_logprobs(None, 2) is None


def test_prompt_logprobs_asked_of_a_server_that_cannot_give_them_refuse_the_job(tmp_path):
    plain = SimProcess(*INSTANT_SIM, "--no-logprobs", log_path=tmp_path / "plain.log").start().wait_ready()
    try:
        src = write_prompts(tmp_path / "in.jsonl", 5)
        out = tmp_path / "out"
        rc, _, err = cli("-i", str(src), "-o", str(out), "--url", plain.url, "--max-tokens", "3")
        assert rc == 0, err[-2000:]
        committed = {k: v for k, v in tree_digest(out).items() if k.startswith(("shards", "ledger"))}
        more = write_prompts(tmp_path / "more.jsonl", 10)
        rc, doc, err = cli(
            "-i",
            str(more),
            "-o",
            str(out),
            "--url",
            plain.url,
            "--max-tokens",
            "3",
            "--prompt-logprobs",
            "2",
            "--force",
        )
        text = json.dumps(doc) + err
        assert (
            rc == 3 and "--prompt-logprobs 2: url answered a request asking for prompt logprobs without them" in text
        ), text[-2000:]
        assert {k: v for k, v in tree_digest(out).items() if k.startswith(("shards", "ledger"))} == committed
    finally:
        plain.stop()


@pytest.mark.parametrize("k", ["21", "-1"])
def test_prompt_logprobs_out_of_range_is_a_usage_error(tmp_path, k):
    src = write_prompts(tmp_path / "in.jsonl", 3)
    rc, doc, err = cli(
        "-i", str(src), "-o", str(tmp_path / "out"), "--url", "http://127.0.0.1:9", "--prompt-logprobs", k
    )
    assert rc == 3 and f"--prompt-logprobs {k}" in json.dumps(doc) + err


def test_logprobs_out_of_range_is_a_usage_error(tmp_path):
    src = write_prompts(tmp_path / "in.jsonl", 3)
    rc, doc, err = cli("-i", str(src), "-o", str(tmp_path / "out"), "--url", "http://127.0.0.1:9", "--logprobs", "21")
    assert rc == 3 and "--logprobs 21" in json.dumps(doc) + err


# ---- units: the pieces the CLI tests above rely on -----------------------------------------------


def test_an_answer_to_n_k_keeps_its_choices_in_index_order_and_a_short_one_is_asked_again():
    from servefleet.generate.client import _parse
    from servefleet.generate.inputs import PromptRecord
    from servefleet.generate.rows import short_of_choices

    body = {
        "model": "m",
        "usage": {"prompt_tokens": 3, "completion_tokens": 9},
        "choices": [{"index": i, "text": f"t{i}", "finish_reason": "stop"} for i in (2, 0, 1)],
    }
    c = _parse(json.dumps(body).encode(), "completions")
    assert [ch.text for ch in c.choices] == ["t0", "t1", "t2"] and c.completion_tokens == 9
    record = PromptRecord(1, "a", "completions", {"prompt": "x"}, sample=0, choices=4)
    failure = short_of_choices(record, c)
    assert failure is not None and failure.retryable and "asked n=4, the answer has 3 choices" in failure.describe()
    assert short_of_choices(PromptRecord(1, "a", "completions", {"prompt": "x"}, sample=0, choices=3), c) is None


def test_fail_fast_waits_for_m_answers_then_judges_a_rolling_window():
    from types import SimpleNamespace

    from servefleet.generate.failfast import FailFast, FailFastPolicy

    ok = SimpleNamespace(id="a", finish_reason="stop", completion_tokens=3, text="x")
    watch = FailFast(FailFastPolicy(max_failure_rate=0.5, first=4, window=6))
    for _ in range(3):
        watch.gave_up("a", "boom")
    assert not watch.tripped.is_set()  # 3 of 3 failed, but fewer than M answers: no verdict yet
    watch.answered(ok)
    assert (
        watch.tripped.is_set() and "3 of the last 4 answers failed" in watch.message() and "a: boom" in watch.message()
    )

    watch = FailFast(FailFastPolicy(max_failure_rate=0.5, first=4, window=6))
    for outcome in ["fail", "fail", "ok", "ok", *["ok"] * 6, "fail", "fail", "fail"]:
        watch.gave_up("a", "boom") if outcome == "fail" else watch.answered(ok)
    assert not watch.tripped.is_set()  # the last 6: 3 failed, not more than half
    watch.gave_up("a", "boom")
    assert watch.tripped.is_set()  # the last 6: 4 failed (of all 14 answers only 6: the early ones left the window)


def test_rows_of_an_id_are_listed_once_in_the_ledger():
    from servefleet.generate.shards import unique_pairs

    assert unique_pairs(["a", "a", "b", "a"], [1, 1, 2, 1]) == (["a", "b"], [1, 2])
    assert unique_pairs(["a", "b"], [1, 2]) == (["a", "b"], [1, 2])


def test_the_fast_logprobs_path_agrees_with_the_general_one_and_falls_back_for_token_strings():
    from servefleet.generate.logprobs import parse_logprobs, parse_logprobs_general

    raw = {
        "tokens": ["token_id:5", "token_id:7"],
        "token_logprobs": [-0.5, -1.0],
        "top_logprobs": [{"token_id:9": -2.0, "token_id:5": -0.5}, {"token_id:7": -1.0}],
    }
    fast = parse_logprobs(raw, 2)
    assert fast == parse_logprobs_general(raw, 2)
    assert fast.token_ids == [5, 7] and fast.top_token_ids == [[5, 9], [7, -1]] and fast.top_logprobs[1][0] == -1.0
    words = {"tokens": [" a", " b"], "token_logprobs": [-0.5, None], "top_logprobs": [{" a": -0.5}, {" b": -1.0}]}
    parsed = parse_logprobs(words, 1)
    assert parsed.token_ids is None and parsed.logprobs[0] == -0.5 and parsed.logprobs[1] != parsed.logprobs[1]  # NaN
