"""The gateway's HTTP face (aiohttp): the OpenAI endpoints, ``/v1/models``, ``/health``, ``/metrics``,
API keys, body limits, and errors in OpenAI's shape."""

from __future__ import annotations

import hmac
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import orjson
from aiohttp import web

from servefleet.serve.errors import ApiError, error_response
from servefleet.serve.metrics import CONTENT_TYPE_LATEST, GatewayMetrics
from servefleet.serve.requests import ENDPOINTS, parse_request
from servefleet.serve.router import QueueFull, QueueTimeout

if TYPE_CHECKING:
    from servefleet.serve.gateway import Gateway

__all__ = ["build_app"]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
OPEN_PATHS = frozenset({"/health"})  # answered without a key (load balancers, `servefleet status`-style checks)


def build_app(gw: Gateway) -> web.Application:
    keys = tuple(k.encode() for k in gw.config.api_keys)
    max_body = gw.config.max_body_bytes
    metrics = GatewayMetrics(gw.router, lambda: gw.forwarder.retried)
    created = int(time.time())

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        if keys and request.path not in OPEN_PATHS:
            auth = request.headers.get("Authorization", "")
            given = auth[7:].strip().encode() if auth[:7].lower() == "bearer " else b""
            if not given or not any(hmac.compare_digest(given, k) for k in keys):
                return error_response(
                    401,
                    "missing or wrong API key: send 'Authorization: Bearer KEY' (servefleet serve --api-key)",
                    code="invalid_api_key",
                )
        try:
            return await handler(request)
        except ApiError as exc:
            return exc.response()
        except web.HTTPRequestEntityTooLarge:
            return _too_large(max_body)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            return error_response(exc.status, f"{request.method} {request.path}: {exc.reason}")

    async def completion(request: web.Request) -> web.StreamResponse:
        path = request.path
        if (request.content_length or 0) > max_body:
            return _too_large(max_body)
        raw = await request.read()
        parsed = parse_request(raw, path)
        if parsed.model not in gw.router.by_model or not gw.router.by_model[parsed.model]:
            raise ApiError(
                404,
                f"the model {parsed.model!r} does not exist here; served: {', '.join(sorted(gw.router.models())) or 'none yet'}",
                param="model",
                code="model_not_found",
            )
        try:
            return await gw.forwarder.forward(request, path, raw, parsed.model, parsed.stream)
        except QueueFull as exc:
            return error_response(429, str(exc), code="queue_full", retry_after_s=exc.retry_after_s)
        except QueueTimeout as exc:
            return error_response(
                503 if exc.up == 0 else 429,
                str(exc),
                code="no_server" if exc.up == 0 else "queue_timeout",
                retry_after_s=exc.retry_after_s,
            )

    async def models(request: web.Request) -> web.Response:
        data = []
        for m in sorted(gw.router.models()):
            servers = [
                {
                    "name": b.name,
                    "state": "held" if b.held else b.health.state.value,
                    "in_flight": b.in_flight,
                    "limit": b.limit,
                }
                for b in gw.router.by_model[m]
            ]
            data.append({"id": m, "object": "model", "created": created, "owned_by": "servefleet", "servers": servers})
        return web.Response(body=orjson.dumps({"object": "list", "data": data}), content_type="application/json")

    async def health(request: web.Request) -> web.Response:
        servers = {b.name: ("held" if b.held else b.health.state.value) for b in gw.router.backends.values()}
        up = sum(1 for b in gw.router.backends.values() if b.usable)
        body = {
            "status": "ok" if up else "no server up",
            "servers_up": up,
            "servers": servers,
            "stopping": gw.stopping,
        }
        return web.Response(
            status=200 if up and not gw.stopping else 503, body=orjson.dumps(body), content_type="application/json"
        )

    async def prometheus(request: web.Request) -> web.Response:
        return web.Response(body=metrics.render(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application(middlewares=[guard], client_max_size=max_body)
    app.add_routes([web.post(p, completion) for p in ENDPOINTS])
    app.add_routes([web.get("/v1/models", models), web.get("/health", health), web.get("/metrics", prometheus)])
    return app


def _too_large(limit: int) -> web.Response:
    return error_response(
        413, f"the request body is larger than {limit:,} bytes (servefleet serve --max-body)", code="request_too_large"
    )
