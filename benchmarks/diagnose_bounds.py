"""`servefleet diagnose LOG --json` on big logs: time and peak memory, before (a baseline source tree,
e.g. main's) and after (this tree), side by side.

The logs are vLLM logs synthesized from real fixture lines (tests/biglog.py): the real start-up of
tests/fixtures/logs/real/vllm_ready.log, then request and metrics lines (and a request-level error
line now and then), with the real fatal block of vllm_kv_too_small.log placed

  start   an earlier launch failed; a launch marker and a healthy launch follow (verdict: ready)
  middle  a crash half-way, then failing requests to the end (verdict: failed, gpu_oom)
  end     a crash at the very end (verdict: failed, gpu_oom)

Each run is a fresh `python -m servefleet.cli.main diagnose LOG --json` (interpreter start and
imports included, as a user sees it); peak RSS is the child's own (os.wait4). Every verdict is
checked against the construction (state, category, the evidence inside the fatal block) and,
where the baseline ran, its evidence line number against the baseline's. The baseline is run only up
to --baseline-max (default 250 MB: it reads the whole file, and needs ~5x the file in memory).
Each log is deleted after use (the disk is shared).

Run:  flock /tmp/servefleet-heavy.lock .venv/bin/python benchmarks/diagnose_bounds.py --baseline-src /work/main/src
      (--sizes 50M,250M,1G --where start,middle,end; --quick: 20M,50M)
Writes benchmarks/results/diagnose_bounds.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from biglog import write_log  # noqa: E402  (test support: the synthesized logs)

RESULTS = ROOT / "benchmarks" / "results" / "diagnose_bounds.json"


def parse_size(text: str) -> int:
    units = {"K": 1024, "M": 1024**2, "G": 1024**3}
    return int(float(text[:-1]) * units[text[-1].upper()]) if text[-1].upper() in units else int(text)


def run_diagnose(src: Path, log: Path, timeout: float) -> dict[str, Any]:
    """One `diagnose --json` in a fresh interpreter with ``src`` first on the path."""
    env = {**os.environ, "PYTHONPATH": str(src), "NO_COLOR": "1"}
    started = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "servefleet.cli.main", "diagnose", str(log), "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    deadline = started + timeout
    while True:  # wait4 for this child's own rusage; poll so that a runaway baseline is stopped
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if time.perf_counter() > deadline:
            proc.kill()
            pid, status, usage = os.wait4(proc.pid, 0)
            return {
                "timed_out": True,
                "wall_s": round(time.perf_counter() - started, 2),
                "peak_rss_mb": round(usage.ru_maxrss / 1024, 1),
            }
        time.sleep(0.01)
    wall = time.perf_counter() - started
    out = proc.stdout.read().decode() if proc.stdout else ""
    err = proc.stderr.read().decode() if proc.stderr else ""
    try:
        verdict = json.loads(out)
    except json.JSONDecodeError:
        verdict = {"error": (out + err)[-500:]}
    return {
        "wall_s": round(wall, 3),
        "peak_rss_mb": round(usage.ru_maxrss / 1024, 1),
        "exit": os.waitstatus_to_exitcode(status),
        "verdict": verdict,
    }


def check(where: str, log_fatal_line: int | None, verdict: dict[str, Any]) -> str:
    """'ok', or what is wrong with the verdict for this construction."""
    if "state" not in verdict:
        return f"no verdict: {verdict.get('error', '')[:120]}"
    if where == "start":
        return "ok" if verdict["state"] == "ready" else f"expected ready, got {verdict['state']} {verdict['category']}"
    ev = verdict.get("evidence") or {}
    if verdict["state"] != "failed" or verdict["category"] != "gpu_oom":
        return f"expected failed gpu_oom, got {verdict['state']} {verdict['category']}"
    if (
        "KV cache is needed" not in ev.get("text", "")
        or not (log_fatal_line or 0) <= ev.get("line_no", 0) < (log_fatal_line or 0) + 200
    ):
        return f"evidence outside the fatal block: line {ev.get('line_no')}"
    return "ok"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="50M,250M,1G")
    ap.add_argument("--where", default="start,middle,end")
    ap.add_argument(
        "--baseline-src",
        type=Path,
        default=None,
        help="src/ of the baseline tree (e.g. /work/main/src); none: after only",
    )
    ap.add_argument("--baseline-label", default="main")
    ap.add_argument(
        "--after-src", type=Path, default=ROOT / "src", help="src/ of the tree measured as 'after' (default: this one)"
    )
    ap.add_argument("--baseline-max", default="250M", help="largest log the baseline is run on")
    ap.add_argument("--baseline-timeout", type=float, default=300.0)
    ap.add_argument("--workdir", type=Path, default=None, help="where the logs are written (deleted after each run)")
    ap.add_argument("--quick", action="store_true", help="sizes 20M,50M")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    sizes = [parse_size(s) for s in ("20M,50M" if args.quick else args.sizes).split(",")]
    wheres = args.where.split(",")
    after_src = args.after_src
    workdir = Path(tempfile.mkdtemp(prefix="diagnose-bounds-", dir=args.workdir))
    rows: list[dict[str, Any]] = []
    try:
        for size in sizes:
            for where in wheres:
                path = workdir / f"vllm-{size >> 20}M-{where}.log"
                t0 = time.perf_counter()
                log = write_log(path, size, where)
                gen_s = time.perf_counter() - t0
                os.sync()
                row: dict[str, Any] = {
                    "size_bytes": log.size,
                    "size_mb": round(log.size / 2**20, 1),
                    "where": where,
                    "generate_s": round(gen_s, 1),
                }
                after = run_diagnose(after_src, path, timeout=600)
                row["after"] = {**after, "check": check(where, log.fatal_line, after.get("verdict", {}))}
                if args.baseline_src is not None and log.size <= parse_size(args.baseline_max):
                    base = run_diagnose(args.baseline_src, path, timeout=args.baseline_timeout)
                    row["baseline"] = {
                        **base,
                        "check": "timed out"
                        if base.get("timed_out")
                        else check(where, log.fatal_line, base.get("verdict", {})),
                    }
                    bv, av = base.get("verdict", {}), after.get("verdict", {})
                    row["same_evidence"] = (bv.get("evidence") or {}).get("line_no") == (av.get("evidence") or {}).get(
                        "line_no"
                    )
                    if not base.get("timed_out"):
                        row["speedup"] = round(base["wall_s"] / after["wall_s"], 1)
                        row["memory_ratio"] = round(base["peak_rss_mb"] / after["peak_rss_mb"], 1)
                rows.append(row)
                path.unlink()
                print(json.dumps({k: v for k, v in row.items()}, default=str)[:400], flush=True)
    finally:
        for leftover in workdir.glob("*"):
            leftover.unlink()
        workdir.rmdir()

    result = {
        "benchmark": "diagnose_bounds",
        "command": "servefleet diagnose LOG --json (fresh interpreter per run)",
        "baseline": args.baseline_label if args.baseline_src else None,
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "load_avg_at_end": os.getloadavg(),
        },
        "rows": [
            {
                **r,
                "after": {k: v for k, v in r["after"].items() if k != "verdict"}
                | {"skipped": r["after"].get("verdict", {}).get("skipped")},
                **(
                    {"baseline": {k: v for k, v in r["baseline"].items() if k != "verdict"}} if "baseline" in r else {}
                ),
            }
            for r in rows
        ],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    table = Table(
        title=f"servefleet diagnose: {args.baseline_label if args.baseline_src else 'baseline'} vs this tree"
    )
    for col in (
        "log",
        "fatal at",
        f"{args.baseline_label} s",
        f"{args.baseline_label} MB RSS",
        "after s",
        "after MB RSS",
        "speed-up",
        "verdict after",
        "verdict baseline",
    ):
        table.add_column(col)
    for r in rows:
        b = r.get("baseline", {})
        table.add_row(
            f"{r['size_mb']:.0f} MB",
            r["where"],
            "timeout" if b.get("timed_out") else str(b.get("wall_s", "-")),
            str(b.get("peak_rss_mb", "-")),
            str(r["after"]["wall_s"]),
            str(r["after"]["peak_rss_mb"]),
            f"{r['speedup']}x" if "speedup" in r else "-",
            r["after"]["check"],
            b.get("check", "not run"),
        )
    Console(width=200).print(table)
    md = args.out.with_suffix(".md")
    with md.open("w") as fh:
        Console(file=fh, width=200, color_system=None).print(table)
    print(f"wrote {args.out} and {md}")


if __name__ == "__main__":
    main()
