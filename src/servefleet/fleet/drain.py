"""``servefleet drain NAME``: take a server out of the running jobs gently, then stop it.

Slurm's ``scontrol update state=drain`` is the model: the server gets no new work, what it is doing
finishes, then it is out. Here: a stop mark (``command = "drain"``) goes into the state folder
first, so every ``generate --fleet`` using the server stops sending to it, lets its in-flight
requests finish and then *parks* it (its record in ``jobs/`` says so, fleet/jobs.py). Once every
job has parked it the server is stopped -- or, with ``keep``, left running with the mark (no job
uses it until ``up``/``restart`` of that server removes the mark). A job that does not park it
within ``timeout_s`` leaves the server running and marked: it still gets no new requests.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from servefleet.fleet.lifecycle import StopResult

if TYPE_CHECKING:
    from servefleet.fleet.core import Fleet

__all__ = ["DrainResult", "drain"]


@dataclass
class DrainResult:
    name: str
    jobs: list[str] = field(default_factory=list)  # the jobs that were using it (described)
    still_using: list[str] = field(default_factory=list)  # those that had not parked it by the deadline
    stopped: StopResult | None = None  # None: not stopped (kept, or a job still drains it)

    @property
    def ok(self) -> bool:
        return not self.still_using and (self.stopped is None or self.stopped.ok)


async def drain(
    fleet: Fleet,
    names: list[str],
    *,
    keep: bool = False,
    timeout_s: float = 600.0,
    grace_s: float = 15.0,
    poll_s: float = 0.2,
    on_wait: Callable[[dict[str, list[str]]], None] | None = None,
) -> dict[str, DrainResult]:
    await fleet.down(names, grace_s=grace_s, by_user="drain", keep=True)  # the marks, under the folder's lock
    results = {n: DrainResult(n, jobs=[j.describe() for j in fleet.jobs.live() if j.uses(n)]) for n in names}
    if on_wait is not None and any(r.jobs for r in results.values()):
        on_wait({n: r.jobs for n, r in results.items() if r.jobs})
    deadline = time.monotonic() + timeout_s
    while True:
        using = {n: [j.describe() for j in fleet.jobs.live() if j.uses(n)] for n in names}
        if not any(using.values()) or time.monotonic() >= deadline:
            break
        await asyncio.sleep(poll_s)
    for name, jobs in using.items():
        results[name].still_using = jobs
    done = [n for n in names if not using[n]]
    if done and not keep:
        for name, stopped in (await fleet.down(done, grace_s=grace_s, by_user="drain")).items():
            results[name].stopped = stopped
    return results
