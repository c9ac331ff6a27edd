"""generate's output storage: damaged shards found and quarantined on resume, ids committed twice
detected, killed runs marked ended, and one run at a time on object storage."""

from __future__ import annotations

import os
from pathlib import Path

from servefleet.generate.job import InputInfo, JobManifest, JobParams, RunRecord
from servefleet.generate.ledger import LEDGER_DIR, QUARANTINE_DIR, SHARDS_DIR, Ledger
from servefleet.generate.shards import OutputRow, ShardBuffer, ShardLimits, shard_schema
from servefleet.generate.sinks import LocalSink

RUN_A = "20260101T000000-abcd"
RUN_B = "20260101T000001-abcd"


def buffer_of(ids: list[str], start_line: int = 1) -> ShardBuffer:
    buf = ShardBuffer(shard_schema(False, False), ShardLimits(rows=1000))
    for k, i in enumerate(ids):
        buf.add(OutputRow(i, start_line + k, f"text {i}", "length", 3, 5, "m", "s0", 1, 0.1))
    return buf


def manifest_of(*runs: str) -> JobManifest:
    m = JobManifest(
        input=InputInfo(
            path="x", kind="jsonl", size=1, mtime_ns=1, sha256="sha", lines=9, valid=9, rejected=0, duplicates=0
        ),
        params=JobParams(),
    )
    m.runs.extend(RunRecord(run_id=r, input_sha256="sha") for r in runs)
    return m


def truncate(path: Path, keep: int) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:keep])


def test_a_truncated_shard_with_a_ledger_entry_is_quarantined_and_its_ids_are_not_done(tmp_path):
    sink = LocalSink(str(tmp_path / "out"))
    ledger = Ledger(sink, "parquet", RUN_A, "sha")
    bad = ledger.commit(buffer_of(["a", "b", "c"], 1))
    ledger.commit(buffer_of(["d"], 4))
    truncate(tmp_path / "out" / SHARDS_DIR / bad.shard, 100)
    done = Ledger(sink, "parquet", RUN_B, "sha").scan(manifest_of(RUN_A))
    assert (done.rows, done.shards) == (1, 1)
    assert sorted(done.lines.tolist()) == [4]  # lines 1-3 are asked again
    assert len(done.quarantined) == 1 and bad.shard in done.quarantined[0] and "3 ids" in done.quarantined[0]
    assert (tmp_path / "out" / QUARANTINE_DIR / bad.shard).is_file()
    assert not (tmp_path / "out" / SHARDS_DIR / bad.shard).exists()
    assert not (tmp_path / "out" / LEDGER_DIR / (bad.shard.rsplit(".", 1)[0] + ".json")).exists()
    # the next scan finds a clean ledger
    again = Ledger(sink, "parquet", RUN_B, "sha").scan(manifest_of(RUN_A))
    assert (again.rows, again.quarantined) == (1, [])


def test_a_damaged_shard_without_a_ledger_entry_is_quarantined_instead_of_crashing_the_scan(tmp_path):
    sink = LocalSink(str(tmp_path / "out"))
    ledger = Ledger(sink, "parquet", RUN_A, "sha")
    bad = ledger.commit(buffer_of(["a", "b"], 1))
    ledger.commit(buffer_of(["c"], 3))
    os.remove(tmp_path / "out" / LEDGER_DIR / (bad.shard.rsplit(".", 1)[0] + ".json"))
    truncate(tmp_path / "out" / SHARDS_DIR / bad.shard, 50)
    done = Ledger(sink, "parquet", RUN_B, "sha").scan(manifest_of(RUN_A))
    assert (done.rows, done.rebuilt) == (1, 0)
    assert len(done.quarantined) == 1 and bad.shard in done.quarantined[0] and "unreadable" in done.quarantined[0]
    assert (tmp_path / "out" / QUARANTINE_DIR / bad.shard).is_file()


def test_ids_committed_twice_are_counted(tmp_path):
    sink = LocalSink(str(tmp_path / "out"))
    Ledger(sink, "parquet", RUN_A, "sha").commit(buffer_of(["a", "b", "c"], 1))
    Ledger(sink, "parquet", RUN_B, "sha").commit(buffer_of(["b", "c"], 2))  # a second writer at the same time
    done = Ledger(sink, "parquet", "20260101T000002-abcd", "sha").scan(manifest_of(RUN_A, RUN_B))
    assert (done.rows, done.duplicates) == (5, 2)


def test_plan_check_on_a_damaged_shard_names_the_shard_not_gpus(tmp_path):
    import json

    from servefleet.cli.main import app
    from test_plan_check import bench_run, make_job_dir, runner

    job = make_job_dir(tmp_path / "out", valid=100, runs=[(0.0, 50.0, "complete")], rows={"a": [10] * 100})
    shard = next((job / SHARDS_DIR).iterdir())
    truncate(shard, 60)
    run = bench_run(tmp_path / "run.json", [(1, 40.0), (4, 100.0)], cap=4)
    res = runner.invoke(app, ["plan", "--check", str(job), "--bench", str(run), "--json"])
    assert res.exit_code == 3, res.output
    message = json.loads(res.stdout)["error"] if res.stdout.strip().startswith("{") else res.output
    assert "--gpus" not in res.output and shard.name in str(message) and "damaged" in str(message)


# ---- what progress and report say --------------------------------------------------------------------


def test_a_killed_run_shows_what_is_committed_and_is_stale_not_running():
    from servefleet.generate.job_record import JobRecord, progress_of

    manifest = {
        "input": {"valid": 3000, "rejected": 0},
        "runs": [{"run_id": "r1", "status": "running", "finished": None}],
    }
    # answered 1,210, of which 1,000 are in committed shards when SIGKILL came
    snap = {
        "run_id": "r1",
        "status": "running",
        "updated_unix": 0.0,
        "interval_s": 2.0,
        "done": 1210,
        "done_before": 0,
        "done_this_run": 1210,
        "committed_this_run": 1000,
        "servers": [],
    }
    live = progress_of(JobRecord("dest", manifest, progress=snap), now=1.0)
    assert (live["state"], live["done"], live["committed"]) == ("running", 1210, 1000)
    view = progress_of(JobRecord("dest", manifest, progress=snap), now=1e6)
    assert (view["state"], view["status"]) == ("stale", "stale")
    assert (view["done"], view["committed"], view["remaining"]) == (1000, 1000, 2000)


async def test_the_next_run_marks_a_run_that_never_finished_as_killed(tmp_path):
    from servefleet.generate.job import JOB_FILE
    from servefleet.generate.runner import _record_run

    sink = LocalSink(str(tmp_path / "out"))
    manifest = manifest_of(RUN_A)  # RUN_A: "running", never finished (SIGKILL)
    await _record_run(sink, manifest, manifest.input, manifest.params)
    written = JobManifest.from_bytes((tmp_path / "out" / JOB_FILE).read_bytes())
    assert [(r.run_id == RUN_A, r.status) for r in written.runs] == [(True, "killed"), (False, "running")]


def test_progress_of_a_finished_job_whose_shard_was_truncated_says_damaged_not_complete(tmp_path):
    from servefleet.generate.job import JOB_FILE
    from servefleet.generate.job_record import progress_of, read_job

    out = tmp_path / "out"
    sink = LocalSink(str(out))
    entry = Ledger(sink, "parquet", RUN_A, "sha").commit(buffer_of(["a", "b", "c"], 1))
    manifest = manifest_of(RUN_A)
    manifest.runs[0].status, manifest.runs[0].finished = "complete", "2026-01-01T00:00:10.000000Z"
    manifest.shards, manifest.rows, manifest.shard_bytes = 1, 3, entry.bytes
    sink.write_bytes(JOB_FILE, manifest.to_bytes())
    assert progress_of(read_job(str(out)))["state"] == "complete"
    truncate(out / SHARDS_DIR / entry.shard, 100)
    view = progress_of(read_job(str(out)))
    assert view["state"] == "damaged" and "quarantine" in view["note"] and f"{entry.bytes:,}" in view["note"]


# ---- one run at a time on object storage (moto's S3 server on loopback: the real protocol) ---------------


def _s3_sink(moto_url: str, monkeypatch, **kw):
    import pytest

    from conftest import s3_env
    from servefleet.generate.sinks import FsspecSink

    for k, v in s3_env(moto_url).items():
        if k.startswith("AWS_"):
            monkeypatch.setenv(k, v)
    s3fs = pytest.importorskip("s3fs")
    s3fs.S3FileSystem.clear_instance_cache()  # fsspec caches filesystems by arguments: not by the endpoint in the environment
    return FsspecSink("s3://bucket/jobs/x", **kw)


def test_a_second_writer_on_s3_is_refused_naming_the_run_that_holds_the_lease(moto_url, monkeypatch):
    import pytest

    from conftest import s3fs_for
    from servefleet.generate.sinks import DestinationBusy

    fs = s3fs_for(moto_url)
    fs.call_s3("create_bucket", Bucket="bucket")
    first, second = _s3_sink(moto_url, monkeypatch), _s3_sink(moto_url, monkeypatch)
    with first.lock():
        first.claim(RUN_A)
        assert fs.exists("bucket/jobs/x/.lease.json")
        with (
            pytest.raises(
                DestinationBusy, match=f"another `servefleet generate` is writing to s3://bucket/jobs/x \\(run {RUN_A}"
            ),
            second.lock(),
        ):
            pass
        first.write_bytes("job.json", b"{}")  # the holder still writes
    assert not fs.exists("bucket/jobs/x/.lease.json")  # released at the end
    with second.lock():  # and free for the next run
        second.claim(RUN_B)


def test_an_expired_lease_is_taken_over_and_its_old_holder_stops_committing(moto_url, monkeypatch):
    import pytest

    from conftest import s3fs_for
    from servefleet.generate.sinks import DestinationBusy

    fs = s3fs_for(moto_url)
    fs.call_s3("create_bucket", Bucket="bucket")
    # the heartbeat is driven by hand here (renew), so nothing depends on timing
    stalled = _s3_sink(moto_url, monkeypatch, lease_heartbeat_s=3600)
    newcomer = _s3_sink(
        moto_url, monkeypatch, lease_heartbeat_s=3600, lease_expires_s=0
    )  # any lease counts as expired
    with stalled.lock():
        stalled.claim(RUN_A)
        with newcomer.lock():
            newcomer.claim(RUN_B)
            assert newcomer.lease is not None and RUN_A in (newcomer.lease.took_over or "")
            assert stalled.lease is not None
            stalled.lease.renew()  # its next heartbeat finds the lease taken
            staged = stalled.new_staging_file(".parquet")
            with pytest.raises(DestinationBusy, match=f"taken over by run {RUN_B}"):
                stalled.commit_file(staged, "shards/part-x.parquet")
            assert not fs.exists("bucket/jobs/x/shards/part-x.parquet")
        assert not fs.exists("bucket/jobs/x/.lease.json")
    # the old holder's release does not delete a lease that is not its own: here none is left to delete
    assert not fs.exists("bucket/jobs/x/.lease.json")


def test_two_generate_runs_on_one_s3_destination_the_second_exits_3_and_every_id_is_written_once(moto_url, tmp_path):
    import json
    import subprocess

    from conftest import PYTHON, SimProcess, s3_env, s3fs_for, wait_until
    from parquet_read import read_parquet

    n = 300
    sim = (
        SimProcess(
            "--load-time",
            "0",
            "--decode-ms",
            "5",
            "--decode-ms-per-running",
            "0",
            "--prefill-ms-per-1k-tokens",
            "0",
            "--max-running",
            "4",
            log_path=tmp_path / "sim.log",
        )
        .start()
        .wait_ready()
    )
    fs = s3fs_for(moto_url)
    fs.call_s3("create_bucket", Bucket="bucket")
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"id": f"p{i}", "prompt": f"prompt {i}"}) + "\n" for i in range(n)))
    argv = [
        PYTHON,
        "-m",
        "servefleet.cli.main",
        "generate",
        "-i",
        str(src),
        "-o",
        "s3://bucket/j",
        "--url",
        sim.url,
        "--max-tokens",
        "8",
        "--concurrency",
        "4",
        "--json",
    ]
    env = s3_env(moto_url)
    first = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:

        def sending() -> bool:
            data = fs.cat_file("bucket/j/progress.json") if fs.exists("bucket/j/progress.json") else b"{}"
            return json.loads(data).get("done", 0) > 0

        wait_until(sending, timeout=60, interval=0.1, what="the first run to send")
        run_id = json.loads(fs.cat_file("bucket/j/job.json"))["runs"][-1]["run_id"]
        second = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
        assert second.returncode == 3, second.stdout[-2000:] + second.stderr[-2000:]
        message = json.loads(second.stdout)["error"]["message"]
        assert "another `servefleet generate`" in message and run_id in message
        out, err = first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
        sim.stop()
    assert first.returncode == 0 and json.loads(out)["status"] == "complete", err[-3000:]
    ids: list[str] = []
    for path in sorted(fs.ls("bucket/j/shards", detail=False)):
        ids.extend(read_parquet(fs.cat_file(path), columns=["id"]).column("id").to_pylist())
    assert sorted(ids) == sorted(f"p{i}" for i in range(n))  # each once
    assert not fs.exists("bucket/j/.lease.json")
    runs = json.loads(fs.cat_file("bucket/j/job.json"))["runs"]
    assert [r["status"] for r in runs] == ["complete"]  # the refused run never touched the manifest


# ---- changed parameters under --force ---------------------------------------------------------------


def test_force_with_other_parameters_counts_the_ids_made_with_the_old_ones_and_reask_changed_asks_them_again(tmp_path):
    import json
    import subprocess

    from conftest import INSTANT_SIM, PYTHON, SimProcess

    n = 40
    sim = SimProcess(*INSTANT_SIM, log_path=tmp_path / "sim.log").start().wait_ready()
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"id": f"p{i}", "prompt": f"prompt {i}"}) + "\n" for i in range(n)))
    out = tmp_path / "out"

    def generate(*extra: str) -> dict:
        res = subprocess.run(
            [
                PYTHON,
                "-m",
                "servefleet.cli.main",
                "generate",
                "-i",
                str(src),
                "-o",
                str(out),
                "--url",
                sim.url,
                "--json",
                "--shard-rows",
                "10",
                *extra,
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
        return json.loads(res.stdout)

    try:
        first = generate("--max-tokens", "4")
        forced = generate("--max-tokens", "6", "--force")
        assert any(f"{n} committed ids were made with other parameters" in e for e in forced["events"]), forced[
            "events"
        ]
        assert forced["to_send"] == 0  # kept, as before, but said
        runs = json.loads((out / "job.json").read_text())["runs"]
        assert [r["params"]["max_tokens"] for r in runs] == [4, 6]  # each run's own parameters
        reasked = generate("--max-tokens", "6", "--force", "--reask-changed")
    finally:
        sim.stop()
    assert reasked["to_send"] == n and reasked["committed"] == n
    assert any("superseded/" in e for e in reasked["events"]), reasked["events"]
    kept = sorted(p.name for p in (out / "shards").iterdir())
    assert kept and all(reasked["run_id"] in name for name in kept)  # every shard now from the run with max_tokens 6
    moved = sorted(p.name for p in (out / "superseded").iterdir())
    assert moved and all(first["run_id"] in name for name in moved)


def test_progress_says_when_more_rows_are_committed_than_the_input_has_ids(tmp_path):
    from servefleet.generate.job import JOB_FILE
    from servefleet.generate.job_record import progress_of, read_job

    out = tmp_path / "out"
    sink = LocalSink(str(out))
    a = Ledger(sink, "parquet", RUN_A, "sha").commit(buffer_of([f"p{i}" for i in range(9)], 1))
    b = Ledger(sink, "parquet", RUN_B, "sha").commit(buffer_of([f"p{i}" for i in range(9)], 1))  # written twice
    manifest = manifest_of(RUN_A)  # valid: 9
    manifest.runs[0].status, manifest.runs[0].finished = "complete", "2026-01-01T00:00:10.000000Z"
    manifest.shards, manifest.rows, manifest.shard_bytes = 2, 18, a.bytes + b.bytes
    sink.write_bytes(JOB_FILE, manifest.to_bytes())
    view = progress_of(read_job(str(out)))
    assert view["state"] == "damaged" and "9 ids are committed more than once" in view["note"]


def test_resume_after_a_shard_was_truncated_quarantines_it_and_answers_every_id_once(tmp_path):
    import json
    import subprocess

    from conftest import PYTHON, SimProcess
    from parquet_read import read_parquet

    n = 30
    sim = (
        SimProcess(
            "--load-time",
            "0",
            "--decode-ms",
            "0",
            "--decode-ms-per-running",
            "0",
            "--prefill-ms-per-1k-tokens",
            "0",
            log_path=tmp_path / "sim.log",
        )
        .start()
        .wait_ready()
    )
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"id": f"p{i}", "prompt": f"prompt {i}"}) + "\n" for i in range(n)))
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
        sim.url,
        "--json",
        "--max-tokens",
        "4",
        "--shard-rows",
        "10",
    ]
    try:
        assert subprocess.run(argv, capture_output=True, timeout=120).returncode == 0
        bad = sorted((out / SHARDS_DIR).iterdir())[0]
        truncate(bad, bad.stat().st_size // 2)
        progress = subprocess.run(
            [PYTHON, "-m", "servefleet.cli.main", "progress", str(out), "--json"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert json.loads(progress.stdout)["state"] == "damaged"
        res = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    finally:
        sim.stop()
    report = json.loads(res.stdout)
    assert res.returncode == 0 and report["status"] == "complete", res.stderr[-2000:]
    assert report["to_send"] == 10 and any(bad.name in e and "quarantine/" in e for e in report["events"]), report[
        "events"
    ]
    ids = [
        i
        for p in sorted((out / SHARDS_DIR).iterdir())
        for i in read_parquet(p, columns=["id"]).column("id").to_pylist()
    ]
    assert sorted(ids) == sorted(f"p{i}" for i in range(n))
    assert (out / QUARANTINE_DIR / bad.name).is_file()


# ---- changed content under --force ------------------------------------------------------------------


def test_force_on_an_input_with_one_changed_prompt_names_that_id_and_reask_changed_answers_it_again_once(tmp_path):
    import json
    import subprocess

    import pyarrow.parquet as pq

    from conftest import PYTHON, SimProcess

    n = 30
    sim = (
        SimProcess(
            "--load-time",
            "0",
            "--decode-ms",
            "0",
            "--decode-ms-per-running",
            "0",
            "--prefill-ms-per-1k-tokens",
            "0",
            log_path=tmp_path / "sim.log",
        )
        .start()
        .wait_ready()
    )
    src = tmp_path / "in.jsonl"
    records = [{"id": f"p{i}", "prompt": f"prompt {i}"} for i in range(n)]
    src.write_text("".join(json.dumps(r) + "\n" for r in records))
    out = tmp_path / "out"

    def generate(*extra: str) -> dict:
        res = subprocess.run(
            [
                PYTHON,
                "-m",
                "servefleet.cli.main",
                "generate",
                "-i",
                str(src),
                "-o",
                str(out),
                "--url",
                sim.url,
                "--json",
                "--shard-rows",
                "10",
                "--max-tokens",
                "4",
                *extra,
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
        return json.loads(res.stdout)

    try:
        first = generate()
        records[7]["prompt"] = "prompt 7, now asked otherwise"
        src.write_text("".join(json.dumps(r) + "\n" for r in records))
        kept = generate("--force")
        assert any("1 committed ids now have different content" in e and "kept" in e for e in kept["events"]), kept[
            "events"
        ]
        assert kept["to_send"] == 0
        reasked = generate("--force", "--reask-changed")
    finally:
        sim.stop()
    assert any("1 committed ids now have different content" in e and "superseded/" in e for e in reasked["events"]), (
        reasked["events"]
    )
    assert 1 <= reasked["to_send"] <= 10  # the one shard that held p7, not the whole job
    rows = [(p.name, r["id"]) for p in sorted((out / "shards").iterdir()) for r in pq.read_table(p).to_pylist()]
    assert sorted(rid for _, rid in rows) == sorted(r["id"] for r in records)  # every id exactly once
    assert [reasked["run_id"] in name for name, rid in rows if rid == "p7"] == [True]  # re-made by the last run
    moved = list((out / "superseded").iterdir())
    assert len(moved) == 1 and first["run_id"] in moved[0].name


def test_ledger_entries_keep_row_digests_and_entries_written_before_digests_still_load_uncompared():
    import json

    import numpy as np

    from servefleet.generate.ledger import LedgerEntry

    digests = np.asarray([11, -22], dtype="<i8").tobytes()
    entry = LedgerEntry("part-x.parquet", "r", "sha", ["a", "b"], [1, 2], 5, 0, "t", digests)
    assert LedgerEntry.from_bytes(entry.to_bytes()).digests == digests
    legacy = {k: v for k, v in json.loads(entry.to_bytes()).items() if k != "digests"}
    assert LedgerEntry.from_bytes(json.dumps(legacy).encode()).digests is None
    misaligned = {**legacy, "digests": "AAAAAAAAAAA="}  # 8 bytes for 2 ids
    assert LedgerEntry.from_bytes(json.dumps(misaligned).encode()).digests is None
