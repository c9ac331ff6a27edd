"""Turns answered rows into committed shards, off the event loop, one shard at a time.

Rows are added synchronously by the dispatcher (never blocking it); a full buffer -- by rows, bytes
or age -- is queued and committed through the :class:`~servefleet.generate.ledger.Ledger` in a worker
thread. When commits fall behind (slow object storage), ``backlogged`` turns true and the dispatcher
stops sending until a commit finishes, so memory stays bounded by a couple of shards.

A failed commit is retried with backoff; if it keeps failing, or fails in a way that waiting does
not mend (the disk is full, the folder read-only), the committer stops: ``broken`` is set at once
(the runner ends the run on it) and ``error`` says what failed. The rows not committed were never
visible, so a resumed run generates them again.
"""

from __future__ import annotations

import asyncio
import errno
import logging

from servefleet.errors import ServefleetError
from servefleet.generate.ledger import Ledger, LedgerEntry
from servefleet.generate.shards import OutputRow, ShardBuffer
from servefleet.generate.stats import JobStats

__all__ = ["Committer", "CommitFailed"]

log = logging.getLogger(__name__)

# errors that another attempt in a few seconds does not mend: the run ends at the first
LASTING = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM})


def lasting(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in LASTING


class CommitFailed(ServefleetError):
    """Answered rows could not be committed (the disk is full, ...): the run ended on it."""

    def __init__(self, destination: str, path: str | None, error: OSError, uncommitted: int, committed: int) -> None:
        self.destination, self.path, self.error = destination, path, error
        self.uncommitted, self.committed = uncommitted, committed
        where = f"{path} (in {destination})" if path else destination
        super().__init__(
            f"could not commit a shard: writing {where} failed: {error}; {uncommitted:,} answered rows were not committed "
            f"(a resumed run asks them again), {committed:,} were in this run. Free space at {destination} (or fix what the "
            "error names) and run the same command again to resume"
        )


class Committer:
    def __init__(
        self,
        ledger: Ledger,
        buffer: ShardBuffer,
        stats: JobStats,
        *,
        max_backlog: int = 2,
        commit_attempts: int = 5,
        tick_s: float = 0.5,
        retry_delay_s: float = 1.0,
    ) -> None:
        self.ledger = ledger
        self.buffer = buffer
        self.stats = stats
        self.max_backlog = max_backlog
        self.commit_attempts = commit_attempts
        self.tick_s = tick_s
        self.retry_delay_s = retry_delay_s  # the first retry's wait, doubling up to 30 s
        self._queue: asyncio.Queue[ShardBuffer | None] = asyncio.Queue()
        self._room = asyncio.Event()
        self._room.set()
        self._committing = 0
        self._task: asyncio.Task[None] | None = None
        self._ticker: asyncio.Task[None] | None = None
        self.broken = asyncio.Event()  # set when a commit failed for good: nothing more will be committed
        self.error: Exception | None = None  # ... and why
        self.failed_shard: str | None = None  # the shard it was committing (its staging file, when known)

    # ---- the dispatcher's side (RowSink) --------------------------------------------------------
    def add(self, row: OutputRow) -> None:
        self.buffer.add(row)
        if self.buffer.full():
            self._enqueue()

    def add_many(self, rows: list[OutputRow]) -> None:
        """Rows that must land in one shard (an id's samples: samples.py)."""
        for row in rows:
            self.buffer.add(row)
        if self.buffer.full():
            self._enqueue()

    @property
    def backlogged(self) -> bool:
        """Behind (or broken: then ``wait_room`` raises the commit's error)."""
        return self.error is not None or self._queue.qsize() + self._committing >= self.max_backlog

    async def wait_room(self) -> None:
        while self.backlogged:
            if self.error is not None:
                raise self.error
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
        if self.broken.is_set():  # nothing more can be committed; the rows left are counted by the caller
            return
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
            except Exception as exc:  # the run ends on it (runner.py): never a silent stop
                self.error = exc
                self.broken.set()
                return
            finally:
                self._committing = 0
                self._room.set()
            self.stats.committed += entry.rows
            self.stats.shards += 1

    async def _commit(self, buf: ShardBuffer) -> LedgerEntry:
        staged = await asyncio.to_thread(self.ledger.stage, buf)
        self.failed_shard = staged.local_path
        delay = self.retry_delay_s
        for attempt in range(1, self.commit_attempts + 1):
            try:
                entry = await asyncio.to_thread(self.ledger.publish, staged)
                self.failed_shard = None
                return entry
            except OSError as exc:
                if attempt == self.commit_attempts or lasting(exc):
                    raise
                self.stats.event(f"commit of {staged.entry.shard} failed ({exc}); retrying in {delay:g}s")
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)
        raise AssertionError("unreachable")

    @property
    def failed(self) -> BaseException | None:
        return self.error
