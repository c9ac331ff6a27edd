"""A fleet's status (and ``up``'s adopt checks) in one remote command per host.

``server_status`` (status.py) and ``start_server`` (lifecycle.py) ask their host a handful of small
questions per server: is the group alive, whose command line is it, what did the wrapper record,
who holds the port. Over SSH each is a round trip. Here every question about every server of a
host is asked up front in one batch (``SSHHost.batch``, hosts/ssh_batch.py), and the per-server
code then runs unchanged against a ``PrefetchedHost`` that answers from the batch: the same
answers, in one round trip per host instead of three or more per server. Both sides build the
questions with the same functions (fleet/questions.py), and the per-server code asks them through
``hosts.questions.ask``. Hosts that cannot batch (the local host) are asked as before.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from servefleet.engines.registry import get_engine
from servefleet.errors import ConfigError, EngineError, HostUnreachable
from servefleet.fleet import questions, start_order
from servefleet.fleet.hosts import HostBinding
from servefleet.fleet.lifecycle import Launchable, load_record, resolve_launch
from servefleet.fleet.spec import LOCAL
from servefleet.fleet.state import ServerState, StateStore
from servefleet.fleet.status import ServerStatus, not_launched, reports_serving_stats, server_status
from servefleet.hosts.base import CommandResult, FilesThrough, Host, Launched, PidStatus, PortHolder
from servefleet.hosts.capabilities import batching_of, connecting_of
from servefleet.hosts.questions import Exists, GpuApps, Question, ask
from servefleet.http import probe_client

log = logging.getLogger(__name__)

__all__ = ["PrefetchedHost", "prefetch_questions", "fleet_status", "prefetched_launchables"]


class PrefetchedHost(FilesThrough):
    """A Host seen through answers fetched in advance (``host.batch``): the questions of
    hosts/questions.py asked through ``ask`` are answered from the batch (``Answering``); every
    ``Host`` method goes to the host itself, and nothing else does: an attribute ``Host`` does not
    declare is an AttributeError here, not a silent bypass of the batch. The host's optional
    capabilities are found behind the view by type (hosts/capabilities.py ``*_of`` unwrap
    ``inner``). ``once``: each answer serves one question (for callers that later change what
    they asked about). ``misses``: questions asked that the batch did not hold, once it was asked
    (each a round trip more: a mismatch between the two sides)."""

    def __init__(self, host: Host, *, once: bool = False) -> None:
        self.host = host
        self.files_host = host
        self.name = host.name
        self.once = once
        self.answers: dict[Question, Any] = {}
        self.misses: list[Question] = []
        self._batched = False

    @property
    def inner(self) -> Host:
        return self.host

    # -- the Host contract, passed through ---------------------------------------------------

    async def run(
        self, argv: Sequence[str], *, timeout: float | None = None, check: bool = True, input: bytes | None = None
    ) -> CommandResult:
        return await self.host.run(argv, timeout=timeout, check=check, input=input)

    async def spawn_detached(
        self,
        argv: Sequence[str],
        *,
        log_path: str,
        status_path: str,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> int:
        return await self.host.spawn_detached(argv, log_path=log_path, status_path=status_path, env=env, cwd=cwd)

    async def launch(
        self,
        argv: Sequence[str],
        *,
        log_path: str,
        status_path: str,
        marker: str,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> Launched:
        return await self.host.launch(
            argv, log_path=log_path, status_path=status_path, marker=marker, env=env, cwd=cwd
        )

    async def group_alive(self, pgid: int) -> bool:
        return await self.host.group_alive(pgid)

    async def owns(self, group: int, marker: str) -> bool | None:
        return await self.host.owns(group, marker)

    async def command_line(self, pid: int) -> str | None:
        return await self.host.command_line(pid)

    async def pid_status(self, pid: int) -> PidStatus:
        return await self.host.pid_status(pid)

    async def signal_group(self, pgid: int, signum: int) -> None:
        await self.host.signal_group(pgid, signum)

    async def port_holder(self, port: int) -> PortHolder | None:
        return await self.host.port_holder(port)

    async def url_for(self, port: int, bind_host: str = "127.0.0.1") -> str:
        return await self.host.url_for(port, bind_host)

    async def close(self) -> None:
        await self.host.close()

    # -- the batch ---------------------------------------------------------------------------

    async def prefetch(self, ops: Sequence[Question]) -> None:
        """Ask ``ops`` in one batch. A host that cannot batch, or a batch that fails for any
        reason but the link, leaves the questions to be asked one by one."""
        batching = batching_of(self.host)
        if batching is None or not ops:
            return
        try:
            self.answers.update(await batching.batch(list(dict.fromkeys(ops))))
        except HostUnreachable:
            raise
        except Exception as exc:
            log.warning(
                "batched remote query of %d questions failed (%s: %s); asking one by one",
                len(ops),
                type(exc).__name__,
                exc,
            )
            return
        self._batched = True

    def answer(self, question: Question) -> tuple[bool, Any]:
        if question not in self.answers:
            if self._batched and not self.once:
                self.misses.append(question)
            return False, None
        return True, (self.answers.pop(question) if self.once else self.answers[question])


def prefetch_questions(record: ServerState) -> list[Question]:
    """Everything ``server_status`` may ask the host about ``record`` (questions.status_questions)."""
    return questions.status_questions(record, reads_stats=_reports_stats(record.engine))


def _reports_stats(engine: str | None) -> bool:
    """A serving server's log end is read for its engine's statistics (status.serving_stall)."""
    try:
        return reports_serving_stats(get_engine(engine))
    except EngineError:
        return False


async def fleet_status(fleet: Any, names: Iterable[str] | None = None) -> list[ServerStatus]:
    """``Fleet.status``: every wanted server's status, with the questions about each host asked
    in one remote command per host (two when records must first be rediscovered from the remote
    state files). ``fleet`` is a ``Fleet`` (spec, store, binding(), label, recorded_names())."""
    spec, store = fleet.spec, fleet.store
    assert isinstance(store, StateStore)
    wanted = list(dict.fromkeys(names)) if names else fleet.recorded_names()
    for name in wanted:
        if name not in spec.names and store.load(name) is None:
            spec.server(name)  # unknown everywhere: ConfigError listing the servers

    views: dict[str, HostBinding] = {}

    def view(host: str) -> HostBinding:
        if host not in views:
            binding = fleet.binding(host)
            views[host] = dataclasses.replace(binding, host=PrefetchedHost(binding.host))
        return views[host]

    async def connected(host: str) -> HostBinding:
        binding = view(host)
        connecting = connecting_of(_prefetched(binding).host)
        if connecting is not None:
            await connecting.connect()  # "~" in the work folder becomes absolute: the batch keys are the paths asked
            binding.work_dir = fleet.binding(host).work_dir
        return binding

    def lookup_host(name: str) -> str:
        return spec.server(name).host if name in spec.names else LOCAL

    # Round 1: what the local records name, and the remote state file and log of every server
    # without a local record (rediscovery from a new machine; "not launched").
    local = {name: store.load(name) for name in wanted}
    first: dict[str, list[Question]] = {}
    for record in local.values():
        if record is not None:
            first.setdefault(record.host, []).extend(prefetch_questions(record))
    for name, record in local.items():
        if record is None and name in spec.names:
            binding = await connected(lookup_host(name))
            asks = first.setdefault(binding.name, [])
            if binding.remote_state:
                asks.append(questions.remote_record(binding, name))
            asks.append(questions.log_size(binding, name))
    await _prefetch_all({h: (await connected(h), q) for h, q in first.items()})

    # Round 2: rediscovered records (only when some were found on a host).
    records = {name: await load_record(store, view(lookup_host(name)), name) for name in wanted}
    later: dict[str, list[Question]] = {}
    for name, record in records.items():
        if record is not None and local[name] is None:
            later.setdefault(record.host, []).extend(prefetch_questions(record))
    await _prefetch_all({h: (await connected(h), q) for h, q in later.items()})

    async with probe_client(connections=100) as client:  # every server of the fleet at once

        async def one(name: str) -> ServerStatus:
            in_fleet = name in spec.names
            server = spec.server(name) if in_fleet else None
            record = records[name]
            if record is None:
                assert server is not None
                binding = view(server.host)
                log = binding.log_path(name)
                exists = await ask(binding.host, questions.log_size(binding, name)) is not None
                return not_launched(name, server.engine, server.host, server.port, log if exists else None)
            binding = view(record.host)
            changed = False
            if server is not None:
                try:
                    changed = (
                        resolve_launch(server, fleet.binding(server.host), fleet.label).digest != record.spec_hash
                    )
                except ConfigError:
                    changed = True
            return await server_status(record, binding, client, in_fleet=in_fleet, spec_changed=changed)

        return list(await asyncio.gather(*(one(n) for n in wanted)))


async def prefetched_launchables(items: Sequence[Launchable], store: StateStore) -> list[Launchable]:
    """``items`` whose hosts answer ``start_server``'s adopt check (record, liveness and
    identity of the recorded group, the port's holder) from one batch per host, asked before
    anything is launched. Each prefetched answer serves one call (``once``): what the launch
    itself asks afterwards (the new group, the log's size) always goes to the host."""
    views: dict[str, PrefetchedHost] = {}
    bindings: dict[str, HostBinding] = {}
    for item in items:
        name = item.binding.name
        if name not in views and batching_of(item.binding.host) is not None:
            views[name] = PrefetchedHost(item.binding.host, once=True)
            bindings[name] = dataclasses.replace(item.binding, host=views[name])
    if not views:
        return list(items)
    for view in views.values():
        if (connecting := connecting_of(view.host)) is not None:
            await connecting.connect()
    for name, binding in bindings.items():
        binding.work_dir = next(i.binding.work_dir for i in items if i.binding.name == name)
    first: dict[str, list[Question]] = {}
    later: dict[str, list[Question]] = {}
    local = {item.name: store.load(item.name) for item in items}
    for item in items:
        if item.binding.name not in views:
            continue
        asks = first.setdefault(item.binding.name, [])
        if not asks:  # start ordering asks whether the host has GPUs, up who holds them: in the same batch
            asks += [Exists(device) for device in start_order.GPU_DEVICES]
            asks.append(GpuApps())
        asks.append(questions.port(item.server.port))
        record = local[item.name]
        if record is not None:
            asks += questions.adopt_questions(record)
        elif bindings[item.binding.name].remote_state:
            asks.append(questions.remote_record(bindings[item.binding.name], item.name))
    await asyncio.gather(*(views[h].prefetch(ops) for h, ops in first.items()))
    for item in items:
        if item.binding.name in views and local[item.name] is None:
            # the remote record (left in the answers: load_record reads it from there)
            raw = views[item.binding.name].answers.get(questions.remote_record(bindings[item.binding.name], item.name))
            if raw is not None:
                try:
                    found = ServerState.model_validate_json(raw)
                except (
                    ValueError
                ):  # a damaged record (pydantic's ValidationError is a ValueError): nothing to ask about it
                    continue
                later.setdefault(item.binding.name, []).extend(questions.adopt_questions(found))
    await asyncio.gather(*(views[h].prefetch(ops) for h, ops in later.items()))
    return [
        dataclasses.replace(item, binding=bindings[item.binding.name]) if item.binding.name in bindings else item
        for item in items
    ]


async def _prefetch_all(work: dict[str, tuple[HostBinding, list[Question]]]) -> None:
    await asyncio.gather(*(_prefetched(binding).prefetch(ops) for binding, ops in work.values()))


def _prefetched(binding: HostBinding) -> PrefetchedHost:
    """The binding's host, which the views above always wrap in a PrefetchedHost."""
    if not isinstance(binding.host, PrefetchedHost):
        raise TypeError(f"host binding {binding.name!r} is not a prefetched view")
    return binding.host


if TYPE_CHECKING:
    _IS_A_HOST: type[Host] = PrefetchedHost  # checked by mypy: the view keeps the whole Host contract
