"""Who listens on a local TCP port, when ``psutil.net_connections`` may not be asked.

psutil raises ``AccessDenied`` where its socket table needs privileges (macOS, some hardened
kernels); treating that as "nobody listens" would switch off the pre-launch port check and the
identity check by socket owner. These are the other ways, tried in order, each named in the
answer (``PortHolder.evidence``) so a verdict can say what it rests on:

1. ``/proc/net/tcp`` and ``/proc/net/tcp6``: every listening socket of this network namespace, with
   its inode, readable without privileges; the owner is the process whose ``/proc/PID/fd`` links to
   ``socket:[INODE]`` (only processes we may inspect: ours, or all as root);
2. ``ss -ltnpH``: the same facts from iproute2, where /proc is not mounted the Linux way;
3. a bind test: binding the port on the wildcard address fails with EADDRINUSE when someone
   listens -- the owner stays unknown (pid None), but the port is known to be taken.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import socket
import subprocess
from collections.abc import Iterable

from servefleet.hosts.base import PortHolder

__all__ = [
    "port_holder_fallback",
    "listening_inodes",
    "parse_ss",
    "socket_owner",
    "bind_test",
    "PROC_EVIDENCE",
    "SS_EVIDENCE",
    "BIND_EVIDENCE",
]

PROC_EVIDENCE = "/proc/net/tcp"
SS_EVIDENCE = "ss -ltnp"
BIND_EVIDENCE = "bind test"

_LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's st column
# "users:(("python3",pid=4242,fd=7))"
_SS_PID = re.compile(r"\bpid=(\d+)")


def listening_inodes(text: str, port: int) -> list[int]:
    """Socket inodes listening on ``port`` in the text of /proc/net/tcp or /proc/net/tcp6."""
    found = []
    for line in text.splitlines()[1:]:
        cols = line.split()
        if len(cols) < 10 or cols[3] != _LISTEN:
            continue
        _, _, hex_port = cols[1].rpartition(":")
        try:
            if int(hex_port, 16) == port:
                found.append(int(cols[9]))
        except ValueError:
            continue
    return found


def socket_owner(inodes: Iterable[int], proc: str = "/proc") -> int | None:
    """The pid of a process holding one of the socket ``inodes`` open (None: none we may see)."""
    wanted = {f"socket:[{inode}]" for inode in inodes}
    if not wanted:
        return None
    try:
        pids = [int(name) for name in os.listdir(proc) if name.isdigit()]
    except OSError:
        return None
    for pid in pids:
        folder = f"{proc}/{pid}/fd"
        try:
            fds = os.listdir(folder)
        except OSError:  # another user's process, or gone
            continue
        for fd in fds:
            try:
                if os.readlink(f"{folder}/{fd}") in wanted:
                    return pid
            except OSError:
                continue
    return None


def parse_ss(stdout: str, port: int) -> tuple[bool, int | None]:
    """(someone listens on ``port``, its pid when ss could name it) from ``ss -ltnpH`` output."""
    for line in stdout.splitlines():
        cols = line.split()
        if len(cols) < 4:
            continue
        _, _, local_port = cols[3].rpartition(":")
        if local_port == str(port):
            match = _SS_PID.search(line)
            return True, int(match.group(1)) if match else None
    return False, None


def bind_test(port: int) -> bool:
    """Whether something listens on ``port``: a bind on the wildcard address (IPv6 dual-stack and
    IPv4) fails with EADDRINUSE. SO_REUSEADDR, so a socket in TIME_WAIT does not count."""
    for family, address in ((socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0")):
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError:  # no IPv6 here
            continue
        with sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((address, port))
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    return True
                continue  # e.g. EADDRNOTAVAIL: this family cannot say; try the next
    return False


def _holder(pid: int | None, evidence: str) -> PortHolder | None:
    if pid is None:
        return PortHolder(None, None, evidence=evidence)
    try:
        return PortHolder(pid, os.getpgid(pid), evidence=evidence)
    except ProcessLookupError:
        return None  # it exited between the scan and now: its socket closed with it


def _from_proc(port: int, proc: str) -> tuple[bool, PortHolder | None]:
    """(whether /proc could answer, the holder)."""
    texts = []
    for name in ("tcp", "tcp6"):
        try:
            with open(f"{proc}/net/{name}") as fh:
                texts.append(fh.read())
        except FileNotFoundError:
            continue  # tcp6 is absent without IPv6
        except OSError:
            return False, None
    if not texts:
        return False, None
    inodes = [i for text in texts for i in listening_inodes(text, port)]
    if not inodes:
        return True, None
    return True, _holder(socket_owner(inodes, proc), PROC_EVIDENCE)


def _from_ss(port: int) -> tuple[bool, PortHolder | None]:
    ss = shutil.which("ss")
    if ss is None:
        return False, None
    try:
        done = subprocess.run([ss, "-ltnpH"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False, None
    if done.returncode != 0:
        return False, None
    listens, pid = parse_ss(done.stdout, port)
    return True, _holder(pid, SS_EVIDENCE) if listens else None


def port_holder_fallback(port: int, proc: str = "/proc") -> PortHolder | None:
    """Who listens on ``port``, without psutil's socket table (module docstring)."""
    answered, holder = _from_proc(port, proc)
    if answered:
        return holder
    answered, holder = _from_ss(port)
    if answered:
        return holder
    return PortHolder(None, None, evidence=BIND_EVIDENCE) if bind_test(port) else None
