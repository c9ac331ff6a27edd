"""What watching a job costs the job: the recorder's work per tick against the coordinator's own budget.

While `generate` sends, its recorder (servefleet/generate/recorder.py) samples JobStats into the
bounded time series once a second, encodes progress.json every 2 s and the timeline every 10 s.
This measures, for fleets of 1, 16, 64 and 256 servers with the timeline full (480 buckets, the
worst case), the CPU time of one sample, one progress snapshot and one timeline encoding, the bytes
written, and the share of one core the recorder takes (sample + snapshot/2 + timeline/10 per second),
beside the baseline of one completion's coordinator cost (0.17-0.18 ms, benchmarks/results/coordinator_ceiling.md):
how many completions' worth of CPU the recorder spends each second.

Run:  .venv/bin/python benchmarks/job_record_cost.py   (--servers 1,16,64,256 --repeats 200)
Writes benchmarks/results/job_record_cost.{json,md} and prints the table.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from servefleet.generate.recorder import snapshot  # noqa: E402 - after the path is set
from servefleet.generate.stats import JobStats, ServerStats  # noqa: E402 - after the sys.path.insert above
from servefleet.generate.timeline import MAX_BUCKETS, Timeline  # noqa: E402 - after the sys.path.insert above

COMPLETION_CPU_MS = 0.175  # coordinator_ceiling.md: one completion's CPU in the coordinator


def fleet(n: int) -> JobStats:
    stats = JobStats(total=10**6)
    for i in range(n):
        stats.servers[f"server-{i:03d}"] = ServerStats(f"server-{i:03d}", f"http://10.0.0.{i % 250}:8000", limit=256)
    for i in range(200):
        stats.event(f"server-{i % n:03d}: concurrency 256 -> 240 (search: step down)")
    return stats


def advance(stats: JobStats, now: float) -> None:
    for s in stats.servers.values():
        s.completion_tokens += 19_000
        s.requests += 10
        s.in_flight = 250
        s.meter.add(19_000, now)
    stats.done += 10 * len(stats.servers)
    stats.completion_tokens += 19_000 * len(stats.servers)


def measure(n: int, repeats: int) -> dict:
    stats = fleet(n)
    tl = Timeline(started=0.0)
    t = 0.0
    while tl._n < MAX_BUCKETS - 1:  # fill the series: the timeline's largest encoding
        t += tl.bucket_s
        advance(stats, t)
        tl.sample(t, stats)
    sample_s = []
    for _ in range(repeats):
        t += 1.0
        advance(stats, t)
        t0 = time.perf_counter()
        tl.sample(t, stats)
        sample_s.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    for _ in range(repeats):
        snap = json.dumps(
            snapshot(stats, run_id="r", status="running", now=t, started=0.0, interval_s=2.0), separators=(",", ":")
        ).encode()
    snap_s = (time.perf_counter() - t0) / repeats
    reps = max(5, repeats // 20)
    t0 = time.perf_counter()
    for _ in range(reps):
        frozen = tl.frozen()
    copy_s = (time.perf_counter() - t0) / reps
    t0 = time.perf_counter()
    for _ in range(reps):
        series = json.dumps(frozen.to_json(run_id="r"), separators=(",", ":")).encode()
    series_s = (time.perf_counter() - t0) / reps
    sample = sorted(sample_s)[len(sample_s) // 2]
    on_loop = sample + snap_s / 2 + copy_s / 10  # per second, on the event loop
    per_s = on_loop + series_s / 10  # and the timeline's encoding, in a thread
    return {
        "servers": n,
        "buckets": tl._n,
        "bucket_s": tl.bucket_s,
        "sample_ms": round(sample * 1e3, 4),
        "snapshot_ms": round(snap_s * 1e3, 4),
        "timeline_copy_ms": round(copy_s * 1e3, 3),
        "timeline_encode_ms": round(series_s * 1e3, 3),
        "snapshot_bytes": len(snap),
        "timeline_bytes": len(series),
        "longest_loop_pause_ms": round(max(sample, snap_s, copy_s) * 1e3, 3),
        "core_share_pct": round(per_s * 100, 4),
        "completions_per_s_equivalent": round(per_s * 1e3 / COMPLETION_CPU_MS, 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--servers", default="1,16,64,256")
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/job_record_cost.json"))
    args = ap.parse_args()
    rows = [measure(int(n), args.repeats) for n in args.servers.split(",")]
    result = {
        "benchmark": "job_record_cost",
        "python": platform.python_version(),
        "machine": platform.machine(),
        "baseline": f"one completion's coordinator CPU, {COMPLETION_CPU_MS} ms (coordinator_ceiling.md)",
        "rows": rows,
    }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    lines = [
        "| servers | sample ms | snapshot ms | timeline copy ms (loop) | timeline encode ms (thread) | snapshot B | timeline B "
        "| longest loop pause ms | % of a core | = completions/s |",
        "|" + " --- |" * 10,
    ]
    for r in rows:
        lines.append(
            f"| {r['servers']} | {r['sample_ms']:.3f} | {r['snapshot_ms']:.3f} | {r['timeline_copy_ms']:.2f} | "
            f"{r['timeline_encode_ms']:.1f} | {r['snapshot_bytes']:,} | {r['timeline_bytes']:,} | "
            f"{r['longest_loop_pause_ms']:.2f} | {r['core_share_pct']:.3f} | {r['completions_per_s_equivalent']:.1f} |"
        )
    table = "\n".join(lines)
    Path(args.out).with_suffix(".md").write_text(
        "# What watching a job costs (benchmarks/job_record_cost.py)\n\n"
        f"Timeline full ({MAX_BUCKETS} buckets); per second: one sample, half a snapshot, a tenth of a timeline. "
        f"Baseline: {result['baseline']}.\n\n{table}\n"
    )
    print(table)


if __name__ == "__main__":
    main()
