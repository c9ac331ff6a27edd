"""The client's self-check: busy, starved, or fine."""

from __future__ import annotations

import asyncio
import time

from servefleet.bench.selfcheck import LoopProbe, WorkerLoad, judge


def test_quiet_client_is_not_flagged() -> None:
    check = judge([WorkerLoad(wall_s=10, cpu_s=2, lags_s=[0.0005] * 100)], host_cpu_percent=40)
    assert check.reasons == [] and check.cpu_percent_max == 20 and check.workers == 1


def test_busy_worker_is_flagged() -> None:
    check = judge(
        [WorkerLoad(wall_s=10, cpu_s=2, lags_s=[0.001] * 10), WorkerLoad(wall_s=10, cpu_s=9.5, lags_s=[0.03] * 10)], 97
    )
    assert any("95% of a core" in r for r in check.reasons)
    assert any("event-loop lag p90 30.0 ms" in r for r in check.reasons)
    assert check.cpu_percent_total == 115


def test_starved_client_says_so() -> None:
    check = judge([WorkerLoad(wall_s=10, cpu_s=1, lags_s=[0.2] * 50)], host_cpu_percent=100)
    assert len(check.reasons) == 1 and "starved of CPU" in check.reasons[0]


async def test_probe_measures_a_blocked_loop() -> None:
    probe = LoopProbe(interval_s=0.005)
    probe.start()
    await asyncio.sleep(0.02)
    end = time.perf_counter() + 0.06
    while time.perf_counter() < end:  # keep the event loop busy on purpose: what the probe must see
        pass
    await asyncio.sleep(0.02)
    load = await probe.stop()
    assert max(load.lags_s) >= 0.04
    assert load.wall_s >= 0.09 and load.cpu_s > 0  # CPU share depends on what else runs here
