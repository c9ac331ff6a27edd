"""One HTTP client for the whole job: non-streaming OpenAI-compatible requests over aiohttp.

One ``ClientSession`` with an unlimited connection pool (concurrency is decided by the dispatcher,
not by the pool), keep-alive connections reused per server. Every outcome is data: a
:class:`Completion`, or a :class:`~servefleet.generate.retry.RequestFailure` classified once here,
at the boundary, from aiohttp's exceptions and the HTTP status.

The per-completion path is the coordinator's ceiling (``benchmarks/coordinator_ceiling.py``): bodies
are encoded and answers (~8 KB for 1,800 tokens) decoded with orjson (stdlib ``json`` for what
orjson refuses: integers beyond 64 bits, NaN literals), and each server's request URL is parsed once.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
from yarl import URL

from servefleet.generate.inputs import ENDPOINT_PATHS
from servefleet.generate.retry import FailureKind, RequestFailure

__all__ = ["Completion", "Client"]

_ERROR_CHARS = 300


@dataclass(frozen=True, slots=True)
class Completion:
    text: str
    finish_reason: str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    model: str | None
    reasoning: str | None = None
    token_ids: list[int] | None = None


class Client:
    def __init__(self, *, request_timeout_s: float = 3600.0, connect_timeout_s: float = 10.0, api_key: str | None = None) -> None:
        self.timeout = aiohttp.ClientTimeout(total=request_timeout_s, sock_connect=connect_timeout_s)
        self.probe_timeout = aiohttp.ClientTimeout(total=5.0, sock_connect=min(5.0, connect_timeout_s))
        self._headers = {"Content-Type": "application/json"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._session: aiohttp.ClientSession | None = None
        self._urls: dict[tuple[str, str], URL] = {}

    async def __aenter__(self) -> "Client":
        self.session  # noqa: B018 - create it inside the running loop
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, ttl_dns_cache=300, keepalive_timeout=60)
            self._session = aiohttp.ClientSession(connector=connector, headers=self._headers)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _url(self, base_url: str, endpoint: str) -> URL:
        url = self._urls.get((base_url, endpoint))
        if url is None:
            url = self._urls[(base_url, endpoint)] = URL(base_url.rstrip("/") + ENDPOINT_PATHS[endpoint])
        return url

    async def complete(self, base_url: str, endpoint: str, body: dict[str, Any]) -> Completion | RequestFailure:
        url = self._url(base_url, endpoint)
        try:
            async with self.session.post(url, data=encode_body(body), timeout=self.timeout) as resp:
                data = await resp.read()
                if resp.status >= 400:
                    return RequestFailure(FailureKind.HTTP, _error_text(data), resp.status, _retry_after(resp.headers.get("Retry-After")))
        except aiohttp.ClientConnectorError as exc:
            return RequestFailure(FailureKind.CONNECT, str(exc.os_error or exc))
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError, aiohttp.ClientOSError) as exc:
            return RequestFailure(FailureKind.DISCONNECT, str(exc) or type(exc).__name__)
        except (TimeoutError, asyncio.TimeoutError, aiohttp.ServerTimeoutError):
            return RequestFailure(FailureKind.TIMEOUT, f"no answer within {self.timeout.total:g}s")
        except aiohttp.ClientError as exc:
            return RequestFailure(FailureKind.DISCONNECT, f"{type(exc).__name__}: {exc}")
        return _parse(data, endpoint)

    async def ping(self, base_url: str, timeout_s: float | None = None) -> bool:
        """Liveness: does the server answer HTTP at all (any status) within the timeout?"""
        timeout = self.probe_timeout if timeout_s is None else aiohttp.ClientTimeout(total=timeout_s)
        try:
            async with self.session.get(base_url.rstrip("/") + "/v1/models", timeout=timeout) as resp:
                await resp.read()
                return True
        except (aiohttp.ClientError, TimeoutError, asyncio.TimeoutError):
            return False

    async def ready(self, base_url: str, timeout_s: float | None = None) -> bool:
        """Readiness: 200 from ``/health`` or ``/v1/models`` (some servers lack one of them)."""
        timeout = self.probe_timeout if timeout_s is None else aiohttp.ClientTimeout(total=timeout_s)
        for path in ("/health", "/v1/models"):
            try:
                async with self.session.get(base_url.rstrip("/") + path, timeout=timeout) as resp:
                    await resp.read()
                    if resp.status == 200:
                        return True
            except (aiohttp.ClientError, TimeoutError, asyncio.TimeoutError):
                return False
        return False

    async def models(self, base_url: str, timeout_s: float | None = None) -> list[str] | None:
        """Model names listed by ``/v1/models`` (None: the server did not answer usefully)."""
        timeout = self.probe_timeout if timeout_s is None else aiohttp.ClientTimeout(total=timeout_s)
        try:
            async with self.session.get(base_url.rstrip("/") + "/v1/models", timeout=timeout) as resp:
                if resp.status != 200:
                    return None
                data = await resp.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, asyncio.TimeoutError, ValueError):
            return None
        try:
            return [str(m["id"]) for m in data.get("data", [])]
        except (AttributeError, KeyError, TypeError):
            return None


def encode_body(body: dict[str, Any]) -> bytes:
    try:
        return orjson.dumps(body)
    except TypeError:  # orjson.JSONEncodeError: an integer beyond 64 bits, a non-string key
        return json.dumps(body).encode()


def decode_answer(data: bytes) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data)  # NaN / Infinity literals, which Python's own encoder writes


def _parse(data: bytes, endpoint: str) -> Completion | RequestFailure:
    try:
        obj = decode_answer(data)
        choice = obj["choices"][0]
    except (ValueError, KeyError, IndexError, TypeError):
        return RequestFailure(FailureKind.PROTOCOL, "answer without choices: " + _error_text(data))
    if endpoint == "chat":
        message = choice.get("message") or {}
        text = message.get("content")
        reasoning = message.get("reasoning_content") or message.get("reasoning")
    else:
        text = choice.get("text")
        reasoning = None
    if text is None and reasoning is None:
        text = ""
    usage = obj.get("usage") or {}
    token_ids = choice.get("token_ids")
    return Completion(
        text=text if isinstance(text, str) else json.dumps(text),
        finish_reason=choice.get("finish_reason"),
        prompt_tokens=usage.get("prompt_tokens"),
        completion_tokens=usage.get("completion_tokens"),
        model=obj.get("model"),
        reasoning=reasoning if isinstance(reasoning, str) else None,
        token_ids=token_ids if isinstance(token_ids, list) else None,
    )


def _error_text(data: bytes) -> str:
    try:
        obj = json.loads(data)
        if isinstance(obj, dict):
            err = obj.get("error", obj)
            msg = err.get("message") if isinstance(err, dict) else err
            if msg is None and isinstance(obj.get("detail"), str):
                msg = obj["detail"]
            if msg is not None:
                return str(msg)[:_ERROR_CHARS]
    except ValueError:
        pass
    return data[:_ERROR_CHARS].decode("utf-8", errors="replace").strip()


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None  # an HTTP date: rare from inference servers; backoff decides
