"""bench asks the engine profiles where a server's info document is and how its /tokenize is spoken
(``EngineProfile.info_paths`` / ``tokenize``, through ``engines.registry``): each engine's shape
against a fake server of that engine (MockTransport), and what happens when a server does not fit."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from servefleet.bench.server_metrics import ServerWatcher, fetch_server_info
from servefleet.bench.workload import find_server_tokenizer
from servefleet.engines.registry import get_engine, info_paths, tokenize_endpoints
from servefleet.http import HttpClient, Response
from servefleet.http.mock import MockTransport, Request

Answer = Callable[[dict[str, Any]], Any]


def _words(text: str) -> list[int]:
    return list(range(len(text.split())))


# How a server of each engine answers POST /tokenize (None: the body is not what it takes -> 422),
# from the engines' own request and response models.
def _vllm_like(body: dict[str, Any]) -> Any:
    if (
        not isinstance(body.get("prompt"), str)
        or body.get("add_special_tokens") is not False
        or body.get("model") != "m"
    ):
        return None
    ids = _words(body["prompt"])
    return {"count": len(ids), "max_model_len": 4096, "tokens": ids, "token_strs": None}


def _llamacpp(body: dict[str, Any]) -> Any:
    if not isinstance(body.get("content"), str) or body.get("add_special") is not False:
        return None
    return {"tokens": _words(body["content"])}


def _tgi(body: dict[str, Any]) -> Any:
    if not isinstance(body.get("inputs"), str):
        return None
    return [{"id": i, "text": w, "start": 0, "stop": 1} for i, w in enumerate(body["inputs"].split())]


TOKENIZE_SERVERS: dict[str, Answer] = {
    "vllm": _vllm_like,
    "sglang": _vllm_like,
    "sim": _vllm_like,
    "llamacpp": _llamacpp,
    "tgi": _tgi,
}


def tokenize_server(answer: Answer | None) -> MockTransport:
    def handler(request: Request) -> Response:
        if answer is None or request.path != "/tokenize" or request.method != "POST":
            return Response(404, b'{"detail": "Not Found"}')
        got = answer(json.loads(request.body or b"{}"))
        return (
            Response(422, b'{"detail": "unprocessable"}') if got is None else Response(200, json.dumps(got).encode())
        )

    return MockTransport(handler)


@pytest.mark.parametrize("engine", sorted(TOKENIZE_SERVERS))
async def test_each_engine_is_asked_in_its_own_tokenize_shape(engine: str) -> None:
    transport = tokenize_server(TOKENIZE_SERVERS[engine])
    async with HttpClient(transport) as client:
        tok = await find_server_tokenizer(client, "http://x/", "m", engine)
        assert tok is not None and tok.exact
        assert await tok.count(["the of and", "to in", "is"]) == [3, 2, 1]
    assert tok.name == f"server:/tokenize ({engine})"
    # the profile's shape only: every request was answered (nothing tried and refused first)
    assert len(transport.requests) == 4 and all(r.url == "http://x/tokenize" for r in transport.requests)


@pytest.mark.parametrize("engine", ["llamacpp", "tgi", "sglang"])
async def test_a_server_of_unknown_engine_is_asked_every_shape_until_one_fits(engine: str) -> None:
    transport = tokenize_server(TOKENIZE_SERVERS[engine])
    async with HttpClient(transport) as client:
        tok = await find_server_tokenizer(client, "http://x", "m", None)
        assert tok is not None and await tok.count(["a b c d"]) == [4]
    assert tok.endpoint == get_engine(engine).tokenize


async def test_no_tokenize_means_no_counter_and_each_shape_is_asked_once() -> None:
    transport = tokenize_server(None)
    async with HttpClient(transport) as client:
        assert await find_server_tokenizer(client, "http://x", "m", None) is None
    bodies = [json.loads(r.body or b"{}") for r in transport.requests]
    # vLLM's and SGLang's shapes are one: three distinct requests, not four
    assert sorted(next(iter(b)) for b in bodies) == ["content", "inputs", "prompt"]
    assert len(tokenize_endpoints(None)) == 3 == len(set(tokenize_endpoints(None)))


async def test_an_engine_without_tokenize_sends_nothing() -> None:
    transport = tokenize_server(_vllm_like)
    async with HttpClient(transport) as client:
        assert await find_server_tokenizer(client, "http://x", "m", "transformers") is None
    assert transport.requests == []


async def test_an_answer_of_the_wrong_shape_is_no_counter() -> None:
    """vLLM's shape, but the server answers with llama.cpp's (no count): not trusted."""
    transport = tokenize_server(lambda body: {"tokens": [1, 2]})
    async with HttpClient(transport) as client:
        assert await find_server_tokenizer(client, "http://x", "m", "vllm") is None


# ---- the info document -------------------------------------------------------------------------
def info_server(paths: dict[str, Any]) -> MockTransport:
    def handler(request: Request) -> Response:
        if request.path in paths:
            return Response(200, json.dumps(paths[request.path]).encode())
        return Response(404, b"Not Found")

    return MockTransport(handler)


def test_info_paths_come_from_the_profiles() -> None:
    assert info_paths("sglang") == ("/server_info", "/get_server_info") == info_paths("sim")
    assert info_paths("vllm") == info_paths("llamacpp") == info_paths("tgi") == info_paths("transformers") == ()
    # a server whose engine is not known may be SGLang
    assert (
        info_paths(None)
        == info_paths("openai")
        == info_paths("no-such-engine")
        == ("/server_info", "/get_server_info")
    )


async def test_an_older_sglang_serves_its_info_at_get_server_info() -> None:
    doc = {"max_total_num_tokens": 1000, "internal_states": [{"avg_spec_accept_length": 2.5}], "version": "0.4.0"}
    transport = info_server({"/get_server_info": doc})
    async with HttpClient(transport) as client:
        assert await fetch_server_info(client, "http://x/", info_paths("sglang")) == doc
        capacity = await get_engine("sglang").capacity_from_server(client, "http://x")
    assert [r.path for r in transport.requests][:2] == ["/server_info", "/get_server_info"]
    assert capacity.kv_cache_tokens == 1000 and capacity.source["kv_cache_tokens"] == "endpoint:/get_server_info"


async def test_a_vllm_server_is_not_asked_for_an_info_document() -> None:
    transport = info_server({"/metrics": "", "/server_info": {"internal_states": []}})
    async with HttpClient(transport) as client:
        assert await fetch_server_info(client, "http://x", info_paths("vllm")) is None
        watcher = ServerWatcher("http://x", client, info_paths=info_paths("vllm"))
        snap = await watcher.scrape()
    assert snap.server_info is None and [r.path for r in transport.requests] == ["/metrics"]


async def test_the_watcher_reads_the_info_document_where_the_profile_says() -> None:
    transport = info_server({"/server_info": {"internal_states": [{"avg_spec_accept_length": 3.0}]}})
    async with HttpClient(transport) as client:
        watcher = ServerWatcher("http://x", client, info_paths=info_paths("sglang"))
        first, second = await watcher.scrape(), await watcher.scrape()
    assert first.server_info == second.server_info == {"internal_states": [{"avg_spec_accept_length": 3.0}]}
    assert watcher.has_metrics is False  # /metrics answered 404: asked once, then no more
    assert [r.path for r in transport.requests] == ["/metrics", "/server_info", "/server_info"]
