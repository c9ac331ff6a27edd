"""monitor.jsonl per generate job: was a slow job the GPU (clock, power, throttle) or the host's CPUs (the engine's
busy-loop process at a full core, steal)? A job spans from its generate process's first line to the next one's (the
first 5 s and last 8 s left out: ramp and tail). Names come from generate's ``--output /tmp/ck/out-NAME`` where the
monitor recorded it, else from ``--names`` in the order the jobs ran. A monitor file appended to by a second
``call7.sh --start`` holds two runs (its clock restarts): ``--run 1`` picks the second.

Usage: monitor_jobs.py MONITOR.jsonl [--run K] [--names a,b,c] [--json]"""

from __future__ import annotations

import argparse
import json
import re
import statistics

SETTLE_S, TAIL_S = 5.0, 8.0
GENERATE = re.compile(r"servefleet\.cli\.main generate")
OUT_NAME = re.compile(r"--output /tmp/ck/out-(\S+)")


def runs(rows: list[dict]) -> list[list[dict]]:
    """The rows split where the monitor's clock starts again."""
    out: list[list[dict]] = [[]]
    for row in rows:
        if out[-1] and row["t"] < out[-1][-1]["t"]:
            out.append([])
        out[-1].append(row)
    return out


def job_starts(rows: list[dict]) -> list[tuple[str, str | None, float]]:
    """(pid, name if recorded, first t) of each generate process, in order."""
    seen: dict[str, tuple[str, str | None, float]] = {}
    for row in rows:
        for key in row["cpu_pct"]:
            pid, _, cmd = key.partition(" ")
            if GENERATE.search(cmd) and pid not in seen:
                name = OUT_NAME.search(cmd)
                seen[pid] = (pid, name.group(1) if name else None, row["t"])
    return sorted(seen.values(), key=lambda s: s[2])


def summarise(rows: list[dict]) -> dict:
    """GPU and CPU figures over one job's rows."""
    gpu = [r["gpu"].split(", ") for r in rows if r["gpu"].count(",") == 5]
    col = lambda i: [float(g[i]) for g in gpu]  # noqa: E731

    def cpu(part: str) -> list[float]:
        return [sum(p for k, p in r["cpu_pct"].items() if part in k) for r in rows]

    steal = [r["steal_pct"] for r in rows if r.get("steal_pct") is not None]
    engine = sorted(cpu("EngineCore"))
    return {
        "seconds": round(rows[-1]["t"] - rows[0]["t"], 1),
        "sm_mhz": round(statistics.mean(col(0))),
        "sm_mhz_min": round(min(col(0))),
        "power_w": round(statistics.mean(col(2))),
        "gpu_util_pct": round(statistics.mean(col(4))),
        "throttled_share": round(sum(g[5] != "0x0000000000000000" for g in gpu) / len(gpu), 2),
        "engine_core_cpu_pct": round(statistics.mean(engine)),
        "engine_core_cpu_p10": round(engine[len(engine) // 10]),
        "api_cpu_pct": round(statistics.mean(cpu("api_server"))),
        "generate_cpu_pct": round(statistics.mean(cpu("cli.main generate"))),
        "steal_pct": round(statistics.mean(steal), 1) if steal else None,
    }


def per_job(rows: list[dict], names: list[str]) -> list[dict]:
    starts = job_starts(rows)
    ends = [t for *_, t in starts[1:]] + [rows[-1]["t"]]
    jobs = []
    for i, ((_, name, t0), t1) in enumerate(zip(starts, ends, strict=True)):
        inside = [r for r in rows if t0 + SETTLE_S <= r["t"] < t1 - TAIL_S]
        if len(inside) < 3:
            continue
        label = name or (names[i] if i < len(names) else f"job{i + 1}")
        jobs.append({"job": label, "from_s": t0, "to_s": t1, **summarise(inside)})
    return jobs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("monitor")
    ap.add_argument("--run", type=int, default=0, help="which run of an appended file (0: the first)")
    ap.add_argument("--names", default="", help="job names in the order they ran, where the monitor lacks them")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with open(args.monitor) as f:
        rows = runs([json.loads(line) for line in f if line.strip()])[args.run]
    jobs = per_job(rows, [n for n in args.names.split(",") if n])
    if args.json:
        print(json.dumps(jobs, indent=1))
        return
    print(
        "| job | s | SM MHz (min) | power W | GPU util % | throttled | EngineCore CPU % (p10) | API CPU % | steal % |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for j in jobs:
        steal = "-" if j["steal_pct"] is None else j["steal_pct"]
        print(
            f"| {j['job']} | {j['seconds']:.0f} | {j['sm_mhz']} ({j['sm_mhz_min']}) | {j['power_w']} | {j['gpu_util_pct']} "
            f"| {j['throttled_share']:.0%} | {j['engine_core_cpu_pct']} ({j['engine_core_cpu_p10']}) | {j['api_cpu_pct']} "
            f"| {steal} |"
        )


if __name__ == "__main__":
    main()
