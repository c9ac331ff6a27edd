"""generate end to end in one process: run_generate against small in-process OpenAI-style servers
whose behaviour each test scripts (latency, error storms, permanent errors, hanging)."""

from __future__ import annotations

import asyncio
import json
import random
import socket
import struct
from collections.abc import Callable
from pathlib import Path

import pytest
from aiohttp import web

from conftest import free_port
from parquet_read import read_parquet
from servefleet.generate.endpoints import Target
from servefleet.generate.health import HealthPolicy
from servefleet.generate.job import JobParams
from servefleet.generate.runner import GenerateConfig, JobMismatch, run_generate

Behaviour = Callable[[dict, int], "int | None"]  # (body, request number) -> error status or None


class FakeServer:
    """An OpenAI-style server in this process; counts what it sees."""

    def __init__(
        self,
        *,
        delay_s: float = 0.0,
        behaviour: Behaviour | None = None,
        hang: bool = False,
        name: str = "fake",
        gate: asyncio.Event | None = None,
    ) -> None:
        self.delay_s = delay_s
        self.gate = gate
        self.behaviour = behaviour
        self.hang = hang
        self.name = name
        self.port = free_port()
        self.requests = 0
        self.answered = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def target(self, max_running: int | None = None, managed: bool = False) -> Target:
        return Target(self.name, self.url, "fake-model", max_running, managed)

    async def start(self) -> FakeServer:
        app = web.Application()
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/completions", self._complete)
        app.router.add_post("/v1/chat/completions", self._complete)
        self.runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=0.2)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()
        return self

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None

    async def _models(self, request: web.Request) -> web.Response:
        if self.hang:
            await asyncio.sleep(3600)
        return web.json_response({"data": [{"id": "fake-model"}]})

    async def _complete(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests += 1
        n = self.requests
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.hang:
                await asyncio.sleep(3600)
            if self.gate is not None:
                await self.gate.wait()
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            status = self.behaviour(body, n) if self.behaviour else None
            if status is not None:
                headers = {"Retry-After": "0"} if status == 429 else None
                return web.json_response({"error": {"message": f"scripted {status}"}}, status=status, headers=headers)
            self.answered += 1
            tokens = body.get("max_tokens", 4)
            prompt = body.get("prompt") or body["messages"][-1]["content"]
            choice = {"finish_reason": "length", "token_ids": list(range(tokens))}
            if "messages" in body:
                choice["message"] = {"role": "assistant", "content": f"answer to {prompt}"}
            else:
                choice["text"] = f"answer to {prompt}"
            return web.json_response(
                {
                    "model": body.get("model"),
                    "choices": [choice],
                    "usage": {"prompt_tokens": 3, "completion_tokens": tokens},
                }
            )
        finally:
            self.in_flight -= 1


def write_input(path: Path, n: int, *, extra: list[str] | None = None) -> Path:
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"id": f"p{i}", "prompt": f"prompt {i}"}) + "\n")
        for line in extra or []:
            f.write(line + "\n")
    return path


def read_rows(out: Path) -> list[dict]:
    shards = sorted((out / "shards").glob("part-*"))
    rows: list[dict] = []
    for s in shards:
        if s.suffix == ".parquet":
            rows.extend(read_parquet(s).to_pylist())
        else:
            rows.extend(json.loads(x) for x in s.read_text().splitlines())
    return rows


def assert_exactly_once(out: Path, ids: set[str]) -> list[dict]:
    rows = read_rows(out)
    got = [r["id"] for r in rows]
    assert len(got) == len(set(got)), "an id was committed twice"
    assert set(got) == ids
    return rows


def config(src: Path, out: Path, **kw) -> GenerateConfig:
    kw.setdefault("params", JobParams(max_tokens=4))
    kw.setdefault("shard_rows", 50)
    kw.setdefault("retry_base_s", 0.01)
    kw.setdefault("retry_cap_s", 0.05)
    return GenerateConfig(input=str(src), output=str(out), **kw)


async def test_dispatch_is_continuous_keeps_limits_and_spreads_over_servers(tmp_path):
    """The slow server holds its requests until the fast one has answered 300: a batch-and-wait
    loop would stall on the held ones; continuous dispatch keeps refilling the fast server's slots."""
    gate = asyncio.Event()
    slow = await FakeServer(gate=gate, name="slow").start()
    fast = await FakeServer(name="fast").start()

    async def open_gate() -> None:
        while fast.answered < 300:
            await asyncio.sleep(0.01)
        gate.set()

    opener = asyncio.ensure_future(open_gate())
    try:
        src = write_input(tmp_path / "in.jsonl", 400)
        report = await run_generate(
            config(src, tmp_path / "out", concurrency=4), targets=[slow.target(), fast.target()]
        )
    finally:
        opener.cancel()
        await slow.stop()
        await fast.stop()
    assert report.status == "complete" and report.committed == 400 and report.remaining == 0
    assert slow.max_in_flight == 4 and fast.max_in_flight <= 4
    assert slow.answered >= 4 and fast.answered >= 300
    rows = assert_exactly_once(tmp_path / "out", {f"p{i}" for i in range(400)})
    assert {r["server"] for r in rows} == {"slow", "fast"}
    assert all(r["text"] == f"answer to prompt {r['line'] - 1}" for r in rows)


async def test_auto_concurrency_starts_from_the_reported_capacity(tmp_path):
    server = await FakeServer(delay_s=0.02).start()
    try:
        src = write_input(tmp_path / "in.jsonl", 300)
        report = await run_generate(config(src, tmp_path / "out"), targets=[server.target(max_running=10)])
    finally:
        await server.stop()
    assert report.status == "complete"
    assert server.max_in_flight == 12  # 10 running + 2 queued at the server
    assert report.servers[0].final_concurrency == 12


async def test_429_and_5xx_storms_are_retried_until_every_prompt_is_answered(tmp_path):
    rng = random.Random(5)
    storm = lambda body, n: rng.choice([429, 500, 502, 503]) if rng.random() < 0.5 else None  # noqa: E731 - a one-line fault table, read as data
    server = await FakeServer(behaviour=storm).start()
    try:
        src = write_input(tmp_path / "in.jsonl", 300)
        report = await run_generate(
            config(src, tmp_path / "out", concurrency=8, max_attempts=30), targets=[server.target()]
        )
    finally:
        await server.stop()
    assert report.status == "complete" and report.failed == 0
    assert report.retries == server.requests - 300 > 100
    rows = assert_exactly_once(tmp_path / "out", {f"p{i}" for i in range(300)})
    assert max(r["attempts"] for r in rows) > 1
    assert not (tmp_path / "out" / "failures.jsonl").exists()


async def test_failing_prompts_go_to_the_failures_file_and_are_retried_on_resume(tmp_path):
    broken = {"on": True}

    def behaviour(body: dict, n: int) -> int | None:
        if "prompt 3" == body["prompt"]:
            return 400  # the request itself is wrong: no retry
        if body["prompt"] in ("prompt 5", "prompt 7") and broken["on"]:
            return 500  # keeps failing: given up after --max-attempts
        return None

    server = await FakeServer(behaviour=behaviour).start()
    src = write_input(tmp_path / "in.jsonl", 20)
    out = tmp_path / "out"
    try:
        report = await run_generate(config(src, out, max_attempts=3), targets=[server.target()])
        assert (
            report.status == "incomplete" and report.failed == 3 and report.committed == 17 and report.remaining == 3
        )
        failures = {f["id"]: f for f in map(json.loads, (out / "failures.jsonl").read_text().splitlines())}
        assert set(failures) == {"p3", "p5", "p7"}
        assert (
            failures["p3"]["attempts"] == 1
            and "HTTP 400" in failures["p3"]["error"]
            and not failures["p3"]["retryable"]
        )
        assert (
            failures["p5"]["attempts"] == 3
            and "HTTP 500: scripted 500" == failures["p5"]["error"]
            and failures["p5"]["line"] == 6
        )
        broken["on"] = False
        again = await run_generate(config(src, out, max_attempts=3), targets=[server.target()])
    finally:
        await server.stop()
    assert again.resumed and again.done_before == 17 and again.to_send == 3
    assert again.committed == 2 and again.failed == 1  # p3 is still a bad request
    assert_exactly_once(out, {f"p{i}" for i in range(20)} - {"p3"})


async def test_a_hung_server_is_found_by_probes_and_its_requests_go_elsewhere(tmp_path):
    hung, good = await FakeServer(hang=True, name="hung").start(), await FakeServer(delay_s=0.002, name="good").start()
    try:
        src = write_input(tmp_path / "in.jsonl", 200)
        policy = HealthPolicy(
            probe_interval_s=0.3, probe_failures=1, probe_timeout_s=0.3, recover_timeout_s=0.5, retry_interval_s=0.1
        )
        cfg = config(src, tmp_path / "out", concurrency=4, health=policy, request_timeout_s=3600)
        report = await run_generate(cfg, targets=[hung.target(), good.target()])
    finally:
        await hung.stop()
        await good.stop()
    assert report.status == "complete" and report.committed == 200
    by_name = {s.name: s for s in report.servers}
    assert by_name["hung"].state in ("down", "gone") and by_name["hung"].outages == 1 and by_name["hung"].requests == 0
    assert report.requeued == 4  # its four in-flight requests, re-queued without counting an attempt
    rows = assert_exactly_once(tmp_path / "out", {f"p{i}" for i in range(200)})
    assert all(r["attempts"] == 1 for r in rows)


async def test_a_dead_managed_server_is_restarted_through_the_restarter_and_reused(tmp_path):
    server = await FakeServer(delay_s=0.005, name="s0").start()
    restarts: list[str] = []

    class Restarter:
        async def restart(self, name: str, on_event) -> Target:
            restarts.append(name)
            on_event(f"{name}: restarted by the test")
            await server.start()  # same port, like a fleet restart
            return server.target(managed=True)

    async def kill_after(n: int) -> None:
        while server.answered < n:
            await asyncio.sleep(0.005)
        await server.stop()

    src = write_input(tmp_path / "in.jsonl", 300)
    policy = HealthPolicy(failures_to_take_out=1, retry_interval_s=0.05)
    killer = asyncio.ensure_future(kill_after(100))
    try:
        report = await run_generate(
            config(src, tmp_path / "out", concurrency=6, health=policy),
            targets=[server.target(managed=True)],
            restarter=Restarter(),
        )
    finally:
        killer.cancel()
        await server.stop()
    assert restarts == ["s0"]
    assert report.status == "complete" and report.committed == 300
    assert report.servers[0].restarts == 1 and report.servers[0].state == "up"
    assert any("s0: restarted by the test" in e for e in report.events)
    assert_exactly_once(tmp_path / "out", {f"p{i}" for i in range(300)})


async def test_stop_commits_what_is_answered_and_resume_finishes_exactly_once(tmp_path):
    server = await FakeServer(delay_s=0.01).start()
    src = write_input(tmp_path / "in.jsonl", 300)
    out = tmp_path / "out"
    stop = asyncio.Event()

    async def stop_after(n: int) -> None:
        while server.answered < n:
            await asyncio.sleep(0.005)
        stop.set()

    try:
        stopper = asyncio.ensure_future(stop_after(120))
        first = await run_generate(
            config(src, out, concurrency=8, shard_rows=1000), targets=[server.target()], stop=stop
        )
        await stopper
        assert first.status == "interrupted"
        assert first.committed == first.done >= 120  # the partial shard was committed on the way out
        second = await run_generate(config(src, out, concurrency=8), targets=[server.target()])
    finally:
        await server.stop()
    assert second.done_before == first.committed and second.committed == 300 - first.committed
    assert_exactly_once(out, {f"p{i}" for i in range(300)})


async def test_another_job_in_the_same_destination_is_refused_unless_forced(tmp_path):
    server = await FakeServer().start()
    src = write_input(tmp_path / "in.jsonl", 30)
    out = tmp_path / "out"
    try:
        await run_generate(config(src, out), targets=[server.target()])
        with pytest.raises(JobMismatch, match="max_tokens: 4 -> 8"):
            await run_generate(config(src, out, params=JobParams(max_tokens=8)), targets=[server.target()])
        write_input(src, 40)  # ten new prompts: another input
        with pytest.raises(JobMismatch, match="input content changed"):
            await run_generate(config(src, out), targets=[server.target()])
        forced = await run_generate(config(src, out, force=True), targets=[server.target()])
    finally:
        await server.stop()
    assert forced.done_before == 30 and forced.committed == 10  # done ids matched by id, not line
    assert_exactly_once(out, {f"p{i}" for i in range(40)})


async def test_jsonl_output_with_token_ids_and_requests(tmp_path):
    server = await FakeServer().start()
    src = tmp_path / "in.jsonl"
    src.write_text(
        json.dumps(
            {
                "custom_id": "c1",
                "url": "/v1/chat/completions",
                "body": {"messages": [{"role": "user", "content": "hi"}]},
            }
        )
        + "\n"
        + json.dumps({"id": "c2", "prompt": "yo", "max_tokens": 2})
        + "\n"
    )
    try:
        params = JobParams(max_tokens=3, format="jsonl", token_ids=True, store_request=True)
        report = await run_generate(config(src, tmp_path / "out", params=params), targets=[server.target()])
    finally:
        await server.stop()
    assert report.status == "complete"
    rows = {r["id"]: r for r in assert_exactly_once(tmp_path / "out", {"c1", "c2"})}
    assert rows["c1"]["text"] == "answer to hi" and rows["c1"]["token_ids"] == [0, 1, 2]
    assert json.loads(rows["c1"]["request"])["return_token_ids"] is True
    assert json.loads(rows["c2"]["request"]) == {
        "prompt": "yo",
        "max_tokens": 2,
        "return_token_ids": True,
        "model": "fake-model",
    }
    assert rows["c2"]["completion_tokens"] == 2 and rows["c2"]["line"] == 2


async def test_a_touched_input_is_hashed_not_parsed_again(tmp_path, monkeypatch):
    """Same bytes, new mtime (a copy, a touch): resume without the pre-pass, from the rejects file."""
    import os

    from servefleet.generate import runner

    server = await FakeServer().start()
    src = write_input(tmp_path / "in.jsonl", 50, extra=["{bad", json.dumps({"id": "p1", "prompt": "dup"})])
    out = tmp_path / "out"
    try:
        first = await run_generate(config(src, out, shard_rows=1000), targets=[server.target()])
        assert first.committed == 50 and first.rejected == 2
        os.utime(src, ns=(1, 1))
        monkeypatch.setattr(runner, "_prepass_to_file", lambda *a: pytest.fail("the pre-pass ran again"))
        again = await run_generate(config(src, out), targets=[server.target()])
    finally:
        await server.stop()
    assert again.resumed and again.done_before == 50 and again.to_send == 0 and again.rejected == 2
    assert json.loads((out / "job.json").read_text())["input"]["mtime_ns"] == 1


class ResettingServer:
    """A keep-alive HTTP server that resets a few pooled connections at their second request, all
    together, as a server does that closed idle keep-alive connections just as the client reused
    them (the H200 run of issue 25: two resets among 844 in flight took the server out)."""

    def __init__(self, *, stale: int, delay_s: float = 0.02) -> None:
        self.stale, self.delay_s = stale, delay_s
        self.port = free_port()
        self.connections = 0
        self.resets = 0
        self.answered = 0
        self._held: list[asyncio.StreamWriter] = []
        self._server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> ResettingServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        stale = self.connections <= self.stale
        n = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    (
                        int(line.split(b":")[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length")
                    ),
                    0,
                )
                body = json.loads(await reader.readexactly(length)) if length else {}
                n += 1
                if stale and n == 2:
                    self._held.append(writer)
                    if len(self._held) == self.stale:  # all stale ones at once: a burst of resets
                        for w in self._held:
                            sock = w.get_extra_info("socket")
                            sock.setsockopt(
                                socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                            )  # close = RST
                            w.transport.abort()
                            self.resets += 1
                    return
                await asyncio.sleep(self.delay_s)
                if head.startswith(b"GET"):
                    out = json.dumps({"data": [{"id": "fake-model"}]}).encode()
                else:
                    tokens = body.get("max_tokens", 4)
                    out = json.dumps(
                        {
                            "model": body.get("model"),
                            "choices": [{"text": "ok", "finish_reason": "length"}],
                            "usage": {"prompt_tokens": 3, "completion_tokens": tokens},
                        }
                    ).encode()
                    self.answered += 1
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(out) + out
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()


async def test_a_reset_pooled_connection_is_retried_at_once_and_costs_no_requeue(tmp_path):
    """Five of 32 keep-alive connections are reset together: those five prompts go again on fresh
    connections; the server stays in service and nothing in flight is re-queued. (Before: five
    server faults in a row took it out and re-queued the other 27.)"""
    server = await ResettingServer(stale=5).start()
    try:
        src = write_input(tmp_path / "in.jsonl", 300)
        report = await run_generate(
            config(src, tmp_path / "out", concurrency=32),
            targets=[Target("reset", server.url, "fake-model", None, False)],
        )
    finally:
        await server.stop()
    assert server.resets == 5
    assert report.status == "complete" and report.committed == 300
    assert report.requeued == 0 and report.servers[0].outages == 0, report.events
    assert not any("taken out" in e for e in report.events)
    rows = assert_exactly_once(tmp_path / "out", {f"p{i}" for i in range(300)})
    assert all(r["attempts"] == 1 for r in rows)  # the retry on a fresh connection is not the prompt's fault


async def test_connections_reset_all_at_once_take_the_server_out(tmp_path):
    """A server that breaks every connection it holds at once is down: taken out at that burst."""
    server = await ResettingServer(stale=16).start()
    good = await FakeServer(delay_s=0.002, name="good").start()
    try:
        src = write_input(tmp_path / "in.jsonl", 300)
        policy = HealthPolicy(recover_timeout_s=0.5, retry_interval_s=0.1)
        report = await run_generate(
            config(src, tmp_path / "out", concurrency=16, health=policy),
            targets=[Target("reset", server.url, "fake-model", None, False), good.target()],
        )
    finally:
        await server.stop()
        await good.stop()
    assert report.status == "complete" and report.committed == 300
    by_name = {s.name: s for s in report.servers}
    assert by_name["reset"].outages == 1
    assert any("reset: taken out" in e and "many connections at once" in e for e in report.events), report.events
    assert_exactly_once(tmp_path / "out", {f"p{i}" for i in range(300)})
