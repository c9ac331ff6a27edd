"""The elastic job: servers join, are replaced and are released while ``generate --fleet`` runs.

A job's fleet is a set that changes under it. Every ``interval_s`` one round:

- **join**: a server of the fleet file that the job does not have in hand and whose status is
  ready (a Slurm job that left PENDING, a server started by another terminal's ``up``, one that
  came back after the job gave it up) is verified the way ``up`` verifies (``Fleet.start``
  adopts it, ``Fleet.wait`` runs the readiness machine: identity, smoke request) and admitted
  (``Dispatcher.admit``) under the same concurrency controller as the others;
- **replace**: a server of a counted template (``count = N``) that is dead, ended or not
  launched is started again (a new Slurm job submitted), so the count stays submitted; at most
  ``max_restarts`` times in ``restart_window_s`` per server (a crash loop ends);
- **release** (``--release-tail``): once the input is read to its end and nothing waits for a
  server, a server with nothing in flight would only sit idle until the last answer: it is
  drained (``Dispatcher.retire``) and stopped (``Fleet.down``, with a stop mark so nothing
  starts it again).

Servers the user stopped (a stop mark) are neither joined nor replaced. The questions are the
fleet's status (one scheduler question per Slurm host); the decision (:func:`plan_round`,
:func:`idle_at_tail`) is pure. Exactly once holds as before: a joined server only takes prompts
from the dispatcher's queue, a released one has nothing in flight.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from servefleet.catalog import State
from servefleet.generate.endpoints import FleetRestarter, Target, describe_verdict, from_endpoint
from servefleet.generate.handover import Handover, due, successor_name
from servefleet.hosts.capabilities import scheduler_of
from servefleet.hosts.slurm_queue import slurm_seconds

if TYPE_CHECKING:
    from servefleet.generate.dispatch import Dispatcher
    from servefleet.verify.verdict import Verdict

__all__ = ["Round", "plan_round", "idle_at_tail", "ElasticRestarter", "ReplaceBudget", "RELEASE_COMMAND"]

RELEASE_COMMAND = "generate --release-tail"  # the stop mark's command: nothing starts a released server again
JOINABLE = frozenset({"ready"})
REPLACEABLE = frozenset({"dead", "not launched", "stale"})


@dataclass(frozen=True)
class Round:
    verify: tuple[str, ...] = ()  # ready, not in the job: verify and admit
    replace: tuple[str, ...] = ()  # counted, gone: start again


def plan_round(
    states: Mapping[str, str], *, known: Collection[str], held: Collection[str], counted: Collection[str]
) -> Round:
    """What one round does, from each candidate's fleet status (``Liveness`` values)."""
    verify, replace = [], []
    for name, state in states.items():
        if name in known or name in held:
            continue
        if state in JOINABLE:
            verify.append(name)
        elif state in REPLACEABLE and name in counted:
            replace.append(name)
    return Round(tuple(verify), tuple(replace))


def idle_at_tail(backlog: int | None, in_service: Mapping[str, int]) -> list[str]:
    """Servers the job would leave idle: nothing waits for a server (the input read to its end,
    no retry due), they have nothing in flight and another server in service still has. With
    nothing in flight anywhere in service the job is at its end (``--down-after`` stops the
    fleet) or its last requests are on draining servers, whose failure would hand them back."""
    if backlog is None or backlog > 0 or not any(in_service.values()):
        return []
    return [name for name, n in in_service.items() if n == 0]


@dataclass
class ReplaceBudget:
    """At most ``max_restarts`` replacements of one server in a sliding ``window_s``."""

    max_restarts: int
    window_s: float
    times: dict[str, deque[float]] = field(default_factory=dict)

    def take(self, name: str, now: float) -> bool:
        seen = self.times.setdefault(name, deque())
        while seen and seen[0] <= now - self.window_s:
            seen.popleft()
        if len(seen) >= self.max_restarts:
            return False
        seen.append(now)
        return True


class ElasticRestarter(FleetRestarter):
    """The fleet restarter with the elastic rounds the dispatcher runs beside the job (``watch``)."""

    def __init__(
        self,
        fleet: Any,
        *,
        interval_s: float = 5.0,
        release_tail: bool = False,
        handover_margin_s: float | None = None,
        max_restarts: int = 3,
        restart_window_s: float = 600.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(fleet)
        self.interval_s = interval_s
        self.release_tail = release_tail
        self.handover_margin_s = handover_margin_s
        self.handovers: dict[str, Handover] = {}  # by the old server's name
        self.budget = ReplaceBudget(max_restarts, restart_window_s)
        self.clock = clock
        self.counted = set(fleet.spec.counted)
        self.releasing: set[str] = set()
        self.released: list[str] = []
        self.given_up: set[str] = set()
        self.counts = {"joins": 0, "leaves": 0, "replacements": 0, "releases": 0, "handovers": 0}
        self._stops: list[asyncio.Future[Any]] = []
        self.first_request_s: dict[str, float] = {}  # seen ready -> admitted, per join (the benchmark reads it)
        self._stats: Any = None

    def _event(self, text: str) -> None:
        if self._stats is not None:
            self._stats.event(text)

    def _count(self, what: str) -> None:
        self.counts[what] += 1
        if self._stats is not None:
            self._stats.membership[what] = self.counts[what]

    async def restart(self, name: str, on_event: Callable[[str], None]) -> Target | None:
        if name in self.counted:  # a member of a template: its restart keeps the count
            self._count("replacements")
        return await super().restart(name, on_event)

    async def watch(self, dispatcher: Dispatcher) -> None:
        """Rounds until the job ends (the dispatcher cancels this with its other tasks)."""
        self._stats = dispatcher.stats
        for what, n in self.counts.items():
            self._stats.membership[what] = n
        while True:
            try:
                await self.step(dispatcher)
            except (
                Exception
            ) as exc:  # a host that failed this round (SSH, sbatch): the job goes on, the next round tries again
                self._event(
                    f"fleet: this round's joins, replacements or handovers failed ({type(exc).__name__}: {exc})"
                )
            await asyncio.sleep(self.interval_s)

    async def step(self, dispatcher: Dispatcher) -> None:
        """One round: release at the tail, stop what was released, then joins and replacements."""
        self._width(dispatcher)
        if self.release_tail:
            await self._release(dispatcher)
        if self.handover_margin_s is not None:
            await self._hand_over(dispatcher)
        known = dispatcher.known()
        leaving = self.releasing | self.given_up | set(self.handovers)
        candidates = [n for n in self.fleet.spec.names if n not in known and n not in leaving]
        held = {n for n in candidates if self.held(n) is not None}
        candidates = [n for n in candidates if n not in held]
        if not candidates:
            return
        seen_at = self.clock()
        try:
            statuses = {st.name: st for st in await self.fleet.status(candidates)}
        except Exception as exc:  # a failed look is skipped: the next round asks again
            self._event(f"fleet: status not read this round ({type(exc).__name__}: {exc})")
            return
        plan = plan_round(
            {n: str(st.state) for n, st in statuses.items()}, known=known, held=held, counted=self.counted
        )
        await asyncio.gather(
            *(self._join(dispatcher, statuses[n], seen_at) for n in plan.verify),
            *(self._replace(n, statuses[n]) for n in plan.replace),
        )
        self._width(dispatcher)

    def _width(self, dispatcher: Dispatcher) -> None:
        self._stats.width = len(dispatcher.in_service())
        # left the job for good: given up, stopped or drained by the user, released
        self.counts["leaves"] = sum(1 for s in self._stats.servers.values() if s.state in ("gone", "stopped"))
        self._stats.membership["leaves"] = self.counts["leaves"]

    async def _join(self, dispatcher: Dispatcher, status: Any, seen_at: float) -> None:
        name = status.name
        outcomes = await self.fleet.start([name], honour_stops=True)  # adopts it: nothing is launched
        verdict: Verdict = (await self.fleet.wait(outcomes))[name]
        if verdict.state != State.READY:
            self._event(f"{name}: not admitted: verification -> {describe_verdict(verdict)}")
            return
        from servefleet.fleet.core import Endpoint

        target = from_endpoint(
            Endpoint(name, status.base_url, status.served_model, status.capacity, status.engine or "")
        )
        if dispatcher.admit(target):
            self.first_request_s[name] = self.clock() - seen_at
            self._count("joins")
            self._event(
                f"{name}: joined at {target.base_url} (verified {self.clock() - seen_at:.1f}s after it was seen ready)"
            )
            if self.use is not None and name not in self.use.servers:
                self.use.servers.append(name)
                self.fleet.jobs.save(self.use)

    async def _replace(self, name: str, status: Any) -> None:
        if not self.budget.take(name, self.clock()):
            self.given_up.add(name)
            self._event(
                f"{name}: not replaced again: {self.budget.max_restarts} replacements within "
                f"{self.budget.window_s:g}s (a crash loop); the job goes on without it"
            )
            return
        why = status.detail or str(status.state)
        outcomes = await self.fleet.start([name], honour_stops=True)
        outcome = outcomes[name]
        self._count("replacements")
        self._event(
            f"{name}: replaced ({why}): {outcome.action.value}{' - ' + outcome.message if outcome.message else ''}"
        )

    async def _release(self, dispatcher: Dispatcher) -> None:
        for name in idle_at_tail(dispatcher.backlog(), dispatcher.in_service()):
            if dispatcher.retire(name, "released at the tail (--release-tail): the prompts left cannot keep it busy"):
                self.releasing.add(name)
                self._count("releases")
        parked = [
            n for n in self.releasing if n not in self.released and dispatcher.stats.servers[n].state == "stopped"
        ]
        if parked:
            self.released += parked
            # not one of the dispatcher's tasks: the job may end while it runs, the stop must not be cut short
            self._stops.append(asyncio.ensure_future(self.fleet.down(parked, by_user=RELEASE_COMMAND)))

    async def _hand_over(self, dispatcher: Dispatcher) -> None:
        """Submit successors of servers near their time limit; drain an old one once its successor serves."""
        known = dispatcher.known()
        for h in self.handovers.values():
            if not h.joined and h.new in known:
                h.joined = True
                if dispatcher.retire(h.old, f"handed over to {h.new} (its job's time limit is near)"):
                    self._count("handovers")
            if h.joined and not h.stopping and dispatcher.stats.servers[h.old].state == "stopped":
                h.stopping = True
                self._stops.append(asyncio.ensure_future(self.fleet.down([h.old])))
                self._event(f"{h.old}: handed over to {h.new}; its job is cancelled")
        taken = {h.old for h in self.handovers.values()} | {h.new for h in self.handovers.values() if not h.joined}
        for name in dispatcher.in_service():
            if name in taken:
                continue
            remaining, limit, ttr = await self._time_left(name)
            if self.handover_margin_s is not None and due(remaining, ttr, self.handover_margin_s, limit):
                await self._submit_successor(name, remaining or 0.0, ttr)

    async def _time_left(self, name: str) -> tuple[float | None, float | None, float | None]:
        """(seconds before the server's job reaches its time limit, the limit, its measured time to ready)."""
        record = self.fleet.store.load(name)
        if record is None:
            return None, None, None
        scheduler = scheduler_of(self.fleet.binding(record.host).host)
        if scheduler is None:
            return None, None, None
        ttr = (record.ready_at - record.launched_at).total_seconds() if record.ready_at is not None else None
        job = (await scheduler.jobs()).get(str(record.pgid))
        return await scheduler.remaining_s(record.pgid), None if job is None else slurm_seconds(job.limit), ttr

    async def _submit_successor(self, name: str, remaining: float, ttr: float | None) -> None:
        spec = self.fleet.spec
        server = spec.server(name)
        new = successor_name(name)
        if new not in spec.names:  # this job's own copy of the server: the fleet file is not changed
            # a port key of its own (a Slurm server's relay follows its key; the job picks its real port on the node)
            port = max(s.port for s in spec.servers if s.host == server.host) + 1
            copy = server.model_copy(update={"name": new, "port": port, "template": server.template or server.name})
            self.fleet.add_server(copy)
        if server.template is not None or name in self.counted:
            self.counted.add(new)
        outcome = (await self.fleet.start([new], honour_stops=True))[new]
        self.handovers[name] = Handover(name, new, remaining)
        ready = f"ready in ~{ttr:.0f}s last time" if ttr is not None else "time to ready unknown"
        self._event(f"{name}: its job ends in {remaining:.0f}s ({ready}): successor {new} {outcome.action.value}")

    async def settle(self) -> list[str]:
        """Wait for the stops of released servers; what could not be stopped, and why."""
        problems = []
        for results in await asyncio.gather(*self._stops, return_exceptions=True):
            if isinstance(results, BaseException):
                problems.append(f"a released server was not stopped ({type(results).__name__}: {results})")
                continue
            problems += [f"{n}: not stopped ({r.message})" for n, r in results.items() if not r.ok]
        self._stops.clear()
        return problems

    async def down_all(self) -> dict[str, Any]:
        """``--down-after``: stop the whole fleet (every server with a record)."""
        return await self.fleet.down()
