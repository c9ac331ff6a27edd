"""hosts/watch.py until_exit, the one rule of every watch stream: every log byte before the exit,
with followers made to lag, truncate, fail or race the exit (no I/O but the rest's read)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from servefleet.hosts.base import Truncated
from servefleet.hosts.local import LocalHost
from servefleet.hosts.watch import Exited, LogAbsent, Pending, WatchItem, until_exit


async def collect(stream: AsyncIterator[WatchItem]) -> list[WatchItem]:
    async with asyncio.timeout(10):
        return [item async for item in stream]


class Log:
    """A log file in memory and a follower of it that delivers only what it is told to."""

    def __init__(self, content: bytes) -> None:
        self.content = content
        self.asked: list[int] = []
        self.items: asyncio.Queue[bytes | Truncated | BaseException] = asyncio.Queue()
        self.stopped = asyncio.Event()

    async def follow(self) -> AsyncIterator[bytes | Truncated | LogAbsent]:
        try:
            while True:
                item = await self.items.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            self.stopped.set()

    async def rest(self, offset: int) -> bytes:
        self.asked.append(offset)
        return self.content[offset:]


async def exits_after(
    gate: asyncio.Event, *before: Pending | LogAbsent, code: int | None = 0
) -> AsyncIterator[Pending | LogAbsent | Exited]:
    for item in before:
        yield item
    await gate.wait()
    yield Exited(code)


async def test_a_follower_that_read_nothing_still_gives_the_whole_log_before_the_exit() -> None:
    log = Log(b"loading\nRuntimeError: Not enough memory\n")
    gate = asyncio.Event()
    gate.set()  # the exit is known before the follower read a byte
    items = await collect(until_exit(log.follow(), exits_after(gate, code=137), 0, log.rest))
    assert items == [log.content, Exited(137)]
    assert log.asked == [0] and log.stopped.is_set()


async def test_bytes_the_follower_read_are_not_read_again() -> None:
    log = Log(b"line 1\nline 2\nfatal: no GPU")
    gate = asyncio.Event()
    stream = until_exit(log.follow(), exits_after(gate), 0, log.rest)
    log.items.put_nowait(b"line 1\n")
    first = await anext(stream)
    log.items.put_nowait(b"line 2\n")  # queued when the exit arrives: yielded before it, in order
    gate.set()
    items = [first, *await collect(stream)]
    assert items == [b"line 1\n", b"line 2\n", b"fatal: no GPU", Exited(0)]
    assert b"".join(i for i in items if isinstance(i, bytes)) == log.content
    assert log.asked == [14]


async def test_after_a_truncation_the_rest_is_read_from_the_new_files_offset() -> None:
    log = Log(b"new file, fatal line\n")
    gate = asyncio.Event()
    stream = until_exit(log.follow(), exits_after(gate), 100, log.rest)
    log.items.put_nowait(b"old tail\n")
    log.items.put_nowait(Truncated(0))
    log.items.put_nowait(b"new ")
    got = [await anext(stream) for _ in range(3)]
    gate.set()
    items = [*got, *await collect(stream)]
    assert items == [b"old tail\n", Truncated(0), b"new ", b"file, fatal line\n", Exited(0)]
    assert log.asked == [4]  # not 100 + 9 + 4: the truncation reset the offset


async def test_pending_and_absent_pass_through_in_order_and_the_exit_comes_last() -> None:
    log = Log(b"")
    gate = asyncio.Event()
    gate.set()
    items = await collect(
        until_exit(log.follow(), exits_after(gate, Pending("Resources", 3.0, "7"), LogAbsent()), 0, log.rest)
    )
    assert items == [Pending("Resources", 3.0, "7"), LogAbsent(), Exited(0)]  # an empty rest yields nothing


async def test_a_failing_follower_ends_the_stream_with_its_error() -> None:
    log = Log(b"")
    stream = until_exit(log.follow(), exits_after(asyncio.Event()), 0, log.rest)
    log.items.put_nowait(b"a")
    log.items.put_nowait(OSError("link gone"))
    assert await anext(stream) == b"a"
    with pytest.raises(OSError, match="link gone"):
        await anext(stream)


async def test_without_a_log_only_the_exit_is_given() -> None:
    gate = asyncio.Event()
    gate.set()

    async def never(offset: int) -> bytes:
        raise AssertionError("no log: nothing to read")

    assert await collect(until_exit(None, exits_after(gate, code=3), 0, never)) == [Exited(3)]


async def test_local_host_watch_reports_a_missing_log_its_bytes_and_the_exit(tmp_path: Path) -> None:
    """LocalHost's watch stream (polled): LogAbsent until the log exists, every byte of it, then
    the code the wrapper recorded, with the last line written just before the exit included."""
    host = LocalHost()
    log, status = tmp_path / "s.log", tmp_path / "s.status"
    gate = tmp_path / "go"  # the log is written only once the watch has seen it absent
    argv = [
        "sh",
        "-c",
        f"while [ ! -e {gate} ]; do sleep 0.01; done; printf 'starting\\n' >> {log}; printf 'fatal: no GPU' >> {log}; exit 3",
    ]
    pgid = await host.spawn_detached(argv, log_path=str(tmp_path / "wrapper.log"), status_path=str(status))
    stream = host.watch(str(log), 0, pgid=pgid, status_path=str(status))
    assert await anext(stream) == LogAbsent()
    gate.touch()
    items = [LogAbsent(), *await collect(stream)]
    assert items[-1] == Exited(3)
    assert b"".join(i for i in items if isinstance(i, bytes)).endswith(b"starting\nfatal: no GPU")
