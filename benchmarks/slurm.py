"""Servers as Slurm jobs: what the scheduler adds to a start, and how often servefleet asks it.

Against a real one-node Slurm (tests/slurm_rig.py; install it with scripts/ci-slurm-setup.sh),
simulated servers (``python -m servefleet.sim``, ``--load-time`` seconds of loading) as the engine:

- **start** — for N = 1 and 4 servers, ``Fleet.up`` on the Slurm host, per server: sbatch -> the
  job running (the job's own first log line, "servefleet: Slurm job N on NODE, port P") ->
  ready. Baseline side by side: the same servers on the local host (``Fleet.up``, no Slurm), launch
  -> ready: the engine's own start time. The scheduler's overhead is the difference.
- **scheduler calls** — every sbatch/squeue/scancel/scontrol/sacct run by any process, counted by
  shims on PATH that log and exec the real command (so the generate subprocess is counted too),
  per server per minute: while ``up`` waits for the servers, while servers wait PENDING (a job
  holds both GPUs) for ``--pending-s`` seconds, and during a ``generate`` over the ready fleet.

The host's ``poll_interval`` (seconds between scheduler questions while waiting) is the default,
5 s, unless ``--poll-interval`` says otherwise.

Run:  .venv/bin/python benchmarks/slurm.py              (~3 minutes on 2 cores)
      .venv/bin/python benchmarks/slurm.py --poll-interval 1 --out benchmarks/results/slurm-poll1.json
Writes benchmarks/results/slurm.json and slurm.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
from servefleet.catalog import State  # noqa: E402
from servefleet.fleet.core import Fleet  # noqa: E402
from slurm_rig import SlurmCluster, slurm_unavailable_reason  # noqa: E402

COMMANDS = ("sbatch", "squeue", "scancel", "scontrol", "sacct")


def write_shims(folder: Path, counter: Path) -> None:
    """One script per scheduler command: append its name to ``counter``, exec the real one."""
    folder.mkdir(parents=True, exist_ok=True)
    for cmd in COMMANDS:
        real = subprocess.run(["sh", "-c", f"command -v {cmd}"], capture_output=True, text=True).stdout.strip()
        shim = folder / cmd
        shim.write_text(f'#!/bin/sh\necho {cmd} >> "{counter}"\nexec {real} "$@"\n')
        shim.chmod(0o755)


def calls(counter: Path) -> dict[str, int]:
    seen: dict[str, int] = {}
    if counter.exists():
        for line in counter.read_text().split():
            seen[line] = seen.get(line, 0) + 1
    return seen


def fleet_file(
    folder: Path, cluster: SlurmCluster | None, n: int, load_s: float, poll: float, extra_host: str = ""
) -> Path:
    host = "local"
    text = '[fleet]\nname = "bench"\ntimeout = 120\nstall = 60\n\n'
    if cluster is not None:
        host = "cluster"
        text += (
            f'[hosts.cluster]\nkind = "slurm"\nworkdir = "{folder}/shared"\npoll_interval = {poll}\ntime = "10"\n'
            f'env = {{ SLURM_CONF = "{cluster.conf}" }}\n{extra_host}\n'
        )
    text += (
        f'[defaults]\nengine = "sim"\nmodel = "sim-m"\nhost = "{host}"\n'
        f'args = ["--load-time", "{load_s}", "--max-running", "8", "--decode-ms", "2", "--decode-ms-per-running", "0"]\n'
    )
    for i in range(n):
        text += f'\n[[servers]]\nname = "s{i}"\nport = {32100 + i}\n'
    path = folder / "fleet.toml"
    path.write_text(text)
    return path


_STARTED = re.compile(rb"servefleet: Slurm job \d+ on ")


async def measure_start(
    folder: Path, cluster: SlurmCluster | None, n: int, load_s: float, poll: float, counter: Path
) -> dict[str, Any]:
    folder.mkdir(parents=True, exist_ok=True)
    fleet = Fleet.load(fleet_file(folder, cluster, n, load_s, poll))
    before = calls(counter)
    job_start: dict[str, float] = {}
    t0 = time.monotonic()

    async def watch_logs() -> None:  # when each job's first line appears (polled every 10 ms)
        logs = {f"s{i}": Path(fleet.binding(fleet.spec.servers[i].host).log_path(f"s{i}")) for i in range(n)}
        while len(job_start) < n:
            for name, log in logs.items():
                if name not in job_start and log.exists() and _STARTED.search(log.read_bytes()):
                    job_start[name] = time.monotonic() - t0
            await asyncio.sleep(0.01)

    watcher = asyncio.create_task(watch_logs()) if cluster is not None else None
    try:
        verdicts = await fleet.up(smoke=False)
        wall = time.monotonic() - t0
        assert all(v.state == State.READY for v in verdicts.values()), verdicts
        ready = {name: v.elapsed_s for name, v in verdicts.items()}  # from each server's launch
        during = {k: v - before.get(k, 0) for k, v in calls(counter).items() if v - before.get(k, 0)}
        return {
            "servers": n,
            "wall_s": round(wall, 3),
            "ready_s": ready,
            "job_running_s": {k: round(v, 3) for k, v in job_start.items()},
            "scheduler_calls": during,
        }
    finally:
        if watcher is not None:
            watcher.cancel()
        await fleet.down()
        await fleet.close()


async def measure_pending(
    folder: Path, cluster: SlurmCluster, n: int, seconds: float, poll: float, counter: Path
) -> dict[str, Any]:
    folder.mkdir(parents=True, exist_ok=True)
    hog = cluster.run(
        "sbatch", "--parsable", "--gres=gpu:2", "--job-name=gpu-hog", "--output=/dev/null", "--wrap", "sleep 600"
    ).stdout.strip()
    fleet = Fleet.load(fleet_file(folder, cluster, n, 0.5, poll, extra_host='gres = "gpu:1"\n'))
    try:
        outcomes = await fleet.start()
        before = calls(counter)
        t0 = time.monotonic()
        verdicts = await fleet.wait(outcomes, timeout_s=seconds, smoke=False)
        wall = time.monotonic() - t0
        assert all(v.state == State.STALLED and "pending" in (v.message or "") for v in verdicts.values()), verdicts
        during = {k: v - before.get(k, 0) for k, v in calls(counter).items() if v - before.get(k, 0)}
        return {
            "servers": n,
            "wall_s": round(wall, 3),
            "scheduler_calls": during,
            "calls_per_server_per_min": round(sum(during.values()) / n / (wall / 60), 2),
        }
    finally:
        await fleet.down()
        await fleet.close()
        cluster.run("scancel", hog, check=False)


async def measure_generate(
    folder: Path, cluster: SlurmCluster, n: int, prompts: int, poll: float, counter: Path
) -> dict[str, Any]:
    folder.mkdir(parents=True, exist_ok=True)
    path = fleet_file(folder, cluster, n, 0.5, poll)
    fleet = Fleet.load(path)
    try:
        assert all(v.state == State.READY for v in (await fleet.up(smoke=False)).values())
        src = folder / "in.jsonl"
        src.write_text("".join(json.dumps({"id": f"p{i}", "prompt": f"prompt {i}"}) + "\n" for i in range(prompts)))
        before = calls(counter)
        t0 = time.monotonic()
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "servefleet.cli.main",
                "generate",
                "-i",
                str(src),
                "-o",
                str(folder / "out"),
                "--fleet",
                str(path),
                "--max-tokens",
                "16",
                "--json",
            ],
            capture_output=True,
            text=True,
            timeout=600,
        )
        wall = time.monotonic() - t0
        report = json.loads(proc.stdout)
        assert report["status"] == "complete", proc.stderr[-2000:]
        during = {k: v - before.get(k, 0) for k, v in calls(counter).items() if v - before.get(k, 0)}
        return {
            "servers": n,
            "prompts": prompts,
            "wall_s": round(wall, 3),
            "scheduler_calls": during,
            "calls_per_server_per_min": round(sum(during.values()) / n / (wall / 60), 2),
        }
    finally:
        await fleet.down()
        await fleet.close()


def summarise(slurm: dict[str, Any], local: dict[str, Any]) -> dict[str, Any]:
    names = sorted(slurm["ready_s"])
    to_ready = [slurm["ready_s"][k] for k in names]
    running = [slurm["job_running_s"].get(k) for k in names]
    engine = [local["ready_s"][k] for k in sorted(local["ready_s"])]
    minutes = slurm["wall_s"] / 60
    return {
        "servers": slurm["servers"],
        "sbatch_to_ready_s_median": round(statistics.median(to_ready), 3),
        "sbatch_to_running_s_median": round(statistics.median([r for r in running if r is not None]), 3)
        if any(running)
        else None,
        "local_launch_to_ready_s_median": round(statistics.median(engine), 3),
        "scheduler_overhead_s": round(statistics.median(to_ready) - statistics.median(engine), 3),
        "ratio_to_local": round(statistics.median(to_ready) / statistics.median(engine), 2),
        "calls_while_waiting": slurm["scheduler_calls"],
        "calls_per_server_per_min_while_waiting": round(
            sum(slurm["scheduler_calls"].values()) / slurm["servers"] / minutes, 2
        ),
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 4])
    parser.add_argument(
        "--load-s", type=float, default=20.0, help="the sim's loading time (long enough for a per-minute rate)"
    )
    parser.add_argument("--poll-interval", type=float, default=5.0)
    parser.add_argument("--pending-s", type=float, default=30.0)
    parser.add_argument("--prompts", type=int, default=6000)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "slurm.json")
    args = parser.parse_args()
    reason = slurm_unavailable_reason()
    if reason:
        sys.exit(reason)
    with tempfile.TemporaryDirectory(prefix="sf-slurm-bench-") as tmp:
        root = Path(tmp)
        counter = root / "calls.log"
        write_shims(root / "shims", counter)
        os.environ["PATH"] = f"{root / 'shims'}:{os.environ['PATH']}"
        cluster = SlurmCluster(root / "cluster").start()
        try:
            starts = []
            for n in args.sizes:
                local = await measure_start(root / f"local-{n}", None, n, args.load_s, args.poll_interval, counter)
                slurm = await measure_start(root / f"slurm-{n}", cluster, n, args.load_s, args.poll_interval, counter)
                starts.append({"summary": summarise(slurm, local), "slurm": slurm, "local": local})
            n = max(args.sizes)
            pending = await measure_pending(root / "pending", cluster, n, args.pending_s, args.poll_interval, counter)
            gen = await measure_generate(root / "generate", cluster, n, args.prompts, args.poll_interval, counter)
            version = cluster.run("sinfo", "--version", check=False).stdout.strip()
        finally:
            cluster.stop()
    result = {
        "benchmark": "slurm",
        "when": datetime.now().isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "slurm": version,
        "settings": {
            "load_s": args.load_s,
            "poll_interval_s": args.poll_interval,
            "pending_s": args.pending_s,
            "prompts": args.prompts,
        },
        "start": starts,
        "pending": pending,
        "generate": gen,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    lines = [
        f"# Slurm hosts: start overhead and scheduler calls ({result['slurm']}, one node, "
        f"sim servers loading {args.load_s:g} s, poll_interval {args.poll_interval:g} s)",
        "",
        "| servers | sbatch -> job running (median s) | sbatch -> ready (median s) | local launch -> ready (median s) "
        "| overhead (s) | ratio | scheduler calls / server / min while waiting |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for s in (x["summary"] for x in starts):
        lines.append(
            f"| {s['servers']} | {s['sbatch_to_running_s_median']} | {s['sbatch_to_ready_s_median']} | {s['local_launch_to_ready_s_median']} | "
            f"{s['scheduler_overhead_s']} | {s['ratio_to_local']} | {s['calls_per_server_per_min_while_waiting']} |"
        )
    lines += [
        "",
        f"- {pending['servers']} servers PENDING for {pending['wall_s']:.0f} s: "
        f"{pending['calls_per_server_per_min']} scheduler calls / server / min ({pending['scheduler_calls']})",
        f"- generate of {gen['prompts']} prompts over {gen['servers']} ready servers ({gen['wall_s']:.0f} s): "
        f"{gen['calls_per_server_per_min']} calls / server / min ({gen['scheduler_calls']})",
        "",
    ]
    md = args.out.with_suffix(".md")
    md.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    asyncio.run(main())
