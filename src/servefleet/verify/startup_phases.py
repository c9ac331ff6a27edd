"""Where start-up time goes: the time between the engine's progress marks (issue 25.7).

The classifier notes each line where the progress label changes ("loading weights", "compiling
(torch.compile)", "capturing CUDA graphs", ...; a label may come back: SGLang captures prefill, then
decode graphs) with two clocks: the engine's own timestamp on
the line (``EngineProfile.log_time``; a line without one, such as a progress bar, takes the last
timestamp before it) and servefleet's, when the waiter read the line. A phase lasts from its mark
to the next label's mark; the last one until ready. The engine's clock is used when every mark
has one and they span at least ``MIN_LOG_SPAN_S`` (its stamps are whole seconds); else
servefleet's when the lines were read as they were written (a live wait, not a catch-up read of
a log written before); else the engine's anyway (``diagnose`` of a finished log).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel

__all__ = ["Mark", "PhaseTime", "phase_times", "phase_totals", "MIN_LOG_SPAN_S"]

MIN_LOG_SPAN_S = 30.0  # whole-second stamps: at most ~3 % off over a start this long

Clock = Literal["log", "seen"]


@dataclass(frozen=True)
class Mark:
    label: str
    line_no: int
    log_s: float | None  # the engine's timestamp (EngineProfile.log_time's clock)
    seen_s: float | None  # seconds since the wait began when servefleet read the line (None: not live)


class PhaseTime(BaseModel):
    phase: str  # the progress label that starts it
    line_no: int  # the log line of that mark
    start_s: float  # since the first mark
    took_s: float | None  # until the next mark (the last phase: until ready; None when not ready)


def _span(values: list[float | None]) -> float | None:
    if any(v is None for v in values):
        return None
    return max(values) - min(values)  # type: ignore[type-var, operator]  # none is None (checked)


def _clock(points: list[Mark]) -> Clock | None:
    log_span, seen_span = _span([p.log_s for p in points]), _span([p.seen_s for p in points])
    if log_span is not None and log_span >= MIN_LOG_SPAN_S:
        return "log"
    if seen_span is not None and (log_span is None or seen_span >= log_span / 2):
        return "seen"  # read as it was written (not caught up with in one read)
    if log_span is not None:
        return "log"
    return None


def phase_totals(phases: list[PhaseTime]) -> list[tuple[str, float]]:
    """Seconds per label, in order of first appearance (a label that comes back adds up)."""
    totals: dict[str, float] = {}
    for p in phases:
        if p.took_s is not None:
            totals[p.phase] = totals.get(p.phase, 0.0) + p.took_s
    return list(totals.items())


def phase_times(marks: list[Mark], ready: Mark | None) -> tuple[list[PhaseTime], Clock | None]:
    """Each phase's start and duration, and the clock they are on (None: no usable clock)."""
    if not marks:
        return [], None
    points = marks + ([ready] if ready is not None else [])
    clock = _clock(points)
    if clock is None:
        return [], None
    at = [float((p.log_s if clock == "log" else p.seen_s) or 0.0) for p in points]
    phases = []
    for i, mark in enumerate(marks):
        took = max(0.0, at[i + 1] - at[i]) if i + 1 < len(points) else None
        phases.append(
            PhaseTime(
                phase=mark.label,
                line_no=mark.line_no,
                start_s=round(at[i] - at[0], 3),
                took_s=None if took is None else round(took, 3),
            )
        )
    return phases, clock
