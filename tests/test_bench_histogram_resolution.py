"""bench's latency percentiles from an engine histogram are only as fine as its buckets (issue 24
item 11): a percentile in the first (0-10 ms) or the open last bucket is not invented by
interpolation; the mean stays exact; the bucket is stated; client timing fills in where it exists."""

from __future__ import annotations

import math

import pytest

from servefleet.bench.histograms import Histogram
from servefleet.bench.result import ServerLatency, Stat
from servefleet.bench.sweep import _coarse, _latencies
from servefleet.cli.bench_view import _ms

# vLLM's inter-token buckets (seconds): the first one spans 0-10 ms
VLLM_ITL = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, math.inf)


def _hist(observations: list[float]) -> Histogram:
    buckets = tuple((le, float(sum(1 for x in observations if x <= le))) for le in VLLM_ITL)
    return Histogram("vllm:inter_token_latency_seconds", buckets, sum(observations), float(len(observations)))


@pytest.mark.parametrize("itl_s", [0.0005, 0.003, 0.0086])
def test_fast_tokens_in_the_first_bucket_give_no_invented_p50(itl_s: float) -> None:
    s = _hist([itl_s] * 1000).stat()
    assert s.mean == pytest.approx(itl_s * 1000)  # exact: sum / count
    assert s.p50 is None and s.p99 is None  # was 5.00 ms (the middle of 0-10 ms) whatever the speed
    assert s.resolution_ms["p50"] == (0.0, 10.0) and s.coarse
    assert _ms(s) == "<10" and _ms(s, "mean") == f"{itl_s * 1000:.1f}"


def test_inside_a_bounded_bucket_the_percentile_is_given_with_its_bucket() -> None:
    s = _hist([0.03] * 50 + [0.06] * 50).stat()
    assert s.p50 is not None and 25.0 <= s.p50 <= 50.0
    assert s.resolution_ms["p50"] == (25.0, 50.0) and not s.coarse


def test_past_the_last_finite_bound_the_bucket_is_open() -> None:
    s = _hist([3.0] * 10).stat()
    assert s.p50 is None and s.resolution_ms["p50"] == (2500.0, None) and _ms(s) == ">2,500"


def test_coarse_percentiles_come_from_the_streamed_sample_the_mean_from_the_engine() -> None:
    server = ServerLatency(itl_ms=_hist([0.004] * 500).stat(), metrics={"itl": "vllm:inter_token_latency_seconds"})
    assert _coarse(server) == ["ITL"]
    timed = Stat(mean=4.4, p50=4.1, p90=5.0, p99=7.2, n=120)
    fields = {"ttft_ms": Stat(), "tpot_ms": Stat(), "itl_ms": Stat()}
    sample = {"ttft_ms": Stat(), "tpot_ms": Stat(), "itl_ms": timed, "successful": 8}
    out = _latencies(fields, server, streamed=False, sample=sample)
    itl = out["itl_ms"]
    assert itl.mean == pytest.approx(4.0) and itl.n == 500  # the engine's exact mean over every token
    assert (itl.p50, itl.p99) == (4.1, 7.2)
    assert "client:streamed sample of 8 (percentiles)" in out["latency_source"]["itl"]
    # without a sample the percentiles stay out, the bucket stated
    alone = _latencies(fields, server, streamed=False)["itl_ms"]
    assert alone.p50 is None and alone.resolution_ms["p50"] == (0.0, 10.0)
