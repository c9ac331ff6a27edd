"""Health by progress: a server with requests in flight whose work does not move is hung, even
though it answers every probe. The pure watch by a table; the dispatcher against in-process servers
that stall behind a live API, or that are slow but visibly busy (their /metrics counters move)."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from servefleet.generate.health import HealthPolicy, ProgressWatch, hang_window_s
from servefleet.generate.server_load import sample_from_text
from test_generate_dispatch import FakeServer, assert_exactly_once, config, write_input


# ---- the pure parts --------------------------------------------------------------------------------
# (looks: (time, in flight, marks)), window, the verdict after each look
@pytest.mark.parametrize(
    ("looks", "expected"),
    [
        ([(0, 4, (1, 1, 0)), (5, 4, (1, 1, 0)), (10, 4, (1, 1, 0))], [False, False, True]),  # nothing moves for 10 s
        (
            [(0, 4, (1, 1, 0)), (5, 4, (2, 1, 0)), (10, 4, (2, 1, 0))],
            [False, False, False],
        ),  # generated tokens moved at 5 s
        (
            [(0, 4, (1, 1, 0)), (9, 4, (1, 2, 0)), (18, 4, (1, 2, 0))],
            [False, False, False],
        ),  # prompt tokens (a prefill)
        (
            [(0, 4, (None, None, 0)), (10, 4, (None, None, 0))],
            [False, True],
        ),  # no metrics: our answers are the evidence
        ([(0, 4, (None, None, 0)), (6, 4, (None, None, 1)), (12, 4, (None, None, 1))], [False, False, False]),
        ([(0, 0, (1, 1, 0)), (20, 0, (1, 1, 0))], [False, False]),  # idle: nothing in flight is never a hang
        ([(0, 0, (1, 1, 0)), (20, 3, (1, 1, 0)), (29, 3, (1, 1, 0)), (30, 3, (1, 1, 0))], [False, False, False, True]),
    ],
)
def test_progress_watch(looks, expected) -> None:
    watch = ProgressWatch()
    assert [watch.update(t, n, marks, 10.0) for t, n, marks in looks] == expected


def test_the_hang_window_grows_with_the_latency_observed() -> None:
    policy = HealthPolicy(hang_min_s=60, hang_latency_factor=3)
    assert (
        hang_window_s(policy, 0.0) == 60 and hang_window_s(policy, 5.0) == 60 and hang_window_s(policy, 100.0) == 300
    )


def test_load_sample_reads_vllms_counters_and_gauges() -> None:
    text = (
        '# HELP vllm:generation_tokens_total x\nvllm:generation_tokens_total{engine="0",model_name="m"} 1234.0\n'
        'vllm:prompt_tokens_total{engine="0"} 99.0\nvllm:iteration_tokens_total_count{engine="0"} 17.0\n'
        'vllm:num_requests_running{engine="0"} 64.0\nvllm:num_requests_waiting{engine="0"} 3.0\n'
    )
    s = sample_from_text(text, 1.0)
    assert (s.generation_tokens, s.prompt_tokens, s.steps, s.running, s.waiting) == (1234, 99, 17, 64, 3)
    assert sample_from_text("python_gc_objects_collected_total 3\n", 1.0) is None  # not an engine's metrics


# ---- the dispatcher -------------------------------------------------------------------------------
class StallingServer(FakeServer):
    """Answers ``answer_first`` completions, then takes every completion forever -- while
    /v1/models keeps answering (a hung engine behind a live API process)."""

    def __init__(self, answer_first: int, **kw) -> None:
        super().__init__(**kw)
        self.answer_first = answer_first

    async def _complete(self, request: web.Request) -> web.Response:
        if self.answered >= self.answer_first:
            self.requests += 1
            await asyncio.sleep(3600)
        return await super()._complete(request)


class BusyServer(FakeServer):
    """Slow requests (a long prefill), with a /metrics whose engine-step counter moves on every scrape."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.steps = 0

    async def start(self) -> BusyServer:
        app = web.Application()
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/completions", self._complete)
        app.router.add_get("/metrics", self._metrics)
        self.runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=0.2)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()
        return self

    async def _metrics(self, request: web.Request) -> web.Response:
        self.steps += 1
        return web.Response(
            text=f"vllm:generation_tokens_total 0.0\nvllm:iteration_tokens_total_count {self.steps}.0\n"
            f"vllm:num_requests_running {self.in_flight}.0\nvllm:num_requests_waiting 0.0\n"
        )


async def test_a_server_that_answers_probes_but_never_finishes_is_taken_out_by_progress(tmp_path) -> None:
    stuck, good = await StallingServer(5, name="stuck").start(), await FakeServer(delay_s=0.01, name="good").start()
    try:
        src = write_input(tmp_path / "in.jsonl", 300)
        # probes every 0.3 s: they all succeed (so the probe check alone would never take it out)
        policy = HealthPolicy(
            hang_min_s=1.0, probe_interval_s=0.3, probe_timeout_s=0.3, recover_timeout_s=1.0, retry_interval_s=0.1
        )
        report = await run(
            config(src, tmp_path / "out", concurrency=4, health=policy), [stuck.target(), good.target()]
        )
    finally:
        await stuck.stop()
        await good.stop()
    assert report.status == "complete" and report.committed == 300
    by_name = {s.name: s for s in report.servers}
    assert by_name["stuck"].outages >= 1 and by_name["stuck"].state in ("down", "gone")
    hung = [e for e in report.events if "stuck: taken out (hung: no progress (answers)" in e]
    assert hung, report.events
    assert not any("stuck: back in service" in e for e in report.events)  # /v1/models answers, a completion never does
    assert report.requeued >= 4
    assert_exactly_once(tmp_path / "out", {f"p{i}" for i in range(300)})


async def test_slow_requests_of_a_server_whose_engine_counters_move_are_not_a_hang(tmp_path) -> None:
    busy = await BusyServer(delay_s=4.5, name="busy").start()
    try:
        src = write_input(tmp_path / "in.jsonl", 8)
        policy = HealthPolicy(hang_min_s=3.0, probe_interval_s=1000)
        report = await run(config(src, tmp_path / "out", concurrency=8, health=policy), [busy.target()])
    finally:
        await busy.stop()
    assert report.status == "complete" and report.servers[0].outages == 0, report.events
    assert_exactly_once(tmp_path / "out", {f"p{i}" for i in range(8)})


async def test_the_same_slow_requests_without_metrics_are_a_hang(tmp_path) -> None:
    """The control of the test above: nothing but our answers to go by, and none within the window."""
    slow, good = await FakeServer(delay_s=4.5, name="slow").start(), await FakeServer(name="good").start()
    try:
        src = write_input(tmp_path / "in.jsonl", 40)
        policy = HealthPolicy(
            hang_min_s=3.0, probe_interval_s=1000, probe_timeout_s=0.3, recover_timeout_s=0.5, retry_interval_s=0.1
        )
        report = await run(config(src, tmp_path / "out", concurrency=8, health=policy), [slow.target(), good.target()])
    finally:
        await slow.stop()
        await good.stop()
    assert {s.name: s.outages for s in report.servers}["slow"] == 1
    assert report.status == "complete"
    assert_exactly_once(tmp_path / "out", {f"p{i}" for i in range(40)})


async def run(cfg, targets):
    from servefleet.generate.runner import run_generate

    return await run_generate(cfg, targets=targets)


def test_a_window_of_scrapes_gives_the_servers_rate_its_lowest_queue_and_most_running() -> None:
    """And the queue now: the fewest waiting over the window's last scrapes, whatever its first ones saw."""
    from servefleet.generate.server_load import LoadSample, LoadWatch, LoadWindow

    watch = LoadWatch()
    for t, gen, waiting, running in [
        (0.0, 0, 5, 60),
        (1.0, 900, 0, 64),
        (2.0, 2000, 3, 64),
        (3.0, 3000, 2, 62),
        (4.0, 4000, 4, 62),
        (5.0, 4900, 6, 63),
        (9.0, 9999, 0, 0),
    ]:
        watch.samples.append(LoadSample(t, gen, 0.0, 0.0, running, waiting))
    assert watch.window(0.5, 3.5) == LoadWindow(1050.0, 0, 64, 0)  # the scrapes at 1, 2 and 3 s
    assert watch.window(0.5, 5.5) == LoadWindow(1000.0, 0, 64, 2)  # its last three: 3, 4 and 5 s
    assert watch.window(8.0, 9.5) == LoadWindow()  # one scrape: no rate


def test_the_jobs_prefix_cache_tally_survives_a_restart() -> None:
    """The job's prefix-cache hits are summed from each scrape's increase: a restarted server's counters
    start again from zero, and what it had answered before is kept, not subtracted."""
    from servefleet.generate.server_load import LoadWatch

    text = "vllm:generation_tokens_total 1\nvllm:prefix_cache_queries_total {q}\nvllm:prefix_cache_hits_total {h}\n"
    watch = LoadWatch()
    for t, (q, h) in enumerate([(100, 0), (500, 100), (900, 300)]):
        watch.add(sample_from_text(text.format(q=q, h=h), float(t)))
    watch.reset()  # restarted: from zero again
    for t, (q, h) in enumerate([(0, 0), (400, 0), (200, 0)], start=3):  # the last one went down: another restart
        watch.add(sample_from_text(text.format(q=q, h=h), float(t)))
    assert (watch.prefix.looked_up, watch.prefix.hits) == (800 + 400, 300)
    assert watch.prefix.hit_rate() == pytest.approx(0.25)
    assert LoadWatch().prefix.hit_rate() is None
