"""Parquet read back in the test process without Arrow's thread pools.

``pq.read_table`` (and a ParquetFile over a Python file object) start Arrow's CPU/IO pools, whose
threads still alive when the interpreter exits can abort it ("terminate called without an active
exception", apache/arrow#34314): a pytest run that passed can then end with SIGABRT. The bytes are
read here and decoded from an Arrow buffer in the calling thread, as servefleet's own readers do
(``generate.shards.read_shard_ids``, ``plan.check``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

__all__ = ["read_parquet"]


def read_parquet(source: Path | bytes, columns: Sequence[str] | None = None) -> pa.Table:
    """One Parquet file (its path or bytes), or every ``*.parquet`` of a folder in name order, as one table."""
    if isinstance(source, Path) and source.is_dir():
        tables = [read_parquet(p, columns) for p in sorted(source.glob("*.parquet"))]
        if not tables:
            raise FileNotFoundError(f"{source}: no .parquet files")
        return pa.concat_tables(tables)
    data = source.read_bytes() if isinstance(source, Path) else source
    return pq.ParquetFile(pa.BufferReader(data)).read(
        columns=list(columns) if columns is not None else None, use_threads=False
    )
