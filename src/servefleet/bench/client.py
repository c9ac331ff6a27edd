"""The HTTP side of the load generator: one pooled HTTP client, one request at a time per call.

The scheduler (``loadgen.py``) talks to a :class:`Backend`, and the backend to a
:class:`~servefleet.http.Transport` (aiohttp by default; ``servefleet.http.mock`` in tests). A
request that fails is a :class:`RequestRecord` with ``ok=False`` and an ``error_kind`` — data, not
an exception — so one bad response cannot end a sweep. The kinds are the HTTP layer's taxonomy under
the stable names of RUN.json (:func:`error_kind`). Bodies arrive pre-encoded; the hot path does no JSON encoding and, for streams, no JSON
decoding either (see ``sse.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from time import perf_counter
from typing import Protocol

from servefleet.bench.sse import SSESplitter, error_message, extract_text, scan_arrival, scan_body, scan_payload
from servefleet.http import (
    FailureKind,
    HttpClient,
    Pool,
    RequestFailure,
    StreamResponse,
    Timeout,
    Transport,
    TransportError,
    status_class,
)

__all__ = [
    "PreparedRequest",
    "RequestRecord",
    "EndpointConfig",
    "Backend",
    "OpenAIBackend",
    "ERROR_KINDS",
    "error_kind",
]

# Stable names for per-request failures (RUN.json ``errors_by_kind``).
ERROR_KINDS = (
    "rate_limited",  # HTTP 429
    "client_error",  # other HTTP 4xx
    "server_error",  # HTTP 5xx
    "connection",  # could not connect / connection refused
    "timeout",  # no complete answer within the request timeout
    "disconnected",  # the server closed the connection mid-answer
    "stream_error",  # an error object inside an otherwise successful stream
    "bad_response",  # 200 with a body that is not an answer
)


@dataclass(frozen=True, slots=True)
class PreparedRequest:
    index: int
    body: bytes  # the JSON body, encoded once before the point starts
    input_tokens: int | None  # as counted when the prompt was built (None: unknown)
    max_tokens: int


@dataclass(slots=True)
class RequestRecord:
    """What happened to one request. Times are ``perf_counter`` seconds (CLOCK_MONOTONIC on
    Linux, hence comparable across worker processes); chunk offsets are relative to ``start``."""

    index: int
    ok: bool
    start: float
    end: float
    ttft: float | None = None
    prompt_tokens: int | None = None  # from usage
    completion_tokens: int | None = None  # from usage
    input_tokens: int | None = None  # as built
    max_tokens: int = 0
    chunk_offsets: list[float] = field(default_factory=list)  # one per arrival that carried output
    chunk_bytes: list[int] = field(default_factory=list)  # text bytes in that arrival
    chunk_tokens: list[int] | None = None  # exact tokens per arrival (continuous usage), else None
    text_bytes: int = 0  # non-streamed: size of the answer text
    text: str | None = None  # kept only when the server reports no usage (counted later)
    status: int | None = None
    error_kind: str | None = None
    error: str | None = None
    warmup: bool = False


@dataclass(frozen=True)
class EndpointConfig:
    """Everything a backend needs; plain data so it can be sent to worker processes."""

    base_url: str
    path: str  # "/v1/chat/completions" or "/v1/completions"
    stream: bool = True
    headers: tuple[tuple[str, str], ...] = ()
    timeout_s: float = 600.0
    keep_text: bool = False  # keep generated text (server reports no usage; tokens counted later)

    @property
    def url(self) -> str:
        return self.base_url.rstrip("/") + self.path


class Backend(Protocol):
    """What the load generator needs from a transport."""

    async def open(self, connections: int) -> None: ...

    async def send(self, request: PreparedRequest) -> RequestRecord: ...

    async def close(self) -> None: ...


_KIND_NAMES = {
    FailureKind.CONNECT: "connection",
    FailureKind.DISCONNECT: "disconnected",
    FailureKind.TIMEOUT: "timeout",
    FailureKind.PROTOCOL: "bad_response",
}


def error_kind(failure: RequestFailure) -> str:
    """The RUN.json name (``ERROR_KINDS``) of a failure of the HTTP layer."""
    if failure.kind is FailureKind.HTTP:
        return status_class(failure.status or 500)
    return _KIND_NAMES[failure.kind]


class OpenAIBackend:
    """OpenAI-compatible chat/completions over one HTTP client with keep-alive connections.
    ``transport``: a fake for in-process tests (worker processes always use the real one)."""

    def __init__(self, config: EndpointConfig, transport: Transport | None = None) -> None:
        self.config = config
        self._url = config.url
        self._transport = transport
        self._http: HttpClient | None = None

    async def open(self, connections: int) -> None:
        if self._http is not None:
            return
        # One connection per concurrent request, reused across requests (keep-alive), no
        # per-request session (sglang's bench_serving opens one per request). ``connections`` 0
        # means no cap (open-loop load without an in-flight limit). Headers ride on the session.
        self._http = HttpClient(
            self._transport,
            pool=Pool(limit=max(connections, 0), decompress=False, user_agent=False),
            headers={"Content-Type": "application/json", **dict(self.config.headers)},
            timeout=Timeout(self.config.timeout_s, 30),
        )

    async def close(self) -> None:
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    async def send(self, request: PreparedRequest) -> RequestRecord:
        if self._http is None:
            raise RuntimeError("OpenAIBackend.open() first")
        rec = RequestRecord(
            index=request.index,
            ok=False,
            start=perf_counter(),
            end=0.0,
            input_tokens=request.input_tokens,
            max_tokens=request.max_tokens,
        )
        try:
            async with self._http.stream("POST", self._url, body=request.body) as resp:
                rec.status = resp.status
                if resp.status != 200:
                    body = await resp.read()
                    return _failed(rec, status_class(resp.status), f"HTTP {resp.status}: {error_message(body)}")
                if self.config.stream:
                    await self._read_stream(resp, rec)
                else:
                    await self._read_body(resp, rec)
        except TransportError as exc:
            if exc.kind is FailureKind.TIMEOUT:
                return _failed(rec, "timeout", f"no complete answer within {self.config.timeout_s:g}s")
            return _failed(rec, error_kind(exc.failure), exc.failure.message)
        return rec

    async def _read_body(self, resp: StreamResponse, rec: RequestRecord) -> None:
        body = await resp.read()
        rec.end = perf_counter()
        scan = scan_body(body)
        if scan.error:
            _failed(rec, "stream_error", error_message(body))
            return
        if scan.completion_tokens is None and b'"choices"' not in body:
            _failed(rec, "bad_response", body[:200].decode("utf-8", "replace"))
            return
        rec.ok = True
        rec.completion_tokens = scan.completion_tokens
        rec.prompt_tokens = scan.prompt_tokens
        rec.text_bytes = scan.text_bytes
        if self.config.keep_text or scan.completion_tokens is None:
            rec.text = extract_text(body)

    async def _read_stream(self, resp: StreamResponse, rec: RequestRecord) -> None:
        """The hot loop. One timestamp per socket arrival: events that arrive together are one
        chunk, so several tokens in one arrival share one gap (per-token ITL, see metrics.py).

        Each arrival (cut at its last newline) is scanned whole by :func:`scan_arrival` — no
        per-event Python loop; only an arrival that holds an error object, or a run that must keep
        the text, takes the event-by-event path.
        """
        if self.config.keep_text:
            await self._read_stream_events(resp, rec)
            return
        start = rec.start
        offsets = rec.chunk_offsets
        sizes = rec.chunk_bytes
        exact: list[int] | None = []  # tokens per arrival while every text event carries usage
        cumulative = 0
        events = 0
        tail = b""
        async for data in resp.chunks():
            now = perf_counter()
            if tail:
                data = tail + data
            cut = data.rfind(b"\n") + 1
            if cut == 0:
                tail = data
                continue
            if cut < len(data):
                data, tail = data[:cut], data[cut:]
            else:
                tail = b""
            arrival = scan_arrival(data, need_text=exact is None)
            if arrival.error:
                for payload in SSESplitter().feed(data):
                    if scan_payload(payload).error:
                        rec.end = now
                        _failed(rec, "stream_error", error_message(payload))
                        return
            events += arrival.events
            new_tokens = 0
            if arrival.completion_tokens is not None:
                if arrival.completion_tokens > cumulative:
                    new_tokens = arrival.completion_tokens - cumulative
                    cumulative = arrival.completion_tokens
                rec.completion_tokens = arrival.completion_tokens
                if arrival.prompt_tokens is not None:
                    rec.prompt_tokens = arrival.prompt_tokens
            if exact is not None and arrival.usage_events < arrival.text_events:
                exact = None  # text without usage: counts are not per chunk
            # A chunk: text arrived, or (usage in every event) the count went up.
            if arrival.text_bytes or (new_tokens and exact is not None):
                offsets.append(now - start)
                sizes.append(arrival.text_bytes)
                if exact is not None:
                    exact.append(new_tokens)
                if rec.ttft is None:
                    rec.ttft = now - start
        if tail.strip():
            last = scan_arrival(tail + b"\n")
            events += last.events
            if last.completion_tokens is not None:
                rec.completion_tokens = last.completion_tokens
        rec.end = perf_counter()
        if not events:
            _failed(rec, "bad_response", "HTTP 200 with no server-sent events")
            return
        rec.ok = True
        if exact is not None and offsets and rec.completion_tokens is not None and sum(exact) == rec.completion_tokens:
            rec.chunk_tokens = exact

    async def _read_stream_events(self, resp: StreamResponse, rec: RequestRecord) -> None:
        """Event-by-event reading that also keeps the text (servers that report no usage)."""
        start = rec.start
        splitter = SSESplitter()
        offsets = rec.chunk_offsets
        sizes = rec.chunk_bytes
        exact: list[int] | None = []  # tokens per arrival while usage comes with every content chunk
        cumulative = 0
        keep = self.config.keep_text
        texts: list[bytes] = []
        events = 0
        async for data in resp.chunks():
            now = perf_counter()
            nbytes = 0
            tokens_before = cumulative
            for payload in splitter.feed(data):
                events += 1
                scan = scan_payload(payload)
                if scan.done:
                    continue
                if scan.error:
                    rec.end = now
                    _failed(rec, "stream_error", error_message(payload))
                    return
                if scan.completion_tokens is not None:
                    cumulative = max(cumulative, scan.completion_tokens)
                    rec.completion_tokens = scan.completion_tokens
                    if scan.prompt_tokens is not None:
                        rec.prompt_tokens = scan.prompt_tokens
                elif scan.text_bytes:
                    exact = None  # a chunk with text but no usage: counts are not per chunk
                nbytes += scan.text_bytes
                if keep and scan.text_bytes:
                    texts.append(payload)
            new_tokens = cumulative - tokens_before
            # An arrival with text is a chunk; so is one whose tokens decoded to no text yet
            # (held-back UTF-8), which only continuous usage reveals.
            if nbytes or (new_tokens and exact is not None):
                offsets.append(now - start)
                sizes.append(nbytes)
                if exact is not None:
                    exact.append(new_tokens)
                if rec.ttft is None:
                    rec.ttft = now - start
        for payload in splitter.flush():
            events += 1
            scan = scan_payload(payload)
            if scan.completion_tokens is not None:
                rec.completion_tokens = scan.completion_tokens
        rec.end = perf_counter()
        if not events:
            _failed(rec, "bad_response", "HTTP 200 with no server-sent events")
            return
        rec.ok = True
        # Exact per-chunk counts only if every text chunk carried a cumulative usage count and they
        # add up to the final total (vLLM ``continuous_usage_stats``); otherwise metrics.py shares
        # the total out in proportion to text size.
        if exact is not None and offsets and rec.completion_tokens is not None and sum(exact) == rec.completion_tokens:
            rec.chunk_tokens = exact
        if texts:
            rec.text = "".join(extract_text(p) for p in texts)


def _failed(rec: RequestRecord, kind: str, message: str) -> RequestRecord:
    rec.ok = False
    rec.error_kind = kind
    rec.error = message[:300]
    if not rec.end:
        rec.end = perf_counter()
    return rec
