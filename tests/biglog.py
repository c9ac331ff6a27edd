"""Big vLLM logs synthesized from real fixture lines, for the bounded-diagnose tests and
benchmarks/diagnose_bounds.py: a real start-up, then request and metrics lines, with a real fatal
block placed at the start, in the middle or at the end. The expected verdict is known by construction."""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "logs"
READY_LOG = FIXTURES / "real" / "vllm_ready.log"
FATAL_LOG = FIXTURES / "real" / "vllm_kv_too_small.log"
WHERE = ("start", "middle", "end", "none")


def _lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


def startup() -> list[bytes]:
    """The real start-up of vllm_ready.log (its launch marker included), up to the first request."""
    lines = _lines(READY_LOG)
    end = next(i for i, line in enumerate(lines) if b"Application startup complete." in line)
    return lines[: end + 1]


def fatal_block() -> list[bytes]:
    """The real failure of vllm_kv_too_small.log: the engine core's ERROR block and what follows."""
    lines = _lines(FATAL_LOG)
    begin = next(i for i, line in enumerate(lines) if b"ERROR" in line)
    return lines[begin:]


def steady_unit(n: int = 2000, pid: int = 27765) -> bytes:
    """Request lines as uvicorn prints them in vLLM's API server, a metrics line every 100, and a
    request-level error now and then (not fatal: the server goes on; its traceback is left out, as
    a bare exception line after ready reads as fatal to the classifier, with or without a bounded read)."""
    out = io.BytesIO()
    for i in range(n):
        out.write(
            f'(APIServer pid={pid}) INFO:     127.0.0.1:{40000 + i % 20000} - "POST /v1/completions HTTP/1.1" 200 OK\n'.encode()
        )
        if i % 100 == 99:
            out.write(
                f"(APIServer pid={pid}) INFO 11-30 02:{i % 60:02d}:00 [loggers.py:123] Engine 000: Avg prompt throughput: {i % 977}.3 tokens/s, "
                f"Avg generation throughput: {i % 1999}.1 tokens/s, Running: {i % 64} reqs, Waiting: 0 reqs, GPU KV cache usage: {i % 90}.5%, "
                f"Prefix cache hit rate: 0.0%\n".encode()
            )
        if i % 1000 == 999:
            out.write(
                f"(APIServer pid={pid}) ERROR 11-30 02:{i % 60:02d}:01 [serving_completion.py:150] Error in preprocessing prompt inputs\n".encode()
            )
            out.write(
                f'(APIServer pid={pid}) INFO:     127.0.0.1:{30000 + i} - "POST /v1/completions HTTP/1.1" 400 Bad Request\n'.encode()
            )
    return out.getvalue()


@dataclass(frozen=True)
class BigLog:
    path: Path
    size: int
    fatal_line: int | None  # 1-based line number of the fatal block's first line (None: no block)


def write_log(path: Path, size: int, where: str) -> BigLog:
    """A log of about ``size`` bytes with the fatal block at ``where`` (start: a failed first launch,
    then a marker and a healthy one; middle: a crash half-way, then shutdown noise and failing requests;
    end: a crash at the end; none: healthy throughout)."""
    assert where in WHERE
    unit = steady_unit()
    head, block = startup(), fatal_block()
    lines_written = 0
    fatal_line = None
    with path.open("wb") as fh:

        def put(chunk: list[bytes] | bytes) -> None:
            nonlocal lines_written
            data = b"".join(chunk) if isinstance(chunk, list) else chunk
            fh.write(data)
            lines_written += data.count(b"\n")

        def fill(until: int) -> None:
            while fh.tell() + len(unit) <= until:
                put(unit)

        if where == "start":  # a failed first launch, then a healthy second one below a new marker
            put(head[:-40])
            fatal_line = lines_written + 1
            put(block)
        put(head)
        if where == "middle":
            fill(size // 2)
            fatal_line = lines_written + 1
            put(block)
            noise = b'(APIServer pid=27765) INFO:     127.0.0.1:41000 - "POST /v1/completions HTTP/1.1" 500 Internal Server Error\n'
            fill_noise = noise * (len(unit) // len(noise))
            while fh.tell() + len(fill_noise) <= size - len(unit):
                put(fill_noise)
        fill(size - (sum(map(len, block)) if where == "end" else 0))
        if where == "end":
            fatal_line = lines_written + 1
            put(block)
    return BigLog(path, path.stat().st_size, fatal_line)
