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
    m = JobManifest(input=InputInfo(path="x", kind="jsonl", size=1, mtime_ns=1, sha256="sha", lines=9, valid=9, rejected=0,
                                    duplicates=0), params=JobParams())
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

    manifest = {"input": {"valid": 3000, "rejected": 0}, "runs": [{"run_id": "r1", "status": "running", "finished": None}]}
    # answered 1,210, of which 1,000 are in committed shards when SIGKILL came
    snap = {"run_id": "r1", "status": "running", "updated_unix": 0.0, "interval_s": 2.0, "done": 1210, "done_before": 0,
            "done_this_run": 1210, "committed_this_run": 1000, "servers": []}
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
