"""The host contract: where commands run. A host knows how to run a command, spawn a detached
process, read and follow a file, signal a process group and reach a port — nothing about engines.

Local, SSH and Slurm hosts share this one interface, so the layers above never branch on host type.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from servefleet.hosts.pidstat import PidStatus

__all__ = [
    "CommandResult",
    "PortHolder",
    "PidStatus",
    "Host",
    "UnitHost",
    "FilesThrough",
    "Launched",
    "DETACH_SCRIPT",
    "detach_argv",
    "loopback_for",
    "poll_follow",
    "Truncated",
    "cmdline_owns",
    "proc_cmdline_path",
    "proc_owns",
    "proc_command_line",
]


@dataclass(frozen=True)
class CommandResult:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str


@dataclass(frozen=True)
class PortHolder:
    """The process listening on a port (pid may be None when the OS hides it from us).

    ``evidence``: how it was found ("psutil", "/proc/net/tcp", "ss -ltnp", "bind test"), for
    verdicts to say what they rest on; not part of equality."""

    pid: int | None
    pgid: int | None
    evidence: str | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Launched:
    """What ``Host.launch`` reports: the new process group, where this launch's output starts in
    the (appended) log and that byte's line number, and the group's state right after the start
    ("alive", "exited" with the wrapper's ``code``, or "gone": killed before it recorded one)."""

    pgid: int
    log_offset: int
    line_no: int
    state: str = "alive"
    code: int | None = None


@dataclass(frozen=True)
class Truncated:
    """Yielded by ``follow`` when the file shrank or was replaced: reading restarts at ``offset``."""

    offset: int


# The detach wrapper, run as `sh -c DETACH_SCRIPT sh LOG STATUS ARGV...` in a new session.
# It is the session and process-group leader, so `down` signals the whole group. It stays the
# parent of the server so the exit code is recorded even though the CLI that launched it is gone:
# a status file with the code (137 = SIGKILL of the server). When the wrapper itself is killed with
# SIGKILL (the whole group was), no status file appears — the fleet layer reads that as `killed`.
# Output is appended (>>) so a restart keeps the earlier attempt's log above a marker line.
# The trap is set before the server starts (a `down` in the first instant must not kill the
# wrapper itself), and signals are ignored while the code is written: `mv` is a process of the
# group, and a group-wide SIGTERM (`up` stopping a server it found failed, as the server exits on
# its own) killed it between the write and the rename, leaving `STATUS.tmp` and no exit code.
DETACH_SCRIPT = r"""
log=$1; status=$2; shift 2
exec </dev/null >>"$log" 2>&1
rm -f "$status"
child=
trap '[ -z "$child" ] || kill -TERM "$child" 2>/dev/null' TERM INT HUP
"$@" &
child=$!
wait "$child"; rc=$?
while kill -0 "$child" 2>/dev/null; do wait "$child"; rc=$?; done
trap '' TERM INT HUP
echo "$rc" > "$status.tmp" && mv -f "$status.tmp" "$status"
"""


def detach_argv(argv: Sequence[str], log_path: str, status_path: str) -> list[str]:
    """The argv that runs ``argv`` under the detach wrapper (the caller starts a new session)."""
    return ["sh", "-c", DETACH_SCRIPT, "sh", log_path, status_path, *argv]


def loopback_for(bind_host: str) -> str:
    """The address that reaches a server bound to ``bind_host`` from its own machine: a wildcard
    bind (or "localhost") is reached at the loopback of its family, an address at itself."""
    if bind_host in ("0.0.0.0", "", "localhost"):
        return "127.0.0.1"
    return "::1" if bind_host == "::" else bind_host


@runtime_checkable
class Host(Protocol):
    """Where commands run. Every method is async; paths are the host's own paths."""

    name: str

    async def run(
        self,
        argv: Sequence[str],
        *,
        timeout: float | None = None,
        check: bool = True,
        input: bytes | None = None,
    ) -> CommandResult:
        """Run a command to completion. ``check`` raises CommandError on a non-zero exit."""
        ...

    async def spawn_detached(
        self,
        argv: Sequence[str],
        *,
        log_path: str,
        status_path: str,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> int:
        """Start ``argv`` fully detached (new session, stdin /dev/null, output appended to
        ``log_path``); return its process-group id (= the wrapper's pid)."""
        ...

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
        """A server's whole launch, as one remote command where commands are round trips: append
        ``marker`` as a line of its own to ``log_path`` (ending a previous attempt's cut line
        first; the log is created 0600 with its folders), record the log's size and line count
        then, remove a stale ``status_path``, ``spawn_detached`` ``argv`` and say whether its
        group lives."""
        ...

    async def read_bytes(self, path: str, offset: int = 0, limit: int | None = None) -> bytes:
        """Bytes of a file from ``offset``; raises FileNotFoundError when it does not exist."""
        ...

    async def file_size(self, path: str) -> int | None:
        """Size in bytes, or None when the file does not exist."""
        ...

    def follow(self, path: str, offset: int = 0) -> AsyncIterator[bytes | Truncated]:
        """Yield new bytes of a growing file from ``offset`` as they appear; yield Truncated when
        the file shrinks or is replaced. Never ends by itself: the caller stops iterating."""
        ...

    async def write_bytes(self, path: str, data: bytes, mode: int = 0o600) -> None:
        """Write a file atomically (temporary file + rename), creating its folder."""
        ...

    async def remove(self, path: str) -> None:
        """Remove a file; a missing file is not an error."""
        ...

    async def group_alive(self, pgid: int) -> bool:
        """Whether any live (non-zombie) process remains in the process group."""
        ...

    async def owns(self, group: int, marker: str) -> bool | None:
        """Whether live process group ``group`` is still the one launched with ``marker`` (the
        server's log path) on its leader's command line: False when the id now names something
        else; None when the host cannot tell (the leader has exited or is a zombie, or it cannot
        be read) — a live group whose leader exited is still ours: Linux does not reuse a pid
        that is in use as a group id. A scheduler's host answers from the scheduler's job."""
        ...

    async def command_line(self, pid: int) -> str | None:
        """Process ``pid``'s command line (arguments joined by spaces), None when unreadable or
        empty; for messages about who holds a port."""
        ...

    async def pid_status(self, pid: int) -> PidStatus:
        """Whether one process is alive, a zombie (with its exit status when readable) or gone.
        A group can outlive the process a user pointed at (a shell's group, orphaned children)."""
        ...

    async def signal_group(self, pgid: int, signum: int) -> None:
        """Send a signal to a whole process group; a group that is gone is not an error."""
        ...

    async def port_holder(self, port: int) -> PortHolder | None:
        """Who listens on TCP ``port`` (any address), or None when nobody does."""
        ...

    async def url_for(self, port: int, bind_host: str = "127.0.0.1") -> str:
        """A base URL this machine can use to reach the host's ``bind_host:port`` (for SSH hosts:
        through a local forward over the master connection)."""
        ...

    async def close(self) -> None:
        """Release connections and forwards (servers keep running)."""
        ...


class FilesThrough:
    """The file half of ``Host`` passed through to another host: a Slurm host's files are its login
    node's, a batch view's (fleet/prefetch.py) are its host's. ``files_host`` is set by the class."""

    files_host: Host

    async def read_bytes(self, path: str, offset: int = 0, limit: int | None = None) -> bytes:
        return await self.files_host.read_bytes(path, offset, limit)

    async def file_size(self, path: str) -> int | None:
        return await self.files_host.file_size(path)

    def follow(self, path: str, offset: int = 0) -> AsyncIterator[bytes | Truncated]:
        return self.files_host.follow(path, offset)

    async def write_bytes(self, path: str, data: bytes, mode: int = 0o600) -> None:
        await self.files_host.write_bytes(path, data, mode)

    async def remove(self, path: str) -> None:
        await self.files_host.remove(path)


@runtime_checkable
class UnitHost(Protocol):
    """An optional capability of a Host: starting servers as transient ``systemd --user`` units
    (SSH hosts with ``launcher = "systemd-run"``, see ssh_systemd.py). The process a unit runs is
    the same detach wrapper with the same log and status file, so everything else still goes
    through ``Host``; only the start and the stop of the unit differ."""

    launcher: str  # "setsid" (the Host contract's spawn_detached) or "systemd-run"

    async def check_units(self) -> None:
        """Raise LaunchError, saying what is missing and what to do, unless units can be used."""
        ...

    async def launch_unit(
        self,
        argv: Sequence[str],
        *,
        unit: str,
        log_path: str,
        status_path: str,
        marker: str,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> Launched:
        """``Host.launch`` with the server started as unit ``unit`` (checks ``check_units`` first)."""
        ...

    async def stop_unit(self, unit: str, *, force: bool = False) -> None:
        """Stop the unit (SIGTERM to all its processes) without waiting, or SIGKILL them."""
        ...


def proc_cmdline_path(pid: int) -> str:
    """Where a /proc host (Linux: local, SSH) keeps a process's NUL-separated command line."""
    return f"/proc/{int(pid)}/cmdline"


def cmdline_owns(cmdline: bytes | None, marker: str) -> bool | None:
    """``Host.owns`` from a group leader's command line (None: missing, unreadable or a zombie's
    empty one: the host cannot tell)."""
    if not cmdline:
        return None
    return marker.encode() in cmdline


async def proc_owns(host: Host, group: int, marker: str) -> bool | None:
    """``Host.owns`` for a /proc host, through its own ``read_bytes``."""
    try:
        raw: bytes | None = await host.read_bytes(proc_cmdline_path(group))
    except OSError:  # FileNotFoundError: the leader is gone; anything else: cannot read it
        raw = None
    return cmdline_owns(raw, marker)


async def proc_command_line(host: Host, pid: int) -> str | None:
    """``Host.command_line`` for a /proc host, through its own ``read_bytes``."""
    try:
        raw = await host.read_bytes(proc_cmdline_path(pid))
    except OSError:
        return None
    return raw.replace(b"\0", b" ").decode(errors="replace").strip() or None


async def poll_follow(
    host: Host, path: str, offset: int = 0, interval_s: float = 0.02
) -> AsyncIterator[bytes | Truncated]:
    """A ``follow`` built from ``file_size`` and ``read_bytes`` by polling (cheap on a local disk)."""
    while True:
        size = await host.file_size(path)
        if size is not None:
            if size < offset:
                offset = 0
                yield Truncated(0)
            elif size > offset:
                try:
                    data = await host.read_bytes(path, offset, size - offset)
                except FileNotFoundError:
                    data = b""
                if data:
                    offset += len(data)
                    yield data
                    continue
        await asyncio.sleep(interval_s)
