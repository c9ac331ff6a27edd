"""Aggregation: per-token ITL under multi-token chunks, token sources, error counting."""

from __future__ import annotations

import pytest

from servefleet.bench.client import RequestRecord
from servefleet.bench.metrics import chunk_tokens, output_tokens, stat, summarize


def rec(
    index=0,
    start=0.0,
    offsets=(0.1, 0.2, 0.3),
    sizes=(4, 4, 4),
    exact=None,
    usage=None,
    ok=True,
    kind=None,
    end=None,
    **kw,
):
    return RequestRecord(
        index=index,
        ok=ok,
        start=start,
        end=end if end is not None else start + (offsets[-1] if offsets else 0.5),
        ttft=offsets[0] if offsets else None,
        completion_tokens=usage,
        chunk_offsets=list(offsets),
        chunk_bytes=list(sizes),
        chunk_tokens=exact,
        error_kind=kind,
        **kw,
    )


def test_stat_percentiles_in_ms() -> None:
    s = stat([0.001 * i for i in range(1, 101)])
    assert s.n == 100 and s.mean == pytest.approx(50.5) and s.p50 == pytest.approx(50.5)
    assert s.p99 == pytest.approx(99.01) and s.min == pytest.approx(1.0) and s.max == pytest.approx(100.0)
    assert stat([]).mean is None and stat([]).n == 0


def test_exact_chunk_counts_are_used_when_they_add_up() -> None:
    r = rec(exact=[1, 3, 3], usage=7)
    assert chunk_tokens(r, 7) == [1, 3, 3]


def test_proportional_sharing_keeps_total_and_one_token_minimum() -> None:
    r = rec(offsets=(0.1, 0.2, 0.3, 0.4), sizes=(5, 15, 10, 0), usage=10)
    shares = chunk_tokens(r, 10)
    assert sum(shares) == 10 and min(shares) >= 1
    assert shares[1] >= shares[2] >= shares[0]


def test_itl_is_per_token_when_a_chunk_carries_several_tokens() -> None:
    # Speculative-like stream: first token at 100 ms, then chunks of 3 tokens every 30 ms.
    offsets = [0.1 + 0.03 * i for i in range(6)]
    r = rec(offsets=offsets, sizes=[4] + [12] * 5, exact=[1] + [3] * 5, usage=16)
    m = summarize([r])
    assert m.itl_ms.mean == pytest.approx(10.0)  # 30 ms / 3 tokens, not 30 ms per chunk
    assert m.itl_ms.n == 15  # one sample per token after the first chunk
    assert m.tpot_ms.mean == pytest.approx((0.25 - 0.1) / 15 * 1000)
    assert m.ttft_ms.mean == pytest.approx(100.0)
    assert m.output_tokens == 16 and m.tokens_per_chunk == pytest.approx(16 / 6)
    assert m.token_sources == {"chunks_exact": 1, "usage": 1}


def test_itl_without_exact_counts_shares_usage_by_text_size() -> None:
    offsets = [0.1, 0.13, 0.16]
    r = rec(offsets=offsets, sizes=[4, 12, 12], usage=7)  # shares: 1, 3, 3
    m = summarize([r])
    assert m.itl_ms.mean == pytest.approx(10.0)


def test_errors_are_counted_by_kind_and_excluded_from_latency() -> None:
    good = [rec(index=i, start=i * 0.1, usage=3) for i in range(4)]
    bad = [
        rec(index=10, ok=False, kind="rate_limited", offsets=(), sizes=(), end=0.01, error="HTTP 429: slow down"),
        rec(index=11, ok=False, kind="rate_limited", offsets=(), sizes=(), end=0.01),
        rec(index=12, ok=False, kind="server_error", offsets=(), sizes=(), end=0.02),
    ]
    warm = rec(index=-1, usage=3)
    warm.warmup = True
    m = summarize(good + bad + [warm])
    assert (m.requests, m.successful, m.errors) == (7, 4, 3)
    assert m.errors_by_kind == {"rate_limited": 2, "server_error": 1}
    assert m.error_examples["rate_limited"] == "HTTP 429: slow down"
    assert m.e2e_ms.n == 4 and m.output_tokens == 12
    assert m.duration_s == pytest.approx(0.3 + 0.3)  # first start .. last end


def test_token_sources_never_fall_back_to_the_requested_length() -> None:
    r = rec(usage=None, max_tokens=500)
    r.text = "a b c d"
    assert output_tokens(r) == (round(len("a b c d") / 4), "estimated")
    assert output_tokens(r, counted=4) == (4, "tokenized")
    m = summarize([r], counted=lambda _: 4)
    assert m.output_tokens == 4 and m.token_sources == {"tokenized": 1}
