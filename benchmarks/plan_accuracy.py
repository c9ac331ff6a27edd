"""Does `servefleet plan` predict how long `servefleet generate` takes? Predict, then run and measure.

One script, side by side, on a fleet of simulated servers of known timing:

1. **bench** one sim with ``servefleet bench`` (the CLI, as a user would): a fixed-concurrency
   sweep up to the sim's ``max_running``, output lengths drawn from the same distribution as the
   job's (uniform ``MIN_TOKENS..MAX_TOKENS``, ``ignore_eos``);
2. **predict** with ``servefleet plan --bench RUN.json --prompts 20000 --output-tokens-mean M
   --gpus N``: the makespan of the job on the N servers (one GPU each), before anything is sent;
3. **measure**: ``servefleet generate`` of those 20,000 prompts on the same N sims, timed from the
   outside (process start to exit) and by its own report (``wall_s``: the sending alone);
4. **check** with ``servefleet plan --check OUT --bench RUN.json --report REPORT.json``: the
   comparison the CLI itself makes, for the record.

Target: predicted makespan within 10% of the measured one.

Usage (from the repository root)::

    .venv/bin/python benchmarks/plan_accuracy.py             # 20,000 prompts on 2 sims (~3 min on 2 cores)
    .venv/bin/python benchmarks/plan_accuracy.py --prompts 2000 --out /tmp/pa.json   # a smoke run

Writes ``benchmarks/results/plan_accuracy.json`` and prints a short table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
PY = sys.executable
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from generate_throughput import Sim  # noqa: E402  (the same sim launcher as the throughput benchmark)

# 64 requests decode at once; a step costs 8 ms + 0.1 ms per running request: 64 tokens per 14.4 ms
# at the cap, ~4,400 output tok/s per server. No prefill cost (prompts are a few tokens).
SIM = {"max_running": 64, "decode_ms": 8.0, "decode_ms_per_running": 0.1, "prefill_ms_per_1k_tokens": 0.0}
SERVERS = 2
MIN_TOKENS, MAX_TOKENS = 16, 80
BENCH_CONCURRENCY = "1,4,16,32,48,64"
BENCH_SECONDS = 5.0


def cli(*args: str, timeout: float = 900) -> tuple[dict[str, Any], float]:
    """Run ``servefleet ARGS --json``; (parsed stdout, seconds from exec to exit)."""
    t0 = time.monotonic()
    proc = subprocess.run(
        [PY, "-m", "servefleet.cli.main", *args, "--json"], capture_output=True, text=True, timeout=timeout
    )
    took = time.monotonic() - t0
    if proc.returncode != 0:
        raise RuntimeError(
            f"servefleet {args[0]} exited {proc.returncode}:\n{proc.stderr[-3000:]}\n{proc.stdout[-2000:]}"
        )
    return json.loads(proc.stdout), took


def make_job(path: Path, n: int, seed: int = 11) -> float:
    """Write the job (ignore_eos: each answer is exactly max_tokens long); returns the mean output length."""
    rng = random.Random(seed)
    total = 0
    with open(path, "w") as f:
        for i in range(n):
            m = rng.randint(MIN_TOKENS, MAX_TOKENS)
            total += m
            f.write(
                json.dumps({"id": f"p{i}", "prompt": f"Write about item {i}.", "max_tokens": m, "ignore_eos": True})
                + "\n"
            )
    return total / n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=20_000)
    ap.add_argument("--servers", type=int, default=SERVERS)
    ap.add_argument("--out", type=Path, default=RESULTS / "plan_accuracy.json")
    args = ap.parse_args()

    mid, spread = (MIN_TOKENS + MAX_TOKENS) / 2, (MAX_TOKENS - MIN_TOKENS) / (MIN_TOKENS + MAX_TOKENS)
    with tempfile.TemporaryDirectory(prefix="plan-accuracy-") as tmp:
        work = Path(tmp)
        sims = [Sim(work, f"sim{i}", **SIM) for i in range(args.servers)]
        try:
            for s in sims:
                s.wait_ready()
            # 1. bench one server of the fleet
            run_path = work / "run.json"
            cli(
                "bench",
                "--url",
                sims[0].url,
                "--label",
                "sim-64",
                "-c",
                BENCH_CONCURRENCY,
                "--duration",
                str(BENCH_SECONDS),
                "--input-len",
                "8",
                "--output-len",
                str(int(mid)),
                "--output-len-range",
                f"{spread:.4f}",
                "--api",
                "completions",
                "--no-stream",
                "--ignore-eos",
                "-o",
                str(run_path),
            )
            bench = json.loads(run_path.read_text())
            curve = [(p["concurrency"], round(p["output_tokens_per_s"], 1)) for p in bench["points"]]

            # 2. predict, before anything of the job is sent
            job = work / "job.jsonl"
            mean = make_job(job, args.prompts)
            plan, _ = cli(
                "plan",
                "--bench",
                str(run_path),
                "--prompts",
                str(args.prompts),
                "--output-tokens-mean",
                f"{mean:.3f}",
                "--gpus",
                str(args.servers),
            )
            row = plan["plans"][str(args.servers)][0]
            predicted = row["makespan_s"]

            # 3. measure: the real generate on the same fleet
            out = work / "out"
            urls = [a for s in sims for a in ("--url", s.url)]
            report, exec_s = cli("generate", "-i", str(job), "-o", str(out), *urls)
            if report["status"] != "complete":
                raise RuntimeError(f"generate ended {report['status']}: {report.get('message')}")
            report_path = work / "report.json"
            report_path.write_text(json.dumps(report))

            # 4. the CLI's own check
            check, _ = cli("plan", "--check", str(out), "--bench", str(run_path), "--report", str(report_path))
        finally:
            for s in sims:
                s.stop()

    measured = report["wall_s"]
    # For the record: the same plan from the points' raw tokens/s (each point's own end-of-point drain
    # left in, as the planner did before it inverted them -- see servefleet.plan.planner.steady_curve).
    from servefleet.plan.planner import Curve, JobSpec, simulate_makespan

    raw_curve = Curve(tuple(c for c, _ in curve), tuple(t for _, t in curve))
    raw_predicted = simulate_makespan(raw_curve, row["best_concurrency"], args.servers, JobSpec(args.prompts, mean))
    result = {
        "benchmark": "plan_accuracy",
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "command": " ".join([".venv/bin/python", "benchmarks/plan_accuracy.py", *sys.argv[1:]]),
        "sim": SIM,
        "servers": args.servers,
        "bench": {"concurrency": BENCH_CONCURRENCY, "seconds_per_point": BENCH_SECONDS, "curve_output_tps": curve},
        "job": {
            "prompts": args.prompts,
            "output_tokens": f"uniform {MIN_TOKENS}..{MAX_TOKENS}",
            "output_tokens_mean": round(mean, 3),
        },
        "prediction": {
            "concurrency": row["best_concurrency"],
            "replica_tps": round(row["replica_tps"], 1),
            "makespan_s": round(predicted, 2),
            "notes": row["notes"],
        },
        "measured": {
            "wall_s": measured,
            "exec_to_exit_s": round(exec_s, 2),
            "startup_s": report["startup_s"],
            "output_tokens_per_s": report["output_tokens_per_s"],
            "completion_tokens": report["completion_tokens"],
            "servers": {
                s["name"]: {"tok_s": s["output_tokens_per_s"], "final_concurrency": s["final_concurrency"]}
                for s in report["servers"]
            },
        },
        "raw_points_prediction": {
            "makespan_s": round(raw_predicted, 2),
            "error_pct": round((raw_predicted - measured) / measured * 100, 2),
        },
        "ratio_predicted_over_measured": round(predicted / measured, 4),
        "error_pct": round((predicted - measured) / measured * 100, 2),
        "within_10pct": abs(predicted - measured) <= 0.1 * measured,
        "check": check,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")

    print(f"bench curve (concurrency, output tok/s of one sim): {curve}")
    print(f"{'':<26}{'predicted':>12}{'measured':>12}{'error':>9}")
    for name, m in check["metrics"].items():
        print(f"{name:<26}{m['predicted']:>12,.1f}{m['measured']:>12,.1f}{m['error_pct']:>+8.1f}%")
    print(
        f"makespan (plan before the run vs generate's wall_s): {predicted:,.1f} s vs {measured:,.1f} s, "
        f"ratio {result['ratio_predicted_over_measured']:.3f}, error {result['error_pct']:+.1f}% "
        f"({'within' if result['within_10pct'] else 'NOT within'} 10%)"
    )
    print(
        f"(from the bench points' raw tok/s, without taking out each point's own drain: {raw_predicted:,.1f} s, "
        f"{result['raw_points_prediction']['error_pct']:+.1f}%)"
    )
    print(f"wrote {args.out}")
    return 0 if result["within_10pct"] else 1


if __name__ == "__main__":
    sys.exit(main())
