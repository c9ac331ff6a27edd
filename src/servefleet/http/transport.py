"""What a transport is: the smallest interface between servefleet and an HTTP library.

A :class:`Transport` sends one request and returns a :class:`Response` (the whole body), or opens a
stream whose body arrives chunk by chunk. It raises only :class:`~servefleet.http.failure.TransportError`.
The real one is ``aiohttp_transport.AiohttpTransport``; ``mock.MockTransport`` answers from a
function, so tests plug a fake in without a server (as httpx's transports allow).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

__all__ = ["Timeout", "Pool", "Response", "StreamResponse", "Transport", "decode_json"]


@dataclass(frozen=True, slots=True)
class Timeout:
    """Seconds: ``total`` for the whole exchange, ``connect`` for the connection alone (None: no limit)."""

    total: float | None
    connect: float | None = None


@dataclass(frozen=True, slots=True)
class Pool:
    """How connections are kept. ``limit`` 0: no cap (the caller decides concurrency).

    ``keep_alive=False`` closes every connection after its answer: a probe must not reuse a
    connection to a process that died or to a port that changed hands."""

    limit: int = 0
    keep_alive: bool = True
    keepalive_timeout_s: float = 15.0
    decompress: bool = True
    user_agent: bool = True  # False: no User-Agent header (bench: fewer bytes per request)
    trust_env: bool = False  # proxies from the environment: never for loopback servers


def decode_json(data: bytes) -> Any:
    """JSON from bytes: orjson, and the stdlib for what orjson refuses (NaN literals). ValueError on garbage."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data)


@dataclass(slots=True)  # not frozen: a frozen dataclass's __init__ costs ~1 µs more per request
class Response:
    status: int
    body: bytes = b""
    headers: Mapping[str, str] = field(default_factory=dict)  # case-insensitive from aiohttp

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    def json(self) -> Any:
        """The body as JSON (ValueError when it is not)."""
        return decode_json(self.body)

    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")


class StreamResponse(Protocol):
    """A response whose body is read as it arrives."""

    status: int
    headers: Mapping[str, str]

    def chunks(self) -> AsyncIterator[bytes]:
        """The body, one item per arrival from the socket."""
        ...

    async def read(self) -> bytes:
        """The whole (rest of the) body."""
        ...


class Transport(Protocol):
    async def request(
        self,
        method: str,
        url: str,
        *,
        body: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: Timeout | None = None,
    ) -> Response:
        """Send one request, read the whole answer. Raises TransportError when no HTTP answer came."""
        ...

    def stream(
        self,
        method: str,
        url: str,
        *,
        body: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: Timeout | None = None,
    ) -> AbstractAsyncContextManager[StreamResponse]:
        """Send one request; the body is read inside the ``async with``. A failure while reading
        leaves the ``async with`` as TransportError."""
        ...

    async def aclose(self) -> None: ...
