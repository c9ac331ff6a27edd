"""The servers a job runs on, and the one thing it asks of the fleet layer: a restart.

``--url`` servers are unmanaged: servefleet can only wait for them to answer again. Servers of a
``--fleet`` file are managed: a dead one is restarted through :class:`servefleet.fleet.Fleet`
(which relaunches it and runs the verification loop, so its diagnosis lands in the log and the
report). The job depends on the fleet only through :class:`Restarter`, so tests can use a fake.
A server the user stopped (``down``) or drained (``drain``) is *held*: :meth:`FleetRestarter.held`
says so, the job drains it and does not restart it, and :meth:`FleetRestarter.parked` tells the
fleet's state folder once the job has nothing in flight on it (``drain`` waits for that).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from servefleet.catalog import State
from servefleet.errors import ConfigError, HostUnreachable

if TYPE_CHECKING:
    from servefleet.fleet.core import Endpoint
    from servefleet.generate.client import Client
    from servefleet.verify.verdict import Verdict

__all__ = [
    "Target",
    "Restarter",
    "FleetRestarter",
    "targets_from_urls",
    "targets_from_fleet",
    "with_bench",
    "from_endpoint",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Target:
    """One server as the dispatcher sees it."""

    name: str
    base_url: str
    served_model: str | None = None
    max_running: int | None = None
    managed: bool = False
    bench_concurrency: int | None = None  # the best point of a bench run of this server (--bench)
    bench_tps: float | None = None
    bench_note: str | None = None  # e.g. "streaming run": how far to trust the point
    launch: Mapping[str, Any] | None = field(default=None, compare=False)  # a fleet server's launch (provenance.py)
    models: tuple[str, ...] = ()  # every model /v1/models lists, LoRA adapters included (routing.py)
    graph_batch: int | None = None  # the largest batch the engine runs as a CUDA graph (Capacity.graph_batch_max)


class Restarter(Protocol):
    """Brings a managed server back. Optional parts, checked by type: Holding, Retiring."""

    async def restart(self, name: str, on_event: Callable[[str], None]) -> Target | None:
        """Bring the server back; its new target when ready, None when it could not be.
        ``on_event`` takes one-line news for the progress view and the report."""
        ...


@runtime_checkable
class Holding(Protocol):
    """A restarter that knows which servers the user stopped or drained (`down`/`drain` marks)."""

    def held(self, name: str) -> str | None:
        """Why the user stopped this server, or None."""
        ...

    def parked(self, name: str) -> None:
        """The job sends nothing more to ``name`` and has nothing in flight on it."""
        ...


@runtime_checkable
class Retiring(Protocol):
    """A restarter whose hosts announce a server's end in advance (a Slurm job's notice)."""

    async def retiring(self) -> set[str]:
        """Servers whose end was announced: drained, then restarted first."""
        ...


@runtime_checkable
class Watching(Protocol):
    """A restarter that keeps looking at the fleet while the job runs (generate/membership.py): servers
    that become ready join, dead members of a counted template are replaced, idle ones released at the tail."""

    async def watch(self, dispatcher: Any) -> None:
        """Runs for the whole job (the dispatcher cancels it at the end)."""
        ...


@runtime_checkable
class Using(Protocol):
    """A restarter that records which servers a running job or gateway uses (`down` and `drain` wait for it)."""

    def using(self, name: str) -> None: ...


class FleetRestarter:
    """Restarts through a :class:`servefleet.fleet.Fleet` (relaunch + verification loop) and
    reports the verdict -- for a failure, its category, evidence line and hint."""

    def __init__(self, fleet: Any) -> None:
        self.fleet = fleet
        self.use: Any = None  # this job's record in the fleet's state folder (fleet/jobs.py), while it runs

    @contextlib.contextmanager
    def recording(self, output: str, servers: list[str]) -> Iterator[Any]:
        """Record this job in the fleet's state folder while the block runs (``down``/``drain`` read it)."""
        with self.fleet.jobs.recording(output, servers) as use:
            self.use = use
            try:
                yield use
            finally:
                self.use = None

    def held(self, name: str) -> str | None:
        """Why the user stopped this server (a stop mark in the state folder), or None."""
        mark = self.fleet.store.stop_mark(name)
        return None if mark is None else mark.describe()

    def parked(self, name: str) -> None:
        """The job sends nothing more to ``name`` and has nothing in flight on it."""
        if self.use is not None and name not in self.use.parked:
            self.use.parked.append(name)
            self.fleet.jobs.save(self.use)

    def using(self, name: str) -> None:
        """The job now also sends to ``name`` (a server admitted while it runs, by ``serve``): ``down``
        and ``drain`` see it; one parked before and admitted again is no longer parked."""
        if self.use is not None and (name not in self.use.servers or name in self.use.parked):
            if name not in self.use.servers:
                self.use.servers.append(name)
            if name in self.use.parked:
                self.use.parked.remove(name)
            self.fleet.jobs.save(self.use)

    async def retiring(self) -> set[str]:
        """Servers whose end their host announced (a Slurm job near its time limit): drain them."""
        return await self.fleet.retiring()

    async def restart(self, name: str, on_event: Callable[[str], None]) -> Target | None:
        verdict: Verdict = await self.fleet.restart(name, honour_stops=True)
        on_event(f"{name}: restart -> {describe_verdict(verdict)}")
        if verdict.state != State.READY:
            return None
        for ep in await self.fleet.ready_endpoints():
            if ep.name == name:
                return from_endpoint(ep)
        return None


def describe_verdict(verdict: Verdict) -> str:
    """One line: the state, and for a failure its category, evidence line and hint."""
    parts = [verdict.state.value]
    if verdict.category is not None:
        parts.append(f"[{verdict.category.value}]")
    if verdict.evidence is not None:
        parts.append(f"log line {verdict.evidence.line_no}: {verdict.evidence.text}")
    elif verdict.message:
        parts.append(f"({verdict.message})")
    if verdict.hint and verdict.state != State.READY:
        parts.append(f"-- {verdict.hint}")
    return " ".join(parts)


def with_bench(targets: list[Target], paths: list[str]) -> list[Target]:
    """Each target with the best point of its bench run (``generate --bench RUN.json``, repeatable).

    A run belongs to the server it measured (same URL, or its label is the server's name); a single
    run that matches none is taken for every server (the same configuration, measured once). Best is
    the highest output tokens/s; a streaming run under-rates a batch job (one event per token), which
    the note says."""
    from servefleet.bench.result import load_run

    if not paths:
        return targets
    runs = []
    for path in paths:
        try:
            run = load_run(path)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"--bench {path}: not a readable bench run ({exc})") from exc
        best = run.best_point()
        if best is None or not best.concurrency:
            raise ConfigError(f"--bench {path}: no concurrency point with a throughput in it")
        runs.append((run, best))

    def norm(url: str) -> str:
        return url.rstrip("/").removesuffix("/v1")

    out = []
    for t in targets:
        match = [(r, p) for r, p in runs if norm(r.target.base_url) == norm(t.base_url) or r.target.label == t.name]
        if not match and len(runs) == 1:
            match = runs
        if not match:
            out.append(t)
            continue
        run, best = max(match, key=lambda rp: rp[1].output_tokens_per_s)
        note = "streaming run" if run.config.stream else None
        out.append(replace(t, bench_concurrency=best.concurrency, bench_tps=best.output_tokens_per_s, bench_note=note))
    return out


def from_endpoint(ep: Endpoint) -> Target:
    return Target(
        ep.name,
        ep.base_url,
        ep.served_model,
        ep.capacity.max_running_requests,
        managed=True,
        graph_batch=ep.capacity.graph_batch_max,
    )


async def targets_from_urls(urls: list[str], client: Client, max_running: int | None = None) -> list[Target]:
    """Unmanaged servers: names ``url1``, ``url2``...; served model from ``/v1/models`` when it
    answers; capacity from the engines' info endpoints when one of them answers."""
    targets = []
    answered = 0
    for i, url in enumerate(urls, 1):
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"--url {url!r}: expected http://host:port")
        base = url.rstrip("/").removesuffix("/v1")
        models = await client.models(base)
        alive = models is not None or await client.ready(base)  # some servers have no /v1/models
        answered += alive
        served = models[0] if models else None
        known = max_running or (await _probe_max_running(client, base) if alive else None)
        targets.append(Target(f"url{i}" if len(urls) > 1 else "url", base, served, known, models=tuple(models or ())))
    if urls and not answered:
        # unreachable (exit 4), as for bench: the command line may be right and the server not up yet
        raise HostUnreachable(f"no server answers (GET /v1/models, /health) at {', '.join(urls)}")
    return targets


async def _probe_max_running(client: Client, base: str) -> int | None:
    """Ask each engine profile's info endpoint; the first that knows wins."""
    from servefleet.engines.registry import engine_names, get_engine

    for name in engine_names():
        try:
            cap = await get_engine(name).capacity_from_server(client.http, base)
        except Exception as exc:
            log.debug("%s: the %s profile could not read its capacity (%s: %s)", base, name, type(exc).__name__, exc)
            continue
        if cap.max_running_requests:
            return cap.max_running_requests
    return None


async def targets_from_fleet(fleet: Any) -> list[Target]:
    """The fleet's ready servers (none ready is a configuration problem for the caller)."""
    from servefleet.generate.provenance import fleet_launch

    return [
        replace(from_endpoint(ep), launch=await fleet_launch(fleet, ep.name)) for ep in await fleet.ready_endpoints()
    ]
