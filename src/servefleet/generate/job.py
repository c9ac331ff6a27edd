"""The job manifest: what a destination folder is the output of.

``job.json`` at the root of the destination records the input's fingerprint (size, mtime, SHA-256),
the parameters that shape the output (model, sampling defaults, endpoint mode, format), the
pre-pass summary and every run. Running the same command again finds it and resumes; a changed input
or changed parameters are refused unless ``--force`` (then the ids already committed stay done and
the rest is generated with the new settings; every run records its own parameters, and the ids made with
other ones are counted at resume -- asked again with ``--reask-changed``).

Parameters that do not change a row -- servers, concurrency, attempts, shard size -- are not part of
the identity: a resumed job may use another fleet.
"""

from __future__ import annotations

import datetime as dt
import secrets
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["JobParams", "InputInfo", "RunRecord", "JobManifest", "new_run_id", "JOB_FILE", "MANIFEST_VERSION"]

JOB_FILE = "job.json"
MANIFEST_VERSION = 1


def utcnow() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def new_run_id() -> str:
    """Sortable and unique: UTC time to the second plus 4 random hex digits."""
    return dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S") + "-" + secrets.token_hex(2)


class JobParams(BaseModel):
    """Everything that changes what a row contains."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0)
    mode: Literal["auto", "chat", "completions"] = "auto"
    token_ids: bool = False
    store_request: bool = False
    format: Literal["parquet", "jsonl"] = "parquet"
    samples: int | None = Field(default=None, ge=1)  # --samples K: one row per (id, sample)
    models: tuple[str, ...] | None = None  # --models a,b: one row per (id, model)
    logprobs: int | None = Field(default=None, ge=0, le=20)  # --logprobs K: token logprobs with K alternatives, stored
    prompt_logprobs: int | None = Field(
        default=None, ge=0, le=20
    )  # --prompt-logprobs K: the same of the prompt's tokens

    def differences(self, other: JobParams) -> list[str]:
        mine, theirs = self.model_dump(), other.model_dump()
        return [f"{k}: {theirs[k]!r} -> {mine[k]!r}" for k in mine if mine[k] != theirs[k]]


class InputInfo(BaseModel):
    """The input's fingerprint and what the pre-pass found in it."""

    model_config = ConfigDict(extra="forbid")

    path: str  # informational: the same content under another path is the same job
    kind: Literal["jsonl", "parquet"]
    size: int
    mtime_ns: int
    sha256: str
    lines: int
    valid: int
    rejected: int
    duplicates: int
    unbounded: int = (
        0  # valid records with no max_tokens (neither --max-tokens nor their own): answer length unlimited
    )
    models: dict[str, int] = Field(default_factory=dict)  # the records' own 'model' values and how many ask each


class RunRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")

    run_id: str
    started: str = Field(default_factory=utcnow)
    finished: str | None = None
    status: str = (
        "running"  # running | complete | incomplete | interrupted | stalled | killed (found unfinished by a later run)
    )
    input_sha256: str
    done_before: int = 0
    done: int = 0  # rows committed by this run
    failed: int = 0
    forced: bool = False
    params: JobParams | None = None  # what this run's rows were made with (the manifest's params are the last run's)
    provenance: dict[str, Any] | None = (
        None  # servefleet's version, per server engine, version, args, model, GPUs (provenance.py)
    )

    def made_with_other_params(self, params: JobParams) -> bool:
        return self.params is not None and self.params != params


class JobManifest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: int = MANIFEST_VERSION
    created: str = Field(default_factory=utcnow)
    input: InputInfo
    params: JobParams
    runs: list[RunRecord] = Field(default_factory=list)
    shards: int = 0  # as of the end of the last run (the ledger folder is the truth)
    rows: int = 0
    shard_bytes: int | None = None  # the shards' total size at the end of the last run (readers compare it: damage)

    def mark_killed(self) -> list[str]:
        """Runs recorded as running that never finished: the run about to start holds the destination, so
        they are dead (killed, or their machine went). Marks them ``killed``; returns their ids."""
        dead = [r for r in self.runs if r.status == "running" and r.finished is None]
        for run in dead:
            run.status = "killed"
        return [r.run_id for r in dead]

    def run_input(self, run_id: str) -> str | None:
        """The input SHA-256 a run worked from (shards are named after their run)."""
        for run in self.runs:
            if run.run_id == run_id:
                return run.input_sha256
        return None

    def mismatch(self, info: InputInfo, params: JobParams) -> list[str]:
        """Why this manifest is not the job asked for now (empty: same job)."""
        problems = []
        if info.sha256 != self.input.sha256:
            problems.append(f"input content changed (sha256 {self.input.sha256[:12]}... -> {info.sha256[:12]}...)")
        problems.extend(params.differences(self.params))
        return problems

    def to_bytes(self) -> bytes:
        return (self.model_dump_json(indent=2) + "\n").encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> JobManifest:
        return cls.model_validate_json(data)

    def summary(self) -> dict[str, Any]:
        return {"input": self.input.model_dump(), "params": self.params.model_dump(), "runs": len(self.runs)}
