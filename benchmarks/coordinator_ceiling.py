"""One coordinator's ceiling: the most completions per second one `servefleet generate` sustains.

Against instant servers -- tiny raw-asyncio HTTP servers in other processes that answer every
``POST /v1/completions`` (or ``/v1/chat/completions``) at once with a pre-built OpenAI-compatible
body of realistic size (``--answer-tokens`` 1,800 tokens of text, about 7-8 KB) -- the real CLI
(``python -m servefleet.cli.main generate``) runs a job of ``--prompts`` prompts at a fixed
concurrency and writes real Parquet shards to a folder. Measured from outside:

* completions/s over the steady part of the run (between 10 % and 90 % of the answers, counted by
  the servers themselves and polled every 0.25 s, so start-up, pre-pass and drain are out);
* the coordinator's CPU time (its whole process tree: the CLI and any worker processes, psutil)
  over that same window, hence CPU ms per completion and completions/s per busy core;
* its peak memory: the largest sum of RSS over the tree seen by the sampler, and the report's
  ``peak_rss_mb`` (VmHWM of the main process);
* the servers' own CPU over the window (the proof that they are not the bottleneck: each answers
  in a few tens of microseconds, and their share of the machine is reported), and the machine's
  load average before and after.

On a small shared machine the CPU is the limit for everything at once, so the figure that carries
over to a bigger one is CPU ms per completion; ``per_core_rps`` = 1000 / that.

Usage (from the repository root; heavy: take the lock)::

    flock /tmp/servefleet-heavy.lock .venv/bin/python benchmarks/coordinator_ceiling.py \\
        --workers 1,2 --label after

A before/after pair in one sitting (the same load for both): export the older commit with
``git archive f828f35 src | tar -x -C /tmp/before`` and pass ``--src /tmp/before/src --label before-...``.

Writes ``benchmarks/results/coordinator_ceiling.json`` (each ``--label`` kept beside the others,
so a before/after pair sits in one file) and prints a table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
RESULTS = REPO / "benchmarks" / "results"
OUT_JSON = RESULTS / "coordinator_ceiling.json"
OUT_TABLE = RESULTS / "coordinator_ceiling.md"
H200_COMPLETIONS_PER_S = 34_000 / 1_800  # one H200 at 1,800-token answers (../shared/gpu/runs/2026-12-01)

WORDS = (
    "the of and to in is was for on that with as by at from his it an are this which be or had "
    "data model answer token server batch cache prompt"
).split()


# ---- the instant server (runs in its own process: `coordinator_ceiling.py serve --port P`) ------
def _answer_body(endpoint: str, tokens: int) -> bytes:
    text = " ".join(WORDS[(i * 7) % len(WORDS)] for i in range(tokens))  # ~4.3 chars a token
    usage = {"prompt_tokens": 40, "completion_tokens": tokens, "total_tokens": 40 + tokens}
    if endpoint == "chat":
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}
        obj = {
            "id": "chatcmpl-x",
            "object": "chat.completion",
            "created": 0,
            "model": "instant",
            "choices": [choice],
            "usage": usage,
        }
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "length"}
        obj = {
            "id": "cmpl-x",
            "object": "text_completion",
            "created": 0,
            "model": "instant",
            "choices": [choice],
            "usage": usage,
        }
    return json.dumps(obj).encode()


class _Instant(asyncio.Protocol):
    """HTTP/1.1 keep-alive, one request at a time per connection, answered as soon as it is read."""

    count = 0

    def __init__(self, answer: bytes, models: bytes, delay_s: float) -> None:
        self.answer = answer
        self.delay_s = delay_s
        self.models = models
        self.buf = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a stream protocol is always given a Transport

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buf[:end]
            length = 0
            for line in head.split(b"\r\n")[1:]:
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:])
            if len(self.buf) < end + 4 + length:
                return
            self.buf = self.buf[end + 4 + length :]
            method, path = head.split(b" ", 2)[:2]
            if method == b"POST" and path.startswith(b"/v1/") and path.endswith(b"completions"):
                if self.delay_s > 0:
                    asyncio.get_running_loop().call_later(self.delay_s, self._answer)
                else:
                    self._answer()
            elif path in (b"/v1/models", b"/health"):
                self._send(b"200 OK", self.models)
            elif path == b"/count":
                self._send(b"200 OK", str(_Instant.count).encode())
            else:
                self._send(b"404 Not Found", b'{"error":"not found"}')

    def _answer(self) -> None:
        _Instant.count += 1
        self._send(b"200 OK", self.answer)

    def _send(self, status: bytes, body: bytes) -> None:
        assert self.transport is not None
        if self.transport.is_closing():
            return
        self.transport.write(
            b"HTTP/1.1 "
            + status
            + b"\r\nContent-Type: application/json\r\nContent-Length: "
            + str(len(body)).encode()
            + b"\r\n\r\n"
            + body
        )


def serve(count: int, endpoint: str, tokens: int, delay_s: float) -> None:
    """``count`` "servers" (one per port, the kernel picks them) in one process; prints
    ``ready PORT,PORT,...``. The answer count is the process's total."""
    answer = _answer_body(endpoint, tokens)
    models = json.dumps({"object": "list", "data": [{"id": "instant", "object": "model"}]}).encode()
    loop = asyncio.new_event_loop()
    servers = [
        loop.run_until_complete(
            loop.create_server(lambda: _Instant(answer, models, delay_s), "127.0.0.1", 0, backlog=4096)
        )
        for _ in range(count)
    ]
    loop.add_signal_handler(signal.SIGTERM, loop.stop)
    print("ready " + ",".join(str(s.sockets[0].getsockname()[1]) for s in servers), flush=True)
    loop.run_forever()
    for server in servers:
        server.close()


# ---- the driver ---------------------------------------------------------------------------------
def _count(port: int) -> int:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"GET /count HTTP/1.1\r\nHost: x\r\n\r\n")
        data = b""
        while b"\r\n\r\n" not in data or not data.split(b"\r\n\r\n", 1)[1]:
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
    return int(data.split(b"\r\n\r\n", 1)[1])


def _write_input(path: Path, n: int) -> None:
    with open(path, "w") as f:
        for i in range(n):
            prompt = " ".join(WORDS[(i + k) % len(WORDS)] for k in range(30))
            f.write(json.dumps({"id": f"p{i:08d}", "prompt": prompt}) + "\n")


def _tree(proc: psutil.Process) -> list[psutil.Process]:
    try:
        return [proc, *proc.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


class _Sampler(threading.Thread):
    """Every 0.25 s: answers counted by the servers, CPU and RSS of the coordinator's tree and of
    the servers."""

    def __init__(self, proc: psutil.Process, servers: list[tuple[int, psutil.Process]]) -> None:
        super().__init__(daemon=True)
        self.proc, self.servers = proc, servers
        self.samples: list[dict[str, float]] = []
        self.cpu_seen: dict[int, float] = {}
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            t = time.monotonic()
            rss = cpu = 0.0
            for p in _tree(self.proc):
                try:
                    ct = p.cpu_times()
                    self.cpu_seen[p.pid] = ct.user + ct.system  # a worker's last reading survives its exit
                    rss += p.memory_info().rss
                except psutil.NoSuchProcess:
                    pass
            cpu = sum(self.cpu_seen.values())
            server_cpu = sum(sum(sp.cpu_times()[:2]) for _, sp in self.servers)
            answers = sum(_count(port) for port, _ in self.servers)
            self.samples.append({"t": t, "answers": answers, "cpu": cpu, "rss": rss, "server_cpu": server_cpu})
            self.done.wait(0.25)


def _steady(samples: list[dict[str, float]], total: int) -> dict[str, float]:
    lo = next(s for s in samples if s["answers"] >= 0.1 * total)
    hi = next((s for s in samples if s["answers"] >= 0.9 * total), samples[-1])
    dt, n = hi["t"] - lo["t"], hi["answers"] - lo["answers"]
    return {
        "seconds": dt,
        "answers": n,
        "rps": n / dt,
        "cpu_s": hi["cpu"] - lo["cpu"],
        "server_cpu_s": hi["server_cpu"] - lo["server_cpu"],
    }


def run_once(
    args: argparse.Namespace,
    workers: int,
    input_path: Path,
    ports: list[int],
    servers: list[tuple[int, psutil.Process]],
    tmp: Path,
) -> dict[str, Any]:
    out = tmp / f"out-w{workers}"
    shutil.rmtree(out, ignore_errors=True)
    cmd = [
        PYTHON,
        "-m",
        "servefleet.cli.main",
        "generate",
        "--input",
        str(input_path),
        "--output",
        str(out),
        "--max-tokens",
        str(args.answer_tokens),
        "--concurrency",
        str(args.concurrency),
        "--max-running",
        str(args.concurrency),
        "--json",
        *(["--chat"] if args.endpoint == "chat" else []),
        *[a for p in ports for a in ("--url", f"http://127.0.0.1:{p}")],
    ]
    if workers != 1 or args.workers_flag:
        cmd += ["--workers", str(workers)]
    if args.py_spy:  # profile instead of measure: CPU figures then include py-spy's own
        cmd = [
            args.py_spy,
            "record",
            "--subprocesses",
            "--format",
            "raw",
            "--rate",
            "250",
            "--nonblocking",
            "--output",
            f"{args.profile_out}-w{workers}.txt",
            *(["--idle"] if args.py_spy_idle else []),
            "--",
            *cmd,
        ]
    before = sum(_count(p) for p, _ in servers)
    load_before = os.getloadavg()
    t0 = time.monotonic()
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, "PYTHONPATH": args.src}
    )
    sampler = _Sampler(psutil.Process(proc.pid), servers)
    sampler.start()
    stdout, stderr = proc.communicate(timeout=args.timeout)
    wall = time.monotonic() - t0
    sampler.done.set()
    sampler.join()
    if proc.returncode != 0:
        raise RuntimeError(f"generate exited {proc.returncode}: {stderr.decode()[-2000:]}")
    report, _ = json.JSONDecoder().raw_decode(
        stdout[stdout.index(b"{\n") :].decode()
    )  # py-spy, when used, prints around it
    samples = [{**s, "answers": s["answers"] - before} for s in sampler.samples]
    st = _steady(samples, args.prompts)
    shards = sorted((out / "shards").glob("*.parquet"))
    import pyarrow.parquet as pq

    rows = sum(pq.read_metadata(s).num_rows for s in shards)
    ids = set()
    for s in shards:
        ids.update(pq.read_table(s, columns=["id"]).column("id").to_pylist())
    first = pq.read_table(shards[0], columns=["text"]).column("text").to_pylist()
    text_chars = sum(map(len, first)) / len(first)  # the answers really arrived whole
    cpu_ms = 1000 * st["cpu_s"] / st["answers"]
    return {
        "workers": workers,
        "prompts": args.prompts,
        "servers": len(ports),
        "concurrency_per_server": args.concurrency,
        "answer_delay_s": args.answer_delay,
        "server_processes": len(servers),
        "endpoint": args.endpoint,
        "answer_tokens": args.answer_tokens,
        "answer_bytes": len(_answer_body(args.endpoint, args.answer_tokens)),
        "status": report["status"],
        "committed": report["committed"],
        "rows_in_shards": rows,
        "unique_ids_in_shards": len(ids),
        "text_chars_mean": round(text_chars),
        "shards": len(shards),
        "wall_s": round(wall, 2),
        "report_wall_s": report["wall_s"],
        "startup_s": report["startup_s"],
        "steady_s": round(st["seconds"], 2),
        "completions_per_s": round(st["rps"], 1),
        "completions_per_s_whole_run": round(report["committed"] / report["wall_s"], 1),
        "cpu_ms_per_completion": round(cpu_ms, 4),
        "coordinator_cores_busy": round(st["cpu_s"] / st["seconds"], 2),
        "per_core_rps": round(1000 / cpu_ms, 1),
        "peak_rss_mb_tree": round(max(s["rss"] for s in sampler.samples) / 2**20, 1),
        "peak_rss_mb_main": report.get("peak_rss_mb"),
        "server_cpu_ms_per_completion": round(1000 * st["server_cpu_s"] / st["answers"], 4),
        "server_cores_busy": round(st["server_cpu_s"] / st["seconds"], 2),
        "server_cores_busy_each_process": round(st["server_cpu_s"] / st["seconds"] / len(servers), 3),
        "server_capacity_rps": round(len(servers) * 1000 / max(1e-9, 1000 * st["server_cpu_s"] / st["answers"])),
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "h200_servers_kept_busy": round(st["rps"] / H200_COMPLETIONS_PER_S, 1),
        "h200_servers_per_core": round(1000 / cpu_ms / H200_COMPLETIONS_PER_S, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd")
    sv = sub.add_parser("serve")
    sv.add_argument("--count", type=int, default=1)
    sv.add_argument("--delay", type=float, default=0.0)
    sv.add_argument("--endpoint", default="completions")
    sv.add_argument("--tokens", type=int, default=1800)
    ap.add_argument("--prompts", type=int, default=40_000)
    ap.add_argument("--servers", type=int, default=4)
    ap.add_argument(
        "--concurrency",
        type=int,
        default=64,
        help="fixed concurrency per server (the controller is not measured here)",
    )
    ap.add_argument("--answer-tokens", type=int, default=1800)
    ap.add_argument(
        "--answer-delay",
        type=float,
        default=0.0,
        help="seconds each answer is held back (0: instant); with it, in flight = servers x concurrency, as on real servers",
    )
    ap.add_argument(
        "--server-processes", type=int, default=4, help="processes the instant servers run in (ports spread over them)"
    )
    ap.add_argument("--endpoint", choices=["completions", "chat"], default="completions")
    ap.add_argument("--workers", default="1", help="comma-separated worker counts to run, e.g. 1,2")
    ap.add_argument("--workers-flag", action="store_true", help="pass --workers even for 1 (the flag's own path)")
    ap.add_argument("--label", default="current", help="name of this result set in the JSON (e.g. before, after)")
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--no-save", action="store_true")
    ap.add_argument("--table-only", action="store_true", help="rewrite the table from the saved JSON and stop")
    ap.add_argument(
        "--src",
        default=str(REPO / "src"),
        help="source tree of the servefleet under test (e.g. an exported older commit, for a before/after pair)",
    )
    ap.add_argument(
        "--py-spy", help="path of a py-spy executable: record collapsed stacks of the coordinator (implies --no-save)"
    )
    ap.add_argument(
        "--py-spy-idle", action="store_true", help="also sample idle threads (where the coordinator waits)"
    )
    ap.add_argument(
        "--profile-out", default=str(RESULTS / "tmp" / "ceiling-profile"), help="prefix of the py-spy output files"
    )
    args = ap.parse_args()
    if args.table_only:
        OUT_TABLE.write_text(_table(json.loads(OUT_JSON.read_text())))
        return
    if args.cmd == "serve":
        serve(args.count, args.endpoint, args.tokens, args.delay)
        return

    tmp = Path(tempfile.mkdtemp(prefix="ceiling-"))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        input_path = tmp / "in.jsonl"
        _write_input(input_path, args.prompts)
        n_proc = min(args.server_processes, args.servers)
        for i in range(n_proc):
            count = len(range(i, args.servers, n_proc))
            sp = subprocess.Popen(
                [
                    PYTHON,
                    __file__,
                    "serve",
                    "--count",
                    str(count),
                    "--endpoint",
                    args.endpoint,
                    "--tokens",
                    str(args.answer_tokens),
                    "--delay",
                    str(args.answer_delay),
                ],
                stdout=subprocess.PIPE,
            )
            procs.append(sp)
        groups = []
        for sp in procs:
            assert sp.stdout is not None
            word, _, listed = sp.stdout.readline().decode().strip().partition(" ")
            assert word == "ready", "an instant server did not start"
            groups.append([int(p) for p in listed.split(",")])
        ports = [p for g in groups for p in g]
        servers = [(g[0], psutil.Process(sp.pid)) for g, sp in zip(groups, procs, strict=True)]
        runs = []
        for w in [int(x) for x in args.workers.split(",")]:
            r = run_once(args, w, input_path, ports, servers, tmp)
            runs.append(r)
            print(json.dumps(r), flush=True)
    finally:
        for sp in procs:
            sp.terminate()
        for sp in procs:
            sp.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)
    result = {
        "label": args.label,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "cpus": os.cpu_count(),
        "cpu_model": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "src": args.src,
        "runs": runs,
    }
    if not args.no_save and not args.py_spy:
        RESULTS.mkdir(parents=True, exist_ok=True)
        saved = json.loads(OUT_JSON.read_text()) if OUT_JSON.exists() else {}
        saved[args.label] = result
        OUT_JSON.write_text(json.dumps(saved, indent=1) + "\n")
        OUT_TABLE.write_text(_table(saved))
    print(_table({args.label: result}))


def _table(saved: dict[str, Any]) -> str:
    intro = (
        "One `servefleet generate` process against instant servers in other processes (1,800-token answers, 8,117-byte "
        "bodies, Parquet shards written). `answer held`: each answer held back that long, so servers × C requests are "
        "in flight as on real servers. CPU = the coordinator's process tree over the steady 10-90 % window. "
        "`before` = commit f828f35 (`--src`), `after` = this branch, measured in one sitting under "
        "`flock /tmp/servefleet-heavy.lock` on a 2-core machine shared with other agents (load average in the last column). "
        "H200 servers = completions/s ÷ 18.9 (34,000 tok/s at 1,800 tokens).\n\n"
    )
    head = (
        "| label | workers | servers×C | answer held | completions/s (steady) | CPU ms/completion | cores busy | per-core completions/s "
        "| peak RSS MB (tree) | server cores busy | H200 servers kept busy | load before → after |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    rows = []
    for label, res in saved.items():
        for r in res["runs"]:
            rows.append(
                f"| {label} | {r['workers']} | {r['servers']}×{r['concurrency_per_server']} | {r['answer_delay_s']:g}s "
                f"| {r['completions_per_s']:,.0f} "
                f"| {r['cpu_ms_per_completion']:.3f} | {r['coordinator_cores_busy']:.2f} | {r['per_core_rps']:,.0f} "
                f"| {r['peak_rss_mb_tree']:.0f} | {r['server_cores_busy']:.2f} | {r['h200_servers_kept_busy']:.0f} "
                f"| {r['load_before'][0]:.1f} → {r['load_after'][0]:.1f} |"
            )
    return intro + head + "\n".join(rows) + "\n"


if __name__ == "__main__":
    main()
