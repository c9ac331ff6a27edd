"""The questions ``status`` and ``up``'s adopt checks ask about a server, built in one place.

The batch (fleet/prefetch.py) asks exactly these values in advance and the per-server code
(status.py, lifecycle.py) asks the same values through ``hosts.questions.ask``: one function
builds each question for both sides, so the two cannot drift apart (a question the batch did not
hold is a round trip more and a miss on the view: tests/test_ssh_status.py counts both).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from servefleet.hosts.questions import Alive, Owns, Port, Question, Read, ReadIfDead, Size, Tail

if TYPE_CHECKING:
    from servefleet.fleet.hosts import HostBinding
    from servefleet.fleet.state import ServerState

__all__ = [
    "DIAGNOSE_LIMIT",
    "STALL_TAIL",
    "alive",
    "owner",
    "exit_code",
    "attempt_log",
    "log_end",
    "port",
    "remote_record",
    "log_size",
    "status_questions",
    "adopt_questions",
]

DIAGNOSE_LIMIT = 8 * 1024 * 1024  # bytes of the current attempt's log read for a diagnosis
# The end of a serving server's log searched for the engine's last statistics: a stopped engine writes
# nothing but the probes' access lines (~100 bytes each), so its last statistics stay in it for a while.
STALL_TAIL = 64 * 1024


def alive(record: ServerState) -> Alive:
    return Alive(record.pgid)


def owner(record: ServerState) -> Owns:
    return Owns(record.pgid, record.log_path)


def exit_code(record: ServerState) -> Read:
    """The detach wrapper's exit-code file."""
    return Read(record.status_path)


def attempt_log(record: ServerState) -> Read:
    """The current attempt's part of the (appended) log, up to DIAGNOSE_LIMIT bytes."""
    return Read(record.log_path, record.log_offset, DIAGNOSE_LIMIT)


def log_end(record: ServerState) -> Tail:
    """The end of the current attempt's log, for the engine's last statistics."""
    return Tail(record.log_path, record.log_offset, STALL_TAIL)


def port(number: int) -> Port:
    return Port(int(number))


def remote_record(binding: HostBinding, name: str) -> Read:
    """The state record kept next to the server (remote hosts)."""
    return Read(binding.state_path(name))


def log_size(binding: HostBinding, name: str) -> Size:
    return Size(binding.log_path(name))


def adopt_questions(record: ServerState) -> list[Question]:
    """Whether the recorded group lives and is still ours (lifecycle.owns_group)."""
    return [alive(record), owner(record)]


def status_questions(record: ServerState, *, reads_stats: bool) -> list[Question]:
    """Everything ``server_status`` may ask the host about ``record`` (the log only when the group
    is gone: a live server's log is read only if its probe does not answer; its end only for an
    engine whose statistics ``serving_stall`` reads)."""
    return [
        *adopt_questions(record),
        exit_code(record),
        port(record.port),
        ReadIfDead(record.pgid, attempt_log(record)),
    ] + ([log_end(record)] if reads_stats else [])
