"""The HTTP client every part of servefleet uses: a transport, default timeouts, best-effort reads.

:meth:`HttpClient.get` / :meth:`post` return a :class:`Response` for any HTTP answer (an error
status is an answer) and raise :class:`TransportError` when none came. :meth:`get_json` and
:meth:`get_text` are the best-effort reads of info endpoints: None on any failure, because an
endpoint an engine version lacks is normal.

The transport is injectable (``HttpClient(MockTransport(handler))``); by default it is aiohttp,
imported only when the first client without a transport is made.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any

from servefleet.http.failure import TransportError
from servefleet.http.transport import Pool, Response, StreamResponse, Timeout, Transport

__all__ = ["HttpClient", "probe_client", "INFO_TIMEOUT"]

log = logging.getLogger(__name__)

INFO_TIMEOUT = Timeout(3.0)  # an info endpoint that takes longer is not worth waiting for


class HttpClient:
    def __init__(
        self,
        transport: Transport | None = None,
        *,
        pool: Pool | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: Timeout | None = None,
    ) -> None:
        if transport is None:
            from servefleet.http.aiohttp_transport import AiohttpTransport

            transport = AiohttpTransport(pool, headers=headers, timeout=timeout)
        self.transport: Transport = transport

    async def __aenter__(self) -> HttpClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self.transport.aclose()

    async def get(
        self, url: str, *, timeout: Timeout | None = None, headers: Mapping[str, str] | None = None
    ) -> Response:
        return await self.transport.request("GET", url, headers=headers, timeout=timeout)

    async def post(
        self, url: str, body: bytes, *, timeout: Timeout | None = None, headers: Mapping[str, str] | None = None
    ) -> Response:
        return await self.transport.request("POST", url, body=body, headers=headers, timeout=timeout)

    def stream(
        self,
        method: str,
        url: str,
        *,
        body: bytes | None = None,
        timeout: Timeout | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> AbstractAsyncContextManager[StreamResponse]:
        return self.transport.stream(method, url, body=body, headers=headers, timeout=timeout)

    async def get_json(self, url: str, timeout: Timeout = INFO_TIMEOUT) -> Any | None:
        """GET and decode JSON; None on anything but a 200 with JSON (404, refused, timeout, garbage)."""
        try:
            resp = await self.get(url, timeout=timeout)
            if resp.status != 200:
                log.debug("GET %s: HTTP %d, nothing read", url, resp.status)
                return None
            return resp.json()
        except (TransportError, ValueError) as exc:  # an endpoint this engine version lacks is normal: not a warning
            log.debug("GET %s: no JSON (%s: %s)", url, type(exc).__name__, exc)
            return None

    async def get_text(self, url: str, timeout: Timeout = INFO_TIMEOUT) -> str | None:
        """GET as text (undecodable bytes replaced); None on anything but a 200."""
        try:
            resp = await self.get(url, timeout=timeout)
        except TransportError as exc:
            log.debug("GET %s: no answer (%s)", url, exc)
            return None
        if resp.status != 200:
            log.debug("GET %s: HTTP %d, nothing read", url, resp.status)
            return None
        return resp.text()


def probe_client(connections: int = 8) -> HttpClient:
    """A client for readiness probes: no kept connections (a kept connection to a process that
    died, or to a port that changed hands, would answer for a server that is no longer there).
    ``connections``: at most that many at once (one server's wait: 8; a fleet's status: more)."""
    return HttpClient(pool=Pool(limit=connections, keep_alive=False))
