"""Watching a job from outside it: `servefleet progress DEST` (folder and s3://), the job's bounded
time series, and `generate --metrics-port` scraped while a real generate runs against sim servers."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import PYTHON, SimProcess, async_wait_until, free_port, s3_env, s3fs_for, wait_until
from servefleet.generate.job_record import progress_of, read_job
from servefleet.generate.recorder import JobRecorder
from servefleet.generate.sinks import LocalSink
from servefleet.generate.stats import JobStats, ServerStats
from servefleet.generate.timeline import Timeline

# slow enough that a run of 200 prompts takes several seconds (4 in flight, ~6 tokens of ~25 ms each)
SLOW_SIM = (
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
)
FAST_SIM = (
    "--load-time",
    "0",
    "--decode-ms",
    "1",
    "--decode-ms-per-running",
    "0",
    "--prefill-ms-per-1k-tokens",
    "0",
    "--max-running",
    "16",
)


@pytest.fixture
def slow_sim(tmp_path):
    proc = SimProcess(*SLOW_SIM, log_path=tmp_path / "sim.log").start().wait_ready()
    yield proc
    proc.stop()


def write_prompts(path: Path, n: int) -> Path:
    path.write_text("".join(json.dumps({"id": f"p{i}", "prompt": f"prompt {i}"}) + "\n" for i in range(n)))
    return path


def generate_argv(src: Path, dest: str, url: str, *extra: str) -> list[str]:
    return [
        PYTHON,
        "-m",
        "servefleet.cli.main",
        "generate",
        "-i",
        str(src),
        "-o",
        dest,
        "--url",
        url,
        "--max-tokens",
        "8",
        "--concurrency",
        "4",
        "--json",
        *extra,
    ]


def progress_cli(dest: str, *extra: str, env: dict | None = None, timeout: float = 60) -> tuple[int, list[dict], str]:
    proc = subprocess.run(
        [PYTHON, "-m", "servefleet.cli.main", "progress", dest, "--json", *extra],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    try:
        return proc.returncode, [json.loads(line) for line in proc.stdout.splitlines() if line.strip()], proc.stderr
    except ValueError:
        raise AssertionError(f"rc {proc.returncode}: {proc.stdout[-2000:]}\n{proc.stderr[-2000:]}") from None


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


# ---- the time series: bounded, sums kept, state changes as events ---------------------------------


def test_the_timeline_stays_bounded_keeps_every_token_and_records_outages_and_restarts():
    stats = JobStats(total=10**6)
    server = ServerStats("a", "http://a", limit=8)
    stats.servers["a"] = server
    tl = Timeline(started=1000.0, max_buckets=16)
    for sec in range(1, 1001):
        server.completion_tokens += 10
        server.requests += 1
        server.in_flight = 8
        stats.done += 1
        stats.completion_tokens += 10
        if sec == 100:
            server.state, server.outages = "down", 1
        if sec == 150:
            server.state, server.restarts = "up", 1
        tl.sample(1000.0 + sec, stats)
    out = tl.to_json()
    assert out["buckets"] <= 16 and out["bucket_s"] == 64.0  # 1,000 s in 16 buckets of a power of two
    series = out["servers"]["a"]
    assert sum(series["output_tokens"]) == 10_000 and sum(out["job"]["done"]) == 1000
    assert max(series["in_flight_max"]) == 8 and set(series["limit"]) == {8}
    assert sum(series["down_s"]) == pytest.approx(50, abs=1)  # down from t=100 to t=150
    kinds = [(e["kind"], e["t"]) for e in out["events"]["items"]]
    assert kinds == [("outage", 100.0), ("back", 150.0), ("restart", 150.0)]


def test_an_outage_shorter_than_a_sample_is_still_an_outage():
    stats = JobStats()
    server = stats.servers["a"] = ServerStats("a", "http://a", limit=4)
    tl = Timeline(started=0.0)
    tl.sample(1.0, stats)
    server.outages, server.restarts = 1, 1  # taken out and restarted between two samples: "up" at both
    tl.sample(2.0, stats)
    assert [(e["kind"], e["t"]) for e in tl.to_json()["events"]["items"]] == [
        ("outage", 1.5),
        ("back", 2.0),
        ("restart", 2.0),
    ]


def test_a_week_of_64_servers_fits_in_a_bounded_record():
    stats = JobStats()
    for i in range(64):
        stats.servers[f"s{i}"] = ServerStats(f"s{i}", "http://x", limit=256)
    tl = Timeline(started=0.0)
    for step in range(0, 7 * 86400, 300):  # a sample every 5 minutes fills every bucket
        for s in stats.servers.values():
            s.completion_tokens += 1_000_000
        tl.sample(float(step), stats)
    data = json.dumps(tl.to_json(), separators=(",", ":"))
    assert tl.to_json()["buckets"] <= 480
    assert len(data) < 2_500_000, len(data)  # ~10 KB per server with the buckets full (job_record_cost.md)


# ---- progress of a real run, from another process, while it runs and after ----------------------


def test_progress_and_metrics_while_a_real_generate_runs_and_after_it_ends(slow_sim, tmp_path):
    n = 200
    src = write_prompts(tmp_path / "in.jsonl", n)
    out = tmp_path / "out"
    port = free_port()
    proc = subprocess.Popen(
        generate_argv(src, str(out), slow_sim.url, "--metrics-port", str(port)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    watcher = None
    try:

        def sending() -> bool:
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            if not (out / "progress.json").exists():
                return False
            snap = json.loads((out / "progress.json").read_text())
            return snap["status"] == "running" and 0 < snap["done"] < n

        wait_until(sending, timeout=60, interval=0.1, what="a progress.json of a run under way")
        watcher = subprocess.Popen(
            [PYTHON, "-m", "servefleet.cli.main", "progress", str(out), "--watch", "--json", "--interval", "0.3"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        rc, views, err = progress_cli(str(out))
        assert rc == 0, err
        live = views[0]
        assert live["state"] == "running" and live["total"] == n and 0 < live["done"] < n
        assert live["remaining"] == n - live["done"] - live["failed"] and live["eta_s"] is not None
        assert [s["name"] for s in live["servers"]] == ["url"] and live["servers"][0]["limit"] == 4

        metrics = scrape(port)
        assert metrics[("servefleet_generate_prompts", (("state", "total"),))] == n
        answered = metrics[("servefleet_generate_prompts_answered_total", ())]
        assert 0 < answered < n
        assert metrics[("servefleet_generate_server_concurrency_limit", (("server", "url"),))] == 4
        assert 0 <= metrics[("servefleet_generate_server_in_flight", (("server", "url"),))] <= 4
        assert metrics[("servefleet_generate_server_up", (("server", "url"),))] == 1
        assert metrics[("servefleet_generate_output_tokens_total", ())] > 0
        # counters only grow, scrape to scrape
        wait_until(
            lambda: scrape(port)[("servefleet_generate_prompts_answered_total", ())] > answered,
            timeout=30,
            what="the answered counter to grow",
        )

        stdout, stderr = proc.communicate(timeout=120)
        watched, watch_err = watcher.communicate(timeout=60)  # --watch ends by itself once the job has
    finally:
        for p in (proc, watcher):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
    lines = [json.loads(line) for line in watched.splitlines()]
    assert watcher.returncode == 0, watch_err
    assert len(lines) >= 2 and lines[0]["state"] == "running" and lines[-1]["state"] == "complete"
    assert [v["done"] for v in lines] == sorted(v["done"] for v in lines) and lines[-1]["done"] == n
    report = json.loads(stdout)
    assert proc.returncode == 0 and report["status"] == "complete", stderr[-3000:]
    assert report["files"]["progress"] == str(out / "progress.json")
    assert report["files"]["timeline"] == str(out / "timeline" / f"{report['run_id']}.json")
    rc, views, err = progress_cli(str(out), "--watch")  # an ended job: one view, the job's exit code
    assert rc == 0 and len(views) == 1, err
    final = views[0]
    assert final["state"] == "complete" and final["done"] == n == report["committed"] and final["remaining"] == 0
    assert final["output_tokens"] == report["completion_tokens"] and final["eta_s"] is None
    assert final["servers"][0]["requests"] == report["servers"][0]["requests"]
    # the time series holds the same numbers as the report
    (timeline,) = read_job(str(out)).timelines
    assert timeline["run_id"] == report["run_id"] and timeline["status"] == "complete"
    assert sum(timeline["servers"]["url"]["output_tokens"]) == report["completion_tokens"]
    assert sum(timeline["job"]["done"]) == n and max(timeline["servers"]["url"]["in_flight_max"]) == 4
    with pytest.raises(OSError):  # the metrics server went away with the job
        scrape(port)


def test_a_killed_run_shows_as_stale_and_a_taken_metrics_port_is_refused_before_anything_is_read(slow_sim, tmp_path):
    src = write_prompts(tmp_path / "in.jsonl", 400)
    out = tmp_path / "out"
    proc = subprocess.Popen(
        generate_argv(src, str(out), slow_sim.url), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        wait_until(
            lambda: (out / "progress.json").exists() and json.loads((out / "progress.json").read_text())["done"] > 0,
            timeout=60,
            interval=0.1,
            what="progress.json",
        )
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    record = read_job(str(out))
    snap = record.progress
    assert progress_of(record, now=snap["updated_unix"] + 5)["state"] == "running"  # killed just now: cannot tell yet
    stale = progress_of(record, now=snap["updated_unix"] + 120)
    assert stale["state"] == "stale" and "resume" in stale["note"] and stale["eta_s"] is None
    assert stale["output_tokens_per_s_now"] is None and stale["remaining"] == 400 - stale["done"] > 0

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        other = tmp_path / "other"
        res = subprocess.run(
            generate_argv(src, str(other), slow_sim.url, "--metrics-port", str(port)),
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert res.returncode == 3 and f"--metrics-port {port}" in json.loads(res.stdout)["error"]["message"]
    assert not other.exists()  # refused before the destination was touched


def test_progress_of_something_that_is_not_a_job_says_so(tmp_path):
    rc, views, err = progress_cli(str(tmp_path))
    assert rc == 3 and "no job.json" in views[0]["error"]["message"] and views[0]["ok"] is False
    rc, views, err = progress_cli(str(tmp_path / "missing"))
    assert rc == 3 and "no such folder" in views[0]["error"]["message"]


def test_progress_of_a_job_on_s3(moto_url, tmp_path):
    sim = SimProcess(*FAST_SIM, log_path=tmp_path / "sim.log").start().wait_ready()
    try:
        fs = s3fs_for(moto_url)
        fs.call_s3("create_bucket", Bucket="bucket")
        src = write_prompts(tmp_path / "in.jsonl", 80)
        env = s3_env(moto_url)
        res = subprocess.run(
            generate_argv(src, "s3://bucket/jobs/w", sim.url), capture_output=True, text=True, timeout=120, env=env
        )
        report = json.loads(res.stdout)
        assert res.returncode == 0 and report["status"] == "complete", res.stderr[-3000:]
    finally:
        sim.stop()
    assert fs.exists("bucket/jobs/w/progress.json") and fs.ls("bucket/jobs/w/timeline")
    rc, views, err = progress_cli("s3://bucket/jobs/w", env=env)
    assert rc == 0, err
    assert (
        views[0]["state"] == "complete" and views[0]["done"] == 80 and views[0]["destination"] == "s3://bucket/jobs/w"
    )
    assert views[0]["output_tokens"] == report["completion_tokens"]
    res = subprocess.run(
        [
            PYTHON,
            "-m",
            "servefleet.cli.main",
            "report",
            "s3://bucket/jobs/w",
            "--out",
            str(tmp_path / "r.html"),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    written = json.loads(res.stdout)
    assert res.returncode == 0 and written["runs"] == 1 and written["servers"] == ["url"], res.stderr[-2000:]
    assert 'data-chart="tps"' in (tmp_path / "r.html").read_text()


class FailingSink(LocalSink):
    """A destination where progress records cannot be written (shards still can)."""

    def write_bytes(self, rel: str, data: bytes) -> None:
        if rel == "progress.json" or rel.startswith("timeline/"):
            raise PermissionError(13, "Permission denied", rel)
        super().write_bytes(rel, data)


async def test_a_progress_record_that_cannot_be_written_is_noted_once_and_the_job_goes_on(tmp_path):
    stats = JobStats(total=10)
    stats.servers["a"] = ServerStats("a", "http://a", limit=2)
    recorder = JobRecorder(FailingSink(str(tmp_path)), stats, run_id="r", interval_s=0.05, sample_s=0.05)
    recorder.start()
    await async_wait_until(lambda: _async(stats.events_total >= 1), timeout=10, what="the failure to be noted")
    stats.done = 3
    await asyncio.sleep(0.3)  # several more ticks fail too: still one event
    await recorder.finish("complete")
    assert stats.events_total == 1 and "progress record" in stats.events[0] and "Permission denied" in stats.events[0]
    assert recorder.writes == 0 and not (tmp_path / "progress.json").exists()
    # the same recorder on a sink that works: the final record lands, with the final status
    ok = JobRecorder(LocalSink(str(tmp_path)), stats, run_id="r")
    await ok.finish("complete")
    assert json.loads((tmp_path / "progress.json").read_text())["status"] == "complete"
    assert (tmp_path / "timeline" / "r.json").exists()


async def _async(value: bool) -> bool:
    return value


def test_the_metrics_servers_rate_reads_agree_with_the_jobs_and_change_nothing():
    from servefleet.generate.stats import RateMeter

    meter = RateMeter(window_s=10.0)
    for step in range(300):
        meter.add(7, now=step * 0.1)
    buckets = len(meter._buckets)
    peeked = meter.peek_rate(35.0)  # 5 s after the last amount: half the window is empty
    assert len(meter._buckets) == buckets  # nothing trimmed from the metrics server's thread
    assert peeked == pytest.approx(meter.rate(35.0)) == pytest.approx(7 * 50 / 10.0, rel=0.05)
    assert len(meter._buckets) < buckets  # the job's own read trims


class RecordingSink(LocalSink):
    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.written: list[str] = []

    def write_bytes(self, rel: str, data: bytes) -> None:
        self.written.append(rel)
        super().write_bytes(rel, data)


async def test_the_timeline_is_written_every_few_snapshots_and_less_often_when_it_is_big(tmp_path, monkeypatch):
    import servefleet.generate.recorder as recorder_mod

    stats = JobStats(total=10)
    stats.servers["a"] = ServerStats("a", "http://a", limit=2)
    for budget, folder in ((10**9, "roomy"), (1.0, "tight")):  # bytes per second the timeline may average
        monkeypatch.setattr(recorder_mod, "TIMELINE_BYTES_PER_S", budget)
        sink = RecordingSink(str(tmp_path / folder))
        rec = JobRecorder(sink, stats, run_id="r", interval_s=0.05, sample_s=0.05, timeline_every=3)
        rec.start()
        await async_wait_until(
            lambda sink=sink: _async(sink.written.count("progress.json") >= 12), timeout=30, what="12 snapshots"
        )
        await rec.finish("complete")
        snapshots, timelines = sink.written.count("progress.json"), sink.written.count("timeline/r.json")
        if folder == "roomy":
            assert snapshots / 3 - 1 <= timelines <= snapshots / 3 + 2
        else:  # the first write, then none until the end: its bytes would take far longer than the run to "pay"
            assert timelines == 2
        assert sink.written[-1] == "progress.json" and sink.written[-2] == "timeline/r.json"  # the end writes both


def test_a_run_that_has_not_started_sending_shows_what_the_run_before_left():
    from servefleet.generate.job_record import JobRecord

    manifest = {
        "input": {"valid": 100, "rejected": 2},
        "rows": 40,
        "runs": [
            {
                "run_id": "r1",
                "status": "interrupted",
                "finished": "2026-12-01T10:00:00.000000Z",
                "done_before": 0,
                "done": 40,
            },
            {"run_id": "r2", "status": "running", "finished": None, "done_before": 0, "done": 0},  # in its pre-pass
        ],
    }
    snap_of_r1 = {"run_id": "r1", "status": "interrupted", "updated_unix": 0.0, "done": 40, "servers": [{"name": "a"}]}
    view = progress_of(JobRecord("dest", manifest, progress=snap_of_r1), now=1e9)
    assert view["state"] == "starting" and view["run_id"] == "r2" and view["done"] == 40 and view["remaining"] == 60
    assert "not started sending" in view["note"] and view["servers"] == []
