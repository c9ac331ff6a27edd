"""The multiplexed master connections of one SSH host, and the sessions and forwards they carry.

One handshake per host instead of one per command: a master is started explicitly with
``ssh -M -N -f`` (all stdio detached), confirmed with ``-O check``, and stopped with ``-O exit``.
Commands and log followers ride it as mux clients.

An OpenSSH server allows ``MaxSessions`` (default 10) sessions per connection, so the pool never
puts more than ``max_sessions`` on one master, and long-lived sessions (log followers) leave
``RESERVED_SHORT`` slots of every master to short commands; more followers open more masters.
Forwarded ports do not count as sessions; they live on master 0 and are re-added when it restarts.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import secrets
import socket
import subprocess
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from servefleet.errors import HostError, HostUnreachable
from servefleet.hosts.ssh_options import SSHSpec, classify_ssh_failure, control_dir, control_path, ssh_argv, ssh_error

__all__ = ["Master", "MasterPool", "RESERVED_SHORT", "free_local_port"]

RESERVED_SHORT = 2
FORWARD_ATTEMPTS = 5


def free_local_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Master:
    index: int
    path: str  # ControlPath with %C, as given to ssh
    err_file: str  # the master's stderr (it outlives the `ssh -f` that started it)
    short: int = 0  # sessions in use by short commands
    long: int = 0  # sessions held by followers
    verified_at: float | None = None  # monotonic time of the last check/start; None = unknown
    pid: int | None = None
    socket: str | None = None  # the expanded control path (None until known)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def sessions(self) -> int:
        return self.short + self.long


class MasterPool:
    """Masters for one SSHSpec. Not shared between processes: the control paths carry a random
    token, so `close()` can never cut another servefleet process's connection."""

    def __init__(self, spec: SSHSpec, folder: str | None = None) -> None:
        self.spec = spec
        self.folder = control_dir(folder)
        self.token = secrets.token_hex(4)
        self.masters: list[Master] = []
        self.forwards: dict[tuple[str, int], int] = {}  # (remote host, remote port) -> local port
        self.starts = 0  # masters started, restarts included (tests and benchmarks read it)
        self._cond = asyncio.Condition()
        self._forward_lock = asyncio.Lock()
        self._closed = False

    # -- sessions ---------------------------------------------------------------------------

    def _pick(self, long: bool) -> Master | None:
        cap = self.spec.max_sessions
        long_cap = max(1, cap - RESERVED_SHORT)
        for m in self.masters:
            if m.sessions < cap and (not long or m.long < long_cap):
                return m
        # Short commands wait for a slot while other short commands hold them (they end soon);
        # they open a new master only when followers fill every existing one.
        if len(self.masters) < self.spec.max_masters and (long or not any(m.short for m in self.masters)):
            return self._new_master()
        return None

    def _new_master(self) -> Master:
        index = len(self.masters)
        m = Master(
            index, control_path(self.folder, self.token, index), os.path.join(self.folder, f"{self.token}.{index}.err")
        )
        self.masters.append(m)
        return m

    @contextlib.asynccontextmanager
    async def session(self, long: bool = False) -> AsyncIterator[Master]:
        """A slot on a live master for one ssh client process."""
        async with self._cond:
            while True:
                if self._closed:
                    raise HostError(f"ssh host {self.spec.label!r} was closed")
                m = self._pick(long)
                if m is not None:
                    break
                await self._cond.wait()
            if long:
                m.long += 1
            else:
                m.short += 1
        try:
            await self.ensure(m)
            yield m
        finally:
            async with self._cond:
                if long:
                    m.long -= 1
                else:
                    m.short -= 1
                self._cond.notify_all()

    def alive(self, m: Master) -> bool:
        """Whether ``m`` answers on its control socket right now (True when its path is unknown)."""
        return m.socket is None or _socket_accepts(m.socket)

    def suspect(self, m: Master) -> None:
        """A client of ``m`` failed at the connection level: check it before the next use."""
        m.verified_at = None

    # -- master lifecycle -------------------------------------------------------------------

    async def ensure(self, m: Master) -> None:
        """Make sure ``m`` runs, starting it if not. Before every session: a master that was
        killed, lost its link or idled out (ControlPersist) must not go unnoticed, or clients
        would silently fall back to one full connection each."""
        async with m.lock:
            if self._closed:
                raise HostError(f"ssh host {self.spec.label!r} was closed")
            if m.socket is None:
                m.socket = await self._socket_path(m)
            if m.socket is not None:
                # Connecting to the control socket is a free liveness test (a stale socket of a
                # killed master refuses); `-O check` would cost a process per command.
                if _socket_accepts(m.socket):
                    return
            elif m.verified_at is not None and time.monotonic() - m.verified_at < max(
                5.0, self.spec.control_persist / 2
            ):
                return  # socket path unknown: trust a recent `-O check`
            elif await self.check(m):
                return
            await self._start(m)

    async def _socket_path(self, m: Master) -> str | None:
        """The socket path ssh makes of ``ControlPath=...%C`` (``ssh -G`` expands it; no network)."""
        argv = ssh_argv(self.spec, "master", m.path, flags=["-G"])
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
        )
        out, _ = await proc.communicate()
        for line in out.decode(errors="replace").splitlines():
            key, _, value = line.partition(" ")
            if key.lower() == "controlpath" and value and "%" not in value:
                return value
        return None

    async def check(self, m: Master) -> bool:
        rc, _out, err = await self._ssh(["-O", "check"], m, timeout=10)
        if rc == 0:
            found = re.search(r"pid=(\d+)", err)
            m.pid = int(found.group(1)) if found else m.pid
            m.verified_at = time.monotonic()
            return True
        m.verified_at = None
        return False

    async def _start(self, m: Master) -> None:
        # -N: no command, -f: background after authentication. Not -M: ControlMaster=yes finding
        # the stale socket of a killed master says "already exists, disabling multiplexing" and
        # leaves a useless unmultiplexed connection; ControlMaster=auto (ssh_options) unlinks a
        # stale socket and becomes the master.
        argv = ssh_argv(self.spec, "master", m.path, flags=["-N", "-f", "-T"])
        # stdin/stdout from /dev/null; stderr to a file, because the backgrounded master keeps
        # it open for its whole life (a pipe would never reach EOF).
        with open(m.err_file, "wb") as err_fh:
            try:
                proc = await asyncio.create_subprocess_exec(
                    *argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err_fh
                )
            except OSError as exc:
                raise HostError(f"cannot run the ssh client: {exc}") from exc
        # ConnectTimeout bounds the TCP connect and banner per hop; allow a second hop (jump
        # host) plus key exchange and authentication.
        budget = 2 * self.spec.connect_timeout + 5
        try:
            rc = await asyncio.wait_for(proc.wait(), budget)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise HostUnreachable(
                f"ssh host {self.spec.label!r} is unreachable: connection timed out (no session after {budget}s)"
            ) from None
        stderr = _read_text(m.err_file)
        if rc != 0:
            err = ssh_error(self.spec, argv, rc, stderr)
            if isinstance(err, HostUnreachable):
                raise err
            raise HostUnreachable(
                f"ssh host {self.spec.label!r}: the master connection failed (exit {rc}): {stderr.strip()[-300:]}"
            )
        if not await self.check(m):
            raise HostUnreachable(
                f"ssh host {self.spec.label!r}: the master started but does not answer `-O check`: {_read_text(m.err_file).strip()[-300:]}"
            )
        self.starts += 1
        if m.index == 0 and self.forwards:
            await self._readd_forwards(m)

    async def _ssh(self, flags: list[str], m: Master, timeout: float) -> tuple[int, str, str]:
        argv = ssh_argv(self.spec, "client", m.path, flags=flags)
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        try:
            out, err = await asyncio.wait_for(proc.communicate(), timeout)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            return 255, "", f"ssh {' '.join(flags)} timed out"
        return proc.returncode or 0, out.decode(errors="replace"), err.decode(errors="replace")

    async def exit_all(self) -> None:
        """``ssh -O exit`` every master (servers keep running; forwards and followers end)."""
        for m in self.masters:
            async with m.lock:
                await self._ssh(["-O", "exit"], m, timeout=10)
                m.verified_at = None
                m.pid = None

    async def close(self) -> None:
        async with self._cond:
            self._closed = True
            self._cond.notify_all()
        for (host, port), local in list(self.forwards.items()):
            if self.masters:
                await self._ssh(["-O", "cancel", "-L", _forward_spec(local, host, port)], self.masters[0], timeout=10)
        self.forwards.clear()
        for m in self.masters:
            await self._ssh(["-O", "exit"], m, timeout=10)
            with contextlib.suppress(OSError):
                os.unlink(m.err_file)

    def master_pids(self) -> list[int]:
        return [m.pid for m in self.masters if m.pid]

    # -- forwards ---------------------------------------------------------------------------

    async def forward(self, host: str, port: int, local_port: int | None = None) -> int:
        """A local port on 127.0.0.1 forwarded over master 0 to ``host:port`` on the remote
        (``local_port`` if given, else a free one)."""
        key = (host, port)
        async with self._forward_lock:
            if self._closed:
                raise HostError(f"ssh host {self.spec.label!r} was closed")
            # Forwards live on master 0 (re-added when it restarts); they use no session slot.
            m = self.masters[0] if self.masters else self._new_master()
            await self.ensure(m)
            if key in self.forwards:
                return self.forwards[key]
            last = ""
            for _ in range(1 if local_port else FORWARD_ATTEMPTS):
                local = local_port or free_local_port()  # -L cannot take port 0: pick one, retry if taken
                rc, _out, err = await self._ssh(
                    ["-O", "forward", "-L", _forward_spec(local, host, port)], m, timeout=15
                )
                if rc == 0:
                    self.forwards[key] = local
                    return local
                last = err
                reason = classify_ssh_failure(rc, err)
                if reason == "master connection lost":
                    self.suspect(m)
                    await self.ensure(m)
                elif reason not in (None, "ssh client failed") and "forwarding failed" not in err:
                    break
            raise HostError(
                f"cannot forward a local port to {host}:{port} on ssh host {self.spec.label!r}: {last.strip()[-300:]}"
            )

    async def _readd_forwards(self, m: Master) -> None:
        for (host, port), local in list(self.forwards.items()):
            rc, _out, _err = await self._ssh(["-O", "forward", "-L", _forward_spec(local, host, port)], m, timeout=15)
            if rc != 0:  # the old local port was taken meanwhile: url_for will pick a new one
                del self.forwards[(host, port)]


def _forward_spec(local: int, host: str, port: int) -> str:
    target = f"[{host}]" if ":" in host else host
    return f"127.0.0.1:{local}:{target}:{port}"


def _socket_accepts(path: str) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        try:
            sock.connect(path)
        except OSError:
            return False
    return True


def _read_text(path: str) -> str:
    try:
        with open(path, "rb") as fh:
            return fh.read().decode(errors="replace")
    except OSError:
        return ""
