"""The result of verifying a server: what state it is in and, when it failed, why."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from servefleet.capacity import Capacity
from servefleet.catalog import Category, State
from servefleet.verify.startup_phases import PhaseTime

__all__ = ["Evidence", "Verdict"]


class Evidence(BaseModel):
    line_no: int  # 1-based line number in the log
    text: str  # the normalised line (ANSI codes stripped)


class Verdict(BaseModel):
    state: State
    category: Category | None = None
    engine: str | None = None
    evidence: Evidence | None = None
    hint: str | None = None
    excerpt: list[str] = Field(default_factory=list)  # a few lines around the evidence
    excerpt_start: int | None = None  # line number of the first excerpt line
    elapsed_s: float | None = None
    exit_code: int | None = None
    progress: str | None = None  # the last progress label seen ("loading weights", ...)
    phase: str | None = None  # gpu_oom: the start-up phase it happened in ("while profiling memory", ...)
    message: str | None = None  # plain words for the live status ("log file does not exist", ...)
    capacity: Capacity = Field(default_factory=Capacity)
    last_line: str | None = None  # the newest log line (live status only; not in to_json)
    skipped: str | None = None  # what a bounded read of a big log left out ("read 2.1 MB of 1.0 GB: ...")
    startup_phases: list[PhaseTime] = Field(default_factory=list)  # where start-up time went (startup_phases.py)
    startup_clock: str | None = None  # their clock: "log" (the engine's timestamps) or "seen" (servefleet's)

    def to_json(self) -> dict[str, Any]:
        """The stable `diagnose --json` / `wait --json` shape."""
        return {
            "state": self.state.value,
            "category": self.category.value if self.category else None,
            "engine": self.engine,
            "evidence": self.evidence.model_dump() if self.evidence else None,
            "hint": self.hint,
            "excerpt": self.excerpt,
            "excerpt_start": self.excerpt_start,
            "elapsed_s": self.elapsed_s,
            "exit_code": self.exit_code,
            "progress": self.progress,
            "phase": self.phase,
            "message": self.message,
            "capacity": self.capacity.model_dump(exclude_defaults=True),
            "skipped": self.skipped,
            "startup_phases": [p.model_dump() for p in self.startup_phases],
            "startup_clock": self.startup_clock,
        }
