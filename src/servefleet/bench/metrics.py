"""Per-request records -> the numbers of one point. Pure functions, no I/O.

Tokens are counted from the server's ``usage`` first. When a server reports no usage, the kept
text is counted with a token counter (the server's ``/tokenize`` or a local tokenizer) after the
point, and only failing that estimated from text size — and the point says which it was
(``token_sources``), never silently falling back to the requested length.

Inter-token latency is per token, not per chunk: an arrival that carries k tokens after a gap g
(speculative decoding emits several tokens per step) contributes k samples of g/k. Per-chunk
counts come from continuous usage when the server sends it (exact), else the request's token
total is shared among its chunks in proportion to their text size, at least one token each.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from servefleet.bench.client import RequestRecord
from servefleet.bench.result import Stat, SteadyWindow
from servefleet.bench.steady import steady_window

__all__ = ["stat", "output_tokens", "chunk_tokens", "itl_samples", "PointMetrics", "summarize", "BYTES_PER_TOKEN"]

# Rough size of one token of English text in bytes, only for the last-resort estimate.
BYTES_PER_TOKEN = 4.0


def stat(values: Sequence[float] | np.ndarray, scale: float = 1000.0) -> Stat:
    """mean/p50/p90/p99/min/max of ``values`` (seconds) in milliseconds (``scale``)."""
    arr = np.asarray(values, dtype=float)
    if arr.size == 0:
        return Stat()
    arr = arr * scale
    p50, p90, p99 = np.percentile(arr, [50, 90, 99])
    return Stat(
        mean=float(arr.mean()),
        p50=float(p50),
        p90=float(p90),
        p99=float(p99),
        min=float(arr.min()),
        max=float(arr.max()),
        n=int(arr.size),
    )


def output_tokens(rec: RequestRecord, counted: int | None = None) -> tuple[int, str]:
    """(tokens, source): usage, else a tokenizer count of the kept text, else a size estimate."""
    if rec.completion_tokens is not None:
        return rec.completion_tokens, "usage"
    if counted is not None:
        return counted, "tokenized"
    size = sum(rec.chunk_bytes) if rec.chunk_bytes else rec.text_bytes
    if rec.text is not None:
        size = len(rec.text.encode())
    return (max(1, round(size / BYTES_PER_TOKEN)) if size else 0), "estimated"


def chunk_tokens(rec: RequestRecord, total: int) -> list[int]:
    """Tokens carried by each streamed arrival of ``rec`` (sums to ``total``)."""
    n = len(rec.chunk_offsets)
    if n == 0:
        return []
    if rec.chunk_tokens is not None and len(rec.chunk_tokens) == n and sum(rec.chunk_tokens) == total:
        return list(rec.chunk_tokens)
    if total <= n:
        # Fewer tokens than chunks can only happen with odd servers; give the first ones one each.
        return [1] * total + [0] * (n - total)
    # Each chunk carries at least one token; the rest is shared by text size (largest remainder).
    weights = np.asarray(rec.chunk_bytes, dtype=float)
    if weights.sum() <= 0:
        weights = np.ones(n)
    spare = total - n
    share = weights / weights.sum() * spare
    base = np.floor(share).astype(int)
    left = spare - int(base.sum())
    if left:
        order = np.argsort(-(share - base), kind="stable")[:left]
        base[order] += 1
    return [int(x) + 1 for x in base]


def itl_samples(rec: RequestRecord, tokens: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """(per-token latency of each chunk after the first, tokens it carried) in seconds."""
    if len(rec.chunk_offsets) < 2:
        return np.empty(0), np.empty(0, dtype=int)
    offsets = np.asarray(rec.chunk_offsets, dtype=float)
    gaps = np.diff(offsets)
    counts = np.asarray(tokens[1:], dtype=int)
    keep = counts > 0
    return gaps[keep] / counts[keep], counts[keep]


@dataclass(frozen=True)
class PointMetrics:
    requests: int
    successful: int
    errors: int
    errors_by_kind: dict[str, int]
    error_examples: dict[str, str]
    duration_s: float
    requests_per_s: float
    input_tokens: int
    output_tokens: int
    output_tokens_per_s: float
    output_tokens_per_s_span: float
    total_tokens_per_s: float
    output_tokens_per_s_per_request: Stat
    ttft_ms: Stat
    tpot_ms: Stat
    itl_ms: Stat
    e2e_ms: Stat
    achieved_concurrency: float
    token_sources: dict[str, int]
    chunks_per_request: float | None
    tokens_per_chunk: float | None
    steady: SteadyWindow | None

    def fields(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def summarize(
    records: Sequence[RequestRecord],
    counted: Callable[[RequestRecord], int | None] | None = None,
    concurrency: int | None = None,
) -> PointMetrics:
    """Aggregate the measured (non-warm-up) records of one point.

    ``counted(rec)`` returns a tokenizer count of ``rec.text`` for servers without usage;
    ``concurrency`` (closed-loop users) marks where the ramp ends (see :mod:`.steady`).
    """
    measured = [r for r in records if not r.warmup]
    ok = [r for r in measured if r.ok]
    failed = [r for r in measured if not r.ok]
    kinds = Counter(r.error_kind or "unknown" for r in failed)
    examples: dict[str, str] = {}
    for r in failed:
        examples.setdefault(r.error_kind or "unknown", r.error or "")

    if measured:
        t0 = min(r.start for r in measured)
        t1 = max(r.end for r in measured)
        duration = max(t1 - t0, 1e-9)
        busy = sum(r.end - r.start for r in measured)
    else:
        duration, busy = 0.0, 0.0

    sources: Counter[str] = Counter()
    out_total = 0
    in_total = 0
    ttft, tpot, e2e, per_req_speed = [], [], [], []
    spans: list[tuple[float, float, int]] = []
    itl_vals: list[np.ndarray] = []
    itl_weights: list[np.ndarray] = []
    chunks = 0
    exact_chunks = 0
    for r in ok:
        tokens, source = output_tokens(r, counted(r) if counted and r.completion_tokens is None else None)
        sources[source] += 1
        out_total += tokens
        if r.prompt_tokens is not None:
            in_total += r.prompt_tokens
        elif r.input_tokens is not None:
            in_total += r.input_tokens
        latency = r.end - r.start
        e2e.append(latency)
        spans.append((r.start, r.end, tokens))
        if r.ttft is not None:
            ttft.append(r.ttft)
            if tokens > 1:
                tpot.append((latency - r.ttft) / (tokens - 1))
        if latency > 0 and tokens:
            per_req_speed.append(tokens / latency)
        if r.chunk_offsets:
            chunks += len(r.chunk_offsets)
            per_chunk = chunk_tokens(r, tokens)
            if r.chunk_tokens is not None and per_chunk == r.chunk_tokens:
                exact_chunks += 1
            vals, weights = itl_samples(r, per_chunk)
            if vals.size:
                itl_vals.append(vals)
                itl_weights.append(weights)
    if exact_chunks:
        sources["chunks_exact"] = exact_chunks
    itl = np.repeat(np.concatenate(itl_vals), np.concatenate(itl_weights)) if itl_vals else np.empty(0)
    streamed = [r for r in ok if r.chunk_offsets]
    span_rate = out_total / duration if duration else 0.0
    window = steady_window(spans, concurrency)
    # A window too short to be steady is noise more than signal: such a point keeps its span rate.
    rate = window.output_tokens_per_s if window is not None and window.steady else span_rate
    return PointMetrics(
        requests=len(measured),
        successful=len(ok),
        errors=len(failed),
        errors_by_kind=dict(sorted(kinds.items())),
        error_examples=examples,
        duration_s=duration,
        requests_per_s=len(ok) / duration if duration else 0.0,
        input_tokens=in_total,
        output_tokens=out_total,
        output_tokens_per_s=rate,
        output_tokens_per_s_span=span_rate,
        total_tokens_per_s=(out_total + in_total) / duration if duration else 0.0,
        output_tokens_per_s_per_request=stat(per_req_speed, scale=1.0),
        ttft_ms=stat(ttft),
        tpot_ms=stat(tpot),
        itl_ms=stat(itl),
        e2e_ms=stat(e2e),
        achieved_concurrency=busy / duration if duration else 0.0,
        token_sources=dict(sorted(sources.items())),
        chunks_per_request=(chunks / len(streamed)) if streamed else None,
        tokens_per_chunk=(sum(_tok(r, counted) for r in streamed) / chunks) if chunks else None,
        steady=window,
    )


def _tok(rec: RequestRecord, counted: Callable[[RequestRecord], int | None] | None) -> int:
    return output_tokens(rec, counted(rec) if counted and rec.completion_tokens is None else None)[0]
