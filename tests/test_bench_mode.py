"""bench measures the way the job runs: non-streaming by default, latency from the engine's /metrics
histograms (warm-up excluded), the steady part of each point as its rate, the mode in every RUN.json,
and plan saying so when it is given streaming-only runs. Unit parts first, then the realistic sim."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import SimProcess
from servefleet.bench.histograms import first_histogram, histogram
from servefleet.bench.result import BenchConfig, Environment, Point, Run, Stat, Target, load_run, save_run
from servefleet.bench.server_metrics import parse_prometheus
from servefleet.bench.steady import counter_rate, steady_window
from servefleet.bench.sweep import BenchTarget, run_bench
from servefleet.capacity import Capacity
from servefleet.cli.main import app
from servefleet.engines.registry import get_engine
from servefleet.sim.config import SimConfig
from servefleet.sim.theory import steady_state

runner = CliRunner()


# ---- histograms ------------------------------------------------------------------------------------
def _hist_text(name: str, series: dict[str, list[tuple[str, float]]], sums: dict[str, float]) -> str:
    lines = [f"# TYPE {name} histogram"]
    for labels, buckets in series.items():
        for le, n in buckets:
            lines.append(f'{name}_bucket{{{labels},le="{le}"}} {n}')
        lines.append(f"{name}_sum{{{labels}}} {sums[labels]}")
        lines.append(f"{name}_count{{{labels}}} {buckets[-1][1]}")
    return "\n".join(lines) + "\n"


def test_histogram_sums_label_sets_differences_and_interpolates() -> None:
    name = "vllm:time_to_first_token_seconds"
    before = parse_prometheus(
        _hist_text(
            name,
            {'engine="0"': [("0.1", 1), ("0.5", 2), ("+Inf", 2)], 'engine="1"': [("0.1", 0), ("0.5", 0), ("+Inf", 0)]},
            {'engine="0"': 0.3, 'engine="1"': 0.0},
        )
    )
    after = parse_prometheus(
        _hist_text(
            name,
            {
                'engine="0"': [("0.1", 3), ("0.5", 8), ("+Inf", 10)],
                'engine="1"': [("0.1", 2), ("0.5", 2), ("+Inf", 2)],
            },
            {'engine="0"': 4.3, 'engine="1"': 0.1},
        )
    )
    h = histogram(after, name)
    assert h is not None and h.count == 12 and h.buckets == ((0.1, 5.0), (0.5, 10.0), (math.inf, 12.0))
    d = h.minus(histogram(before, name))
    assert d.count == 10 and d.sum == pytest.approx(4.1) and d.buckets == ((0.1, 4.0), (0.5, 8.0), (math.inf, 10.0))
    s = d.stat()
    assert s.n == 10 and s.mean == pytest.approx(410.0)  # exact: sum / count, in ms
    assert s.p50 == pytest.approx(100 + 400 * (5 - 4) / 4)  # inside (0.1, 0.5]: linear
    assert s.p99 is None and s.resolution_ms["p99"] == (500.0, None)  # in +Inf: "over 500 ms" is all that is known
    assert d.minus(h).count == 10  # a counter reset (earlier larger) reads as the whole later scrape
    assert histogram(after, "vllm:e2e_request_latency_seconds") is None
    assert first_histogram(after, ("sglang:time_to_first_token_seconds", name)) == h


def test_engine_profiles_name_their_latency_histograms() -> None:
    vllm, sglang, sim = (get_engine(n).latency_metrics for n in ("vllm", "sglang", "sim"))
    assert vllm is not None and vllm.ttft[0] == "vllm:time_to_first_token_seconds"
    assert vllm.itl[0] == "vllm:inter_token_latency_seconds" and "vllm:time_per_output_token_seconds" in vllm.itl
    assert sglang is not None and sglang.ttft == ("sglang:time_to_first_token_seconds",)
    assert sim is not None and set(vllm.ttft + sglang.ttft) == set(sim.ttft)
    assert get_engine("llamacpp").latency_metrics is None


# ---- the steady part of a point --------------------------------------------------------------------
def _closed_loop(concurrency: int, lifetime: float, until: float, tokens: int) -> list[tuple[float, float, int]]:
    """Spans of a closed loop: each user sends back to back until ``until``; the last ones drain."""
    spans = []
    for u in range(concurrency):
        first = lifetime * (1 + u / concurrency)  # the first wave ends spread out (a ramp)
        spans.append((0.0, first, tokens))
        t = first
        while t < until:
            spans.append((t, t + lifetime, tokens))
            t += lifetime
    return spans


def test_steady_window_leaves_ramp_and_drain_out() -> None:
    spans = _closed_loop(8, 2.0, 40.0, 100)
    w = steady_window(spans, 8)
    assert w is not None and w.steady and w.reason is None
    assert w.start_s == pytest.approx(3.75)  # the 8th answer of the first wave
    assert w.end_s == pytest.approx(max(s for s, _, _ in spans))
    assert w.output_tokens_per_s == pytest.approx(8 * 100 / 2.0, rel=0.02)  # 8 users x 100 tokens per 2 s
    span_rate = sum(n for *_, n in spans) / (max(e for _, e, _ in spans) - 0.0)
    assert span_rate < 0.97 * w.output_tokens_per_s  # the whole span reads low: ramp and drain

    short = steady_window(_closed_loop(8, 2.0, 4.5, 100), 8)
    assert short is not None and not short.steady and "make the point longer" in (short.reason or "")
    one = steady_window([(0.0, 1.0, 5)], 1)
    assert one is not None and not one.steady and one.output_tokens_per_s == 0.0


def test_counter_rate_uses_samples_inside_the_window() -> None:
    samples = [(t * 0.5, 100.0 * t * 0.5) for t in range(21)]  # 100/s for 10 s
    assert counter_rate(samples, 2.0, 8.0) == pytest.approx(100.0)
    assert counter_rate(samples, 2.0, 2.4) is None  # one sample inside
    assert counter_rate([(0.0, 10.0), (2.0, 5.0)], 0.0, 2.0) is None  # counter went back: a restart


# ---- RUN.json says its mode; plan says so when it plans from streaming ----------------------------
def _run(path: Path, stream: bool, curve: list[tuple[int, float]], label: str) -> Path:
    points = [
        Point(
            concurrency=c,
            requests=10_000,
            successful=10_000,
            errors=0,
            duration_s=1000.0,
            requests_per_s=10.0,
            input_tokens=10_000,
            output_tokens=int(t * 1000),
            output_tokens_per_s=t,
            total_tokens_per_s=t,
            ttft_ms=Stat(),
            tpot_ms=Stat(),
            itl_ms=Stat(),
            e2e_ms=Stat(),
            achieved_concurrency=float(c),
            client_bound=False,
        )
        for c, t in curve
    ]
    run = Run(
        created_at="2026-12-01T00:00:00Z",
        target=Target(label=label, base_url="http://127.0.0.1:1", model="m"),
        config=BenchConfig(concurrency=[c for c, _ in curve], stream=stream),
        environment=Environment(servefleet_version="0", python="3.11", platform="linux", hostname="h"),
        capacity=Capacity(max_running_requests=64),
        points=points,
    )
    save_run(run, path)
    return path


def test_run_json_says_its_mode_also_for_old_files(tmp_path: Path) -> None:
    streamed = _run(tmp_path / "s.json", True, [(8, 100.0)], "s")
    body = json.loads(streamed.read_text())
    assert body["measured_mode"] == "streaming"
    del body["measured_mode"]  # written before the field existed
    (tmp_path / "old.json").write_text(json.dumps(body))
    assert load_run(tmp_path / "old.json").measured_mode == "streaming"
    assert BenchConfig().stream is False  # non-streaming unless asked


def test_plan_warns_when_it_plans_from_streaming_runs(tmp_path: Path) -> None:
    s = _run(tmp_path / "plain-stream.json", True, [(16, 1000.0), (64, 1800.0)], "plain")
    n = _run(tmp_path / "plain-nostream.json", False, [(16, 1200.0), (64, 2800.0)], "plain-ns")
    args = ["plan", "--prompts", "10000", "--output-tokens-mean", "100", "--json"]
    only = runner.invoke(app, [*args, "--bench", str(s)])
    assert only.exit_code == 0, only.output
    out = json.loads(only.output)
    assert (
        len(out["warnings"]) == 1
        and "streaming runs only" in out["warnings"][0]
        and "--no-stream" in out["warnings"][0]
    )
    assert out["plans"]["1"][0]["measured_mode"] == "streaming"
    mixed = json.loads(runner.invoke(app, [*args, "--bench", str(s), "--bench", str(n)]).output)
    assert "mixed with non-streaming" in mixed["warnings"][0]
    clean = json.loads(runner.invoke(app, [*args, "--bench", str(n)]).output)
    assert clean["warnings"] == [] and clean["plans"]["1"][0]["measured_mode"] == "non-streaming"
    table = runner.invoke(app, ["plan", "--prompts", "10000", "--output-tokens-mean", "100", "--bench", str(s)])
    assert table.exit_code == 0 and "warning:" in table.output and "streaming runs only" in table.output


# ---- on the realistic sim ---------------------------------------------------------------------------
# Realistic timing (the default): max running 16, peak at 8; steps of 4 ms + 0.5 ms per request.
SIM = dict(style="vllm", max_running=16, decode_ms=4.0, decode_ms_per_running=0.5, prefill_ms_per_1k_tokens=0.0)


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    args = ["--load-time", "0", "--model", "sim-mode"]
    for key, value in SIM.items():
        args += [f"--{key.replace('_', '-')}", str(value)]
    proc = SimProcess(*args, log_path=tmp_path_factory.mktemp("sim") / "sim.log").start()
    yield proc.wait_ready(timeout=180)
    proc.stop()


async def test_non_streaming_point_takes_latency_from_the_engine_histograms(sim) -> None:
    out = 24
    cfg = BenchConfig(concurrency=[8], requests=48, input_len=16, output_len=out, api="completions", warmup=8)
    run = await run_bench(BenchTarget(base_url=sim.url, capacity=Capacity(max_running_requests=16)), cfg)
    assert run.measured_mode == "non-streaming" and run.config.stream is False
    (p,) = run.points
    assert p.successful == 48 and p.chunks_per_request is None  # answered whole
    assert p.latency_source["ttft"] == "server:vllm:time_to_first_token_seconds"
    assert p.latency_source["tpot"] == "server:vllm:request_time_per_output_token_seconds"
    assert p.server_latency is not None and p.server_latency.e2e_ms is not None
    # Exactly the measured requests: the warm-up (8 short ones) was scraped out.
    assert p.ttft_ms.n == 48 and p.server_latency.e2e_ms.n == 48 and p.tpot_ms.n == 48
    theory = steady_state(SimConfig(**SIM), 8, prompt_tokens=16, output_tokens=out)
    # A loaded machine only slows the sim's steps: the engine's TPOT is at least one step.
    assert p.tpot_ms.mean >= 0.9 * theory.step_ms
    assert p.ttft_ms.mean is not None and 0 < p.ttft_ms.mean < p.e2e_ms.mean
    assert p.steady is not None and p.output_tokens_per_s_span is not None


async def test_streaming_on_the_realistic_sim_is_capped_by_the_api_process(sim) -> None:
    """One event per step per request through the API process: streamed throughput cannot pass its cap,
    whatever the load; the same point unstreamed is not bound by it (checked in the benchmark)."""
    model = SimConfig(**SIM)
    out = 24
    cfg = BenchConfig(
        concurrency=[8, 16], requests=64, input_len=16, output_len=out, api="completions", stream=True, warmup=4
    )
    run = await run_bench(BenchTarget(base_url=sim.url), cfg)
    assert run.measured_mode == "streaming"
    cap = model.steps.api_events_per_s * out / steady_state(model, 8, prompt_tokens=16, output_tokens=out).steps
    for p in run.points:
        assert p.latency_source["ttft"] == "client" and p.ttft_ms.n == 64
        assert p.output_tokens_per_s_span <= 1.1 * cap, (p.concurrency, p.output_tokens_per_s_span, cap)


def test_plan_takes_a_points_steady_rate_and_inverts_the_rest(tmp_path: Path) -> None:
    from servefleet.bench.result import SteadyWindow
    from servefleet.plan.runs import curve_from_run

    path = _run(tmp_path / "r.json", False, [(8, 100.0), (32, 300.0)], "r")
    run = load_run(path)
    # The 32 point: 30 s of 1000 answers, its steady part read 360 tok/s (the span mixes in ramp and drain).
    run.points[1] = run.points[1].model_copy(
        update={
            "requests": 1000,
            "successful": 1000,
            "duration_s": 30.0,
            "output_tokens": 9000,
            "output_tokens_per_s": 360.0,
            "steady": SteadyWindow(
                start_s=2.0, end_s=28.0, output_tokens=9360.0, output_tokens_per_s=360.0, steady=True
            ),
        }
    )
    save_run(run, path)
    curve = curve_from_run(path).curve
    assert curve.total(32) == 360.0  # measured steady, taken as is
    assert curve.total(8) == pytest.approx(100.0, rel=0.01)  # a 1000 s point: the drain model changes little
    run.points[1] = run.points[1].model_copy(
        update={"steady": run.points[1].steady.model_copy(update={"steady": False})}
    )
    save_run(run, path)
    assert curve_from_run(path).curve.total(32) != 360.0  # a short window is not trusted: inverted from the span


async def test_without_histograms_a_small_streamed_sample_gives_latency(sim) -> None:
    """An engine whose profile names no latency histograms (llama.cpp's): a few streamed requests beside the
    load measure TTFT/TPOT; they are not counted in the point's requests or rate."""
    cfg = BenchConfig(concurrency=[4], requests=40, input_len=16, output_len=24, api="completions", warmup=4)
    run = await run_bench(BenchTarget(base_url=sim.url, engine="llamacpp"), cfg)
    (p,) = run.points
    assert any("streamed requests sent one at a time" in n for n in run.notes)
    assert p.successful == 40 and p.output_tokens == 40 * 24 and p.chunks_per_request is None
    assert p.latency_source["ttft"].startswith("client:streamed sample of ") and 1 <= p.ttft_ms.n <= 8
    assert p.tpot_ms.mean is not None and p.tpot_ms.mean > 0 and p.server_latency is None


async def test_a_duration_point_too_short_for_a_steady_part_runs_again_longer_and_says_so(sim) -> None:
    """Issue 25 (H200): "steady part 11.6 s is under 2 request lifetimes: make the point longer" asked
    the user; the point is lengthened instead, up to a cap, with a note."""
    out = 100  # ~1 s a request on this sim: 1.5 s of load leaves well under 2 lifetimes of steady part
    cfg = BenchConfig(concurrency=[8], duration_s=1.5, input_len=16, output_len=out, api="completions", warmup=0)
    run = await run_bench(BenchTarget(base_url=sim.url), cfg)
    (p,) = run.points
    (note,) = [n for n in run.notes if "ran it again" in n]
    assert "C=8: steady part" in note and "instead of 1.5 s" in note and "at most 4x --duration" in note
    assert 1.5 < p.duration_s <= 4 * 1.5 + 3  # the longer run (plus its drain) is the point
    assert p.steady is not None and p.steady.steady, p.steady
