"""Is a server still answering? When not: take it out, bring it back, put it back.

Evidence, per server:

* consecutive *server-fault* failures of real requests (connection refused, timeouts; an HTTP
  error status is an answer and does not count) -- ``failures_to_take_out`` in a row;
* a connection broken mid-request (reset, closed) is retried at once on another connection and the
  server probed: it is taken out when that probe fails, or when many connections break at once
  (:meth:`Health.reset_seen`) -- one reset pooled connection is not an outage;
* a cheap probe (``GET /v1/models``, any HTTP answer counts) sent when the server has had requests in flight but no answer
  for ``probe_interval_s`` -- ``probe_failures`` failed probes in a row (catches a hung server whose
  requests would otherwise wait for the full request timeout);
* progress (:class:`ProgressWatch`): requests in flight, yet nothing moves for a window -- neither the
  server's own counters (generated and prompt tokens, engine steps, from ``/metrics``) nor our answers.
  That is a hung engine behind a live API process: it still answers probes and ``/metrics``, its
  requests never end. A long prefill is not a hang: the engine steps and prompt tokens move while it
  prefills, and the window grows with the latency observed (``hang_latency_factor`` x mean latency,
  at least ``hang_min_s``), so a job of long requests gets a long window.

Taken out, a server gets no new requests and its in-flight ones are re-queued (the dispatcher
does that). Then it is brought back: managed servers through the fleet layer's restart (relaunch +
verification), unmanaged ones by probing until they answer -- each with a deadline, after which the
server is given up for this run. Restarts are also counted in a sliding window (:class:`RestartWindow`,
``max_restarts`` in ``restart_window_s``): a server that starts fine and dies again (a crash loop, a
poison workload) is taken out for good once the window is full, instead of being restarted forever
(each recovery's own attempt counter starts again after a successful start).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING

from servefleet.generate.endpoints import Restarter, Target

if TYPE_CHECKING:
    from servefleet.generate.client import Client

RESET_BURST_S = 1.0  # resets this close together count as one event ("many connections at once")

__all__ = ["ServerState", "HealthPolicy", "Health", "ProgressWatch", "RestartWindow", "hang_window_s", "recover"]


class ServerState(StrEnum):
    UP = "up"
    DOWN = "down"  # taken out, recovery under way
    GONE = "gone"  # could not be brought back in this run
    STOPPED = "stopped"  # stopped or drained by the user: drained, not restarted in this run


@dataclass(frozen=True)
class HealthPolicy:
    failures_to_take_out: int = 3
    probe_interval_s: float = 10.0
    probe_failures: int = 2
    probe_timeout_s: float = 5.0
    recover_timeout_s: float = 600.0  # --give-up-after: not back within this long, a server is given up for the run
    restart_attempts: int = 3
    retry_interval_s: float = 2.0  # between recovery probes / restart attempts (doubling, capped)
    hang_min_s: float = 60.0  # no progress for this long (at least) with requests in flight: hung
    hang_latency_factor: float = 3.0  # ... or this many mean latencies, whichever is longer
    max_restarts: int = 3  # restarts of one server within restart_window_s; past it, the server is out for good
    restart_window_s: float = 600.0


def hang_window_s(policy: HealthPolicy, mean_latency_s: float) -> float:
    """How long nothing may move, with requests in flight, before a server counts as hung."""
    return max(policy.hang_min_s, policy.hang_latency_factor * mean_latency_s)


@dataclass
class ProgressWatch:
    """Pure: has a server with requests in flight made any progress within its window?

    ``marks`` are counters that move while the engine works (the server's generated and prompt
    tokens and engine steps, None where it has no metrics; and our own answers): any change is
    progress. No requests in flight is never a hang (nothing to make progress on)."""

    last_marks: tuple[float | None, ...] | None = None
    last_progress: float = 0.0
    idle: bool = True  # nothing was in flight at the last look: the clock starts when work does

    def update(self, now: float, in_flight: int, marks: tuple[float | None, ...], window_s: float) -> bool:
        """Record one look; True when the server is hung."""
        was_idle, self.idle = self.idle, in_flight == 0
        if self.idle or was_idle or marks != self.last_marks:
            self.last_marks = marks
            self.last_progress = now
            return False
        return now - self.last_progress >= window_s

    def quiet_s(self, now: float) -> float:
        return now - self.last_progress

    def reset(self, now: float) -> None:
        self.last_marks = None
        self.last_progress = now
        self.idle = True


@dataclass
class RestartWindow:
    """Pure: restarts of one server in the last ``window_s`` seconds, at most ``limit`` of them."""

    limit: int
    window_s: float
    times: deque[float] = field(default_factory=deque)

    def _trim(self, now: float) -> None:
        while self.times and self.times[0] <= now - self.window_s:
            self.times.popleft()

    def allows(self, now: float) -> bool:
        """Whether one more restart fits in the window."""
        self._trim(now)
        return len(self.times) < self.limit

    def record(self, now: float) -> int:
        """One restart now; how many the window holds with it."""
        self._trim(now)
        self.times.append(now)
        return len(self.times)

    def describe(self) -> str:
        return f"at most {self.limit} restarts in {_duration(self.window_s)}"


def _duration(seconds: float) -> str:
    if seconds >= 120 and seconds % 60 == 0:
        return f"{seconds / 60:g} min"
    return f"{seconds:g} s"


@dataclass
class Health:
    """Pure bookkeeping of one server's evidence."""

    policy: HealthPolicy
    state: ServerState = ServerState.UP
    consecutive_faults: int = 0
    failed_probes: int = 0
    last_answer: float = 0.0
    last_probe: float = 0.0
    outages: int = 0
    restarts: int = 0
    window: RestartWindow | None = None  # set from the policy (managed servers are restarted)
    resets: list[float] = field(default_factory=list)  # when recent connections broke mid-request

    def __post_init__(self) -> None:
        if self.window is None:
            self.window = RestartWindow(self.policy.max_restarts, self.policy.restart_window_s)

    def answered(self, now: float | None = None) -> None:
        """Any HTTP answer, success or error status."""
        self.consecutive_faults = 0
        self.failed_probes = 0
        self.last_answer = time.monotonic() if now is None else now

    def fault(self) -> bool:
        """A server-fault failure; True when the server should be taken out."""
        self.consecutive_faults += 1
        return self.state is ServerState.UP and self.consecutive_faults >= self.policy.failures_to_take_out

    def reset_seen(self, now: float, in_flight: int) -> bool:
        """A connection broke mid-request (reset, closed). One broken pooled connection (a keep-alive
        connection the server closed while it sat idle) is not an outage; many at once are: True when
        the resets of the last :data:`RESET_BURST_S` reach ``failures_to_take_out`` and a quarter of
        what was in flight (a dead server breaks every connection it held)."""
        self.resets = [t for t in self.resets if now - t < RESET_BURST_S] + [now]
        many = max(self.policy.failures_to_take_out, in_flight // 4)
        return self.state is ServerState.UP and len(self.resets) >= many

    def wants_probe(self, in_flight: int, now: float) -> bool:
        if self.state is not ServerState.UP or in_flight == 0:
            return False
        quiet = now - max(self.last_answer, self.last_probe)
        return quiet >= self.policy.probe_interval_s

    def probed(self, ok: bool, now: float) -> bool:
        """Record a probe; True when the server should be taken out."""
        self.last_probe = now
        if ok:
            self.failed_probes = 0
            return False
        self.failed_probes += 1
        return self.state is ServerState.UP and self.failed_probes >= self.policy.probe_failures

    def take_out(self) -> None:
        self.state = ServerState.DOWN
        self.outages += 1

    def put_back(self, now: float | None = None) -> None:
        self.state = ServerState.UP
        self.consecutive_faults = 0
        self.failed_probes = 0
        self.resets = []
        self.last_answer = time.monotonic() if now is None else now


async def recover(
    target: Target,
    *,
    client: Client,
    policy: HealthPolicy,
    restarter: Restarter | None,
    on_event: Callable[[str], None],
    answers: Callable[[], Awaitable[bool]] | None = None,
    window: RestartWindow | None = None,
    on_crash_loop: Callable[[str], None] | None = None,
    held: Callable[[], str | None] | None = None,
) -> Target | None:
    """Bring a taken-out server back; its (possibly new) target, or None when it cannot be.
    ``answers``: for an unmanaged server taken out for a hang, what must succeed before it is put
    back (a hung engine behind a live API process passes ``/health``; a small completion does not).
    ``window``: the server's restarts so far; when it is full no restart is tried and
    ``on_crash_loop`` gets the reason. ``held``: why the user stopped the server, if they did
    (then no restart is tried)."""
    delay = policy.retry_interval_s
    deadline = time.monotonic() + policy.recover_timeout_s
    if restarter is not None and target.managed:
        for attempt in range(1, policy.restart_attempts + 1):
            if held is not None and held() is not None:
                return None
            if window is not None and not window.allows(time.monotonic()):
                reason = (
                    f"crash loop: restarted {len(window.times)} times in the last {_duration(window.window_s)} "
                    f"({window.describe()}: --max-restarts / --restart-window, or the fleet file's "
                    "[fleet] max_restarts / restart_window); out for good in this run"
                )
                on_event(f"{target.name}: {reason}")
                if on_crash_loop is not None:
                    on_crash_loop(reason)
                return None
            count = window.record(time.monotonic()) if window is not None else None
            within = f"; restart {count} of {window.describe()}" if window is not None else ""
            on_event(
                f"{target.name}: restarting through the fleet (attempt {attempt}/{policy.restart_attempts}{within})"
            )
            try:
                new = await restarter.restart(target.name, on_event)
            except Exception as exc:  # a failed restart is an event, not a crash of the job
                on_event(f"{target.name}: restart failed: {type(exc).__name__}: {exc}")
                new = None
            if new is not None:
                return new
            if time.monotonic() + delay > deadline:
                break
            await asyncio.sleep(delay)
            delay = min(delay * 2, 60.0)
        return None
    on_event(
        f"{target.name}: waiting for it to answer again (unmanaged: cannot restart it); "
        f"given up if it does not within {policy.recover_timeout_s:g}s (--give-up-after)"
    )
    while time.monotonic() < deadline:
        if await client.ready(target.base_url, timeout_s=policy.probe_timeout_s) and (
            answers is None or await answers()
        ):
            return target
        await asyncio.sleep(min(delay, max(0.0, deadline - time.monotonic())))
        delay = min(delay * 2, 30.0)
    return None
