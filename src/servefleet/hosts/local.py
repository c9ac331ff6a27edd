"""The local host: this machine, through asyncio subprocesses, os and psutil."""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import AsyncIterator, Mapping, Sequence

import psutil

from servefleet.errors import CommandError, HostError
from servefleet.hosts.atomic_write import write_atomically
from servefleet.hosts.base import (
    CommandResult,
    Launched,
    PortHolder,
    Truncated,
    detach_argv,
    loopback_for,
    proc_command_line,
    proc_owns,
)
from servefleet.hosts.local_ports import port_holder_fallback
from servefleet.hosts.pidstat import PidStatus, read_pid_status
from servefleet.hosts.piped import reap, start_piped
from servefleet.hosts.watch import WatchItem, poll_watch

__all__ = ["LocalHost"]


class LocalHost:
    """Runs everything on this machine. Stateless: cheap to create."""

    name = "local"

    def __init__(self, follow_interval_s: float = 0.02) -> None:
        self.follow_interval_s = follow_interval_s

    async def run(
        self,
        argv: Sequence[str],
        *,
        timeout: float | None = None,
        check: bool = True,
        input: bytes | None = None,
    ) -> CommandResult:
        proc = await start_piped(argv, has_input=input is not None, cannot=f"cannot run {argv[0]!r} on the local host")
        try:
            out, err = await asyncio.wait_for(proc.communicate(input), timeout)
        except TimeoutError:
            await reap(proc)
            raise HostError(f"command timed out after {timeout}s: {' '.join(argv)[:200]}") from None
        result = CommandResult(
            tuple(argv), proc.returncode or 0, out.decode(errors="replace"), err.decode(errors="replace")
        )
        if check and result.returncode != 0:
            raise CommandError(list(argv), result.returncode, result.stderr)
        return result

    async def spawn_detached(
        self,
        argv: Sequence[str],
        *,
        log_path: str,
        status_path: str,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> int:
        for path in (log_path, status_path):  # the wrapper cannot record an exit code in a missing folder
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        full_env = {**os.environ, **(env or {})}
        try:
            # start_new_session: setsid() in the child, so the wrapper leads a new session and
            # process group, and no terminal hang-up or Ctrl-C of ours reaches the server.
            proc = subprocess.Popen(
                detach_argv(argv, log_path, status_path),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env=full_env,
                cwd=cwd,
                start_new_session=True,
                close_fds=True,
            )
        except OSError as exc:
            raise HostError(f"cannot start the detach wrapper: {exc}") from exc
        return proc.pid

    async def launch(
        self,
        argv: Sequence[str],
        *,
        log_path: str,
        status_path: str,
        marker: str,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> Launched:
        offset, newlines = await asyncio.to_thread(
            append_marker, log_path, status_path, marker
        )  # counting lines reads the log
        await self.remove(status_path)
        pgid = await self.spawn_detached(argv, log_path=log_path, status_path=status_path, env=env, cwd=cwd)
        if await self.group_alive(pgid):
            return Launched(pgid, offset, newlines + 1)
        try:
            with open(status_path) as fh:
                code: int | None = int(fh.read().strip())
        except (OSError, ValueError):
            code = None
        return Launched(pgid, offset, newlines + 1, "exited" if code is not None else "gone", code)

    async def read_bytes(self, path: str, offset: int = 0, limit: int | None = None) -> bytes:
        with open(path, "rb") as fh:
            fh.seek(offset)
            return fh.read(-1 if limit is None else limit)

    async def file_size(self, path: str) -> int | None:
        try:
            return os.stat(path).st_size
        except FileNotFoundError:
            return None

    async def follow(self, path: str, offset: int = 0) -> AsyncIterator[bytes | Truncated]:
        inode: int | None = None
        fh = None
        try:
            while True:
                try:
                    st = os.stat(path)
                except FileNotFoundError:
                    st = None
                if st is not None and (fh is None or st.st_ino != inode):
                    if fh is not None:  # replaced (rotated): start the new file from its top
                        fh.close()
                        offset = 0
                        yield Truncated(0)
                    fh = open(path, "rb")
                    inode = st.st_ino
                if fh is not None and st is not None:
                    if st.st_size < offset:  # truncated in place
                        offset = 0
                        yield Truncated(0)
                    if st.st_size > offset:
                        fh.seek(offset)
                        data = fh.read(st.st_size - offset)
                        if data:
                            offset += len(data)
                            yield data
                            continue
                await asyncio.sleep(self.follow_interval_s)
        finally:
            if fh is not None:
                fh.close()

    def watch(
        self,
        log_path: str | None,
        offset: int = 0,
        *,
        pgid: int | None = None,
        status_path: str | None = None,
        pid: int | None = None,
    ) -> AsyncIterator[WatchItem]:
        """The WatchHost stream from this machine's disk and process table, polled (cheap here);
        ``pid``: a process of its own to watch (its group may outlive it)."""
        return poll_watch(self, log_path, offset, pgid=pgid, status_path=status_path, pid=pid)

    async def write_bytes(self, path: str, data: bytes, mode: int = 0o600) -> None:
        folder = os.path.dirname(os.path.abspath(path))
        os.makedirs(folder, exist_ok=True)
        write_atomically(path, data, mode, f"{path}.tmp.{os.getpid()}")

    async def remove(self, path: str) -> None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass

    async def owns(self, group: int, marker: str) -> bool | None:
        return await proc_owns(self, group, marker)

    async def command_line(self, pid: int) -> str | None:
        return await proc_command_line(self, pid)

    async def group_alive(self, pgid: int) -> bool:
        # In a thread: a process-table scan takes milliseconds (more on a busy machine), and the
        # readiness loop polls this while it probes; it must not stall the event loop.
        return await asyncio.to_thread(self._group_alive, pgid)

    @staticmethod
    def _group_alive(pgid: int) -> bool:
        try:  # the leader (the detach wrapper) alive answers without a scan
            if psutil.Process(pgid).status() != psutil.STATUS_ZOMBIE and os.getpgid(pgid) == pgid:
                return True
        except (ProcessLookupError, psutil.Error):
            pass
        for proc in psutil.process_iter(["pid", "status"]):
            try:
                if proc.info["status"] == psutil.STATUS_ZOMBIE:
                    continue
                if os.getpgid(proc.info["pid"]) == pgid:
                    return True
            except (ProcessLookupError, psutil.Error):
                continue
        return False

    async def pid_status(self, pid: int) -> PidStatus:
        return read_pid_status(pid)  # one small /proc read: no thread needed

    async def signal_group(self, pgid: int, signum: int) -> None:
        try:
            os.killpg(pgid, signum)
        except ProcessLookupError:
            pass
        except PermissionError as exc:
            raise HostError(f"not allowed to signal process group {pgid}: {exc}") from exc

    async def port_holder(self, port: int) -> PortHolder | None:
        return await asyncio.to_thread(self._port_holder, port)  # a scan of every socket: off the loop

    @staticmethod
    def _port_holder(port: int) -> PortHolder | None:
        try:
            conns = psutil.net_connections(kind="tcp")
        except psutil.AccessDenied:
            # Not "nobody listens": that would switch off the pre-launch port check and the
            # identity check wherever the socket table needs privileges. Ask /proc, ss, a bind.
            return port_holder_fallback(port)
        for conn in conns:
            if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port:
                pgid = None
                if conn.pid is not None:
                    try:
                        pgid = os.getpgid(conn.pid)
                    except ProcessLookupError:
                        continue
                return PortHolder(conn.pid, pgid, evidence="psutil")
        return None

    async def url_for(self, port: int, bind_host: str = "127.0.0.1") -> str:
        host = loopback_for(bind_host)
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    async def close(self) -> None:
        return None


def append_marker(log_path: str, status_path: str, marker: str, chunk: int = 16 * 1024 * 1024) -> tuple[int, int]:
    """Append ``marker`` as a line of its own to the log (ending a cut last line first), creating
    it 0600 and the folders of both files; (the log's size then, the newlines before it)."""
    for path in (log_path, status_path):
        os.makedirs(os.path.dirname(os.path.abspath(path)), mode=0o700, exist_ok=True)
    fd = os.open(log_path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        size = os.fstat(fd).st_size
        cut = size > 0 and os.pread(fd, 1, size - 1) != b"\n"
        os.write(fd, (b"\n" if cut else b"") + marker.encode() + b"\n")
        size = os.fstat(fd).st_size
        newlines, pos = 0, 0
        while pos < size:  # chunk by chunk: memory stays bounded on a big log
            data = os.pread(fd, min(chunk, size - pos), pos)
            if not data:
                break
            newlines += data.count(b"\n")
            pos += len(data)
        return size, newlines
    finally:
        os.close(fd)
