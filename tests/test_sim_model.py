"""The sim's pure parts: the timing formula, options, tokenizer, request parsing, and the scheduler
loop driven in-process (admission by max-running and KV, FIFO, tokens per step, cancellation)."""

from __future__ import annotations

import asyncio
import json
import math
from itertools import pairwise

import pytest
from typer.testing import CliRunner

from conftest import async_wait_until
from servefleet.sim import SimConfig, steady_state, steps_per_request, theoretical_output_tokens_per_s
from servefleet.sim.cli_args import parse_args, parse_config
from servefleet.sim.openai_api import ApiError, parse_job
from servefleet.sim.scheduler import Scheduler, SimRequest, Stats
from servefleet.sim.theory import best_concurrency
from servefleet.sim.timing import H200_VLLM
from servefleet.sim.tokens import TextBank, count_tokens, render_chat, token_ids


# ---- formula --------------------------------------------------------------------------------------
def test_formula_matches_hand_computation() -> None:
    cfg = SimConfig(timing="knee", decode_ms=20, decode_ms_per_running=2, prefill_ms_per_1k_tokens=50, max_running=64)
    # C=8, P=200, N=30: S=30 steps of 20+2*8=36 ms, plus 8 prefills of 10 ms -> 1160 ms per 8 requests.
    assert theoretical_output_tokens_per_s(cfg, 8, prompt_tokens=200, output_tokens=30) == pytest.approx(
        8 * 30 / 1.160
    )
    s = steady_state(cfg, 1, prompt_tokens=200, output_tokens=30)
    assert s.batch == 1 and s.steps == 30 and s.step_ms == 22
    assert s.request_latency_s == pytest.approx((30 * 22 + 10) / 1000)
    assert s.ttft_s == pytest.approx(0.032)


def test_speculative_steps_and_caps() -> None:
    assert steps_per_request(1, 3) == 1
    assert steps_per_request(10, 3) == 4  # 1 from prefill, then 3+3+3
    cfg = SimConfig(decode_ms=10, decode_ms_per_running=1, prefill_ms_per_1k_tokens=0, max_running=4, kv_tokens=1000)
    assert steady_state(cfg, 100, prompt_tokens=100, output_tokens=100).batch == 4  # max_running
    small_kv = cfg.model_copy(update={"kv_tokens": 450})
    assert steady_state(small_kv, 100, prompt_tokens=100, output_tokens=100).batch == 2  # 450 // 200
    queued = steady_state(cfg, 8, prompt_tokens=100, output_tokens=100)
    alone = steady_state(cfg, 4, prompt_tokens=100, output_tokens=100)
    assert queued.output_tokens_per_s == alone.output_tokens_per_s
    assert queued.request_latency_s == pytest.approx(2 * alone.request_latency_s)  # waits one turn in the queue


def test_knee_per_request_falls_total_plateaus() -> None:
    cfg = SimConfig(
        timing="knee", decode_ms=10, decode_ms_per_running=0.5, prefill_ms_per_1k_tokens=20, max_running=256
    )
    states = [steady_state(cfg, c, prompt_tokens=128, output_tokens=256) for c in (1, 4, 16, 64, 256)]
    per_req = [s.per_request_tokens_per_s for s in states]
    totals = [s.output_tokens_per_s for s in states]
    assert per_req == sorted(per_req, reverse=True)
    assert totals == sorted(totals)
    assert totals[-1] < 1000 / 0.5  # below the asymptote k * 1000 / decode_ms_per_running
    assert totals[-1] / totals[-2] < 1.5 < totals[1] / totals[0]  # gains shrink: the knee


def test_realistic_throughput_peaks_below_max_running_and_declines() -> None:
    cfg = SimConfig()  # the default: realistic timing, max running 64, peak at half of it
    assert cfg.timing == "realistic" and cfg.resolved_peak_batch == 32
    assert best_concurrency(cfg, prompt_tokens=128, output_tokens=256) == 32 < cfg.max_running
    tps = {
        c: theoretical_output_tokens_per_s(cfg, c, prompt_tokens=128, output_tokens=256)
        for c in (1, 8, 16, 32, 48, 64, 128)
    }
    assert tps[1] < tps[8] < tps[16] < tps[32] > tps[48] > tps[64] == tps[128]  # past max running: a queue, no gain
    assert tps[64] / tps[32] == pytest.approx(0.81, abs=0.02)  # decline_at_2x_peak (prefill moves it a little)
    steps = [cfg.steps.step_ms(b) for b in range(1, 129)]
    gaps = [b - a for a, b in pairwise(steps)]
    assert all(g > 0 for g in gaps) and all(b >= a for a, b in pairwise(gaps))  # rising, super-linear
    lat = [steady_state(cfg, c, prompt_tokens=128, output_tokens=256) for c in range(1, 65)]
    assert all(b.request_latency_s > a.request_latency_s and b.ttft_s >= a.ttft_s for a, b in pairwise(lat))


def test_realistic_fit_reproduces_the_h200_figures() -> None:
    """vLLM 0.26 on one H200 (benchmarks/results/gpu/2026-12-01/solo), 256 in / 256 out: non-streaming 28.5k / 28.7k /
    23.4k tok/s at 256 / 512 / 1024 (--max-num-seqs 1024), streaming flat at 17.9k-18.9k, 486 at C=1."""
    cfg = SimConfig(**H200_VLLM)

    def tps(c: int, stream: bool = False) -> float:
        return theoretical_output_tokens_per_s(cfg, c, prompt_tokens=256, output_tokens=256, stream=stream)

    for c, measured in ((256, 28_490), (512, 28_687), (1024, 23_363)):
        assert tps(c) == pytest.approx(measured, rel=0.06), c
    for c in (256, 512, 1024):
        assert 17_500 <= tps(c, stream=True) <= 19_500, c
    assert tps(1, stream=True) == pytest.approx(486, rel=0.05)
    assert best_concurrency(cfg, prompt_tokens=256, output_tokens=256) == 512
    assert tps(256, stream=True) / tps(512) < 0.66  # a streaming sweep under-rates the server by a third


def test_streaming_costs_tokens_per_event_not_per_token() -> None:
    """Speculative decoding sends several tokens per event: the API process's cap binds it less."""
    plain = SimConfig(max_running=64)
    spec = SimConfig(max_running=64, tokens_per_step=3)
    cap = plain.steps.api_events_per_s
    assert cap == spec.steps.api_events_per_s
    assert theoretical_output_tokens_per_s(plain, 32, output_tokens=256, stream=True) == pytest.approx(cap * 256 / 256)
    assert theoretical_output_tokens_per_s(spec, 32, output_tokens=256, stream=True) == pytest.approx(cap * 256 / 86)
    knee = SimConfig(timing="knee")
    assert knee.steps.api_events_per_s is None  # the old model: streaming costs nothing
    assert theoretical_output_tokens_per_s(knee, 64, stream=True) == theoretical_output_tokens_per_s(knee, 64)


def test_timing_mode_options_are_checked() -> None:
    with pytest.raises(ValueError, match="--peak-batch belongs to --timing realistic"):
        SimConfig(timing="knee", peak_batch=4)
    with pytest.raises(ValueError, match="needs --decode-ms > 0"):
        SimConfig(decode_ms=0)  # no fixed cost: no peak to fit
    assert SimConfig(peak_batch=10, max_running=64).steps.peak_batch == 10
    assert SimConfig(max_running=1).resolved_peak_batch == 1


def test_fractional_tokens_per_step_parse_and_count() -> None:
    """examples/sim-fleet.toml passes --tokens-per-step 2.5 (a mean acceptance length); it used to be
    refused as 'invalid int value'."""
    cfg = parse_config(["--tokens-per-step", "2.5", "--max-running-requests", "4"])
    assert cfg.tokens_per_step == 2.5 and cfg.speculative and cfg.spec_draft_tokens == 2
    assert steps_per_request(256, 2.5) == 1 + 102  # 255 tokens after the first: 102 steps of 2.5
    assert steps_per_request(6, 2.5) == 3
    assert steps_per_request(10, 3) == 4


async def test_fractional_tokens_per_step_alternate_in_the_loop() -> None:
    cfg = SimConfig(
        timing="knee",
        decode_ms=1,
        decode_ms_per_running=0,
        prefill_ms_per_1k_tokens=0,
        max_running=1,
        tokens_per_step=2.5,
    )
    stats = Stats()
    sched = Scheduler(cfg, stats)
    sched.start()
    try:
        req = SimRequest(3, 12, 15, stream=True)
        sched.submit(req)
        steps: list[int] = []
        while sum(steps) < 12:
            steps += await asyncio.wait_for(req.next_steps(), 5)
        assert steps == [1, 2, 3, 2, 3, 1]  # a mean of 2.5 per decode step, the last one cut at max_tokens
        assert stats.spec_draft_total == 5 * 2 and stats.spec_accepted_total == 1 + 2 + 1 + 2 + 0
    finally:
        await sched.stop()


async def test_api_process_paces_streamed_events_but_not_the_engine() -> None:
    """Realistic timing: streamed events leave the API process at most api_events_per_s a second; the
    engine finishes its work earlier, and non-streaming answers do not wait for the events."""
    cfg = SimConfig(
        decode_ms=1, decode_ms_per_running=0, prefill_ms_per_1k_tokens=0, max_running=16, api_events_per_s=200
    )
    stats = Stats()
    sched = Scheduler(cfg, stats)
    loop = asyncio.get_running_loop()
    sched.start()
    try:
        t0 = loop.time()
        streamed = [SimRequest(1, 10, 11, stream=True) for _ in range(10)]  # 100 events: >= 0.5 s at 200/s
        for r in streamed:
            sched.submit(r)
        plain = SimRequest(1, 10, 11, stream=False)
        sched.submit(plain)
        await asyncio.wait_for(plain.done, 30)
        assert sum(r.delivered for r in streamed) < 100  # the plain answer did not queue behind the events

        async def drain(r: SimRequest) -> int:
            got = 0
            while got < r.target:
                got += sum(await r.next_steps())
            return got

        assert await asyncio.wait_for(asyncio.gather(*(drain(r) for r in streamed)), 30) == [10] * 10
        elapsed = loop.time() - t0
        assert elapsed >= 0.5 * 0.95  # the cap is a floor no load can lower
        assert max(r.finished_at for r in streamed) - t0 < elapsed  # the engine was done before the last event
        assert sched.pipe is not None and not sched.pipe.queue
    finally:
        await sched.stop()
    assert Scheduler(SimConfig(timing="knee"), Stats()).pipe is None


def test_instant_mode_is_infinite() -> None:
    cfg = SimConfig(decode_ms=0, decode_ms_per_running=0, prefill_ms_per_1k_tokens=0)
    assert cfg.instant and math.isinf(theoretical_output_tokens_per_s(cfg, 256))


# ---- options ----------------------------------------------------------------------------------------
def test_engine_flag_aliases_and_defaults() -> None:
    cfg = parse_config(
        [
            "--style",
            "vllm",
            "--max-num-seqs",
            "7",
            "--max-model-len",
            "4096",
            "--max-total-tokens",
            "9000",
            "--model-path",
            "/m",
            "--tp-size",
            "2",
            "--fail-at-startup",
            "gpu_oom",
            "--no-color",
        ]
    )
    assert (cfg.max_running, cfg.context_length, cfg.kv_tokens, cfg.model, cfg.tp) == (7, 4096, 9000, "/m", 2)
    assert cfg.fail_at_startup == "gpu_oom" and cfg.color is False
    assert (cfg.timing, cfg.decode_ms, cfg.decode_ms_per_running) == ("realistic", 1.0, 0.22)
    knee = parse_config(["--timing", "knee"])
    assert (knee.decode_ms, knee.decode_ms_per_running) == (10.0, 0.1)  # the old model keeps its old speeds
    assert parse_config(["--timing", "knee", "--decode-ms", "3"]).decode_ms == 3.0
    assert parse_config(["--max-running-requests", "3"]).max_running == 3


@pytest.mark.parametrize(("style", "prog"), [("sglang", "launch_server.py"), ("vllm", "vllm serve")])
def test_bad_option_fails_like_the_engine(style: str, prog: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_args(["--style", style, "--max-running", "zero"])
    assert exc.value.code == 2
    assert f"{prog}: error: argument --max-running/" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_args(["--fail-at-startup", "gpu_oom", "--fail-after-ready", "other"])  # exclusive
    assert "exclude each other" in capsys.readouterr().err


def test_cli_dry_run_json_and_table() -> None:
    from servefleet.cli.main import app

    result = CliRunner().invoke(app, ["sim", "--dry-run", "--json", "--max-running", "4", "--decode-ms", "5"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["config"]["max_running"] == 4 and [s["concurrency"] for s in report["curve"]] == [1, 2, 4, 8]
    assert report["curve"][-1]["batch"] == 4
    assert report["timing"] == "realistic" and report["best_concurrency"] == 2 and report["peak_batch"] == 2
    assert all(0 < p["streaming_output_tokens_per_s"] <= p["output_tokens_per_s"] for p in report["curve"])
    table = CliRunner().invoke(app, ["sim", "--dry-run", "--max-running", "2"])
    assert table.exit_code == 0 and "tok/s" in table.output


# ---- tokens and requests ----------------------------------------------------------------------------
def test_tokenizer_and_generated_text_agree() -> None:
    bank = TextBank(500)
    for start in (0, 17, 63, 64, 200):
        for n in (1, 2, 37, 300):
            assert count_tokens(bank.text(start, 0, n)) == n
            assert bank.text(start, 0, 5) + bank.text(start, 5, n) == bank.text(start, 0, n) or n < 5
    assert count_tokens("Hello, world!") == 4 == len(token_ids("Hello, world!"))
    assert count_tokens(render_chat([{"role": "user", "content": [{"type": "text", "text": "hi there"}]}])) > 2


def test_parse_job_lengths_and_errors() -> None:
    cfg = SimConfig(context_length=100, kv_tokens=1000, eos_rate=1.0, seed=3)
    job = parse_job({"prompt": "one two three", "max_tokens": 50, "ignore_eos": True}, chat=False, cfg=cfg)
    assert (job.prompt_tokens, job.target, job.finish_reason) == (3, 50, "length")
    early = parse_job({"prompt": "one two three", "max_tokens": 50}, chat=False, cfg=cfg)
    again = parse_job({"prompt": "one two three", "max_tokens": 50}, chat=False, cfg=cfg)
    assert 1 <= early.target <= 50 and early.target == again.target  # deterministic
    assert early.finish_reason == ("stop" if early.target < 50 else "length")
    assert parse_job({"prompt": "x", "max_tokens": 50, "min_tokens": 50}, chat=False, cfg=cfg).target == 50
    chat = parse_job(
        {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 4, "ignore_eos": True},
        chat=True,
        cfg=cfg,
    )
    assert chat.target == 4 and chat.prompt_tokens == count_tokens(render_chat([{"role": "user", "content": "hi"}]))
    with pytest.raises(ApiError, match="maximum context length is 100 tokens"):
        parse_job({"prompt": "a b", "max_tokens": 99}, chat=False, cfg=cfg)
    with pytest.raises(ApiError):
        parse_job({"prompt": ["a", "b"]}, chat=False, cfg=cfg)
    with pytest.raises(ApiError) as missing:
        parse_job({"model": "other", "prompt": "a"}, chat=False, cfg=cfg.model_copy(update={"style": "vllm"}))
    assert missing.value.status == 404


# ---- the scheduler loop, in-process ------------------------------------------------------------------
async def test_admission_bounded_by_max_running_and_kv_fifo() -> None:
    cfg = SimConfig(decode_ms=2, decode_ms_per_running=0, prefill_ms_per_1k_tokens=0, max_running=3, kv_tokens=250)
    seen: list[tuple[int, int]] = []
    sched = Scheduler(cfg, Stats(), on_step=lambda step: seen.append((step.batch, sched.kv_reserved)))
    sched.start()
    try:
        big = [SimRequest(20, 40, 100, stream=False) for _ in range(3)]  # KV: only two of these fit in 250
        small = SimRequest(5, 5, 10, stream=False)
        for r in [*big, small]:
            sched.submit(r)
        await asyncio.wait_for(asyncio.gather(*(r.done for r in [*big, small])), 10)
        assert max(batch for batch, _ in seen) <= 3 and max(kv for _, kv in seen) <= 250
        # The third big request waited for KV until one of the first two finished (40 steps) ...
        assert big[2].first_token_at >= big[0].first_token_at + 0.002 * 39
        # ... and FIFO: the small one, which would have fitted, did not overtake it.
        assert small.first_token_at >= big[2].first_token_at
        assert sched.kv_reserved == 0 and not sched.running
    finally:
        await sched.stop()


async def test_kv_usage_counts_admitted_prompts_before_their_first_step() -> None:
    """A scrape between admission and the first step (a long step: 1 s here) sees the admitted
    prompts' KV in use, never running requests on an empty cache."""
    cfg = SimConfig(decode_ms=1000, decode_ms_per_running=0, prefill_ms_per_1k_tokens=0, max_running=2, kv_tokens=1000)
    stats = Stats()
    sched = Scheduler(cfg, stats)
    sched.start()
    try:
        reqs = [SimRequest(30, 5, 35, stream=False) for _ in range(3)]
        for r in reqs:
            sched.submit(r)

        async def admitted() -> bool:
            return stats.running == 2

        await async_wait_until(admitted, timeout=5, what="two requests admitted")
        assert stats.waiting == 1 and stats.steps == 0 and stats.used_tokens == 60
    finally:
        await sched.stop()


async def test_streaming_steps_carry_tokens_per_step_and_cancel_frees_slot() -> None:
    cfg = SimConfig(decode_ms=1, decode_ms_per_running=0, prefill_ms_per_1k_tokens=0, max_running=1, tokens_per_step=4)
    stats = Stats()
    sched = Scheduler(cfg, stats)
    sched.start()
    try:
        req = SimRequest(3, 10, 13, stream=True)
        sched.submit(req)
        steps: list[int] = []
        while sum(steps) < 10:
            steps += await asyncio.wait_for(req.next_steps(), 5)
        assert steps == [1, 4, 4, 1]
        assert stats.generation_tokens_total == 10 and stats.spec_accepted_total == 3 + 3 + 0
        hog, waiting = SimRequest(1, 10_000, 10_001, stream=False), SimRequest(1, 2, 3, stream=False)
        sched.submit(hog)
        sched.submit(waiting)
        await asyncio.sleep(0.01)
        assert waiting.first_token_at is None  # max_running=1: it waits behind the hog
        sched.cancel(hog)
        await asyncio.wait_for(waiting.done, 5)
        assert sched.kv_reserved == 0
    finally:
        await sched.stop()


# ---- request faults and log rendering ------------------------------------------------------------------
def test_request_fault_draws_honour_rates_and_seed() -> None:
    from servefleet.sim.faults import RequestFaults

    cfg = SimConfig(error_rate=0.2, rate_limit_rate=0.1, slow_rate=0.3, slow_ms=250, seed=5)
    faults = RequestFaults(cfg)
    draws = [faults.draw() for _ in range(10000)]
    share = {s: sum(d.status == s for d in draws) / len(draws) for s in (500, 429, None)}
    assert share[500] == pytest.approx(0.2, abs=0.02) and share[429] == pytest.approx(0.1, abs=0.02)
    assert sum(d.slow_s == 0.25 for d in draws) / len(draws) == pytest.approx(0.3, abs=0.02)
    first, second = RequestFaults(cfg), RequestFaults(cfg)
    assert [first.draw() for _ in range(100)] == [second.draw() for _ in range(100)]  # same seed, same faults
    assert RequestFaults(SimConfig()).draw().status is None


def test_renderer_prefixes_and_colour() -> None:
    from servefleet.sim.logline import SG_RANK, Line, Renderer, uv

    clock = lambda: 1_764_000_000.0  # noqa: E731 - a frozen clock, one expression
    sg = Renderer("sglang", tp=2, clock=clock)
    assert sg.render(Line("Load weight begin.", SG_RANK)).count("] Load weight begin.\n") == 2
    assert " TP1] Load weight begin." in sg.render(Line("Load weight begin.", SG_RANK))
    assert sg.render(Line("a\nb", "TP0")).endswith(" TP0] a\nb\n")  # a traceback continues bare
    vl = Renderer("vllm", color=True, pids={"APIServer": 7}, clock=clock)
    text = vl.render(Line("x\ny", "APIServer", level="ERROR", src="core.py:1"))
    assert (
        text.count("\x1b[1;36m(APIServer pid=7)\x1b[0;0m ") == 2
        and "\x1b[31mERROR\x1b[0m" in text
        and "[core.py:1] y\n" in text
    )
    assert vl.render(uv("INFO:     Application startup complete.", "APIServer")).endswith(
        "\x1b[32mINFO\x1b[0m:     Application startup complete.\n"
    )
    bar = Renderer("vllm").render(Line("100%", raw=True, redraws=("0%", "50%")))
    assert bar == "0%\r50%\r100%\n"
