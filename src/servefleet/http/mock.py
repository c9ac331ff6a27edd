"""A transport that answers from a function: tests drive every HTTP path without a server.

::

    def handler(request: Request) -> Response:   # or an async function; may raise TransportError
        return Response(200, b'{"data": []}')

    client = HttpClient(MockTransport(handler))

A handler's ``Response`` may carry ``chunks`` (:class:`MockResponse`) for streamed bodies.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from servefleet.http.failure import FailureKind, RequestFailure, TransportError
from servefleet.http.transport import Response, Timeout

__all__ = ["MockTransport", "MockResponse", "Request", "refused", "reset", "timed_out"]


@dataclass(frozen=True)
class Request:
    method: str
    url: str
    body: bytes | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    timeout: Timeout | None = None

    @property
    def path(self) -> str:
        rest = self.url.split("://", 1)[-1]
        return "/" + rest.split("/", 1)[1] if "/" in rest else "/"


@dataclass
class MockResponse(Response):
    """A response whose body arrives as these chunks (``stream``); ``body`` is their join."""

    chunks_: Sequence[bytes] = ()
    fail_after: TransportError | None = None  # raised once the chunks are out (a broken stream)

    @classmethod
    def streamed(cls, status: int, chunks: Sequence[bytes], fail_after: TransportError | None = None) -> MockResponse:
        return cls(status, b"".join(chunks), {}, tuple(chunks), fail_after)


Handler = Callable[[Request], "Response | Awaitable[Response]"]


def refused(url: str = "") -> TransportError:
    return TransportError(RequestFailure(FailureKind.CONNECT, f"connection refused {url}".strip()))


def reset() -> TransportError:
    return TransportError(RequestFailure(FailureKind.DISCONNECT, "server disconnected"))


def timed_out() -> TransportError:
    return TransportError(RequestFailure(FailureKind.TIMEOUT, "no answer"))


class _MockStream:
    def __init__(self, response: Response) -> None:
        self.status = response.status
        self.headers = response.headers
        self._response = response

    async def chunks(self) -> AsyncIterator[bytes]:
        resp = self._response
        pieces = (
            resp.chunks_ if isinstance(resp, MockResponse) and resp.chunks_ else ([resp.body] if resp.body else [])
        )
        for piece in pieces:
            yield piece
        if isinstance(resp, MockResponse) and resp.fail_after is not None:
            raise resp.fail_after

    async def read(self) -> bytes:
        return b"".join([c async for c in self.chunks()])


class MockTransport:
    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.requests: list[Request] = []  # every request seen, in order
        self.closed = False

    async def _answer(self, request: Request) -> Response:
        self.requests.append(request)
        got = self.handler(request)
        if inspect.isawaitable(got):
            got = await got
        return got

    async def request(
        self,
        method: str,
        url: str,
        *,
        body: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: Timeout | None = None,
    ) -> Response:
        return await self._answer(Request(method, str(url), body, dict(headers or {}), timeout))

    @asynccontextmanager
    async def stream(
        self,
        method: str,
        url: str,
        *,
        body: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: Timeout | None = None,
    ) -> AsyncIterator[_MockStream]:
        yield _MockStream(await self._answer(Request(method, str(url), body, dict(headers or {}), timeout)))

    async def aclose(self) -> None:
        self.closed = True
