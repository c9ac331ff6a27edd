"""What a tune returns: one row per candidate (measured, failed, stopped early or skipped), ranked."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

__all__ = ["Outcome", "Prediction", "CandidateRow", "TuneResult"]

Outcome = Literal["measured", "stopped_early", "failed", "skipped"]


@dataclass
class Prediction:
    gpus: int
    replicas: int
    makespan_s: float
    gpu_hours: float
    concurrency: int

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "makespan_s": _finite(self.makespan_s), "gpu_hours": _finite(self.gpu_hours)}


@dataclass
class CandidateRow:
    name: str
    outcome: Outcome
    args: list[str]
    reason: str | None = None  # why failed / stopped early / skipped
    category: str | None = None  # failed: the failure category
    evidence: str | None = None  # failed: the evidence line
    run: str | None = None  # the RUN.json written for it
    fleet: str | None = None  # its one-server fleet file
    time_to_ready_s: float | None = None
    kv_tokens: int | None = None
    max_running: int | None = None
    best_concurrency: int | None = None
    output_tps: float | None = None  # one replica, at the best measured point
    acceptance: float | None = None  # speculative: accepted / drafted tokens (engine metrics)
    accept_length: float | None = None  # speculative: tokens per verification step
    prefix_cache_hit_rate: float | None = None  # at the best point: share of the sample's prompt tokens cached
    concurrencies: list[int] = field(default_factory=list)  # what was measured, in order
    predictions: list[Prediction] = field(default_factory=list)  # one per --gpus count
    measured_s: float = 0.0  # seconds spent in measured points
    started_s: float | None = None  # its launch, seconds into the tune
    ended_s: float | None = None  # its stop
    notes: list[str] = field(default_factory=list)

    @property
    def first_makespan(self) -> float:
        return self.predictions[0].makespan_s if self.predictions else math.inf

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["predictions"] = [p.to_json() for p in self.predictions]
        return out


@dataclass
class TuneResult:
    rows: list[CandidateRow]  # ranked: measured (soonest first), then stopped early, failed, skipped
    prompts: int  # records in the job's input
    sample: int  # prompts of the sample measured on
    output_tokens_mean: float | None  # measured on the sample (the job's own output lengths)
    gpus: list[int]
    budget_s: float | None
    wall_s: float
    measured_s: float  # wall time spent inside measured points (the rest: launches, verification, stops)
    out_dir: str
    winner_fleet: str | None = None
    plot: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def winner(self) -> CandidateRow | None:
        best = self.rows[0] if self.rows else None
        return best if best is not None and best.outcome == "measured" and math.isfinite(best.first_makespan) else None

    @property
    def overhead_share(self) -> float:
        return (self.wall_s - self.measured_s) / self.wall_s if self.wall_s > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        winner = self.winner
        return {
            "winner": winner.name if winner else None,
            "winner_fleet": self.winner_fleet,
            "job": {"prompts": self.prompts, "sample": self.sample, "output_tokens_mean": self.output_tokens_mean},
            "gpus": self.gpus,
            "budget_s": self.budget_s,
            "wall_s": self.wall_s,
            "measured_s": self.measured_s,
            "overhead_share": self.overhead_share,
            "out_dir": self.out_dir,
            "plot": self.plot,
            "ran": [r.name for r in self.rows if r.outcome in ("measured", "stopped_early", "failed")],
            "skipped": [r.name for r in self.rows if r.outcome == "skipped"],
            "candidates": [r.to_json() for r in self.rows],
            "notes": self.notes,
        }


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None
