"""Servers that share a GPU start one after another: who waits for whom, and what lets them go.

Two vLLM (or SGLang) servers profiling GPU memory at the same moment see each other's
allocations: the second counts the first one's KV cache as its own and is left with almost
nothing (seen on an H200: 0.01 GiB of KV cache, ``gpu_oom``). So ``up`` and ``restart`` start the
servers of one host that share a GPU in fleet-file order, each once the one before has settled.

The rule (``[fleet] start_shared_gpu = "ordered"``, the default; ``"together"`` turns it off):

- Two servers share a GPU when they run on the same host and the GPUs they may use overlap: their
  ``gpus``, else a ``CUDA_VISIBLE_DEVICES`` set in ``env`` (host or server). A server restricted
  to none (``CUDA_VISIBLE_DEVICES = ""``) shares with no one. One not restricted at all may use any
  GPU of its host (the engine picks, usually GPU 0), so on a host with a GPU driver
  (``/dev/nvidiactl`` or ``/dev/kfd``) it shares with every server there; on a host without one
  (CPU builds) it shares with no one.
- A server waits for each server earlier in the fleet file that shares a GPU with it and is
  started by the same command, and for any other sharing server that is running but still
  starting (a ``restart`` or an ``up --only`` while a sibling loads).
- The wait for a sibling ends at the first of: its memory-settled line (each engine profile
  declares it, ``EngineProfile.memory_settled``: vLLM's "init engine (profile, create kv cache,
  warmup model) took", SGLang's "Capture cuda graph end"; engines without one: readiness), read
  only from the sibling's current launch (its ``log_offset``); its final verdict; its process group
  gone; or the timeout. A failed sibling is stopped before its verdict is final (unless
  ``--keep-failed``), so the next server starts once the failed one's memory is released rather
  than never (or beside a half-dead process holding the GPU).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from servefleet.catalog import State
from servefleet.engines.base import EngineProfile
from servefleet.fleet.hosts import HostBinding
from servefleet.fleet.spec import ServerSpec
from servefleet.fleet.state import ServerState, StateStore, utcnow
from servefleet.hosts.base import Truncated
from servefleet.hosts.capabilities import jobs_own_gpus
from servefleet.hosts.questions import Exists, answered
from servefleet.verify.logtext import match_text

__all__ = ["visible_gpus", "shares_gpu", "host_has_gpus", "settled_before", "Sibling", "Settled", "StartQueue"]

SETTLED_STATES = (State.READY.value, State.FAILED.value, State.STALLED.value)
ALIVE_INTERVAL_S = 0.25  # process-group liveness of a sibling not waited on by this call
REMOTE_ALIVE_INTERVAL_S = 2.0  # the same over SSH: a remote command each
RECORD_INTERVAL_S = 0.5  # a sibling's state record (its verdict, written by whoever waits on it)
_NO_DEVICE = ("-1", "NoDevFiles")
GPU_DEVICES = ("/dev/nvidiactl", "/dev/kfd")  # NVIDIA's and AMD ROCm's control devices
_ANY_EXISTS = 'for d in "$@"; do [ -e "$d" ] && exit 0; done; exit 1'


def visible_gpus(server: ServerSpec, host_env: Mapping[str, str]) -> frozenset[str] | None:
    """The GPUs a server may use (indices or UUIDs as given), or None when it is not restricted."""
    if server.gpus is not None:
        return frozenset(str(g) for g in server.gpus)
    value = {**host_env, **server.env}.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return None
    parts = [p.strip() for p in value.split(",") if p.strip()]
    if not parts or parts[0] in _NO_DEVICE:
        return frozenset()
    return frozenset(parts)


def shares_gpu(
    a: ServerSpec, b: ServerSpec, env_a: Mapping[str, str], env_b: Mapping[str, str], *, gpu_host: bool
) -> bool:
    """Whether two servers may use one GPU at the same time (see the module docstring);
    ``gpu_host``: their host has a GPU driver (``host_has_gpus``)."""
    if a.host != b.host:
        return False
    ga, gb = visible_gpus(a, env_a), visible_gpus(b, env_b)
    if ga == frozenset() or gb == frozenset():
        return False
    if ga is None or gb is None:
        return gpu_host
    return bool(ga & gb)


async def host_has_gpus(binding: HostBinding) -> bool:
    """Whether the host has an NVIDIA or AMD GPU driver loaded (its control device exists): one
    command, which never reads the devices (none where the adopt-check batch already asked)."""
    if jobs_own_gpus(binding.host):
        return False  # a scheduler's host (Slurm): each job is given GPUs of its own, never shared
    found = answered(binding.host, [Exists(device) for device in GPU_DEVICES])  # the adopt checks' batch
    if found is not None:
        return any(found)
    result = await binding.host.run(["sh", "-c", _ANY_EXISTS, "sh", *GPU_DEVICES], timeout=30, check=False)
    return result.returncode == 0


def settled_before(record: ServerState) -> bool:
    """A record whose launch already has a final verdict (ready, failed, stalled)."""
    return (record.last_verdict or {}).get("state") in SETTLED_STATES


@dataclass(frozen=True)
class Settled:
    """Why a waiting server's sibling no longer holds it back."""

    server: str  # the sibling
    signal: str  # "memory settled" | "ready" | "failed" | "stalled" | "exited" | "not launched" | "timed out"
    at: datetime
    line: str | None = None  # the memory-settled line
    offset: int | None = None  # where that line starts in the sibling's log (bytes)
    detail: str | None = None  # e.g. "stopped" for a failed sibling

    def describe(self) -> str:
        what = self.signal + (f"; {self.detail}" if self.detail else "")
        return f"{self.server}: {what}"

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"server": self.server, "signal": self.signal, "at": self.at.isoformat()}
        for key in ("line", "offset", "detail"):
            if getattr(self, key) is not None:
                data[key] = getattr(self, key)
        return data


@dataclass
class Sibling:
    """A server that another one waits for. ``in_batch``: started (or adopted) by this same call,
    so its launch and final verdict arrive as events; otherwise only its record and host tell."""

    name: str
    binding: HostBinding
    profile: EngineProfile
    in_batch: bool
    record: ServerState | None = None  # known now for servers already running


@dataclass
class StartQueue:
    """One ``up``/``restart`` call's waits: ``waits[name]`` are the siblings ``name`` starts after."""

    store: StateStore
    waits: dict[str, list[Sibling]]
    names: list[str]  # every server of the call
    launched: dict[str, asyncio.Event] = field(default_factory=dict)
    done: dict[str, asyncio.Event] = field(default_factory=dict)
    records: dict[str, ServerState] = field(default_factory=dict)
    finals: dict[str, Settled] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in self.names:
            self.launched.setdefault(name, asyncio.Event())
            self.done.setdefault(name, asyncio.Event())

    def waits_for(self, name: str) -> list[str]:
        return [s.name for s in self.waits.get(name, [])]

    def mark_launched(self, name: str, record: ServerState | None) -> None:
        if record is not None:
            self.records[name] = record
        self.launched[name].set()

    def mark_done(self, name: str, state: str, detail: str | None = None) -> None:
        """The final verdict of ``name`` (after a failed one was stopped): its waiters may go."""
        self.finals.setdefault(name, Settled(name, state, utcnow(), detail=detail))
        self.launched[name].set()
        self.done[name].set()

    async def wait_turn(self, name: str, timeout_s: float, *, siblings_waited: bool) -> list[Settled]:
        """Wait until every sibling ``name`` waits for has settled; say why each one did.

        ``siblings_waited``: this call waits for its own servers' verdicts, and each such wait has
        its own timeout, so a sibling of this call is waited for until its verdict. Otherwise (and
        for servers started elsewhere) a sibling gets ``timeout_s`` from when it is seen launched."""
        return list(
            await asyncio.gather(*(self._one(s, timeout_s, siblings_waited) for s in self.waits.get(name, [])))
        )

    async def _one(self, sibling: Sibling, timeout_s: float, siblings_waited: bool) -> Settled:
        name = sibling.name
        final = self.done[name] if sibling.in_batch else None  # a sibling of this call: its final verdict
        if final is not None:
            await self.launched[name].wait()  # also set when it is done without a launch
            if final.is_set():
                return self.finals.get(name) or Settled(name, "not launched", utcnow())
        record = self.records.get(name) or sibling.record
        if record is None:
            return Settled(name, "not launched", utcnow())
        # A sibling this call waits on reports its exit and verdict through ``done`` (its wait has
        # its own timeout): only its log is followed (over SSH: one long-lived stream, no polling).
        waited = sibling.in_batch and siblings_waited
        deadline = None if waited else time.monotonic() + timeout_s
        watch = watch_settled(sibling.binding, sibling.profile, record, self.store, poll_exit=not waited)
        settled = await _until(_first(watch, final.wait()) if final is not None else watch, deadline)
        if settled is None:
            return Settled(name, "timed out", utcnow())
        if isinstance(settled, Settled):
            return settled
        return self.finals.get(name) or Settled(name, "not launched", utcnow())


async def watch_settled(
    binding: HostBinding, profile: EngineProfile, record: ServerState, store: StateStore, *, poll_exit: bool = True
) -> Settled:
    """Return once the launch in ``record`` has settled: its memory line (from its log offset on),
    and with ``poll_exit`` a final verdict in its state record or its process group gone."""
    watchers = [_group_gone(binding, record), _record_final(store, record)] if poll_exit else []
    if profile.memory_settled:
        watchers.append(_memory_line(binding, profile, record))
    if not watchers:
        await asyncio.Event().wait()  # nothing to watch here: the caller's other signal decides
    return await _first(*watchers)


async def _memory_line(binding: HostBinding, profile: EngineProfile, record: ServerState) -> Settled:
    pending, start = b"", record.log_offset  # start: the offset of the first byte of ``pending``
    async for chunk in binding.host.follow(record.log_path, record.log_offset):
        if isinstance(chunk, Truncated):
            pending, start = b"", chunk.offset
            continue
        pending += chunk
        *complete, pending = pending.split(b"\n")
        for raw in complete:
            text = match_text(raw.decode("utf-8", errors="replace"))
            if any(p.search(text) for p in profile.memory_settled):
                return Settled(record.name, "memory settled", utcnow(), line=text, offset=start)
            start += len(raw) + 1
    raise AssertionError("follow never ends")  # pragma: no cover


async def _group_gone(binding: HostBinding, record: ServerState) -> Settled:
    interval = REMOTE_ALIVE_INTERVAL_S if binding.remote_state else ALIVE_INTERVAL_S
    while await binding.host.group_alive(record.pgid):
        await asyncio.sleep(interval)
    return Settled(record.name, "exited", utcnow())


async def _record_final(store: StateStore, record: ServerState) -> Settled:
    while True:
        current = store.load(record.name)
        if current is None or current.pgid != record.pgid:
            return Settled(record.name, "exited", utcnow(), detail="its record was removed or replaced")
        if settled_before(current):
            return Settled(record.name, str((current.last_verdict or {})["state"]), utcnow())
        await asyncio.sleep(RECORD_INTERVAL_S)


async def _first(*aws: Awaitable[Any]) -> Any:
    """The result of whichever awaitable finishes first; the others are cancelled."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        return next(iter(done)).result()
    finally:
        for task in tasks:
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task


async def _until(aw: Awaitable[Any], deadline: float | None) -> Any:
    """``aw``'s result, or None when ``deadline`` (monotonic; None: never) passes first."""
    try:
        async with asyncio.timeout(None if deadline is None else max(0.0, deadline - time.monotonic())):
            return await aw
    except TimeoutError:
        return None
