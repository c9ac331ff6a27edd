"""The HTTP layer's own cost per request: ``servefleet.http`` against raw aiohttp, side by side.

One instant HTTP server in another process (raw asyncio, keep-alive, every ``POST`` answered at
once with a fixed ~8 KB OpenAI-style body, as ``coordinator_ceiling.py``'s). In this process, one
aiohttp session per variant, ``--concurrency`` requests in flight, ``--requests`` per trial; the
variants alternate trial by trial (A B B A ...), so machine load falls on both alike:

* ``aiohttp``            -- ``session.post`` + ``read()`` (what generate's and bench's clients did
                            before the layer: the named baseline);
* ``http-request``       -- ``AiohttpTransport.request`` (generate's per-completion path);
* ``http-stream``        -- ``AiohttpTransport.stream`` + ``read()`` (bench's per-request path).

Measured: this process's CPU time (``time.process_time``) per request; the server's CPU is not
counted. Usage (heavy: take the lock)::

    flock /tmp/servefleet-heavy.lock .venv/bin/python benchmarks/http_overhead.py

Writes ``benchmarks/results/http_overhead.json`` and prints a table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
sys.path.insert(0, str(REPO / "src"))

SERVER = r"""
import asyncio, json, sys
body = json.dumps({"id": "x", "object": "text_completion", "model": "m",
                   "choices": [{"index": 0, "text": "tok " * 1800, "finish_reason": "length"}],
                   "usage": {"prompt_tokens": 16, "completion_tokens": 1800}}).encode()
head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
answer = head + body
async def handle(reader, writer):
    try:
        while True:
            headers = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in headers.split(b"\r\n"):
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:])
            if length:
                await reader.readexactly(length)
            writer.write(answer)
    except (asyncio.IncompleteReadError, ConnectionError):
        writer.close()
async def main():
    server = await asyncio.start_server(handle, "127.0.0.1", int(sys.argv[1]), backlog=1024)
    print("ready", flush=True)
    await server.serve_forever()
asyncio.run(main())
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def trial(variant: str, url: str, requests: int, concurrency: int, payload: bytes) -> float:
    """CPU seconds of this process per request, for one variant."""
    import aiohttp

    from servefleet.http import Pool, Timeout
    from servefleet.http.aiohttp_transport import AiohttpTransport

    timeout = Timeout(600.0, 10.0)
    headers = {"Content-Type": "application/json"}
    transport = AiohttpTransport(Pool(limit=0, keepalive_timeout_s=60), headers=headers, timeout=timeout)
    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, limit_per_host=0, ttl_dns_cache=300, keepalive_timeout=60),
        headers=headers,
    )
    raw_timeout = aiohttp.ClientTimeout(total=600.0, sock_connect=10.0)
    from yarl import URL

    target = URL(url)

    async def one() -> int:
        if variant == "aiohttp":
            async with session.post(target, data=payload, timeout=raw_timeout) as resp:
                data = await resp.read()
                return resp.status + len(data)
        if variant == "http-request":
            got = await transport.request("POST", target, body=payload, timeout=timeout)  # type: ignore[arg-type]
            return got.status + len(got.body)
        async with transport.stream("POST", target, body=payload) as stream:  # type: ignore[arg-type]
            data = await stream.read()
            return stream.status + len(data)

    left = requests

    async def worker() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            await one()

    try:
        await asyncio.gather(*(worker() for _ in range(concurrency)))  # warm: connections opened
        left = requests
        t0 = time.process_time()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return (time.process_time() - t0) / requests
    finally:
        await transport.aclose()
        await session.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=20_000)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=4, help="each variant runs 2 x rounds trials, in A B B A order")
    ap.add_argument("--out", type=Path, default=RESULTS / "http_overhead.json")
    args = ap.parse_args()
    port = free_port()
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(port)], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        url = f"http://127.0.0.1:{port}/v1/completions"
        payload = json.dumps({"model": "m", "prompt": "hello " * 64, "max_tokens": 1800}).encode()
        variants = ["aiohttp", "http-request", "http-stream"]
        cpu: dict[str, list[float]] = {v: [] for v in variants}
        load_before = os.getloadavg()
        for r in range(args.rounds):
            order = variants if r % 2 == 0 else variants[::-1]
            for v in order + order[::-1]:
                cpu[v].append(asyncio.run(trial(v, url, args.requests, args.concurrency, payload)))
        load_after = os.getloadavg()
    finally:
        server.kill()
        server.wait()
    base = statistics.median(cpu["aiohttp"])
    rows = {
        v: {
            "cpu_us_per_request_median": round(statistics.median(xs) * 1e6, 2),
            "cpu_us_per_request_all": [round(x * 1e6, 2) for x in xs],
            "ratio_to_aiohttp": round(statistics.median(xs) / base, 4),
        }
        for v, xs in cpu.items()
    }
    table = ["| variant | CPU µs/request (median) | vs raw aiohttp | all trials |", "|---|---|---|---|"]
    for v, row in rows.items():
        table.append(
            f"| {v} | {row['cpu_us_per_request_median']} | {row['ratio_to_aiohttp']:.3f} | "
            f"{', '.join(map(str, row['cpu_us_per_request_all']))} |"
        )
    result = {
        "benchmark": "http_overhead",
        "command": " ".join(["python", "benchmarks/http_overhead.py", *sys.argv[1:]]),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "loadavg_before": load_before,
            "loadavg_after": load_after,
        },
        "requests_per_trial": args.requests,
        "concurrency": args.concurrency,
        "answer_bytes": "~8 KB",
        "variants": rows,
        "table": "\n".join(table),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(result["table"])
    print(f"\nwritten to {args.out}")


if __name__ == "__main__":
    main()
