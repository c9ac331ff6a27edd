"""The events that drive the readiness state machine.

Each of the waiter's watchers (log follower, HTTP probe, liveness) turns what it sees into one of
these plain values; the state machine consumes them with a clock reading and does no I/O itself,
so every rule is testable with a table of events.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

__all__ = [
    "ProbeOutcome",
    "ProbeResult",
    "SmokeResult",
    "LogLines",
    "LogGrew",
    "LogTruncated",
    "LogMissing",
    "ProcessExit",
    "Queued",
    "Tick",
    "Event",
]


class ProbeOutcome(StrEnum):
    REFUSED = "refused"  # nothing listens (connection refused / reset / timed out)
    HTTP = "http"  # an answer that is not readiness (503 while loading, 500, all paths 404)
    OK = "ok"  # 2xx and the identity holds: our server says it is ready
    WRONG_IDENTITY = "wrong_identity"  # 2xx from a process that is not our server


@dataclass(frozen=True)
class ProbeResult:
    outcome: ProbeOutcome
    status: int | None = None
    path: str | None = None
    detail: str = ""  # plain words: "connection refused", "held by pid 123 (pgid 120), not 456"

    @property
    def key(self) -> tuple[str, int | None]:
        """What counts as a change of the probe for stall detection."""
        return (self.outcome.value, self.status)


@dataclass(frozen=True)
class SmokeResult:
    ok: bool
    detail: str = ""  # "HTTP 500: ...", "server disconnected", "200 in 0.01s"


@dataclass(frozen=True)
class LogLines:
    """Complete raw lines, in order; the machine numbers them. ``first_line_no``: the file's number
    of the first one, when lines were skipped before it (a bounded catch-up on a big log)."""

    lines: tuple[str, ...]
    first_line_no: int | None = None


@dataclass(frozen=True)
class LogGrew:
    """Bytes arrived without completing a line (a progress bar redrawn in place)."""

    partial: str = ""


@dataclass(frozen=True)
class LogTruncated:
    """The log shrank or was replaced: numbering restarts at line 1."""


@dataclass(frozen=True)
class LogMissing:
    """The log path does not exist (``present=True`` when it appears later)."""

    present: bool = False


@dataclass(frozen=True)
class ProcessExit:
    """The server process is gone.

    ``code``: its exit status (137 = SIGKILL as reported by the shell wrapper, negative = signal).
    ``code=None, killed=True``: the group vanished without the wrapper recording a status, i.e. the
    wrapper itself was SIGKILLed. ``code=None, killed=False``: gone, with no way to know the code
    (a server attached with ``--pid``, no status file). ``note``: how the code was or could not be
    known (e.g. the pid is not our child, so its own parent reaped its exit status)."""

    code: int | None
    killed: bool = False
    note: str = ""
    hint: str | None = None  # the host's own advice for how it ended (a Slurm job's end state)


@dataclass(frozen=True)
class Queued:
    """The server waits in a scheduler's queue (a pending Slurm job): not started, not stalled."""

    reason: str
    waited_s: float | None = None
    job_id: str = ""


@dataclass(frozen=True)
class Tick:
    """Time passed (drives the stall and overall timeouts and grace periods)."""


Event = ProbeResult | SmokeResult | LogLines | LogGrew | LogTruncated | LogMissing | ProcessExit | Queued | Tick
