"""The one HTTP layer (servefleet.http): the taxonomy of real socket failures, the fake transport,
and the callers that turn failures into their own records (probe, status identity, bench, generate)."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest

from servefleet.bench.client import EndpointConfig, OpenAIBackend, PreparedRequest, error_kind
from servefleet.bench.negotiate import wants_ignore_eos
from servefleet.bench.result import BenchConfig
from servefleet.engines.base import EngineProfile, Probe
from servefleet.engines.registry import recognise
from servefleet.generate.client import Client, Completion
from servefleet.hosts.base import PortHolder
from servefleet.http import FailureKind, HttpClient, RequestFailure, Response, Timeout, TransportError, status_class
from servefleet.http.mock import MockResponse, MockTransport, Request, refused, reset, timed_out
from servefleet.verify.events import ProbeOutcome
from servefleet.verify.probe import Prober

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@asynccontextmanager
async def raw_server(handler: Handler) -> AsyncIterator[str]:
    """A loopback TCP server speaking whatever ``handler`` writes (broken HTTP on purpose)."""
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()
        await server.wait_closed()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _after_request(reader: asyncio.StreamReader) -> None:
    await reader.readuntil(b"\r\n\r\n")


async def garbled(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await _after_request(reader)
    writer.write(b"garbage here\r\n\r\n")
    await writer.drain()
    writer.close()


async def cut_short(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await _after_request(reader)
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nabc")
    await writer.drain()
    writer.close()


async def hangs_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await _after_request(reader)
    writer.transport.abort()


async def never_answers(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await _after_request(reader)
    await asyncio.Event().wait()  # cancelled when the server closes


async def busy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await _after_request(reader)
    writer.write(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 4\r\nRetry-After: 2\r\n\r\nbusy")
    await writer.drain()
    writer.close()


# ------------------------------------------------------------------ the real transport's taxonomy
@pytest.mark.parametrize(
    ("handler", "kind", "words"),
    [
        (garbled, FailureKind.PROTOCOL, "not an HTTP answer"),
        (cut_short, FailureKind.DISCONNECT, "not completed"),
        (hangs_up, FailureKind.DISCONNECT, "server disconnected"),
        (never_answers, FailureKind.TIMEOUT, "no answer within 0.3s"),
    ],
)
async def test_socket_failures_are_translated_once_into_the_taxonomy(
    handler: Handler, kind: FailureKind, words: str
) -> None:
    async with raw_server(handler) as url, HttpClient() as client:
        with pytest.raises(TransportError) as caught:
            await client.get(url + "/health", timeout=Timeout(0.3))
    assert caught.value.kind is kind and words in caught.value.failure.message
    assert caught.value.__cause__ is not None  # the foreign error stays chained


async def test_refused_is_connect_and_an_error_status_is_an_answer() -> None:
    async with HttpClient() as client:
        with pytest.raises(TransportError) as caught:
            await client.get(f"http://127.0.0.1:{free_port()}/health")
        assert caught.value.kind is FailureKind.CONNECT and "refused" in caught.value.failure.message
        assert caught.value.failure.down
        async with raw_server(busy) as url:
            resp = await client.get(url + "/health")
    assert (resp.status, resp.body, resp.headers.get("retry-after")) == (503, b"busy", "2")  # headers case-insensitive


async def test_a_stream_cut_mid_body_leaves_the_async_with_as_a_transport_error() -> None:
    got: list[bytes] = []
    async with raw_server(cut_short) as url, HttpClient() as client:
        with pytest.raises(TransportError) as caught:
            async with client.stream("POST", url + "/v1/completions", body=b"{}") as resp:
                assert resp.status == 200
                async for chunk in resp.chunks():
                    got.append(chunk)
    assert caught.value.kind is FailureKind.DISCONNECT and b"".join(got) == b"abc"


@pytest.mark.parametrize(
    ("status", "name"),
    [
        (429, "rate_limited"),
        (400, "client_error"),
        (404, "client_error"),
        (500, "server_error"),
        (503, "server_error"),
    ],
)
def test_status_classes(status: int, name: str) -> None:
    assert status_class(status) == name


# ------------------------------------------------------------------ best-effort reads, the fake
async def test_get_json_is_none_on_anything_but_a_200_with_json() -> None:
    answers = {
        "/ok": Response(200, b'{"a": 1}'),
        "/nan": Response(200, b'{"a": NaN}'),
        "/missing": Response(404, b"{}"),
        "/garbage": Response(200, b"<html>"),
    }

    def handler(request: Request) -> Response:
        if request.path == "/down":
            raise refused(request.url)
        return answers[request.path]

    transport = MockTransport(handler)
    async with HttpClient(transport) as client:
        assert await client.get_json("http://x/ok") == {"a": 1}
        assert (await client.get_json("http://x/nan"))["a"] != (await client.get_json("http://x/nan"))[
            "a"
        ]  # NaN, via the stdlib
        assert [await client.get_json(f"http://x/{p}") for p in ("missing", "garbage", "down")] == [None, None, None]
        assert (
            await client.get_text("http://x/missing") is None and await client.get_text("http://x/garbage") == "<html>"
        )
    assert transport.closed and [r.path for r in transport.requests][:2] == ["/ok", "/nan"]


# ------------------------------------------------------------------ bench's records
def _sse(*events: dict) -> list[bytes]:
    return [b"data: " + json.dumps(e).encode() + b"\n\n" for e in events] + [b"data: [DONE]\n\n"]


async def _bench_send(handler: Callable[[Request], Response], stream: bool = True):
    backend = OpenAIBackend(
        EndpointConfig("http://x", "/v1/completions", stream=stream, timeout_s=7), MockTransport(handler)
    )
    await backend.open(1)
    try:
        return await backend.send(PreparedRequest(index=0, body=b"{}", input_tokens=3, max_tokens=2))
    finally:
        await backend.close()


async def test_bench_reads_a_stream_from_the_fake_transport() -> None:
    chunks = _sse(
        {"choices": [{"text": "he"}], "usage": {"prompt_tokens": 3, "completion_tokens": 1}},
        {"choices": [{"text": "llo"}], "usage": {"prompt_tokens": 3, "completion_tokens": 2}},
    )
    rec = await _bench_send(lambda r: MockResponse.streamed(200, chunks))
    assert rec.ok and rec.completion_tokens == 2 and rec.prompt_tokens == 3 and len(rec.chunk_offsets) >= 1


@pytest.mark.parametrize(
    ("answer", "kind"),
    [
        (lambda r: Response(429, b'{"error": {"message": "slow down"}}'), "rate_limited"),
        (lambda r: Response(400, b'{"error": {"message": "bad"}}'), "client_error"),
        (lambda r: Response(502, b"bad gateway"), "server_error"),
        (
            lambda r: MockResponse.streamed(200, [b'data: {"choices": [{"text": "a"}]}\n\n'], fail_after=reset()),
            "disconnected",
        ),
        (lambda r: MockResponse.streamed(200, [b""]), "bad_response"),
    ],
)
async def test_bench_failures_are_records_with_their_stable_kind(
    answer: Callable[[Request], Response], kind: str
) -> None:
    rec = await _bench_send(answer)
    assert not rec.ok and rec.error_kind == kind


@pytest.mark.parametrize(
    ("error", "kind", "message"),
    [
        (refused, "connection", "refused"),
        (timed_out, "timeout", "no complete answer within 7s"),
        (reset, "disconnected", "disconnected"),
    ],
)
async def test_bench_transport_failures_keep_runjson_names(
    error: Callable[[], TransportError], kind: str, message: str
) -> None:
    def handler(request: Request) -> Response:
        raise error()

    rec = await _bench_send(handler)
    assert (rec.ok, rec.error_kind) == (False, kind) and message in (rec.error or "")
    assert error_kind(error().failure) == kind


# ------------------------------------------------------------------ generate's failures
async def test_generate_client_classifies_through_the_one_taxonomy() -> None:
    def handler(request: Request) -> Response:
        if request.url.endswith("/v1/chat/completions"):
            return Response(503, b'{"error": {"message": "overloaded"}}', {"Retry-After": "2"})
        return Response(
            200, b'{"choices": [{"text": "hi", "finish_reason": "length"}], "usage": {"completion_tokens": 1}}'
        )

    async with Client(transport=MockTransport(handler)) as client:
        done = await client.complete("http://x", "completions", {"prompt": "a"})
        busy_ = await client.complete("http://x", "chat", {"messages": []})
    assert isinstance(done, Completion) and (done.text, done.completion_tokens) == ("hi", 1)
    assert isinstance(busy_, RequestFailure) and busy_.kind is FailureKind.HTTP
    assert (busy_.status, busy_.retry_after_s, busy_.message, busy_.retryable, busy_.overload) == (
        503,
        2.0,
        "overloaded",
        True,
        True,
    )

    def down(request: Request) -> Response:
        raise refused(request.url)

    async with Client(transport=MockTransport(down)) as client:
        failure = await client.complete("http://x", "completions", {"prompt": "a"})
        assert isinstance(failure, RequestFailure) and failure.kind is FailureKind.CONNECT and failure.server_fault
        assert (
            not await client.ping("http://x")
            and not await client.ready("http://x")
            and await client.models("http://x") is None
        )


# ------------------------------------------------------------------ one probe, one identity rule
class _Holder:
    """A host whose port is held by a given process group (or by nobody visible)."""

    def __init__(self, pgid: int | None) -> None:
        self.pgid = pgid

    async def port_holder(self, port: int) -> PortHolder | None:
        return None if self.pgid is None else PortHolder(pid=self.pgid, pgid=self.pgid, evidence="test")


def _answers(status: int, models: list[str] | None = None) -> MockTransport:
    def handler(request: Request) -> Response:
        if request.path == "/v1/models" and models is not None:
            return Response(200, json.dumps({"data": [{"id": m} for m in models]}).encode())
        return Response(status, b"")

    return MockTransport(handler)


@pytest.mark.parametrize(
    ("status", "holder", "models", "outcome"),
    [
        (200, 7, None, ProbeOutcome.OK),  # ours by its process group
        (200, 9, None, ProbeOutcome.WRONG_IDENTITY),  # another group holds the port
        (200, None, ["m"], ProbeOutcome.OK),  # owner unseen: the served name decides
        (200, None, ["other"], ProbeOutcome.WRONG_IDENTITY),
        (503, 7, None, ProbeOutcome.HTTP),  # ours, loading
        (503, 9, None, ProbeOutcome.WRONG_IDENTITY),  # `status` names a foreign answer even when not ready
    ],
)
async def test_probe_once_applies_the_identity_rule_of_wait(
    status: int, holder: int | None, models: list[str] | None, outcome: ProbeOutcome
) -> None:
    async with HttpClient(_answers(status, models)) as client:
        prober = Prober(client, "http://127.0.0.1:8000", _Holder(holder), pgid=7, port=8000, served_model="m")  # type: ignore[arg-type]
        try:
            result = await prober.probe_once(Probe(("/health",)))
        finally:
            await prober.close()
    assert result.outcome is outcome, result


@pytest.mark.parametrize(
    ("error", "outcome"),
    [(refused, ProbeOutcome.REFUSED), (reset, ProbeOutcome.REFUSED), (timed_out, ProbeOutcome.HTTP)],
)
async def test_probe_failures_map_to_outcomes(error: Callable[[], TransportError], outcome: ProbeOutcome) -> None:
    def handler(request: Request) -> Response:
        raise error()

    async with HttpClient(MockTransport(handler)) as client:
        prober = Prober(client, "http://127.0.0.1:8000", _Holder(7), pgid=7, port=8000)  # type: ignore[arg-type]
        result = await prober.probe(Probe(("/health",), timeout_s=0.5))
        await prober.close()
    assert result.outcome is outcome and result.status is None


async def test_smoke_request_through_the_layer() -> None:
    def handler(request: Request) -> Response:
        assert (
            request.headers.get("Content-Type") == "application/json"
            and json.loads(request.body or b"")["max_tokens"] == 1
        )
        return Response(500, b'{"error": "head size 80 is not supported"}')

    async with HttpClient(MockTransport(handler)) as client:
        prober = Prober(client, "http://127.0.0.1:8000", _Holder(7), pgid=7, port=8000, served_model="m")  # type: ignore[arg-type]
        smoke = await prober.smoke(EngineProfile())
    assert not smoke.ok and "HTTP 500" in smoke.detail and "head size" in smoke.detail


# ------------------------------------------------------------------ engine knowledge stays in profiles
@pytest.mark.parametrize(
    ("owner", "info", "metrics", "engine"),
    [
        ("vllm", None, "", "vllm"),
        ("SGLang", None, "", "sglang"),
        ("llamacpp", None, "", "llamacpp"),
        ("tgi", None, "", "tgi"),
        ("sglang", None, "vllm:num_requests_running 1", "sglang"),  # /v1/models' owner is trusted first
        (None, {"max_total_num_tokens": 1000}, "vllm:x 1", "sglang"),  # then the info document
        (None, None, "vllm:num_requests_running 1", "vllm"),
        (None, None, "llamacpp:tokens 1", "llamacpp"),
        (None, None, "tgi_queue_size 0", "tgi"),
        ("someone", {"version": "1"}, "process_cpu 1", None),
    ],
)
def test_a_bare_server_is_recognised_by_the_profiles(
    owner: str | None, info: dict | None, metrics: str, engine: str | None
) -> None:
    assert recognise(owner, info, metrics) == engine


@pytest.mark.parametrize(
    ("engine", "asked", "sent"),
    [
        ("vllm", None, True),
        ("sglang", None, True),
        ("llamacpp", None, True),
        ("sim", None, True),
        ("transformers", None, False),
        ("tgi", None, False),
        ("openai", None, False),
        (None, None, True),
        ("not-an-engine", None, True),
        ("transformers", True, True),
        ("vllm", False, False),
    ],
)
def test_ignore_eos_follows_the_profile_unless_asked(engine: str | None, asked: bool | None, sent: bool) -> None:
    config = BenchConfig(concurrency=[1], requests=1, input_len=8, output_len=8, ignore_eos=asked)
    assert wants_ignore_eos(config, engine) is sent
