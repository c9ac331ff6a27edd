"""The pre-pass: one streaming read of the input before anything is sent.

It counts the records (for progress and ETA), fingerprints the file (SHA-256 of its bytes, so a
changed input is noticed on resume), writes every invalid record to the rejects file with its line
number, and finds duplicate ids -- all in memory that does not hold the ids themselves.

Duplicates with bounded memory: each valid record leaves an 8-byte hash of its id in a compact
array (8 MB per million records, against ~100 MB for a Python set of the ids). Sorting the hashes
finds the few groups that share a value; a second, cheap pass re-reads only the records of those
groups and compares their ids exactly, so a hash collision between two different ids is never taken
for a duplicate. The first occurrence of an id wins; later ones are rejected.

The hashes use Python's ``hash(str)`` (64-bit SipHash, salted per process): they are never stored,
only compared within this process -- against the ids of committed shards when resuming.

Each valid record also gets a content digest (:func:`record_digest`, 8 bytes of BLAKE2b), which *is*
stored: ledger entries keep their rows' digests, so a resume on a changed input (``--force``) finds the
committed ids whose prompt or fields changed since.
"""

from __future__ import annotations

import hashlib
import json
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from servefleet.generate.inputs import PromptRecord, Reject, RequestDefaults, input_stat, iter_raw, parse_raw

__all__ = ["Prepass", "run_prepass", "id_hash", "record_digest", "max_tokens_warning", "SEND", "SKIP", "CHECK"]

MAX_MODELS = 256  # distinct record models counted (a routed job is refused on the first unserved one anyway)

# Plan codes per line (see Prepass.plan and ledger.DoneSet.apply).
SEND = 0  # send it
SKIP = 1  # blank, rejected, or already done
CHECK = 2  # done-ness must be decided by comparing the id exactly (shared hash)


def id_hash(rid: str) -> int:
    """The 8-byte stand-in for an id (a module function so tests can force collisions)."""
    return hash(rid)


def record_digest(raw: bytes | dict[str, Any]) -> int:
    """8 bytes of BLAKE2b over a record as written: the stripped JSONL line, or a Parquet row's canonical
    JSON. The line's own bytes, not a canonical re-encoding: ~1 us a line against ~9 us for sorted-key
    JSON (measured), and the pre-pass reads millions; a record merely re-formatted (key order, spaces)
    therefore counts as changed, which errs toward asking again, and only under --reask-changed."""
    data = (
        raw.strip()
        if isinstance(raw, bytes)
        else json.dumps(raw, sort_keys=True, separators=(",", ":"), default=str).encode()
    )
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little", signed=True)


@dataclass
class Prepass:
    """What the pre-pass learnt. Arrays are indexed by ``line - 1``."""

    sha256: str
    size: int
    mtime_ns: int
    lines: int
    valid: int
    rejected: int
    duplicates: int
    hashes: np.ndarray  # int64 hash of the id, 0 where the line is not valid
    valid_mask: np.ndarray  # bool
    collisions: frozenset[int] = field(default_factory=frozenset)  # hashes shared by distinct valid ids
    unbounded: int = 0  # valid records whose body sets no max_tokens (nor max_completion_tokens)
    digests: np.ndarray = field(
        default_factory=lambda: np.zeros(0, dtype=np.int64)
    )  # record_digest, 0 where not valid
    models: dict[str, int] = field(
        default_factory=dict
    )  # the records' own 'model' values and their counts (routing.py)

    def plan(self) -> bytearray:
        """SEND for every valid line, SKIP for the rest (done-ness is added by the ledger)."""
        return bytearray(np.where(self.valid_mask, SEND, SKIP).astype(np.uint8).tobytes())


def run_prepass(path: str, defaults: RequestDefaults, on_reject: Callable[[Reject], None]) -> Prepass:
    """Read ``path`` once (twice for the records of hash groups), report rejects, return the summary."""
    size, mtime_ns = input_stat(path)
    digest = hashlib.sha256()
    hashes = array("q")
    digests = array("q")
    valid = bytearray()
    rejected = 0
    unbounded = 0
    models: dict[str, int] = {}
    for line, raw in iter_raw(path, on_bytes=digest.update):
        if line > len(hashes) + 1:  # (never for JSONL: every line is yielded)
            gap = line - 1 - len(hashes)
            hashes.extend([0] * gap)
            digests.extend([0] * gap)
            valid.extend(b"\x00" * gap)
        rec = parse_raw(line, raw, defaults)
        if isinstance(rec, PromptRecord):
            hashes.append(id_hash(rec.id))
            digests.append(record_digest(raw))
            valid.append(1)
            unbounded += "max_tokens" not in rec.body and "max_completion_tokens" not in rec.body
            model = rec.body.get("model")
            if isinstance(model, str) and (model in models or len(models) < MAX_MODELS):
                models[model] = models.get(model, 0) + 1
        else:
            hashes.append(0)
            digests.append(0)
            valid.append(0)
            if rec is not None:
                rejected += 1
                on_reject(rec)
    hash_arr = np.frombuffer(hashes, dtype=np.int64).copy() if len(hashes) else np.zeros(0, dtype=np.int64)
    del hashes
    valid_mask = np.frombuffer(bytes(valid), dtype=np.uint8).astype(bool) if valid else np.zeros(0, dtype=bool)
    del valid
    shared = _shared_hashes(hash_arr, valid_mask)
    duplicates = 0
    collisions: frozenset[int] = frozenset()
    if shared.size:
        duplicates, collisions = _resolve_shared(path, defaults, hash_arr, valid_mask, shared, on_reject)
    return Prepass(
        sha256=digest.hexdigest(),
        size=size,
        mtime_ns=mtime_ns,
        lines=len(hash_arr),
        valid=int(valid_mask.sum()),
        rejected=rejected + duplicates,
        duplicates=duplicates,
        hashes=hash_arr,
        valid_mask=valid_mask,
        collisions=collisions,
        unbounded=unbounded,
        models=models,
        digests=np.frombuffer(digests, dtype=np.int64).copy() if len(digests) else np.zeros(0, dtype=np.int64),
    )


def _shared_hashes(hashes: np.ndarray, valid_mask: np.ndarray) -> np.ndarray:
    """Hash values that more than one valid line has (sorted)."""
    vh = np.sort(hashes[valid_mask])
    if vh.size < 2:
        return np.zeros(0, dtype=np.int64)
    return np.unique(vh[1:][vh[1:] == vh[:-1]])


def _resolve_shared(
    path: str,
    defaults: RequestDefaults,
    hashes: np.ndarray,
    valid_mask: np.ndarray,
    shared: np.ndarray,
    on_reject: Callable[[Reject], None],
) -> tuple[int, frozenset[int]]:
    """Re-read the lines of shared-hash groups; reject true duplicates (first occurrence wins).
    Returns (duplicates, hashes that belong to more than one distinct id)."""
    candidate = np.isin(hashes, shared) & valid_mask
    lines = set((np.flatnonzero(candidate) + 1).tolist())
    seen: dict[int, dict[str, int]] = {}
    duplicates = 0
    for line, raw in iter_raw(path):
        if line not in lines:
            continue
        rec = parse_raw(line, raw, defaults)
        assert isinstance(rec, PromptRecord), "input changed during the pre-pass"
        h = hashes[line - 1].item()
        first = seen.setdefault(h, {})
        if rec.id in first:
            duplicates += 1
            valid_mask[line - 1] = False
            hashes[line - 1] = 0
            on_reject(Reject(line, f"duplicate id (first seen on line {first[rec.id]})", rec.id))
        else:
            first[rec.id] = line
    return duplicates, frozenset(h for h, ids in seen.items() if len(ids) > 1)


def max_tokens_warning(unbounded: int, valid: int) -> str | None:
    """A warning when records carry no max_tokens: each answer may then run to the model's context,
    and on a large job a few runaway answers cost GPU days."""
    if unbounded == 0:
        return None
    return (
        f"{unbounded:,} of {valid:,} records set no max_tokens (and no --max-tokens was given): each answer may run "
        "to the model's context length; give --max-tokens N (or max_tokens per record) to bound them"
    )
