"""Continuous dispatch over every ready server.

A request goes out the moment a slot frees up -- never batch-and-wait, so no server idles while the
slowest request of a batch finishes. Each server has its own limit (:mod:`.concurrency`); the next
prompt goes to the least-loaded server with a free slot (lowest in-flight/limit). Prompts wait in a
bounded deque filled by the input stream, so memory does not grow with the input; retries wait in
a heap until their backoff has passed and then go first.

Exactly once within a run: a prompt (a :class:`Ticket`) is owned by one place at a time -- the
waiting deque, the retry heap, or one request task. When a server is taken out, its request tasks
are cancelled; a cancelled task never records its answer (the answer is recorded synchronously
right after the only ``await``), so its ticket is re-queued exactly when ``cancel()`` succeeds.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import Protocol

from servefleet.generate.client import Client, Completion
from servefleet.generate.concurrency import SPREAD, ConcurrencyController, Window, ramp_lifetimes
from servefleet.generate.endpoints import Holding, Restarter, Retiring, Target, Watching
from servefleet.generate.health import Health, HealthPolicy, ProgressWatch, ServerState, hang_window_s, recover
from servefleet.generate.inputs import PromptRecord
from servefleet.generate.retry import RetryPolicy
from servefleet.generate.routing import model_for, served
from servefleet.generate.rows import rows_of, short_of_choices
from servefleet.generate.server_load import LoadWatch, LoadWindow
from servefleet.generate.shards import OutputRow
from servefleet.generate.stats import JobStats, ServerStats
from servefleet.http import FailureKind, RequestFailure

__all__ = ["Dispatcher", "Ticket", "RowSink", "Outcome"]

log = logging.getLogger(__name__)

Outcome = str  # "complete" | "stalled"


class RowSink(Protocol):
    """Where answered rows go (the committer): never blocks; tells when it is behind."""

    def add(self, row: OutputRow) -> None: ...

    @property
    def backlogged(self) -> bool: ...

    async def wait_room(self) -> None: ...


@dataclass(eq=False)
class Ticket:
    record: PromptRecord
    attempts: int = 0
    state: str = "waiting"  # waiting | in_flight | settled
    last_error: str | None = None
    last_server: str | None = None
    resets: int = 0  # connections broken under it (the first is retried at once, free)


class _Server:
    def __init__(self, target: Target, controller: ConcurrencyController, policy: HealthPolicy) -> None:
        now = time.monotonic()
        self.target = target
        self.controller = controller
        self.health = Health(policy, last_answer=now)
        self.stats = ServerStats(target.name, target.base_url, limit=controller.limit)
        self.in_flight: dict[asyncio.Task[None], Ticket] = {}
        self.load = LoadWatch(prefix=self.stats.prefix_cache)
        self.progress = ProgressWatch(last_progress=now)
        self.answers = 0  # HTTP answers of any kind: our own evidence of progress
        self.hung = False  # taken out for a hang: an unmanaged one must answer a completion to come back
        self.last_endpoint = "completions"  # the job's kind of request (the hang recovery check sends one)
        self.window_start = now
        self.window_tokens = 0
        self.ticks = 0
        self.saturated_ticks = 0
        self.settle_until = now  # after a limit change: no window until the old setting's requests are out
        self.settle_deadline = now
        self.last_overload = 0.0
        self.probing = False
        self.draining = False  # its end was announced (a Slurm job's notice): no new requests, restarted once empty
        self.held: str | None = None  # stopped or drained by the user (why): drained, then parked, never restarted
        self.sync_stats()

    def sync_stats(self) -> None:
        """What the progress view and the report show of this server's limit."""
        self.stats.in_flight = len(self.in_flight)
        self.stats.limit = self.controller.limit
        self.stats.limit_source = self.controller.source
        self.stats.limit_reason = self.controller.reason

    def window_s(self, minimum: float) -> float:
        """Long enough to be steady: a few request latencies (our answers come in lumps of a whole
        completion) and at least 5x ``minimum`` when throughput is compared (a 10 s window on a busy
        vLLM-CPU host still varied by +-10%); in the ramp one lifetime where answers end apart, else two."""
        latency = self.stats.lifetime_s()
        if self.controller.phase == "ramp":  # the wave after a doubling is not read as growth
            return max(minimum, ramp_lifetimes(self.spread()) * latency)
        if (
            self.controller.short_window()
        ):  # to be dropped (one lifetime is its transient), or the capacity start's first
            return max(minimum, latency)
        return self.controller.window_factor() * self.probe_window_s(minimum)

    def probe_window_s(self, minimum: float) -> float:
        """A window that compares throughput, where windows do not swing (the controller doubles it where they do)."""
        return max(5 * minimum, (2.0 if self.load.available else 3.0) * self.stats.lifetime_s())

    def limit_changed(self, now: float, grew: bool) -> None:
        latency = self.stats.lifetime_s()
        ramp = self.controller.phase == "ramp" and bool(self.load.available)
        self.settle_until = now + (0.5 if ramp else max(1.0, latency if grew else 0.5 * latency))
        self.settle_deadline = now + max(2.0, 3 * latency)

    def settled(self, now: float) -> bool:
        if self.answers == 0:  # the first requests are still in prefill: nothing steady to measure yet
            return False
        if now < self.settle_until:
            return False
        return len(self.in_flight) <= self.controller.limit or now >= self.settle_deadline

    def spread(self) -> bool:
        """Whether recent answers end apart (a dataset's lengths) rather than in waves (uniform work)."""
        spread = self.stats.latency_spread()
        return spread is not None and spread >= SPREAD

    def measure(self, now: float, span: float) -> Window:
        """The window just ended: tok/s by the server's counter when it has one, else by our answers."""
        saturated = self.saturated_ticks >= 0.8 * self.ticks
        load = self.load.window(self.window_start, now) if self.load.available else LoadWindow()
        lifetime = self.stats.lifetime_s()
        return Window.of(
            self.window_tokens / span,
            load,
            saturated=saturated,
            lifetimes=span / lifetime if lifetime > 0 else None,
            spread=self.spread(),
        )

    def cut_short(self, now: float, span: float, minimum: float) -> Window | None:
        """The window so far, when the step being tried already reads far below the best one request lifetime
        (and ``minimum`` s, a few scrapes of the server's own counter) in; None otherwise."""
        return self.controller.cut_short(
            span,
            self.stats.lifetime_s(),
            minimum,
            lambda: len(self.load.between(self.window_start, now)),
            bool(self.load.available),
            lambda: self.measure(now, span),
        )

    def progress_marks(self) -> tuple[float | None, ...]:
        latest = self.load.latest()
        return (*(latest.marks() if latest is not None else (None, None, None)), float(self.answers))


class Dispatcher:
    def __init__(
        self,
        targets: list[Target],
        *,
        client: Client,
        out: RowSink,
        on_failure: Callable[[Ticket, RequestFailure], None],
        stats: JobStats,
        retry: RetryPolicy | None = None,
        health: HealthPolicy | None = None,
        concurrency: int | None = None,
        model: str | None = None,
        routed: bool = False,
        store_request: bool = False,
        restarter: Restarter | None = None,
        tick_s: float = 0.25,
        window_min_s: float = 2.0,
        notice_interval_s: float = 5.0,
        hold_interval_s: float = 1.0,
    ) -> None:
        self.client = client
        self.out = out
        self.on_failure = on_failure
        self.stats = stats
        self.retry = retry or RetryPolicy()
        self.policy = health or HealthPolicy()
        self.concurrency = concurrency
        self.model = model
        self.routed = routed  # servers serve different models: a request goes to one that serves its own (routing.py)
        self.store_request = store_request
        self.restarter = restarter
        self.tick_s = tick_s
        self.window_min_s = window_min_s
        self.notice_interval_s = notice_interval_s
        self.hold_interval_s = hold_interval_s
        self.servers = [_Server(t, self._controller(t), self.policy) for t in targets]
        for s in self.servers:
            stats.servers[s.target.name] = s.stats
        self._pending: deque[Ticket] = deque()
        self._delayed: list[tuple[float, int, Ticket]] = []
        self._seq = itertools.count()
        self._wake = asyncio.Event()
        self._room = asyncio.Event()
        self._feed_done = False
        self._error: BaseException | None = None
        self._background: set[asyncio.Task[None]] = set()

    def _controller(self, target: Target) -> ConcurrencyController:
        if self.concurrency is not None:
            return ConcurrencyController.fixed(self.concurrency)
        return ConcurrencyController.auto(
            target.max_running,
            bench_concurrency=target.bench_concurrency,
            bench_tps=target.bench_tps,
            bench_note=target.bench_note,
            graph_batch=target.graph_batch,
        )

    # ---- the loop -------------------------------------------------------------------------------
    async def run(self, feed: AsyncIterator[PromptRecord]) -> Outcome:
        """Send every record of ``feed``; returns when all are answered or failed ("complete"), or
        when no server is left ("stalled")."""
        self._spawn(self._feeder(feed))
        self._spawn(self._monitor())
        if isinstance(self.restarter, Retiring):
            self._spawn(self._watch_notices(self.restarter.retiring))
        if isinstance(self.restarter, Holding):
            self._check_holds()  # before the first request: a server drained with --keep gets none
            self._spawn(self._watch_holds())
        if isinstance(
            self.restarter, Watching
        ):  # servers joining, replaced, released at the tail (generate/membership.py)
            self._spawn(self.restarter.watch(self))
        for s in self.servers:
            self._spawn(s.load.run(self.client.http, partial(_base_url, s)))
        try:
            while True:
                if self._error is not None:
                    raise self._error
                self._release_due(time.monotonic())
                if self.out.backlogged:
                    await self.out.wait_room()
                    continue
                self._launch()
                if self._feed_done and not self._pending and not self._delayed and not self._in_flight():
                    up = [s for s in self.servers if s.health.state is ServerState.UP]
                    await asyncio.gather(*(s.load.last(self.client.http, _base_url(s)) for s in up))
                    return "complete"
                if all(s.health.state in (ServerState.GONE, ServerState.STOPPED) for s in self.servers):
                    return "stalled"
                self._wake.clear()
                if not self._delayed:
                    await self._wake.wait()
                    continue
                try:
                    await asyncio.wait_for(self._wake.wait(), max(0.0, self._delayed[0][0] - time.monotonic()))
                except TimeoutError:
                    pass
        finally:
            await self._shutdown()

    async def _shutdown(self) -> None:
        tasks = [t for s in self.servers for t in s.in_flight] + list(self._background)
        for s in self.servers:
            s.in_flight.clear()
            s.sync_stats()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background_done)

    def _background_done(self, task: asyncio.Task[None]) -> None:
        self._background.discard(task)
        if not task.cancelled() and task.exception() is not None and self._error is None:
            self._error = task.exception()
            self._wake.set()

    def _in_flight(self) -> int:
        return sum(len(s.in_flight) for s in self.servers)

    def _high_water(self) -> int:
        return max(64, 2 * sum(s.controller.limit for s in self.servers if s.health.state is ServerState.UP))

    async def _feeder(self, feed: AsyncIterator[PromptRecord]) -> None:
        async for record in feed:
            while len(self._pending) >= self._high_water():
                self._room.clear()
                await self._room.wait()
            self._pending.append(Ticket(record))
            self._wake.set()
        self._feed_done = True
        self._wake.set()

    def _release_due(self, now: float) -> None:
        while self._delayed and self._delayed[0][0] <= now:
            _, _, ticket = heapq.heappop(self._delayed)
            self._pending.appendleft(ticket)

    def _pick(self, model: str | None = None) -> _Server | None:
        best, best_load = None, 2.0
        for s in self.servers:
            if s.health.state is not ServerState.UP or s.draining:
                continue
            if model is not None and model not in served(s.target):
                continue
            n, limit = len(s.in_flight), s.controller.limit
            if n >= limit:
                continue
            load = n / limit
            if load < best_load:
                best, best_load = s, load
        return best

    def _launch(self) -> None:
        while self._pending:
            if self.routed:
                ticket, server = self._routed_next()
                if ticket is None or server is None:
                    break
            else:
                server = self._pick()
                if server is None:
                    break
                ticket = self._pending.popleft()
            ticket.attempts += 1
            ticket.state = "in_flight"
            ticket.last_server = server.target.name
            task = asyncio.ensure_future(self._attempt(server, ticket))
            server.in_flight[task] = ticket
            task.add_done_callback(partial(self._attempt_done, server))
        if len(self._pending) < self._high_water() // 2:
            self._room.set()

    def _routed_next(self, look_ahead: int = 64) -> tuple[Ticket | None, _Server | None]:
        """The first of the next ``look_ahead`` waiting tickets that a server of its model has a free slot for
        (a full model's tickets at the head do not hold back the others')."""
        if self._pick() is None:  # no free slot anywhere: nothing to look for
            return None, None
        for i, ticket in enumerate(itertools.islice(self._pending, look_ahead)):
            own = ticket.record.body.get("model")
            server = self._pick(own if isinstance(own, str) and not self.model else None)
            if server is not None:
                del self._pending[i]
                return ticket, server
        return None, None

    def _attempt_done(self, server: _Server, task: asyncio.Task[None]) -> None:
        server.in_flight.pop(task, None)
        if not task.cancelled() and task.exception() is not None and self._error is None:
            self._error = task.exception()
        self._wake.set()

    # ---- one request ----------------------------------------------------------------------------
    async def _attempt(self, server: _Server, ticket: Ticket) -> None:
        record = ticket.record
        server.last_endpoint = record.endpoint
        model = model_for(self.model, record, server.target, self.routed)
        body = record.body if model is None else {**record.body, "model": model}
        t0 = time.perf_counter()
        result = await self.client.complete(server.target.base_url, record.endpoint, body)
        # Nothing below awaits: a cancelled task never gets here, a task that got here is settled.
        ticket.state = "settled"
        if (
            isinstance(result, Completion)
            and record.choices > 1
            and (short := short_of_choices(record, result)) is not None
        ):
            result = short
        if isinstance(result, Completion):
            self._succeeded(server, ticket, result, time.perf_counter() - t0, body)
        else:
            self._failed(server, ticket, result)

    def _succeeded(self, server: _Server, ticket: Ticket, c: Completion, latency: float, body: dict) -> None:
        now = time.monotonic()
        server.health.answered(now)
        server.answers += 1
        tokens = c.completion_tokens or 0
        st = server.stats
        st.requests += 1
        st.completion_tokens += tokens
        st.prompt_tokens += c.prompt_tokens or 0
        st.add_latency(latency)
        st.meter.add(tokens, now)
        server.window_tokens += tokens
        self.stats.done += 1
        self.stats.completion_tokens += tokens
        self.stats.prompt_tokens += c.prompt_tokens or 0
        self.stats.meter.add(tokens, now)
        for row in rows_of(
            ticket.record,
            c,
            server=server.target.name,
            attempts=ticket.attempts,
            latency=latency,
            body=body,
            store_request=self.store_request,
        ):
            self.out.add(row)

    def _failed(self, server: _Server, ticket: Ticket, failure: RequestFailure) -> None:
        if failure.server_fault and (reason := self._hold_reason(server)) is not None:
            # the user stopped it (`down`): not the prompt's fault, not an outage
            ticket.state = "waiting"
            ticket.attempts -= 1
            self._pending.appendleft(ticket)
            self.stats.requeued += 1
            self._hold(server, reason)
            return
        server.stats.errors += 1
        ticket.last_error = failure.describe()
        if not failure.server_fault:
            server.health.answered()
            server.answers += 1
        now = time.monotonic()
        if failure.overload and now - server.last_overload >= server.window_s(
            self.window_min_s
        ):  # a burst of 429s is one signal
            server.last_overload = now
            if server.controller.on_overload():
                server.limit_changed(now, grew=False)
                self.stats.event(
                    f"{server.target.name}: overloaded ({failure.describe()}), concurrency -> {server.controller.limit}"
                )
        if failure.kind is FailureKind.DISCONNECT and server.health.state is ServerState.UP:
            self._reset(server, ticket, failure, now)
            return
        decision = self.retry.decide(failure, ticket.attempts)
        if decision.retry:
            self.stats.retries += 1
            ticket.state = "waiting"
            heapq.heappush(self._delayed, (time.monotonic() + decision.delay_s, next(self._seq), ticket))
        else:
            self.stats.failed += 1
            self.on_failure(ticket, failure)
        if failure.server_fault and server.health.fault():
            self._take_out(server, failure.describe())

    def _reset(self, server: _Server, ticket: Ticket, failure: RequestFailure, now: float) -> None:
        """A connection broke mid-request. Usually one pooled keep-alive connection the server had
        closed: the prompt goes again at once (on a fresh connection: the broken one left the pool),
        the others keep running, and a probe asks whether the server itself is still there."""
        ticket.resets += 1
        self.stats.retries += 1
        if server.health.reset_seen(now, len(server.in_flight)):
            self._take_out(server, f"{failure.describe()} on many connections at once")
        elif not server.probing:
            server.probing = True
            self._spawn(self._probe(server, after_reset=True))
        if ticket.resets == 1:  # free: not the prompt's fault
            ticket.attempts -= 1
            ticket.state = "waiting"
            self._pending.appendleft(ticket)
            return
        decision = self.retry.decide(failure, ticket.attempts)
        if decision.retry:
            ticket.state = "waiting"
            heapq.heappush(self._delayed, (now + decision.delay_s, next(self._seq), ticket))
        else:
            self.stats.retries -= 1
            self.stats.failed += 1
            self.on_failure(ticket, failure)

    # ---- servers going and coming ---------------------------------------------------------------
    def _take_out(self, server: _Server, reason: str, *, hung: bool = False) -> None:
        if (held := self._hold_reason(server)) is not None:
            self._hold(server, held, requeue=True)
            return
        server.hung = hung
        server.draining = False
        server.health.take_out()
        server.stats.state = ServerState.DOWN.value
        server.stats.outages += 1
        requeued = self._requeue_in_flight(server)
        self.stats.event(f"{server.target.name}: taken out ({reason}); {requeued} in-flight requests re-queued")
        self._spawn(self._recover(server))
        self._wake.set()

    def _requeue_in_flight(self, server: _Server) -> int:
        requeued = 0
        for task, ticket in list(server.in_flight.items()):
            if ticket.state == "in_flight" and task.cancel():
                ticket.state = "waiting"
                ticket.attempts -= 1  # not the prompt's fault
                self._pending.appendleft(ticket)
                requeued += 1
            server.in_flight.pop(task, None)
        self.stats.requeued += requeued
        return requeued

    async def _recover(self, server: _Server) -> None:
        answers = partial(self._answers_a_completion, server) if server.hung else None
        new = await recover(
            server.target,
            client=self.client,
            policy=self.policy,
            restarter=self.restarter,
            on_event=self.stats.event,
            answers=answers,
            window=server.health.window,
            on_crash_loop=partial(setattr, server.stats, "state_reason"),
            held=partial(self._hold_reason, server),
        )
        if (held := self._hold_reason(server)) is not None:  # stopped by the user while it was out
            server.held = held
            self._park(server)
        elif new is None:
            server.health.state = ServerState.GONE
            server.stats.state = ServerState.GONE.value
            if not server.stats.state_reason:
                self.stats.event(f"{server.target.name}: given up for this run")
        else:
            if new.managed:
                server.health.restarts += 1
                server.stats.restarts += 1
            self._put_back(server, new)
            self.stats.event(f"{server.target.name}: back in service at {new.base_url}")
        self._wake.set()

    def _put_back(self, server: _Server, new: Target) -> None:
        old = server.target
        if (
            new.bench_concurrency is None and old.bench_concurrency is not None
        ):  # the same configuration: its bench point stands
            new = replace(
                new, bench_concurrency=old.bench_concurrency, bench_tps=old.bench_tps, bench_note=old.bench_note
            )
        if not new.models and old.models:  # the same launch: the same models and adapters
            new = replace(new, models=old.models)
        if new.managed or server.hung or (new.max_running and new.max_running != server.target.max_running):
            # a new engine, or windows measured while it hung: what the controller learned is stale
            server.controller = self._controller(new)
        server.target = new
        now = time.monotonic()
        server.load.reset()  # a restarted engine counts from zero
        server.progress.reset(now)
        server.hung = False
        server.window_start, server.window_tokens, server.ticks, server.saturated_ticks = now, 0, 0, 0
        server.limit_changed(now, grew=True)
        server.health.put_back()
        server.stats.state = ServerState.UP.value
        server.stats.base_url = new.base_url

    # ---- servers joining and leaving while the job runs (generate/membership.py decides) ----------
    def admit(self, target: Target) -> bool:
        """Send to a server that became ready while the job runs (a Slurm job that left PENDING, a
        server started by another terminal's `up`), or put back one given up for this run; under
        the same concurrency controller as the others. False when it is already in service."""
        server = next((s for s in self.servers if s.target.name == target.name), None)
        if server is not None:
            if server.target.name in self.known():
                return False
            server.held, server.draining = None, False  # parked earlier: the user started it again
            self._put_back(server, target)
            server.stats.state_reason = ""
        else:
            server = _Server(target, self._controller(target), self.policy)
            self.servers.append(server)
            self.stats.servers[target.name] = server.stats
            self._spawn(server.load.run(self.client.http, partial(_base_url, server)))
        self._wake.set()
        return True

    def retire(self, name: str, reason: str) -> bool:
        """No new requests to ``name``; parked (``restarter.parked``) once nothing is in flight on
        it, never restarted. False when it is not in service."""
        server = next((s for s in self.servers if s.target.name == name), None)
        if server is None or server.health.state is not ServerState.UP or server.held is not None:
            return False
        self._hold(server, reason)
        return True

    def backlog(self) -> int | None:
        """Prompts waiting for a server (retries included) once the input is read to its end; None before."""
        return len(self._pending) + len(self._delayed) if self._feed_done else None

    def in_service(self) -> dict[str, int]:
        """Servers that take requests now, with their requests in flight."""
        return {
            s.target.name: len(s.in_flight)
            for s in self.servers
            if s.health.state is ServerState.UP and not s.draining
        }

    def known(self) -> set[str]:
        """Servers the job has in hand (in service or being brought back): not to be admitted again."""
        return {s.target.name for s in self.servers if s.health.state in (ServerState.UP, ServerState.DOWN)}

    async def _watch_notices(self, retiring: Callable[[], Awaitable[set[str]]]) -> None:
        """Servers whose end their host announced (a Slurm job's advance notice before its time
        limit) get no new requests; once their last one is answered they are taken out and
        restarted, with nothing to re-queue. A failed look is skipped: the end is handled anyway."""
        while True:
            await asyncio.sleep(self.notice_interval_s)
            try:
                names = await retiring()
            except Exception as exc:
                log.debug(
                    "asking which servers' end was announced failed (%s: %s); asking again later",
                    type(exc).__name__,
                    exc,
                )
                continue
            for s in self.servers:
                if s.target.name in names and s.health.state is ServerState.UP and not s.draining:
                    s.draining = True
                    self.stats.event(
                        f"{s.target.name}: draining ({len(s.in_flight)} in flight): its end was announced; no new requests"
                    )
                    self._wake.set()

    # ---- servers the user stopped or drained (`servefleet down` / `drain`) ------------------------
    def _hold_reason(self, server: _Server) -> str | None:
        if not isinstance(self.restarter, Holding) or not server.target.managed:
            return None
        return server.held or self.restarter.held(server.target.name)

    def _check_holds(self) -> None:
        for s in self.servers:
            if s.held is None and s.health.state is ServerState.UP and (reason := self._hold_reason(s)) is not None:
                self._hold(s, reason)

    async def _watch_holds(self) -> None:
        while True:
            await asyncio.sleep(self.hold_interval_s)
            self._check_holds()

    def _hold(self, server: _Server, reason: str, *, requeue: bool = False) -> None:
        """No new requests; parked once nothing is in flight. ``requeue``: the server is gone
        (its requests cannot finish): re-queue them now, without counting an outage or an attempt."""
        if server.held is None:
            server.held = reason
            server.draining = True
            self.stats.event(
                f"{server.target.name}: {reason}: draining ({len(server.in_flight)} in flight); no new requests, not restarted"
            )
        if requeue:
            self._requeue_in_flight(server)
        if not server.in_flight and server.health.state is ServerState.UP:
            self._park(server)
        self._wake.set()

    def _park(self, server: _Server) -> None:
        server.draining = False
        server.health.state = ServerState.STOPPED
        server.stats.state = ServerState.STOPPED.value
        server.stats.state_reason = server.held or ""
        server.sync_stats()
        self.stats.event(f"{server.target.name}: drained: nothing in flight; out of this run ({server.held})")
        if isinstance(self.restarter, Holding):
            self.restarter.parked(server.target.name)
        self._wake.set()

    async def _probe(self, server: _Server, *, after_reset: bool = False) -> None:
        """``after_reset``: sent because a connection broke; one failed probe then takes it out."""
        try:
            ok = await self.client.ping(server.target.base_url, timeout_s=self.policy.probe_timeout_s)
        finally:
            server.probing = False
        if server.health.state is ServerState.UP and (
            server.health.probed(ok, time.monotonic()) or (after_reset and not ok)
        ):
            self._take_out(
                server, "a connection broke and it does not answer probes" if after_reset else "does not answer probes"
            )

    async def _answers_a_completion(self, server: _Server) -> bool:
        """One token of a tiny completion within the probe timeout (a hung engine behind a live API
        process passes every probe, never this)."""
        endpoint = server.last_endpoint
        body: dict = {"max_tokens": 1, "model": self.model or server.target.served_model or ""}
        body.update({"messages": [{"role": "user", "content": "ping"}]} if endpoint == "chat" else {"prompt": "ping"})
        try:
            result = await asyncio.wait_for(
                self.client.complete(server.target.base_url, endpoint, body), 2 * self.policy.probe_timeout_s
            )
        except TimeoutError:
            return False
        return isinstance(result, Completion)

    async def _monitor(self) -> None:
        while True:
            await asyncio.sleep(self.tick_s)
            now = time.monotonic()
            for s in self.servers:
                s.sync_stats()
                if s.health.state is not ServerState.UP:
                    continue
                if s.draining and not s.in_flight:
                    if s.held is not None:
                        self._park(s)
                        continue
                    self._take_out(s, "drained before its announced end")
                    continue
                # at least a few scrapes: counters read once a second cannot move faster than that
                window = max(hang_window_s(self.policy, s.stats.mean_latency_s()), 3 * s.load.interval_s)
                if s.progress.update(now, len(s.in_flight), s.progress_marks(), window):
                    what = "generated tokens, engine steps or answers" if s.load.available else "answers"
                    self._take_out(
                        s,
                        f"hung: no progress ({what}) for {s.progress.quiet_s(now):.0f}s "
                        f"with {len(s.in_flight)} requests in flight",
                        hung=True,
                    )
                    continue
                if not s.settled(now):
                    s.window_start, s.window_tokens, s.ticks, s.saturated_ticks = now, 0, 0, 0
                else:
                    self._tick_window(s, now)
                if not s.probing and s.health.wants_probe(len(s.in_flight), now):
                    s.probing = True
                    self._spawn(self._probe(s))

    def _tick_window(self, s: _Server, now: float) -> None:
        s.ticks += 1
        if len(s.in_flight) >= s.controller.limit:
            s.saturated_ticks += 1
        span = now - s.window_start
        cut = None
        if span < s.window_s(self.window_min_s):
            cut = s.cut_short(now, span, self.window_min_s)
            if cut is None:
                return
        if s.load.available is None and span < 10 * self.window_min_s:
            return  # does it have /metrics? known after the first scrapes
        if s.load.available and len(s.load.between(s.window_start, now)) < 3 and span < 10 * self.window_min_s:
            return  # scrapes are late (a busy host): a window needs a few of them
        before = s.controller.limit
        # what a step around the best would cost, against the time the job has left (concurrency.TRIAL_SHARE)
        s.controller.job_left_s = self._job_left_s(now)
        s.controller.probe_window_s = s.probe_window_s(self.window_min_s)
        if s.controller.observe(cut or s.measure(now, span)):
            self.stats.event(
                f"{s.target.name}: concurrency {before} -> {s.controller.limit} ({s.controller.describe()})"
            )
            s.limit_changed(now, grew=s.controller.limit > before)
            self._wake.set()
        s.window_start, s.window_tokens, s.ticks, s.saturated_ticks = now, 0, 0, 0

    def _job_left_s(self, now: float) -> float | None:
        """The seconds the job has left at its rate so far (None: not known yet, or no job size)."""
        return self.stats.eta_s(now) if self.stats.to_send > 0 else None


def _base_url(server: _Server) -> str:
    """The server's address now (a restarted fleet server may have moved)."""
    return server.target.base_url
