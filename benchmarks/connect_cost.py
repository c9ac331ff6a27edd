"""What a connection that never meets itself costs: ``servefleet.sockets.socket_for`` against a plain socket.

``socket_for`` binds a socket to a loopback address before it connects (one ``setsockopt`` and one ``bind``
more). Every new connection of servefleet's HTTP clients goes through it: readiness probes open one per
probe (no kept connections), the job's and the bench's clients one per pooled connection. Measured here:
wall time per connect + accept + close on loopback, one listener in this process, the two variants
alternating trial by trial (A B B A ...) so machine load falls on both alike. Baseline: ``plain``
(``socket.socket`` as aiohttp makes it without a ``socket_factory``).

    .venv/bin/python benchmarks/connect_cost.py

Writes ``benchmarks/results/connect_cost.json`` and prints a table.
"""

from __future__ import annotations

import argparse
import json
import platform
import socket
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
sys.path.insert(0, str(REPO / "src"))

from servefleet.sockets import socket_for  # noqa: E402


def trial(make: Callable[[], socket.socket], listener: socket.socket, address: tuple, n: int) -> float:
    """Microseconds per connect + accept + close."""
    start = time.perf_counter()
    for _ in range(n):
        sock = make()
        sock.connect(address)
        accepted, _ = listener.accept()
        accepted.close()
        sock.close()
    return (time.perf_counter() - start) / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--connections", type=int, default=2000, help="per trial")
    ap.add_argument("--rounds", type=int, default=4, help="each variant runs 2 x rounds trials, in A B B A order")
    ap.add_argument("--out", type=Path, default=RESULTS / "connect_cost.json")
    args = ap.parse_args()

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4096)
    info = socket.getaddrinfo(*listener.getsockname(), type=socket.SOCK_STREAM)[0]
    variants: dict[str, Callable[[], socket.socket]] = {
        "plain": lambda: socket.socket(info[0], info[1], info[2]),
        "socket_for": lambda: socket_for(info),
    }
    times: dict[str, list[float]] = {name: [] for name in variants}
    with listener:
        for r in range(args.rounds):
            order = list(variants) if r % 2 == 0 else list(reversed(variants))
            for name in order + order[::-1]:
                times[name].append(trial(variants[name], listener, info[4], args.connections))
    result = {
        "machine": {"python": platform.python_version(), "platform": platform.platform()},
        "connections_per_trial": args.connections,
        "us_per_connection": {name: statistics.median(ts) for name, ts in times.items()},
        "trials_us": times,
    }
    base = result["us_per_connection"]["plain"]
    result["ratio_vs_plain"] = {name: us / base for name, us in result["us_per_connection"].items()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print("| variant | µs per connect + accept + close (median) | vs plain |")
    print("|---|---|---|")
    for name, us in result["us_per_connection"].items():
        print(f"| {name} | {us:.1f} | {result['ratio_vs_plain'][name]:.2f} |")
    print(f"results: {args.out}")


if __name__ == "__main__":
    main()
