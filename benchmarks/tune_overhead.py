"""How much of `servefleet tune`'s wall time is not measuring? Launches, verification, stops, the
sample and the ranking, as a share of the whole, on the sim.

`servefleet tune` is run as a user would (the CLI, a subprocess) over three sim candidates -- plain,
speculative, and a narrow one -- on a sample of a variable-length prompt file, with two start-up times
(the sim's ``--load-time``) and two sample sizes. From its ``--json``: ``wall_s`` (the search, from the
first launch to the ranking), ``measured_s`` (inside measured bench points), and each candidate's
time to ready. Overhead = wall - measured; of which start-up (time to ready, the engine's own) and the
rest (servefleet's: verification after ready, bench discovery and negotiation between points, stops).
The process's own wall time (python start, the input sampled) is reported beside it.

Usage (from the repository root)::

    .venv/bin/python benchmarks/tune_overhead.py                  # ~3 min on 2 cores
    .venv/bin/python benchmarks/tune_overhead.py --quick          # one case

Writes ``benchmarks/results/tune_overhead.json`` and ``tune_overhead.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
SERVEFLEET = [sys.executable, "-m", "servefleet.cli.main"]
SIM = [
    "--style",
    "vllm",
    "--max-running-requests",
    "64",
    "--max-total-tokens",
    "6000",
    "--prefill-ms-per-1k-tokens",
    "2",
]
CANDIDATES = (
    ("plain", []),
    ("spec", ["--tokens-per-step", "4", "--spec-ms-per-running", "1.0"]),
    ("narrow", ["--max-running-requests", "16"]),
)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _files(root: Path, load_time: float) -> tuple[Path, Path, Path]:
    fleet = root / "base.toml"
    fleet.write_text(
        f'[fleet]\nname = "ovh"\ntimeout = 120\nstall = 60\n\n[defaults]\nengine = "sim"\nmodel = "sim-7b"\n'
        f"python = {json.dumps(sys.executable)}\nargs = {json.dumps(['--load-time', str(load_time), *SIM])}\n\n"
        f'[[servers]]\nname = "s"\nport = {_port()}\n'
    )
    space = root / "space.toml"
    space.write_text("".join(f'[[candidate]]\nname = "{n}"\nargs = {json.dumps(a)}\n\n' for n, a in CANDIDATES))
    rng = random.Random(3)
    job = root / "job.jsonl"
    job.write_text(
        "".join(
            json.dumps(
                {"id": i, "prompt": " ".join(["word"] * rng.randint(20, 400)), "max_tokens": rng.randint(16, 96)}
            )
            + "\n"
            for i in range(20000)
        )
    )
    return fleet, space, job


def one(load_time: float, sample: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="tune-ovh-") as tmp:
        root = Path(tmp)
        fleet, space, job = _files(root, load_time)
        t0 = time.monotonic()
        proc = subprocess.run(
            [
                *SERVEFLEET,
                "tune",
                "--fleet",
                str(fleet),
                "--space",
                str(space),
                "--input",
                str(job),
                "--sample",
                str(sample),
                "--out",
                str(root / "out"),
                "--no-plot",
                "--json",
            ],
            capture_output=True,
            text=True,
            timeout=900,
            env={**os.environ, "PYTHONPATH": str(REPO / "src")},
        )
        process_s = time.monotonic() - t0
        if proc.returncode != 0:
            raise SystemExit(f"tune failed ({proc.returncode}): {proc.stderr[-2000:]}")
        doc = json.loads(proc.stdout)
    ready = sum(c["time_to_ready_s"] or 0.0 for c in doc["candidates"])
    wall, measured = doc["wall_s"], doc["measured_s"]
    return {
        "load_time_s": load_time,
        "sample": sample,
        "candidates": len(doc["candidates"]),
        "outcomes": {c["name"]: c["outcome"] for c in doc["candidates"]},
        "winner": doc["winner"],
        "points": sum(len(c["concurrencies"]) for c in doc["candidates"]),
        "process_s": round(process_s, 2),
        "wall_s": round(wall, 2),
        "measured_s": round(measured, 2),
        "overhead_s": round(wall - measured, 2),
        "overhead_share": round((wall - measured) / wall, 3),
        "startup_s": round(ready, 2),
        "servefleet_overhead_s": round(wall - measured - ready, 2),
        "servefleet_overhead_share": round((wall - measured - ready) / wall, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one case only")
    parser.add_argument("--out", type=Path, default=RESULTS / "tune_overhead.json")
    args = parser.parse_args()
    cases = [(0.2, 200)] if args.quick else [(0.2, 200), (0.2, 1000), (5.0, 200), (5.0, 1000)]
    rows = [one(lt, n) for lt, n in cases]
    doc = {
        "benchmark": "tune_overhead",
        "host": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "baseline": "the tune's own measured time (inside bench points)",
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    lines = [
        "| sim load time | sample | points | wall s | measured s | overhead | of which start-up s | servefleet's own |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(
            f"| {r['load_time_s']:g} s | {r['sample']} | {r['points']} | {r['wall_s']:.1f} | {r['measured_s']:.1f} | "
            f"{100 * r['overhead_share']:.0f} % | {r['startup_s']:.1f} | {r['servefleet_overhead_s']:.1f} s "
            f"({100 * r['servefleet_overhead_share']:.0f} %) |"
        )
    table = "\n".join(lines)
    args.out.with_suffix(".md").write_text(
        "# servefleet tune: overhead on the sim (benchmarks/tune_overhead.py)\n\n" + table + "\n"
    )
    print(table)


if __name__ == "__main__":
    main()
