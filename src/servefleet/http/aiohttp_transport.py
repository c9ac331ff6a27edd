"""The real transport: one aiohttp session, created inside the running loop on first use.

aiohttp's exceptions are translated here and nowhere else (:func:`translate`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from functools import lru_cache
from types import TracebackType

import aiohttp

from servefleet.http.failure import FailureKind, RequestFailure, TransportError
from servefleet.http.transport import Pool, Response, Timeout
from servefleet.sockets import socket_for

__all__ = ["AiohttpTransport", "translate"]

_MESSAGE_CHARS = 200


def translate(exc: BaseException, timeout: Timeout | None = None) -> TransportError:
    """The taxonomy's name for a foreign error (aiohttp's, the OS's, asyncio's timeout)."""
    if isinstance(exc, TimeoutError):  # also aiohttp's ServerTimeoutError and ConnectionTimeoutError
        within = f" within {timeout.total:g}s" if timeout is not None and timeout.total is not None else ""
        return TransportError(RequestFailure(FailureKind.TIMEOUT, f"no answer{within}"))
    if isinstance(exc, aiohttp.ClientConnectorError):
        if isinstance(exc.os_error, ConnectionRefusedError):
            text = f"connection refused ({exc.host}:{exc.port})"
        else:
            text = str(exc.os_error or exc)
        return TransportError(RequestFailure(FailureKind.CONNECT, _short(text)))
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return TransportError(RequestFailure(FailureKind.DISCONNECT, "server disconnected"))
    if isinstance(exc, (aiohttp.ClientPayloadError, aiohttp.ClientOSError, aiohttp.ClientConnectionError, OSError)):
        return TransportError(RequestFailure(FailureKind.DISCONNECT, _short(f"{type(exc).__name__}: {exc}")))
    if isinstance(exc, aiohttp.ClientResponseError):  # not an HTTP answer (a garbled status line)
        return TransportError(
            RequestFailure(FailureKind.PROTOCOL, _short(f"not an HTTP answer: {exc.message or exc}"))
        )
    # InvalidURL, redirects, ...: the request could not be made
    return TransportError(RequestFailure(FailureKind.CONNECT, _short(f"{type(exc).__name__}: {exc}")))


def _short(text: str) -> str:
    return " ".join(text.split())[:_MESSAGE_CHARS] or "error"


_CAUGHT = (aiohttp.ClientError, TimeoutError, OSError)


@lru_cache(maxsize=64)
def _client_timeout(timeout: Timeout) -> aiohttp.ClientTimeout:
    return aiohttp.ClientTimeout(total=timeout.total, sock_connect=timeout.connect)


class _Stream:
    __slots__ = ("_resp", "status", "headers")

    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self._resp = resp
        self.status = resp.status
        self.headers: Mapping[str, str] = resp.headers

    def chunks(self) -> AsyncIterator[bytes]:
        return self._resp.content.iter_any()  # aiohttp's own iterator: nothing added per chunk

    async def read(self) -> bytes:
        return await self._resp.read()


class _StreamContext:
    """``async with transport.stream(...)``: a class rather than an asynccontextmanager generator,
    which costs a few microseconds more per request on bench's hot path."""

    __slots__ = ("_request", "_timeout", "_resp")

    def __init__(self, request: aiohttp.client._RequestContextManager, timeout: Timeout) -> None:
        self._request = request
        self._timeout = timeout

    async def __aenter__(self) -> _Stream:
        try:
            self._resp = await self._request.__aenter__()
        except _CAUGHT as exc:
            raise translate(exc, self._timeout) from exc
        return _Stream(self._resp)

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self._request.__aexit__(kind, exc, tb)
        if exc is not None and isinstance(exc, _CAUGHT):  # raised while the body was read
            raise translate(exc, self._timeout) from exc


class AiohttpTransport:
    def __init__(
        self, pool: Pool | None = None, *, headers: Mapping[str, str] | None = None, timeout: Timeout | None = None
    ) -> None:
        self.pool = pool or Pool()
        self._headers = dict(headers or {})
        self._timeout = timeout or Timeout(300.0)  # the default of a request that names none
        self._client_timeout = _client_timeout(self._timeout)
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            pool = self.pool
            if pool.keep_alive:
                connector = aiohttp.TCPConnector(
                    limit=pool.limit,
                    limit_per_host=0,
                    ttl_dns_cache=300,
                    keepalive_timeout=pool.keepalive_timeout_s,
                    socket_factory=socket_for,
                )
            else:  # probes of servers still loading: the case servefleet.sockets exists for
                connector = aiohttp.TCPConnector(
                    limit=pool.limit, limit_per_host=0, force_close=True, socket_factory=socket_for
                )
            self._session = aiohttp.ClientSession(
                connector=connector,
                headers=self._headers,
                trust_env=pool.trust_env,
                auto_decompress=pool.decompress,
                skip_auto_headers=() if pool.user_agent else ("User-Agent",),
                timeout=self._client_timeout,
            )
        return self._session

    def _timeouts(self, timeout: Timeout | None) -> tuple[Timeout, aiohttp.ClientTimeout]:
        if timeout is None or timeout is self._timeout:  # the usual case: no hashing, no cache lookup
            return self._timeout, self._client_timeout
        return timeout, _client_timeout(timeout)

    async def request(
        self,
        method: str,
        url: str,
        *,
        body: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: Timeout | None = None,
    ) -> Response:
        # generate's hot path (one call per completion): the usual timeout without a method call
        if timeout is None or timeout is self._timeout:
            timeout, client_timeout = self._timeout, self._client_timeout
        else:
            client_timeout = _client_timeout(timeout)
        session = self._session or self.session
        try:
            async with session.request(method, url, data=body, headers=headers, timeout=client_timeout) as resp:
                data = await resp.read()
                return Response(resp.status, data, resp.headers)
        except _CAUGHT as exc:
            raise translate(exc, timeout) from exc

    def stream(
        self,
        method: str,
        url: str,
        *,
        body: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: Timeout | None = None,
    ) -> _StreamContext:
        timeout, client_timeout = self._timeouts(timeout)
        return _StreamContext(
            self.session.request(method, url, data=body, headers=headers, timeout=client_timeout), timeout
        )

    async def aclose(self) -> None:
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()
