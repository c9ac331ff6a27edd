"""The sim as a real server: OpenAI endpoints (streaming and not), usage, exact lengths, chunks per
step, measured throughput against the formula, queueing, /metrics, /server_info, request faults."""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp
import pytest

from conftest import SimProcess, async_wait_until
from servefleet.sim import theoretical_output_tokens_per_s
from servefleet.sim.cli_args import parse_config
from servefleet.sim.tokens import count_tokens, render_chat

pytestmark = pytest.mark.timeout(120)

# A: SGLang style, timed; B: vLLM style, fast, speculative (3 tokens per step); C: instant, with request faults.
A_ARGS = (
    "--style",
    "sglang",
    "--load-time",
    "0.2",
    "--decode-ms",
    "20",
    "--decode-ms-per-running",
    "2.5",
    "--prefill-ms-per-1k-tokens",
    "50",
    "--max-running",
    "8",
    "--kv-tokens",
    "100000",
    "--context-length",
    "4096",
)
B_ARGS = (
    "--style",
    "vllm",
    "--load-time",
    "0.2",
    "--decode-ms",
    "1",
    "--decode-ms-per-running",
    "0",
    "--tokens-per-step",
    "3",
    "--served-model-name",
    "sim-b",
    "--max-running",
    "32",
)
C_ARGS = (
    "--style",
    "vllm",
    "--load-time",
    "0",
    "--decode-ms",
    "0",
    "--decode-ms-per-running",
    "0",
    "--prefill-ms-per-1k-tokens",
    "0",
    "--tokens-per-step",
    "4",
    "--error-rate",
    "0.2",
    "--rate-limit-rate",
    "0.1",
    "--slow-rate",
    "0.05",
    "--slow-ms",
    "20",
    "--seed",
    "7",
)
PROMPT = " ".join(["word"] * 200)  # 200 tokens


@pytest.fixture(scope="module")
def sims(tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("sims")
    procs = {
        name: SimProcess(*args, log_path=folder / f"{name}.log").start()
        for name, args in (("a", A_ARGS), ("b", B_ARGS), ("c", C_ARGS))
    }
    try:
        for proc in procs.values():
            proc.wait_ready(timeout=90)
        yield procs
    finally:
        for proc in procs.values():
            proc.stop()


async def _post(session: aiohttp.ClientSession, url: str, body: dict) -> tuple[int, dict]:
    async with session.post(url, json=body) as resp:
        return resp.status, await resp.json(content_type=None)


async def _stream(session: aiohttp.ClientSession, url: str, body: dict) -> list[dict | str]:
    """SSE events in order: decoded JSON objects, and the literal "[DONE]"."""
    events: list[dict | str] = []
    async with session.post(url, json={**body, "stream": True}) as resp:
        assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/event-stream")
        buffer = b""
        async for data in resp.content.iter_any():
            buffer += data
            while b"\n\n" in buffer:
                event, buffer = buffer.split(b"\n\n", 1)
                assert event.startswith(b"data: ")
                payload = event[6:].decode()
                events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


async def test_completions_and_chat_with_usage(sims) -> None:
    url = sims["a"].url
    async with aiohttp.ClientSession() as s:
        status, body = await _post(
            s,
            url + "/v1/completions",
            {"model": "sim-model", "prompt": "Hello there, sim!", "max_tokens": 7, "ignore_eos": True},
        )
        assert status == 200 and body["object"] == "text_completion"
        choice = body["choices"][0]
        assert choice["finish_reason"] == "length" and count_tokens(choice["text"]) == 7
        assert body["usage"] == {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12}

        messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]
        status, body = await _post(
            s, url + "/v1/chat/completions", {"messages": messages, "max_completion_tokens": 5, "ignore_eos": True}
        )
        assert status == 200 and body["object"] == "chat.completion"
        assert body["choices"][0]["message"]["role"] == "assistant"
        assert count_tokens(body["choices"][0]["message"]["content"]) == 5
        assert (
            body["usage"]["prompt_tokens"] == count_tokens(render_chat(messages))
            and body["usage"]["completion_tokens"] == 5
        )

        status, body = await _post(s, url + "/v1/completions", {"prompt": "x", "max_tokens": 5000})
        assert status == 400 and "maximum context length is 4096" in body["message"]


async def test_prompt_logprobs_in_vllm_shape_and_refused_with_stream(sims) -> None:
    from servefleet.sim.tokens import token_ids

    url = sims["b"].url
    prompt = "the of and to in is was for"
    async with aiohttp.ClientSession() as s:
        status, body = await _post(
            s, url + "/v1/completions", {"prompt": prompt, "max_tokens": 2, "n": 2, "prompt_logprobs": 3}
        )
        assert status == 200
        first, second = (c["prompt_logprobs"] for c in body["choices"])  # on completions: in each choice
        assert first == second and first[0] is None and len(first) == count_tokens(prompt)
        for tid, pos in zip(token_ids(prompt)[1:], first[1:], strict=True):
            keys = list(pos)
            assert keys[0] == str(tid)  # the prompt token first, then the top 3 by rank
            ranks = [v["rank"] for v in pos.values()]
            assert (
                sorted(ranks[1:]) == [1, 2, 3] if len(pos) == 4 else sorted(ranks) == [1, 2, 3]
            )  # 4: the prompt token ranks below 3
        messages = [{"role": "user", "content": prompt}]
        status, body = await _post(
            s, url + "/v1/chat/completions", {"messages": messages, "max_tokens": 2, "prompt_logprobs": 1}
        )
        assert status == 200 and "prompt_logprobs" not in body["choices"][0]  # on chat: at the top
        assert (
            len(body["prompt_logprobs"]) == count_tokens(render_chat(messages)) and body["prompt_logprobs"][0] is None
        )
        status, body = await _post(
            s, url + "/v1/completions", {"prompt": prompt, "max_tokens": 2, "prompt_logprobs": 1, "stream": True}
        )
        assert status == 400 and "prompt_logprobs" in body["message"]
        status, body = await _post(s, url + "/v1/completions", {"prompt": prompt, "max_tokens": 2})
        assert status == 200 and "prompt_logprobs" not in body["choices"][0]


async def test_streaming_chunks_one_per_step_with_usage(sims) -> None:
    async with aiohttp.ClientSession() as s:
        events = await _stream(
            s,
            sims["a"].url + "/v1/completions",
            {"prompt": "count", "max_tokens": 6, "ignore_eos": True, "stream_options": {"include_usage": True}},
        )
        assert events[-1] == "[DONE]"
        usage = events[-2]
        assert usage["choices"] == [] and usage["usage"] == {
            "prompt_tokens": 1,
            "completion_tokens": 6,
            "total_tokens": 7,
        }
        chunks = events[:-2]
        assert [count_tokens(c["choices"][0]["text"]) for c in chunks] == [1] * 6
        assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * 5 + ["length"]

        chat = await _stream(
            s,
            sims["a"].url + "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "ignore_eos": True},
        )
        assert chat[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        assert "".join(c["choices"][0]["delta"].get("content", "") for c in chat[1:-1]).count(" ") == 3
        assert chat[-1] == "[DONE]" and "usage" not in chat[-2]  # no include_usage: no usage chunk


async def test_speculative_steps_put_several_tokens_per_chunk(sims) -> None:
    url = sims["b"].url
    async with aiohttp.ClientSession() as s:
        events = await _stream(
            s, url + "/v1/completions", {"model": "sim-b", "prompt": "go", "max_tokens": 10, "ignore_eos": True}
        )
        sizes = [count_tokens(e["choices"][0]["text"]) for e in events[:-1]]
        assert sizes == [1, 3, 3, 3]  # the prefill step's token, then 3 per step
        status, body = await _post(s, url + "/v1/completions", {"model": "not-served", "prompt": "go"})
        assert status == 404 and body["type"] == "NotFoundError"  # vLLM checks the model name
        async with s.get(url + "/metrics") as resp:
            metrics = _parse_metrics(await resp.text())
        assert metrics["vllm:spec_decode_num_accepted_tokens_total"] >= 6
        assert metrics["sglang:spec_accept_length"] == 3.0
        async with s.get(url + "/server_info") as resp:
            info = await resp.json()
        assert info["speculative_algorithm"] == "EAGLE" and info["internal_states"][0]["avg_spec_accept_length"] == 3.0
        async with s.get(url + "/v1/models") as resp:
            models = await resp.json()
        assert models["data"][0]["id"] == "sim-b" and models["data"][0]["max_model_len"] == 32768


async def test_eos_early_stop_is_deterministic(sims) -> None:
    async with aiohttp.ClientSession() as s:
        lengths = {}
        for prompt in ("alpha", "beta", "gamma", "delta", "epsilon", "zeta"):
            first = await _post(s, sims["b"].url + "/v1/completions", {"prompt": prompt, "max_tokens": 40})
            second = await _post(s, sims["b"].url + "/v1/completions", {"prompt": prompt, "max_tokens": 40})
            assert first[1]["usage"] == second[1]["usage"]
            n = first[1]["usage"]["completion_tokens"]
            assert first[1]["choices"][0]["finish_reason"] == ("stop" if n < 40 else "length")
            lengths[prompt] = n
        assert min(lengths.values()) < 40  # with --eos-rate 0.5 some stop early ...
        exact = await _post(
            s,
            sims["b"].url + "/v1/completions",
            {"prompt": min(lengths, key=lengths.get), "max_tokens": 40, "ignore_eos": True},
        )
        assert exact[1]["usage"]["completion_tokens"] == 40  # ... and ignore_eos gives exactly max_tokens


def _parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text format: every sample line is ``name{labels} value``; HELP/TYPE precede each family."""
    values: dict[str, float] = {}
    typed = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            typed.add(line.split()[2])
        elif line and not line.startswith("#"):
            name_labels, value = line.rsplit(" ", 1)
            name = name_labels.split("{", 1)[0]
            family = next(
                (
                    name[: -len(x)]
                    for x in ("_bucket", "_sum", "_count")
                    if name.endswith(x) and name[: -len(x)] in typed
                ),
                name,
            )
            assert family in typed, f"sample {name} without a TYPE line"  # a histogram's samples: under its family
            values[name] = float(value)
    return values


async def _closed_loop(url: str, concurrency: int, rounds: int, max_tokens: int) -> float:
    """Output tokens/s of ``concurrency`` clients each sending ``rounds`` requests back to back."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:

        async def client() -> int:
            total = 0
            for _ in range(rounds):
                status, body = await _post(
                    s, url + "/v1/completions", {"prompt": PROMPT, "max_tokens": max_tokens, "ignore_eos": True}
                )
                assert status == 200
                total += body["usage"]["completion_tokens"]
            return total

        start = time.perf_counter()
        tokens = sum(await asyncio.gather(*(client() for _ in range(concurrency))))
        return tokens / (time.perf_counter() - start)


@pytest.mark.parametrize("concurrency", [1, 8])
async def test_measured_throughput_agrees_with_theory(sims, concurrency: int) -> None:
    cfg = parse_config(A_ARGS)
    expected = theoretical_output_tokens_per_s(cfg, concurrency, prompt_tokens=200, output_tokens=30)
    # Best of up to three runs: a busy 2-core CI machine can only delay the sim's steps (never
    # speed them up), so a slow run is retried while a too-fast one fails at once. Client
    # turnaround costs about one step per request (see servefleet.sim.theory), hence 0.6.
    runs: list[float] = []
    while len(runs) < 3 and (not runs or max(runs) < 0.6 * expected):
        runs.append(await _closed_loop(sims["a"].url, concurrency, rounds=2, max_tokens=30))
        assert runs[-1] <= 1.1 * expected, (runs, expected)
    print(f"concurrency {concurrency}: measured {runs} tok/s, theory {expected:.1f} tok/s")
    assert max(runs) >= 0.6 * expected, (runs, expected)


async def test_requests_beyond_max_running_queue(sims) -> None:
    url = sims["a"].url
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:

        async def timed() -> float:
            t0 = time.perf_counter()
            status, _ = await _post(s, url + "/v1/completions", {"prompt": "q", "max_tokens": 50, "ignore_eos": True})
            assert status == 200
            return time.perf_counter() - t0

        tasks = [asyncio.create_task(timed()) for _ in range(12)]
        seen: dict[str, float] = {}

        async def queue_visible() -> bool:
            async with s.get(url + "/metrics") as resp:
                seen.update(_parse_metrics(await resp.text()))
            return seen["vllm:num_requests_running"] == 8 and seen["vllm:num_requests_waiting"] == 4

        # The window lasts one batch (50 steps of ~117 ms): wide enough for a busy machine's polls.
        await async_wait_until(queue_visible, timeout=30, what="8 running and 4 waiting")
        assert seen["sglang:num_running_reqs"] == 8 and seen["sglang:num_queue_reqs"] == 4
        assert 0 < seen["vllm:kv_cache_usage_perc"] == seen["sglang:token_usage"] < 1
        latencies = sorted(await asyncio.gather(*tasks))
        # The last four waited for a slot: the first eight's batch, then their own run -- a batch of 4,
        # whose steps in realistic timing take ~40 % of a batch of 8's (47 vs 117 ms): ~1.4 x.
        assert min(latencies[8:]) > 1.2 * latencies[3], latencies


async def test_server_info_metrics_tokenize_version(sims) -> None:
    url = sims["a"].url
    async with aiohttp.ClientSession() as s:
        for path in ("/server_info", "/get_server_info"):
            async with s.get(url + path) as resp:
                info = await resp.json()
            assert info["max_total_num_tokens"] == 100000 and info["context_length"] == 4096
            assert info["internal_states"][0]["effective_max_running_requests_per_dp"] == 8
            assert info["speculative_algorithm"] is None and info["version"]
        async with s.post(url + "/tokenize", json={"prompt": "Hello, world!"}) as resp:
            tok = await resp.json()
        assert tok["count"] == 4 == len(tok["tokens"])
        async with s.get(url + "/version") as resp:
            assert "version" in await resp.json()
        async with s.get(url + "/health_generate") as resp:
            assert resp.status == 200
        before = _parse_metrics(await (await s.get(url + "/metrics")).text())
        await _post(s, url + "/v1/completions", {"prompt": "a b c", "max_tokens": 4, "ignore_eos": True})
        after = _parse_metrics(await (await s.get(url + "/metrics")).text())
        assert after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"] == 4
        assert after["vllm:prompt_tokens_total"] - before["vllm:prompt_tokens_total"] == 3
        assert after["sglang:generation_tokens_total"] == after["vllm:generation_tokens_total"]
    assert "Prefill batch. #new-seq: 1, #new-token: 3," in sims["a"].log()


async def test_instant_mode_and_request_faults(sims) -> None:
    url = sims["c"].url
    statuses: dict[int, int] = {}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:

        async def one(i: int) -> None:
            status, body = await _post(
                s, url + "/v1/completions", {"prompt": f"p {i}", "max_tokens": 9, "ignore_eos": True}
            )
            statuses[status] = statuses.get(status, 0) + 1
            if status == 200:
                assert body["usage"]["completion_tokens"] == 9 and count_tokens(body["choices"][0]["text"]) == 9
            else:
                assert body["object"] == "error" and body["code"] == status

        t0 = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(400)))
        elapsed = time.perf_counter() - t0
        streamed = None
        while streamed is None:  # retry past injected errors
            async with s.post(
                url + "/v1/completions", json={"prompt": "s", "max_tokens": 9, "ignore_eos": True, "stream": True}
            ) as resp:
                if resp.status == 200:
                    streamed = (await resp.read()).decode()
    assert set(statuses) <= {200, 429, 500}
    assert 40 <= statuses.get(500, 0) <= 130 and 15 <= statuses.get(429, 0) <= 70, statuses  # 20 % and 10 % of 400
    chunks = [json.loads(e[6:]) for e in streamed.split("\n\n") if e.startswith("data: {")]
    assert [count_tokens(c["choices"][0]["text"]) for c in chunks] == [1, 4, 4]  # instant streams keep the step shape
    assert elapsed < 30  # instant: no time model (generous: a loaded CI machine)


async def test_no_server_info_answers_404_as_real_vllm_does() -> None:
    """--no-server-info: a client cannot read max running from the sim (real vLLM has no /server_info), so
    generate --url with no hints ramps as it did on the H200."""
    from aiohttp import web

    from servefleet.sim.config import SimConfig
    from servefleet.sim.server import SimServer

    def never(*_: object) -> None:
        raise AssertionError("the sim tried to exit")

    cfg = parse_config(["--no-server-info", "--max-running", "128"])
    assert cfg.server_info is False and SimConfig().server_info is True
    with pytest.raises(web.HTTPNotFound):
        await SimServer(cfg, None, 0, exit_with=never, hard_exit=never).server_info(None)  # type: ignore[arg-type]
