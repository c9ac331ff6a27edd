"""An optional capability of a Host: watching one server with one long-lived stream.

Waiting for a server needs its log as it grows, its exit code and whether its process group still
lives. A host where every question is a round trip (SSH) answers all three with one remote watcher
per server instead of a command per poll (ssh_follow.py); the waiter uses it when the host has it
and polls ``file_size``/``group_alive`` otherwise (a local disk and process table are cheap).

What ``watch`` yields, in order of occurrence:

- ``bytes`` and ``Truncated``: as ``Host.follow`` (nothing when no log is watched);
- ``LogAbsent(present=False)`` when the log does not exist yet, ``LogAbsent(present=True)`` when
  it appears;
- ``Exited`` once, when the process is gone, after every byte the log held at that moment: the
  iteration ends there.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from servefleet.hosts.base import Truncated

__all__ = ["Exited", "LogAbsent", "Pending", "WatchHost", "WatchItem"]


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
