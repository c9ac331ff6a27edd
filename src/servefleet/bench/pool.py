"""Where the load runs: in this process, or spread over worker processes.

One asyncio event loop on one core tops out at some tens of thousands of streamed chunks a
second; past that the client, not the server, sets the pace. A :class:`ProcessRunner` starts
worker processes once per run (each with its own loop, HTTP session and share of the point's
concurrency or rate), runs every share's warm-up, then starts them together at one
``perf_counter`` instant (CLOCK_MONOTONIC, shared by processes on Linux) and merges the records.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import traceback
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from time import perf_counter
from typing import Any, Protocol

from servefleet.bench.client import EndpointConfig, OpenAIBackend, PreparedRequest, RequestRecord
from servefleet.bench.loadgen import ShareJob, run_share, warm_up
from servefleet.bench.selfcheck import WorkerLoad
from servefleet.errors import ServefleetError

__all__ = ["Share", "Runner", "InProcessRunner", "ProcessRunner", "WorkerError", "loop_factory", "START_DELAY_S"]

START_DELAY_S = 0.05  # time for every worker to receive "go" before the common start


class WorkerError(ServefleetError):
    """A load-generating worker process died or failed."""


@dataclass(frozen=True)
class Share:
    job: ShareJob
    requests: Sequence[PreparedRequest]
    warmup: Sequence[PreparedRequest] = ()
    warmup_concurrency: int = 1


class Runner(Protocol):
    workers: int

    async def start(self) -> None: ...

    async def run_point(
        self,
        shares: Sequence[Share],
        on_warm: Callable[[], Awaitable[None]] | None = None,
    ) -> tuple[list[RequestRecord], list[WorkerLoad]]: ...

    async def close(self) -> None: ...


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The event loop for load generation: asyncio's own unless ``SERVEFLEET_EVENT_LOOP=uvloop``.

    Measured on 16 cores against the instant sim (benchmarks/client_overhead.py): with aiohttp,
    uvloop was not faster here (streamed, one process: 1.85k req/s on asyncio against 1.19k on
    uvloop at concurrency 64; equal within noise without streaming), so it is opt-in.
    """
    if os.environ.get("SERVEFLEET_EVENT_LOOP", "").lower() != "uvloop":
        return None
    try:
        import uvloop  # optional
    except ImportError:
        return None
    return uvloop.new_event_loop


class InProcessRunner:
    """One share, in the caller's event loop."""

    workers = 1

    def __init__(self, endpoint: EndpointConfig, connections: int) -> None:
        self.backend = OpenAIBackend(endpoint)
        self.connections = connections

    async def start(self) -> None:
        await self.backend.open(self.connections)

    async def run_point(
        self,
        shares: Sequence[Share],
        on_warm: Callable[[], Awaitable[None]] | None = None,
    ) -> tuple[list[RequestRecord], list[WorkerLoad]]:
        """Warm up, call ``on_warm`` (a scrape between warm-up and measurement), then measure."""
        if len(shares) != 1:
            raise ValueError("InProcessRunner runs exactly one share")
        share = shares[0]
        await warm_up(self.backend, share.warmup, share.warmup_concurrency)
        if on_warm is not None:
            await on_warm()
        records, load = await run_share(self.backend, share.requests, share.job)
        return records, [load]

    async def close(self) -> None:
        await self.backend.close()


def _worker_main(conn: Connection, endpoint: EndpointConfig, connections: int) -> None:
    factory = loop_factory()
    try:
        with asyncio.Runner(loop_factory=factory) as runner:
            runner.run(_worker_loop(conn, endpoint, connections))
    except KeyboardInterrupt:
        pass


async def _worker_loop(conn: Connection, endpoint: EndpointConfig, connections: int) -> None:
    loop = asyncio.get_running_loop()
    backend = OpenAIBackend(endpoint)
    await backend.open(connections)
    conn.send(("ready",))
    try:
        while True:
            msg = await loop.run_in_executor(None, conn.recv)
            if msg[0] == "stop":
                return
            try:
                _, share = msg
                ok = await warm_up(backend, share.warmup, share.warmup_concurrency)
                conn.send(("warm", ok))
                go = await loop.run_in_executor(None, conn.recv)
                if go[0] == "stop":
                    return
                records, load = await run_share(backend, share.requests, share.job, start_at=go[1])
                conn.send(("done", records, load))
            except Exception:  # reported to the coordinator, which raises
                conn.send(("error", traceback.format_exc()))
    finally:
        await backend.close()


class ProcessRunner:
    """``workers`` processes, started once and reused for every point."""

    def __init__(self, endpoint: EndpointConfig, connections_per_worker: int, workers: int) -> None:
        self.endpoint = endpoint
        self.connections = connections_per_worker
        self.workers = workers
        self._procs: list[multiprocessing.process.BaseProcess] = []
        self._conns: list[Connection] = []

    async def _recv(self, i: int) -> Any:
        loop = asyncio.get_running_loop()
        try:
            msg = await loop.run_in_executor(None, self._conns[i].recv)
        except (EOFError, OSError) as exc:
            code = self._procs[i].exitcode
            raise WorkerError(f"bench worker {i} died (exit code {code})") from exc
        if msg[0] == "error":
            raise WorkerError(f"bench worker {i} failed:\n{msg[1]}")
        return msg

    async def start(self) -> None:
        ctx = multiprocessing.get_context("spawn")  # no fork of a process with a running loop
        for i in range(self.workers):
            parent, child = ctx.Pipe()
            proc = ctx.Process(
                target=_worker_main,
                args=(child, self.endpoint, self.connections),
                name=f"servefleet-bench-{i}",
                daemon=True,
            )
            proc.start()
            child.close()
            self._procs.append(proc)
            self._conns.append(parent)
        await asyncio.gather(*(self._recv(i) for i in range(self.workers)))

    async def run_point(
        self,
        shares: Sequence[Share],
        on_warm: Callable[[], Awaitable[None]] | None = None,
    ) -> tuple[list[RequestRecord], list[WorkerLoad]]:
        if len(shares) > self.workers:
            raise ValueError(f"{len(shares)} shares for {self.workers} workers")
        used = range(len(shares))
        for i in used:
            self._conns[i].send(("point", shares[i]))
        await asyncio.gather(*(self._recv(i) for i in used))
        if on_warm is not None:
            await on_warm()
        start_at = perf_counter() + START_DELAY_S
        for i in used:
            self._conns[i].send(("go", start_at))
        results = await asyncio.gather(*(self._recv(i) for i in used))
        records = [rec for msg in results for rec in msg[1]]
        return records, [msg[2] for msg in results]

    async def close(self) -> None:
        for conn in self._conns:
            try:
                conn.send(("stop",))
            except (OSError, BrokenPipeError):
                pass
        loop = asyncio.get_running_loop()
        for proc in self._procs:
            await loop.run_in_executor(None, proc.join, 10)
            if proc.is_alive():
                proc.terminate()
                await loop.run_in_executor(None, proc.join, 5)
        for conn in self._conns:
            conn.close()
        self._procs, self._conns = [], []
