"""One client request through the fleet: a slot from the router, the request sent to that server,
its answer passed back -- or, when the server failed before a byte reached the client, the request
sent again to another server.

Non-streaming answers are read whole before anything is written, so any failure on the way is
retried. A streamed answer is passed through chunk by chunk; once its first chunk went out it
belongs to that server: when the server breaks it afterwards, the stream ends with an error event
in OpenAI's shape (the ``openai`` client raises it) and is never sent again (the client would see
text twice). Error statuses from a server are answers: 4xx goes back as is; 429, 503 and other 5xx
are tried on another server first and go back as is when every attempt got one.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass

import orjson
from aiohttp import web
from yarl import URL

from servefleet.generate.client import Client
from servefleet.http import FailureKind, RequestFailure, Timeout, TransportError
from servefleet.serve.backend import Attempt, Backend
from servefleet.serve.errors import ApiError, error_body
from servefleet.serve.router import Router
from servefleet.serve.supervisor import Supervisor

__all__ = ["Forwarder", "ClientGone"]

_PASSED_HEADERS = ("Content-Type", "Retry-After")


class ClientGone(Exception):
    """The client closed its connection while its answer was being written (not the server's fault)."""


@dataclass(slots=True)
class _Retry:
    failure: RequestFailure
    answer: web.Response | None  # what the client gets if no attempt is left (a server's own error answer)


class Forwarder:
    def __init__(
        self,
        router: Router,
        client: Client,
        supervisor: Supervisor,
        *,
        max_attempts: int = 3,
        request_timeout_s: float = 3600.0,
    ) -> None:
        self.router = router
        self.supervisor = supervisor
        self.max_attempts = max_attempts
        self.transport = client.http.transport
        self.timeout = Timeout(request_timeout_s, 10.0)
        self._urls: dict[tuple[str, str], URL] = {}
        self.retried = 0  # attempts sent again to another server

    def _url(self, base: str, path: str) -> URL:
        url = self._urls.get((base, path))
        if url is None:
            url = self._urls[(base, path)] = URL(base.rstrip("/") + path)
        return url

    async def forward(
        self, request: web.Request, path: str, raw: bytes, model: str, stream: bool
    ) -> web.StreamResponse:
        avoid: frozenset[str] = frozenset()
        last: _Retry | None = None
        for _ in range(self.max_attempts):
            backend = await self.router.acquire(model, avoid)  # QueueFull / QueueTimeout: the caller answers them
            attempt = Attempt(backend)
            task: asyncio.Task[web.StreamResponse | _Retry] = asyncio.ensure_future(
                self._send(request, attempt, path, raw, stream)
            )
            backend.attempts[task] = attempt
            try:
                outcome = await task
            except asyncio.CancelledError:
                me = asyncio.current_task()
                if me is not None and me.cancelling():  # the client went away, or the gateway is stopping
                    task.cancel()
                    raise
                # the server was taken out under this request
                if attempt.response is not None:
                    await _end_with_error(attempt.response, f"{backend.name} was taken out while streaming")
                    return attempt.response
                outcome = _Retry(RequestFailure(FailureKind.DISCONNECT, f"{backend.name} was taken out"), None)
            finally:
                backend.attempts.pop(task, None)
                self.router.release(backend)
            if not isinstance(outcome, _Retry):
                return outcome
            last = outcome
            avoid = avoid | {backend.name}
            self.retried += 1
        assert last is not None
        if last.answer is not None:
            return last.answer
        raise ApiError(
            502,
            f"no server answered: {last.failure.describe()} (after {self.max_attempts} attempts)",
            code="upstream_failed",
        )

    async def _send(
        self, request: web.Request, attempt: Attempt, path: str, raw: bytes, stream: bool
    ) -> web.StreamResponse | _Retry:
        b = attempt.backend
        url = self._url(b.target.base_url, path)
        t0 = time.perf_counter()
        if not stream:
            try:
                resp = await self.transport.request("POST", url, body=raw, timeout=self.timeout)  # type: ignore[arg-type]
            except TransportError as exc:
                self.supervisor.failed(b, exc.failure)
                return _Retry(exc.failure, None)
            answer = web.Response(status=resp.status, body=resp.body, headers=_headers(resp.headers))
            if resp.status >= 400:
                return self._error_status(b, resp.status, resp.body, answer)
            self.supervisor.answered(b, _completion_tokens(resp.body), time.perf_counter() - t0)
            return answer
        out: web.StreamResponse | None = None
        events = 0
        try:
            async with self.transport.stream("POST", url, body=raw, timeout=self.timeout) as up:  # type: ignore[arg-type]
                if up.status >= 400:
                    body = await up.read()
                    return self._error_status(
                        b, up.status, body, web.Response(status=up.status, body=body, headers=_headers(up.headers))
                    )
                async for chunk in up.chunks():
                    if out is None:
                        out = web.StreamResponse(
                            status=up.status,
                            headers={
                                "Content-Type": up.headers.get("Content-Type", "text/event-stream"),
                                "Cache-Control": "no-cache",
                            },
                        )
                        attempt.response = out
                        try:
                            await out.prepare(request)
                        except (ConnectionError, RuntimeError) as exc:
                            raise ClientGone() from exc
                        attempt.started = True
                    events += chunk.count(b"data:")
                    b.answers += 1  # progress, for the hang watch
                    try:
                        await out.write(chunk)
                    except ConnectionError as exc:
                        raise ClientGone() from exc
        except TransportError as exc:
            self.supervisor.failed(b, exc.failure)
            if out is None:
                return _Retry(exc.failure, None)
            await _end_with_error(out, f"{b.name} failed mid-stream: {exc.failure.describe()}")
            return out
        except ClientGone:
            return out or web.Response(status=499)
        if out is None:  # a 2xx with an empty body
            failure = RequestFailure(FailureKind.PROTOCOL, "an empty stream")
            self.supervisor.failed(b, failure)
            return _Retry(failure, None)
        self.supervisor.answered(b, max(0, events - 1), time.perf_counter() - t0)  # one event per token, less [DONE]
        try:
            await out.write_eof()
        except ConnectionError:
            pass
        return out

    def _error_status(self, b: Backend, status: int, body: bytes, answer: web.Response) -> web.Response | _Retry:
        retry_after = answer.headers.get("Retry-After")
        failure = RequestFailure(FailureKind.HTTP, body[:200].decode("utf-8", "replace"), status, _float(retry_after))
        self.supervisor.failed(b, failure)
        if status == 429 or status >= 500:
            return _Retry(failure, answer)
        return answer


async def _end_with_error(out: web.StreamResponse, message: str) -> None:
    try:
        await out.write(b"data: " + orjson.dumps(error_body(502, message, code="upstream_failed")) + b"\n\n")
        await out.write_eof()
    except (ConnectionError, RuntimeError):
        pass


def _headers(headers: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k in _PASSED_HEADERS if (v := headers.get(k)) is not None}


def _completion_tokens(body: bytes) -> float:
    try:
        return float(orjson.loads(body)["usage"]["completion_tokens"] or 0)
    except (ValueError, KeyError, TypeError):
        return 0.0


def _float(value: str | None) -> float | None:
    try:
        return None if value is None else float(value)
    except ValueError:
        return None
