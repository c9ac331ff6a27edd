"""Following a remote log over SSH: one streaming ``tail -F`` per log, resumed after a dropped link.

Polling a remote file costs a round trip per poll; instead one long-lived mux session runs GNU
``tail -c +N -F`` (see ssh_scripts.FOLLOW), which pushes bytes as they are written. The offset we
keep is the count of bytes *yielded*, so whatever happens to the link, the next stream starts at
exactly the first byte the caller has not seen: nothing lost, nothing repeated.

- Link drop (master killed, network gone, keep-alives expired): the mux client exits with 255;
  the master is checked and restarted, and the stream restarts at the offset. Reconnecting gives
  up with HostUnreachable after ``spec.reconnect_s`` seconds without a connection.
- Truncation or replacement: tail reports it on stderr; the stream restarts at byte 0 after a
  ``Truncated(0)``. After a reconnect the header line (inode, size) catches a replacement or
  truncation that happened while we were away. Bytes of the new file that arrived just before
  tail's notice may precede the Truncated marker; everything after it is the new file from 0.

``watch`` (the WatchHost capability, what a wait uses) runs ssh_scripts.WATCH instead: the same
stream on stdout, and on stderr framed lines from a remote loop that reports the server's exit
(with the log's size then, so every byte is delivered before the exit) and a heartbeat. A wait
thus costs one remote command per server however long the server loads, where polling the
status file and the process group cost ~25 a second.

What to do at each turn (yield, restart, reconnect, give up) is decided by the pure
ssh_stream.StreamMachine; this module only runs the remote processes and feeds it. The rule
"every log byte before the exit" is kept here by the exit line's log size: bytes up to it are
awaited from tail for EXIT_CATCHUP_S, and what is still missing is read in one command.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import shlex
import subprocess
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from servefleet.errors import HostUnreachable
from servefleet.hosts import ssh_scripts as scripts
from servefleet.hosts.base import Truncated
from servefleet.hosts.ssh_options import ssh_argv
from servefleet.hosts.ssh_stream import (
    HEARTBEAT_S,
    TERMINAL,
    Action,
    Emit,
    Fail,
    Finish,
    Leave,
    Restart,
    Retry,
    StreamMachine,
    StreamSettings,
    classify_tail_notice,
)
from servefleet.hosts.watch import WatchItem

if TYPE_CHECKING:
    from servefleet.hosts.ssh import SSHHost

__all__ = ["follow", "watch", "classify_tail_notice", "HEARTBEAT_S"]  # the last two: from ssh_stream

CHUNK = 65536


@contextlib.asynccontextmanager
async def _stream(host: SSHHost, remote: str) -> AsyncIterator[tuple[asyncio.subprocess.Process, Callable[[], bool]]]:
    """One remote FOLLOW or WATCH process, holding a long-lived session slot (or a direct
    connection), and a test of whether the connection it rides still lives."""
    host.commands += 1

    async def start(argv: list[str]) -> asyncio.subprocess.Process:
        return await asyncio.create_subprocess_exec(
            *argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )

    if host.pool is None:
        proc = await start(ssh_argv(host.spec, "direct", None, flags=["-T"], remote=remote))
        try:
            yield proc, lambda: proc.returncode is None
        finally:
            await _stop(proc)
        return
    async with host.pool.session(long=True) as master:
        proc = await start(ssh_argv(host.spec, "client", master.path, flags=["-T"], remote=remote))
        pool = host.pool
        try:
            yield proc, lambda: pool.alive(master)
        finally:
            await _stop(proc)
            if proc.returncode == 255:
                host.pool.suspect(master)


async def _stop(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
    await proc.wait()


@dataclass(frozen=True)
class _Watch:
    """What a watch asks of the remote watcher besides the log (ssh_scripts.WATCH)."""

    pgid: int | None
    status_path: str | None
    silence_s: float  # nothing heard for this long on a live stream: the link went silent


def follow(host: SSHHost, path: str, offset: int = 0) -> AsyncIterator[bytes | Truncated]:
    """``Host.follow`` over SSH: one streaming ``tail -F``, resumed after a dropped link."""
    return _streams(host, path, offset, None)  # type: ignore[return-value]  # without a watch job it yields only log items


def watch(
    host: SSHHost, log_path: str | None, offset: int = 0, *, pgid: int | None = None, status_path: str | None = None
) -> AsyncIterator[WatchItem]:
    """``WatchHost.watch`` over SSH: the log, the exit and a heartbeat from one remote watcher
    (ssh_scripts.WATCH) on one long-lived session, instead of a command per poll. Besides a
    dropped link (reconnect, as ``follow``), a stream on which nothing — not even the heartbeat —
    arrives from the watcher for ``alive_timeout`` (log bytes do not count: tail may outlive a
    killed watcher loop) is left to its connection's keep-alives for another ``alive_timeout``:
    the connection dies, the link went silent (HostUnreachable); it lives, the watcher died and
    a new stream starts."""
    return _streams(host, log_path, offset, _Watch(pgid, status_path, float(host.spec.alive_timeout)))


async def _streams(host: SSHHost, path: str | None, offset: int, job: _Watch | None) -> AsyncIterator[WatchItem]:
    """The I/O around ssh_stream.StreamMachine: start each remote stream, feed the machine what
    it says, do what it answers."""
    await host.connect()
    path = host.expand(path) if path else None
    if job is not None and job.status_path:
        job = replace(job, status_path=host.expand(job.status_path))
    settings = StreamSettings(
        host=host.name,
        what=path or f"process group {job.pgid if job else '?'}",
        log=path is not None,
        silence_s=job.silence_s if job else None,
        status_file=job is not None and job.status_path is not None,
        alive_timeout=host.spec.alive_timeout,
        alive_interval=host.spec.alive_interval,
        reconnect_s=host.spec.reconnect_s,
    )
    m = StreamMachine(settings, offset, time.monotonic())
    while True:
        m.begin(secrets.token_hex(16))
        remote = (
            scripts.watch_argv(path, m.offset, host.tail_has_pid, m.token, job.pgid, job.status_path, HEARTBEAT_S)
            if job
            else scripts.follow_argv(path or "", m.offset, host.tail_has_pid)
        )
        end: Action | None = None
        code: int | None = None
        stderr_text = ""
        try:
            async with _stream(host, shlex.join(remote)) as (proc, link_alive):
                async with contextlib.aclosing(_drive(proc, link_alive, m)) as actions:
                    async for action in actions:
                        if isinstance(action, Emit):
                            yield action.item
                        else:
                            end = action
                if isinstance(end, Finish):
                    rest = await _rest(host, path, m.offset, end.rest_to)
                    if rest:
                        yield rest
                    yield end.exited
                    return
                if isinstance(end, Leave) and end.wait:
                    assert proc.stderr is not None
                    code = await proc.wait()
                    stderr_text = m.stderr_text + (await proc.stderr.read()).decode(errors="replace")
            after = m.ended(code, stderr_text, time.monotonic()) if not isinstance(end, Restart) else end
        except HostUnreachable as exc:
            if host.pool is None:
                raise
            after = m.ended(255, str(exc), time.monotonic(), unreachable=True)
        if isinstance(after, Fail):
            raise after.error
        if isinstance(after, Retry):
            await asyncio.sleep(after.after_s)


async def _drive(
    proc: asyncio.subprocess.Process, link_alive: Callable[[], bool], m: StreamMachine
) -> AsyncGenerator[Action, None]:
    """One stream's events into the machine and its actions out, up to the first that ends the
    stream's reading (Finish, Restart, Leave)."""
    assert proc.stdout is not None and proc.stderr is not None
    header = await _within(proc.stdout.readline(), m.header_timeout())
    for action in m.header(header, header is not None or link_alive(), time.monotonic()):
        yield action
        if isinstance(action, TERMINAL):
            return
    out_task: asyncio.Future[bytes] | None = asyncio.ensure_future(proc.stdout.read(CHUNK))
    err_task: asyncio.Future[bytes] | None = asyncio.ensure_future(proc.stderr.readline())
    try:
        while out_task is not None or err_task is not None:
            waiting = {t for t in (out_task, err_task) if t is not None}
            done, _pending = await asyncio.wait(
                waiting, timeout=m.timeout(time.monotonic()), return_when=asyncio.FIRST_COMPLETED
            )
            if not done:
                actions = m.quiet(link_alive(), time.monotonic())
            elif (
                err_task is not None and err_task in done
            ):  # stderr first: a truncation notice outranks data that follows it
                line = err_task.result()
                err_task = asyncio.ensure_future(proc.stderr.readline()) if line else None
                actions = m.stderr(line, time.monotonic())
            else:
                assert out_task is not None
                data = out_task.result()
                out_task = asyncio.ensure_future(proc.stdout.read(CHUNK)) if data else None
                actions = m.stdout(data)
            for action in actions:
                yield action
                if isinstance(action, TERMINAL):
                    return
        yield Leave()
    finally:
        for task in (out_task, err_task):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task


async def _within(aw: Awaitable[bytes], timeout: float | None) -> bytes | None:
    """``await aw``, or None when ``timeout`` passes first."""
    try:
        async with asyncio.timeout(timeout):
            return await aw
    except TimeoutError:
        return None


async def _rest(host: SSHHost, path: str | None, offset: int, size: int | None) -> bytes:
    """The log's bytes from ``offset`` up to its size at the exit (one command; rare)."""
    if path is None or size is None or size <= offset:
        return b""
    try:
        return await host.read_bytes(path, offset, size - offset)
    except FileNotFoundError:
        return b""
