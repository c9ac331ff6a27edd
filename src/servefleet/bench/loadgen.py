"""The scheduler: drives one share of a point through a :class:`Backend` in one event loop.

Two shapes of load:

* closed loop (``concurrency``): N users, each sending its next request as soon as its last
  one finished — the way a batch job drives a server;
* open loop (``rate``): Poisson arrivals at a given rate, optionally capped in flight.

A point ends after a number of requests or a duration (no new request starts after the
deadline; those in flight finish and count). Warm-up requests run first, at the point's
concurrency, so connections are open and the server is past its first-request costs; they are
marked and excluded. The same code runs in the calling process or in each worker process of
``pool.py`` (several processes share a point when one event loop would be the limit).
"""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from time import perf_counter

from servefleet.bench.client import Backend, PreparedRequest, RequestRecord
from servefleet.bench.selfcheck import LoopProbe, WorkerLoad

__all__ = ["ShareJob", "warm_up", "run_share", "split_share"]


@dataclass(frozen=True)
class ShareJob:
    """One process's part of one point."""

    concurrency: int | None  # closed-loop users; in rate mode the in-flight cap (None: no cap)
    rate: float | None  # Poisson arrivals per second (rate mode)
    requests: int | None  # measured requests to send (None: until the deadline)
    duration_s: float | None
    seed: int = 0


def _cycle(requests: Sequence[PreparedRequest], limit: int | None) -> Iterator[PreparedRequest]:
    it = itertools.cycle(requests)
    return itertools.islice(it, limit) if limit is not None else it


async def warm_up(backend: Backend, requests: Sequence[PreparedRequest], concurrency: int) -> int:
    """Send ``requests`` at ``concurrency``; returns how many succeeded (results discarded)."""
    if not requests:
        return 0
    it = iter(requests)
    ok = 0

    async def user() -> None:
        nonlocal ok
        for req in it:
            rec = await backend.send(req)
            ok += rec.ok

    await asyncio.gather(*(user() for _ in range(max(1, min(concurrency, len(requests))))))
    return ok


async def _closed(
    backend: Backend, it: Iterator[PreparedRequest], users: int, deadline: float | None, records: list[RequestRecord]
) -> None:
    async def user() -> None:
        send = backend.send
        append = records.append
        for req in it:
            if deadline is not None and perf_counter() >= deadline:
                return
            append(await send(req))

    await asyncio.gather(*(user() for _ in range(users)))


async def _open(
    backend: Backend,
    it: Iterator[PreparedRequest],
    rate: float,
    cap: int | None,
    deadline: float | None,
    seed: int,
    records: list[RequestRecord],
) -> None:
    rng = random.Random(seed)
    sem = asyncio.Semaphore(cap) if cap else None
    tasks: set[asyncio.Task] = set()

    async def one(req: PreparedRequest) -> None:
        try:
            records.append(await backend.send(req))
        finally:
            if sem is not None:
                sem.release()

    due = perf_counter()
    loop = asyncio.get_running_loop()
    for req in it:
        due += rng.expovariate(rate)
        if deadline is not None and due >= deadline:
            break
        delay = due - perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        if sem is not None:
            await sem.acquire()
        task = loop.create_task(one(req))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    if tasks:
        await asyncio.gather(*tasks)


async def run_share(
    backend: Backend, requests: Sequence[PreparedRequest], job: ShareJob, start_at: float | None = None
) -> tuple[list[RequestRecord], WorkerLoad]:
    """Run the measured part of one share; returns its records and the self-check."""
    if start_at is not None:
        delay = start_at - perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
    records: list[RequestRecord] = []
    probe = LoopProbe()
    probe.start()
    t0 = perf_counter()
    deadline = t0 + job.duration_s if job.duration_s else None
    it = _cycle(requests, job.requests)
    if job.rate:
        await _open(backend, it, job.rate, job.concurrency, deadline, job.seed, records)
    else:
        await _closed(backend, it, max(1, job.concurrency or 1), deadline, records)
    load = await probe.stop()
    return records, load


def split_share(total: int | None, parts: int) -> list[int | None]:
    """Split ``total`` into ``parts`` near-equal integers (None stays None)."""
    if total is None:
        return [None] * parts
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]
