"""``generate --samples K``: K answers per record, one row per (id, sample), exactly once.

Two ways to ask (``--sample-mode``):

* ``n`` -- one request with ``n = K``: the prompt's prefill is computed once and shared by the K samples;
* ``requests`` -- K requests of ``n = 1``: spread over the servers (and the only way with an engine that
  refuses ``n > 1``, e.g. llama.cpp's server).

``auto`` (the default) picks ``n`` -- shared prefill is the cheaper way whenever the fleet is busy -- unless
the job has fewer records than the fleet has servers (K requests then keep every server busy).

Seeds: sample ``k`` of an id is asked with ``seed = base + k``, ``base`` the record's own ``seed`` or a hash of
its id. A request of ``n = K`` carries ``seed = base``: vLLM gives its child ``i`` the seed ``seed + i`` (its
parallel sampling), so the two modes ask each sample with the same seed and an engine that honours seeds
gives the same rows either way.

Exactly once: the K rows of an id are committed together (:class:`Groups` holds them until the last one is
answered and hands them to the committer as one unit, in one shard), so a committed shard answers whole ids
and the ledger keeps marking done *ids* (and input lines): a job without ``--samples`` and an old destination
resume as before. A kill loses at most the samples of ids not yet whole; the resumed run asks those again
with the same seeds. An id one of whose requests failed for good gets no rows (failures.jsonl names the sample).
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Literal, Protocol

from servefleet.generate.inputs import PromptRecord

if TYPE_CHECKING:
    from servefleet.generate.dispatch import Ticket
    from servefleet.generate.shards import OutputRow
    from servefleet.http import RequestFailure

__all__ = ["SampleMode", "base_seed", "expand", "expanded", "choose_mode", "Groups"]

SampleMode = Literal["auto", "n", "requests"]
_SEED_SPACE = 1 << 30  # seeds stay well inside a signed 32-bit integer after + k


def base_seed(rid: str, own: object = None) -> int:
    """The record's own integer seed, else a stable hash of its id (the same on every run and machine)."""
    if isinstance(own, int) and not isinstance(own, bool):
        return own
    return int.from_bytes(hashlib.blake2b(rid.encode(), digest_size=4).digest(), "little") % _SEED_SPACE


def expand(rec: PromptRecord, samples: int, mode: Literal["n", "requests"]) -> list[PromptRecord]:
    """The requests that ask the ``samples`` answers of ``rec``."""
    base = base_seed(rec.id, rec.body.get("seed"))
    if mode == "n":
        return [replace(rec, body={**rec.body, "n": samples, "seed": base}, sample=0, choices=samples)]
    return [replace(rec, body={**rec.body, "seed": base + k}, sample=k) for k in range(samples)]


async def expanded(
    feed: AsyncIterator[PromptRecord],
    samples: int | None,
    mode: Literal["n", "requests"],
    models: tuple[str, ...] | None = None,
) -> AsyncIterator[PromptRecord]:
    """Each record's requests: one per model of ``models`` (--models), each asking ``samples`` answers."""
    async for rec in feed:
        for m in models or (None,):
            each = rec if m is None else replace(rec, body={**rec.body, "model": m})
            for one in expand(each, samples, mode) if samples is not None else (each,):
                yield one


def choose_mode(mode: SampleMode, *, records: int, servers: int) -> Literal["n", "requests"]:
    if mode != "auto":
        return mode
    return "requests" if records < servers else "n"


class GroupSink(Protocol):
    """The committer's side Groups needs: rows added as one unit."""

    def add_many(self, rows: list[OutputRow]) -> None: ...

    @property
    def backlogged(self) -> bool: ...

    async def wait_room(self) -> None: ...


class Groups:
    """Between the dispatcher and the committer: an id's rows are held until all ``per_id`` are answered, then
    added as one unit (one shard holds them all). A request of the id failing for good drops its rows."""

    def __init__(self, out: GroupSink, on_failure: Callable[[Ticket, RequestFailure], None], per_id: int) -> None:
        self.out = out
        self._on_failure = on_failure
        self.per_id = per_id
        self.held: dict[int, list[OutputRow]] = {}  # by input line
        self.failed: set[int] = set()

    def add(self, row: OutputRow) -> None:
        if row.line in self.failed:
            return
        rows = self.held.setdefault(row.line, [])
        rows.append(row)
        if len(rows) == self.per_id:
            del self.held[row.line]
            rows.sort(key=_sample_key)
            self.out.add_many(rows)

    @property
    def backlogged(self) -> bool:
        return self.out.backlogged

    async def wait_room(self) -> None:
        await self.out.wait_room()

    def on_failure(self, ticket: Ticket, failure: RequestFailure) -> None:
        line = ticket.record.line
        self.failed.add(line)
        self.held.pop(line, None)
        self._on_failure(ticket, failure)


def _sample_key(row: OutputRow) -> tuple[str, int]:
    return (row.model or "", row.sample or 0)
