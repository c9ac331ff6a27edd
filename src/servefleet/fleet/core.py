"""The ``Fleet``: the async library API that ``up``/``down``/``status``/``restart`` and the jobs
(``generate``, ``bench``) share.

    async with Fleet.load("fleet.toml") as fleet:
        verdicts = await fleet.up()                    # {name: Verdict}, all waited in parallel
        for ep in await fleet.ready_endpoints():       # [Endpoint(name, base_url, served_model, capacity)]
            ...
        await fleet.restart("plain")                   # -> Verdict
        await fleet.down()                             # {name: StopResult}

Every call works from the state files and the servers themselves, never from memory, so another
process may run ``status`` or ``down`` at any time.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from servefleet.capacity import Capacity
from servefleet.catalog import State
from servefleet.engines.base import Probe
from servefleet.engines.registry import get_engine
from servefleet.errors import ConfigError
from servefleet.fleet.hosts import HostBinding, HostPool
from servefleet.fleet.lifecycle import (
    Action,
    Launchable,
    StartOutcome,
    StopResult,
    load_record,
    resolve_launch,
    save_record,
    start_server,
    stop_server,
)
from servefleet.fleet.logs import follow_lines, tail_lines
from servefleet.fleet.loader import load_fleet_file
from servefleet.fleet.spec import LOCAL, FleetSpec
from servefleet.fleet.state import ServerState, StateStore, utcnow
from servefleet.fleet.prefetch import fleet_status, prefetched_launchables
from servefleet.fleet.status import Liveness, ServerStatus
from servefleet.verify.verdict import Verdict
from servefleet.verify.waiter import WaitTarget, wait_for_server

__all__ = ["Fleet", "Endpoint", "UpdateCallback", "find_fleet_file", "DEFAULT_FLEET_FILE"]

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
        self.hosts = HostPool(spec)

    # ---- construction ---------------------------------------------------------------------------
    @classmethod
    def load(cls, path: str | Path) -> "Fleet":
        return cls(load_fleet_file(path))

    @classmethod
    def discover(cls, given: str | Path | None = None, cwd: Path | None = None) -> "Fleet":
        return cls.load(find_fleet_file(given, cwd))

    async def __aenter__(self) -> "Fleet":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close host connections (servers keep running)."""
        await self.hosts.close()

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

    def _target(self, record: ServerState, binding: HostBinding, base_url: str, follow_log: bool = True) -> WaitTarget:
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
        )

    # ---- up -------------------------------------------------------------------------------------
    def resolve(self, names: Iterable[str] | None = None) -> list[Launchable]:
        """Resolve every selected server (argv, env, host) before anything is launched, so a
        configuration error stops ``up`` with nothing half-started."""
        return [resolve_launch(self.spec.server(n), self.binding(self.spec.server(n).host), self.label) for n in self._select(names)]

    async def start(self, names: Iterable[str] | None = None) -> dict[str, StartOutcome]:
        """Adopt, refuse (port taken) or launch each server; do not wait for readiness."""
        items = self.resolve(names)
        async with self.store.lock():
            self.store.write_index(self.name, self.spec.path)
            items = await prefetched_launchables(items, self.store)  # the adopt checks: one command per host
            outcomes = await asyncio.gather(*(start_server(item, self.store, self.name) for item in items))
        return {o.name: o for o in outcomes}

    async def wait(
        self,
        outcomes: dict[str, StartOutcome],
        *,
        timeout_s: float | None = None,
        stall_s: float | None = None,
        smoke: bool | None = None,
        on_update: UpdateCallback | None = None,
    ) -> dict[str, Verdict]:
        """Wait for every started server in parallel; record each verdict in its state file."""
        timeout_s = self.spec.timeout if timeout_s is None else timeout_s
        stall_s = self.spec.stall if stall_s is None else stall_s
        smoke = self.spec.smoke if smoke is None else smoke

        async def one(outcome: StartOutcome) -> Verdict:
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
            target = self._target(record, binding, base_url, follow_log=follow)
            callback = (lambda v: on_update(record.name, v)) if on_update else None
            verdict = await wait_for_server(target, timeout_s=timeout_s, stall_s=stall_s, smoke=smoke, on_update=callback)
            if last.get("capacity"):
                verdict = verdict.model_copy(update={"capacity": verdict.capacity.merge(Capacity(**last["capacity"]))})
            await self._remember(record, binding, verdict)
            return verdict

        verdicts = await asyncio.gather(*(one(o) for o in outcomes.values()))
        return dict(zip(outcomes, verdicts, strict=True))

    async def _remember(self, record: ServerState, binding: HostBinding, verdict: Verdict) -> None:
        current = self.store.load(record.name)
        if current is None or current.pgid != record.pgid:
            return  # stopped (or relaunched by someone else) while we waited
        now = utcnow()
        update: dict = {"last_verdict": verdict.to_json(), "verdict_at": now}
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
    ) -> dict[str, Verdict]:
        """Start (or adopt) the servers and wait until each is ready, failed or stalled."""
        outcomes = await self.start(names)
        if not wait:
            launching = Verdict(state=State.LAUNCHING)
            return {n: (o.verdict or launching) for n, o in outcomes.items()}
        return await self.wait(outcomes, timeout_s=timeout_s, stall_s=stall_s, smoke=smoke, on_update=on_update)

    # ---- down / restart -------------------------------------------------------------------------
    def recorded_names(self) -> list[str]:
        """Servers of the fleet file, then servers that only have a record (removed from the file)."""
        names = list(self.spec.names)
        names += [n for n in self.store.names() if n not in names]
        return names

    async def down(self, names: Iterable[str] | None = None, *, grace_s: float = 15.0) -> dict[str, StopResult]:
        """Stop servers (all with a record when ``names`` is empty) and remove their records."""
        wanted = list(dict.fromkeys(names)) if names else self.recorded_names()
        for name in wanted:
            if name not in self.spec.names and self.store.load(name) is None:
                self.spec.server(name)  # unknown everywhere: ConfigError listing the servers

        async def one(name: str) -> StopResult:
            record = await self.record(name)
            if record is None:
                return StopResult(name, was_running=False, message="not launched")
            binding = self.binding(record.host)
            result = await stop_server(record, binding, grace_s)
            if result.ok:
                self.store.remove(name)
                if binding.remote_state:
                    await binding.host.remove(binding.state_path(name))
                await binding.host.remove(record.status_path)
            return result

        async with self.store.lock():
            results = await asyncio.gather(*(one(n) for n in wanted))
        return dict(zip(wanted, results, strict=True))

    async def restart(
        self,
        name: str,
        *,
        grace_s: float = 15.0,
        timeout_s: float | None = None,
        stall_s: float | None = None,
        smoke: bool | None = None,
        on_update: UpdateCallback | None = None,
    ) -> Verdict:
        """Stop one server (if running) and start it again with the current fleet file; wait."""
        self.resolve([name])  # a broken fleet file must not stop a running server
        stopped = (await self.down([name], grace_s=grace_s))[name]
        if not stopped.ok:
            return Verdict(state=State.FAILED, message=f"could not stop {name}: {stopped.message}")
        verdicts = await self.up([name], timeout_s=timeout_s, stall_s=stall_s, smoke=smoke, on_update=on_update)
        return verdicts[name]

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

    async def ready_endpoints(self) -> list[Endpoint]:
        """Servers that are ready right now (alive, ours, answering their probe)."""
        endpoints = []
        for st in await self.status(self.spec.names):
            if st.state == Liveness.READY and st.base_url:
                endpoints.append(Endpoint(st.name, st.base_url, st.served_model, st.capacity, st.engine or ""))
        return endpoints
