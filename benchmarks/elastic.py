"""The elastic job (generate/membership.py) on local simulated servers.

1. Idle server-seconds at the tail, with and without ``--release-tail``, on a fleet of 8: 8 x 60
   short prompts, then 6 long ones (~6 s each) at the end of the input. A server is held from its
   last busy moment (the end of the last timeline bucket with a request in flight) until it is
   released (the release event) or the job ends; the sum over servers is the idle time the tail
   costs. Read from the job's own timeline (1 s buckets: +-1 s per server).
2. Time from "ready" to the first request of a server that joins a running job: ``up --only b``
   from another process while the job runs on ``a``; "ready" is b's first 200 on /health, "first
   request" the first scrape of its /metrics with more than one request running (the job sends
   four at once; the verification's smoke request is one), both polled every 10 ms here.

    PYTHONPATH=src python benchmarks/elastic.py [--trials 3]

3. The width through a handover (``--handover-margin``), on the real one-node Slurm of the tests
   (tests/slurm_rig.py; needs root and Slurm, skipped otherwise): one server whose job has a
   1-minute limit (Slurm's smallest) and loads for 3 s, a 50 s margin; the servers in service per
   1 s bucket of the job's timeline, and when each successor was submitted, joined and the old
   one drained.

Writes benchmarks/results/elastic.json and prints a short table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable
CLI = [PY, "-m", "servefleet.cli.main"]
RESULTS = Path(__file__).resolve().parent / "results" / "elastic.json"
FAST = ["--load-time", "0", "--decode-ms-per-running", "0", "--prefill-ms-per-1k-tokens", "0", "--max-running", "8"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fleet_file(folder: Path, servers: dict[str, list[str]]) -> Path:
    text = '[fleet]\nname = "bench-el"\ntimeout = 120\nstall = 60\n'
    for name, args in servers.items():
        text += (
            f'\n[[servers]]\nname = "{name}"\nengine = "sim"\nmodel = "sim-7b"\nport = {free_port()}\n'
            f"args = {json.dumps([*FAST, *args])}\n"
        )
    path = folder / "fleet.toml"
    path.write_text(text)
    return path


def cli(*args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(
            f"servefleet {' '.join(args)}: exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
        )
    return proc


def prompts(path: Path, short: int, long: int, long_tokens: int) -> Path:
    with open(path, "w") as f:
        for i in range(short):
            f.write(json.dumps({"id": f"s{i}", "prompt": f"short {i}", "max_tokens": 4}) + "\n")
        for i in range(long):
            f.write(json.dumps({"id": f"l{i}", "prompt": f"long {i}", "max_tokens": long_tokens}) + "\n")
    return path


def generate(src: Path, out: Path, fleet: Path, *extra: str) -> subprocess.Popen:
    argv = [
        *CLI,
        "generate",
        "-i",
        str(src),
        "-o",
        str(out),
        "--fleet",
        str(fleet),
        "--concurrency",
        "4",
        "--json",
        "--shard-rows",
        "50",
        "--shard-seconds",
        "0.5",
        *extra,
    ]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen) -> dict:
    stdout, stderr = proc.communicate(timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"generate: exit {proc.returncode}\n{stderr[-3000:]}")
    return json.loads(stdout)


# ---- 1. the tail ---------------------------------------------------------------------------------


def idle_at_tail(out: Path) -> dict:
    from servefleet.generate.tail import (
        tail_of_timeline,
    )  # the report's own reading (servefleet report --json: "tail")

    tail = tail_of_timeline(json.loads(next((out / "timeline").glob("*.json")).read_text()))
    return {
        "idle_server_s": tail["idle_server_s"],
        "per_server": {n: p["idle_s"] for n, p in tail["per_server"].items()},
        "job_s": tail["job_s"],
        "released": tail["released"],
        "released_server_s": tail["released_server_s"],
    }


def tail_trial(release: bool) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        fleet = fleet_file(folder, {f"s{i}": ["--decode-ms", "5"] for i in range(8)})
        cli("up", str(fleet))
        try:
            src = prompts(folder / "in.jsonl", 8 * 60, 6, 1200)
            out = folder / "out"
            report = finish(
                generate(src, out, fleet, *(("--release-tail", "--watch-interval", "0.5") if release else ()))
            )
            assert report["status"] == "complete", report
            return {"release_tail": release, **idle_at_tail(out), "wall_s": report["wall_s"]}
        finally:
            subprocess.run([*CLI, "down", "--fleet", str(fleet)], capture_output=True, timeout=300)


# ---- 2. ready -> first request -------------------------------------------------------------------


async def watch_join(port: int, deadline_s: float) -> tuple[float | None, float | None]:
    """(first /health 200, first /metrics scrape with > 1 request running), time.monotonic()."""
    ready = first = None
    base = f"http://127.0.0.1:{port}"
    end = time.monotonic() + deadline_s
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as http:
        while time.monotonic() < end and first is None:
            try:
                if ready is None:
                    async with http.get(base + "/health") as r:
                        if r.status == 200:
                            ready = time.monotonic()
                else:
                    async with http.get(base + "/metrics") as r:
                        text = await r.text()
                    running = [
                        float(line.split()[-1])
                        for line in text.splitlines()
                        if line.startswith("vllm:num_requests_running")
                    ]
                    if running and max(running) > 1:
                        first = time.monotonic()
            except (aiohttp.ClientError, OSError, TimeoutError):
                pass
            await asyncio.sleep(0.01)
    return ready, first


def join_trial(interval_s: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        fleet = fleet_file(folder, {"a": ["--decode-ms", "30"], "b": ["--decode-ms", "30"]})
        port_b = int(fleet.read_text().split('name = "b"')[1].split("port = ")[1].split("\n")[0])
        cli("up", str(fleet), "--only", "a")
        try:
            src = prompts(folder / "in.jsonl", 600, 0, 4)
            out = folder / "out"
            job = generate(src, out, fleet, "--watch-interval", str(interval_s))
            while not (out / "shards").is_dir() or not list((out / "shards").glob("part-*")):
                if job.poll() is not None:
                    raise RuntimeError(job.communicate()[1][-3000:])
                time.sleep(0.05)
            up = subprocess.Popen(
                [*CLI, "up", str(fleet), "--only", "b"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
            ready, first = asyncio.run(watch_join(port_b, 60))
            up.wait(120)
            report = finish(job)
            assert report["status"] == "complete" and report["membership"]["joins"] == 1, report
            return {
                "watch_interval_s": interval_s,
                "ready_to_first_request_s": None if ready is None or first is None else round(first - ready, 3),
                "bound_s": interval_s + 1.0,
            }
        finally:
            subprocess.run([*CLI, "down", "--fleet", str(fleet)], capture_output=True, timeout=300)


# ---- 3. the width through a handover (real Slurm) -------------------------------------------------


def handover_trial() -> dict | None:
    sys.path.insert(0, str(REPO / "tests"))
    from slurm_rig import SlurmCluster, slurm_unavailable_reason

    if (why := slurm_unavailable_reason()) is not None:
        print(f"handover: skipped ({why})")
        return None
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        cluster = SlurmCluster(folder / "slurm").start()
        try:
            sim = [
                "--load-time",
                "3",
                "--max-running",
                "4",
                "--decode-ms",
                "20",
                "--decode-ms-per-running",
                "0",
                "--prefill-ms-per-1k-tokens",
                "0",
            ]
            fleet = folder / "fleet.toml"
            fleet.write_text(
                f'[fleet]\nname = "bench-ho"\ntimeout = 120\nstall = 60\n\n[hosts.minute]\nkind = "slurm"\nworkdir = "{folder / "shared"}"\n'
                f'poll_interval = 0.5\ntime = "1"\nenv = {{ SLURM_CONF = "{cluster.conf}" }}\n\n[[servers]]\nname = "w"\ncount = 1\n'
                f'engine = "sim"\nmodel = "sim-m"\nhost = "minute"\nport = 31300\nargs = {json.dumps(sim)}\n'
            )
            cli("up", str(fleet))
            src = prompts(folder / "in.jsonl", 1200, 0, 4)
            out = folder / "out"
            report = finish(
                generate(src, out, fleet, "--handover-margin", "50s", "--watch-interval", "0.5", "--down-after")
            )
            tl = json.loads(next((out / "timeline").glob("*.json")).read_text())
            marks = [
                {"t": m["t"], "event": m["text"]}
                for m in tl["messages"]["items"]
                if any(k in m["text"] for k in ("successor", ": joined at", "handed over to"))
            ]
            serving = tl["serving"]
            return {
                "bucket_s": tl["bucket_s"],
                "serving": serving,
                "min_serving": min(serving[1:-1] or serving),
                "events": marks,
                "handovers": report["membership"].get("handovers", 0),
                "wall_s": report["wall_s"],
            }
        finally:
            subprocess.run([*CLI, "down", "--fleet", str(folder / "fleet.toml")], capture_output=True, timeout=300)
            cluster.stop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--only", choices=("tail", "join", "handover"), action="append")
    args = ap.parse_args()
    parts = set(args.only or ("tail", "join", "handover"))
    tails = [tail_trial(release) for _ in range(args.trials) for release in (False, True)] if "tail" in parts else []
    joins = [join_trial(interval) for _ in range(args.trials) for interval in (1.0, 2.0)] if "join" in parts else []
    handover = handover_trial() if "handover" in parts else None
    old = json.loads(RESULTS.read_text()) if RESULTS.is_file() else {}
    result = {
        "benchmark": "elastic",
        "trials": args.trials,
        "tail": tails or old.get("tail", []),
        "join": joins or old.get("join", []),
        "handover": handover or old.get("handover"),
        "python": sys.version.split()[0],
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=1) + "\n")
    print("tail (fleet of 8 sim servers, 6 long prompts at the end)")
    print(f"{'release_tail':>12} {'idle server-s':>14} {'given back s':>13} {'job s':>7} {'released':>9}")
    for t in result["tail"]:
        back = t.get("released_server_s")  # results before the report read the tail have none
        print(
            f"{t['release_tail']!s:>12} {t['idle_server_s']:>14.1f} {'-' if back is None else f'{back:.1f}':>13} {t['job_s']:>7.1f} {t['released']:>9}"
        )
    print("\njoin: ready -> first request")
    print(f"{'watch interval s':>16} {'ready->first s':>15} {'bound s':>8}")
    for j in result["join"]:
        print(f"{j['watch_interval_s']:>16.1f} {j['ready_to_first_request_s']!s:>15} {j['bound_s']:>8.1f}")
    handover = result["handover"]
    if handover:
        print(
            f"\nhandover (1-minute Slurm jobs, 50 s margin): {handover['handovers']} handovers in {handover['wall_s']:.0f} s, "
            f"servers in service per {handover['bucket_s']:g} s: min {handover['min_serving']}"
        )
        print(" ".join(f"{v:g}" for v in handover["serving"]))
        for e in handover["events"]:
            print(f"{e['t']:7.1f}s {e['event']}")


if __name__ == "__main__":
    main()
