"""`servefleet generate` against a fleet of four simulated servers of known capacity.

Three questions, one run:

1. **Throughput.** The same job (``--prompts`` prompts, ``ignore_eos``, output lengths drawn
   uniformly from 16..128 tokens, so requests end at different times as they do with real EOS) is
   sent three ways to four sims (``max_running`` 32, 20 ms + 0.1 ms/request decode steps):

   * ``servefleet``        -- ``servefleet generate --url ... x4`` (the CLI, in a subprocess);
   * ``openai-semaphore``  -- a plain ``openai.AsyncOpenAI`` script: one client per server, prompts
     assigned round-robin, a global ``asyncio.Semaphore`` of the fleet's total capacity, ``gather``;
   * ``batch-and-gather``  -- the same clients, batches of the fleet's capacity, each batch awaited
     before the next is sent.

   Each is measured from the servers' own counters (``vllm:generation_tokens_total``): sustained
   output tokens/s between 10 % and 90 % of the job's tokens (ramp-up and the drain of the last
   requests are out) and end to end. The fleet's theoretical maximum is
   ``4 x servefleet.sim.theory.theoretical_output_tokens_per_s(config, max_running)``: with one
   token per step and no prefill cost, a full batch yields ``max_running`` tokens per step whatever
   the output lengths.

2. **Peak memory** of ``servefleet generate`` for a ``--rss-lines`` (1,000,000) line input, sent in
   full to four instant sims (no time model: answers as fast as HTTP allows). Peak RSS is the
   process's own high-water mark (``VmHWM``, in its report), checked by sampling it from outside.

3. **Resume time** of a ``--rss-lines`` job of which 90 % is committed: the destination is made
   the way a killed run leaves it (job manifest and 900 committed shards of 1,000 rows, written
   through the ledger), then the same command is run again. Measured: from ``exec`` to the first
   new request arriving at a server (polled at the sims), the run's own ``startup_s``, and the wall
   time of the whole resumed run (100,000 requests). Also with the input touched (mtime changed,
   same bytes: one hashing read instead of the pre-pass).

4. **Against the best bench point** (section ``vs-bench``, :mod:`generate_vs_bench`): generate
   against the best non-streaming ``bench`` point of the same server and workload -- the sim, or
   real vLLM-CPU (``--vs-server vllm``) -- for each way the concurrency limit is found (search,
   capacity, bench): the sustained fraction of the bench point and the ramp time.

Usage (from the repository root)::

    .venv/bin/python benchmarks/generate_throughput.py            # everything (~20-30 min on 2 cores)
    .venv/bin/python benchmarks/generate_throughput.py --quick    # small sizes, a smoke run
    .venv/bin/python benchmarks/generate_throughput.py --sections vs-bench --vs-server sim vllm   # generate vs bench

Writes ``benchmarks/results/generate_throughput.json`` and prints a table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
PY = sys.executable

sys.path.insert(0, str(REPO / "src"))
from servefleet.sim.config import SimConfig  # noqa: E402 - after the sys.path.insert above
from servefleet.sim.theory import theoretical_output_tokens_per_s  # noqa: E402 - after the sys.path.insert above

SIM_TIMED = {"max_running": 32, "decode_ms": 20.0, "decode_ms_per_running": 0.1, "prefill_ms_per_1k_tokens": 0.0}
SERVERS = 4
MIN_TOKENS, MAX_TOKENS = 16, 128


# ---- sims ------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Sim:
    def __init__(self, workdir: Path, name: str, **options: Any) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        argv = [PY, "-m", "servefleet.sim", "--port", str(self.port), "--load-time", "0", "--model", "sim-bench"]
        for key, value in options.items():
            argv += [f"--{key.replace('_', '-')}", str(value)]
        self.log = open(workdir / f"{name}.log", "wb")
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def wait_ready(self, timeout: float = 60) -> Sim:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sim exited with {self.proc.returncode}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=1) as r:
                    if r.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError("sim not ready")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()


def start_fleet(workdir: Path, **options: Any) -> list[Sim]:
    sims = [Sim(workdir, f"sim{i}", **options) for i in range(SERVERS)]
    return [s.wait_ready() for s in sims]


async def counters(session: aiohttp.ClientSession, sims: list[Sim]) -> tuple[float, float]:
    """(generated tokens, finished requests) summed over the fleet."""
    tokens = requests = 0.0
    for s in sims:
        async with session.get(s.url + "/metrics") as r:
            for line in (await r.text()).splitlines():
                if line.startswith("vllm:generation_tokens_total"):
                    tokens += float(line.rsplit(" ", 1)[1])
                elif line.startswith("vllm:request_success_total"):
                    requests += float(line.rsplit(" ", 1)[1])
    return tokens, requests


class Sampler:
    """Polls the fleet's counters; turns the series into sustained and end-to-end rates."""

    def __init__(self, sims: list[Sim], interval: float = 0.2) -> None:
        self.sims = sims
        self.interval = interval
        self.samples: list[tuple[float, float, float]] = []

    async def run(self, stop: asyncio.Event) -> None:
        async with aiohttp.ClientSession() as session:
            base = await counters(session, self.sims)
            while True:
                tok, req = await counters(session, self.sims)
                self.samples.append((time.monotonic(), tok - base[0], req - base[1]))
                if stop.is_set():
                    return
                await asyncio.sleep(self.interval)

    def crossing(self, level: float) -> float:
        prev = self.samples[0]
        for cur in self.samples[1:]:
            if cur[1] >= level:
                if cur[1] == prev[1]:
                    return cur[0]
                return prev[0] + (cur[0] - prev[0]) * (level - prev[1]) / (cur[1] - prev[1])
            prev = cur
        raise ValueError("level never reached")

    def sustained(self, total: float, lo: float = 0.1, hi: float = 0.9) -> float:
        return (hi - lo) * total / (self.crossing(hi * total) - self.crossing(lo * total))


# ---- the job ---------------------------------------------------------------------------------------


def make_job(n: int, seed: int = 7) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    return [
        {
            "id": f"q{i}",
            "prompt": f"Write about item {i}.",
            "max_tokens": rng.randint(MIN_TOKENS, MAX_TOKENS),
            "ignore_eos": True,
        }
        for i in range(n)
    ]


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


async def run_servefleet(job_file: Path, out: Path, sims: list[Sim]) -> dict[str, Any]:
    urls = [a for s in sims for a in ("--url", s.url)]
    proc = await asyncio.create_subprocess_exec(
        PY,
        "-m",
        "servefleet.cli.main",
        "generate",
        "-i",
        str(job_file),
        "-o",
        str(out),
        *urls,
        "--json",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    stdout, _ = await proc.communicate()
    report = json.loads(stdout)
    if report.get("status") != "complete":
        raise RuntimeError(f"servefleet generate ended {report.get('status')}: {report.get('message')}")
    return {
        "concurrency": {s["name"]: s["final_concurrency"] for s in report["servers"]},
        "retries": report["retries"],
    }


async def run_openai_semaphore(job: list[dict[str, Any]], sims: list[Sim], capacity: int) -> dict[str, Any]:
    import openai

    clients = [openai.AsyncOpenAI(base_url=s.url + "/v1", api_key="none", max_retries=3, timeout=600) for s in sims]
    sem = asyncio.Semaphore(capacity)

    async def one(i: int, p: dict[str, Any]) -> None:
        async with sem:
            await clients[i % len(clients)].completions.create(
                model="sim-bench", prompt=p["prompt"], max_tokens=p["max_tokens"], extra_body={"ignore_eos": True}
            )

    await asyncio.gather(*(one(i, p) for i, p in enumerate(job)))
    for c in clients:
        await c.close()
    return {"semaphore": capacity}


async def run_batch_gather(job: list[dict[str, Any]], sims: list[Sim], batch: int) -> dict[str, Any]:
    import openai

    clients = [openai.AsyncOpenAI(base_url=s.url + "/v1", api_key="none", max_retries=3, timeout=600) for s in sims]

    async def one(i: int, p: dict[str, Any]) -> None:
        await clients[i % len(clients)].completions.create(
            model="sim-bench", prompt=p["prompt"], max_tokens=p["max_tokens"], extra_body={"ignore_eos": True}
        )

    for start in range(0, len(job), batch):
        await asyncio.gather(*(one(start + k, p) for k, p in enumerate(job[start : start + batch])))
    for c in clients:
        await c.close()
    return {"batch": batch}


async def throughput_section(workdir: Path, prompts: int) -> dict[str, Any]:
    cfg = SimConfig(load_time=0, **SIM_TIMED)
    job = make_job(prompts)
    total_tokens = sum(p["max_tokens"] for p in job)
    mean_out = total_tokens / len(job)
    per_server = theoretical_output_tokens_per_s(cfg, cfg.max_running, prompt_tokens=8, output_tokens=round(mean_out))
    # k=1 and no prefill cost: the maximum does not depend on the output length -- check it.
    assert (
        abs(per_server - theoretical_output_tokens_per_s(cfg, cfg.max_running, output_tokens=MAX_TOKENS))
        < 1e-6 * per_server
    )
    theoretical = SERVERS * per_server
    job_file = workdir / "throughput.jsonl"
    write_jsonl(job_file, job)
    capacity = SERVERS * cfg.max_running
    methods: dict[str, Any] = {}
    for name in ("servefleet", "openai-semaphore", "batch-and-gather"):
        sims = start_fleet(workdir, **SIM_TIMED)
        try:
            sampler = Sampler(sims)
            stop = asyncio.Event()
            sampling = asyncio.ensure_future(sampler.run(stop))
            await asyncio.sleep(0.5)
            t0 = time.monotonic()
            if name == "servefleet":
                extra = await run_servefleet(job_file, workdir / "out-throughput", sims)
            elif name == "openai-semaphore":
                extra = await run_openai_semaphore(job, sims, capacity)
            else:
                extra = await run_batch_gather(job, sims, capacity)
            wall = time.monotonic() - t0
            stop.set()
            await sampling
        finally:
            for s in sims:
                s.stop()
        got = sampler.samples[-1][1]
        if abs(got - total_tokens) > 0.001 * total_tokens:
            raise RuntimeError(f"{name}: servers generated {got} tokens, expected {total_tokens}")
        sustained = sampler.sustained(total_tokens)
        # end to end: first generated token to last, at the servers (a client's own start-up is out)
        span = sampler.crossing(total_tokens) - sampler.crossing(min(10.0, total_tokens))
        e2e = total_tokens / span
        methods[name] = {
            "sustained_output_tokens_per_s": round(sustained, 1),
            "sustained_fraction_of_theoretical": round(sustained / theoretical, 4),
            "end_to_end_output_tokens_per_s": round(e2e, 1),
            "end_to_end_fraction_of_theoretical": round(e2e / theoretical, 4),
            "generation_span_s": round(span, 2),
            "wall_s": round(wall, 2),
            **extra,
        }
        print(
            f"  {name:18s} sustained {sustained:8.1f} tok/s = {sustained / theoretical:6.1%} of theoretical; "
            f"end to end {e2e:8.1f} tok/s = {e2e / theoretical:6.1%} over {span:.1f}s",
            flush=True,
        )
    return {
        "servers": SERVERS,
        "sim": SIM_TIMED,
        "prompts": prompts,
        "output_tokens": total_tokens,
        "output_tokens_per_request": [MIN_TOKENS, MAX_TOKENS, round(mean_out, 1)],
        "theoretical_output_tokens_per_s": round(theoretical, 1),
        "methods": methods,
    }


# ---- memory and resume -------------------------------------------------------------------------------


def write_big_input(path: Path, n: int) -> None:
    with open(path, "w") as f:
        for i in range(n):
            f.write(f'{{"id": "r{i:07d}", "prompt": "Tell me something about the number {i}.", "max_tokens": 8}}\n')


def watch_run(
    argv: list[str],
    sims: list[Sim] | None = None,
    stop_after_s: float | None = None,
) -> tuple[int, dict[str, Any], float, float, float | None]:
    """Run ``argv``; returns (exit code, JSON report, peak RSS MB sampled from outside, wall s,
    s from exec to the first request at the sims). The report's own ``peak_rss_mb`` (VmHWM) is the
    exact peak; the outside samples (every 50 ms) check it. ``wait4``'s ``ru_maxrss`` is not used:
    after vfork+exec it starts from the parent's (this script's) memory."""
    import psutil

    base = _requests(sims) if sims else 0.0
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    watched = psutil.Process(proc.pid)
    first = None
    sampled = 0.0
    while proc.poll() is None:
        try:
            sampled = max(sampled, watched.memory_info().rss / 2**20)
        except psutil.Error:
            pass
        if stop_after_s is not None and time.monotonic() - t0 > stop_after_s:
            proc.send_signal(signal.SIGTERM)  # a clean stop: what is answered is committed
            stop_after_s = None
        if sims and first is None and _requests(sims) > base:
            first = time.monotonic() - t0
        time.sleep(0.05)
    wall = time.monotonic() - t0
    out = proc.stdout.read()  # type: ignore[union-attr]  # started with stdout=PIPE
    return proc.returncode, json.loads(out), sampled, wall, first


def _requests(sims: list[Sim]) -> float:
    total = 0.0
    for s in sims:
        with urllib.request.urlopen(s.url + "/metrics", timeout=5) as r:
            for line in r.read().decode().splitlines():
                if line.startswith("vllm:request_success_total"):
                    total += float(line.rsplit(" ", 1)[1])
    return total


def gen_argv(src: Path, out: Path, sims: list[Sim]) -> list[str]:
    return [
        PY,
        "-m",
        "servefleet.cli.main",
        "generate",
        "-i",
        str(src),
        "-o",
        str(out),
        *[a for s in sims for a in ("--url", s.url)],
        "--json",
    ]


def memory_section(workdir: Path, lines: int, time_limit_s: float | None) -> dict[str, Any]:
    src = workdir / "big.jsonl"
    write_big_input(src, lines)
    sims = start_fleet(workdir, max_running=64, decode_ms=0, decode_ms_per_running=0, prefill_ms_per_1k_tokens=0)
    try:
        rc, report, sampled, wall, _ = watch_run(gen_argv(src, workdir / "out-big", sims), stop_after_s=time_limit_s)
    finally:
        for s in sims:
            s.stop()
    if report.get("status") not in ("complete", "interrupted") or (
        time_limit_s is None and report.get("status") != "complete"
    ):
        raise RuntimeError(f"{lines:,}-line run ended {report.get('status')}")
    peak = report["peak_rss_mb"]
    result = {
        "lines": lines,
        "input_mb": round(src.stat().st_size / 2**20, 1),
        "peak_rss_mb": peak,
        "peak_rss_sampled_mb": round(sampled, 1),
        "wall_s": round(wall, 1),
        "requests_per_s": round(report["committed"] / wall, 1),
        "committed": report["committed"],
        "shards": report["shards"],
        "status": report["status"],
        "stopped_after_s": time_limit_s,
    }
    print(
        f"  {lines:,} lines ({result['input_mb']} MB): peak RSS {peak:.1f} MB, {wall:.0f}s ({result['requests_per_s']} req/s)",
        flush=True,
    )
    return result


def seed_done(src: Path, out: Path, done: int) -> None:
    """Leave ``out`` the way a run killed after committing ``done`` rows leaves it."""
    from servefleet.generate.inputs import RequestDefaults, detect_kind
    from servefleet.generate.job import InputInfo, JobManifest, JobParams, RunRecord
    from servefleet.generate.ledger import Ledger
    from servefleet.generate.prepass import run_prepass
    from servefleet.generate.shards import OutputRow, ShardBuffer, ShardLimits, shard_schema
    from servefleet.generate.sinks import LocalSink

    pp = run_prepass(str(src), RequestDefaults(), lambda r: None)
    info = InputInfo(
        path=str(src),
        kind=detect_kind(str(src)),
        size=pp.size,
        mtime_ns=pp.mtime_ns,
        sha256=pp.sha256,
        lines=pp.lines,
        valid=pp.valid,
        rejected=pp.rejected,
        duplicates=pp.duplicates,
    )
    run_id = "20260101T000000-beef"
    sink = LocalSink(str(out))
    sink.write_bytes(
        "job.json",
        JobManifest(
            input=info, params=JobParams(), runs=[RunRecord(run_id=run_id, input_sha256=pp.sha256)]
        ).to_bytes(),
    )
    ledger = Ledger(sink, "parquet", run_id, pp.sha256)
    schema = shard_schema(False, False)
    for start in range(0, done, 1000):
        buf = ShardBuffer(schema, ShardLimits(rows=1000))
        for i in range(start, start + 1000):
            buf.add(
                OutputRow(
                    f"r{i:07d}",
                    i + 1,
                    "an earlier answer of eight tokens",
                    "length",
                    10,
                    8,
                    "sim-bench",
                    "sim0",
                    1,
                    0.01,
                )
            )
        ledger.commit(buf)


def resume_section(workdir: Path, lines: int, time_limit_s: float | None) -> dict[str, Any]:
    src = workdir / "big.jsonl"
    if not src.exists():
        write_big_input(src, lines)
    done = lines * 9 // 10
    out = workdir / "out-resume"
    t = time.monotonic()
    seed_done(src, out, done)
    seeded = time.monotonic() - t
    backup = workdir / "out-resume-seeded"
    shutil.copytree(out, backup)
    sims = start_fleet(workdir, max_running=64, decode_ms=0, decode_ms_per_running=0, prefill_ms_per_1k_tokens=0)
    results: dict[str, Any] = {"lines": lines, "done_before": done, "seed_s": round(seeded, 1)}
    try:
        for label in ("same input", "input touched"):
            if label == "input touched":
                shutil.rmtree(out)
                shutil.copytree(backup, out)
                os.utime(src)
            rc, report, _, wall, first = watch_run(gen_argv(src, out, sims), sims, stop_after_s=time_limit_s)
            peak = report["peak_rss_mb"]
            if first is None:
                raise RuntimeError(f"resume ({label}): no request reached the servers: {json.dumps(report)[:2000]}")
            if report.get("status") not in ("complete", "interrupted") or report["done_before"] != done:
                raise RuntimeError(
                    f"resume ({label}) ended {report.get('status')}, done_before {report.get('done_before')}"
                )
            results[label] = {
                "exec_to_first_request_s": round(first or float("nan"), 3),
                "startup_s": report["startup_s"],
                "wall_s": round(wall, 1),
                "sent": report["committed"],
                "status": report["status"],
                "peak_rss_mb": round(peak, 1),
            }
            print(
                f"  resume, {label}: first request {first:.2f}s after exec (startup_s {report['startup_s']}), "
                f"{report['committed']:,} sent in {wall:.0f}s, peak RSS {peak:.0f} MB",
                flush=True,
            )
    finally:
        for s in sims:
            s.stop()
    return results


# ---- main --------------------------------------------------------------------------------------------


def table(result: dict[str, Any]) -> str:
    rows = [("method", "sustained tok/s", "of theoretical", "end-to-end tok/s", "of theoretical", "wall s")]
    tp = result.get("throughput")
    if tp:
        for name, m in tp["methods"].items():
            rows.append(
                (
                    name,
                    f"{m['sustained_output_tokens_per_s']:,.0f}",
                    f"{m['sustained_fraction_of_theoretical']:.1%}",
                    f"{m['end_to_end_output_tokens_per_s']:,.0f}",
                    f"{m['end_to_end_fraction_of_theoretical']:.1%}",
                    f"{m['wall_s']:.1f}",
                )
            )
        rows.append(("theoretical", f"{tp['theoretical_output_tokens_per_s']:,.0f}", "100%", "", "", ""))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows] if tp else []
    mem = result.get("memory")
    if mem:
        how = (
            "sent in full"
            if mem["status"] == "complete"
            else f"stopped cleanly after {mem['stopped_after_s']:.0f}s, {mem['committed']:,} sent"
        )
        lines.append(
            f"\npeak RSS, {mem['lines']:,}-line input ({how}): {mem['peak_rss_mb']} MB (target < 300 MB); "
            f"{mem['requests_per_s']} req/s to instant sims"
        )
    vs = result.get("vs_bench")
    if vs:
        from generate_vs_bench import vs_bench_table

        lines.append("\n" + vs_bench_table(vs))
    res = result.get("resume")
    if res:
        for label in ("same input", "input touched"):
            r = res.get(label)
            if r:
                rest = (
                    f"rest sent in {r['wall_s']}s"
                    if r["status"] == "complete"
                    else f"stopped after {r['wall_s']}s, {r['sent']:,} sent"
                )
                lines.append(
                    f"resume {res['lines']:,} lines, {res['done_before']:,} done ({label}): first request "
                    f"{r['exec_to_first_request_s']}s after exec (target < 10 s); run's own startup {r['startup_s']}s; "
                    f"{rest}; peak RSS {r['peak_rss_mb']} MB"
                )
    return "\n".join(lines)


async def amain(args: argparse.Namespace) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="sf-genbench-"))
    result: dict[str, Any] = {
        "benchmark": "generate_throughput",
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "loadavg_at_start": os.getloadavg(),
        },
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    try:
        if "throughput" in args.sections:
            print(f"throughput: {args.prompts:,} prompts over {SERVERS} sims", flush=True)
            result["throughput"] = await throughput_section(workdir, args.prompts)
        if "memory" in args.sections:
            print(f"memory: {args.rss_lines:,}-line input", flush=True)
            result["memory"] = await asyncio.to_thread(memory_section, workdir, args.rss_lines, args.rss_time_limit)
        if "vs-bench" in args.sections:
            from generate_vs_bench import vs_bench_section

            result["vs_bench"] = {}
            for kind in args.vs_server:
                print(
                    f"vs-bench: {kind}, {args.vs_prompts:,} prompts of {args.vs_input_len} -> {args.vs_output_len} tokens",
                    flush=True,
                )
                result["vs_bench"][kind] = await vs_bench_section(
                    workdir,
                    kind,
                    prompts=args.vs_prompts,
                    input_len=args.vs_input_len,
                    output_len=args.vs_output_len,
                    levels=args.vs_levels,
                    point_s=args.vs_point_s,
                    modes=args.vs_modes,
                    sim_options=json.loads(args.vs_sim_options) if args.vs_sim_options else None,
                    bench_run=args.vs_bench_run,
                    sim_src=args.vs_sim_src,
                )
        if "resume" in args.sections:
            print(f"resume: {args.rss_lines:,}-line job, 90% done", flush=True)
            result["resume"] = await asyncio.to_thread(resume_section, workdir, args.rss_lines, args.resume_time_limit)
    finally:
        result["machine"]["loadavg_at_end"] = os.getloadavg()
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--prompts",
        type=int,
        default=10_000,
        help="prompts of the throughput job (long enough that the final drain costs < 3%%)",
    )
    p.add_argument("--rss-lines", type=int, default=1_000_000, help="lines of the memory and resume inputs")
    p.add_argument(
        "--rss-time-limit",
        type=float,
        default=None,
        help="stop the memory run cleanly (SIGTERM) after this many seconds: on a slow machine sending a million "
        "requests takes hours; the whole input is still read and checked, and RSS plateaus early",
    )
    p.add_argument(
        "--resume-time-limit",
        type=float,
        default=None,
        help="stop each resumed run cleanly after this many seconds (the figure is the time to the first request)",
    )
    p.add_argument(
        "--sections",
        nargs="+",
        default=["throughput", "memory", "resume"],
        choices=["throughput", "memory", "resume", "vs-bench"],
    )
    p.add_argument(
        "--vs-server",
        nargs="+",
        default=["sim"],
        choices=["sim", "vllm"],
        help="vs-bench: the server(s) (vllm: vLLM-CPU, tiny model)",
    )
    p.add_argument("--vs-prompts", type=int, default=3000, help="vs-bench: prompts of each generate run")
    p.add_argument("--vs-input-len", type=int, default=128)
    p.add_argument("--vs-output-len", type=int, default=128)
    p.add_argument("--vs-levels", default="32,64,96,128,192", help="vs-bench: bench concurrency levels")
    p.add_argument("--vs-point-s", type=float, default=15.0, help="vs-bench: seconds per bench point")
    p.add_argument(
        "--vs-modes", nargs="+", default=["search", "capacity", "bench"], choices=["search", "capacity", "bench"]
    )
    p.add_argument(
        "--vs-bench-run",
        type=Path,
        default=None,
        help="vs-bench: a RUN.json of this very server and workload to take as the baseline instead of benching (one server only)",
    )
    p.add_argument(
        "--vs-sim-src",
        type=Path,
        default=None,
        help="vs-bench: run the sim from this src folder (PYTHONPATH), e.g. a branch's with the realistic timing mode",
    )
    p.add_argument(
        "--vs-sim-options",
        default=None,
        help="vs-bench: the sim's options as JSON (default: generate_vs_bench.SIM_OPTIONS)",
    )
    p.add_argument("--quick", action="store_true", help="small sizes (a smoke run, not the reported figures)")
    p.add_argument("--keep", action="store_true", help="keep the work folder")
    p.add_argument("--output", type=Path, default=RESULTS / "generate_throughput.json")
    args = p.parse_args()
    if args.quick:
        args.prompts, args.rss_lines = 600, 20_000
        if args.output == RESULTS / "generate_throughput.json":
            args.output = RESULTS / "generate_throughput.quick.json"
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    result = asyncio.run(amain(args))
    result["table"] = table(result)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print()
    print(result["table"])
    print(f"\nwritten to {args.output}")


if __name__ == "__main__":
    main()
