"""One HTTP client for the whole job: non-streaming OpenAI-compatible requests.

One :class:`~servefleet.http.HttpClient` with an unlimited connection pool (concurrency is decided by
the dispatcher, not by the pool), keep-alive connections reused per server. Every outcome is data: a
:class:`Completion`, or a :class:`~servefleet.http.RequestFailure` (the HTTP layer's taxonomy:
transport failures come classified from the transport, error statuses and unusable answers here).

The per-completion path is the coordinator's ceiling (``benchmarks/coordinator_ceiling.py``): bodies
are encoded and answers (~8 KB for 1,800 tokens) decoded with orjson (stdlib ``json`` for what
orjson refuses: integers beyond 64 bits, NaN literals), and each server's request URL is parsed once.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

import orjson
from yarl import URL

from servefleet.generate.inputs import ENDPOINT_PATHS
from servefleet.generate.logprobs import Logprobs, parse_logprobs
from servefleet.generate.prompt_logprobs import parse_prompt_logprobs, raw_prompt_logprobs
from servefleet.http import (
    FailureKind,
    HttpClient,
    Pool,
    RequestFailure,
    Timeout,
    Transport,
    TransportError,
    decode_json,
)

__all__ = ["Completion", "Client"]

_ERROR_CHARS = 300
# An idle pooled connection is closed before the server closes it (uvicorn, and so vLLM and SGLang,
# after 5 s idle): one the server closed as we reused it breaks the request sent on it.
KEEPALIVE_S = 4.0


@dataclass(frozen=True, slots=True)
class Completion:
    text: str
    finish_reason: str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    model: str | None
    reasoning: str | None = None
    token_ids: list[int] | None = None
    choices: tuple[Completion, ...] = ()  # every choice of an answer to n > 1, in order (each without usage)
    logprobs: Logprobs | None = None  # --logprobs: the answer's token logprobs (logprobs.py)
    prompt_logprobs: Logprobs | None = None  # --prompt-logprobs: the prompt's token logprobs (prompt_logprobs.py)


class Client:
    """``transport``: a fake for tests (``servefleet.http.mock``); by default aiohttp, whose session
    carries the JSON and authorisation headers."""

    def __init__(
        self,
        *,
        request_timeout_s: float = 3600.0,
        connect_timeout_s: float = 10.0,
        api_key: str | None = None,
        transport: Transport | None = None,
        logprobs_k: int | None = None,
        prompt_logprobs_k: int | None = None,
    ) -> None:
        self.logprobs_k = logprobs_k  # --logprobs K: answers' logprobs are parsed (K alternatives per position)
        self.prompt_logprobs_k = prompt_logprobs_k  # --prompt-logprobs K: so are the prompts'
        self.timeout = Timeout(request_timeout_s, connect_timeout_s)
        self.probe_timeout = Timeout(5.0, min(5.0, connect_timeout_s))
        headers = {"Content-Type": "application/json"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self.http = HttpClient(
            transport, pool=Pool(limit=0, keepalive_timeout_s=KEEPALIVE_S), headers=headers, timeout=self.timeout
        )
        self._send = self.http.transport.request  # the per-completion path, one call frame shorter
        self._urls: dict[tuple[str, str], URL] = {}

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self.http.aclose()

    def _url(self, base_url: str, endpoint: str) -> URL:
        url = self._urls.get((base_url, endpoint))
        if url is None:
            url = self._urls[(base_url, endpoint)] = URL(base_url.rstrip("/") + ENDPOINT_PATHS[endpoint])
        return url

    async def complete(self, base_url: str, endpoint: str, body: dict[str, Any]) -> Completion | RequestFailure:
        try:
            # a parsed URL (aiohttp takes one as is): parsing the string per request costs more
            url = self._url(base_url, endpoint)
            resp = await self._send("POST", url, body=encode_body(body), timeout=self.timeout)  # type: ignore[arg-type]
        except TransportError as exc:
            return exc.failure
        if resp.status >= 400:
            return RequestFailure(
                FailureKind.HTTP, _error_text(resp.body), resp.status, _retry_after(resp.headers.get("Retry-After"))
            )
        return _parse(resp.body, endpoint, self.logprobs_k, self.prompt_logprobs_k)

    def _timeout(self, timeout_s: float | None) -> Timeout:
        return self.probe_timeout if timeout_s is None else Timeout(timeout_s)

    async def ping(self, base_url: str, timeout_s: float | None = None) -> bool:
        """Liveness: does the server answer HTTP at all (any status) within the timeout?"""
        try:
            await self.http.get(base_url.rstrip("/") + "/v1/models", timeout=self._timeout(timeout_s))
        except TransportError:
            return False
        return True

    async def ready(self, base_url: str, timeout_s: float | None = None) -> bool:
        """Readiness: 200 from ``/health`` or ``/v1/models`` (some servers lack one of them)."""
        timeout = self._timeout(timeout_s)
        for path in ("/health", "/v1/models"):
            try:
                if (await self.http.get(base_url.rstrip("/") + path, timeout=timeout)).status == 200:
                    return True
            except TransportError:
                return False
        return False

    async def models(self, base_url: str, timeout_s: float | None = None) -> list[str] | None:
        """Model names listed by ``/v1/models`` (None: the server did not answer usefully)."""
        data = await self.http.get_json(base_url.rstrip("/") + "/v1/models", timeout=self._timeout(timeout_s))
        if not isinstance(data, dict):
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


def _parse(
    data: bytes, endpoint: str, logprobs_k: int | None = None, prompt_logprobs_k: int | None = None
) -> Completion | RequestFailure:
    try:
        obj = decode_json(data)  # orjson; the stdlib for NaN / Infinity literals
        choice = obj["choices"][0]
    except (ValueError, KeyError, IndexError, TypeError):
        return RequestFailure(FailureKind.PROTOCOL, "answer without choices: " + _error_text(data))
    head = _choice(choice, endpoint, obj, logprobs_k=logprobs_k)
    if prompt_logprobs_k is not None:  # one prompt for every choice
        try:
            raw, prompt_ids = raw_prompt_logprobs(obj, choice)
            head = replace(head, prompt_logprobs=parse_prompt_logprobs(raw, prompt_logprobs_k, prompt_ids))
        except (AttributeError, TypeError):
            return RequestFailure(FailureKind.PROTOCOL, "answer with malformed prompt_logprobs: " + _error_text(data))
    if len(obj["choices"]) > 1:
        try:
            ordered = sorted(obj["choices"], key=lambda c: c.get("index", 0))
            others = tuple(_choice(c, endpoint, obj, usage=False, logprobs_k=logprobs_k) for c in ordered)
        except (AttributeError, TypeError):
            return RequestFailure(FailureKind.PROTOCOL, "answer with malformed choices: " + _error_text(data))
        return Completion(
            head.text,
            head.finish_reason,
            head.prompt_tokens,
            head.completion_tokens,
            head.model,
            head.reasoning,
            head.token_ids,
            others,
            prompt_logprobs=head.prompt_logprobs,
        )
    return head


def _choice(
    choice: dict[str, Any], endpoint: str, obj: dict[str, Any], *, usage: bool = True, logprobs_k: int | None = None
) -> Completion:
    if endpoint == "chat":
        message = choice.get("message") or {}
        text = message.get("content")
        reasoning = message.get("reasoning_content") or message.get("reasoning")
    else:
        text = choice.get("text")
        reasoning = None
    if text is None and reasoning is None:
        text = ""
    token_ids = choice.get("token_ids")
    token_ids = token_ids if isinstance(token_ids, list) else None
    counts = (
        (obj.get("usage") or {}) if usage else {"completion_tokens": len(token_ids) if token_ids is not None else None}
    )
    return Completion(
        text=text if isinstance(text, str) else json.dumps(text),
        finish_reason=choice.get("finish_reason"),
        prompt_tokens=counts.get("prompt_tokens"),
        completion_tokens=counts.get("completion_tokens"),
        model=obj.get("model"),
        reasoning=reasoning if isinstance(reasoning, str) else None,
        token_ids=token_ids,
        logprobs=parse_logprobs(choice.get("logprobs"), logprobs_k) if logprobs_k is not None else None,
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
