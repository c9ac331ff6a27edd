"""generate --fleet and the fleet's own state: crash loops end, an explicit stop wins.

The CLI in subprocesses against simulated engines launched by `servefleet up` (real processes,
real signals): a server that keeps dying is restarted only so often in a sliding window and then
taken out for good; `servefleet down` / `drain` while a job runs are not undone by the job."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from conftest import PYTHON, free_port, wait_until
from test_generate_sim import FAST_SIM, committed_ids, generate_argv, run_cli, shard_count, write_prompts

SERVEFLEET = [PYTHON, "-m", "servefleet.cli.main"]


def fleet_file(tmp_path: Path, servers: dict[str, list[str]], extra: str = "") -> Path:
    path = tmp_path / "fleet.toml"
    text = f"""
[fleet]
name = "ctl"
timeout = 60
stall = 30
smoke = false
{extra}
"""
    for name, args in servers.items():
        text += f"""
[[servers]]
name = "{name}"
engine = "sim"
model = "sim-7b"
port = {free_port()}
args = {json.dumps([*FAST_SIM, "--max-running", "8", *args])}
"""
    path.write_text(text)
    return path


@pytest.fixture
def fleet_up():
    started: list[Path] = []

    def up(path: Path) -> Path:
        started.append(path)
        proc = subprocess.run([*SERVEFLEET, "up", str(path)], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return path

    yield up
    for path in started:
        subprocess.run([*SERVEFLEET, "down", "--fleet", str(path)], capture_output=True, timeout=120)


# ---- crash loops ---------------------------------------------------------------------------------


def test_a_server_in_a_crash_loop_is_taken_out_for_good_and_the_job_finishes_on_the_others(tmp_path, fleet_up):
    """`crashy` dies (SIGKILL) after every 10 answers however often it is restarted. Before the
    window existed every outage began again at "attempt 1/3" and it was restarted until the job
    ended (about 20 times here); now the second restart in the window is the last."""
    slow = ["--decode-ms", "20"]  # ~10 s of work: time for every restart the old code would have made
    fleet = fleet_up(
        fleet_file(tmp_path, {"steady": slow, "crashy": [*slow, "--crash-after", "10", "--crash-mode", "kill"]})
    )
    src = write_prompts(tmp_path / "in.jsonl", 400)
    rc, report, err = run_cli(
        generate_argv(
            src, tmp_path / "out", "--fleet", str(fleet), extra=("--max-restarts", "2", "--concurrency", "4")
        ),
        timeout=240,
    )
    assert rc == 0 and report["status"] == "complete", err[-3000:]
    servers = {s["name"]: s for s in report["servers"]}
    crashy = servers["crashy"]
    assert crashy["restarts"] == 2 and crashy["outages"] == 3 and crashy["state"] == "gone", crashy
    assert "crash loop: restarted 2 times in the last 10 min" in crashy["state_reason"]
    assert any("crashy: crash loop" in e for e in report["events"])
    assert any("restart 2 of at most 2 restarts in 10 min" in e for e in report["events"])
    assert servers["steady"]["state"] == "up" and servers["steady"]["restarts"] == 0
    assert sorted(committed_ids(tmp_path / "out")) == sorted(f"p{i}" for i in range(400))
    progress = json.loads((tmp_path / "out" / "progress.json").read_text())
    assert any("crash loop" in s.get("state_reason", "") for s in progress["servers"])


def test_the_fleet_files_limit_applies_and_a_fleet_with_no_server_left_ends_stalled(tmp_path, fleet_up):
    """One server, crash loop, `max_restarts = 1` from the fleet file: the run ends (exit 2,
    "stalled", the reason in the human summary) instead of restarting it for ever."""
    fleet = fleet_up(
        fleet_file(
            tmp_path,
            {"crashy": ["--crash-after", "10", "--crash-mode", "kill"]},
            extra="max_restarts = 1\nrestart_window = 3600",
        )
    )
    src = write_prompts(tmp_path / "in.jsonl", 200)
    argv = generate_argv(src, tmp_path / "out", "--fleet", str(fleet), extra=("--concurrency", "4"))
    proc = subprocess.run([a for a in argv if a != "--json"], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "crashy" in proc.stdout and "crash loop" in proc.stdout, proc.stdout  # the summary says why
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["status"] == "stalled"
    crashy = report["servers"][0]
    assert crashy["restarts"] == 1 and crashy["state"] == "gone" and "max_restarts" in crashy["state_reason"]
    ids = committed_ids(tmp_path / "out")
    assert len(ids) == len(set(ids)) and 10 <= len(ids) < 200


def test_the_restart_window_slides() -> None:
    from servefleet.generate.health import RestartWindow

    w = RestartWindow(limit=2, window_s=600)
    assert w.allows(0) and w.record(0) == 1 and w.record(100) == 2
    assert not w.allows(599)  # two restarts in the last 10 min: the limit
    assert w.allows(600.5) and w.record(600.5) == 2  # the first has left the window
    assert w.describe() == "at most 2 restarts in 10 min"


# ---- an explicit stop wins -----------------------------------------------------------------------


def start_job(tmp_path: Path, fleet: Path, n: int) -> tuple[subprocess.Popen, Path]:
    src = write_prompts(tmp_path / "in.jsonl", n)
    out = tmp_path / "out"
    argv = generate_argv(
        src, out, "--fleet", str(fleet), extra=("--concurrency", "4", "--shard-rows", "20", "--shard-seconds", "0.3")
    )
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_until(lambda: shard_count(out) >= 2 or proc.poll() is not None, timeout=60, what="the job's first shards")
    assert proc.poll() is None, proc.communicate()
    return proc, out


def finish(proc: subprocess.Popen) -> tuple[int, dict, str]:
    stdout, stderr = proc.communicate(timeout=180)
    try:
        return proc.returncode, json.loads(stdout), stderr
    except ValueError:
        raise AssertionError(f"no JSON report (rc {proc.returncode}):\n{stdout[-2000:]}\n{stderr[-3000:]}") from None


def statuses(fleet: Path) -> dict[str, str]:
    proc = subprocess.run(
        [*SERVEFLEET, "status", "--fleet", str(fleet), "--json"], capture_output=True, text=True, timeout=60
    )
    return {s["name"]: s["state"] for s in json.loads(proc.stdout)["servers"]}


SLOW = ["--decode-ms", "30"]  # ~5 s of work for two servers: the stop lands mid-job


def test_down_while_a_job_runs_wins_the_job_does_not_restart_the_servers(tmp_path, fleet_up):
    """Before: `down` said "stopped, port free", then the job restarted both servers within
    seconds and they stayed up after it ended."""
    fleet = fleet_up(fleet_file(tmp_path, {"a": SLOW, "b": SLOW}))
    proc, out = start_job(tmp_path, fleet, 300)
    down = subprocess.run([*SERVEFLEET, "down", "--fleet", str(fleet)], capture_output=True, text=True, timeout=120)
    assert down.returncode == 0, down.stdout + down.stderr
    assert f"in use by generate pid {proc.pid} (output {out})" in down.stdout, down.stdout
    rc, report, err = finish(proc)
    assert rc == 2 and report["status"] == "stalled", err[-3000:]  # no server left: the documented exit
    for s in report["servers"]:
        assert s["state"] == "stopped" and s["restarts"] == 0 and s["outages"] == 0, s
        assert s["state_reason"].startswith("stopped by the user (servefleet down at "), s
    assert not any("restarting" in e for e in report["events"]), report["events"]
    assert statuses(fleet) == {"a": "not launched", "b": "not launched"}  # and they stay down
    ids = committed_ids(out)
    assert len(ids) == len(set(ids)) and len(ids) < 300
    # `up` lifts the stop: the same command resumes and answers every id exactly once
    fleet_up(fleet)
    rc, report, err = run_cli(generate_argv(tmp_path / "in.jsonl", out, "--fleet", str(fleet)), timeout=180)
    assert rc == 0 and report["status"] == "complete", err[-3000:]
    assert sorted(committed_ids(out)) == sorted(f"p{i}" for i in range(300))


def test_drain_one_server_lets_its_requests_finish_then_stops_it_and_the_job_goes_on(tmp_path, fleet_up):
    fleet = fleet_up(fleet_file(tmp_path, {"a": SLOW, "b": SLOW}))
    proc, out = start_job(tmp_path, fleet, 300)
    early = subprocess.run(
        [*SERVEFLEET, "drain", "a", "--timeout", "0", "--fleet", str(fleet)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert early.returncode == 2 and f"a: still in use by generate pid {proc.pid}" in early.stdout, (
        early.stdout + early.stderr
    )
    assert f"a: waiting for generate pid {proc.pid} (output {out}) to finish its requests on it" in early.stderr
    assert statuses(fleet)["a"] == "ready"  # left running (and drained) when the job has not finished with it
    drain = subprocess.run(
        [*SERVEFLEET, "drain", "a", "--fleet", str(fleet)], capture_output=True, text=True, timeout=120
    )
    assert drain.returncode == 0, drain.stdout + drain.stderr
    assert "a: drained; stopped" in drain.stdout, drain.stdout  # the job parked it meanwhile: nothing to wait for
    assert statuses(fleet)["a"] == "not launched"
    rc, report, err = finish(proc)
    assert rc == 0 and report["status"] == "complete", err[-3000:]
    a, b = (next(s for s in report["servers"] if s["name"] == n) for n in ("a", "b"))
    assert a["state"] == "stopped" and a["state_reason"].startswith("drained by the user (servefleet drain at "), a
    assert a["requests"] > 0 and a["errors"] == 0 and a["outages"] == 0 and a["restarts"] == 0, a
    assert report["requeued"] == 0 and report["retries"] == 0  # its in-flight requests finished there
    assert b["state"] == "up" and b["requests"] + a["requests"] == 300
    assert sorted(committed_ids(out)) == sorted(f"p{i}" for i in range(300))
    assert statuses(fleet)["a"] == "not launched"


def test_drain_keep_leaves_the_server_running_but_no_job_uses_it_until_up(tmp_path, fleet_up):
    fleet = fleet_up(fleet_file(tmp_path, {"a": [], "b": []}))
    typo = subprocess.run(
        [*SERVEFLEET, "drain", "c", "--fleet", str(fleet)], capture_output=True, text=True, timeout=60
    )
    assert typo.returncode == 3 and "no server named 'c' (servers: a, b)" in typo.stderr, typo.stderr
    assert not (fleet.parent / ".servefleet" / "ctl" / "stopped").exists()  # nothing marked
    drain = subprocess.run(
        [*SERVEFLEET, "drain", "b", "--keep", "--fleet", str(fleet), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert drain.returncode == 0, drain.stdout + drain.stderr
    assert json.loads(drain.stdout)["servers"] == [
        {
            "name": "b",
            "ok": True,
            "jobs": [],
            "still_using": [],
            "stopped": False,
            "message": "drained; left running (--keep): no job sends to it until `servefleet up` of it",
        }
    ]
    assert statuses(fleet)["b"] == "ready"
    shown = subprocess.run([*SERVEFLEET, "status", "--fleet", str(fleet)], capture_output=True, text=True, timeout=60)
    assert "b: drained by the user (servefleet drain at " in shown.stdout, (
        shown.stdout
    )  # why no job uses a ready server
    src = write_prompts(tmp_path / "in.jsonl", 50)
    rc, report, err = run_cli(generate_argv(src, tmp_path / "out", "--fleet", str(fleet)))
    assert rc == 0, err[-3000:]
    b = next(s for s in report["servers"] if s["name"] == "b")
    assert b["requests"] == 0 and b["state"] == "stopped" and b["state_reason"].startswith("drained by the user")
    fleet_up(fleet)  # `up` lifts the drain (b is adopted, not relaunched)
    assert not json.loads(
        subprocess.run(
            [*SERVEFLEET, "status", "--fleet", str(fleet), "--json"], capture_output=True, text=True, timeout=60
        ).stdout
    )["servers"][1]["stopped_by_user"]
    rc, report, err = run_cli(generate_argv(src, tmp_path / "out2", "--fleet", str(fleet)))
    assert rc == 0 and next(s for s in report["servers"] if s["name"] == "b")["requests"] > 0, err[-3000:]


def test_a_job_whose_restart_meets_a_stop_mark_does_not_start_the_server(tmp_path) -> None:
    """The job's restart checks the mark under the state folder's lock: a `down` between the job's
    look and its launch still wins."""
    import asyncio

    from servefleet.fleet import Fleet
    from servefleet.fleet.state import StopMark, utcnow

    fleet = Fleet.load(fleet_file(tmp_path, {"a": []}))
    fleet.store.mark_stopped(StopMark(name="a", command="down", at=utcnow()))
    outcomes = asyncio.run(fleet.start(["a"], honour_stops=True))
    assert outcomes["a"].action.value == "held" and "stopped by the user" in (outcomes["a"].message or "")
    assert fleet.store.load("a") is None  # nothing launched


def test_the_record_of_a_job_that_died_is_stale_and_ignored(tmp_path) -> None:
    """A SIGKILLed job cannot remove its record: `down` and `drain` must not wait for it."""
    import os
    import socket

    from servefleet.fleet.jobs import JobUse, JobUses
    from servefleet.fleet.state import utcnow

    dead = subprocess.Popen([PYTHON, "-c", "pass"])
    dead.wait()
    uses = JobUses(tmp_path)
    uses.save(JobUse(pid=dead.pid, host=socket.gethostname(), started=0.0, output="x", since=utcnow(), servers=["a"]))
    reused = JobUse(pid=os.getpid(), host=socket.gethostname(), started=1.0, output="y", since=utcnow(), servers=["a"])
    uses.save(
        reused.model_copy(update={"pid": os.getppid()})
    )  # a live pid, but not the job's process (start time differs)
    assert uses.live() == [] and not list((tmp_path / "jobs").glob("*.json"))
    with uses.recording("out", ["a", "b"]) as me:
        assert [u.pid for u in uses.live()] == [os.getpid()] and me.uses("a")
    assert uses.live() == []


async def test_a_server_the_user_drains_while_it_hangs_is_parked_its_requests_requeued_without_an_outage(
    tmp_path,
) -> None:
    """In one process, a fake restarter: the user's drain lands while the server's 4 requests hang;
    it gets nothing new, and when it is taken out (probes) its requests are re-queued, no outage
    or attempt counted, no restart tried; the job finishes on the other server."""
    from servefleet.generate.health import HealthPolicy
    from servefleet.generate.runner import run_generate
    from test_generate_dispatch import FakeServer, assert_exactly_once, config, write_input

    hung, good = await FakeServer(hang=True, name="hung").start(), await FakeServer(delay_s=0.002, name="good").start()
    parked: list[str] = []

    class Restarter:
        async def restart(self, name, on_event):
            raise AssertionError(f"{name} restarted although the user drained it")

        def held(self, name):
            return "drained by the user (test)" if name == "hung" and hung.requests >= 4 else None

        def parked(self, name):
            parked.append(name)

    try:
        src = write_input(tmp_path / "in.jsonl", 200)
        policy = HealthPolicy(probe_interval_s=0.3, probe_failures=1, probe_timeout_s=0.3, retry_interval_s=0.05)
        targets = [hung.target(managed=True), good.target(managed=True)]
        report = await run_generate(
            config(src, tmp_path / "out", concurrency=4, health=policy), targets=targets, restarter=Restarter()
        )
    finally:
        await hung.stop()
        await good.stop()
    assert report.status == "complete" and report.committed == 200
    by_name = {s.name: s for s in report.servers}
    assert by_name["hung"].state == "stopped" and by_name["hung"].outages == 0 and by_name["hung"].restarts == 0
    assert by_name["hung"].state_reason == "drained by the user (test)" and parked == ["hung"]
    assert hung.requests == 4 and report.requeued == 4
    assert all(r["attempts"] == 1 for r in assert_exactly_once(tmp_path / "out", {f"p{i}" for i in range(200)}))
