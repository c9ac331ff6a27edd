"""`servefleet serve`: what the gateway costs, and whether a client through it gets what `generate` gets.

Two sections:

1. **overhead** -- the gateway (``servefleet serve --url ... --concurrency 512``, a subprocess) in
   front of two *instant* sims (no time model: answers as fast as their HTTP stack allows), driven by a
   closed-loop aiohttp client (``--clients`` requests in flight, small completions, ``max_tokens`` 8)
   for ``--seconds``. Measured: requests/s through the gateway, the gateway process's own CPU seconds
   (user + system, psutil) per request, and so requests per gateway CPU-second ("per core"; the anchor
   is ~2,000 req/s per core: the Kubernetes Gateway API inference extension's picker does ~6,000 req/s
   on 16 cores). The same load straight at the sims is the baseline of the achieved rate. Non-streaming
   and streaming.
2. **vs-generate** -- the same job (``--prompts`` prompts, ``ignore_eos``, 16..128 output tokens) on
   two timed sims (``max_running`` 32, 20 ms + 0.1 ms/request decode steps), fresh for each way:
   ``servefleet generate --url ... x2``, and a closed-loop ``openai.AsyncOpenAI`` client through
   ``servefleet serve`` (as many workers as the gateway's limits add up to, each sending the next
   prompt when its answer is in). Throughput is read from the sims' own counters
   (``vllm:generation_tokens_total``): sustained between 10 % and 90 % of the job's tokens, and end to end.
   Target: the gateway within 5 % of generate.

Usage (from the repository root)::

    .venv/bin/python benchmarks/serve_gateway.py                 # both sections (~3 min)
    .venv/bin/python benchmarks/serve_gateway.py --quick         # smaller, a smoke run

Writes ``benchmarks/results/serve_gateway.json`` (``--out`` to change) and prints a table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import psutil

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(HERE))
from generate_throughput import PY, SIM_TIMED, Sampler, Sim, make_job, write_jsonl  # noqa: E402 - after the sys.path.insert above

INSTANT = {"decode_ms": 0, "decode_ms_per_running": 0, "prefill_ms_per_1k_tokens": 0}
MODEL = "sim-bench"


class Serving:
    """`servefleet serve --json` in a subprocess; its URL from the first line."""

    def __init__(self, sims: list[Sim], *extra: str) -> None:
        urls = [a for s in sims for a in ("--url", s.url)]
        path = os.pathsep.join(p for p in (str(REPO / "src"), os.environ.get("PYTHONPATH")) if p)
        self.proc = subprocess.Popen(
            [PY, "-m", "servefleet.cli.main", "serve", "--port", "0", "--json", *urls, *extra],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env={**os.environ, "PYTHONPATH": path},
        )
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if not line:
            raise RuntimeError(f"serve exited {self.proc.wait()} before serving")
        self.url = json.loads(line)["url"]
        self.ps = psutil.Process(self.proc.pid)

    def cpu_s(self) -> float:
        t = self.ps.cpu_times()
        return t.user + t.system

    def limits(self) -> int:
        with urllib.request.urlopen(self.url + "/models", timeout=10) as r:
            return sum(s["limit"] for m in json.load(r)["data"] for s in m["servers"])

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


# ---- 1. overhead against instant answerers ----------------------------------------------------------


async def closed_loop(urls: list[str], clients: int, seconds: float, stream: bool) -> dict[str, Any]:
    """``clients`` workers, each sending its next request when the answer is in; round-robin over ``urls``."""
    body = json.dumps(
        {"model": MODEL, "prompt": "hello", "max_tokens": 8, "ignore_eos": True, "stream": stream}
    ).encode()
    done = errors = 0
    stop_at = time.monotonic() + seconds
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn, headers={"Content-Type": "application/json"}) as session:

        async def worker(i: int) -> None:
            nonlocal done, errors
            url = urls[i % len(urls)] + "/completions"
            while time.monotonic() < stop_at:
                async with session.post(url, data=body) as resp:
                    await resp.read()
                    if resp.status == 200:
                        done += 1
                    else:
                        errors += 1

        t0 = time.monotonic()
        await asyncio.gather(*(worker(i) for i in range(clients)))
        wall = time.monotonic() - t0
    return {"requests": done, "errors": errors, "wall_s": round(wall, 3), "requests_per_s": round(done / wall, 1)}


async def overhead_section(workdir: Path, clients: int, seconds: float) -> dict[str, Any]:
    out: dict[str, Any] = {}
    sims = [Sim(workdir, f"instant{i}", **INSTANT).wait_ready() for i in range(2)]
    try:
        for stream in (False, True):
            mode = "stream" if stream else "plain"
            direct = await closed_loop([s.url + "/v1" for s in sims], clients, seconds, stream)
            gw = Serving(sims, "--concurrency", "512", "--max-queue", "100000")
            try:
                await closed_loop([gw.url], clients, 1.0, stream)  # warm-up: connections, first-call costs
                cpu0 = gw.cpu_s()
                through = await closed_loop([gw.url], clients, seconds, stream)
                cpu = gw.cpu_s() - cpu0
            finally:
                gw.stop()
            n = max(1, through["requests"])
            out[mode] = {
                "direct": direct,
                "through_gateway": through,
                "gateway_cpu_s": round(cpu, 3),
                "gateway_cpu_us_per_request": round(1e6 * cpu / n, 1),
                "requests_per_gateway_core_s": round(n / cpu, 1) if cpu > 0 else None,
                "achieved_vs_direct": round(through["requests_per_s"] / direct["requests_per_s"], 3),
            }
    finally:
        for s in sims:
            s.stop()
    return out


# ---- 2. a closed-loop openai client through the gateway vs generate ---------------------------------


async def through_gateway(job: list[dict[str, Any]], sims: list[Sim]) -> dict[str, Any]:
    import openai

    gw = Serving(sims, "--max-queue", "100000")
    try:
        workers = gw.limits()
        todo = iter(job)
        async with openai.AsyncOpenAI(base_url=gw.url, api_key="none", max_retries=3, timeout=600) as client:

            async def worker() -> None:
                for p in todo:
                    await client.completions.create(
                        model=MODEL, prompt=p["prompt"], max_tokens=p["max_tokens"], extra_body={"ignore_eos": True}
                    )

            await asyncio.gather(*(worker() for _ in range(workers)))
    finally:
        gw.stop()
    return {"workers": workers}


async def with_generate(job_file: Path, out: Path, sims: list[Sim]) -> dict[str, Any]:
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
        raise RuntimeError(f"generate ended {report.get('status')}: {report.get('message')}")
    return {"concurrency": {s["name"]: s["final_concurrency"] for s in report["servers"]}}


async def vs_generate_section(workdir: Path, prompts: int) -> dict[str, Any]:
    job = make_job(prompts)
    total = sum(p["max_tokens"] for p in job)
    job_file = workdir / "job.jsonl"
    write_jsonl(job_file, job)
    out: dict[str, Any] = {"prompts": prompts, "output_tokens": total, "sim": SIM_TIMED, "servers": 2}
    for name in ("generate", "serve+openai"):
        sims = [Sim(workdir, f"{name}{i}", **SIM_TIMED).wait_ready() for i in range(2)]
        try:
            sampler = Sampler(sims)
            stop = asyncio.Event()
            sampling = asyncio.ensure_future(sampler.run(stop))
            await asyncio.sleep(0.5)
            t0 = time.monotonic()
            extra = await (
                with_generate(job_file, workdir / "out", sims) if name == "generate" else through_gateway(job, sims)
            )
            wall = time.monotonic() - t0
            stop.set()
            await sampling
        finally:
            for s in sims:
                s.stop()
        out[name] = {
            "sustained_tok_s": round(sampler.sustained(total), 1),
            "end_to_end_tok_s": round(total / wall, 1),
            "wall_s": round(wall, 2),
            **extra,
        }
    out["sustained_ratio"] = round(out["serve+openai"]["sustained_tok_s"] / out["generate"]["sustained_tok_s"], 4)
    out["end_to_end_ratio"] = round(out["serve+openai"]["end_to_end_tok_s"] / out["generate"]["end_to_end_tok_s"], 4)
    return out


def table(result: dict[str, Any]) -> str:
    lines = [
        "| load | direct req/s | via gateway req/s | gateway CPU µs/req | req per gateway core-s |",
        "|---|---|---|---|---|",
    ]
    for mode, r in result.get("overhead", {}).items():
        lines.append(
            f"| {mode}, {result['clients']} in flight | {r['direct']['requests_per_s']:,.0f} | {r['through_gateway']['requests_per_s']:,.0f} | "
            f"{r['gateway_cpu_us_per_request']:,.0f} | {r['requests_per_gateway_core_s']:,.0f} |"
        )
    v = result.get("vs_generate")
    if v:
        lines += ["", "| way | sustained tok/s | end-to-end tok/s | wall s |", "|---|---|---|---|"]
        for name in ("generate", "serve+openai"):
            r = v[name]
            lines.append(f"| {name} | {r['sustained_tok_s']:,.0f} | {r['end_to_end_tok_s']:,.0f} | {r['wall_s']} |")
        lines.append(f"| ratio | {v['sustained_ratio']:.3f} | {v['end_to_end_ratio']:.3f} | |")
    return "\n".join(lines)


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--sections", nargs="+", default=["overhead", "vs-generate"], choices=["overhead", "vs-generate"])
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--prompts", type=int, default=3000)
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "serve_gateway.json")
    args = ap.parse_args()
    if args.quick:
        args.seconds, args.prompts = 3.0, 600
    result: dict[str, Any] = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "clients": args.clients,
    }
    with tempfile.TemporaryDirectory() as tmp:
        if "overhead" in args.sections:
            result["overhead"] = await overhead_section(Path(tmp), args.clients, args.seconds)
        if "vs-generate" in args.sections:
            result["vs_generate"] = await vs_generate_section(Path(tmp), args.prompts)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(table(result))
    print(f"\nwritten: {args.out}")


if __name__ == "__main__":
    asyncio.run(main())
