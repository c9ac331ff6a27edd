"""What a running job writes about itself beside the manifest, for any terminal or machine to read.

* ``progress.json`` -- a small snapshot (done, remaining, rates, ETA, each server's state, the last
  events), rewritten every ``interval_s`` (2 s) while the job sends;
* ``timeline/<run_id>.json`` -- the run's bounded time series (:mod:`.timeline`), rewritten every
  ``timeline_every`` snapshots (10 s; less often for a big fleet, so that it averages at most
  ``TIMELINE_BYTES_PER_S``) and at the end.

Both go through the job's sink, so they are atomic (rename, or one object upload) and land where
the shards do (a folder or ``s3://``). A write that fails is noted once in the job's events and
retried at the next tick: the record never stops the job. A write still under way (slow object
storage) makes the next tick skip rather than queue. Readers: :mod:`.job_record`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from typing import Any

from servefleet.generate.job import utcnow
from servefleet.generate.sinks import Sink
from servefleet.generate.stats import JobStats
from servefleet.generate.timeline import Timeline

__all__ = ["JobRecorder", "snapshot", "PROGRESS_FILE", "TIMELINE_DIR", "RECORD_VERSION"]

PROGRESS_FILE = "progress.json"
TIMELINE_DIR = "timeline"
RECORD_VERSION = 1
EVENTS_IN_SNAPSHOT = 20
TIMELINE_BYTES_PER_S = 50_000  # a fleet of 256 servers writes its full 2.5 MB timeline every ~50 s, not every 10 s


def snapshot(
    stats: JobStats, *, run_id: str, status: str, now: float, started: float, interval_s: float
) -> dict[str, Any]:
    """The progress snapshot of a run (``now``, ``started``: UNIX times)."""
    mono = time.monotonic()
    done = stats.done_before + stats.done
    servers = [
        {
            "name": s.name,
            "base_url": s.base_url,
            "state": s.state,
            "state_reason": s.state_reason,
            "in_flight": s.in_flight,
            "limit": s.limit,
            "limit_source": s.limit_source,
            "limit_reason": s.limit_reason,
            "output_tokens_per_s": round(s.meter.rate(mono), 2),
            "requests": s.requests,
            "errors": s.errors,
            "output_tokens": s.completion_tokens,
            "restarts": s.restarts,
            "outages": s.outages,
            "mean_latency_s": round(s.mean_latency_s(), 4),
        }
        for s in list(stats.servers.values())
    ]
    eta = stats.eta_s(mono)
    return {
        "version": RECORD_VERSION,
        "run_id": run_id,
        "status": status,
        "updated": utcnow(),
        "updated_unix": round(now, 3),
        "started_unix": round(started, 3),
        "elapsed_s": round(max(0.0, now - started), 3),
        "interval_s": interval_s,
        "total": stats.total,
        "done": done,
        "done_before": stats.done_before,
        "done_this_run": stats.done,
        "committed_this_run": stats.committed,
        "to_send": stats.to_send,
        "remaining": max(0, stats.total - done - stats.failed),
        "failed": stats.failed,
        "retries": stats.retries,
        "requeued": stats.requeued,
        "rejected": stats.rejected,
        "shards_this_run": stats.shards,
        "output_tokens": stats.completion_tokens,
        "output_tokens_per_s_now": round(stats.instant_tps(mono), 2),
        "output_tokens_per_s_avg": round(stats.avg_tps(mono), 2),
        "eta_s": None if eta is None or status != "running" else round(eta, 1),
        "servers": servers,
        "events": list(stats.events)[-EVENTS_IN_SNAPSHOT:],
        "events_total": stats.events_total,
        "membership": dict(stats.membership),
        "width": stats.width,
    }


class JobRecorder:
    def __init__(
        self,
        sink: Sink,
        stats: JobStats,
        *,
        run_id: str,
        interval_s: float = 2.0,
        timeline_every: int = 5,
        sample_s: float = 1.0,
        extra: dict[str, Any] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.sink = sink
        self.stats = stats
        self.run_id = run_id
        self.interval_s = interval_s
        self.timeline_every = timeline_every
        self.sample_s = min(sample_s, interval_s)
        self.extra = extra or {}  # written into the timeline (e.g. the bench runs the job started from)
        self.clock = clock
        self.timeline = Timeline(clock())
        self.writes = 0
        self._task: asyncio.Task[None] | None = None
        self._writing: asyncio.Task[None] | None = None
        self._failed_once = False
        self._next_timeline = 0.0  # clock time of the next timeline write

    @property
    def timeline_rel(self) -> str:
        return f"{TIMELINE_DIR}/{self.run_id}.json"

    def start(self) -> None:
        """Sending starts now: the time series counts from here."""
        self.timeline = Timeline(self.clock())
        self._task = asyncio.ensure_future(self._loop())

    async def finish(self, status: str) -> None:
        """The run's last record, with its final status (also when it never started sending)."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._writing is not None:
            await asyncio.gather(self._writing, return_exceptions=True)
        self.timeline.sample(self.clock(), self.stats)
        await self._write(status, with_timeline=True)

    async def _loop(self) -> None:
        ticks_per_write = max(1, round(self.interval_s / self.sample_s))
        tick = 0
        while True:
            await asyncio.sleep(self.sample_s)
            self.timeline.sample(self.clock(), self.stats)
            tick += 1
            if tick % ticks_per_write or (self._writing is not None and not self._writing.done()):
                continue
            with_timeline = self.clock() >= self._next_timeline
            self._writing = asyncio.ensure_future(self._write("running", with_timeline=with_timeline))

    async def _write(self, status: str, *, with_timeline: bool) -> None:
        now = self.clock()
        snap = snapshot(
            self.stats,
            run_id=self.run_id,
            status=status,
            now=now,
            started=self.timeline.started,
            interval_s=self.interval_s,
        )
        blobs = [(PROGRESS_FILE, json.dumps(snap, separators=(",", ":")).encode())]
        if with_timeline:
            # encoded in a thread: for 256 servers a full timeline takes ~0.1 s (benchmarks/job_record_cost.py),
            # too long a pause for the event loop that drives every request
            frozen = self.timeline.frozen()
            extra = {"run_id": self.run_id, "status": status, "updated_unix": round(now, 3), **self.extra}
            data = await asyncio.to_thread(lambda: json.dumps(frozen.to_json(**extra), separators=(",", ":")).encode())
            blobs.insert(0, (self.timeline_rel, data))
            # every timeline_every snapshots, and no more than TIMELINE_BYTES_PER_S on average (a big fleet's is MBs)
            self._next_timeline = now + max(self.timeline_every * self.interval_s, len(data) / TIMELINE_BYTES_PER_S)
        try:
            for rel, data in blobs:
                await asyncio.to_thread(self.sink.write_bytes, rel, data)
            self.writes += 1
        except Exception as exc:  # object storage raises more than OSError; the job goes on
            if not self._failed_once:
                self._failed_once = True
                with contextlib.suppress(Exception):
                    self.stats.event(
                        f"progress record: writing to {self.sink.url} failed ({exc}); retrying every {self.interval_s:g}s"
                    )
