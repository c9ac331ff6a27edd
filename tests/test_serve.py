"""`servefleet serve`'s gateway in this process, in front of simulated engines in real processes,
driven by the real `openai` client (sync and async, streaming and not) and raw HTTP where the
client would hide what is checked (status, headers, error shape)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import openai
import pytest
from aiohttp import web

from conftest import SimProcess, async_wait_until
from servefleet.generate.client import Client
from servefleet.generate.endpoints import Target, targets_from_urls
from servefleet.generate.health import HealthPolicy
from servefleet.serve import Gateway, ServeConfig
from servefleet.serve.backend import Backend
from servefleet.serve.errors import ApiError
from servefleet.serve.requests import parse_request
from servefleet.serve.router import QueueFull, Router
from test_generate_sim import FAST_SIM

MODEL = "sim-model"


def sim_requests(sim: SimProcess) -> float:
    """Completions the sim itself answered (its own counter)."""
    with urllib.request.urlopen(sim.url + "/metrics", timeout=5) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith("vllm:request_success_total"):
                return float(line.rsplit(" ", 1)[1])
    raise AssertionError("no request counter in the sim's /metrics")


def start_sims(tmp: Path, n: int, *args: str) -> list[SimProcess]:
    sims = [SimProcess(*FAST_SIM, "--max-running", "8", *args, log_path=tmp / f"sim{i}.log").start() for i in range(n)]
    for s in sims:
        s.wait_ready()
    return sims


@pytest.fixture(scope="module")
def sims(tmp_path_factory: pytest.TempPathFactory):
    started = start_sims(tmp_path_factory.mktemp("serve-sims"), 2)
    yield started
    for s in started:
        s.stop()


@contextlib.asynccontextmanager
async def gateway(sims: list[SimProcess], **config: object) -> AsyncIterator[Gateway]:
    async with Client() as probe:
        targets = await targets_from_urls([s.url for s in sims], probe)
    gw = Gateway(ServeConfig(port=0, **config))  # type: ignore[arg-type]
    await gw.start(targets)
    try:
        yield gw
    finally:
        await gw.stop()


def aclient(gw: Gateway, **kw: object) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=gw.url, api_key=kw.pop("api_key", "none"), **kw)  # type: ignore[arg-type]


# ---- what is checked before any server sees a request (pure) --------------------------------------


@pytest.mark.parametrize(
    ("raw", "path", "param", "says"),
    [
        (b"", "/v1/completions", None, "no body"),
        (b"{bad", "/v1/completions", None, "not valid JSON"),
        (b"[1, 2]", "/v1/completions", None, "JSON object"),
        (b'{"prompt": "x"}', "/v1/completions", "model", "missing field 'model'"),
        (b'{"model": 3, "prompt": "x"}', "/v1/completions", "model", "non-empty string"),
        (b'{"model": "m"}', "/v1/completions", "prompt", "missing field 'prompt'"),
        (b'{"model": "m", "prompt": 5}', "/v1/completions", "prompt", "string or a list"),
        (b'{"model": "m"}', "/v1/chat/completions", "messages", "missing field 'messages'"),
        (b'{"model": "m", "messages": []}', "/v1/chat/completions", "messages", "non-empty list"),
        (b'{"model": "m", "prompt": "x", "stream": "yes"}', "/v1/completions", "stream", "true or false"),
    ],
)
def test_bad_requests_are_400_naming_the_field(raw: bytes, path: str, param: str | None, says: str) -> None:
    with pytest.raises(ApiError) as err:
        parse_request(raw, path)
    assert err.value.status == 400 and err.value.param == param and says in err.value.message


def test_a_good_request_gives_its_model_and_whether_it_streams() -> None:
    p = parse_request(
        b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": true}', "/v1/chat/completions"
    )
    assert (p.model, p.stream) == ("m", True)
    assert parse_request(b'{"model": "m", "prompt": ["a", "b"]}', "/v1/completions").stream is False


# ---- routing and the bounded queue (pure asyncio) ---------------------------------------------------


def backend(name: str, limit: int, models: tuple[str, ...] = (MODEL,)) -> Backend:
    return Backend.create(Target(name, f"http://127.0.0.1:1/{name}"), models, limit, HealthPolicy())


def test_the_gateway_ends_a_step_far_below_the_best_one_lifetime_in() -> None:
    """As generate's dispatcher does: a step on trial that the server's own counter reads a third below the best,
    one request lifetime and a few scrapes in, is judged there (the supervisor's tick), not after its whole window;
    on our own answers alone (they come in lumps) it runs its length."""
    from servefleet.generate.concurrency import ConcurrencyController, Window
    from servefleet.generate.server_load import LoadSample
    from servefleet.serve.supervisor import Supervisor

    b = Backend.create(Target("a", "http://127.0.0.1:1/a"), (MODEL,), None, HealthPolicy())
    b.controller = ConcurrencyController.auto(1024, bench_concurrency=512)
    b.requests, b.latency_sum_s = 50, 150.0  # lifetimes of 3 s
    b.controller.observe(Window(43_000.0))  # 512 -> 589, on trial
    t0 = b.window_start
    b.load.samples.extend(LoadSample(t0 + 0.5 * i, 28_000.0 * 0.5 * i, None, None, 589.0, 0.0) for i in range(9))
    b.ticks = b.saturated_ticks = 8
    assert not b.window_due(t0 + 4.0, 2.0)
    assert b.cut_short(t0 + 4.0, 2.0) is None  # no /metrics known: our answers alone never cut
    b.load.available = True
    assert b.cut_short(t0 + 2.5, 2.0) is None  # under one lifetime
    cut = b.cut_short(t0 + 4.0, 2.0)
    assert cut is not None and cut.cut and cut.tps == pytest.approx(28_000.0)
    events: list[str] = []
    sup = Supervisor(Router(max_queue=1, queue_timeout_s=1), Client(), policy=HealthPolicy(), on_event=events.append)
    sup._tick_window(b, t0 + 4.0)
    assert b.limit == 512 and "in its first 1.3 request lifetimes" in events[-1], events


def test_the_gateways_ramp_judges_its_short_windows_when_answers_take_longer() -> None:
    """The gateway ramps on windows of ``window_min_s`` (the server's queue gauge says whether it has room), not of
    request lifetimes: a window shorter than two answers' latency must still be judged, or the ramp never moves."""
    from servefleet.generate.server_load import LoadSample

    b = Backend.create(Target("a", "http://127.0.0.1:1/a"), (MODEL,), None, HealthPolicy())
    b.requests, b.latency_sum_s = 20, 200.0  # answers of 10 s
    b.load.available = True
    start, t, tokens = b.limit, b.window_start, 0.0
    for rate in (1_000.0, 2_000.0):  # each window grows in proportion to what was added
        for _ in range(5):
            t += 0.5
            tokens += rate * 0.5
            b.load.samples.append(LoadSample(t, tokens, None, None, float(b.limit), 0.0))
        b.ticks = b.saturated_ticks = 4  # the limit was kept in flight
        assert b.window_due(t, 2.0)
        assert b.controller.observe(b.measure(t)), b.controller.reason
        b.new_window(t)
    assert b.limit > 2 * start and b.controller.phase == "ramp"


async def test_least_loaded_by_model_then_a_bounded_wait_then_429() -> None:
    router = Router(max_queue=1, queue_timeout_s=5)
    a, b, other = backend("a", 2), backend("b", 1), backend("c", 4, ("other",))
    for x in (a, b, other):
        router.add(x)
    got = [await router.acquire(MODEL) for _ in range(3)]
    assert sorted(x.name for x in got) == ["a", "a", "b"]  # least loaded first; never the other model's server
    assert other.in_flight == 0
    waiter = asyncio.ensure_future(router.acquire(MODEL))
    await asyncio.sleep(0)  # let it queue
    assert router.queued(MODEL) == 1
    with pytest.raises(QueueFull) as full:
        await router.acquire(MODEL)
    assert full.value.retry_after_s >= 1 and router.rejected[MODEL] == 1
    router.release(b)  # the freed slot goes to the waiter, not to a newcomer
    assert (await asyncio.wait_for(waiter, 1)) is b and router.queued(MODEL) == 0


async def test_a_retry_avoids_the_server_that_failed_unless_it_is_the_only_one_with_room() -> None:
    router = Router()
    a, b = backend("a", 4), backend("b", 4)
    router.add(a)
    router.add(b)
    assert (await router.acquire(MODEL, frozenset({"a"}))) is b
    assert (await router.acquire(MODEL, frozenset({"a"}))) is b  # b is now the more loaded, still not a
    b.health.take_out()
    assert (await router.acquire(MODEL, frozenset({"a"}))) is a  # the only one left


# ---- the real openai client through the gateway ------------------------------------------------------


async def test_the_openai_client_sync_and_async_streaming_and_not(sims) -> None:
    async with gateway(sims, max_queue=100) as gw, aclient(gw, max_retries=0) as client:
        listed = await client.models.list()
        assert [m.id for m in listed.data] == [MODEL]
        assert sorted(s["name"] for s in listed.data[0].model_extra["servers"]) == [
            "url1",
            "url2",
        ]  # which servers serve it

        done = await client.completions.create(model=MODEL, prompt="hello", max_tokens=5)
        assert done.choices[0].text and done.usage.completion_tokens == 5
        chat = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
        assert chat.choices[0].message.content is not None

        stream = await client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=6,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        pieces = [c.choices[0].delta.content async for c in stream if c.choices and c.choices[0].delta.content]
        assert len(pieces) == 6
        cstream = await client.completions.create(
            model=MODEL, prompt="x", max_tokens=3, stream=True, extra_body={"ignore_eos": True}
        )
        assert len([c async for c in cstream if c.choices and c.choices[0].text]) == 3

        def sync_calls() -> tuple[str, int]:
            with openai.OpenAI(base_url=gw.url, api_key="none", max_retries=0) as sync:
                text = sync.completions.create(model=MODEL, prompt="hello", max_tokens=3).choices[0].text
                n = sum(
                    1
                    for c in sync.chat.completions.create(
                        model=MODEL,
                        messages=[{"role": "user", "content": "x"}],
                        max_tokens=3,
                        stream=True,
                        extra_body={"ignore_eos": True},
                    )
                    if c.choices and c.choices[0].delta.content
                )
            return text, n

        text, n = await asyncio.to_thread(sync_calls)
        assert text and n == 3

        # many at once: spread over both servers (least loaded)
        await asyncio.gather(
            *(
                client.completions.create(model=MODEL, prompt="p", max_tokens=20, extra_body={"ignore_eos": True})
                for _ in range(40)
            )
        )
        assert all(b.requests >= 5 for b in gw.router.backends.values()), {
            b.name: b.requests for b in gw.router.backends.values()
        }

        async with aiohttp.ClientSession() as http, http.get(gw.url.removesuffix("/v1") + "/metrics") as resp:
            text = await resp.text()
        assert 'servefleet_serve_server_requests_total{model="sim-model",server="url1"}' in text
        assert "servefleet_serve_server_concurrency_limit" in text and "servefleet_serve_server_outages_total" in text


async def test_bad_input_gets_openais_error_shape_and_never_reaches_a_server(sims) -> None:
    before = [sim_requests(s) for s in sims]
    async with gateway(sims, max_body_bytes=1000) as gw, aiohttp.ClientSession() as http:
        cases = [
            ("/v1/completions", b"{not json", 400, None),
            ("/v1/completions", b'{"prompt": "x"}', 400, "model"),
            ("/v1/chat/completions", b'{"model": "sim-model"}', 400, "messages"),
            ("/v1/completions", b'{"model": "gpt-nope", "prompt": "x"}', 404, "model"),
            ("/v1/completions", b'{"model": "sim-model", "prompt": "' + b"x" * 2000 + b'"}', 413, None),
        ]
        for path, body, status, param in cases:
            async with http.post(
                gw.url.removesuffix("/v1") + path, data=body, headers={"Content-Type": "application/json"}
            ) as resp:
                doc = await resp.json()
            assert resp.status == status, (path, body[:40], doc)
            assert set(doc["error"]) >= {"message", "type", "param", "code"} and doc["error"]["param"] == param, doc
        async with aclient(gw, max_retries=0) as client:
            with pytest.raises(openai.NotFoundError, match="gpt-nope"):  # the client's own class for it
                await client.completions.create(model="gpt-nope", prompt="x")
        assert all(b.requests == 0 and b.errors == 0 for b in gw.router.backends.values())
    assert [sim_requests(s) for s in sims] == before


async def test_a_full_queue_is_429_with_retry_after_and_the_clients_retries_then_succeed(tmp_path) -> None:
    (slow,) = start_sims(tmp_path, 1, "--decode-ms", "15")
    try:
        async with gateway([slow], concurrency=1, max_queue=1) as gw, aiohttp.ClientSession() as http:
            url = gw.url + "/completions"
            body = {"model": MODEL, "prompt": "x", "max_tokens": 30, "ignore_eos": True}
            first = asyncio.ensure_future(http.post(url, json=body))
            await async_wait_until(
                lambda: _true(gw.router.backends["url"].in_flight == 1),
                timeout=10,
                what="the first request at the server",
            )
            second = asyncio.ensure_future(http.post(url, json=body))
            await async_wait_until(
                lambda: _true(gw.router.queued(MODEL) == 1), timeout=10, what="the second request queued"
            )
            async with http.post(url, json=body) as third:
                doc = await third.json()
                assert third.status == 429 and int(third.headers["Retry-After"]) >= 1, doc
                assert doc["error"]["type"] == "rate_limit_error" and doc["error"]["code"] == "queue_full"
            for fut in (first, second):
                resp = await fut
                assert resp.status == 200
                resp.release()
            # the openai client backs off on 429 (honouring Retry-After) and gets through
            async with aclient(gw, max_retries=8) as client:
                answers = await asyncio.gather(
                    *(client.completions.create(model=MODEL, prompt="p", max_tokens=5) for _ in range(4))
                )
            assert all(a.choices[0].text for a in answers)
            assert gw.router.rejected[MODEL] >= 2  # the clients were refused, then retried
    finally:
        slow.stop()


async def _true(value: bool) -> bool:
    return value


async def test_a_server_sigkilled_under_load_costs_the_client_nothing(tmp_path) -> None:
    """Requests on the killed server had sent the client nothing (non-streaming answers are read
    whole first): each is sent again to the other server. max_retries=0: any failure would show."""
    victim, survivor = start_sims(tmp_path, 2, "--decode-ms", "4")
    try:
        async with gateway([victim, survivor], max_queue=200) as gw, aclient(gw, max_retries=0) as client:
            answered = 0

            async def one() -> None:
                nonlocal answered
                r = await client.completions.create(
                    model=MODEL, prompt="p", max_tokens=24, extra_body={"ignore_eos": True}
                )
                assert r.usage.completion_tokens == 24
                answered += 1

            async def kill_midway() -> None:
                await async_wait_until(
                    lambda: _true(answered >= 20 and gw.router.backends["url1"].in_flight > 0),
                    timeout=30,
                    what="load on both servers",
                )
                os.killpg(victim.proc.pid, signal.SIGKILL)

            killer = asyncio.ensure_future(kill_midway())
            await asyncio.gather(*(one() for _ in range(120)))
            await killer
            dead = gw.router.backends["url1"]
            assert answered == 120
            assert gw.forwarder.retried >= 1 and dead.errors >= 1
            await async_wait_until(lambda: _true(not dead.up), timeout=10, what="the dead server taken out")
            assert dead.health.outages == 1
    finally:
        victim.stop()
        survivor.stop()


async def test_a_hung_server_is_taken_out_and_its_requests_answered_elsewhere(tmp_path) -> None:
    """SIGSTOP: the process holds its connections and answers nothing. Progress (answers, the
    engine's counters) stops; the gateway takes it out and sends its requests to the other."""
    hung, good = start_sims(tmp_path, 2, "--decode-ms", "4")
    policy = HealthPolicy(hang_min_s=3.0, probe_interval_s=1.0, probe_timeout_s=2.0, recover_timeout_s=600)
    try:
        async with (
            gateway([hung, good], health=policy, max_queue=100) as gw,
            aclient(gw, max_retries=0, timeout=60) as client,
        ):
            await asyncio.gather(
                *(client.completions.create(model=MODEL, prompt="p", max_tokens=5) for _ in range(20))
            )
            os.killpg(hung.proc.pid, signal.SIGSTOP)
            answers = await asyncio.gather(
                *(client.completions.create(model=MODEL, prompt="p", max_tokens=20) for _ in range(60))
            )
            assert all(a.choices[0].text for a in answers)
            out = gw.router.backends["url1"]
            assert not out.up and out.health.outages == 1
            assert any("url1: taken out" in e for e in gw.supervisor.events), list(gw.supervisor.events)
            async with aiohttp.ClientSession() as http, http.get(gw.url.removesuffix("/v1") + "/health") as resp:
                health = await resp.json()
            assert resp.status == 200 and health["servers"] == {"url1": "down", "url2": "up"}
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(hung.proc.pid, signal.SIGCONT)
        hung.stop()
        good.stop()


async def test_api_keys_are_required_when_set_and_health_stays_open(sims) -> None:
    async with gateway(sims, api_keys=("k1", "k2")) as gw:
        async with aclient(gw, api_key="wrong", max_retries=0) as wrong:
            with pytest.raises(openai.AuthenticationError):
                await wrong.models.list()
        for key in ("k1", "k2"):
            async with aclient(gw, api_key=key, max_retries=0) as client:
                r = await client.completions.create(model=MODEL, prompt="p", max_tokens=2)
            assert r.choices[0].text
        async with aiohttp.ClientSession() as http:
            async with http.get(gw.url.removesuffix("/v1") + "/health") as resp:
                assert resp.status == 200
            async with http.get(gw.url.removesuffix("/v1") + "/metrics") as resp:
                assert resp.status == 401 and (await resp.json())["error"]["code"] == "invalid_api_key"
            async with http.post(gw.url + "/completions", json={"model": MODEL, "prompt": "p"}) as resp:
                assert resp.status == 401


# ---- a server that breaks mid-answer (in-process fakes: the moment of the break is exact) ---------------


class Breaker:
    """An OpenAI-ish server. ``breaks``: it drops the connection before answering, or, streaming,
    right after the first event."""

    def __init__(self, breaks: bool) -> None:
        self.breaks = breaks
        self.requests = 0
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> Breaker:
        app = web.Application()
        app.add_routes(
            [
                web.get("/v1/models", self.models),
                web.get("/health", self.models),
                web.post("/v1/completions", self.complete),
            ]
        )
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}"
        return self

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    async def complete(self, request: web.Request) -> web.StreamResponse:
        self.requests += 1
        body = await request.json()
        event = {
            "id": "c",
            "object": "text_completion",
            "created": 0,
            "model": MODEL,
            "choices": [{"index": 0, "text": "hi", "finish_reason": None}],
        }
        if not body.get("stream"):
            if self.breaks:
                request.transport.close()
                return web.Response()
            return web.json_response(
                {**event, "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}
            )
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b"data: " + json.dumps(event).encode() + b"\n\n")
        if self.breaks:
            request.transport.close()
            return resp
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


async def test_a_break_before_any_byte_is_retried_elsewhere_and_a_started_stream_never_is() -> None:
    breaker, good = await Breaker(True).start(), await Breaker(False).start()
    try:
        gw = Gateway(ServeConfig(port=0, concurrency=4))
        await gw.start(
            [Target("breaker", breaker.url), Target("good", good.url)]
        )  # equal load: the first one is picked first
        try:
            async with aclient(gw, max_retries=0) as client:
                answer = await client.completions.create(model=MODEL, prompt="p", max_tokens=1)
                assert answer.choices[0].text == "hi"
                assert (breaker.requests, good.requests) == (1, 1)  # broke before answering: sent again, to the other
                assert gw.forwarder.retried == 1

                stream = await client.completions.create(model=MODEL, prompt="p", max_tokens=1, stream=True)
                got = []
                with pytest.raises(openai.APIError, match="breaker failed mid-stream"):
                    async for chunk in stream:
                        got.append(chunk.choices[0].text)
                assert got == ["hi"]  # the client had the first event from the breaker ...
                assert (breaker.requests, good.requests) == (2, 1)  # ... so it was not sent again
                assert gw.forwarder.retried == 1
        finally:
            await gw.stop()
    finally:
        await breaker.stop()
        await good.stop()


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.0.0.2", True),
        ("::1", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.1.2.3", False),
        ("gpu-box.example", False),
    ],
)
def test_which_addresses_are_loopback(host: str, loopback: bool) -> None:
    from servefleet.errors import OptionError
    from servefleet.serve import check_bind, is_loopback

    assert is_loopback(host) is loopback
    if loopback:
        check_bind(host, ())
    else:
        with pytest.raises(OptionError, match="--api-key"):
            check_bind(host, ())
        check_bind(host, ("k",))


class SimRestarter:
    """A fleet stand-in: restarting a server starts a fresh sim process (a new port) and returns it."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.started: list[SimProcess] = []

    async def restart(self, name: str, on_event) -> Target | None:
        sim = SimProcess(
            *FAST_SIM, "--max-running", "8", "--decode-ms", "4", log_path=self.tmp / f"{name}-{len(self.started)}.log"
        ).start()
        self.started.append(sim)
        await asyncio.to_thread(sim.wait_ready)
        return Target(name, sim.url, MODEL, 8, managed=True)


async def test_a_dead_managed_server_is_restarted_and_back_in_service(tmp_path) -> None:
    (first,) = start_sims(tmp_path, 1, "--decode-ms", "4")
    restarter = SimRestarter(tmp_path)
    policy = HealthPolicy(retry_interval_s=0.2)
    try:
        gw = Gateway(ServeConfig(port=0, health=policy, max_queue=100), restarter=restarter)
        await gw.start([Target("s", first.url, MODEL, 8, managed=True)])
        try:
            async with aclient(gw, max_retries=0, timeout=60) as client:
                await asyncio.gather(
                    *(client.completions.create(model=MODEL, prompt="p", max_tokens=5) for _ in range(10))
                )
                first.stop()  # SIGKILL
                # requests wait in the queue while it is restarted, then go to the new process
                answers = await asyncio.gather(
                    *(client.completions.create(model=MODEL, prompt="p", max_tokens=5) for _ in range(20))
                )
            assert all(a.choices[0].text for a in answers)
            s = gw.router.backends["s"]
            assert (
                s.up
                and s.health.restarts == 1
                and s.health.outages == 1
                and s.target.base_url == restarter.started[0].url
            )
            assert any("s: back in service" in e for e in gw.supervisor.events)
        finally:
            await gw.stop()
    finally:
        first.stop()
        for sim in restarter.started:
            sim.stop()


async def test_a_port_in_use_is_a_configuration_error_naming_it(sims) -> None:
    import socket

    from servefleet.errors import ConfigError

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        gw = Gateway(ServeConfig(port=port))
        with pytest.raises(ConfigError, match=f"--port {port}: cannot listen there"):
            await gw.start([Target("s", sims[0].url, MODEL)])
        await gw.stop()
