"""`servefleet plan --check JOB_DIR`: the planner's prediction against what `generate` measured.

Unit tests build destinations the way `generate` leaves them (its manifest model, its shard writer)
with known times and token counts, so the expected figures are computed by hand. One test runs the
real chain on a sim: bench -> generate -> plan --check."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import PYTHON, SimProcess, s3_env, s3fs_for
from servefleet.bench.result import BenchConfig, Environment, Point, Run, Stat, Target, save_run
from servefleet.capacity import Capacity
from servefleet.cli.main import app
from servefleet.errors import ConfigError
from servefleet.generate.job import InputInfo, JobManifest, JobParams, RunRecord
from servefleet.generate.shards import OutputRow, ShardBuffer, ShardLimits, shard_schema, write_shard
from servefleet.plan.check import check_plan, measure_job, pick_config
from servefleet.plan.planner import ConfigCurve, Curve, JobSpec, PointSample, simulate_makespan, steady_curve

runner = CliRunner()
T0 = dt.datetime(2026, 11, 30, 1, 0, 0, tzinfo=dt.UTC)


def _ts(seconds: float) -> str:
    return (T0 + dt.timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def make_job_dir(
    root: Path,
    *,
    valid: int,
    runs: list[tuple[float, float | None, str]],
    rows: dict[str, list[int]],
    model: str = "m",
    fmt: str = "parquet",
    ledger_commit_s: float | None = None,
) -> Path:
    """A destination as generate leaves it: job.json with runs (start s, end s or None, status),
    one shard per server with rows of the given completion tokens."""
    root.mkdir(parents=True, exist_ok=True)
    run_ids = [f"20261130T0100{i:02d}-abc{i}" for i in range(len(runs))]
    info = InputInfo(
        path="in.jsonl",
        kind="jsonl",
        size=1,
        mtime_ns=1,
        sha256="0" * 64,
        lines=valid,
        valid=valid,
        rejected=0,
        duplicates=0,
    )
    records = [
        RunRecord(
            run_id=rid, started=_ts(s), finished=_ts(e) if e is not None else None, status=st, input_sha256="0" * 64
        )
        for rid, (s, e, st) in zip(run_ids, runs, strict=True)
    ]
    manifest = JobManifest(input=info, params=JobParams(model=model, format=fmt), runs=records)
    (root / "job.json").write_bytes(manifest.to_bytes())
    (root / "shards").mkdir(exist_ok=True)
    (root / "ledger").mkdir(exist_ok=True)
    line = 0
    for seq, (server, tokens) in enumerate(rows.items()):
        buf = ShardBuffer(shard_schema(False, False), ShardLimits())
        for n in tokens:
            line += 1
            buf.add(
                OutputRow(
                    id=f"p{line}",
                    line=line,
                    text="x",
                    finish_reason="length",
                    prompt_tokens=3,
                    completion_tokens=n,
                    model=model,
                    server=server,
                    attempts=1,
                    latency_s=0.1,
                )
            )
        name = f"part-{run_ids[-1]}-{seq:06d}.{'parquet' if fmt == 'parquet' else 'jsonl'}"
        write_shard(buf, str(root / "shards" / name), fmt)
        entry = {
            "shard": name,
            "run_id": run_ids[-1],
            "rows": len(tokens),
            "ids": [],
            "lines": [],
            "committed": _ts(ledger_commit_s if ledger_commit_s is not None else 0.0),
        }
        (root / "ledger" / name.replace(".parquet", ".json").replace(".jsonl", ".json")).write_text(json.dumps(entry))
    return root


def bench_run(
    path: Path,
    curve: list[tuple[int, float]],
    *,
    model: str | None = "m",
    cap: int | None = None,
    requests: int = 100_000,
    duration_s: float = 1000.0,
) -> Path:
    """A RUN.json whose points are long (the end-of-point drain is negligible: the curve is as given)."""
    points = [
        Point(
            concurrency=c,
            requests=requests,
            successful=requests,
            errors=0,
            duration_s=duration_s,
            requests_per_s=requests / duration_s,
            input_tokens=requests,
            output_tokens=int(t * duration_s),
            output_tokens_per_s=t,
            total_tokens_per_s=t,
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
        target=Target(label=path.stem, base_url="http://127.0.0.1:1", model=model),
        config=BenchConfig(concurrency=[c for c, _ in curve]),
        environment=Environment(servefleet_version="0", python="3.11", platform="linux", hostname="h"),
        capacity=Capacity(max_running_requests=cap) if cap else None,
        points=points,
    )
    save_run(run, path)
    return path


# ---- measuring a destination ------------------------------------------------------------------------


def test_measure_reads_rows_tokens_servers_and_run_time(tmp_path):
    job = make_job_dir(tmp_path / "out", valid=4, runs=[(0.0, 20.0, "complete")], rows={"a": [10, 30], "b": [20, 40]})
    m = measure_job(job)
    assert (m.prompts_total, m.prompts_measured, m.completion_tokens, m.complete) == (4, 4, 100, True)
    assert m.mean_output_tokens == 25.0
    assert m.wall_s == pytest.approx(20.0)
    assert [(s.name, s.requests, s.completion_tokens) for s in m.servers] == [("a", 2, 40), ("b", 2, 60)]
    assert (m.model, m.wall_source, m.status) == ("m", "manifest", "complete")


def test_measure_reads_shards_a_few_at_a_time_and_counts_them_all(tmp_path, monkeypatch):
    import servefleet.plan.check as check

    monkeypatch.setattr(check, "SHARDS_PER_READ", 2)
    rows = {f"s{i}": [i + 1] * (i + 1) for i in range(5)}  # 5 shards, read 2 + 2 + 1
    job = make_job_dir(tmp_path / "out", valid=15, runs=[(0.0, 20.0, "complete")], rows=rows)
    m = measure_job(job)
    assert [(s.name, s.requests, s.completion_tokens) for s in m.servers] == [
        (f"s{i}", i + 1, (i + 1) ** 2) for i in range(5)
    ]
    assert m.complete and m.prompts_measured == 15


def test_measure_resumed_job_sums_runs_and_times_a_killed_run_by_its_last_commit(tmp_path):
    # run 1 finished after 10 s; run 2 was killed (no end): its last ledger commit, 35 s after T0, ends it
    job = make_job_dir(
        tmp_path / "out",
        valid=10,
        runs=[(0.0, 10.0, "interrupted"), (30.0, None, "running")],
        rows={"a": [5, 5, 5]},
        fmt="jsonl",
        ledger_commit_s=35.0,
    )
    m = measure_job(job)
    assert m.wall_s == pytest.approx(15.0)
    assert (m.prompts_measured, m.complete, m.runs) == (3, False, 2)


def test_measure_prefers_a_saved_report_for_a_single_run(tmp_path):
    job = make_job_dir(tmp_path / "out", valid=2, runs=[(0.0, 20.0, "complete")], rows={"a": [10, 10]})
    (tmp_path / "r.json").write_text(json.dumps({"status": "complete", "wall_s": 16.0}))
    m = measure_job(job, tmp_path / "r.json")
    assert (m.wall_s, m.wall_source) == (16.0, "report")
    (job / "report.json").write_text(json.dumps({"wall_s": 12.5}))  # found in the folder without --report
    assert measure_job(job).wall_s == 12.5


@pytest.mark.parametrize(
    "case, message",
    [
        ("missing", "no such folder"),
        ("no-manifest", "no job.json"),
        ("no-shards", "no committed shards"),
        ("bad-report", "no such report"),
    ],
)
def test_measure_errors_say_what_is_missing(tmp_path, case, message):
    job = tmp_path / "out"
    report = None
    if case == "no-manifest":
        job.mkdir()
    elif case == "no-shards":
        make_job_dir(job, valid=5, runs=[(0.0, None, "running")], rows={})
    elif case == "bad-report":
        make_job_dir(job, valid=1, runs=[(0.0, 5.0, "complete")], rows={"a": [1]})
        report = tmp_path / "nope.json"
    with pytest.raises(ConfigError, match=message):
        measure_job(job, report)


# ---- predicting and comparing -------------------------------------------------------------------


def test_check_complete_job_compares_with_the_planners_makespan(tmp_path):
    # 2 servers x 8 prompts of 100 tokens; the curve says 100 tok/s per replica at concurrency 4
    job = make_job_dir(
        tmp_path / "out", valid=16, runs=[(0.0, 9.0, "complete")], rows={"a": [100] * 8, "b": [100] * 8}
    )
    curve = Curve((1, 4), (40.0, 100.0))
    cfg = ConfigCurve("c", curve, max_running=4)
    res = check_plan(cfg, measure_job(job))
    expected = simulate_makespan(curve, 4, 2, JobSpec(16, 100.0))
    assert (res.replicas, res.concurrency) == (2, 4)
    assert res.makespan.predicted == pytest.approx(expected)
    assert res.makespan.measured == 9.0
    assert res.makespan.error_pct == pytest.approx((expected - 9.0) / 9.0 * 100)
    per_server = next(m for m in res.metrics if m.name == "output_tps_per_server")
    assert per_server.measured == pytest.approx(1600 / 9.0 / 2)
    out = res.to_json()
    assert set(out["metrics"]) == {"output_tps_per_gpu", "output_tps_per_server", "makespan_s"}
    assert out["within_tolerance"] is (abs(res.makespan.error_pct) <= 10)


def test_verdict_says_which_way_and_the_tolerance(tmp_path):
    # steady 100 tok/s x 2 replicas for 100,000 tokens: about 500 s predicted
    job = make_job_dir(
        tmp_path / "out", valid=1000, runs=[(0.0, 800.0, "complete")], rows={"a": [100] * 500, "b": [100] * 500}
    )
    cfg = ConfigCurve("c", Curve((1, 4), (40.0, 100.0)), max_running=4)
    slow = check_plan(cfg, measure_job(job))
    assert not slow.within and "optimistic" in slow.verdict() and "more than 10%" in slow.verdict()
    job2 = make_job_dir(
        tmp_path / "out2", valid=1000, runs=[(0.0, 505.0, "complete")], rows={"a": [100] * 500, "b": [100] * 500}
    )
    ok = check_plan(cfg, measure_job(job2))
    assert ok.within and ok.verdict().startswith("within 10%")
    fast = check_plan(cfg, measure_job(job2), gpus=1)  # planned on one GPU: far too pessimistic
    assert fast.replicas == 1 and "pessimistic" in fast.verdict()


def test_partial_job_is_compared_without_a_tail_and_gets_an_eta(tmp_path):
    job = make_job_dir(
        tmp_path / "out", valid=100, runs=[(0.0, None, "running")], rows={"a": [100] * 10}, ledger_commit_s=10.0
    )
    res = check_plan(ConfigCurve("c", Curve((4,), (100.0,))), measure_job(job))
    assert res.makespan.predicted == pytest.approx(10.0)  # 1000 tokens at 100 tok/s, no drain
    assert res.within
    assert any("partial job (10/100 prompts)" in n for n in res.notes)


def test_pick_config_refuses_a_run_of_another_model(tmp_path):
    job = make_job_dir(tmp_path / "out", valid=1, runs=[(0.0, 1.0, "complete")], rows={"a": [5]}, model="org/llama")
    meas = measure_job(job)
    a, b = ConfigCurve("a", Curve((1,), (1.0,))), ConfigCurve("b", Curve((1,), (1.0,)))
    assert pick_config([(a, "qwen"), (b, "/models/llama")], meas) is b  # same name under another path
    with pytest.raises(ConfigError, match="configuration mismatch"):
        pick_config([(a, "qwen")], meas)
    # `transformers serve` answers with "<model>@<revision>" where bench recorded the model it asked for
    tf = measure_job(
        make_job_dir(
            tmp_path / "tf", valid=1, runs=[(0.0, 1.0, "complete")], rows={"a": [5]}, model="/d/tiny-llama@main"
        )
    )
    assert pick_config([(a, "/d/tiny-llama"), (b, "/d/other")], tf) is a
    # two runs of the model: each server of the job needs the run named after it ("a" has one, no "b" server)
    assert pick_config([(a, None), (b, "llama")], meas) == {"a": a}
    c = ConfigCurve("c", Curve((1,), (1.0,)))
    with pytest.raises(ConfigError, match="none is named after server"):
        pick_config([(b, None), (c, "llama")], meas)


def test_a_job_on_two_configurations_is_planned_per_server(tmp_path):
    """The demo's fleet: one server of each configuration. Each at its best point (a: 50 tok/s at
    c=1; b: 300 tok/s at c=8); the prompts shared by rate, the makespan the slower share's."""
    job = make_job_dir(
        tmp_path / "out", valid=14, runs=[(0.0, 10.0, "complete")], rows={"a": [100] * 2, "b": [100] * 12}
    )
    a, b = ConfigCurve("a", Curve((1, 8), (50.0, 50.0))), ConfigCurve("b", Curve((1, 8), (60.0, 300.0)))
    meas = measure_job(job)
    picked = pick_config([(a, "m"), (b, "m")], meas)
    assert picked == {"a": a, "b": b}
    res = check_plan(picked, meas)
    expected = max(
        simulate_makespan(a.curve, 1, 1, JobSpec(2, 100.0)), simulate_makespan(b.curve, 8, 1, JobSpec(12, 100.0))
    )
    assert res.makespan.predicted == pytest.approx(expected)
    assert (res.replicas, res.concurrency, res.configuration) == (2, 9, "a + b")
    assert any(
        "b (b): concurrency 8, 300 tok/s steady; planned 86% of the tokens, answered 86%" in n for n in res.notes
    )
    assert res.to_json()["verdict"]
    with pytest.raises(ConfigError, match="apply to a job of one configuration"):
        check_plan(picked, meas, concurrency=4)


# ---- the bench point's own drain ------------------------------------------------------------------


def test_steady_curve_recovers_the_throughput_behind_short_points():
    true = Curve((1, 8, 32), (100.0, 700.0, 2000.0))
    points = []
    for c in true.concurrency:
        n, m = 6 * c, 50.0  # a short point: 6 requests per user, one drain at the end
        points.append(PointSample(c, n, n * m, simulate_makespan(true, c, 1, JobSpec(n, m))))
    naive = [p.output_tokens / p.duration_s for p in points]
    assert naive[-1] < 0.95 * 2000.0  # a short point reads well under the steady rate
    got = steady_curve(points)
    assert got.output_tps == pytest.approx(true.output_tps, rel=0.01)


def test_steady_curve_leaves_points_that_never_filled_and_never_lowers():
    points = [PointSample(16, 10, 1000.0, 2.0), PointSample(4, 400, 40_000.0, 100.0)]
    got = steady_curve(points)
    assert got.total(16) == 500.0  # 10 requests for 16 users: left as measured
    assert got.total(4) >= 400.0


# ---- the CLI ------------------------------------------------------------------------------------


def test_cli_check_json_and_table_and_errors(tmp_path):
    job = make_job_dir(
        tmp_path / "out", valid=1000, runs=[(0.0, 505.0, "complete")], rows={"a": [100] * 500, "b": [100] * 500}
    )
    run = bench_run(tmp_path / "run.json", [(1, 40.0), (4, 100.0)], cap=4)
    res = runner.invoke(app, ["plan", "--check", str(job), "--bench", str(run), "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert (out["replicas"], out["gpus"], out["concurrency"], out["prompts_measured"]) == (2, 2, 4, 1000)
    assert out["within_tolerance"] is True and out["verdict"].startswith("within 10%")
    assert out["metrics"]["makespan_s"]["measured"] == 505.0
    table = runner.invoke(app, ["plan", "--check", str(job), "--bench", str(run)])
    assert table.exit_code == 0 and "makespan" in table.output and "verdict" in table.output
    fast = bench_run(tmp_path / "fast.json", [(1, 80.0), (4, 200.0)], cap=4)  # promises twice what the job measured
    missed = runner.invoke(app, ["plan", "--check", str(job), "--bench", str(fast), "--json"])
    assert missed.exit_code == 1, (
        missed.output
    )  # the check ran and the plan missed: exit 1, the payload says by how much
    assert json.loads(missed.stdout)["within_tolerance"] is False
    assert runner.invoke(app, ["plan", "--check", str(job), "--bench", str(fast)]).exit_code == 1
    other = bench_run(tmp_path / "other.json", [(4, 100.0)], model="another-model")
    bad = runner.invoke(app, ["plan", "--check", str(job), "--bench", str(other)])
    assert bad.exit_code == 3 and "configuration mismatch" in bad.output
    missing = runner.invoke(app, ["plan", "--check", str(job), "--bench", str(tmp_path / "nope.json")])
    assert missing.exit_code == 3 and "no such bench run" in missing.output
    empty = runner.invoke(app, ["plan", "--check", str(tmp_path), "--bench", str(run)])
    assert empty.exit_code == 3 and "no job.json" in empty.output
    no_prompts = runner.invoke(app, ["plan", "--bench", str(run)])
    assert no_prompts.exit_code == 3 and "--prompts" in no_prompts.output


def test_bench_generate_then_check_on_a_sim(tmp_path):
    """The real chain: bench a sim, generate on it, check. Loose bound: CI shares 2 cores."""
    sim = SimProcess(
        "--load-time",
        "0",
        "--model",
        "sim-check",
        "--max-running",
        "8",
        "--decode-ms",
        "4",
        "--decode-ms-per-running",
        "0.2",
        "--prefill-ms-per-1k-tokens",
        "0",
        log_path=tmp_path / "sim.log",
    ).start()
    try:
        sim.wait_ready()
        cli = [PYTHON, "-m", "servefleet.cli.main"]
        run = tmp_path / "run.json"
        subprocess.run(
            [
                *cli,
                "bench",
                "--url",
                sim.url,
                "-c",
                "1,8",
                "--duration",
                "1",
                "--input-len",
                "8",
                "--output-len",
                "16",
                "--api",
                "completions",
                "--no-stream",
                "--ignore-eos",
                "-o",
                str(run),
                "--json",
            ],
            check=True,
            capture_output=True,
            timeout=120,
        )
        src = tmp_path / "in.jsonl"
        src.write_text(
            "".join(
                json.dumps({"id": f"p{i}", "prompt": f"item {i}", "max_tokens": 16, "ignore_eos": True}) + "\n"
                for i in range(200)
            )
        )
        gen = subprocess.run(
            [*cli, "generate", "-i", str(src), "-o", str(tmp_path / "out"), "--url", sim.url, "--json"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert gen.returncode == 0, gen.stderr[-2000:]
        (tmp_path / "report.json").write_text(gen.stdout)
    finally:
        sim.stop()
    res = runner.invoke(
        app,
        [
            "plan",
            "--check",
            str(tmp_path / "out"),
            "--bench",
            str(run),
            "--report",
            str(tmp_path / "report.json"),
            "--json",
        ],
    )
    out = json.loads(res.stdout)
    assert res.exit_code == (0 if out["within_tolerance"] else 1), res.output  # loose bound below: 2 shared cores
    assert out["complete"] and out["prompts_measured"] == 200 and out["output_tokens_mean"] == 16.0
    assert out["wall_source"] == "report" and out["replicas"] == 1
    assert abs(out["metrics"]["makespan_s"]["error_pct"]) < 25, out


def test_check_reads_a_destination_in_object_storage(tmp_path, moto_url):
    """The same destination uploaded to S3 (moto, the real protocol on loopback) gives the same check as
    the local folder, report.json included; a prefix with no job says so. The CLI runs in a subprocess
    with the credentials in its environment, as a user's would."""
    job = make_job_dir(
        tmp_path / "out",
        valid=1000,
        runs=[(0.0, 505.0, "complete")],
        rows={"a": [100] * 500, "b": [100] * 500},
        ledger_commit_s=500.0,
    )
    (job / "report.json").write_text(json.dumps({"wall_s": 498.0}))
    run = bench_run(tmp_path / "run.json", [(1, 40.0), (4, 100.0)], cap=4)
    fs = s3fs_for(moto_url)
    fs.call_s3("create_bucket", Bucket="bucket")
    for path in job.rglob("*"):
        if path.is_file():
            fs.put_file(str(path), f"bucket/jobs/out/{path.relative_to(job).as_posix()}")

    def check(dest: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [PYTHON, "-m", "servefleet.cli.main", "plan", "--check", dest, "--bench", str(run), "--json"],
            capture_output=True,
            text=True,
            timeout=120,
            env=s3_env(moto_url),
        )

    remote = check("s3://bucket/jobs/out")
    assert remote.returncode == 0, remote.stderr[-3000:]
    local = runner.invoke(app, ["plan", "--check", str(job), "--bench", str(run), "--json"])
    assert local.exit_code == 0, local.output
    got, want = json.loads(remote.stdout), json.loads(local.output)
    assert got.pop("job_dir") == "s3://bucket/jobs/out" and want.pop("job_dir") == str(job)
    assert got == want
    assert got["wall_source"] == "report" and got["metrics"]["makespan_s"]["measured"] == 498.0
    assert got["prompts_measured"] == 1000 and got["replicas"] == 2
    nothing = check("s3://bucket/jobs/elsewhere")
    assert nothing.returncode == 3 and "no job.json" in nothing.stderr + nothing.stdout, nothing.stderr


def test_steady_curve_uses_a_duration_points_deadline():
    # 32 users at a steady 2000 tok/s until the 10 s deadline, then their 32 * 50 / 2 tokens drain over 1.5 s
    p = PointSample(32, 416, 2000 * 10 + 32 * 50 / 2, 11.5, deadline_s=10.0)  # 416 requests of 50 tokens
    assert p.output_tokens / p.duration_s < 1900
    assert steady_curve([p]).total(32) == pytest.approx(2000.0)


def test_measuring_a_job_starts_no_arrow_thread_pool(tmp_path):
    """plan --check aborted now and then at exit after printing its verdict (SIGABRT, "terminate called
    without an active exception": Arrow's pool threads torn down with the interpreter; 3 of 90 runs
    reading the demo's shards with pq.read_table, 0 of 140 reading each file in the calling thread).
    Reading the shards must start no Arrow thread at all: pq.read_table started 3 here, a ParquetFile
    over io.BytesIO 1-2 (IO pool), over pa.BufferReader with use_threads=False none."""
    job = make_job_dir(tmp_path / "out", valid=24, runs=[(0.0, 5.0, "complete")], rows={"a": [5] * 12, "b": [7] * 12})
    code = (
        "import os, sys\n"
        "from servefleet.plan.check import measure_job\n"
        "from servefleet.generate.shards import read_shard_ids\n"
        "import pyarrow, pyarrow.parquet\n"
        "threads = lambda: len(os.listdir('/proc/self/task'))\n"
        "before = threads()\n"
        f"m = measure_job({str(job)!r})\n"
        "assert m.prompts_measured == 24\n"
        f"data = open(sorted(__import__('glob').glob({str(job / 'shards' / '*.parquet')!r}))[0], 'rb').read()\n"
        "assert len(read_shard_ids(data, 'parquet')[0]) == 12\n"
        "print(threads() - before)\n"
    )
    done = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout.strip()) == 0, done.stdout


# ---- the server against its bench, from the job's timeline ------------------------------------------


def write_timeline(job: Path, server: str, buckets: list[tuple[int, float, int, int, float]]) -> None:
    """A run's timeline as generate writes it (``timeline/RUN_ID.json``, 1 s buckets): per bucket
    (limit, mean in flight, answers, output tokens, seconds out of service)."""
    cols = {
        "output_tokens": [b[3] for b in buckets],
        "requests": [b[2] for b in buckets],
        "errors": [0] * len(buckets),
        "in_flight_mean": [b[1] for b in buckets],
        "in_flight_max": [int(b[1]) for b in buckets],
        "limit": [b[0] for b in buckets],
        "down_s": [b[4] for b in buckets],
    }
    (job / "timeline").mkdir(exist_ok=True)
    doc = {"version": 1, "started": 0.0, "bucket_s": 1.0, "buckets": len(buckets), "servers": {server: cols}}
    (job / "timeline" / "20261130T010000-abc0.json").write_text(json.dumps(doc))


def held_job(tmp_path: Path, steady_tokens: int) -> Path:
    """30 s at limit 8 (2 answers a second with 8 in flight: 4 s lifetimes), its first 8 s a slower
    transient; a 6 s stretch at 16 (too short to read); an outage; 12 s more at 8; a drain at 3."""
    job = make_job_dir(tmp_path / "out", valid=100, runs=[(0.0, 60.0, "complete")], rows={"a": [100] * 100})
    b = [(8, 8.0, 2, 500, 0.0)] * 8 + [(8, 8.0, 2, steady_tokens, 0.0)] * 22
    b += [(16, 16.0, 4, 9999, 0.0)] * 6 + [(8, 0.0, 0, 0, 1.0)]
    b += [(8, 8.0, 2, 500, 0.0)] * 8 + [(8, 8.0, 2, steady_tokens, 0.0)] * 12 + [(8, 3.0, 1, 50, 0.0)] * 3
    write_timeline(job, "a", b)
    return job


def test_held_rates_leave_out_transients_short_stretches_outages_and_the_drain(tmp_path):
    from servefleet.plan.held import against_bench, held_rates

    job = held_job(tmp_path, 1000)
    (rate,) = measure_job(job).held  # the 16 stretch is too short for a rate: left out
    assert (rate.server, rate.concurrency) == ("a", 8)
    assert rate.lifetime_s == pytest.approx(4.0)
    assert rate.seconds == 22 + 12 and rate.output_tps == pytest.approx(1000.0)
    (cmp,) = against_bench(
        held_rates([json.loads((job / "timeline" / "20261130T010000-abc0.json").read_text())]),
        Curve((4, 12), (1000.0, 3000.0)),
    )
    assert cmp.benched_tps == pytest.approx(2000.0) and cmp.error_pct == pytest.approx(-50.0)
    assert against_bench([rate], Curve((16, 32), (1.0, 2.0))) == []  # 8 was not benched: nothing to compare


@pytest.mark.parametrize(("steady", "said"), [(1000, "ran 50% slower than benched"), (2000, "ran as benched")])
def test_a_miss_says_whether_the_server_or_the_model_missed(tmp_path, steady, said):
    job = held_job(tmp_path, steady)
    cfg = ConfigCurve("c", Curve((4, 8), (1000.0, 2000.0)), max_running=8)
    res = check_plan(cfg, measure_job(job))  # 10,000 tokens at 2,000 tok/s: ~5 s predicted against 60 s
    assert not res.within and said in res.verdict(), res.verdict()
    out = res.to_json()
    assert out["against_bench"][0]["concurrency"] == 8 and out["against_bench"][0]["seconds"] == 34.0


def test_a_check_within_tolerance_gives_no_cause(tmp_path):
    job = held_job(tmp_path, 1000)
    cfg = ConfigCurve("c", Curve((8,), (10000 / 60.0,)), max_running=8)  # the whole job at this rate: 60 s
    res = check_plan(cfg, measure_job(job))
    assert res.within and res.cause() is not None and ";" not in res.verdict()


def test_a_server_slower_than_its_bench_is_named_on_a_sim(tmp_path):
    """Bench one sim, run the job on a slower one (twice the step time) at the benched concurrency:
    the check blames the server's speed, with the figures."""
    timing = ["--decode-ms-per-running", "0.2", "--prefill-ms-per-1k-tokens", "0", "--load-time", "0"]
    common = ["--model", "sim-check", "--max-running", "8", *timing]
    fast = SimProcess(*common, "--decode-ms", "4", log_path=tmp_path / "fast.log").start()
    slow = SimProcess(*common, "--decode-ms", "10", log_path=tmp_path / "slow.log").start()
    cli = [PYTHON, "-m", "servefleet.cli.main"]
    run = tmp_path / "run.json"
    try:
        fast.wait_ready()
        slow.wait_ready()
        bench = [*cli, "bench", "--url", fast.url, "-c", "8", "--duration", "2", "--input-len", "8"]
        bench += ["--output-len", "16", "--api", "completions", "--no-stream", "--ignore-eos", "-o", str(run)]
        subprocess.run(bench, check=True, capture_output=True, timeout=120)
        src = tmp_path / "in.jsonl"
        src.write_text(
            "".join(
                json.dumps({"id": f"p{i}", "prompt": f"item {i}", "max_tokens": 16, "ignore_eos": True}) + "\n"
                for i in range(300)
            )
        )
        gen = [*cli, "generate", "-i", str(src), "-o", str(tmp_path / "out"), "--url", slow.url]
        done = subprocess.run([*gen, "--concurrency", "8", "--json"], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
    finally:
        fast.stop()
        slow.stop()
    res = runner.invoke(app, ["plan", "--check", str(tmp_path / "out"), "--bench", str(run), "--json"])
    out = json.loads(res.stdout)
    assert res.exit_code == 1 and not out["within_tolerance"], res.output
    (row,) = out["against_bench"]
    assert row["concurrency"] == 8 and row["error_pct"] < -25, row  # 2.5x the step time: about -55 %
    assert "slower than benched" in out["verdict"] and "at concurrency 8" in out["verdict"]


@pytest.mark.parametrize(("job_rate", "said"), [(0.05, True), (0.55, False)])
def test_a_miss_names_a_bench_whose_prompts_found_more_in_the_prefix_cache(tmp_path, job_rate, said):
    job = held_job(tmp_path, 1000)
    report = {"wall_s": 60.0, "servers": [{"name": "a", "prefix_cache_hit_rate": job_rate}, {"name": "gone"}]}
    (job / "report.json").write_text(json.dumps(report))
    cfg = ConfigCurve("c", Curve((4, 8), (1000.0, 2000.0)), max_running=8, prefix_cache_hit_rate=0.6)
    res = check_plan(cfg, measure_job(job))
    assert not res.within
    assert ("found 60% of the bench's prompt tokens in its prefix cache" in res.verdict()) is said, res.verdict()
    assert "ran 50% slower than benched" in res.verdict()  # beside the server's own speed, not instead
    assert res.to_json()["prefix_cache_hit_rate"] == {"bench": 0.6, "job": job_rate}
    (job / "report.json").write_text(json.dumps({"wall_s": 60.0}))  # a report of before: nothing to compare
    assert check_plan(cfg, measure_job(job)).to_json()["prefix_cache_hit_rate"] == {"bench": 0.6, "job": None}


def test_a_bench_on_repeated_prompts_is_named_by_the_check_on_a_sim(tmp_path):
    """Bench a sim on a few long prompts sent again and again (the engine's prefix cache holds them: no
    prefill), then run a job of distinct ones on it: the job is slower than planned, and the check says
    which share of the prompt tokens each found cached, from the engine's own counters."""
    timing = ["--decode-ms", "2", "--decode-ms-per-running", "0", "--prefill-ms-per-1k-tokens", "60"]
    sim = SimProcess(
        "--model", "sim-prefix", "--max-running", "8", "--load-time", "0", *timing, log_path=tmp_path / "s.log"
    )
    sim.start()
    cli = [PYTHON, "-m", "servefleet.cli.main"]
    run, few = tmp_path / "run.json", tmp_path / "few.jsonl"
    words = lambda i: " ".join(f"w{i}x{j}" for j in range(300))  # noqa: E731
    few.write_text("".join(json.dumps({"prompt": words(i), "max_tokens": 8}) + "\n" for i in range(8)))
    src = tmp_path / "in.jsonl"
    src.write_text(
        "".join(json.dumps({"id": f"p{i}", "prompt": words(100 + i), "max_tokens": 8}) + "\n" for i in range(240))
    )
    try:
        sim.wait_ready()
        bench = [*cli, "bench", "--url", sim.url, "-c", "8", "--requests", "160", "--dataset", str(few)]
        subprocess.run(
            [*bench, "--api", "completions", "--no-stream", "-o", str(run)],
            check=True,
            capture_output=True,
            timeout=120,
        )
        gen = [*cli, "generate", "-i", str(src), "-o", str(tmp_path / "out"), "--url", sim.url, "--concurrency", "8"]
        done = subprocess.run([*gen, "--json"], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
    finally:
        sim.stop()
    (point,) = json.loads(run.read_text())["points"]
    assert point["server"]["prefix_cache_hit_rate"] > 0.9, point["server"]
    (server,) = json.loads(done.stdout)["servers"]
    assert server["prefix_cache_hit_rate"] == 0.0, server
    res = runner.invoke(app, ["plan", "--check", str(tmp_path / "out"), "--bench", str(run), "--json"])
    out = json.loads(res.stdout)
    assert res.exit_code == 1 and not out["within_tolerance"], res.output
    assert out["prefix_cache_hit_rate"]["job"] == 0.0 and out["prefix_cache_hit_rate"]["bench"] > 0.9, out
    assert "of the job's: the job had more prefill to do" in out["verdict"], out["verdict"]
