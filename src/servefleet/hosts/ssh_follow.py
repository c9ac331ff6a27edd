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
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import shlex
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from servefleet.errors import HostError, HostUnreachable
from servefleet.hosts import ssh_scripts as scripts
from servefleet.hosts.base import Truncated
from servefleet.hosts.ssh_options import classify_ssh_failure, ssh_argv
from servefleet.hosts.watch import Exited, LogAbsent, WatchItem

if TYPE_CHECKING:
    from servefleet.hosts.ssh import SSHHost

__all__ = ["follow", "watch", "classify_tail_notice", "HEARTBEAT_S"]

CHUNK = 65536
MAX_TAIL_FAILURES = 3
HEARTBEAT_S = 1  # the remote watcher's heartbeat (whole seconds: the remote `sleep` may not do fractions)
LINK_POLL_S = 0.2  # while the watcher is quiet, how often to look whether its connection still lives
EXIT_CATCHUP_S = 2.0  # after the exit line, how long tail (polling every second without inotify) may take to deliver the log's end


def classify_tail_notice(line: str) -> str:
    """What a line of GNU tail's stderr means for us: truncated | appeared | ignore | error."""
    if "file truncated" in line or "has been replaced" in line:
        return "truncated"
    if "has appeared" in line:
        return "appeared"
    if any(s in line for s in ("has become inaccessible", "cannot open", "No such file", "inotify", "giving up on",
                               "directory containing watched file was removed", "has been replaced with an untailable")):
        return "ignore"
    return "error"


@contextlib.asynccontextmanager
async def _stream(host: SSHHost, remote: str) -> AsyncIterator[tuple[asyncio.subprocess.Process, Callable[[], bool]]]:
    """One remote FOLLOW or WATCH process, holding a long-lived session slot (or a direct
    connection), and a test of whether the connection it rides still lives."""
    host.commands += 1

    async def start(argv: list[str]) -> asyncio.subprocess.Process:
        return await asyncio.create_subprocess_exec(*argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)

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


def watch(host: SSHHost, log_path: str | None, offset: int = 0, *, pgid: int | None = None, status_path: str | None = None) -> AsyncIterator[WatchItem]:
    """``WatchHost.watch`` over SSH: the log, the exit and a heartbeat from one remote watcher
    (ssh_scripts.WATCH) on one long-lived session, instead of a command per poll. Besides a
    dropped link (reconnect, as ``follow``), a stream on which nothing — not even the heartbeat —
    arrives from the watcher for ``alive_timeout`` (log bytes do not count: tail may outlive a
    killed watcher loop) is left to its connection's keep-alives for another ``alive_timeout``:
    the connection dies, the link went silent (HostUnreachable); it lives, the watcher died and
    a new stream starts."""
    return _streams(host, log_path, offset, _Watch(pgid, status_path, float(host.spec.alive_timeout)))


def _silent_link(host: SSHHost, what: str, quiet_s: float) -> HostUnreachable:
    err = HostUnreachable(f"ssh host {host.name!r} is unreachable: link went silent: no answer to keep-alives and no heartbeat from the watcher of {what} for {quiet_s:.0f}s "
                          f"(alive_timeout {host.spec.alive_timeout}s)")
    err.reason = "link went silent"
    return err


async def _streams(host: SSHHost, path: str | None, offset: int, job: _Watch | None) -> AsyncIterator[WatchItem]:
    await host.connect()
    path = host.expand(path) if path else None
    if job is not None and job.status_path:
        job = replace(job, status_path=host.expand(job.status_path))
    what = path or f"process group {job.pgid if job else '?'}"
    inode: int | None = None
    lost_since: float | None = None  # when the link was first found down (None: it is up)
    tail_failures = 0
    mute_streams = 0  # streams in a row whose watcher went quiet on a live connection (job only)
    absent = False  # LogAbsent() yielded, its appearance not yet
    # The remote's last word (a header, a heartbeat, an exit) on any stream so far; log bytes do
    # not count (tail may outlive a killed watcher loop), nor does a stream that never started.
    heard_at = time.monotonic()
    backoff = 0.05
    while True:
        restart_now = silent = reconnect_failed = master_lost = started = False
        code: int | None = None
        stderr_text = ""
        token = secrets.token_hex(16)
        remote = (scripts.watch_argv(path, offset, host.tail_has_pid, token, job.pgid, job.status_path, HEARTBEAT_S) if job
                  else scripts.follow_argv(path or "", offset, host.tail_has_pid))
        exit_info: tuple[int | None, int | None] | None = None  # (code, log size) once the watcher said so
        exit_due = 0.0
        grace_until: float | None = None  # the watcher went quiet: the connection's keep-alives decide until then
        try:
            async with _stream(host, shlex.join(remote)) as (proc, link_alive):
                assert proc.stdout is not None and proc.stderr is not None
                header = await _within(proc.stdout.readline(), job.silence_s if job else None)
                if header is None:
                    silent = True
                    master_lost = not link_alive()
                elif header:
                    heard_at, started = time.monotonic(), True
                    lost_since, backoff = None, 0.05
                    ino, size = scripts.parse_follow_header(header) if path else (None, None)
                    if job and path and ino is None and not absent:
                        absent = True
                        yield LogAbsent()
                    if ino is not None and size is not None and ((inode is not None and ino != inode) or size < offset):
                        offset, inode = 0, ino  # replaced or truncated while we were not looking
                        yield Truncated(0)
                        continue
                    if ino is not None:
                        inode = ino
                        if absent:
                            absent = False
                            yield LogAbsent(present=True)
                    out_task: asyncio.Future[bytes] | None = asyncio.ensure_future(proc.stdout.read(CHUNK))
                    err_task: asyncio.Future[bytes] | None = asyncio.ensure_future(proc.stderr.readline())
                    try:
                        while out_task is not None or err_task is not None:
                            waiting = {t for t in (out_task, err_task) if t is not None}
                            timeout = max(0.0, heard_at + job.silence_s - time.monotonic()) if job else None
                            if grace_until is not None:
                                timeout = LINK_POLL_S
                            if exit_info is not None:
                                timeout = max(0.0, exit_due - time.monotonic())
                            done, _pending = await asyncio.wait(waiting, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
                            if not done:
                                if exit_info is None:  # not even a heartbeat
                                    # A silent link or a mute watcher? The master's keep-alives
                                    # (whose timer runs about as ours) end it on a silent link.
                                    if not link_alive():
                                        silent = master_lost = True
                                        break
                                    if grace_until is None:
                                        grace_until = time.monotonic() + job.silence_s  # type: ignore[union-attr]  # nothing done means a timeout, and without a job there is none
                                    elif time.monotonic() >= grace_until:
                                        silent = True  # the link lives, the watcher does not speak
                                        break
                                    continue
                                # tail has not delivered the log's last bytes in time: read them
                                rest = await _rest(host, path, offset, exit_info[1])
                                if rest:
                                    yield rest
                                yield _exited(exit_info[0], job)
                                return
                            # stderr first: a truncation notice outranks data that follows it.
                            if err_task is not None and err_task in done:
                                line = err_task.result()
                                err_task = asyncio.ensure_future(proc.stderr.readline()) if line else None
                                text = line.decode(errors="replace")
                                if job and text.startswith(token + " "):
                                    heard_at, grace_until, mute_streams = time.monotonic(), None, 0
                                    fields = text.split()[1:]
                                    if fields and fields[0] == "exit":
                                        exit_info = scripts.parse_watch_exit(fields[1:])
                                        exit_due = time.monotonic() + EXIT_CATCHUP_S
                                        if path is None or exit_info[1] is None or offset >= exit_info[1]:
                                            yield _exited(exit_info[0], job)
                                            return
                                    continue  # a heartbeat
                                notice = classify_tail_notice(text)
                                if notice == "truncated":
                                    offset, inode = 0, None
                                    yield Truncated(0)
                                    restart_now = True
                                    break
                                if notice == "appeared" and (offset > 0 or inode is not None):
                                    restart_now = True  # the header of a new stream decides
                                    break
                                if notice == "appeared" and absent:
                                    absent = False
                                    yield LogAbsent(present=True)
                                if notice == "error":
                                    stderr_text += text
                                continue
                            if out_task is not None and out_task in done:
                                data = out_task.result()
                                if not data:
                                    out_task = None
                                    if exit_info is not None:  # the stream ended before the log's end arrived
                                        rest = await _rest(host, path, offset, exit_info[1])
                                        if rest:
                                            yield rest
                                        yield _exited(exit_info[0], job)
                                        return
                                    if job is None:
                                        break
                                    continue  # the watcher may still speak on stderr
                                out_task = asyncio.ensure_future(proc.stdout.read(CHUNK))
                                offset += len(data)
                                tail_failures = 0
                                if absent:
                                    absent = False
                                    yield LogAbsent(present=True)
                                yield data
                                if exit_info is not None and (exit_info[1] is None or offset >= exit_info[1]):
                                    yield _exited(exit_info[0], job)
                                    return
                    finally:
                        for task in (out_task, err_task):
                            if task is not None and not task.done():
                                task.cancel()
                                with contextlib.suppress(asyncio.CancelledError, Exception):
                                    await task
                if restart_now:
                    continue
                if not silent:
                    code = await proc.wait()
                    stderr_text += (await proc.stderr.read()).decode(errors="replace")
        except HostUnreachable as exc:
            if host.pool is None:
                raise
            reconnect_failed, code, stderr_text = True, 255, str(exc)
        quiet_s = time.monotonic() - heard_at
        if silent:
            # Nothing on a stream that should speak every HEARTBEAT_S. Its connection gone as
            # well: the link went silent. Still up: the watcher died; a new one starts.
            if master_lost:
                raise _silent_link(host, what, quiet_s)
            mute_streams += 1
            if mute_streams >= MAX_TAIL_FAILURES:
                raise HostError(f"the remote watcher of {what} on ssh host {host.name!r} stopped speaking {mute_streams} times in a row on a live connection")
            continue
        # The stream ended without our asking: a dropped link, or tail itself failed.
        if reconnect_failed or (code == 255 and (classify_ssh_failure(code, stderr_text) or not stderr_text.strip())):
            if job is not None and started and quiet_s >= max(host.spec.alive_interval, 2 * HEARTBEAT_S):
                # The master died after a quiet spell longer than the heartbeat allows: its
                # keep-alives went unanswered, a silent link, not a dropped connection.
                # Reconnecting would only wait out ConnectTimeout.
                raise _silent_link(host, what, quiet_s)
            now = time.monotonic()
            lost_since = lost_since or now
            if now - lost_since > host.spec.reconnect_s:
                raise HostUnreachable(f"ssh host {host.name!r}: lost the link while following {what} and could not reconnect within {host.spec.reconnect_s}s: "
                                      f"{stderr_text.strip()[-300:]}")
        else:
            tail_failures += 1
            if tail_failures >= MAX_TAIL_FAILURES:
                raise HostError(f"following {what} on ssh host {host.name!r} failed (exit {code}): {stderr_text.strip()[-300:]}")
        await asyncio.sleep(backoff)
        backoff = min(backoff * 2, 2.0)


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


def _exited(code: int | None, job: _Watch | None) -> Exited:
    return Exited(code, killed=code is None and job is not None and job.status_path is not None)
