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
"""

from __future__ import annotations

import asyncio
import contextlib
import shlex
import subprocess
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from servefleet.errors import HostError, HostUnreachable
from servefleet.hosts import ssh_scripts as scripts
from servefleet.hosts.base import Truncated
from servefleet.hosts.ssh_options import classify_ssh_failure, ssh_argv

if TYPE_CHECKING:
    from servefleet.hosts.ssh import SSHHost

__all__ = ["follow", "classify_tail_notice"]

CHUNK = 65536
MAX_TAIL_FAILURES = 3


def classify_tail_notice(line: str) -> str:
    """What a line of GNU tail's stderr means for us: truncated | appeared | ignore | error."""
    if "file truncated" in line or "has been replaced" in line:
        return "truncated"
    if "has appeared" in line:
        return "appeared"
    if any(s in line for s in ("has become inaccessible", "cannot open", "No such file", "inotify", "giving up on", "directory containing watched file was removed", "has been replaced with an untailable")):
        return "ignore"
    return "error"


@contextlib.asynccontextmanager
async def _stream(host: SSHHost, path: str, offset: int) -> AsyncIterator[asyncio.subprocess.Process]:
    """One remote FOLLOW process, holding a long-lived session slot (or a direct connection)."""
    remote = shlex.join(scripts.follow_argv(path, offset, host.tail_has_pid))

    async def start(argv: list[str]) -> asyncio.subprocess.Process:
        return await asyncio.create_subprocess_exec(*argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    if host.pool is None:
        proc = await start(ssh_argv(host.spec, "direct", None, flags=["-T"], remote=remote))
        try:
            yield proc
        finally:
            await _stop(proc)
        return
    async with host.pool.session(long=True) as master:
        proc = await start(ssh_argv(host.spec, "client", master.path, flags=["-T"], remote=remote))
        try:
            yield proc
        finally:
            await _stop(proc)
            if proc.returncode == 255:
                host.pool.suspect(master)


async def _stop(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
    await proc.wait()


async def follow(host: SSHHost, path: str, offset: int = 0) -> AsyncIterator[bytes | Truncated]:
    await host.connect()
    path = host.expand(path)
    inode: int | None = None
    lost_since: float | None = None  # when the link was first found down (None: it is up)
    tail_failures = 0
    backoff = 0.05
    while True:
        restart_now = False
        reconnect_failed = False
        code: int | None = None
        stderr_text = ""
        try:
            async with _stream(host, path, offset) as proc:
                assert proc.stdout is not None and proc.stderr is not None
                header = await proc.stdout.readline()
                if header:
                    lost_since, backoff = None, 0.05
                    ino, size = scripts.parse_follow_header(header)
                    if ino is not None and size is not None and ((inode is not None and ino != inode) or size < offset):
                        offset, inode = 0, ino  # replaced or truncated while we were not looking
                        yield Truncated(0)
                        continue
                    if ino is not None:
                        inode = ino
                    out_task: asyncio.Future[bytes] | None = asyncio.ensure_future(proc.stdout.read(CHUNK))
                    err_task: asyncio.Future[bytes] | None = asyncio.ensure_future(proc.stderr.readline())
                    try:
                        while out_task is not None:
                            waiting = {t for t in (out_task, err_task) if t is not None}
                            done, _pending = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                            # stderr first: a truncation notice outranks data that follows it.
                            if err_task is not None and err_task in done:
                                line = err_task.result()
                                err_task = asyncio.ensure_future(proc.stderr.readline()) if line else None
                                notice = classify_tail_notice(line.decode(errors="replace"))
                                if notice == "truncated":
                                    offset, inode = 0, None
                                    yield Truncated(0)
                                    restart_now = True
                                    break
                                if notice == "appeared" and (offset > 0 or inode is not None):
                                    restart_now = True  # the header of a new stream decides
                                    break
                                if notice == "error":
                                    stderr_text += line.decode(errors="replace")
                                continue
                            if out_task in done:
                                data = out_task.result()
                                if not data:
                                    out_task = None
                                    break
                                out_task = asyncio.ensure_future(proc.stdout.read(CHUNK))
                                offset += len(data)
                                tail_failures = 0
                                yield data
                    finally:
                        for task in (out_task, err_task):
                            if task is not None and not task.done():
                                task.cancel()
                                with contextlib.suppress(asyncio.CancelledError, Exception):
                                    await task
                if restart_now:
                    continue
                code = await proc.wait()
                stderr_text += (await proc.stderr.read()).decode(errors="replace")
        except HostUnreachable as exc:
            if host.pool is None:
                raise
            reconnect_failed, code, stderr_text = True, 255, str(exc)
        # The stream ended without our asking: a dropped link, or tail itself failed.
        if reconnect_failed or (code == 255 and (classify_ssh_failure(code, stderr_text) or not stderr_text.strip())):
            now = time.monotonic()
            lost_since = lost_since or now
            if now - lost_since > host.spec.reconnect_s:
                raise HostUnreachable(f"ssh host {host.name!r}: lost the link while following {path} and could not reconnect within {host.spec.reconnect_s}s: {stderr_text.strip()[-300:]}")
        else:
            tail_failures += 1
            if tail_failures >= MAX_TAIL_FAILURES:
                raise HostError(f"following {path} on ssh host {host.name!r} failed (exit {code}): {stderr_text.strip()[-300:]}")
        await asyncio.sleep(backoff)
        backoff = min(backoff * 2, 2.0)
