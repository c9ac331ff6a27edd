"""How a point is split over worker processes, and how many processes `--workers auto` picks."""

from __future__ import annotations

from servefleet.bench.client import PreparedRequest
from servefleet.bench.loadgen import split_share
from servefleet.bench.result import BenchConfig
from servefleet.bench.sweep import _shares, auto_workers


def _reqs(n: int) -> list[PreparedRequest]:
    return [PreparedRequest(index=i, body=b"{}", input_tokens=1, max_tokens=1) for i in range(n)]


def test_split_share() -> None:
    assert split_share(10, 3) == [4, 3, 3]
    assert split_share(None, 2) == [None, None]


def test_auto_workers_one_per_64_concurrent_at_most_one_per_core() -> None:
    assert auto_workers(1, cpus=16) == 1 and auto_workers(64, cpus=16) == 1
    assert auto_workers(256, cpus=16) == 4 and auto_workers(256, cpus=2) == 2


def test_concurrency_point_is_split_evenly_and_small_points_stay_in_one_process() -> None:
    cfg = BenchConfig(concurrency=[256], requests=1000)
    shares = _shares(cfg, 256, 4, _reqs(1000), _reqs(256), 0)
    assert [s.job.concurrency for s in shares] == [64, 64, 64, 64]
    assert sum(s.job.requests for s in shares) == 1000
    assert sorted(r.index for s in shares for r in s.requests) == list(range(1000))
    assert sum(len(s.warmup) for s in shares) == 256 and all(s.warmup_concurrency == 64 for s in shares)
    (one,) = _shares(cfg, 8, 4, _reqs(10), [], 0)  # 8 concurrent requests: not worth a second process
    assert one.job.concurrency == 8 and one.job.requests == 1000


def test_rate_point_splits_the_rate_and_the_cap() -> None:
    cfg = BenchConfig(mode="rate", request_rates=[100.0], max_concurrency=128, requests=400)
    shares = _shares(cfg, 100.0, 4, _reqs(400), [], 1)
    assert len(shares) == 4 and {s.job.rate for s in shares} == {25.0}
    assert [s.job.concurrency for s in shares] == [32, 32, 32, 32]
    assert len({s.job.seed for s in shares}) == 4  # independent arrival streams
