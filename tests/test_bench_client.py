"""The load generator's HTTP client and the whole run, against a small in-test OpenAI-like server.

The server's behaviour is chosen per request by a word in the prompt, so one server covers
normal streams, several tokens per arrival, missing usage, HTTP errors, an error event inside a
stream, a connection cut mid-stream and a request that never ends.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp import web

from conftest import free_port
from servefleet.bench.client import EndpointConfig, OpenAIBackend, PreparedRequest
from servefleet.bench.metrics import summarize
from servefleet.bench.result import BenchConfig, Run
from servefleet.bench.sweep import BenchError, BenchTarget, ServerUnreachable, run_bench


def _prompt(body: dict) -> str:
    if "messages" in body:
        return body["messages"][-1]["content"]
    return body.get("prompt", "")


async def _completions(request: web.Request) -> web.StreamResponse:
    app = request.app[STATE]
    body = await request.json()
    app["bodies"].append(body)
    if app.get("strict") and "continuous_usage_stats" in body.get("stream_options", {}):
        return web.json_response({"error": {"message": "unknown field continuous_usage_stats"}}, status=400)
    prompt = _prompt(body)
    n = int(body.get("max_tokens", 8))
    for word, status in (("RATELIMIT", 429), ("BOOM", 500)):
        if word in prompt:
            return web.json_response({"error": {"message": f"{word.lower()} now"}}, status=status)
    if "HANG" in prompt:
        await asyncio.sleep(30)
    per = 3 if "SPEC" in prompt else 1
    usage = not ("NOUSAGE" in prompt or app.get("no_usage"))
    if not body.get("stream"):
        out = {"choices": [{"index": 0, "message": {"role": "assistant", "content": " tok" * n}}]}
        if usage:
            out["usage"] = {"prompt_tokens": 5, "completion_tokens": n, "total_tokens": 5 + n}
        return web.json_response(out)
    cont = body.get("stream_options", {}).get("continuous_usage_stats") and usage
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    if "EMPTY" in prompt:
        return resp
    await resp.write(b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n')
    done = 0
    while done < n:
        await asyncio.sleep(0.004)
        k = 1 if done == 0 else min(per, n - done)
        if "BURST" in prompt:  # k separate events in one write: one arrival
            events = []
            for j in range(k):
                chunk = {"choices": [{"index": 0, "delta": {"content": " tok"}}]}
                if cont:
                    chunk["usage"] = {"prompt_tokens": 5, "completion_tokens": done + j + 1}
                events.append(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            await resp.write(b"".join(events))
        else:
            chunk = {"choices": [{"index": 0, "delta": {"content": " tok" * k}}]}
            if cont:
                chunk["usage"] = {"prompt_tokens": 5, "completion_tokens": done + k}
            await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        done += k
        if "CUT" in prompt and done >= 3:
            request.transport.close()
            return resp
        if "STREAMERR" in prompt and done >= 2:
            await resp.write(b'data: {"error":{"message":"engine died","code":500}}\n\n')
            return resp
    if usage and body.get("stream_options", {}).get("include_usage"):
        await resp.write(b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":%d}}\n\n' % n)
    await resp.write(b"data: [DONE]\n\n")
    return resp


async def _models(request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [{"id": "fake-model"}]})


STATE = web.AppKey("state", dict)


@pytest.fixture
async def fake_server():
    app = web.Application()
    state: dict = {"bodies": []}
    app[STATE] = state
    app.router.add_get("/v1/models", _models)
    app.router.add_post("/v1/chat/completions", _completions)
    app.router.add_post("/v1/completions", _completions)
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
    await runner.setup()
    port = free_port()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    yield state, f"http://127.0.0.1:{port}"
    await runner.cleanup()


def _req(prompt: str, n: int = 8, stream: bool = True, cont: bool = True) -> PreparedRequest:
    body = {"model": "fake-model", "messages": [{"role": "user", "content": prompt}], "max_tokens": n}
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True, "continuous_usage_stats": cont}
    return PreparedRequest(index=0, body=json.dumps(body).encode(), input_tokens=3, max_tokens=n)


async def _send(
    base: str, *reqs: PreparedRequest, stream: bool = True, timeout: float = 10.0, keep_text: bool = False
):
    backend = OpenAIBackend(
        EndpointConfig(base, "/v1/chat/completions", stream=stream, timeout_s=timeout, keep_text=keep_text)
    )
    await backend.open(4)
    try:
        return [await backend.send(r) for r in reqs]
    finally:
        await backend.close()


async def test_stream_with_continuous_usage_gives_exact_chunk_counts(fake_server) -> None:
    _, base = fake_server
    (r,) = await _send(base, _req("SPEC please", n=10))
    assert r.ok and r.completion_tokens == 10 and r.prompt_tokens == 5
    assert r.chunk_tokens == [1, 3, 3, 3]
    assert r.ttft is not None and 0 < r.ttft <= r.chunk_offsets[0] + 1e-9
    m = summarize([r])
    assert m.itl_ms.n == 9 and m.tokens_per_chunk == pytest.approx(2.5)


async def test_events_arriving_together_are_one_chunk(fake_server) -> None:
    _, base = fake_server
    (r,) = await _send(base, _req("SPEC BURST", n=7))
    assert r.ok and r.completion_tokens == 7
    assert r.chunk_tokens == [1, 3, 3]  # three events per write, each with one token


async def test_final_usage_only_is_shared_by_text_size(fake_server) -> None:
    _, base = fake_server
    (r,) = await _send(base, _req("SPEC", n=7, cont=False))
    assert r.ok and r.completion_tokens == 7 and r.chunk_tokens is None
    m = summarize([r])
    assert m.output_tokens == 7 and m.itl_ms.n == 6 and m.token_sources == {"usage": 1}


async def test_missing_usage_keeps_text_for_counting(fake_server) -> None:
    _, base = fake_server
    (r,) = await _send(base, _req("NOUSAGE", n=6), keep_text=True)
    assert r.ok and r.completion_tokens is None and r.text == " tok" * 6
    assert summarize([r], counted=lambda rec: len(rec.text.split())).output_tokens == 6


@pytest.mark.parametrize(
    "prompt, kind",
    [
        ("RATELIMIT", "rate_limited"),
        ("BOOM", "server_error"),
        ("STREAMERR", "stream_error"),
        ("CUT", "disconnected"),
        ("EMPTY", "bad_response"),
    ],
)
async def test_failures_are_records_not_exceptions(fake_server, prompt, kind) -> None:
    _, base = fake_server
    (r,) = await _send(base, _req(prompt, n=8))
    assert not r.ok and r.error_kind == kind and r.error
    assert r.end >= r.start


async def test_timeout_and_refused_connection(fake_server) -> None:
    _, base = fake_server
    (r,) = await _send(base, _req("HANG"), timeout=0.3)
    assert not r.ok and r.error_kind == "timeout"
    (r,) = await _send(f"http://127.0.0.1:{free_port()}", _req("hello"))
    assert not r.ok and r.error_kind == "connection"


async def test_non_streamed_answer(fake_server) -> None:
    _, base = fake_server
    (r,) = await _send(base, _req("hello", n=5, stream=False), stream=False)
    assert r.ok and r.completion_tokens == 5 and r.ttft is None and r.text_bytes == len(" tok" * 5)


async def test_run_bench_drops_refused_options_and_counts_errors(fake_server) -> None:
    app, base = fake_server
    app["strict"] = True  # refuses continuous_usage_stats with 400, like a strict server
    cfg = BenchConfig(concurrency=[1, 4], requests=8, input_len=16, output_len=20, warmup=2, stream=True)
    run = await run_bench(BenchTarget(base_url=base, label="fake"), cfg)
    Run.model_validate_json(run.model_dump_json())  # round-trips through the schema
    assert run.target.model == "fake-model"
    assert any("continuous_usage_stats" in n for n in run.notes)
    assert run.workload["request_options"]["stream_options"] == {"include_usage": True}
    assert [p.concurrency for p in run.points] == [1, 4]
    for p in run.points:
        assert p.requests == 8 and p.successful == 8 and p.errors == 0
        assert p.output_tokens == 8 * 20 and p.token_sources == {"usage": 8}
        assert p.itl_ms.n == 8 * 19 and p.ttft_ms.n == 8
    measured = [b for b in app["bodies"] if b.get("max_tokens") == 20]
    assert len(measured) == 16 and all(b.get("ignore_eos") for b in measured)
    warm = [b for b in app["bodies"] if b.get("max_tokens") == 16]
    assert len(warm) == 4  # two short warm-up requests per point, not measured


async def test_run_bench_without_usage_counts_text_and_says_so(fake_server) -> None:
    app, base = fake_server
    app["no_usage"] = True
    cfg = BenchConfig(concurrency=[2], requests=4, input_len=8, output_len=5, warmup=0)
    run = await run_bench(BenchTarget(base_url=base), cfg)
    (p,) = run.points
    assert any("no token usage" in n for n in run.notes)
    assert p.token_sources == {"estimated": 4}  # no /tokenize here: an estimate, labelled as such
    assert p.successful == 4


async def test_run_bench_unreachable_and_refusing_servers(fake_server, tmp_path) -> None:
    cfg = BenchConfig(concurrency=[1], requests=1, input_len=4, output_len=2)
    with pytest.raises(ServerUnreachable):
        await run_bench(BenchTarget(base_url=f"http://127.0.0.1:{free_port()}"), cfg)
    # A dataset whose only prompt is always rate limited: the probe fails and the run stops early.
    _, base = fake_server
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"prompt": "RATELIMIT", "max_tokens": 2}) + "\n")
    with pytest.raises(BenchError, match="rate_limited"):
        await run_bench(BenchTarget(base_url=base), cfg.model_copy(update={"dataset": str(path), "input_len": None}))
