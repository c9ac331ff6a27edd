"""Server-side truth: Prometheus parsing and the per-point summary (vLLM and SGLang names)."""

from __future__ import annotations

import pytest

from servefleet.bench.server_metrics import Snapshot, parse_prometheus, summarize_server

VLLM = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="m"}} {running}
vllm:num_requests_waiting{{engine="0",model_name="m"}} {waiting}
vllm:kv_cache_usage_perc{{engine="0",model_name="m"}} {kv}
vllm:generation_tokens_total{{engine="0",model_name="m"}} {gen}
vllm:spec_decode_num_drafts_total{{engine="0",model_name="m"}} {drafts}
vllm:spec_decode_num_draft_tokens_total{{engine="0",model_name="m"}} {draft_tokens}
vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="m"}} {accepted}
vllm:e2e_request_latency_seconds_bucket{{le="+Inf",model_name="m"}} 3.0
"""


def vllm(**kw) -> dict[str, float]:
    base = dict(running=0, waiting=0, kv=0.0, gen=0, drafts=0, draft_tokens=0, accepted=0)
    base.update(kw)
    return parse_prometheus(VLLM.format(**base))


def test_parse_sums_label_sets_and_keeps_series() -> None:
    m = parse_prometheus('a{x="1"} 2\na{x="2"} 3.5\nb 7\nc NaN\n# comment\n')
    assert m["a"] == 5.5 and m['a{x="2"}'] == 3.5 and m["b"] == 7 and "c" not in m


def test_vllm_spec_decode_acceptance_is_differenced_over_the_point() -> None:
    before = Snapshot(vllm(gen=1000, drafts=100, draft_tokens=300, accepted=150))
    samples = [vllm(running=4, waiting=0, kv=0.2), vllm(running=8, waiting=3, kv=0.45)]
    after = Snapshot(vllm(gen=3000, drafts=600, draft_tokens=1800, accepted=1050))
    s = summarize_server(before, after, samples, max_running=8)
    assert s is not None
    assert s.running_max == 8 and s.running_mean == 6 and s.queued_max == 3
    assert s.kv_cache_usage_max == pytest.approx(0.45)
    assert s.generation_tokens == 2000
    assert s.spec_acceptance_rate == pytest.approx(900 / 1500)
    assert s.spec_accept_length == pytest.approx(1 + 900 / 500)
    assert s.saturated is True


def test_sglang_gauges_and_server_info() -> None:
    text = (
        'sglang:num_running_reqs{model_name="m",tp_rank="0"} 4\n'
        'sglang:num_queue_reqs{model_name="m"} 0\n'
        'sglang:token_usage{model_name="m",tp_rank="0"} 0.3\n'
        'sglang:spec_accept_length{model_name="m",tp_rank="0"} 2.9\n'
    )
    sample = parse_prometheus(text)
    s = summarize_server(
        Snapshot(sample),
        Snapshot(sample, {"internal_states": [{"avg_spec_accept_length": 3.1}]}),
        [sample],
        max_running=16,
    )
    assert s is not None and s.running_max == 4 and s.queued_max == 0 and s.saturated is False
    assert s.spec_accept_length == pytest.approx(2.9) and s.kv_cache_usage_max == pytest.approx(0.3)
    assert s.source == ["/metrics", "/server_info"]
    # without the gauge, /server_info's average is used
    s2 = summarize_server(Snapshot(), Snapshot(None or {}, {"internal_states": [{"avg_spec_accept_length": 3.1}]}), [])
    assert s2 is not None and s2.spec_accept_length == pytest.approx(3.1)


def test_no_metrics_no_section() -> None:
    assert summarize_server(Snapshot(), Snapshot(), []) is None


def test_a_burst_queued_between_steps_is_not_saturation() -> None:
    """Eight requests sent at once to an idle server with 8 slots are queued for an instant (until
    the next step admits them): not saturated. A queue while every slot is busy is."""
    burst = [vllm(running=0, waiting=8), vllm(running=1, waiting=0), vllm(running=1, waiting=0)]
    s = summarize_server(Snapshot(vllm()), Snapshot(vllm()), burst, max_running=8)
    assert s is not None and s.queued_max == 8 and s.saturated is False
    full = [vllm(running=8, waiting=0), vllm(running=8, waiting=2)]
    assert summarize_server(Snapshot(vllm()), Snapshot(vllm()), full, max_running=8).saturated is True
    # capacity unknown: a queue that persists on average
    assert summarize_server(Snapshot(vllm()), Snapshot(vllm()), burst).saturated is True
    assert summarize_server(Snapshot(vllm()), Snapshot(vllm()), [vllm(running=3, waiting=0)] * 2).saturated is False


def test_the_prefix_cache_hit_rate_is_differenced_over_the_point() -> None:
    """vLLM counts looked-up and cached prompt tokens; SGLang every finished prompt's tokens and their
    cached part, in a counter that has no series before its first cached token."""
    v = 'vllm:prefix_cache_queries_total{{engine="0"}} {q}\nvllm:prefix_cache_hits_total{{engine="0"}} {h}\n'
    before = Snapshot(parse_prometheus(v.format(q=10_000, h=9_000)))  # an earlier point's repeats: not this one's
    s = summarize_server(before, Snapshot(parse_prometheus(v.format(q=14_000, h=10_000))), [])
    assert s is not None and s.prefix_cache_hit_rate == pytest.approx(0.25)
    sgl = 'sglang:prompt_tokens_total{{model_name="m",is_streaming="false"}} {p}\n'
    none_yet = summarize_server(
        Snapshot(parse_prometheus(sgl.format(p=0))), Snapshot(parse_prometheus(sgl.format(p=800))), []
    )
    assert none_yet is not None and none_yet.prefix_cache_hit_rate == 0.0
    cached = sgl + 'sglang:cached_tokens_total{{model_name="m",cache_source="device"}} {c}\n'
    s2 = summarize_server(
        Snapshot(parse_prometheus(sgl.format(p=800))), Snapshot(parse_prometheus(cached.format(p=1800, c=600))), []
    )
    assert s2 is not None and s2.prefix_cache_hit_rate == pytest.approx(0.6)
    idle = summarize_server(before, before, [])  # nothing looked up during the point: no rate, not 0
    assert idle is not None and idle.prefix_cache_hit_rate is None
