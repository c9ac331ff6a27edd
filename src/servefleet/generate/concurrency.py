"""How many requests to keep in flight at one server: fixed, or found and held (``--concurrency auto``).

Auto starts from what is known, best first:

* ``bench``: a bench run's best point of this server (``generate --bench RUN.json``): its concurrency;
* ``capacity``: the server's max running requests (verification loop, info endpoints, ``--max-running``):
  that many plus a little headroom (a finished request's slot is refilled at the next step, without
  waiting for our next request to cross the network). That is also the ceiling until a window shows
  throughput still growing there (then up to :func:`room`): more only waits in the server's queue;
* ``search``: nothing known: start at :data:`START` and grow each window -- x4 while throughput grows
  in proportion (far from full), else x2 -- while the server's own queue is empty (``/metrics``: it
  admits all we send) and throughput still grows (by :data:`GROW`; a flat window counts when
  repeated). A queue at the server means its batch is full: the running count then is its
  capacity, plus :func:`headroom` the ceiling (more on evidence), as from the capacity figure; a window whose
  queue never empties while more than that is in flight ends after the minimum window, not after lifetimes
  lengthened by the queue. Throughput that stopped growing ends the ramp at the better of the last two limits,
  the higher one its ceiling: an engine that peaks below its max running is never pushed past it.
  Throughput that still grows, by less than :data:`GROW`, ends the ramp too, and one more doubling is
  tried as a step on trial (the knee is above, but a x2 in the ramp would not be judged). A doubling that wins by
  a ramp step's growth resumes the ramp (one short window of mixed answers had read too little). A step on trial
  that the server does not run whole (its gauges: fewer running than sent, the rest queued) is trimmed one request
  lifetime in: what it runs plus :func:`headroom` is the ceiling (more only waits in its queue), and the trial goes on
  there with the windows it has (the server runs the same batch either way).
  Ramp windows last at least :data:`LIFETIMES` request lifetimes (the latency of recent answers: the
  dispatcher sizes them so); a shorter one is the wave right after a raise and is not judged, and
  one long window that did not grow ends the ramp (the H200 run read 2-s windows as +15 % from 256
  to 512 where 25-s bench points said 256 was better). Those waves are uniform work's: requests that
  start together end together. Where the answers end apart (their latencies spread by :data:`SPREAD`:
  a dataset's lengths), a window of one lifetime is steady and any growth is x4, the first window's
  too: on the H100 such work grew 25-40 % a doubling up to 512, and x2 steps on two-lifetime windows
  took 25 s to get there.

From the capacity figure the climb goes down first and fast: one window at the start, then
:data:`HALVE` steps (half as many in flight) while each pays, then steps that halve from a third
each time a step loses (a bisection of the last factor 2): the H200's best was a quarter of max
running, reached in a few windows instead of the 0.33 steps that took a minute per step there.

Then it verifies by measured output tokens/s (a hill climb): try a step up and a step down from the
best limit; a step is kept when its throughput is better by more than :data:`MARGIN`, judged a loss only
when the mean of :data:`CONFIRM` windows says so (one window decides alone when the difference is at least
:data:`LARGE` and beyond the whole spread of the windows at the best limit: more than their swing); on a loss
it returns to the best limit, re-measured. A step that reads :data:`EARLY` below the best (and beyond twice the
swing of its windows, or :data:`EARLY_MAX` below) one request lifetime in is judged there
(:meth:`ConcurrencyController.clearly_worse`): on the H100 the steps past vLLM's largest CUDA-graph batch lost a third
of the throughput for 12-14 s windows, 6 % of a 70-s job. The first window after lowering the limit (or after going
back to the best one) is dropped (the batch drains through a hole: the H200 run read that transient as -17 %).
Closed-loop waves (uniform work: requests that start together end together) make windows at one limit swing
by 10-20 %: when the windows at the best limit spread by more than :data:`NOISY`, the dispatcher measures
longer windows (:meth:`ConcurrencyController.window_factor`), the first window after any change is dropped,
a difference that one window does not decide takes :data:`CONFIRM` + 1 (the issue-25 H200 run spent 60 % of
its job at a limit whose first judged window read -32 % with a 15 % spread), and one inside a third of the
spread is no difference. Equal throughput going up is kept (more in
flight only waits in the server's queue; it never settles below the best limit measured). Real engines
peak *below* their max running requests and decline past it, so the climb goes down from the capacity
figure too. Held, it probes again every :data:`REPROBE_WINDOWS` windows with a smaller step. A step around the best
is taken only while its windows fit in :data:`TRIAL_SHARE` of the time the job has left (the dispatcher says how long);
near a job's end, or in a short job whose windows swing, the best is held (:meth:`ConcurrencyController.step_cost_s`).

429/503 from the server back off multiplicatively (never above the limit that triggered it until a
later probe shows the room is back).

This module is pure: the dispatcher measures the windows (a window starts after the requests of the
previous setting have drained) and feeds them to :meth:`ConcurrencyController.observe`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from servefleet.generate.server_load import LoadWindow

__all__ = [
    "ConcurrencyController",
    "Window",
    "ramp_lifetimes",
    "START",
    "GROW",
    "NOISY",
    "headroom",
    "room",
    "MARGIN",
    "CONFIRM",
    "REPROBE_WINDOWS",
    "HALVE",
    "LIFETIMES",
    "SPREAD",
    "EARLY",
    "EARLY_MAX",
    "TRIAL_SHARE",
]

START = 32  # from 8 the first window always grew x4 (~3 s at a tenth of the peak on the H100)
GROW = 0.15  # a ramp step (x2 or more in flight) that adds less than this has stopped paying
NOISY = 0.08  # windows at one limit spreading more than this: waves; longer windows, transient dropped
MARGIN = 0.03  # two windows within 3% measure the same throughput (window-to-window noise of a real server)
LARGE = 0.15  # a difference this large is decided by one window
EARLY = 0.25  # a step this far below the best is judged one request lifetime in, not after its whole window
# ... or twice the swing of the windows at the best, but never more than this: a whole lifetime this far below is no
# wave (uniform work's wave is one lifetime long). On the H100 the best's windows of uniform work swung 28 % (the
# capacity start's first wave reads high) and a step reading -40 % to -60 % (4-s engine rates) ran its whole window:
# 50 s at 681.
EARLY_MAX = 0.4
CONFIRM = 2  # windows at a candidate before a small difference is judged
STEP = 0.33  # first probe step (fraction of the limit): a decline past the peak is found in few steps
STEP_FROM_BENCH = 0.15  # a bench point is already a measured optimum: probe closer to it
STEP_MIN = 0.08
HALVE = 1.0  # from the capacity figure: halve while it pays (the H200's best was a quarter of max running)
LIFETIMES = 2.0  # a ramp window shorter than this many request lifetimes is a transient: not judged
SPREAD = 0.25  # answers' latencies spreading more than this (std / mean) end apart: no closed-loop waves
REPROBE_WINDOWS = 30
# A step around the best (the hill climb's, not the coarse search's halvings and doubling) may take at most this share
# of the time the job has left: on the H100 (tenth lease) such steps of 12,000-prompt jobs were held 64-158 s, through
# windows that swing, and lost 8.8-9.6 %; the jobs ran at 0.81-0.97 of a fixed limit. A job that ends soon cannot earn back
# what a step costs; a long one probes as before.
TRIAL_SHARE = 0.25
SHRINK = 0.7
KEEP = 3  # windows remembered per limit
Source = Literal["fixed", "bench", "capacity", "search"]
Phase = Literal["fixed", "ramp", "probe", "hold"]


def headroom(n: int) -> int:
    """Requests queued beyond the engine's batch: 10%, at least 2."""
    return max(2, math.ceil(n * 0.1))


def room(max_running: int) -> int:
    """How far above the engine's batch the climb may go: half as much again queued. Past the batch
    more requests only wait in the server's queue, which costs nothing and, on a host where the API
    process is short of CPU, keeps the batch full (vLLM-CPU's bench peaked at 192 with 128 slots)."""
    return max_running + max(headroom(max_running), max_running // 2)


@dataclass(frozen=True)
class Window:
    """One measurement window at the current limit."""

    tps: float  # output tokens/s (the server's own counter when it has one, else our answers)
    saturated: bool = True  # the limit was kept in flight for most of the window (else it teaches nothing)
    queued: float | None = None  # the server's waiting requests, the fewest seen in the window (None: no metrics)
    running: float | None = None  # the server's running requests, most seen in the window
    queued_lately: float | None = None  # the server's waiting requests, the fewest over the window's last scrapes
    lifetimes: float | None = (
        None  # the window's length in request lifetimes (latency of recent answers); None: unknown
    )
    cut: bool = False  # ended early: the step being tried already read far below the best (clearly_worse)
    spread: bool = False  # the answers end apart (their latencies spread by SPREAD): no waves after a raise

    @classmethod
    def of(
        cls,
        ours_tps: float,
        load: LoadWindow,
        *,
        saturated: bool,
        lifetimes: float | None = None,
        spread: bool = False,
    ) -> Window:
        """A window read from the server's own gauges where it has them (its counter's tokens/s, its queue and running
        count), else from ``ours_tps``, the tokens/s of our answers."""
        return cls(
            tps=ours_tps if load.tps is None else load.tps,
            saturated=saturated,
            queued=load.waiting,
            running=load.running,
            queued_lately=load.waiting_lately,
            lifetimes=lifetimes,
            spread=spread,
        )


@dataclass
class ConcurrencyController:
    limit: int
    source: Source
    phase: Phase = "probe"
    ceiling: int = 4096
    room: int = 0  # how far the ceiling may rise on evidence (throughput still growing at it); 0: no further
    floor: int = 1
    step: float = STEP
    reason: str = ""  # the last decision, one line
    best_limit: int = 0
    measured: dict[int, list[float]] = field(default_factory=dict)  # limit -> its last KEEP windows' tok/s
    history: list[tuple[int, float]] = field(default_factory=list)
    changes: int = 0
    _direction: int = 1
    _tried: set[int] = field(default_factory=set)  # directions that stopped paying at this step
    _candidate: list[float] = field(default_factory=list)  # windows at the limit under test
    _held: int = 0  # windows since the last probe ended
    _ramp_prev: float = 0.0
    _ramp_prev_limit: int = 0
    _ramp_flat: int = 0
    _queue_seen: int = 0
    _fresh: bool = False  # no window yet since the last change of limit
    _lowered: bool = False  # that change lowered the limit
    # from the capacity start: steps down halve the limit until one stops paying; after a ramp that still grew,
    # one doubling up (direction +1)
    _halving: bool = False
    _refining: bool = False  # after halving: the best is within a factor 2 either way; each loss halves the step
    # while a doubling after the ramp is on trial: the ceiling the ramp had (0: none on trial)
    _search_ceiling: int = 0
    _room_open: bool = False  # a window showed that requests queued at the server pay (the ceiling rose to room)
    # Set by the dispatcher before each window: the seconds the job has left (None: unknown, every step is worth it) and
    # one probe window's length in s when windows do not swing (0: unknown).
    job_left_s: float | None = None
    probe_window_s: float = 0.0

    # ---- construction ---------------------------------------------------------------------------
    @classmethod
    def fixed(cls, n: int) -> ConcurrencyController:
        n = max(1, n)
        return cls(limit=n, source="fixed", phase="fixed", best_limit=n, reason=f"--concurrency {n}")

    @classmethod
    def auto(
        cls,
        max_running: int | None,
        *,
        bench_concurrency: int | None = None,
        bench_tps: float | None = None,
        bench_note: str | None = None,
        ceiling: int = 4096,
        graph_batch: int | None = None,
    ) -> ConcurrencyController:
        cap = min(ceiling, room(max_running)) if max_running else ceiling
        if bench_concurrency:  # a measured point: evidence for anything up to room
            start = max(1, min(cap, bench_concurrency))
            tps = f" ({bench_tps:,.0f} tok/s)" if bench_tps else ""
            note = f", {bench_note}" if bench_note else ""
            return cls(
                limit=start,
                source="bench",
                ceiling=cap,
                best_limit=start,
                step=STEP_FROM_BENCH,
                reason=f"bench best point C={bench_concurrency}{tps}{note}; verifying",
            )
        if max_running and graph_batch and graph_batch < max_running:
            # Above its largest CUDA-graph batch each engine step launches its kernels one by one: start there and halve.
            start = min(cap, graph_batch)
            return cls(
                limit=start,
                source="capacity",
                ceiling=start,
                room=cap,
                best_limit=start,
                _direction=-1,
                step=HALVE,
                _halving=True,
                reason=f"max running {max_running}; {graph_batch}, the largest batch run as a CUDA graph; verifying",
            )
        if max_running:
            start = min(cap, max_running + headroom(max_running))
            return cls(
                limit=start,
                source="capacity",
                ceiling=start,
                room=cap,
                best_limit=start,
                _direction=-1,  # real engines peak below
                step=HALVE,
                _halving=True,
                reason=f"max running {max_running} + {headroom(max_running)} queued; verifying",
            )
        start = min(START, ceiling)
        return cls(
            limit=start,
            source="search",
            phase="ramp",
            ceiling=ceiling,
            best_limit=start,
            reason=f"capacity unknown: from {start}, doubling while the server has room",
        )

    # ---- signals --------------------------------------------------------------------------------
    def on_overload(self) -> bool:
        """A 429/503 from the server (the dispatcher sends one per window at most). Whether the limit changed."""
        if self.phase == "fixed":
            return False
        new = max(self.floor, int(self.limit * SHRINK))
        if new == self.limit:
            return False
        self.ceiling = self.limit
        self.best_limit = new
        self._enter_hold(f"server overloaded (429/503) at {self.limit}: backing off")
        return self._set(new)

    def observe(self, w: Window) -> bool:
        """One measurement window ended. Returns whether the limit changed."""
        if self.phase == "fixed" or not w.saturated:
            return False
        self.history.append((self.limit, w.tps))
        if self.phase == "ramp":
            return self._ramp(w)
        if self.phase == "hold":
            return self._hold(w)
        return self._probe(w)

    def best_tps(self) -> float:
        return _mean(self.measured.get(self.best_limit, []))

    def spread(self) -> float:
        """How far the windows at the best limit disagree ((max - min) / mean; 0 with fewer than two)."""
        kept = self.measured.get(self.best_limit, [])
        mean = _mean(kept)
        return (max(kept) - min(kept)) / mean if len(kept) >= 2 and mean > 0 else 0.0

    def noisy(self) -> bool:
        return self.spread() > NOISY

    def window_factor(self) -> float:
        """How much longer than usual the next window should be: twice when the windows swing."""
        return 2.0 if self.phase in ("probe", "hold") and self.noisy() else 1.0

    def windows_to_judge(self) -> int:
        """How many windows a small difference at a step takes before it is judged: one more when the windows swing."""
        return CONFIRM + 1 if self.noisy() else CONFIRM

    def settling(self) -> bool:
        """Whether the next window is the transient of the last change (a batch draining, new requests in
        prefill, a wave): dropped, neither compared nor kept as the best's figure; it need not be long."""
        return (
            self.phase == "probe" and self._fresh and (self._lowered or self.noisy() or self.limit == self.best_limit)
        )

    def short_window(self) -> bool:
        """Whether one request lifetime is window enough (else the dispatcher measures two or more): a window to
        be dropped, or the first one at the capacity start (one full wave of requests at max running, which is
        most often well past the best: the sooner it is left, the less it costs)."""
        return self.settling() or (self._halving and self.limit == self.best_limit and not self.measured)

    def cut_short(
        self,
        span: float,
        lifetime: float,
        minimum: float,
        scrapes: Callable[[], int],
        own_counter: bool,
        measure: Callable[[], Window],
    ) -> Window | None:
        """The window under way, ended early, when a step on trial already reads far below the best
        (:meth:`clearly_worse`); None otherwise. Only on the server's own counter (our answers come in lumps of whole
        completions: never cut on them), and once the window is one request ``lifetime``, ``minimum`` s and 3
        scrapes long. The cheap tests first (``scrapes`` counted, ``measure`` taken last): this runs on every tick of
        the dispatcher and of the gateway. The window carries its length in lifetimes, for the reason.

        In the ramp, a window whose gauges show a queue that has not emptied over its last scrapes while we send more
        than the server runs plus :func:`headroom` ends after ``minimum`` s and 3 scrapes: the server is full, and a
        window of lifetimes lengthened by its queue would only wait (on the H100 the x4 from 512 to 2048 stayed 87 s
        at 2048, two windows of 40-s lifetimes, while vLLM ran 870-1024)."""
        ramp = self.phase == "ramp"
        if not own_counter or self.phase not in ("ramp", "probe") or (not ramp and self.limit == self.best_limit):
            return None
        if span < (minimum if ramp else max(minimum, lifetime)) or scrapes() < 3:
            return None
        window = measure()
        if ramp and window.queued_lately is not None:
            # the queue now: a raise's requests reach the server's queue a second or two into the window (on the H100
            # the x4 to 2048 began with two scrapes of no queue, and the window ran its 50 s lifetime at 2048)
            window = replace(window, queued=window.queued_lately)
        if self._over_slots(window) is None and (ramp or not self.clearly_worse(window)):
            return None  # the ramp is judged on tokens/s over its lifetimes: only a full server ends it early
        return replace(window, cut=True, lifetimes=span / lifetime if lifetime > 0 else None)

    def clearly_worse(self, w: Window) -> bool:
        """Whether a window cut short in a step being tried already reads far below the best: by :data:`EARLY`
        and by twice the swing of the windows at the best, or by :data:`EARLY_MAX` whatever the swing. The dispatcher
        then hands it to :meth:`observe`, where a difference that large is decided by one window."""
        if self.phase != "probe" or self.limit == self.best_limit or self.settling() or not w.saturated:
            return False
        best = self.best_tps()
        return best > 0 and w.tps < best * (1 - min(EARLY_MAX, max(EARLY, 2 * self.spread())))

    def _over_slots(self, w: Window) -> int | None:
        """The server's slot count when a step on trial (or a ramp step) above the best sends more than it runs plus
        the queue that keeps its batch full: its queue never emptied over the window, it runs ``w.running`` and the
        rest only wait (its own gauges). None otherwise."""
        if self.phase not in ("probe", "ramp") or self.limit <= self.best_limit or w.queued is None or not w.running:
            return None
        cap = int(w.running)
        return cap if w.queued >= 1 and self.limit > self._slots_bound(cap) else None

    def _slots_bound(self, cap: int) -> int:
        """The most in flight worth sending to a server that runs ``cap``: the queue that keeps its batch full, or
        half as much again where a window showed the queue pays (vLLM-CPU's API process, short of CPU, refills the
        batch late) or the best limit already sits in the queue."""
        if self._room_open or self.best_limit > cap + headroom(cap):
            return room(cap)
        return cap + headroom(cap)

    def describe(self) -> str:
        return f"{self.source}: {self.reason}" if self.reason else self.source

    # ---- internals ------------------------------------------------------------------------------
    def _set(self, n: int) -> bool:
        n = max(self.floor, min(self.ceiling, n))
        if n == self.limit:
            return False
        self._fresh, self._lowered = True, n < self.limit
        self.limit = n
        self.changes += 1
        self._candidate = []
        return True

    def _record(self, limit: int, tps: float) -> None:
        kept = self.measured.setdefault(limit, [])
        kept.append(tps)
        del kept[:-KEEP]

    def _ramp(self, w: Window) -> bool:
        if not w.cut and self._ramp_prev > 0 and w.lifetimes is not None and w.lifetimes < ramp_lifetimes(w.spread):
            return False  # shorter than its lifetimes: the wave after a raise, not growth (nor its end)
        self._record(self.limit, w.tps)
        prev, prev_limit = self._ramp_prev, self._ramp_prev_limit
        grew = prev == 0 or w.tps > prev * (1 + GROW)
        # in proportion to what was added: far below the server's best, grow faster. The first window of uniform
        # work has nothing to be in proportion to: x2 (from 32, a blind x4 overshot a peak at 32 into 128 for two
        # long lifetimes). Answers that end apart make one-lifetime windows, so x4 on any growth: a dataset's
        # lengths on the H100 grew 25-40 % a doubling up to 512, and four doublings of x2 took 25 s to reach it.
        linear = (prev_limit > 0 and w.tps >= 0.75 * prev * self.limit / prev_limit) or w.spread
        if w.queued is not None:
            # Room: the queue emptied and what we sent runs. (A CPU-starved API process may not have
            # handed requests to the engine yet: neither running nor waiting, so not room either.)
            admitted = w.running is None or w.running >= 0.9 * self.limit
            if w.queued < 1 and admitted and grew:
                self._queue_seen = 0
                return self._grow(w.tps, linear, "server queue empty")
            if w.queued < 1 and admitted:
                return self._flat()
            # A queue that never emptied. Right after a doubling it may be requests still being
            # admitted (an engine admits a step's token budget at a time): full only when repeated.
            self._queue_seen += 1
            if self._queue_seen < CONFIRM:
                return False
            # Every slot of the server is busy. What runs now is its capacity.
            if w.running:
                # As from the capacity figure: its slots plus the queue that keeps them full, more on evidence only
                # (x4 steps reach past the slots: from 512 to 2048 on the H100's 1024).
                cap = int(w.running)
                self.room = min(self.ceiling, room(cap))
                self.ceiling = min(self.ceiling, cap + headroom(cap))
                self.reason = f"server full at {cap} running (learned from /metrics); verifying"
            else:
                self.reason = f"server queues at {self.limit}; verifying"
            self.best_limit = min(self.limit, cap + headroom(cap)) if w.running else self.limit
            self.measured.pop(self.limit, None)
            self.phase = "probe"
            self._direction = -1  # from the capacity down first: real engines peak below it
            return self._set(self.best_limit)
        # No metrics: grow while throughput grows; a flat window counts only when repeated.
        if grew:
            return self._grow(w.tps, linear, "throughput grows")
        return self._flat()

    def _grow(self, tps: float, linear: bool, why: str) -> bool:
        self._ramp_prev, self._ramp_prev_limit, self._ramp_flat = tps, self.limit, 0
        self.best_limit = self.limit
        if self.limit >= self.ceiling:
            self.phase = "probe"
            return False
        factor = 4 if linear else 2
        self.reason = f"{why} at {self.limit}: x{factor}"
        return self._set(self.limit * factor)

    def _flat(self) -> bool:
        """Throughput stopped growing (one window of at least two lifetimes says so: the dispatcher
        makes ramp windows that long, so the wave after a raise is inside it): the knee is between the last limit that grew and
        this one. The better of the two is the best; nothing above this one was shown to pay."""
        self._ramp_flat += 1
        self.phase = "probe"
        here, before = self.limit, self._ramp_prev_limit
        ours, theirs = self.best_tps_at(here), self.best_tps_at(before)
        if before and ours > theirs * (1 + MARGIN) and self.ceiling > here:
            # Still growing, by less than a ramp step asks: the knee is above. Variable work on the H100 grew 7-9 % a
            # doubling from 128 to 512; the ramp stopped at 256 and the job ran 17 % under a fixed 512. One more
            # doubling, as a step on trial: judged on its windows (cut short one lifetime in when far below).
            self.best_limit, self._search_ceiling = here, self.ceiling
            self.ceiling = min(self.ceiling, 2 * here)
            self._direction, self.step, self._halving = 1, HALVE, True
            return self._next_candidate(
                f"throughput still grows at {here} ({ours:,.0f} tok/s, {ours / theirs - 1:+.1%} vs {before}), "
                f"by less than a ramp step; at most {self.ceiling}"
            )
        self.best_limit = here if before == 0 or ours >= theirs * (1 - MARGIN) else before
        self.ceiling = min(self.ceiling, here)
        self._direction = 1 if self.best_limit < here else -1
        self.reason = (
            f"throughput stopped growing at {here} ({ours:,.0f} tok/s, {theirs:,.0f} at {before}); "
            f"from {self.best_limit}, at most {here}"
        )
        return self._set(self.best_limit)

    def best_tps_at(self, limit: int) -> float:
        return _mean(self.measured.get(limit, []))

    def _probe(self, w: Window) -> bool:
        cap = self._over_slots(w)
        if cap is not None and not self._trim_to_slots(cap):
            return self._back_from_slots()
        trimmed = cap is not None  # the limit changed, the trial goes on: the window is judged as at the trial's limit
        if self._fresh:
            dropped = self.settling()
            self._fresh = False
            if dropped:
                return trimmed
        if self.limit == self.best_limit:
            self._record(self.limit, w.tps)
            if len(self.measured[self.limit]) < CONFIRM and self.source != "bench" and not self._halving:
                return False  # the spread of windows at the best is known before anything is compared
                # (a bench point was measured by the bench: probed at once, closer; the capacity start
                # is most often far above the best: one window, then half as many)
            return self._next_candidate()
        self._candidate.append(w.tps)
        best = self.best_tps()
        noisy = self.noisy()
        judged = self._candidate
        mean = _mean(judged)
        gain = mean / best - 1 if best > 0 else 1.0
        # Beyond the whole spread at the best is no wave (a window swings within it); quiet, the spread is under LARGE.
        decisive = abs(gain) >= LARGE and abs(gain) > self.spread()
        if not decisive and len(self._candidate) < self.windows_to_judge():
            return trimmed  # small difference, or one inside the swing: more windows before judging
        margin = max(MARGIN, self.spread() / 3) if noisy else MARGIN  # inside the swing is no difference
        up = self.limit > self.best_limit
        for tps in judged:
            self._record(self.limit, tps)
        if gain > margin or (
            up and gain > -MARGIN and (not self._refining or self.step >= STEP)
        ):  # equal going up: within the quiet margin only
            # (not in the small steps of refining: steps up that each lose a little would ratchet past the peak)
            old = self.best_limit
            self.best_limit = self.limit
            why = f"{self.limit} gives {mean:,.0f} tok/s ({gain:+.1%} vs {old})"
            self.reason = why
            if gain > margin and up and self.limit >= self.ceiling and self.room > self.ceiling:
                # evidence: still growing at the ceiling, so the queue pays
                self.ceiling, self._room_open = self.room, True
                why = self.reason = f"{why}, still growing: room up to {self.room}"
            if gain <= margin:  # equal going up: keep the higher limit, but this direction is spent
                self._turn()
                self._end_halving()
            elif self._halving and up and self._search_ceiling and gain >= GROW:
                return self._resume_ramp(mean, why)
            elif self._halving and up and self.limit >= self.ceiling:
                self._end_halving()  # the doubling after the ramp reached its bound: closer steps from here
            return self._next_candidate(why)
        # A loss (or an equal step down): back to the best limit, then the other direction.
        short = (
            (f" in its first {w.lifetimes:.1f} request lifetimes" if w.lifetimes else " in a window cut short")
            if w.cut
            else ""
        )
        self.reason = f"{self.limit} gives {mean:,.0f} tok/s{short} ({gain:+.1%} vs {self.best_limit}): back to {self.best_limit}"
        if gain < -margin and not up and self.best_limit >= self.ceiling and self.room > self.ceiling:
            # evidence: less in flight loses at the ceiling, so more may pay
            self.ceiling, self._room_open = self.room, True
            self.reason += f"; still growing at {self.best_limit}: room up to {self.room}"
        doubling = self._halving and up
        self._turn()
        if self._halving:
            self._end_halving()
            if doubling:  # the ramp measured below the best: the knee is between it and the doubling that lost
                self._direction = 1
        elif self._refining and self.step > STEP_MIN:  # closer, both ways again (a bisection of the factor 2)
            self.step = max(STEP_MIN, self.step / 2)
            self._tried = set()
        return self._back_to_best()

    def _trim_to_slots(self, cap: int) -> bool:
        """A step on trial sends more than the server runs: on the H100 the doubling after a --url ramp went from 1024
        to 2048 in flight, vLLM ran 1024 and queued the rest, and the step stayed on trial past the job's end. The
        server's slots (plus the queue that keeps them full) are the ceiling, as from the capacity figure. When that is
        still above the best, the limit is trimmed to it and the trial goes on with its windows: the server runs the
        same full batch at the trimmed limit, only its queue is shorter, so what was measured still holds. (Restarted
        instead, the trial never ended on variable work: vLLM's running count drifts down as long answers fill its KV
        cache, 929, 918, 910 on the H100, each a new bound, and a --url job spent 200 of its 218 s on trial.) Whether
        the limit was trimmed; False: the slots are at or below the best, the trial is over."""
        old = self.limit
        self.ceiling = max(self.best_limit, min(self.ceiling, self._slots_bound(cap)))
        # more only on evidence that it pays, as from the capacity figure
        self.room = room(cap) if not self.room else min(self.room, room(cap))
        if self._search_ceiling:
            self._search_ceiling = min(self._search_ceiling, self.ceiling)
        self.reason = f"server full at {cap} running (learned from /metrics): {old} only waits in its queue"
        if self.ceiling <= self.best_limit:
            return False
        self.limit = self.ceiling
        self.changes += 1
        self.reason += f"; {self.limit} on trial from here, its windows so far kept"
        return True

    def _back_from_slots(self) -> bool:
        """The server's slots are at or below the best: the step on trial is over, back to the best."""
        self._turn()
        self._end_halving()
        self.reason += f"; back to {self.best_limit}"
        return self._back_to_best()

    def _turn(self) -> None:
        """This direction from the best is spent: the other one next."""
        self._tried.add(self._direction)
        self._direction = -self._direction

    def _back_to_best(self) -> bool:
        """Back to the best limit, held there once both directions from it are spent."""
        if len(self._tried) >= 2:
            self._enter_hold(self.reason + ", held")
        return self._set(self.best_limit)

    def _end_halving(self) -> None:
        """Halving stopped paying: the best is between the last two halvings; closer steps from here."""
        self._search_ceiling = 0
        if self._halving:
            self._halving, self._refining = False, True
            self.step = STEP
            self._tried = set()

    def _resume_ramp(self, tps: float, why: str) -> bool:
        """The doubling after the ramp grew by a ramp step, so the ramp stopped too soon: on the H100 a variable job's
        ramp read +9.9 % from 32 to 64 (short windows of long, mixed answers) and the doubling to 128 +33.7 %; held
        under that doubling, the job ran at 0.66 of a fixed 512. The ramp goes on from it (the queue and the growth of
        each doubling judged as before). A smaller win ends the search there as before: past a doubling that grew
        7-9 % the H100 lost (681 read -11 % to -33 %)."""
        self.ceiling, self._search_ceiling = self._search_ceiling, 0
        self._halving, self.phase, self._queue_seen = False, "ramp", 0
        return self._grow(tps, False, f"{why}, a ramp step's growth: the ramp goes on; throughput grows")

    def step_cost_s(self) -> float:
        """What a step around the best costs, in s: its transient, then the windows that judge it (one more, each twice
        as long, where the windows at the best swing). 0 when the dispatcher has not said how long a window is."""
        return (1 + self.windows_to_judge()) * self.window_factor() * self.probe_window_s

    def _step_pays(self) -> bool:
        """Whether the job has time to earn back a step around the best (the coarse search's steps always do)."""
        if self._halving or self.job_left_s is None:
            return True
        return self.step_cost_s() <= TRIAL_SHARE * self.job_left_s

    def _next_candidate(self, why: str | None = None) -> bool:
        """Set the next limit to try around the best one; its reason says why this move (an event names
        each change of limit by the reason set with it, so a stale one would describe the move before)."""
        if len(self._tried) < 2 and not self._step_pays():
            held = (
                f"{self.best_limit} held ({self.best_tps():,.0f} tok/s): a step around it would take "
                f"~{self.step_cost_s():.0f} s of the job's ~{self.job_left_s:.0f} s left"
            )
            self._enter_hold(f"{why}; {held}" if why else held)
            return self._set(self.best_limit)
        while len(self._tried) < 2:
            d = self._direction
            factor = (1 + self.step) if d > 0 else 1 / (1 + self.step)
            cand = max(self.floor, min(self.ceiling, round(self.best_limit * factor)))
            if cand == self.best_limit:
                cand = self.best_limit + d
            if self.floor <= cand <= self.ceiling and cand != self.best_limit:
                best = self.best_tps()
                trying = f"trying {cand} ({'above' if cand > self.best_limit else 'below'} the best so far, {self.best_limit}"
                trying += f": {best:,.0f} tok/s)" if best > 0 else ")"
                self.reason = f"{why}; {trying}" if why else trying
                return self._set(cand)
            self._tried.add(d)
            self._direction = -d
        self._enter_hold(f"{self.best_limit} is the best measured ({self.best_tps():,.0f} tok/s), held")
        return self._set(self.best_limit)

    def _enter_hold(self, reason: str) -> None:
        self._halving = self._refining = False
        self.phase = "hold"
        self.reason = reason
        self._held = 0
        self._tried = set()

    def _hold(self, w: Window) -> bool:
        if self.limit != self.best_limit:  # after a back-off
            self.best_limit = self.limit
        self._record(self.limit, w.tps)
        self._held += 1
        if self._held < REPROBE_WINDOWS:
            return False
        # Probe again, closer: the server's best may have moved (other load, other prompts).
        self.phase = "probe"
        self.step = max(STEP_MIN, self.step / 2)
        self._direction = 1
        self._tried = set()
        return self._next_candidate()


def ramp_lifetimes(spread: bool) -> float:
    """How many request lifetimes a ramp window lasts: two where answers end together (the wave after a raise
    would read as growth), one where they end apart (only the new requests' prefill is a transient)."""
    return 1.0 if spread else LIFETIMES


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0
