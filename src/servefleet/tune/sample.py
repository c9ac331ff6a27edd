"""The job's own prompts, sampled: N records drawn (seeded, uniformly, one pass) from the job's
input with their real lengths and ``max_tokens``, written as the bench dataset of every candidate."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servefleet.errors import ConfigError

__all__ = ["JobSample", "sample_job"]


@dataclass(frozen=True)
class JobSample:
    path: Path  # the sample, JSONL
    records: int  # valid records in the whole input (the job's size)
    sampled: int
    api: str  # what generate will use for these records: chat for messages, completions for prompt
    options: dict[
        str, Any
    ]  # request fields every sampled record gives alike (ignore_eos, temperature, ...): generate sends them
    notes: tuple[str, ...] = ()


def _records(path: Path) -> Iterator[dict[str, Any]]:
    if path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        # from an Arrow buffer, in this thread: Arrow's pools can abort the process at exit (plan/check.py)
        yield from pq.ParquetFile(pa.BufferReader(path.read_bytes())).read(use_threads=False).to_pylist()
        return
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue  # generate's pre-pass rejects it too: not part of the job
            if isinstance(row, dict) and (isinstance(row.get("prompt"), str) or isinstance(row.get("messages"), list)):
                yield row


def sample_job(path: Path, n: int, dest: Path, *, max_tokens: int | None, seed: int = 0) -> JobSample:
    if not path.is_file():
        raise ConfigError(f"--input {path}: no such file")
    rng = random.Random(seed)
    kept: list[dict[str, Any]] = []
    total = 0
    for row in _records(path):  # reservoir sampling: every record equally likely, one pass
        total += 1
        if len(kept) < n:
            kept.append(row)
        else:
            j = rng.randrange(total)
            if j < n:
                kept[j] = row
    if not kept:
        raise ConfigError(f"--input {path}: no record with a 'prompt' or 'messages'")
    options, notes = _common_fields(kept)
    out: list[dict[str, Any]] = []
    for row in kept:
        tokens = row.get("max_tokens") or max_tokens
        if not tokens:
            raise ConfigError(
                f"--input {path}: a record without max_tokens and no --max-tokens; give --max-tokens "
                "(the job's default output limit, as for generate)"
            )
        keep: dict[str, Any] = {k: row[k] for k in ("prompt", "messages") if k in row and row[k] is not None}
        out.append({**keep, "max_tokens": int(tokens)})
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text("".join(json.dumps(r) + "\n" for r in out))
    api = "chat" if any("messages" in r for r in out) else "completions"
    return JobSample(path=dest, records=total, sampled=len(out), api=api, options=options, notes=notes)


_NOT_OPTIONS = ("id", "prompt", "messages", "max_tokens", "model", "stream")


def _common_fields(rows: list[dict[str, Any]]) -> tuple[dict[str, Any], tuple[str, ...]]:
    """The request fields the records carry (generate sends each record's own): those alike in every
    sampled record go into each bench request; those that vary cannot, and a note says so."""
    keys = {k for r in rows for k in r if k not in _NOT_OPTIONS}
    options: dict[str, Any] = {}
    varying = []
    for key in sorted(keys):
        values = {json.dumps(r.get(key), sort_keys=True) for r in rows}
        if len(values) == 1 and all(key in r for r in rows):
            options[key] = rows[0][key]
        else:
            varying.append(key)
    notes = (
        (f"record fields that vary between records are not sent by the tune's bench: {', '.join(varying)}",)
        if varying
        else ()
    )
    return options, notes
