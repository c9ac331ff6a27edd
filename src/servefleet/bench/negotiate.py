"""What the server accepts: the request options a run asks for, and one probe request that drops
each option the server refuses (with a note) before any point is measured.

Which engines accept ``ignore_eos`` is the engine profile's ``supports_ignore_eos``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from servefleet.bench.client import EndpointConfig, OpenAIBackend, PreparedRequest, RequestRecord
from servefleet.bench.errors import BenchError, ServerUnreachable
from servefleet.bench.result import BenchConfig
from servefleet.errors import ServefleetError

__all__ = ["requested_options", "wants_ignore_eos", "negotiate", "Negotiated", "PROBE_RETRIES"]

PROBE_RETRIES = 5
# Dropped in this order when the server refuses a request (4xx): the most optional first.
_DROPS = (("stream_options", "continuous_usage_stats"), ("ignore_eos", None), ("stream_options", None))


@dataclass
class Negotiated:
    options: dict[str, Any]  # what every request of the run carries
    probe: RequestRecord  # the answer to the accepted probe request


def wants_ignore_eos(config: BenchConfig, engine: str | None) -> bool:
    """As asked; else where the engine's profile says it accepts it (unknown engine: try it)."""
    if config.ignore_eos is not None:
        return config.ignore_eos
    if not engine:
        return True
    try:
        from servefleet.engines.registry import get_engine

        return get_engine(engine).supports_ignore_eos
    except ServefleetError:
        return True


def requested_options(config: BenchConfig, engine: str | None) -> dict[str, Any]:
    """The request options a run asks for before the server has said what it accepts."""
    options: dict[str, Any] = dict(config.extra_body)
    if wants_ignore_eos(config, engine):
        options["ignore_eos"] = True
    if config.temperature is not None:
        options["temperature"] = config.temperature
    if config.stream:
        options["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    return options


async def negotiate(
    endpoint: EndpointConfig, body: dict[str, Any], options: dict[str, Any], note: Callable[[str], None]
) -> Negotiated:
    """Send one short request, dropping options the server refuses; returns the accepted options."""
    opts = dict(options)
    drops = list(_DROPS)
    backend = OpenAIBackend(endpoint)
    await backend.open(1)
    transient = 0
    try:
        while True:
            req = PreparedRequest(
                index=-1, body=json.dumps({**body, **opts}).encode(), input_tokens=None, max_tokens=body["max_tokens"]
            )
            rec = await backend.send(req)
            if rec.ok:
                return Negotiated(opts, rec)
            if rec.error_kind == "connection":
                raise ServerUnreachable(f"{endpoint.base_url}: {rec.error}")
            if rec.error_kind in ("server_error", "rate_limited", "disconnected") and transient < PROBE_RETRIES:
                transient += 1  # a server that fails some requests (the sweep counts those) may pass
                await asyncio.sleep(0.05 * transient)
                continue
            if rec.error_kind != "client_error" or not drops:
                raise BenchError(f"probe request to {endpoint.url} failed: {rec.error_kind}: {rec.error}")
            key, sub = drops.pop(0)
            if key not in opts:
                continue
            if sub is None:
                note(f"server refused '{key}' ({rec.error}); sent without it")
                opts.pop(key)
            elif isinstance(opts[key], dict) and sub in opts[key]:
                note(f"server refused '{key}.{sub}' ({rec.error}); sent without it")
                opts[key] = {k: v for k, v in opts[key].items() if k != sub}
    finally:
        await backend.close()
