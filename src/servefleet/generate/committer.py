"""Turns answered rows into committed shards, off the event loop, one shard at a time.

Rows are added synchronously by the dispatcher (never blocking it); a full buffer -- by rows, bytes
or age -- is queued and committed through the :class:`~servefleet.generate.ledger.Ledger` in a worker
thread. When commits fall behind (slow object storage), ``backlogged`` turns true and the dispatcher
stops sending until a commit finishes, so memory stays bounded by a couple of shards.

A failed commit is retried with backoff; if it keeps failing the job stops with the error (the
rows of that shard were never visible, so a resumed run generates them again).
"""

from __future__ import annotations

import asyncio
import logging

from servefleet.generate.ledger import Ledger, LedgerEntry
from servefleet.generate.shards import OutputRow, ShardBuffer
from servefleet.generate.stats import JobStats

__all__ = ["Committer"]

log = logging.getLogger(__name__)


class Committer:
    def __init__(self, ledger: Ledger, buffer: ShardBuffer, stats: JobStats, *, max_backlog: int = 2,
                 commit_attempts: int = 5, tick_s: float = 0.5) -> None:
        self.ledger = ledger
        self.buffer = buffer
        self.stats = stats
        self.max_backlog = max_backlog
        self.commit_attempts = commit_attempts
        self.tick_s = tick_s
        self._queue: asyncio.Queue[ShardBuffer | None] = asyncio.Queue()
        self._room = asyncio.Event()
        self._room.set()
        self._committing = 0
        self._task: asyncio.Task[None] | None = None
        self._ticker: asyncio.Task[None] | None = None

    # ---- the dispatcher's side (RowSink) --------------------------------------------------------
    def add(self, row: OutputRow) -> None:
        self.buffer.add(row)
        if self.buffer.full():
            self._enqueue()

    @property
    def backlogged(self) -> bool:
        return self._queue.qsize() + self._committing >= self.max_backlog

    async def wait_room(self) -> None:
        while self.backlogged:
            self._room.clear()
            await self._room.wait()

    # ---- life cycle -----------------------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())
        self._ticker = asyncio.ensure_future(self._tick())

    async def close(self) -> None:
        """Commit what is buffered and wait for every queued shard to be committed."""
        if self._ticker is not None:
            self._ticker.cancel()
            await asyncio.gather(self._ticker, return_exceptions=True)
        if len(self.buffer):
            self._enqueue()
        self._queue.put_nowait(None)
        if self._task is not None:
            await self._task

    def _enqueue(self) -> None:
        self._queue.put_nowait(self.buffer.take())

    async def _tick(self) -> None:
        """Age-based rotation: a slow trickle of rows still becomes a shard every few seconds."""
        while True:
            await asyncio.sleep(self.tick_s)
            if self.buffer.full():
                self._enqueue()

    async def _run(self) -> None:
        while True:
            buf = await self._queue.get()
            if buf is None:
                return
            self._committing = 1
            try:
                entry = await self._commit(buf)
            finally:
                self._committing = 0
                self._room.set()
            self.stats.committed += entry.rows
            self.stats.shards += 1

    async def _commit(self, buf: ShardBuffer) -> LedgerEntry:
        staged = await asyncio.to_thread(self.ledger.stage, buf)
        delay = 1.0
        for attempt in range(1, self.commit_attempts + 1):
            try:
                return await asyncio.to_thread(self.ledger.publish, staged)
            except OSError as exc:
                if attempt == self.commit_attempts:
                    raise
                self.stats.event(f"commit of {staged.entry.shard} failed ({exc}); retrying in {delay:.0f}s")
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)
        raise AssertionError("unreachable")

    @property
    def failed(self) -> BaseException | None:
        if self._task is not None and self._task.done() and not self._task.cancelled():
            return self._task.exception()
        return None
