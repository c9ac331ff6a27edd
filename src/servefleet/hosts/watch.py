"""Watching one server with one stream: its log as it grows, then its exit.

Waiting for a server needs its log as it grows, its exit code and whether its process group still
lives. Every host gives that as one stream (``WatchHost.watch``): a host where every question is a
round trip (SSH) from one remote watcher per server instead of a command per poll (ssh_follow.py);
a Slurm host from its log follower and the scheduler (slurm.py); any other host from its own
primitives, polled (``poll_watch``: a local disk and process table are cheap).

The rule every watch keeps, written once here (``until_exit``): **every log byte before the
exit**. The exit is seen by one source (a status file, the process table, the scheduler) and the
log through a follower that may lag behind it (a poll interval, a busy machine, a shared folder),
so what the follower had delivered is not the whole log: once the exit is known the follower is
stopped and the log is read from the last byte yielded to its end, and only then is ``Exited``
yielded. A fatal line lost there leaves only the exit code to judge by (SGLang's OOM, then a
SIGKILL of itself: ``killed`` instead of ``gpu_oom``).

What ``watch`` yields, in order of occurrence:

- ``bytes`` and ``Truncated``: as ``Host.follow`` (nothing when no log is watched);
- ``LogAbsent(present=False)`` when the log does not exist yet, ``LogAbsent(present=True)`` when
  it appears;
- ``Exited`` once, when the process is gone, after every byte the log held at that moment: the
  iteration ends there.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from servefleet.hosts.base import Host, Truncated
from servefleet.hosts.pidstat import PidStatus

__all__ = [
    "Exited",
    "LogAbsent",
    "Pending",
    "WatchHost",
    "WatchItem",
    "until_exit",
    "poll_watch",
    "poll_exit",
    "offset_after",
]

STATUS_INTERVAL_S = 0.05  # polling: the status file, a stat per tick (cheap)
ALIVE_INTERVAL_S = 0.1  # polling: group liveness, a process-table scan
LOG_PRESENT_S = 0.1  # polling: how often a log that does not exist yet is looked for


@dataclass(frozen=True)
class Exited:
    """The server's process group is gone. ``code``: what the detach wrapper recorded (None when
    it recorded nothing); ``killed``: no code although a status file was expected (the wrapper
    was killed with its group)."""

    code: int | None
    killed: bool = False
    note: str = ""  # how it ended, where the host knows more (a Slurm job's end state)
    hint: str | None = None  # what to do about that end, replacing the category's default hint


@dataclass(frozen=True)
class Pending:
    """The server has not started: its job waits in a scheduler's queue (``reason``: the
    scheduler's word, e.g. Resources, Priority). Waiting there is not a stall."""

    reason: str
    waited_s: float | None = None
    job_id: str = ""


@dataclass(frozen=True)
class LogAbsent:
    """The watched log does not exist (``present=True``: it has appeared since)."""

    present: bool = False


WatchItem = bytes | Truncated | LogAbsent | Pending | Exited


@runtime_checkable
class WatchHost(Protocol):
    def watch(
        self,
        log_path: str | None,
        offset: int = 0,
        *,
        pgid: int | None = None,
        status_path: str | None = None,
    ) -> AsyncIterator[WatchItem]:
        """Follow ``log_path`` from ``offset`` and report the exit of process group ``pgid``
        (code from ``status_path``, the detach wrapper's file). A status file present at the
        start while the group lives is an earlier attempt's and is ignored until it goes."""
        ...


LogItem = bytes | Truncated | LogAbsent
ExitItem = Pending | LogAbsent | Exited


def offset_after(offset: int, item: LogItem) -> int:
    """Where the log's bytes yielded so far end, after ``item``."""
    if isinstance(item, Truncated):
        return item.offset
    return offset + len(item) if isinstance(item, bytes) else offset


async def until_exit(
    log: AsyncIterator[LogItem] | None,
    exits: AsyncIterator[ExitItem],
    offset: int,
    rest: Callable[[int], Awaitable[bytes]],
) -> AsyncIterator[WatchItem]:
    """The one watcher: ``log`` (a follower from ``offset``; None: no log) and ``exits`` (what is
    known about the process: Pending, LogAbsent, then Exited) merged into one stream in order of
    arrival, which ends with every log byte before the exit: when ``exits`` yields ``Exited``,
    what the follower had queued is yielded, the follower is stopped, and ``rest(offset)`` (the
    log from the last byte yielded to its end) is yielded before the ``Exited``.

    A follower that fails ends the stream with its error; one that ends just stops (the exit
    source decides the end)."""
    queue: asyncio.Queue[LogItem | BaseException] = asyncio.Queue()
    delivered = offset

    async def pump(source: AsyncIterator[LogItem]) -> None:
        try:
            async for item in source:
                queue.put_nowait(item)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # raised where the stream is read
            queue.put_nowait(exc)

    def take(item: LogItem | BaseException) -> LogItem:
        nonlocal delivered
        if isinstance(item, BaseException):
            raise item
        delivered = offset_after(delivered, item)
        return item

    follower = asyncio.ensure_future(pump(log)) if log is not None else None
    getting: asyncio.Future[LogItem | BaseException] = asyncio.ensure_future(queue.get())
    next_exit: asyncio.Future[ExitItem] = asyncio.ensure_future(anext(exits))
    try:
        while True:
            # asyncio.wait, not wait_for: on 3.11 wait_for can swallow a cancellation that
            # arrives as an item does, and a cancelled watch must end.
            waiting: set[asyncio.Future[Any]] = {getting, next_exit}
            done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            if getting in done:  # the log first: bytes read before an exit precede it
                yield take(getting.result())
                getting = asyncio.ensure_future(queue.get())
                continue
            event = next_exit.result()  # the exit source ending without an Exited is its bug: raised
            if not isinstance(event, Exited):
                yield event
                next_exit = asyncio.ensure_future(anext(exits))
                continue
            if getting.done():  # taken from the queue as the exit arrived
                yield take(getting.result())
            while not queue.empty():  # what the follower had read, in order
                yield take(queue.get_nowait())
            if follower is not None:
                await _stop(follower)
                follower = None
            while not queue.empty():
                yield take(queue.get_nowait())
            if log is not None and (tail := await rest(delivered)):
                yield tail
            yield event
            return
    finally:
        for task in (getting, next_exit):
            await _stop(task)
        if follower is not None:
            await _stop(follower)
        with contextlib.suppress(Exception):
            await exits.aclose()  # type: ignore[attr-defined]  # an async generator (every exit source here)
        if log is not None:
            with contextlib.suppress(Exception):
                await log.aclose()  # type: ignore[attr-defined]  # an async generator (every follower here)


async def _stop(task: asyncio.Future) -> None:
    if not task.done():
        task.cancel()
    with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration, Exception):
        await task


async def read_rest(host: Host, path: str, offset: int) -> bytes:
    """The log from ``offset`` to its end (nothing when it is gone or shorter)."""
    try:
        return await host.read_bytes(path, offset)
    except FileNotFoundError:
        return b""


def poll_watch(
    host: Host,
    log_path: str | None,
    offset: int = 0,
    *,
    pgid: int | None = None,
    status_path: str | None = None,
    pid: int | None = None,
) -> AsyncIterator[WatchItem]:
    """A watch stream from any host's primitives, polled: ``host.follow`` for the log (LogAbsent
    until it exists), ``poll_exit`` for the exit."""
    log = _log_when_present(host, log_path, offset) if log_path else None
    return until_exit(
        log, poll_exit(host, pgid, status_path, pid), offset, lambda at: read_rest(host, log_path or "", at)
    )


async def _log_when_present(host: Host, path: str, offset: int) -> AsyncIterator[LogItem]:
    if await host.file_size(path) is None:
        yield LogAbsent()
        while await host.file_size(path) is None:
            await asyncio.sleep(LOG_PRESENT_S)
        yield LogAbsent(present=True)
    async for item in host.follow(path, offset):
        yield item


async def poll_exit(
    host: Host, pgid: int | None, status_path: str | None, pid: int | None = None
) -> AsyncIterator[ExitItem]:
    """The exit, polled: the status file's code, or a group gone without one, or the given pid gone
    (whatever its group still holds: a shell that started it, orphaned children). Nothing to
    watch: no exit is ever reported.

    A status file present at the start while the group lives is the previous attempt's (the
    wrapper removes it first thing, but we may look before it does): ignored until it goes."""
    if pgid is None and status_path is None and pid is None:
        await asyncio.Event().wait()
    stale = False
    if status_path is not None and pgid is not None and await host.file_size(status_path) is not None:
        stale = await host.group_alive(pgid)
    first = await host.pid_status(pid) if pid is not None else None
    next_alive = 0.0
    while True:
        if status_path is not None:
            present = await host.file_size(status_path) is not None
            if present and not stale:
                yield Exited(await _read_code(host, status_path))
                return
            if not present:
                stale = False
        due = time.monotonic() >= next_alive
        if due:
            next_alive = time.monotonic() + ALIVE_INTERVAL_S
        if due and pid is not None and first is not None:
            seen = await host.pid_status(pid)
            reused = seen.alive and first.started is not None and seen.started != first.started
            if not seen.alive or reused:
                if status_path is not None and await host.file_size(status_path) is not None:
                    yield Exited(await _read_code(host, status_path))
                else:
                    yield _pid_exit(pid, PidStatus("gone") if reused else seen, first)
                return
        if due and pgid is not None and not await host.group_alive(pgid):
            if status_path is not None and await host.file_size(status_path) is not None:
                yield Exited(await _read_code(host, status_path))
            else:
                yield Exited(None, killed=status_path is not None)
            return
        await asyncio.sleep(STATUS_INTERVAL_S)


def _pid_exit(pid: int, now: PidStatus, first: PidStatus) -> Exited:
    """The exit of a watched pid: its code while it is a zombie, else why the code is unknown."""
    if now.code is not None:
        return Exited(now.code)
    if now.state == "zombie":
        return Exited(None, note=f"pid {pid} exited, but /proc does not show its exit status")
    parent = f"pid {first.ppid}" if first.ppid else "its parent"
    return Exited(
        None, note=f"pid {pid} is not a child of servefleet: only its parent ({parent}) could read its exit code"
    )


async def _read_code(host: Host, status_path: str) -> int | None:
    try:
        return int((await host.read_bytes(status_path)).decode().strip())
    except (FileNotFoundError, ValueError):
        return None
