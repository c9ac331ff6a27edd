"""A generate job with something to show, for the report tests: a fleet of two simulated servers, one
of which is killed mid-job (SIGKILL by the sim itself) and restarted by the fleet, prompts failing on
the other (one attempt each), the first run interrupted with SIGINT and the job resumed to the end."""

from __future__ import annotations

import json
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

from conftest import PYTHON, free_port, wait_until

SIM = (
    "--load-time",
    "0",
    "--decode-ms",
    "12",
    "--decode-ms-per-running",
    "0",
    "--prefill-ms-per-1k-tokens",
    "0",
    "--max-running",
    "8",
)
PROMPTS = 400  # the first run would take ~6 s: it is interrupted after a quarter (~4 s), 2 s of progress.json apart
SERVEFLEET = [PYTHON, "-m", "servefleet.cli.main"]


@dataclass
class Job:
    dest: Path
    fleet: Path
    runs: list[dict]  # each run's generate --json report


def build_job(root: Path) -> Job:
    fleet = root / "fleet.toml"
    servers = []
    for name, extra in (
        ("steady", ["--error-rate", "0.03", "--seed", "5"]),
        ("crashy", ["--crash-after", "60", "--crash-mode", "kill"]),
    ):
        servers.append(f"""
[[servers]]
name = "{name}"
engine = "sim"
model = "sim-7b"
port = {free_port()}
args = {json.dumps([*SIM, *extra])}
""")
    fleet.write_text('[fleet]\nname = "report"\ntimeout = 60\nstall = 30\nsmoke = false\n' + "".join(servers))
    src = root / "in.jsonl"
    src.write_text("".join(json.dumps({"id": f"p{i}", "prompt": f"prompt {i}"}) + "\n" for i in range(PROMPTS)))
    dest = root / "job"
    argv = [
        *SERVEFLEET,
        "generate",
        "-i",
        str(src),
        "-o",
        str(dest),
        "--fleet",
        str(fleet),
        "--max-tokens",
        "8",
        "--max-attempts",
        "1",
        "--shard-rows",
        "40",
        "--json",
    ]
    up = subprocess.run([*SERVEFLEET, "up", str(fleet)], capture_output=True, text=True, timeout=120)
    assert up.returncode == 0, up.stdout + up.stderr
    runs = []
    try:
        first = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

        def restarted_and_a_quarter_done() -> bool:
            assert first.poll() is None, (
                "the first run ended before it could be interrupted: " + first.communicate()[1][-2000:]
            )
            snap = dest / "progress.json"
            if not snap.exists():
                return False
            data = json.loads(snap.read_text())
            crashy = [s for s in data["servers"] if s["name"] == "crashy"]
            return data["done"] >= PROMPTS // 4 and bool(crashy) and crashy[0]["restarts"] >= 1

        try:
            wait_until(
                restarted_and_a_quarter_done,
                timeout=120,
                interval=0.1,
                what="the crashed server back and a quarter of the job done",
            )
            first.send_signal(signal.SIGINT)
            out, err = first.communicate(timeout=120)
        finally:
            if first.poll() is None:
                first.kill()
                first.wait()
        runs.append(json.loads(out))
        assert runs[0]["status"] == "interrupted", err[-2000:]
        again = subprocess.run(argv, capture_output=True, text=True, timeout=180)
        runs.append(json.loads(again.stdout))
        assert runs[1]["resumed"] and runs[1]["status"] in ("complete", "incomplete"), again.stderr[-2000:]
    finally:
        subprocess.run([*SERVEFLEET, "down", "--fleet", str(fleet)], capture_output=True, timeout=120)
    return Job(dest, fleet, runs)
