"""What --samples and --logprobs cost the coordinator: CPU per completion and bytes per row, against plain rows.

Against instant servers (raw-asyncio HTTP in another process, every answer pre-built and sent at once, as in
``coordinator_ceiling.py``), the real CLI runs one job per variant and writes real Parquet shards:

* ``plain`` -- one choice of ``--answer-tokens`` tokens per request, one row per record;
* ``samples8_n`` -- ``--samples 8 --sample-mode n``: one request per record, the answer has 8 choices (8 rows);
* ``samples8_requests`` -- ``--samples 8 --sample-mode requests``: 8 requests per record, one choice each;
* ``logprobs5`` -- ``--logprobs 5``: one choice with vLLM-shaped completions logprobs (``token_id:N`` tokens, 5
  alternatives per position);
* ``prompt_logprobs5`` -- ``--prompt-logprobs 5``: a plain answer plus vLLM-shaped ``prompt_logprobs`` of the
  records' 31-token prompts (``null``, then per token ``{id: {logprob, rank, decoded_token}}``, 5 or 6 entries).

CPU is the coordinator process's own (user + system, from ``wait4``), minus the same command's CPU on the finished
destination (start-up, reading the ledger: nothing sent), divided by requests and by rows. Bytes per row: the
committed shards' size on disk (zstd Parquet) and Arrow's in-memory size, per row.

Usage (heavy: take the lock)::

    flock /tmp/servefleet-heavy.lock .venv/bin/python benchmarks/dataset_rows.py

Writes ``benchmarks/results/dataset_rows.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
RESULTS = REPO / "benchmarks" / "results"
WORDS = (
    "the of and to in is was for on that with as by at from data model answer token server batch cache prompt".split()
)


VOCAB = [f"{WORDS[i % len(WORDS)]}{i // len(WORDS)}" if i >= len(WORDS) else WORDS[i] for i in range(4000)]


PROMPT_TOKENS = 31  # the records' 30 words and a BOS


def _prompt_logprobs(rng: random.Random, k: int) -> list[Any]:
    out: list[Any] = [None]
    for _ in range(PROMPT_TOKENS - 1):
        t, rank = min(int(rng.paretovariate(1.1)), 3999), 1 + int(rng.expovariate(0.3))
        lps = sorted((round(-rng.expovariate(1.0) - 0.01 * j, 6) for j in range(k + 1)), reverse=True)
        pos = {str(t): {"logprob": lps[min(rank, k + 1) - 1], "rank": rank, "decoded_token": VOCAB[t]}}
        for j in range(1, k + 1):
            a = t if j == rank else (t + 97 * j) % 32000
            pos.setdefault(str(a), {"logprob": lps[j - 1], "rank": j, "decoded_token": VOCAB[a % 4000]})
        out.append(pos)
    return out


def _answer(
    tokens: int, choices: int, logprobs: int | None, seed: int = 0, prompt_logprobs: int | None = None
) -> bytes:
    """One answer body; pseudo-random text, ids and logprobs (a pool of them is served in turn, so shards
    do not compress identical rows away)."""
    rng = random.Random(seed)
    out = []
    for c in range(choices):
        ids = [min(int(rng.paretovariate(1.1)), 3999) for _ in range(tokens)]  # a few common tokens, a long tail
        choice: dict[str, Any] = {
            "index": c,
            "text": "".join(" " + VOCAB[t] for t in ids),
            "logprobs": None,
            "finish_reason": "length",
        }
        if prompt_logprobs is not None:
            choice["prompt_logprobs"] = _prompt_logprobs(rng, prompt_logprobs)
        if logprobs is not None:
            lps = [round(-rng.expovariate(2.0), 6) for _ in ids]
            choice["logprobs"] = {
                "tokens": [f"token_id:{t}" for t in ids],
                "token_logprobs": lps,
                "top_logprobs": [
                    {
                        f"token_id:{(t + 97 * j) % 32000}": round(lp - rng.expovariate(0.5) * (j > 0) - j * 0.01, 6)
                        for j in range(logprobs)
                    }
                    for t, lp in zip(ids, lps, strict=True)
                ],
                "text_offset": None,
            }
        out.append(choice)
    usage = {"prompt_tokens": 40, "completion_tokens": tokens * choices, "total_tokens": 40 + tokens * choices}
    return json.dumps(
        {"id": "cmpl-x", "object": "text_completion", "created": 0, "model": "instant", "choices": out, "usage": usage}
    ).encode()


class _Instant(asyncio.Protocol):
    turn = 0

    def __init__(self, answers: list[bytes], models: bytes) -> None:
        self.answers, self.models, self.buf = answers, models, b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while (end := self.buf.find(b"\r\n\r\n")) >= 0:
            head = self.buf[:end]
            length = next(
                (int(line[15:]) for line in head.split(b"\r\n")[1:] if line[:15].lower() == b"content-length:"), 0
            )
            if len(self.buf) < end + 4 + length:
                return
            self.buf = self.buf[end + 4 + length :]
            path = head.split(b" ", 2)[1]
            if path.endswith(b"completions"):
                _Instant.turn += 1
                body = self.answers[_Instant.turn % len(self.answers)]
            else:
                body = self.models
            assert self.transport is not None
            self.transport.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                + str(len(body)).encode()
                + b"\r\n\r\n"
                + body
            )


def serve(tokens: int, choices: int, logprobs: int | None, prompt_logprobs: int | None = None) -> None:
    models = json.dumps({"object": "list", "data": [{"id": "instant", "object": "model"}]}).encode()
    answers = [
        _answer(tokens, choices, logprobs, seed, prompt_logprobs)
        for seed in range(256 if logprobs is not None else 1024)
    ]
    loop = asyncio.new_event_loop()
    server = loop.run_until_complete(
        loop.create_server(lambda: _Instant(answers, models), "127.0.0.1", 0, backlog=4096)
    )
    loop.add_signal_handler(signal.SIGTERM, loop.stop)
    print(f"ready {server.sockets[0].getsockname()[1]}", flush=True)
    loop.run_forever()


def _cpu_of(cmd: list[str]) -> tuple[float, float, int]:
    """(CPU seconds, wall seconds, exit code) of one CLI run."""
    t0 = time.monotonic()
    proc = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(REPO / "src")}
    )
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return usage.ru_utime + usage.ru_stime, time.monotonic() - t0, proc.returncode


VARIANTS: dict[str, dict[str, Any]] = {
    "plain": {"choices": 1, "logprobs": None, "flags": [], "rows_per_record": 1, "requests_per_record": 1},
    "samples8_n": {
        "choices": 8,
        "logprobs": None,
        "flags": ["--samples", "8", "--sample-mode", "n"],
        "rows_per_record": 8,
        "requests_per_record": 1,
    },
    "samples8_requests": {
        "choices": 1,
        "logprobs": None,
        "flags": ["--samples", "8", "--sample-mode", "requests"],
        "rows_per_record": 8,
        "requests_per_record": 8,
    },
    "logprobs5": {
        "choices": 1,
        "logprobs": 5,
        "flags": ["--logprobs", "5"],
        "rows_per_record": 1,
        "requests_per_record": 1,
    },
    "prompt_logprobs5": {
        "choices": 1,
        "logprobs": None,
        "prompt_logprobs": 5,
        "flags": ["--prompt-logprobs", "5"],
        "rows_per_record": 1,
        "requests_per_record": 1,
    },
}


def run_variant(name: str, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    import pyarrow.parquet as pq

    v = VARIANTS[name]
    records = args.records // v["rows_per_record"] if name.startswith("samples") else args.records
    if v["logprobs"] is not None:
        records = args.logprobs_records
    src = tmp / f"{name}.jsonl"
    with open(src, "w") as f:
        for i in range(records):
            f.write(
                json.dumps({"id": f"p{i:07d}", "prompt": " ".join(WORDS[(i + k) % len(WORDS)] for k in range(30))})
                + "\n"
            )
    sp = subprocess.Popen(
        [
            PYTHON,
            __file__,
            "serve",
            "--tokens",
            str(args.answer_tokens),
            "--choices",
            str(v["choices"]),
            *(["--logprobs", str(v["logprobs"])] if v["logprobs"] is not None else []),
            *(["--prompt-logprobs", str(v["prompt_logprobs"])] if v.get("prompt_logprobs") is not None else []),
        ],
        stdout=subprocess.PIPE,
    )
    try:
        assert sp.stdout is not None
        port = int(sp.stdout.readline().split()[1])
        out = tmp / f"out-{name}"
        cmd = [
            PYTHON,
            "-m",
            "servefleet.cli.main",
            "generate",
            "-i",
            str(src),
            "-o",
            str(out),
            "--url",
            f"http://127.0.0.1:{port}",
            "--max-tokens",
            str(args.answer_tokens),
            "--concurrency",
            str(args.concurrency),
            "--json",
            *v["flags"],
        ]
        cpu, wall, rc = _cpu_of(cmd)
        assert rc == 0, f"{name}: generate exited {rc}"
        idle_cpu, _, rc = _cpu_of(cmd)  # the finished job: start-up and ledger only
        assert rc == 0
    finally:
        sp.terminate()
        sp.wait(10)
    shards = sorted((out / "shards").glob("*.parquet"))
    rows = sum(pq.read_metadata(s).num_rows for s in shards)
    disk = sum(s.stat().st_size for s in shards)
    arrow = sum(pq.read_table(s).nbytes for s in shards)
    requests = records * v["requests_per_record"]
    work = max(cpu - idle_cpu, 1e-9)
    shutil.rmtree(out, ignore_errors=True)
    return {
        "variant": name,
        "records": records,
        "requests": requests,
        "rows": rows,
        "answer_tokens": args.answer_tokens,
        "answer_bytes": len(_answer(args.answer_tokens, v["choices"], v["logprobs"], 0, v.get("prompt_logprobs"))),
        "cpu_s": round(cpu, 3),
        "startup_cpu_s": round(idle_cpu, 3),
        "wall_s": round(wall, 2),
        "cpu_ms_per_request": round(1000 * work / requests, 4),
        "cpu_ms_per_row": round(1000 * work / rows, 4),
        "disk_bytes_per_row": round(disk / rows, 1),
        "arrow_bytes_per_row": round(arrow / rows, 1),
    }


def _table(res: dict[str, Any]) -> str:
    base = next(r for r in res["runs"] if r["variant"] == "plain")
    head = (
        f"`servefleet generate` against an instant server (pseudo-random answers of {base['answer_tokens']} tokens, concurrency "
        f"{res['concurrency']}, zstd Parquet), on a {res['cpus']}-core machine shared with other agents (load {res['load'][0]:.1f} before). "
        "CPU: the coordinator process, minus the same command on the finished destination. Ratios against `plain`.\n\n"
        "| variant | records | requests | rows | answer bytes | CPU ms/request | CPU ms/row | × plain per row | disk bytes/row | "
        "× plain | Arrow bytes/row |\n|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    lines = [
        f"| {r['variant']} | {r['records']:,} | {r['requests']:,} | {r['rows']:,} | {r['answer_bytes']:,} | {r['cpu_ms_per_request']:.3f} "
        f"| {r['cpu_ms_per_row']:.3f} | {r['cpu_ms_per_row'] / base['cpu_ms_per_row']:.2f} | {r['disk_bytes_per_row']:,.0f} "
        f"| {r['disk_bytes_per_row'] / base['disk_bytes_per_row']:.2f} | {r['arrow_bytes_per_row']:,.0f} |"
        for r in res["runs"]
    ]
    return head + "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd")
    sv = sub.add_parser("serve")
    sv.add_argument("--tokens", type=int, default=512)
    sv.add_argument("--choices", type=int, default=1)
    sv.add_argument("--logprobs", type=int, default=None)
    sv.add_argument("--prompt-logprobs", type=int, default=None)
    ap.add_argument(
        "--records", type=int, default=16000, help="rows per variant (records / 8 for the samples variants)"
    )
    ap.add_argument(
        "--logprobs-records",
        type=int,
        default=4000,
        help="records of the logprobs variant (its answers are ~40x larger)",
    )
    ap.add_argument("--answer-tokens", type=int, default=512)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--no-save", action="store_true")
    args = ap.parse_args()
    if args.cmd == "serve":
        serve(args.tokens, args.choices, args.logprobs, args.prompt_logprobs)
        return
    tmp = Path(tempfile.mkdtemp(prefix="dataset-rows-"))
    load = os.getloadavg()
    try:
        runs = []
        for name in args.variants.split(","):
            runs.append(run_variant(name, args, tmp))
            print(json.dumps(runs[-1]), flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    res = {
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "cpus": os.cpu_count(),
        "load": list(load),
        "concurrency": args.concurrency,
        "runs": runs,
    }
    if not args.no_save:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "dataset_rows.json").write_text(json.dumps(res, indent=1) + "\n")
        (RESULTS / "dataset_rows.md").write_text(_table(res))
    print(_table(res))


if __name__ == "__main__":
    main()
