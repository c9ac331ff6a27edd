"""Shards: the rows of finished requests, gathered in memory and written as one file.

A :class:`ShardBuffer` holds the rows (slotted objects, no dict per row) until it is full by
rows, by bytes or by age; the columns are built only when the shard is written, in the committer's
thread, not once per answer on the event loop -- the age bound caps the work a crash can lose when generation is slow.
:func:`write_shard` then encodes it as Parquet (zstd) or JSONL into a local staging file, which the
ledger commits. Every row carries its id and input line, so a shard proves by itself what it answers.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, Literal

import pyarrow as pa
import pyarrow.parquet as pq

__all__ = ["OutputRow", "ShardBuffer", "ShardLimits", "write_shard", "read_shard_ids", "shard_schema", "EXTENSIONS"]

Format = Literal["parquet", "jsonl"]
EXTENSIONS: dict[str, str] = {"parquet": ".parquet", "jsonl": ".jsonl"}


@dataclass(slots=True)
class OutputRow:
    """One answered request."""

    id: str
    line: int
    text: str
    finish_reason: str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    model: str | None
    server: str
    attempts: int
    latency_s: float
    reasoning: str | None = None
    token_ids: list[int] | None = None
    request: str | None = None  # the request body as JSON, with --store-request
    sample: int | None = None  # --samples: which of the id's K samples (0..K-1)
    logprobs: list[float] | None = None  # --logprobs (logprobs.py): the chosen tokens' logprobs
    logprob_token_ids: list[int] | None = None
    top_logprobs: list[list[float]] | None = None  # K alternatives per position
    top_token_ids: list[list[int]] | None = None
    prompt_logprobs: list[float] | None = None  # --prompt-logprobs (prompt_logprobs.py): the prompt tokens' logprobs
    prompt_logprob_token_ids: list[int] | None = None
    prompt_top_logprobs: list[list[float]] | None = None
    prompt_top_token_ids: list[list[int]] | None = None

    def approx_bytes(self) -> int:
        n = 96 + len(self.id) + len(self.text) + len(self.reasoning or "") + len(self.request or "")
        if self.logprobs is not None:
            n += 8 * len(self.logprobs) * (1 + len(self.top_logprobs[0]) if self.top_logprobs else 1)
        if self.prompt_logprobs is not None:
            n += (
                8
                * len(self.prompt_logprobs)
                * (1 + len(self.prompt_top_logprobs[0]) if self.prompt_top_logprobs else 1)
            )
        return n + 4 * len(self.token_ids or ())


def shard_schema(
    token_ids: bool,
    store_request: bool,
    samples: bool = False,
    logprobs_k: int | None = None,
    prompt_logprobs_k: int | None = None,
) -> pa.Schema:
    fields = [
        pa.field("id", pa.string(), nullable=False),
        pa.field("line", pa.int64(), nullable=False),
        pa.field("text", pa.string()),
        pa.field("reasoning", pa.string()),
        pa.field("finish_reason", pa.string()),
        pa.field("prompt_tokens", pa.int64()),
        pa.field("completion_tokens", pa.int64()),
        pa.field("model", pa.string()),
        pa.field("server", pa.string()),
        pa.field("attempts", pa.int32()),
        pa.field("latency_s", pa.float64()),
    ]
    if token_ids:
        fields.append(pa.field("token_ids", pa.list_(pa.int32())))
    if store_request:
        fields.append(pa.field("request", pa.string()))
    if samples:
        fields.append(pa.field("sample", pa.int32()))
    if logprobs_k is not None:
        fields += [
            pa.field("logprobs", pa.list_(pa.float32())),
            pa.field("logprob_token_ids", pa.list_(pa.int32())),
            pa.field("top_logprobs", pa.list_(pa.list_(pa.float32(), logprobs_k))),
            pa.field("top_token_ids", pa.list_(pa.list_(pa.int32(), logprobs_k))),
        ]
    if prompt_logprobs_k is not None:
        fields += [
            pa.field("prompt_logprobs", pa.list_(pa.float32())),
            pa.field("prompt_logprob_token_ids", pa.list_(pa.int32())),
            pa.field("prompt_top_logprobs", pa.list_(pa.list_(pa.float32(), prompt_logprobs_k))),
            pa.field("prompt_top_token_ids", pa.list_(pa.list_(pa.int32(), prompt_logprobs_k))),
        ]
    return pa.schema(fields)


@dataclass(frozen=True)
class ShardLimits:
    rows: int = 1000
    bytes: int = 256 << 20
    seconds: float = 60.0


class ShardBuffer:
    """Rows waiting to become a shard."""

    def __init__(self, schema: pa.Schema, limits: ShardLimits) -> None:
        self.schema = schema
        self.limits = limits
        self.names = schema.names
        self.rows: list[OutputRow] = []
        self.bytes = 0
        self.started: float | None = None
        self.completion_tokens = 0

    def __len__(self) -> int:
        return len(self.rows)

    def add(self, row: OutputRow) -> None:
        if self.started is None:
            self.started = time.monotonic()
        self.rows.append(row)
        self.bytes += row.approx_bytes()
        self.completion_tokens += row.completion_tokens or 0

    def full(self, now: float | None = None) -> bool:
        if not self.rows:
            return False
        if len(self.rows) >= self.limits.rows or self.bytes >= self.limits.bytes:
            return True
        now = time.monotonic() if now is None else now
        return self.started is not None and now - self.started >= self.limits.seconds

    def take(self) -> ShardBuffer:
        """Hand the rows over (this buffer starts empty again)."""
        full = ShardBuffer(self.schema, self.limits)
        full.rows, full.bytes, full.started, full.completion_tokens = (
            self.rows,
            self.bytes,
            self.started,
            self.completion_tokens,
        )
        self.rows = []
        self.bytes, self.started, self.completion_tokens = 0, None, 0
        return full

    def column(self, name: str) -> list[Any]:
        return list(map(attrgetter(name), self.rows))

    @property
    def columns(self) -> dict[str, list[Any]]:
        return {n: self.column(n) for n in self.names}

    def ids(self) -> list[str]:
        return self.column("id")

    def lines(self) -> list[int]:
        return self.column("line")


def write_shard(buffer: ShardBuffer, path: str, fmt: Format, metadata: dict[str, str] | None = None) -> None:
    """Encode ``buffer`` into ``path`` (a staging file); the caller commits it."""
    if fmt == "parquet":
        schema = buffer.schema.with_metadata({f"servefleet.{k}": v for k, v in (metadata or {}).items()})
        table = pa.Table.from_pydict(buffer.columns, schema=schema)
        pq.write_table(table, path, compression="zstd")
        return
    names = buffer.names
    columns = buffer.columns
    cols = [columns[n] for n in names]
    with open(path, "w", encoding="utf-8") as f:
        for values in zip(*cols, strict=True):
            f.write(json.dumps(dict(zip(names, values, strict=True)), ensure_ascii=False))
            f.write("\n")


def read_shard_ids(data: bytes, fmt: Format) -> tuple[list[str], list[int]]:
    """The ids and input lines a committed shard answers (to rebuild a missing ledger entry)."""
    if fmt == "parquet":
        # from an Arrow buffer, in this thread: Arrow's pools can abort the process at exit (plan/check.py)
        table = pq.ParquetFile(pa.BufferReader(data)).read(columns=["id", "line"], use_threads=False)
        return unique_pairs(table.column("id").to_pylist(), table.column("line").to_pylist())
    ids, lines = [], []
    for raw in data.splitlines():
        if raw.strip():
            obj = json.loads(raw)
            ids.append(obj["id"])
            lines.append(obj["line"])
    return unique_pairs(ids, lines)


def unique_pairs(ids: list[str], lines: list[int]) -> tuple[list[str], list[int]]:
    """Each (id, line) once, in order: a shard holds several rows per id with --samples or --models, and
    the ledger lists the ids it answers (an id's rows are always committed together, in one shard)."""
    if len(set(lines)) == len(lines):
        return ids, lines
    pairs = list(dict.fromkeys(zip(ids, lines, strict=True)))
    return [p[0] for p in pairs], [p[1] for p in pairs]
