"""The ``Fleet``: the async library API that ``up``/``down``/``status``/``restart`` and the jobs
(``generate``, ``bench``) share.

    async with Fleet.load("fleet.toml") as fleet:
        verdicts = await fleet.up()                    # {name: Verdict}, all waited in parallel
        for ep in await fleet.ready_endpoints():       # [Endpoint(name, base_url, served_model, capacity)]
            ...
        await fleet.restart("plain")                   # -> Verdict (relaunch() + wait())
        await fleet.down()                             # {name: StopResult}

Every call works from the state files and the servers themselves, never from memory, so another
process may run ``status`` or ``down`` at any time.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from servefleet.capacity import Capacity
from servefleet.catalog import Category, State
from servefleet.engines.base import Probe
from servefleet.engines.registry import get_engine
from servefleet.errors import ConfigError, HostUnreachable
from servefleet.fleet import questions
from servefleet.fleet.gpu_holders import holder_notes, host_gpu_apps
from servefleet.fleet.hosts import HostBinding, HostPool
from servefleet.fleet.jobs import JobUses
from servefleet.fleet.launch_facts import launch_capacity
from servefleet.fleet.lifecycle import (
    Action,
    Launchable,
    StartOutcome,
    StopResult,
    adopt_running,
    held_elsewhere,
    launch_server,
    load_record,
    owns_group,
    port_blocked,
    resolve_launch,
    save_record,
    stop_server,
)
from servefleet.fleet.loader import load_fleet_file
from servefleet.fleet.logs import follow_lines, tail_lines
from servefleet.fleet.prefetch import fleet_status, prefetched_launchables
from servefleet.fleet.spec import LOCAL, FleetSpec, ServerSpec
from servefleet.fleet.start_order import Sibling, StartQueue, host_has_gpus, settled_before, shares_gpu, visible_gpus
from servefleet.fleet.state import ServerState, StateStore, StopMark, utcnow
from servefleet.fleet.status import Liveness, ServerStatus
from servefleet.hosts.capabilities import scheduler_of
from servefleet.hosts.questions import ask
from servefleet.verify.verdict import Verdict
from servefleet.verify.waiter import WaitTarget, wait_for_server

__all__ = ["Fleet", "Endpoint", "Relaunch", "UpdateCallback", "find_fleet_file", "DEFAULT_FLEET_FILE"]

DEFAULT_FLEET_FILE = "servefleet.toml"
UpdateCallback = Callable[[str, Verdict], None]


@dataclass(frozen=True)
class Endpoint:
    """A ready server, as the jobs see it."""

    name: str
    base_url: str
    served_model: str | None
    capacity: Capacity
    engine: str


@dataclass(frozen=True)
class Relaunch:
    """A server stopped and started again, not yet waited for (``Fleet.relaunch``)."""

    stopped: StopResult
    outcomes: dict[str, StartOutcome]  # empty when it could not be stopped

    @property
    def failure(self) -> str | None:
        """Why it was not started again (it could not be stopped), or None."""
        return None if self.stopped.ok else f"could not stop {self.stopped.name}: {self.stopped.message}"


def find_fleet_file(given: str | Path | None = None, cwd: Path | None = None) -> Path:
    """The fleet file to use: ``given``, else ``./servefleet.toml``, else the fleet of the only
    state folder under ``./.servefleet`` (recorded there by ``up``)."""
    if given is not None:
        return Path(given)
    cwd = Path.cwd() if cwd is None else cwd
    default = cwd / DEFAULT_FLEET_FILE
    if default.is_file():
        return default
    found = []
    root = cwd / ".servefleet"
    if root.is_dir():
        for sub in sorted(root.iterdir()):
            index = StateStore.read_index(sub) if sub.is_dir() else None
            if index is not None:
                found.append((sub.name, Path(index["fleet_file"])))
    if len(found) == 1:
        name, path = found[0]
        if not path.is_file():
            raise ConfigError(f"the fleet file of .servefleet/{name} ({path}) no longer exists; pass --fleet FILE")
        return path
    if len(found) > 1:
        names = ", ".join(f"{n} ({p})" for n, p in found)
        raise ConfigError(f"several fleets under ./.servefleet: {names}; pass --fleet FILE to choose one")
    raise ConfigError(
        f"no fleet file: pass --fleet FILE, or run from a folder with {DEFAULT_FLEET_FILE} "
        "(or the folder where `servefleet up FILE` was run)"
    )


class Fleet:
    """One fleet file and its state folder."""

    def __init__(self, spec: FleetSpec) -> None:
        self.spec = spec
        self.store = StateStore(spec.state_dir)
        self.jobs = JobUses(spec.state_dir)  # the generate jobs using this fleet now
        self.hosts = HostPool(spec)

    # ---- construction ---------------------------------------------------------------------------
    @classmethod
    def load(cls, path: str | Path) -> Fleet:
        return cls(load_fleet_file(path))

    @classmethod
    def discover(cls, given: str | Path | None = None, cwd: Path | None = None) -> Fleet:
        return cls.load(find_fleet_file(given, cwd))

    async def __aenter__(self) -> Fleet:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close host connections (servers keep running)."""
        await self.hosts.close()

    def add_server(self, server: ServerSpec) -> None:
        """A server of this Fleet object only (the fleet file is not changed): a job's successor of
        one of its servers (generate/handover.py). Its record and log live beside the others'."""
        self.spec = self.spec.model_copy(update={"servers": (*self.spec.servers, server)})
        self.hosts.fleet = self.spec

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def label(self) -> str:
        return self.spec.path.name

    # ---- helpers --------------------------------------------------------------------------------
    def _select(self, names: Iterable[str] | None) -> list[str]:
        if not names:
            return self.spec.names
        wanted = list(dict.fromkeys(names))
        for name in wanted:
            self.spec.server(name)  # raises ConfigError naming the known servers
        return wanted

    def binding(self, host: str) -> HostBinding:
        return self.hosts.get(host)

    async def record(self, name: str) -> ServerState | None:
        host = self.spec.server(name).host if name in self.spec.names else LOCAL
        return await load_record(self.store, self.binding(host), name)

    def _target(
        self,
        record: ServerState,
        binding: HostBinding,
        base_url: str,
        follow_log: bool = True,
        first_line_no: int | None = None,
    ) -> WaitTarget:
        return WaitTarget(
            base_url=base_url,
            engine=get_engine(record.engine),
            host=binding.host,
            log_path=record.log_path if follow_log else None,
            log_offset=record.log_offset,
            pgid=record.pgid,
            status_path=record.status_path,
            served_model=record.served_model,
            port=record.port,
            probe=Probe(tuple(record.probe_paths)) if record.probe_paths else None,
            first_line_no=first_line_no if follow_log else None,
        )

    # ---- up -------------------------------------------------------------------------------------
    def resolve(self, names: Iterable[str] | None = None) -> list[Launchable]:
        """Resolve every selected server (argv, env, host) before anything is launched, so a
        configuration error stops ``up`` with nothing half-started."""
        return [
            resolve_launch(self.spec.server(n), self.binding(self.spec.server(n).host), self.label)
            for n in self._select(names)
        ]

    async def start(
        self, names: Iterable[str] | None = None, *, honour_stops: bool = False
    ) -> dict[str, StartOutcome]:
        """Adopt, refuse (port taken) or launch each server; do not wait for readiness. A server
        sharing a GPU with one still starting is QUEUED (see start_order.py): ``wait`` (or
        ``launch_queued``) launches it when its turn comes. The user's start: a stop mark of the
        server is removed. ``honour_stops`` (a job's restart): a server the user stopped is HELD,
        not started -- checked under the folder's lock, which ``down`` writes its mark under."""
        items = self.resolve(names)
        async with self.store.lock():
            if honour_stops:
                held = {i.name: m for i in items if (m := self.store.stop_mark(i.name)) is not None}
                if held:
                    return {
                        n: StartOutcome(
                            n,
                            Action.HELD,
                            verdict=Verdict(state=State.FAILED, message=m.describe()),
                            message=m.describe(),
                        )
                        for n, m in held.items()
                    }
            else:
                for item in items:
                    self.store.clear_stop_mark(item.name)
            self.store.write_index(self.name, self.spec.path)
            viewed = await prefetched_launchables(items, self.store)  # the adopt checks: one command per host
            records = await asyncio.gather(*(load_record(self.store, v.binding, v.name) for v in viewed))
            running = await asyncio.gather(*(adopt_running(v, r) for v, r in zip(viewed, records, strict=True)))
            adopted = {v.name: o for v, o in zip(viewed, running, strict=True) if o is not None}
            refused = await _refuse_held_ports(viewed, records, adopted)
            if refused is not None:
                return refused
            queue = await self._plan_order(items, adopted, {v.binding.name: v.binding for v in viewed})
            holders = await self._gpu_holders([v for v in viewed if v.name not in adopted], records)

            async def first(item: Launchable, view: Launchable, record: ServerState | None) -> StartOutcome:
                if item.name in adopted:
                    return adopted[item.name]
                if queue is not None and queue.waits.get(item.name):
                    return StartOutcome(
                        item.name,
                        Action.QUEUED,
                        waits_for=tuple(queue.waits_for(item.name)),
                        item=item,
                        message=f"starts after {', '.join(queue.waits_for(item.name))} (same GPU) settle",
                    )
                return await launch_server(
                    view, self.store, self.name, previous=record, port_checked=True
                )  # _refuse_held_ports

            started = await asyncio.gather(*(first(i, v, r) for i, v, r in zip(items, viewed, records, strict=True)))
        outcomes = [dataclasses.replace(o, queue=queue, gpu_holders=tuple(holders.get(o.name, ()))) for o in started]
        for outcome in outcomes:
            if queue is not None and outcome.action in (Action.LAUNCHED, Action.ADOPTED):
                queue.mark_launched(outcome.name, outcome.record)
            elif queue is not None and outcome.action != Action.QUEUED:
                queue.mark_done(outcome.name, "not launched")
        return {o.name: o for o in outcomes}

    async def _gpu_holders(
        self, items: list[Launchable], records: Iterable[ServerState | None]
    ) -> dict[str, list[str]]:
        """Per server about to launch: the processes outside this fleet that hold memory on the
        GPUs it may use (gpu_holders.py), asked once per host (over SSH: answered by the batch)."""
        if not items:
            return {}
        bindings = {i.binding.name: i.binding for i in items}
        apps = dict(zip(bindings, await asyncio.gather(*(host_gpu_apps(b) for b in bindings.values())), strict=True))
        out = {}
        for item in items:
            pgids = self._fleet_pgids(item.server.host, records)
            out[item.name] = holder_notes(apps, pgids, visible_gpus(item.server, item.binding.env), item.binding.name)
        return out

    def _fleet_pgids(self, host: str, records: Iterable[ServerState | None] = ()) -> set[int]:
        """The process groups of this fleet's servers on ``host``: every recorded one, and ``records``
        (launches not recorded yet)."""
        known = [r for r in records if r is not None]
        known += [r for r in (self.store.load(n) for n in self.store.names()) if r is not None]
        return {r.pgid for r in known if r.host == host}

    async def _holders_at_failure(self, record: ServerState, binding: HostBinding) -> list[str]:
        """At a memory failure: the processes outside the fleet on the server's GPUs now, asked
        again (the failed server's own group is the fleet's). [] when the host cannot say: the
        caller falls back to those listed before the launch."""
        try:
            apps = await host_gpu_apps(binding, fresh=True)
        except HostUnreachable:
            return []
        pgids = self._fleet_pgids(record.host, [record])
        gpus = visible_gpus(self.spec.server(record.name), binding.env) if record.name in self.spec.names else None
        return holder_notes({binding.name: apps}, pgids, gpus, binding.name)

    async def _plan_order(
        self, items: list[Launchable], adopted: dict[str, StartOutcome], views: dict[str, HostBinding] | None = None
    ) -> StartQueue | None:
        """Who waits for whom among servers sharing a GPU (None: ``start_shared_gpu = "together"``).
        ``views``: the hosts as the adopt-check batch saw them (it answers the GPU question)."""
        if self.spec.start_shared_gpu != "ordered":
            return None
        batch = [i.name for i in items]
        order = {n: k for k, n in enumerate(self.spec.names)}
        waits: dict[str, list[Sibling]] = {}
        gpu_hosts: dict[str, bool] = {}
        starting: dict[str, ServerState | None] = {}  # servers outside this call: the record of one still starting

        async def gpu_host(binding: HostBinding) -> bool:  # asked only for servers without `gpus`
            if binding.name not in gpu_hosts:
                gpu_hosts[binding.name] = await host_has_gpus((views or {}).get(binding.name, binding))
            return gpu_hosts[binding.name]

        async def still_starting(name: str, binding: HostBinding) -> ServerState | None:
            if name not in starting:
                record = await load_record(self.store, binding, name)
                live = record is not None and not settled_before(record) and await owns_group(binding, record)
                starting[name] = record if live else None
            return starting[name]

        for item in items:
            if item.name in adopted:
                continue
            siblings = []
            for other in self.spec.servers:
                if other.name == item.name or other.host != item.server.host:
                    continue
                binding = self.binding(other.host)
                unrestricted = (
                    visible_gpus(item.server, item.binding.env) is None or visible_gpus(other, binding.env) is None
                )
                on_gpu_host = await gpu_host(binding) if unrestricted else False
                if not shares_gpu(item.server, other, item.binding.env, binding.env, gpu_host=on_gpu_host):
                    continue
                profile = get_engine(other.engine)
                if other.name in adopted:  # running already: wait only while it is still starting
                    record = adopted[other.name].record
                    if record is not None and not settled_before(record):
                        siblings.append(Sibling(other.name, binding, profile, in_batch=True, record=record))
                elif other.name in batch:
                    if order[other.name] < order[item.name]:
                        siblings.append(Sibling(other.name, binding, profile, in_batch=True))
                else:  # not started by this call: a `restart`, or `up --only`, while it loads
                    record = await still_starting(other.name, binding)
                    if record is not None:
                        siblings.append(
                            Sibling(other.name, binding, get_engine(record.engine), in_batch=False, record=record)
                        )
            if siblings:
                waits[item.name] = siblings
        return StartQueue(self.store, waits, batch)

    async def _take_turn(
        self, outcome: StartOutcome, *, timeout_s: float, waited: bool, on_update: UpdateCallback | None
    ) -> StartOutcome:
        """Launch a QUEUED server once the siblings it waits for have settled; the new outcome is
        the launch's (or an adoption's, when another process launched it meanwhile)."""
        queue, item = outcome.queue, outcome.item
        assert isinstance(queue, StartQueue) and item is not None
        if on_update:
            on_update(outcome.name, Verdict(state=State.LAUNCHING, message=outcome.message))
        settled = await queue.wait_turn(outcome.name, timeout_s, siblings_waited=waited)
        async with self.store.lock():
            record = await load_record(self.store, item.binding, item.name)
            new = await adopt_running(item, record) or await launch_server(
                item, self.store, self.name, previous=record, started_after=[s.to_json() for s in settled]
            )
        after = "after " + ", ".join(s.describe() for s in settled)
        turned = dataclasses.replace(
            outcome,
            action=new.action,
            record=new.record,
            verdict=new.verdict,
            spec_changed=new.spec_changed,
            log_line_no=new.log_line_no,
            started_after=tuple(settled),
            message=f"{new.message}; {after}" if new.message else after,
        )
        if new.action in (Action.LAUNCHED, Action.ADOPTED):
            queue.mark_launched(outcome.name, new.record)
            if on_update:
                on_update(outcome.name, Verdict(state=State.LAUNCHING, message=f"{new.action.value} {turned.message}"))
        else:
            queue.mark_done(outcome.name, "not launched")
        return turned

    async def launch_queued(self, outcomes: dict[str, StartOutcome], *, timeout_s: float | None = None) -> None:
        """``up --no-wait``: launch every QUEUED server when its turn comes, without waiting for
        readiness (a sibling's turn then ends at its memory line, its exit or ``timeout_s``)."""
        timeout_s = self.spec.timeout if timeout_s is None else timeout_s
        queued = [o for o in outcomes.values() if o.action == Action.QUEUED]
        for turned in await asyncio.gather(
            *(self._take_turn(o, timeout_s=timeout_s, waited=False, on_update=None) for o in queued)
        ):
            outcomes[turned.name] = turned

    async def wait(
        self,
        outcomes: dict[str, StartOutcome],
        *,
        timeout_s: float | None = None,
        stall_s: float | None = None,
        smoke: bool | None = None,
        on_update: UpdateCallback | None = None,
        keep_failed: bool = False,
        grace_s: float = 15.0,
    ) -> dict[str, Verdict]:
        """Wait for every started server in parallel (launching QUEUED ones in their turn); record
        each verdict in its state file. A server found failed is stopped (its whole process
        group) unless ``keep_failed``. Each server's final outcome (its turn's launch, and
        ``after_failure``: what was done with a failed one) replaces its entry in ``outcomes``."""
        timeout_s = self.spec.timeout if timeout_s is None else timeout_s
        stall_s = self.spec.stall if stall_s is None else stall_s
        smoke = self.spec.smoke if smoke is None else smoke

        async def one(outcome: StartOutcome) -> Verdict:
            queue = outcome.queue
            final, detail = "not launched", None
            try:
                if outcome.action == Action.QUEUED:
                    outcome = outcomes[outcome.name] = await self._take_turn(
                        outcome, timeout_s=timeout_s, waited=True, on_update=on_update
                    )
                if outcome.verdict is not None or outcome.record is None:
                    verdict = outcome.verdict or Verdict(state=State.FAILED, message=outcome.message)
                    if on_update:
                        on_update(outcome.name, verdict)
                    return verdict
                record = outcome.record
                binding = self.binding(record.host)
                base_url = await binding.host.url_for(record.port, record.bind)
                last = record.last_verdict or {}
                # Proven ready before: liveness, probe and identity re-check it; the log (possibly
                # gigabytes of request lines by now) is not re-read, and the recorded capacity is kept.
                follow = not (outcome.action == Action.ADOPTED and last.get("state") == State.READY.value)
                # Just launched: the launch counted the log's lines up to this attempt (no re-read).
                launched_now = outcome.log_line_no if outcome.action == Action.LAUNCHED else None
                target = self._target(record, binding, base_url, follow_log=follow, first_line_no=launched_now)
                callback = (lambda v: on_update(record.name, v)) if on_update else None
                verdict = await wait_for_server(
                    target, timeout_s=timeout_s, stall_s=stall_s, smoke=smoke, on_update=callback
                )
                if last.get("capacity"):
                    verdict = verdict.model_copy(
                        update={"capacity": verdict.capacity.merge(Capacity(**last["capacity"]))}
                    )
                if verdict.state == State.READY:
                    launched = await launch_capacity(record, binding)
                    verdict = verdict.model_copy(update={"capacity": verdict.capacity.merge(launched)})
                if verdict.state == State.FAILED and verdict.category == Category.GPU_OOM:
                    named = "; ".join(await self._holders_at_failure(record, binding) or outcome.gpu_holders)
                    if named:
                        verdict = verdict.model_copy(
                            update={"message": f"{verdict.message}; {named}" if verdict.message else named}
                        )
                after_failure = None
                if verdict.state == State.FAILED:
                    after_failure = await self._after_failure(record, binding, keep_failed, grace_s)
                    outcomes[outcome.name] = dataclasses.replace(outcome, after_failure=after_failure)
                await self._remember(record, binding, verdict, after_failure)
                final, detail = verdict.state.value, after_failure
                return verdict
            finally:
                if isinstance(queue, StartQueue):
                    queue.mark_done(outcome.name, final, detail)  # after a failed one was stopped

        verdicts = await asyncio.gather(*(one(o) for o in list(outcomes.values())))
        return dict(zip(outcomes, verdicts, strict=True))

    async def _after_failure(
        self, record: ServerState, binding: HostBinding, keep_failed: bool, grace_s: float
    ) -> str:
        """Stop a server ``up`` found failed (a failed server may keep its port, its GPU memory and
        a half-working API: `status` would call it ready), unless the user keeps it to look at."""
        if keep_failed:
            return "kept running (--keep-failed)"
        result = await stop_server(record, binding, grace_s)
        if not result.was_running:
            return "exited"
        if "still running" in result.message:
            return f"could not be stopped: {result.message}"
        return "stopped"

    async def _remember(
        self, record: ServerState, binding: HostBinding, verdict: Verdict, after_failure: str | None = None
    ) -> None:
        current = self.store.load(record.name)
        if current is None or current.pgid != record.pgid:
            return  # stopped (or relaunched by someone else) while we waited
        now = utcnow()
        update: dict = {"last_verdict": verdict.to_json(), "verdict_at": now, "after_failure": after_failure}
        if verdict.state == State.READY and current.ready_at is None:
            update["ready_at"] = now
        await save_record(self.store, binding, current.model_copy(update=update))

    async def up(
        self,
        names: Iterable[str] | None = None,
        *,
        timeout_s: float | None = None,
        stall_s: float | None = None,
        smoke: bool | None = None,
        wait: bool = True,
        on_update: UpdateCallback | None = None,
        keep_failed: bool = False,
        grace_s: float = 15.0,
    ) -> dict[str, Verdict]:
        """Start (or adopt) the servers and wait until each is ready, failed or stalled (a failed
        one is stopped unless ``keep_failed``). ``wait=False``: return once all are launched."""
        outcomes = await self.start(names)
        if not wait:
            await self.launch_queued(outcomes, timeout_s=timeout_s)
            launching = Verdict(state=State.LAUNCHING)
            return {n: (o.verdict or launching) for n, o in outcomes.items()}
        return await self.wait(
            outcomes,
            timeout_s=timeout_s,
            stall_s=stall_s,
            smoke=smoke,
            on_update=on_update,
            keep_failed=keep_failed,
            grace_s=grace_s,
        )

    # ---- down / restart -------------------------------------------------------------------------
    def recorded_names(self) -> list[str]:
        """Servers of the fleet file, then servers that only have a record (removed from the file)."""
        names = list(self.spec.names)
        names += [n for n in self.store.names() if n not in names]
        return names

    async def down(
        self,
        names: Iterable[str] | None = None,
        *,
        grace_s: float = 15.0,
        by_user: str | None = None,
        keep: bool = False,
    ) -> dict[str, StopResult]:
        """Stop servers (all with a record when ``names`` is empty) and remove their records.
        ``by_user`` ("down", "drain"): the user's command; each server gets a stop mark first, so
        that a running job neither counts the stop as an outage nor restarts it (``keep``: mark
        only, the server is left running)."""
        wanted = list(dict.fromkeys(names)) if names else self.recorded_names()
        for name in wanted:
            if name not in self.spec.names and self.store.load(name) is None:
                self.spec.server(name)  # unknown everywhere: ConfigError listing the servers

        async def one(name: str) -> StopResult:
            record = await self.record(name)
            if record is None:
                return await self._not_launched(name)
            binding = self.binding(record.host)
            result = await stop_server(record, binding, grace_s)
            if result.ok:
                self.store.remove(name)
                if binding.remote_state:
                    await binding.host.remove(binding.state_path(name))
                await binding.host.remove(record.status_path)
            return result

        async with self.store.lock():
            if by_user is not None:  # before any signal: a job seeing the failures finds the mark
                for name in wanted:
                    self.store.mark_stopped(StopMark(name=name, command=by_user, at=utcnow(), keep=keep))
                if keep:
                    return {
                        n: StopResult(n, was_running=True, message="left running (--keep); no job sends to it")
                        for n in wanted
                    }
            results = await asyncio.gather(*(one(n) for n in wanted))
        return dict(zip(wanted, results, strict=True))

    async def _not_launched(self, name: str) -> StopResult:
        """`down` of a server with no record: nothing to stop, but its port is not called free while
        another process holds it (after `up` refused it, say)."""
        result = StopResult(name, was_running=False, message="not launched")
        if name not in self.spec.names:
            return result
        server = self.spec.server(name)
        holder = await self.binding(server.host).host.port_holder(server.port)
        if holder is not None:
            result.port_free, result.port_holder_pid = False, holder.pid
            result.message = (
                f"not launched; its port {server.port} is held by another process (pid {holder.pid}), not signalled"
            )
        return result

    async def restart(
        self,
        name: str,
        *,
        grace_s: float = 15.0,
        timeout_s: float | None = None,
        stall_s: float | None = None,
        smoke: bool | None = None,
        on_update: UpdateCallback | None = None,
        keep_failed: bool = False,
        honour_stops: bool = False,
    ) -> Verdict:
        """Stop one server (if running) and start it again with the current fleet file; wait. It
        starts after any sibling on its GPU that is still starting (start_order.py).
        ``honour_stops``: a job's restart; a server the user stopped stays stopped (FAILED verdict)."""
        if honour_stops and (mark := self.store.stop_mark(name)) is not None:  # drain --keep: not even stopped
            return Verdict(state=State.FAILED, message=mark.describe())
        relaunch = await self.relaunch(name, grace_s=grace_s, honour_stops=honour_stops)
        if relaunch.failure is not None:
            return Verdict(state=State.FAILED, message=relaunch.failure)
        verdicts = await self.wait(
            relaunch.outcomes,
            timeout_s=timeout_s,
            stall_s=stall_s,
            smoke=smoke,
            on_update=on_update,
            keep_failed=keep_failed,
            grace_s=grace_s,
        )
        return verdicts[name]

    async def relaunch(self, name: str, *, grace_s: float = 15.0, honour_stops: bool = False) -> Relaunch:
        """The first half of ``restart``: stop one server (if running) and start it again with the
        current fleet file, without waiting (``wait`` does; ``servefleet restart`` shows it live)."""
        self.resolve([name])  # a broken fleet file must not stop a running server
        stopped = (await self.down([name], grace_s=grace_s))[name]
        if not stopped.ok:
            return Relaunch(stopped, {})
        return Relaunch(stopped, await self.start([name], honour_stops=honour_stops))

    # ---- status ---------------------------------------------------------------------------------
    async def status(self, names: Iterable[str] | None = None) -> list[ServerStatus]:
        """Every wanted server's status; one remote command per SSH host (see fleet_status)."""
        return await fleet_status(self, names)

    # ---- logs -----------------------------------------------------------------------------------
    async def log_location(self, name: str) -> tuple[HostBinding, str]:
        """The host and path of a server's log (from its record, else where `up` would put it)."""
        record = await self.record(name)
        if record is not None:
            return self.binding(record.host), record.log_path
        binding = self.binding(self.spec.server(name).host)
        return binding, binding.log_path(name)

    async def tail(self, name: str, n: int = 50) -> tuple[str, list[str], int]:
        """(log path, its last ``n`` lines, its size). FileNotFoundError when there is no log."""
        binding, path = await self.log_location(name)
        lines, size = await tail_lines(binding.host, path, n)
        return path, lines, size

    async def follow(self, name: str, offset: int) -> AsyncIterator[str]:
        """Lines appended to a server's log from ``offset`` on (never ends by itself)."""
        binding, path = await self.log_location(name)
        async for line in follow_lines(binding.host, path, offset):
            yield line

    async def retiring(self) -> set[str]:
        """Servers whose host announced their end (a Slurm job's advance notice before its time
        limit, sbatch ``--signal=B:USR1@N``): generate drains them and restarts them first."""
        names = set()
        for name in self.spec.names:
            record = self.store.load(name)
            if record is None:
                continue
            scheduler = scheduler_of(self.binding(record.host).host)
            if scheduler is not None and await scheduler.noticed(record.pgid, record.status_path):
                names.add(name)
        return names

    async def ready_endpoints(self) -> list[Endpoint]:
        """Servers that are ready right now (alive, ours, answering their probe)."""
        endpoints = []
        for st in await self.status(self.spec.names):
            if st.state == Liveness.READY and st.base_url:
                endpoints.append(Endpoint(st.name, st.base_url, st.served_model, st.capacity, st.engine or ""))
        return endpoints


async def _refuse_held_ports(
    viewed: list[Launchable], records: list[ServerState | None], adopted: dict[str, StartOutcome]
) -> dict[str, StartOutcome] | None:
    """Every server to launch whose port another process holds, asked before any launch: if one is,
    none is launched (the held ones say who holds the port; the rest, why they waited), adopted ones
    stay adopted. None when every port is free."""
    todo = [(v, r) for v, r in zip(viewed, records, strict=True) if v.name not in adopted]
    holders = await asyncio.gather(
        *(ask(v.binding.host, questions.port(v.server.port)) for v, _ in todo)
    )  # from the adopt checks' batch
    held = {v.name: (v, r, h) for (v, r), h in zip(todo, holders, strict=True) if h is not None}
    if not held:
        return None
    out: dict[str, StartOutcome] = {}
    for v in viewed:
        if v.name in adopted:
            out[v.name] = adopted[v.name]
        elif v.name in held:
            item, record, holder = held[v.name]
            out[v.name] = await port_blocked(item, holder, record)
        else:
            out[v.name] = held_elsewhere(v, list(held))
    return out
