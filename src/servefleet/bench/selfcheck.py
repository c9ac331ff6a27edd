"""The load generator watching itself, so a result can say "the client was the limit".

Two signs, measured inside each worker process during the measured window only:

* event-loop lag — a task asks to wake every ``interval`` and records how late it woke. A
  saturated loop (too many callbacks per second) wakes late; so do responses, whose latency
  is then the client's, not the server's.
* CPU time of the process per wall second — one asyncio loop uses at most one core, so a
  worker near 100% of a core is a bottleneck whatever the loop lag says.

The machine's total CPU is recorded too: a client sharing a saturated machine with the server
under test competes with it (and says so).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from time import perf_counter
from typing import TYPE_CHECKING

import psutil

from servefleet.stopping import cancel_and_wait

if TYPE_CHECKING:  # worker processes import this module; keep numpy and pydantic out of them
    from servefleet.bench.result import ClientCheck

__all__ = ["LoopProbe", "WorkerLoad", "judge", "CPU_LIMIT", "LAG_P90_LIMIT_MS", "LAG_P99_LIMIT_MS"]

CPU_LIMIT = 85.0  # % of one core for one worker's event loop
LAG_P90_LIMIT_MS = 10.0
LAG_P99_LIMIT_MS = 50.0
HOST_LIMIT = 95.0  # % of all cores


@dataclass
class WorkerLoad:
    """What one worker measured about itself over one point (plain data, crosses processes)."""

    wall_s: float = 0.0
    cpu_s: float = 0.0
    lags_s: list[float] = field(default_factory=list)

    @property
    def cpu_percent(self) -> float:
        return 100.0 * self.cpu_s / self.wall_s if self.wall_s > 0 else 0.0


class LoopProbe:
    """Measures event-loop lag and this process's CPU between ``start()`` and ``stop()``."""

    def __init__(self, interval_s: float = 0.01) -> None:
        self.interval_s = interval_s
        self._proc = psutil.Process()
        self._task: asyncio.Task | None = None
        self._lags: list[float] = []
        self._t0 = 0.0
        self._cpu0 = 0.0

    def _cpu(self) -> float:
        t = self._proc.cpu_times()
        return t.user + t.system

    def start(self) -> None:
        self._lags = []
        self._t0 = perf_counter()
        self._cpu0 = self._cpu()
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        interval = self.interval_s
        lags = self._lags
        while True:
            t = perf_counter()
            await asyncio.sleep(interval)
            lags.append(max(0.0, perf_counter() - t - interval))

    async def stop(self) -> WorkerLoad:
        wall = perf_counter() - self._t0
        cpu = self._cpu() - self._cpu0
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None
        return WorkerLoad(wall_s=wall, cpu_s=cpu, lags_s=list(self._lags))


def judge(loads: list[WorkerLoad], host_cpu_percent: float | None = None) -> ClientCheck:
    """Combine the workers' self-measurements into a verdict with reasons."""
    from servefleet.bench.metrics import stat  # see the TYPE_CHECKING note
    from servefleet.bench.result import ClientCheck

    lags = [x for load in loads for x in load.lags_s]
    lag = stat(lags)
    cpu = [load.cpu_percent for load in loads]
    reasons: list[str] = []
    busiest = max(cpu) if cpu else 0.0
    if busiest >= CPU_LIMIT:
        reasons.append(f"a client worker used {busiest:.0f}% of a core (limit {CPU_LIMIT:.0f}%)")
    lag_text = None
    if lag.p90 is not None and lag.p90 >= LAG_P90_LIMIT_MS:
        lag_text = f"event-loop lag p90 {lag.p90:.1f} ms (limit {LAG_P90_LIMIT_MS:.0f} ms)"
    elif lag.p99 is not None and lag.p99 >= LAG_P99_LIMIT_MS:
        lag_text = f"event-loop lag p99 {lag.p99:.1f} ms (limit {LAG_P99_LIMIT_MS:.0f} ms)"
    if lag_text:
        if busiest < 50.0 and host_cpu_percent is not None and host_cpu_percent >= 90.0:
            # Not busy itself, yet late: other processes (the server on the same machine?) took
            # the CPU. Its timestamps are late all the same, so the point is still flagged.
            lag_text += (
                f" while using only {busiest:.0f}% of a core: starved of CPU by other processes "
                f"(machine {host_cpu_percent:.0f}% busy), so latencies include that wait"
            )
        reasons.append(lag_text)
    if host_cpu_percent is not None and host_cpu_percent >= HOST_LIMIT and sum(cpu) >= 50.0 and busiest >= 50.0:
        reasons.append(
            f"machine CPU {host_cpu_percent:.0f}% busy and the client used {sum(cpu):.0f}% of a core: "
            "client and server compete for the same cores"
        )
    return ClientCheck(
        workers=len(loads),
        cpu_percent_max=max(cpu) if cpu else None,
        cpu_percent_total=sum(cpu) if cpu else None,
        loop_lag_ms=lag,
        host_cpu_percent=host_cpu_percent,
        reasons=reasons,
    )
