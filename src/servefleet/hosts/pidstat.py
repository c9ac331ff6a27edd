"""One process's fate from its ``/proc/PID/stat`` line: alive, a zombie (with its exit status), or gone.

Pure parsing, shared by LocalHost (reads the file) and SSHHost (cats it on the remote), so both
answer ``Host.pid_status`` the same way.

Why a pid and not only its process group: a server started as a plain child of a live shell shares
the shell's group, and a vLLM API server leaves engine-core children behind; the group then stays
alive after the server died. The pid dying is the server dying, whatever its group holds.

The exit status can be read only while the process is a zombie (field 52, ``exit_code``, in
``waitpid`` form, Linux >= 3.5). A process that is not our child is reaped by its own parent at
once (a shell's ``wait``), so its exit status is usually lost to us: ``PidStatus.code`` is None.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = ["PidStatus", "parse_proc_stat", "read_pid_status", "GONE"]


@dataclass(frozen=True)
class PidStatus:
    """``state``: ``alive``, ``zombie`` (exited, not yet reaped) or ``gone``.

    ``code``: a zombie's exit status when readable (negative = killed by that signal, as in
    ``subprocess``); ``ppid``: the parent (who will reap it); ``started``: the kernel's start time in
    clock ticks, to tell a reused pid from the process first seen."""

    state: str
    code: int | None = None
    ppid: int | None = None
    started: int | None = None

    @property
    def alive(self) -> bool:
        return self.state == "alive"


GONE = PidStatus("gone")


def _status_to_code(status: int) -> int | None:
    if os.WIFSIGNALED(status):
        return -os.WTERMSIG(status)
    if os.WIFEXITED(status):
        return os.WEXITSTATUS(status)
    return None


def parse_proc_stat(text: str) -> PidStatus:
    """The status a ``/proc/PID/stat`` line describes (GONE for an empty or garbled line).

    The command name (field 2) may hold spaces and parentheses: fields are counted after the last
    ``") "``. After it: state (3), ppid (4), ... starttime (22), ... exit_code (52)."""
    head, sep, rest = text.strip().rpartition(") ")
    if not sep:
        return GONE
    fields = rest.split()
    if len(fields) < 20:
        return GONE
    try:
        ppid = int(fields[1])
        started = int(fields[19])
    except ValueError:
        return GONE
    if fields[0] in ("Z", "X", "x"):  # zombie, or dead and being torn down
        code = None
        if len(fields) >= 50 and fields[49].lstrip("-").isdigit():
            code = _status_to_code(int(fields[49]))
        return PidStatus("zombie", code=code, ppid=ppid, started=started)
    return PidStatus("alive", ppid=ppid, started=started)


def read_pid_status(pid: int) -> PidStatus:
    """This machine's answer for ``pid``."""
    try:
        with open(f"/proc/{int(pid)}/stat", encoding="utf-8", errors="replace") as fh:
            return parse_proc_stat(fh.read())
    except (FileNotFoundError, ProcessLookupError):
        return GONE
    except PermissionError:  # hidepid=2 hides other users' processes: fall back to kill(0)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return GONE
        except PermissionError:
            pass
        return PidStatus("alive")
