"""Issue 25's targets from one call7 run (its an-*.json, analyse.py's lines): each auto job (fleet, url, bench) of a
work against that work's fixed job, or against the mean of its fixed runs where fixed-again ran too (a bracket: the
H100 hosts' rate moved 27 % between two runs of one fixed job). A job cut by its timeout is compared by its rate over
the time it ran. Targets: within 5 % of fixed, re-queued at most 1 %, time to 90 % at most 10 s.

Usage: targets.py DIR [--json]   (DIR: call7.tgz unpacked)"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics

WITHIN, REQUEUED, T90_S = 0.05, 0.01, 10.0


def load(folder: pathlib.Path) -> dict[str, dict]:
    return {p.stem.removeprefix("an-"): json.loads(p.read_text()) for p in sorted(folder.glob("an-*.json"))}


def rows(jobs: dict[str, dict]) -> list[dict]:
    out = []
    for work in ("uni", "var"):
        fixed = [jobs[n]["output_tokens_per_s"] for n in (f"{work}-fixed", f"{work}-fixed-again") if n in jobs]
        base = statistics.mean(fixed) if fixed else None
        for mode in ("fixed", "fixed-again", "fleet", "url", "bench"):
            job = jobs.get(f"{work}-{mode}")
            if job is None:
                continue
            tps = job["output_tokens_per_s"]
            ratio = tps / base if base else None
            auto = not mode.startswith("fixed")
            met = (
                auto
                and ratio is not None
                and ratio >= 1 - WITHIN
                and job["requeued_share"] <= REQUEUED
                and job.get("t90_s") is not None
                and job["t90_s"] <= T90_S
            )
            out.append(
                {
                    "job": f"{work}-{mode}",
                    "status": job["status"],
                    "tok_s": round(tps),
                    "vs_fixed": round(ratio, 3) if ratio else None,
                    "fixed_runs": len(fixed),
                    "requeued_share": job["requeued_share"],
                    "t90_s": job.get("t90_s"),
                    "met": met if auto else None,
                }
            )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=pathlib.Path)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    table = rows(load(args.folder))
    if args.json:
        print(json.dumps(table, indent=1))
        return
    print("| job | status | tok/s | vs fixed (runs) | re-queued | time to 90 % | target |")
    print("|---|---|---|---|---|---|---|")
    for r in table:
        vs = "-" if r["vs_fixed"] is None else f"{r['vs_fixed']:.3f} ({r['fixed_runs']})"
        target = {True: "met", False: "missed", None: ""}[r["met"]]
        print(
            f"| {r['job']} | {r['status']} | {r['tok_s']:,} | {vs} | {r['requeued_share']:.2%} | {r['t90_s']} s "
            f"| {target} |"
        )


if __name__ == "__main__":
    main()
