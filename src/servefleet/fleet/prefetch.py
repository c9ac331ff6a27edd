"""A fleet's status (and ``up``'s adopt checks) in one remote command per host.

``server_status`` (status.py) and ``start_server`` (lifecycle.py) ask their host a handful of small
questions per server: is the group alive, whose command line is it, what did the wrapper record,
who holds the port. Over SSH each is a round trip. Here every question about every server of a
host is asked up front in one batch (``SSHHost.batch``, hosts/ssh_batch.py), and the per-server
code then runs unchanged against a ``PrefetchedHost`` that answers from the batch: the same
answers, in one round trip per host instead of three or more per server. Hosts that cannot batch
(the local host) are asked as before.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Iterable, Sequence
from typing import Any

from servefleet.engines.registry import get_engine
from servefleet.errors import ConfigError, EngineError, HostUnreachable
from servefleet.fleet import start_order
from servefleet.fleet.hosts import HostBinding
from servefleet.fleet.lifecycle import Launchable, load_record, resolve_launch
from servefleet.fleet.spec import LOCAL
from servefleet.fleet.state import ServerState, StateStore
from servefleet.fleet.status import DIAGNOSE_LIMIT, STALL_TAIL, ServerStatus, not_launched, read_tail, reports_serving_stats, server_status
from servefleet.hosts.base import cmdline_owns
from servefleet.hosts.capabilities import batching_of, connecting_of
from servefleet.http import probe_client

log = logging.getLogger(__name__)

__all__ = ["PrefetchedHost", "prefetch_questions", "fleet_status", "prefetched_launchables"]




class PrefetchedHost:
    """A Host seen through answers fetched in advance (``host.batch``): ``group_alive``,
    ``read_bytes``, ``file_size`` and ``port_holder`` return the prefetched answer for exactly
    the question asked, anything else goes to the host. The per-server code above runs
    unchanged, so a batched status says exactly what the one-question-at-a-time status says.
    ``once``: each answer serves one call (for callers that later change what they asked about)."""

    def __init__(self, host: Any, *, once: bool = False) -> None:
        self.host = host
        self.once = once
        self.answers: dict[tuple[Any, ...], Any] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.host, name)

    async def prefetch(self, ops: Sequence[tuple[Any, ...]]) -> None:
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
            log.warning("batched remote query of %d questions failed (%s: %s); asking one by one",
                        len(ops), type(exc).__name__, exc)
            return

    def _take(self, key: tuple[Any, ...]) -> tuple[bool, Any]:
        if key not in self.answers:
            return False, None
        return True, (self.answers.pop(key) if self.once else self.answers[key])

    async def group_alive(self, pgid: int) -> bool:
        found, value = self._take(("alive", int(pgid)))
        return value if found else await self.host.group_alive(pgid)

    async def read_bytes(self, path: str, offset: int = 0, limit: int | None = None) -> bytes:
        found, value = self._take(("read", path, int(offset), limit))
        if not found:
            return await self.host.read_bytes(path, offset, limit)
        if value is None:
            raise FileNotFoundError(path)
        return value

    async def owns(self, group: int, marker: str) -> bool | None:
        found, value = self._take(("cmdline", int(group)))
        return cmdline_owns(value, marker) if found else await self.host.owns(group, marker)

    async def file_size(self, path: str) -> int | None:
        found, value = self._take(("size", path))
        return value if found else await self.host.file_size(path)

    async def read_tail(self, path: str, offset: int, limit: int) -> tuple[int, bytes] | None:
        """status.read_tail, answered from the batch when it was asked there."""
        found, value = self._take(("tail", path, int(offset), int(limit)))
        return value if found else await read_tail(self.host, path, offset, limit)

    def prefetched_exists(self, paths: Sequence[str]) -> bool | None:
        """Whether any of ``paths`` exists, when the batch was asked about every one (else None)."""
        found = [self._take(("exists", p)) for p in paths]
        if not all(known for known, _ in found):
            return None
        return any(value for _, value in found)

    def prefetched_gpu_apps(self) -> str | None:
        """The GPU-process report of hosts/gpu_apps.py when the batch was asked for it (else None)."""
        found, value = self._take(("gpu_apps",))
        return value.decode(errors="replace") if found and value is not None else None

    async def port_holder(self, port: int) -> Any:
        found, value = self._take(("port", int(port)))
        return value if found else await self.host.port_holder(port)


def prefetch_questions(record: ServerState) -> list[tuple[Any, ...]]:
    """Everything ``server_status`` may ask the host about ``record`` (the log only when the
    group is gone: a live server's log is read only if its probe does not answer)."""
    return [
        ("alive", record.pgid),
        ("cmdline", record.pgid),
        ("read", record.status_path, 0, None),
        ("port", record.port),
        ("read_if_dead", record.pgid, record.log_path, record.log_offset, DIAGNOSE_LIMIT),
    ] + ([("tail", record.log_path, record.log_offset, STALL_TAIL)] if _reports_stats(record.engine) else [])


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
    questions: dict[str, list[tuple[Any, ...]]] = {}
    for record in local.values():
        if record is not None:
            questions.setdefault(record.host, []).extend(prefetch_questions(record))
    for name, record in local.items():
        if record is None and name in spec.names:
            binding = await connected(lookup_host(name))
            asks = questions.setdefault(binding.name, [])
            if binding.remote_state:
                asks.append(("read", binding.state_path(name), 0, None))
            asks.append(("size", binding.log_path(name)))
    await _prefetch_all({h: (await connected(h), q) for h, q in questions.items()})

    # Round 2: rediscovered records (only when some were found on a host).
    records = {name: await load_record(store, view(lookup_host(name)), name) for name in wanted}
    later: dict[str, list[tuple[Any, ...]]] = {}
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
                exists = await binding.host.file_size(log) is not None
                return not_launched(name, server.engine, server.host, server.port, log if exists else None)
            binding = view(record.host)
            changed = False
            if server is not None:
                try:
                    changed = resolve_launch(server, fleet.binding(server.host), fleet.label).digest != record.spec_hash
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
    first: dict[str, list[tuple[Any, ...]]] = {}
    later: dict[str, list[tuple[Any, ...]]] = {}
    local = {item.name: store.load(item.name) for item in items}
    for item in items:
        if item.binding.name not in views:
            continue
        asks = first.setdefault(item.binding.name, [])
        if not asks:  # start ordering asks whether the host has GPUs, up who holds them: in the same batch
            asks += [("exists", device) for device in start_order.GPU_DEVICES]
            asks.append(("gpu_apps",))
        asks.append(("port", item.server.port))
        record = local[item.name]
        if record is not None:
            asks += [("alive", record.pgid), ("cmdline", record.pgid)]
        elif bindings[item.binding.name].remote_state:
            asks.append(("read", bindings[item.binding.name].state_path(item.name), 0, None))
    await asyncio.gather(*(views[h].prefetch(ops) for h, ops in first.items()))
    for item in items:
        if item.binding.name in views and local[item.name] is None:
            # the remote record (left in the answers: load_record reads it from there)
            raw = views[item.binding.name].answers.get(("read", bindings[item.binding.name].state_path(item.name), 0, None))
            if raw is not None:
                try:
                    pgid = int(ServerState.model_validate_json(raw).pgid)
                except Exception:
                    continue
                later.setdefault(item.binding.name, []).extend([("alive", pgid), ("cmdline", pgid)])
    await asyncio.gather(*(views[h].prefetch(ops) for h, ops in later.items()))
    return [dataclasses.replace(item, binding=bindings[item.binding.name]) if item.binding.name in bindings else item for item in items]


async def _prefetch_all(work: dict[str, tuple[HostBinding, list[tuple[Any, ...]]]]) -> None:
    await asyncio.gather(*(_prefetched(binding).prefetch(ops) for binding, ops in work.values()))


def _prefetched(binding: HostBinding) -> PrefetchedHost:
    """The binding's host, which the views above always wrap in a PrefetchedHost."""
    if not isinstance(binding.host, PrefetchedHost):
        raise TypeError(f"host binding {binding.name!r} is not a prefetched view")
    return binding.host
