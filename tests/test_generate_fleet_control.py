"""generate --fleet and the fleet's own state: crash loops end, an explicit stop wins.

The CLI in subprocesses against simulated engines launched by `servefleet up` (real processes,
real signals): a server that keeps dying is restarted only so often in a sliding window and then
taken out for good; `servefleet down` / `drain` while a job runs are not undone by the job."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from conftest import PYTHON, free_port
from test_generate_sim import FAST_SIM, committed_ids, generate_argv, run_cli, write_prompts

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
    fleet = fleet_up(fleet_file(tmp_path, {"steady": slow, "crashy": [*slow, "--crash-after", "10", "--crash-mode", "kill"]}))
    src = write_prompts(tmp_path / "in.jsonl", 400)
    rc, report, err = run_cli(generate_argv(src, tmp_path / "out", "--fleet", str(fleet), extra=("--max-restarts", "2", "--concurrency", "4")),
                              timeout=240)
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
    fleet = fleet_up(fleet_file(tmp_path, {"crashy": ["--crash-after", "10", "--crash-mode", "kill"]},
                                extra="max_restarts = 1\nrestart_window = 3600"))
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
