"""What a benchmarked server is, from its own endpoints: model, engine, version, info, capacity.

Which engine a bare URL runs is the engine profiles' knowledge (``engines.registry.recognise``);
where its info document is (``engines.registry.info_paths``) and how to read its capacity
(``EngineProfile.capacity_from_server``) too. This module only asks.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from servefleet.bench.errors import ServerUnreachable
from servefleet.bench.server_metrics import fetch_server_info
from servefleet.capacity import Capacity
from servefleet.engines.registry import info_paths, recognise
from servefleet.http import FailureKind, HttpClient, Timeout, TransportError

if TYPE_CHECKING:
    from servefleet.bench.sweep import BenchTarget

__all__ = ["ServerFacts", "discover"]

log = logging.getLogger(__name__)

_TIMEOUT = Timeout(10.0)

_INFO_KEPT = (
    "version",
    "model_path",
    "served_model_name",
    "max_total_num_tokens",
    "max_running_requests",
    "context_length",
    "speculative_algorithm",
    "speculative_num_steps",
    "speculative_num_draft_tokens",
    "tp_size",
    "dp_size",
    "chunked_prefill_size",
    "mem_fraction_static",
    "internal_states",
)


@dataclass
class ServerFacts:
    model: str | None
    engine: str | None
    version: str | None
    info: dict[str, Any] = field(default_factory=dict)
    capacity: Capacity | None = None

    def trimmed_info(self) -> dict[str, Any]:
        """The info document's keys worth keeping in RUN.json."""
        return {k: self.info[k] for k in _INFO_KEPT if k in self.info}


async def discover(client: HttpClient, target: BenchTarget) -> ServerFacts:
    """Ask the server what it is; ServerUnreachable when /v1/models gets no answer at all."""
    base = target.base_url.rstrip("/")
    models = await _models(client, base)
    model, owner = target.model, None
    if isinstance(models, dict) and models.get("data"):
        first = models["data"][0]
        if model is None:
            model = first.get("id")
        owner = str(first.get("owned_by") or "")
    info = await fetch_server_info(client, base, info_paths(target.engine)) or {}
    engine = target.engine
    if engine is None:
        engine = recognise(owner, info, await client.get_text(base + "/metrics", timeout=_TIMEOUT) or "")
    version = str(info["version"]) if info.get("version") else None
    if version is None:
        got = await client.get_json(base + "/version", timeout=_TIMEOUT)
        if isinstance(got, dict) and got.get("version"):
            version = str(got["version"])
    capacity = await _capacity(client, base, target.capacity, engine)
    if capacity is not None and version and not capacity.engine_version:
        capacity = capacity.model_copy(update={"engine_version": version})
    return ServerFacts(model, engine, version, info, capacity)


async def _models(client: HttpClient, base: str) -> Any:
    try:
        resp = await client.get(base + "/v1/models", timeout=_TIMEOUT)
    except TransportError as exc:
        if exc.kind in (FailureKind.CONNECT, FailureKind.TIMEOUT):
            raise ServerUnreachable(f"{base}: no answer ({exc.failure.message})") from exc
        return None  # it answered something (a dropped connection): the probe request decides
    if resp.status != 200:
        return None
    try:
        return resp.json()
    except ValueError:
        return None


async def _capacity(client: HttpClient, base: str, known: Capacity | None, engine: str | None) -> Capacity | None:
    if not engine:
        return known
    try:
        from servefleet.engines.registry import get_engine

        found = await get_engine(engine).capacity_from_server(client, base)
    except Exception as exc:
        log.debug("%s: the %s profile could not read its capacity (%s: %s)", base, engine, type(exc).__name__, exc)
        return known
    if found.is_empty():
        return known
    return found if known is None else known.merge(found)
