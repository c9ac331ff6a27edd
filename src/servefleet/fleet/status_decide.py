"""``status``'s decision, pure: one look at a server (a ``Snapshot`` of facts) in, its state out.

status.py gathers the facts with one question per fact, asked only when the decision needs it (a
dead server is not probed, a serving one's log is read only for its statistics); all it means is decided here.
The log's own word (failed with a category and evidence, or loading with progress) is the verdict
of verify's log decider (``verify.diagnose.verdict_of``, the one ``servefleet diagnose`` gives); here
it is combined with the process group, the exit code, the probe and the record.

Not ``verify.machine.ReadinessMachine``: that decides a start attempt as events arrive over time
(grace periods for a cause still being flushed; an exit is always a failure with a category), while
a look reads a log once and keeps diagnose's words (an exit with no fatal line is "exit code 1",
no category; a fatal line that a later ready line follows is no failure).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from servefleet.capacity import Capacity
from servefleet.catalog import State
from servefleet.verify.events import ProbeOutcome, ProbeResult
from servefleet.verify.verdict import Verdict

__all__ = ["Liveness", "Snapshot", "Decision", "decide"]

EVIDENCE_CHARS = 120  # of the evidence line shown in the detail


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
    log: Verdict | None = None  # the current attempt's log, diagnosed (dead; or alive and not answering)
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
    verdict = snap.log if snap.log is not None else Verdict(state=State.LOADING)
    capacity = verdict.capacity.merge(snap.recorded_capacity)
    if verdict.state == State.FAILED:
        category = verdict.category.value if verdict.category else None
        return Decision(
            Liveness.FAILED,
            f"{category or 'failed'}{_evidence(verdict)} (process still alive)",
            category,
            capacity=capacity,
        )
    return Decision(Liveness.LOADING, said or verdict.progress or verdict.message, capacity=capacity)


def _dead(snap: Snapshot) -> Decision:
    verdict = snap.log if snap.log is not None else Verdict(state=State.LOADING)
    category = verdict.category.value if verdict.category else None
    if snap.exit_code is None:
        detail = "killed (no exit code recorded: the whole group got SIGKILL)"
        category = category or "killed"
    else:
        detail = f"exit code {snap.exit_code}"
    if category:
        detail += f", {category}"
    detail += _evidence(verdict)
    if snap.ended:
        detail += f"; {snap.ended}"
    if snap.after_failure == "stopped":  # `up` stopped it: its verdict says why, the log may not
        category = category or snap.last_category
        detail = f"stopped by `up` after it failed ({category or 'other'}); " + detail
    return Decision(Liveness.DEAD, detail, category, snap.exit_code, snap.recorded_capacity)


def _evidence(verdict: Verdict) -> str:
    return f": {verdict.evidence.text.strip()[:EVIDENCE_CHARS]}" if verdict.evidence is not None else ""
