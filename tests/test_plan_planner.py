"""The planner on synthetic curves with answers known by hand."""

from __future__ import annotations

import math

import pytest

from servefleet.plan.planner import (
    ConfigCurve,
    Curve,
    JobSpec,
    plan_job,
    prefix_hit_rate_of,
    simulate_makespan,
    tail_model,
)

# The shapes of the MTP-vs-plain choice (examples/sglang-mtp-vs-plain.toml): speculative decoding is ~2.5x faster per request but capped
# at 4 running requests; plain decoding is slower per request and scales to 64.
SPEC = ConfigCurve("mtp", Curve((1, 2, 4), (70.0, 130.0, 234.0)), max_running=4)
PLAIN = ConfigCurve("plain", Curve((1, 4, 16, 64), (26.7, 100.0, 350.0, 600.0)))


def test_capped_fast_config_loses_a_large_job():
    rows = plan_job([SPEC, PLAIN], JobSpec(prompts=902_087, output_tokens_mean=1800), gpus=1)
    assert [r.name for r in rows] == ["plain", "mtp"]
    mtp = rows[1]
    # 1.624e9 tokens at 234 tok/s is ~80 days (the tail adds well under a day)
    assert mtp.makespan_s / 86400 == pytest.approx(902_087 * 1800 / 234 / 86400, rel=0.001)
    assert mtp.best_concurrency == 4


def test_capped_fast_config_wins_a_tiny_job():
    rows = plan_job([SPEC, PLAIN], JobSpec(prompts=4, output_tokens_mean=1800), gpus=1)
    assert rows[0].name == "mtp"
    # four requests at once on the speculative server: 1800 tokens at 234/4 tok/s each
    assert rows[0].makespan_s == pytest.approx(1800 / (234 / 4))


def test_cap_excludes_points_above_it():
    capped = ConfigCurve("x", Curve((1, 8, 32), (10.0, 70.0, 200.0)), max_running=8)
    c, tps, notes = capped.best()
    assert (c, tps) == (8, 70.0)
    assert not notes


def test_measured_below_cap_is_said_and_flat():
    short = ConfigCurve("x", Curve((1, 8), (10.0, 70.0)), max_running=256)
    c, tps, notes = short.best()
    assert c == 8 and "measured only up to concurrency 8" in notes[0]
    assert short.curve.total(200) == 70.0  # conservative: no growth beyond the last point


def test_more_gpus_shorten_makespan_linearly_for_large_jobs():
    job = JobSpec(prompts=100_000, output_tokens_mean=1000)
    one = plan_job([PLAIN], job, gpus=1)[0].makespan_s
    eight = plan_job([PLAIN], job, gpus=8)[0].makespan_s
    assert eight == pytest.approx(one / 8, rel=0.01)


def test_replica_needing_more_gpus_than_given():
    tp2 = ConfigCurve("tp2", Curve((1,), (50.0,)), gpus_per_replica=2)
    row = plan_job([tp2], JobSpec(10, 100), gpus=1)[0]
    assert row.replicas == 0 and math.isinf(row.makespan_s)
    assert "needs 2 GPUs" in row.notes[-1]


def test_tail_drains_at_falling_concurrency():
    # Per-request speed is constant (linear curve) -> the drain of an even spread of remaining
    # work (M/c, 2M/c, ... M) takes exactly the time of one full request: M / speed.
    lin = Curve((1, 10), (5.0, 50.0))
    t = simulate_makespan(lin, concurrency=10, replicas=1, job=JobSpec(prompts=1000, output_tokens_mean=100))
    steady = (1000 * 100 - 10 * 100 / 2) / 50.0
    assert t == pytest.approx(steady + 100 / 5.0)


def test_cost_and_gpu_hours():
    row = plan_job([PLAIN], JobSpec(10_000, 1000), gpus=2, gpu_hour_cost=2.5)[0]
    assert row.gpu_hours == pytest.approx(row.makespan_s * 2 / 3600)
    assert row.cost == pytest.approx(row.gpu_hours * 2.5)


def test_the_tail_model_ends_where_the_makespan_does_and_holds_every_replica_until_then():
    lin = Curve((1, 8), (10.0, 80.0))  # 10 tok/s per request at any concurrency
    job = JobSpec(prompts=100, output_tokens_mean=100)
    tail = tail_model(lin, concurrency=2, replicas=2, job=job)
    # 4 slots: remaining work 25, 50, 75, 100 dealt in turn -> replica 0 drains (25, 75), replica 1 (50, 100)
    assert tail.queue_empty_s == pytest.approx((100 * 100 - 4 * 100 / 2) / 40)
    assert tail.finish_s == pytest.approx((tail.queue_empty_s + 7.5, tail.queue_empty_s + 10.0))
    assert tail.makespan_s == pytest.approx(simulate_makespan(lin, 2, 2, job))
    assert tail.held_server_s == pytest.approx(2 * 10.0) and tail.released_server_s == pytest.approx(2.5)
    curve = Curve((1, 8, 32, 64), (50.0, 350.0, 1000.0, 1600.0))
    for prompts, c, replicas in ((100_000, 64, 8), (2000, 8, 16), (10, 4, 4)):
        big = JobSpec(prompts=prompts, output_tokens_mean=500)
        assert tail_model(curve, c, replicas, big).makespan_s == pytest.approx(
            simulate_makespan(curve, c, replicas, big)
        )


def test_prompts_that_do_not_divide_evenly_leave_replicas_that_release_gives_back():
    curve = Curve((1, 4), (10.0, 20.0))  # per request: 10 tok/s alone, 100/15 at 2, 100/18 at 3
    tail = tail_model(curve, concurrency=4, replicas=4, job=JobSpec(prompts=10, output_tokens_mean=100))
    assert tail.queue_empty_s == 0.0 and tail.finish_s == pytest.approx((18.0, 18.0, 15.0, 15.0))  # 3, 3, 2, 2 prompts
    assert tail.held_server_s == pytest.approx(72.0) and tail.released_server_s == pytest.approx(6.0)
    idle = tail_model(curve, concurrency=4, replicas=4, job=JobSpec(prompts=3, output_tokens_mean=100))
    assert idle.finish_s == pytest.approx((10.0, 10.0, 10.0, 0.0)) and idle.released_server_s == pytest.approx(10.0)


def test_a_prefix_hit_rate_of_several_measurements_weighs_each_by_its_requests() -> None:
    """A bench's points and a job's servers each tell a rate over their own requests: one server that
    answered three times as many counts three times as much; one that answered nothing does not count."""
    assert prefix_hit_rate_of([(0.8, 300), (0.0, 100), (1.0, 0)]) == pytest.approx(0.6)
    assert prefix_hit_rate_of([(0.5, 0)]) is None
    assert prefix_hit_rate_of([]) is None
