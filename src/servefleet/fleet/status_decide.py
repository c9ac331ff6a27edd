"""``status``'s decision, pure: one look at a server (a ``Snapshot`` of facts) in, its state out.

status.py gathers the facts with one question per fact, asked only when the decision needs it (a
dead server is not probed, a serving one's log is read only for its statistics); all it means is decided here.
The log's part of the decision (failed with a category and evidence, or loading with progress) is
the verdict of the same ``verify.machine.ReadinessMachine`` that ``wait`` runs, replayed over the
snapshot's facts (``replay``): the attempt's log lines, the probe's answer and, for a dead server,
the exit (no exit code recorded: the whole group was killed). So ``wait`` and ``status`` cannot
disagree: an exit with no fatal line is a failure (``other``; SIGKILL, 137 or no code, ``killed``),
and the first fatal line is the cause even when a ready line follows it.

The machine decides over time (grace periods for a cause still being flushed, stall and overall
timeouts); a one-shot look has no later moment, so its facts are fed at one instant and then the
clock is read once more at ``SETTLED_S``, past every grace period: what the look saw is all there
will be. No stall or timeout is counted (``inf``: a stall needs two looks), and that instant is
too early for the machine's "quiet for Ns" notes, which would speak of seconds that never passed.
Here the machine's verdict is combined with the process group, the exit code, the probe and the
record (a server `up` stopped after it failed: its exit is that stop, so unless the log names a
cause the record's category says why).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum

from servefleet.capacity import Capacity
from servefleet.catalog import State
from servefleet.engines.base import EngineProfile
from servefleet.verify.events import LogLines, LogMissing, ProbeOutcome, ProbeResult, ProcessExit, Tick
from servefleet.verify.machine import SMOKE_GRACE_S, WRAPPER_GRACE_S, WRAPPER_MAX_S, ReadinessMachine
from servefleet.verify.verdict import Verdict

__all__ = ["Liveness", "AttemptLog", "Snapshot", "Decision", "decide", "replay", "SETTLED_S"]

EVIDENCE_CHARS = 120  # of the evidence line shown in the detail
SETTLED_S = max(WRAPPER_GRACE_S, WRAPPER_MAX_S, SMOKE_GRACE_S)  # the look's one later reading of the clock


class Liveness(StrEnum):
    """What a server is doing now, seen from outside in one look (``status``). Three vocabularies,
    three questions: ``catalog.State`` is the verdict of one start attempt (``wait``'s readiness
    machine: launching, loading, ready, failed, stalled); ``Liveness`` is the present state of a
    recorded server (its names shared with State mean the same: ``ready``, ``loading``, ``failed``;
    the others exist only after a start: unresponsive, hung, dead, stale, not launched);
    ``generate.health.ServerState`` is a server's place in one job (up, down, gone, stopped)."""

    READY = "ready"  # alive, probe answers, the port is ours
    LOADING = "loading"  # alive, probe not answering yet, no fatal line
    FAILED = "failed"  # alive but the log holds a fatal line (e.g. hanging after an error)
    UNRESPONSIVE = "unresponsive"  # was ready, alive, but the probe no longer answers
    HUNG = "hung"  # the probe answers, but the engine's own statistics say it stopped generating
    DEAD = "dead"  # the process group is gone (exit code, or killed)
    STALE = "stale"  # the recorded pgid now belongs to an unrelated process
    NOT_LAUNCHED = "not launched"


@dataclass(frozen=True)
class AttemptLog:
    """The current attempt's log as read: its lines in file order, each run of them with the number
    of its first line (one run for a log read whole, the bounded reader's windows for a big one)."""

    windows: tuple[LogLines, ...] = ()
    missing: bool = False  # there is no log file
    skipped: str | None = None  # what a bounded read of a big log left out
    detected: EngineProfile | None = None  # the engine the bounded read found, when the record's is unknown


@dataclass(frozen=True)
class Snapshot:
    """What one look at a recorded server found. A fact not asked (the decision did not need it) is None."""

    name: str
    pgid: int
    owned: bool  # the recorded group lives and is still the one launched
    alive: bool | None = None  # not owned: whether the group lives (then it is another process's)
    exit_code: int | None = None  # dead: what the detach wrapper recorded (None: killed with it)
    probe: ProbeResult | None = None  # owned: the readiness probe's answer
    served_capacity: Capacity | None = None  # probe OK: what the server's info endpoint says it holds
    stall: str | None = None  # probe OK: the engine's statistics say it stopped generating (serving_stall)
    ended: str | None = None  # dead, on a scheduler's host: how the job ended
    queued: str | None = None  # probe not OK, on a scheduler's host: the job still waits to run
    log: AttemptLog | None = None  # the current attempt's log (dead; or alive and not answering)
    engine: EngineProfile | None = None  # the record's engine (None: unknown, found from the log)
    log_path: str | None = None
    recorded_capacity: Capacity = field(default_factory=Capacity)  # the record's last verdict's
    last_state: str | None = None  # the record's last verdict's state
    last_category: str | None = None  # ... and category
    after_failure: str | None = None  # the record's: "stopped" when `up` stopped it after it failed


@dataclass(frozen=True)
class Decision:
    state: Liveness
    detail: str | None = None
    category: str | None = None
    exit_code: int | None = None
    capacity: Capacity = field(default_factory=Capacity)


def decide(snap: Snapshot) -> Decision:
    """The server's state, detail and category from one look at it."""
    if not snap.owned:
        if snap.alive:
            return Decision(
                Liveness.STALE,
                f"pgid {snap.pgid} now belongs to another process; run `servefleet down {snap.name}`",
                capacity=snap.recorded_capacity,
            )
        return _dead(snap)
    probe = snap.probe
    if probe is not None and probe.outcome is ProbeOutcome.OK:
        capacity = (
            snap.served_capacity.merge(snap.recorded_capacity)
            if snap.served_capacity is not None
            else snap.recorded_capacity
        )
        if snap.stall:
            return Decision(Liveness.HUNG, f"{snap.stall}; `servefleet restart {snap.name}`", capacity=capacity)
        return Decision(Liveness.READY, capacity=capacity)
    said = probe.detail if probe is not None and probe.outcome is ProbeOutcome.WRONG_IDENTITY else None
    if snap.last_state == State.READY.value:
        return Decision(
            Liveness.UNRESPONSIVE, said or "was ready; the probe no longer answers", capacity=snap.recorded_capacity
        )
    if snap.queued:
        return Decision(Liveness.LOADING, snap.queued, capacity=snap.recorded_capacity)
    verdict = replay(snap)
    capacity = verdict.capacity.merge(snap.recorded_capacity)
    if verdict.state is State.FAILED:
        category = verdict.category.value if verdict.category else None
        return Decision(
            Liveness.FAILED,
            f"{category or 'failed'}{_evidence(verdict)} (process still alive)",
            category,
            capacity=capacity,
        )
    return Decision(Liveness.LOADING, said or verdict.progress or verdict.message, capacity=capacity)


def _dead(snap: Snapshot) -> Decision:
    verdict = replay(snap)  # an exit is always a failure: the log's cause, else how the process ended
    category = verdict.category.value if verdict.category else None
    how = (
        "killed (no exit code recorded: the whole group got SIGKILL)"
        if snap.exit_code is None
        else f"exit code {snap.exit_code}"
    )
    if snap.after_failure == "stopped" and verdict.evidence is None:
        # `up` stopped it: the exit is that stop, the record's verdict says why it failed
        category = snap.last_category or category
        detail = f"stopped by `up` after it failed ({category or 'other'}); {how}"
    else:
        detail = how + (f", {category}" if category else "") + _evidence(verdict)
        if snap.after_failure == "stopped":
            detail = f"stopped by `up` after it failed ({category or 'other'}); {detail}"
    if snap.ended:
        detail += f"; {snap.ended}"
    return Decision(Liveness.DEAD, detail, category, snap.exit_code, snap.recorded_capacity)


def replay(snap: Snapshot) -> Verdict:
    """The readiness machine's verdict of the snapshot's facts, fed at one instant (the module's
    docstring says why ``SETTLED_S``): the log's lines, the probe's answer, and the exit when the
    group is gone (no exit code recorded: it was killed with the group)."""
    log = snap.log if snap.log is not None else AttemptLog()
    first = log.windows[0].first_line_no if log.windows else None
    machine = ReadinessMachine(
        snap.engine if snap.engine is not None else log.detected,
        now=0.0,
        timeout_s=math.inf,
        stall_s=math.inf,
        smoke=False,
        log_path=snap.log_path,
        pgid=snap.pgid,
        first_line_no=first if first is not None else 1,
    )
    machine.skipped = log.skipped
    if log.missing:
        machine.feed(LogMissing(), 0.0)
    for lines in log.windows:
        machine.feed(lines, 0.0)
    if snap.probe is not None:
        machine.feed(snap.probe, 0.0)
    if not snap.owned and not snap.alive:
        machine.feed(ProcessExit(snap.exit_code, killed=snap.exit_code is None), 0.0)
    machine.feed(Tick(), SETTLED_S)
    return machine.verdict(SETTLED_S)


def _evidence(verdict: Verdict) -> str:
    return f": {verdict.evidence.text.strip()[:EVIDENCE_CHARS]}" if verdict.evidence is not None else ""
