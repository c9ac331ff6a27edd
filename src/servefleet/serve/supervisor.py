"""The servers' side of the gateway: evidence from answers, hangs, probes, limits, outages, and the
fleet's servers admitted while it runs.

The rules are generate's (:mod:`servefleet.generate.health`): consecutive server-fault failures or a
burst of broken connections take a server out, as do failed probes of a server with requests in
flight and no answer, and a server with requests in flight whose counters and answers do not move
for the hang window. Taken out, its requests that sent the client nothing are retried elsewhere
(the gateway does that when their attempt is cancelled) and it is brought back by
:func:`~servefleet.generate.health.recover`: fleet servers restarted through the fleet, others
waited for. Limits follow :class:`~servefleet.generate.concurrency.ConcurrencyController`, fed
windows of measured output tokens/s while the server is kept full.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from servefleet.generate.client import Client, Completion
from servefleet.generate.endpoints import Holding, Restarter, Target, Using
from servefleet.generate.health import HealthPolicy, ServerState, hang_window_s, recover
from servefleet.http import FailureKind, RequestFailure
from servefleet.serve.backend import Backend
from servefleet.serve.router import Router

__all__ = ["Supervisor"]

log = logging.getLogger("servefleet.serve")
EVENTS_KEPT = 200


class Supervisor:
    def __init__(
        self,
        router: Router,
        client: Client,
        *,
        policy: HealthPolicy,
        concurrency: int | None = None,
        restarter: Restarter | None = None,
        tick_s: float = 0.25,
        window_min_s: float = 2.0,
        on_event: Callable[[str], None] | None = None,
    ) -> None:
        self.router = router
        self.client = client
        self.policy = policy
        self.concurrency = concurrency
        self.restarter = restarter
        self.tick_s = tick_s
        self.window_min_s = window_min_s
        self.events: deque[str] = deque(maxlen=EVENTS_KEPT)
        self._on_event = on_event
        self._background: set[asyncio.Task[Any]] = set()
        self.error: BaseException | None = None

    def event(self, text: str) -> None:
        self.events.append(text)
        log.info("%s", text)
        if self._on_event is not None:
            self._on_event(text)

    # ---- membership -----------------------------------------------------------------------------
    async def admit(self, target: Target) -> Backend | None:
        """Add a server: what it serves from its ``/v1/models`` (the fleet's served name when it
        lists none). None when it does not answer."""
        models = await self.client.models(target.base_url)
        if not models:
            if target.served_model is None or not await self.client.ready(target.base_url):
                return None
            models = [target.served_model]
        backend = Backend.create(target, tuple(models), self.concurrency, self.policy)
        backend.watch = self.spawn(backend.load.run(self.client.http, partial(_base_url, backend)))
        self.router.add(backend)
        if isinstance(self.restarter, Using) and target.managed:
            self.restarter.using(target.name)  # `down` and `drain` name this gateway and wait for it
        self.event(
            f"{target.name}: admitted ({', '.join(models)}, at {target.base_url}; limit {backend.limit}: {backend.controller.describe()})"
        )
        return backend

    def drop(self, backend: Backend) -> None:
        if backend.watch is not None:
            backend.watch.cancel()
        self.router.remove(backend.name)

    # ---- evidence from requests -----------------------------------------------------------------
    def answered(self, b: Backend, tokens: float, latency_s: float) -> None:
        b.answered(tokens, latency_s, time.monotonic())

    def failed(self, b: Backend, failure: RequestFailure) -> None:
        b.errors += 1
        now = time.monotonic()
        if not failure.server_fault:  # an error status is an answer
            b.health.answered(now)
            b.answers += 1
            b.requests += 1
            if failure.overload and now - b.last_overload >= max(self.window_min_s, b.mean_latency_s()):
                b.last_overload = now
                if b.controller.on_overload():
                    b.new_window(now)
                    self.event(f"{b.name}: overloaded ({failure.describe()}), limit -> {b.limit}")
            return
        if not b.up:
            return
        if failure.kind is FailureKind.DISCONNECT:
            if b.health.reset_seen(now, b.in_flight):
                self.take_out(b, f"{failure.describe()} on many connections at once")
            elif not b.probing:
                b.probing = True
                self.spawn(self._probe(b, after_reset=True))
            return
        if b.health.fault():
            self.take_out(b, failure.describe())

    # ---- out and back ---------------------------------------------------------------------------
    def take_out(self, b: Backend, reason: str, *, hung: bool = False) -> None:
        if not b.up:
            return
        b.hung = hung
        b.health.take_out()
        cancelled = 0
        for task in list(b.attempts):
            cancelled += task.cancel()
        self.event(
            f"{b.name}: taken out ({reason}); {cancelled} requests on it cancelled (those that sent nothing are retried)"
        )
        self.spawn(self._recover(b))

    async def _recover(self, b: Backend) -> None:
        held = self.restarter.held if isinstance(self.restarter, Holding) else None
        answers = partial(self._answers_a_completion, b) if b.hung else None
        new = await recover(
            b.target,
            client=self.client,
            policy=self.policy,
            restarter=self.restarter,
            on_event=self.event,
            answers=answers,
            window=b.health.window,
            held=(partial(held, b.name) if held is not None and b.target.managed else None),
        )
        if self.router.backends.get(b.name) is not b:
            return  # replaced meanwhile (admitted again from the fleet)
        if new is None:
            b.health.state = ServerState.GONE
            self.event(f"{b.name}: given up (not back within --give-up-after {self.policy.recover_timeout_s:g}s)")
            return
        if new.managed:
            b.health.restarts += 1
        b.restarted(new, self.concurrency)
        self.event(f"{b.name}: back in service at {new.base_url} (limit {b.limit})")
        self.router.wake(b)

    async def _probe(self, b: Backend, *, after_reset: bool = False) -> None:
        try:
            ok = await self.client.ping(b.target.base_url, timeout_s=self.policy.probe_timeout_s)
        finally:
            b.probing = False
        if b.up and (b.health.probed(ok, time.monotonic()) or (after_reset and not ok)):
            self.take_out(
                b, "a connection broke and it does not answer probes" if after_reset else "does not answer probes"
            )

    async def _answers_a_completion(self, b: Backend) -> bool:
        """A hung engine behind a live API process passes every probe, never a one-token completion."""
        body = {"model": b.models[0], "prompt": "ping", "max_tokens": 1}
        try:
            result = await asyncio.wait_for(
                self.client.complete(b.target.base_url, "completions", body), 2 * self.policy.probe_timeout_s
            )
        except TimeoutError:
            return False
        return isinstance(result, Completion)

    def _park(self, b: Backend) -> None:
        """Stopped or drained by the user and nothing in flight: out of this gateway, and the fleet is told."""
        b.health.state = ServerState.STOPPED
        self.event(f"{b.name}: drained: nothing in flight; out ({b.held})")
        if isinstance(self.restarter, Holding):
            self.restarter.parked(b.name)

    # ---- the loop -------------------------------------------------------------------------------
    async def monitor(self) -> None:
        while True:
            await asyncio.sleep(self.tick_s)
            self.tick(time.monotonic())

    def tick(self, now: float) -> None:
        for b in list(self.router.backends.values()):
            if not b.up:
                continue
            if b.held is not None and b.in_flight == 0:
                self._park(b)
                continue
            window = max(hang_window_s(self.policy, b.mean_latency_s()), 3 * b.load.interval_s)
            if b.progress.update(now, len(b.attempts), b.progress_marks(), window):
                what = "generated tokens, engine steps or answers" if b.load.available else "answers"
                self.take_out(
                    b,
                    f"hung: no progress ({what}) for {b.progress.quiet_s(now):.0f}s with {len(b.attempts)} requests in flight",
                    hung=True,
                )
                continue
            self._tick_window(b, now)
            if not b.probing and b.health.wants_probe(len(b.attempts), now):
                b.probing = True
                self.spawn(self._probe(b))

    def _tick_window(self, b: Backend, now: float) -> None:
        b.ticks += 1
        if b.in_flight >= b.limit:
            b.saturated_ticks += 1
        cut = None
        if not b.window_due(now, self.window_min_s):
            cut = b.cut_short(now, self.window_min_s)  # a step on trial far below the best: judged one lifetime in
            if cut is None:
                return
        before = b.limit
        if b.controller.observe(cut or b.measure(now)):
            self.event(f"{b.name}: limit {before} -> {b.limit} ({b.controller.describe()})")
            if b.limit > before:
                self.router.wake(b)
        b.new_window(now)

    # ---- the fleet's servers, admitted while serving ---------------------------------------------
    async def follow_fleet(self, ready: Callable[[], Awaitable[list[Target]]], interval_s: float) -> None:
        """Every ``interval_s``: servers newly ready (``servefleet up --only NAME`` while serving, or
        one given up that is ready again) are admitted; one the user stopped or drained is drained."""
        held = self.restarter.held if isinstance(self.restarter, Holding) else None
        while True:
            await asyncio.sleep(interval_s)
            try:
                targets = await ready()
            except Exception as exc:  # a failed look is skipped: the next one may work
                log.debug("fleet poll failed: %s: %s", type(exc).__name__, exc)
                continue
            await self.admit_new(targets)
            if held is not None:
                for b in list(self.router.backends.values()):
                    if b.held is None and b.target.managed and (reason := held(b.name)) is not None:
                        b.held = reason
                        self.event(
                            f"{b.name}: {reason}: no new requests ({b.in_flight} in flight finish), not restarted"
                        )

    async def admit_new(self, targets: list[Target]) -> None:
        held = self.restarter.held if isinstance(self.restarter, Holding) else None
        for t in targets:
            old = self.router.backends.get(t.name)
            if (
                old is not None
                and old.health.state not in (ServerState.GONE, ServerState.STOPPED)
                and old.held is None
            ):
                continue
            if old is not None and old.held is not None and held is not None and held(t.name) is not None:
                continue  # still stopped by the user
            if old is not None:
                self.drop(old)
            await self.admit(t)

    # ---- background tasks -----------------------------------------------------------------------
    def spawn(self, coro: Awaitable[Any]) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._background.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self.error = self.error or task.exception()
            log.error("serve: background task failed: %r", task.exception())

    async def close(self) -> None:
        tasks = list(self._background)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _base_url(b: Backend) -> str:
    return b.target.base_url
