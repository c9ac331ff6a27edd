"""The concurrency controller (pure): driven window by window with throughput curves of the shapes
real engines show -- a peak below max running and a decline past it, plateaus, noise -- and the
server's queue gauge where it has one. No server, no clock."""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import pytest

from servefleet.generate.concurrency import (
    CONFIRM,
    EARLY_MAX,
    REPROBE_WINDOWS,
    START,
    ConcurrencyController,
    Window,
    headroom,
    room,
)
from servefleet.sim.config import SimConfig

Curve = Callable[[int], float]


def peaked(peak_at: int, peak_tps: float = 10_000.0, decline: float = 0.004) -> Curve:
    """Rises linearly to ``peak_at`` then declines by ``decline`` of the peak per request past it
    (vLLM on one H200: 28.7k at 512, 23.4k at 1024)."""

    def f(n: int) -> float:
        return peak_tps * n / peak_at if n <= peak_at else peak_tps * max(0.1, 1 - decline * (n - peak_at))

    return f


def plateau(knee: int, tps: float = 8_000.0) -> Curve:
    return lambda n: tps * min(n, knee) / knee


def drive(
    c: ConcurrencyController,
    curve: Curve,
    windows: int,
    *,
    noise: float = 0.0,
    seed: int = 0,
    capacity: int | None = None,
) -> list[int]:
    """Feed ``windows`` windows; with ``capacity`` the server also reports its queue and running count."""
    rng = random.Random(seed)
    limits = []
    for _ in range(windows):
        n = c.limit
        running = min(n, capacity) if capacity else n
        tps = curve(running) * (1 + rng.uniform(-noise, noise))
        queue = (max(0, n - capacity), running) if capacity else (None, None)
        c.observe(Window(tps=tps, saturated=True, queued=queue[0], running=queue[1]))
        limits.append(c.limit)
    return limits


def best_of(curve: Curve, upto: int) -> float:
    return max(curve(n) for n in range(1, upto + 1))


@pytest.mark.parametrize(
    ("max_running", "curve", "name"),
    [
        (128, peaked(80), "peak well below max running"),
        (128, peaked(120), "peak just below max running"),
        (1024, peaked(512, decline=0.0004), "H200-like: 512 beats 1024 by ~20%"),
        (128, plateau(64), "flat past 64"),
        (64, plateau(200), "still rising at max running"),
    ],
)
@pytest.mark.parametrize("seed", range(4))
def test_from_capacity_it_holds_within_5_percent_of_the_best(
    max_running: int, curve: Curve, name: str, seed: int
) -> None:
    c = ConcurrencyController.auto(max_running)
    assert c.source == "capacity" and c.limit == max_running + headroom(max_running)
    drive(c, lambda n: curve(min(n, max_running)), 40, noise=0.02, seed=seed)
    assert c.phase in ("hold", "probe")
    achieved = curve(min(c.best_limit, max_running))
    assert achieved >= 0.95 * best_of(curve, max_running), (name, c.best_limit, c.history)


@pytest.mark.parametrize("seed", range(4))
def test_it_goes_down_from_the_capacity_figure_when_the_engine_declines_past_its_peak(seed: int) -> None:
    c = ConcurrencyController.auto(1024)
    drive(c, peaked(512, decline=0.0004), 30, noise=0.02, seed=seed)
    assert c.best_limit < 800  # left 1024 (+headroom) behind
    assert any(limit < 1024 for limit, _ in c.history)


def test_a_bench_point_is_where_it_starts_and_a_flat_neighbourhood_keeps_it() -> None:
    c = ConcurrencyController.auto(256, bench_concurrency=180, bench_tps=9_000.0)
    assert (c.source, c.limit) == ("bench", 180)
    assert "C=180" in c.reason and "9,000" in c.reason
    drive(c, plateau(150), 30)
    assert c.best_limit >= 180  # equal throughput: never settles below the best limit measured


def test_a_bench_point_above_the_capacity_is_capped_at_half_as_much_again() -> None:
    c = ConcurrencyController.auto(64, bench_concurrency=512)
    assert c.limit == c.ceiling == room(64) == 96


def test_search_doubles_while_the_servers_queue_is_empty_and_learns_its_capacity() -> None:
    c = ConcurrencyController.auto(None)
    assert (c.source, c.phase, c.limit) == ("search", "ramp", START) and START == 32
    limits = drive(c, peaked(100), 4, capacity=128)
    assert limits[0] == 64  # the first window: queue empty, nothing yet to be in proportion to -> x2
    assert limits[1] == 256  # grew in proportion: x4
    assert limits[2] == 256  # a queue at 256: one window is not enough to call it full
    assert limits[3] == 128 + headroom(128)  # ... two are: full at 128 running
    # as from the capacity figure: the slots plus headroom, half as much again queued only on evidence
    assert "full at 128 running" in c.reason and c.ceiling == 128 + headroom(128) and c.room == room(128) == 192
    drive(c, peaked(100), 40, noise=0.02, capacity=128)
    assert peaked(100)(min(c.best_limit, 128)) >= 0.95 * 10_000


def test_a_burst_still_being_admitted_is_not_a_full_server() -> None:
    """vLLM-CPU admits a step's token budget at a time: right after a doubling some requests wait
    for a window, then run. Seen on the real server: 32 sent, 22 running, 10 waiting, then all 32 running."""
    c = ConcurrencyController.auto(None)
    c.observe(Window(1000.0, queued=0.0, running=32))
    assert c.limit == 64
    c.observe(Window(1500.0, queued=20.0, running=44))  # admitting
    assert c.limit == 64 and c.phase == "ramp"
    c.observe(Window(2000.0, queued=0.0, running=64))  # all admitted: room, grow
    assert c.limit == 256 and c.phase == "ramp"


def test_search_without_metrics_grows_while_throughput_grows() -> None:
    c = ConcurrencyController.auto(None)
    drive(c, plateau(30), 40)
    assert c.phase in ("hold", "probe") and 30 <= c.best_limit <= 128  # on the plateau, not far past it


def test_one_bad_window_is_not_a_loss_a_repeated_one_is() -> None:
    c = ConcurrencyController.auto(None, bench_concurrency=100)
    c.observe(Window(1000.0))  # the best limit measured
    up = c.limit
    assert up > 100
    c.observe(Window(960.0))  # -4%: one window does not decide a small difference
    assert c.limit == up
    c.observe(Window(1030.0))  # mean -0.5%: equal going up is kept
    assert c.best_limit == up
    c2 = ConcurrencyController.auto(None, bench_concurrency=100)
    c2.observe(Window(1000.0))
    for _ in range(CONFIRM):
        c2.observe(Window(950.0))  # -5% twice: a loss
    assert c2.limit == 100 and c2.best_limit == 100


def test_a_large_loss_is_decided_by_one_window() -> None:
    c = ConcurrencyController.auto(None, bench_concurrency=100)
    c.observe(Window(1000.0))
    c.observe(Window(700.0))
    assert c.limit == 100 and "back to 100" in c.reason


def test_held_it_probes_again_later() -> None:
    c = ConcurrencyController.auto(128)
    for _ in range(40):
        drive(c, plateau(60), 1)
        if c.phase == "hold":
            break
    assert c.phase == "hold"
    held = c.limit
    changed = [c.observe(Window(8_000.0)) for _ in range(REPROBE_WINDOWS)]
    assert changed[-1] and c.limit != held and c.phase == "probe"


def test_overload_backs_off_and_caps_unsaturated_windows_teach_nothing_fixed_never_moves() -> None:
    c = ConcurrencyController.auto(64)
    assert c.on_overload() and c.limit == int(71 * 0.7) and c.ceiling == 71
    assert "overloaded" in c.reason
    s = ConcurrencyController.auto(None)
    for _ in range(10):
        assert not s.observe(Window(5.0, saturated=False))
    assert s.limit == START and not s.history
    f = ConcurrencyController.fixed(3)
    assert not f.on_overload() and not f.observe(Window(1.0)) and f.limit == 3
    assert f.source == "fixed" and f.describe() == "fixed: --concurrency 3"


def test_from_capacity_it_also_climbs_into_the_servers_queue_when_that_pays() -> None:
    """vLLM-CPU on a busy 2-core host: its bench peaked at 192 in flight with 128 slots (the API
    process, short of CPU, refills the batch late; a queue keeps it full)."""
    c = ConcurrencyController.auto(128)
    drive(c, plateau(192), 40, noise=0.02)
    assert c.best_limit >= 180 and c.best_limit <= room(128)


def test_requests_the_engine_has_not_seen_yet_are_not_room() -> None:
    """vLLM-CPU on a busy host: 256 sent, 128 running, the engine's queue empty (the API process had
    not handed the rest over yet). Doubling again would be blind."""
    c = ConcurrencyController.auto(None, ceiling=4096)
    c.limit = 256
    c.observe(Window(1000.0, queued=0.0, running=128))
    assert c.limit == 256
    c.observe(Window(1000.0, queued=0.0, running=128))
    assert c.limit < 256 and c.ceiling == 128 + headroom(128) and c.room == room(128)


def test_each_change_of_limit_comes_with_its_own_reason() -> None:
    """Seen on the H200: after 'back to 282' the next probe (282 -> 375) was announced with the reason
    of the move before ('212 gives ... back to 282'), and the job's report kept it as the limit's reason."""
    c = ConcurrencyController.auto(None, bench_concurrency=100)
    c.observe(Window(1000.0))  # the best limit measured: probe above it
    assert c.limit > 100 and f"trying {c.limit} (above the best so far, 100: 1,000 tok/s)" in c.reason
    c.observe(Window(500.0))  # a large loss: back to 100
    assert c.limit == 100 and "back to 100" in c.reason
    assert not c.observe(Window(800.0))  # the first window after lowering is its transient: dropped
    c.observe(Window(1000.0))  # at the best again: probe the other way
    assert c.limit < 100 and "back to" not in c.reason and f"trying {c.limit} (below the best so far, 100" in c.reason


def h200_curve() -> Curve:
    """Output tok/s by batch of the sim's realistic timing model at the H200/vLLM fit (peak at 512 of
    --max-num-seqs 1024, 0.81 of the peak at 1024): the shape of a server that peaks below max running."""
    model = SimConfig(timing="realistic", max_running=1024, decode_ms=2.04, decode_ms_per_running=0.0282).steps
    return lambda n: model.decode_tokens_per_s(min(n, 1024))


def drive_waves(
    c: ConcurrencyController,
    curve: Curve,
    windows: int,
    *,
    swing: float,
    transient: float,
    seed: int,
    capacity: int | None = None,
) -> list[int]:
    """Windows as closed-loop waves of uniform work make them: throughput swings by +-``swing``
    around the curve from window to window, and the first window after a change of limit reads
    ``transient`` low (the requests of the old setting still draining or the new ones in prefill).
    A window the controller asks to be k times longer averages k times as many waves: 1/k the swing."""
    rng = random.Random(seed)
    phase = rng.uniform(0, 2 * math.pi)
    limits, changed = [], False
    for k in range(windows):
        n = c.limit
        running = min(n, capacity) if capacity else n
        wave = swing / c.window_factor() * math.sin(phase + 2.1 * k)
        tps = curve(running) * (1 + wave) * ((1 - transient) if changed else 1.0)
        queued = max(0, n - capacity) if capacity else None
        changed = c.observe(Window(tps=tps, queued=queued, running=running if capacity else None))
        limits.append(c.limit)
    return limits


@pytest.mark.parametrize("metrics", [True, False])
def test_the_ramp_stops_where_throughput_stops_growing_below_max_running(metrics: bool) -> None:
    """The H200 run: the ramp doubled 8 -> 2048 while vLLM (1024 slots) had an empty queue and its
    throughput had stopped growing at 512. It must stop growing there: never past what it runs."""
    curve = h200_curve()
    c = ConcurrencyController.auto(None)
    limits = drive(c, curve, 40, noise=0.02, capacity=1024 if metrics else None)
    assert max(limits) <= 1024, limits
    assert "stopped growing" in " ".join(str(x) for x in limits) or c.phase in ("probe", "hold")
    assert curve(c.best_limit) >= 0.95 * best_of(curve, 1024), (c.best_limit, c.history)
    assert limits.index(512) <= 3  # 32 -> 64 -> 256 -> 512: x4 while it grows in proportion


@pytest.mark.parametrize("seed", range(6))
def test_from_capacity_it_sees_through_the_waves_of_uniform_work(seed: int) -> None:
    """The H200 --fleet run: from 1127 (1024 + 10 %) it tried 847, read the transient after lowering
    the limit as -17 %, went back, then tried 1499, above max running. With windows that swing
    +-12 % and a first window 20 % low after each change it must still find the better region below
    max running and never climb above max running + the queue that keeps it full."""
    curve = h200_curve()
    c = ConcurrencyController.auto(1024)
    limits = drive_waves(c, curve, 60, swing=0.12, transient=0.2, seed=seed)
    assert max(limits) <= 1024 + headroom(1024), limits
    assert curve(c.best_limit) >= 0.95 * best_of(curve, 1024), (c.best_limit, c.history)


def test_from_capacity_the_ceiling_is_max_running_plus_headroom_until_a_window_shows_more_pays() -> None:
    c = ConcurrencyController.auto(128)
    assert c.limit == c.ceiling == 128 + headroom(128) and c.room == room(128)
    c.observe(Window(1000.0))  # one window at the start: then half as many
    assert c.limit == 70 and c.window_factor() == 1.0
    assert c.settling()  # the dispatcher makes the dropped window short
    assert not c.observe(Window(500.0))  # the transient after lowering: dropped
    assert not c.settling()
    c.observe(Window(700.0))  # less in flight loses 30 %: throughput still grows at the ceiling
    assert c.limit == 141 and c.ceiling == room(128) and "room up to 192" in c.reason


def test_windows_that_swing_ask_for_longer_windows() -> None:
    c = ConcurrencyController.auto(None, bench_concurrency=128)
    c.observe(Window(1000.0))
    assert not c.observe(Window(1000.0))  # the transient after the first probe's raise: dropped
    c.observe(Window(700.0))  # a large loss: back to 128, where the windows then swing
    assert c.limit == 128
    assert not c.observe(Window(800.0))  # the transient of going back
    c.observe(Window(1200.0))
    c.observe(Window(1200.0))
    assert c.noisy() and c.window_factor() == 2.0


def quarter_peak_curve() -> Curve:
    """The issue-25 H200 run (vLLM 0.26, --max-num-seqs 1024): 25.2k / 23.9k / 18.4k tok/s at 256 / 512 / 1024,
    the best at a quarter of max running: the sim's realistic timing with --peak-batch 256, 0.95 at twice it."""
    model = SimConfig(
        timing="realistic",
        max_running=1024,
        decode_ms=2.04,
        decode_ms_per_running=0.0282,
        peak_batch=256,
        decline_at_2x_peak=0.95,
    ).steps
    return lambda n: model.decode_tokens_per_s(min(n, 1024))


@pytest.mark.parametrize("seed", range(4))
def test_from_capacity_a_peak_at_a_quarter_of_max_running_is_reached_in_a_few_windows(seed: int) -> None:
    """The H200 --fleet run started at 1127 and made its first (small) step down only at 68 s: one window at the
    start, then halving while it pays, each comparison after the transient of lowering: 1127 -> 564 -> 282."""
    curve = quarter_peak_curve()
    assert curve(256) > 1.2 * curve(1024)  # the shape: the peak far below max running
    c = ConcurrencyController.auto(1024)
    limits = drive_waves(c, curve, 8, swing=0.03, transient=0.2, seed=seed)
    assert limits[0] == 564, limits  # one window at 1127, then half as many
    assert limits[-1] <= 1024 // 3, limits  # within 8 windows (two of them transients), at about a quarter
    drive_waves(c, curve, 40, swing=0.03, transient=0.2, seed=seed)
    assert curve(c.best_limit) >= 0.95 * best_of(curve, 1024), (c.best_limit, c.history)


def test_from_capacity_on_a_server_that_peaks_at_max_running_halving_costs_one_step() -> None:
    """Variable work on the H200 peaked near max running: the first halving loses, and the limit goes back up."""
    c = ConcurrencyController.auto(1024)
    limits = drive_waves(c, plateau(1024, 24_000.0), 12, swing=0.0, transient=0.2, seed=0)
    assert min(limits) == 564 and limits[-1] >= 1024, limits


def test_a_ramp_window_shorter_than_two_lifetimes_is_not_growth() -> None:
    """The H200 --url run doubled 256 -> 512 -> 1024 on 2-s windows that showed +15 % from 256 to 512 (the wave
    right after a raise); the bench's 25-s points said 256 was better. A window under two request lifetimes is
    not judged; the first long one that does not grow ends the ramp at the better of the last two limits."""
    c = ConcurrencyController.auto(None)
    c.limit = c.best_limit = 256
    c.observe(Window(25_000.0, queued=0, running=256, lifetimes=2.5))
    assert c.limit == 512  # x2: the first step (nothing yet to be in proportion to)
    assert not c.observe(Window(30_000.0, queued=0, running=512, lifetimes=0.8))  # the wave right after the raise
    assert c.limit == 512 and c.phase == "ramp"
    assert c.observe(Window(23_900.0, queued=0, running=512, lifetimes=2.2))  # one long window that did not grow
    assert c.limit == 256 and c.phase == "probe" and c.ceiling == 512 and "stopped growing at 512" in c.reason


def test_the_dispatcher_sizes_windows_in_recent_lifetimes_and_keeps_a_dropped_one_short() -> None:
    """Ramp windows: two lifetimes of the recent answers (10 s answers after 1 s ones: 20 s, not the job mean's 5.5 s);
    the first window at the capacity start and the one after lowering (dropped) are one lifetime; the next, two."""
    from servefleet.generate.dispatch import _Server
    from servefleet.generate.endpoints import Target
    from servefleet.generate.health import HealthPolicy

    s = _Server(Target("a", "http://127.0.0.1:1"), ConcurrencyController.auto(None), HealthPolicy())
    s.load.available = True
    for latency in [1.0] * 100 + [10.0] * 100:
        s.stats.requests += 1
        s.stats.add_latency(latency)
    assert s.window_s(2.0) == pytest.approx(20.0, rel=0.02)
    assert s.measure(now=s.window_start + 5.0, span=5.0).lifetimes == pytest.approx(0.5, rel=0.02)
    s.controller = ConcurrencyController.auto(1024)
    assert s.window_s(2.0) == pytest.approx(10.0, rel=0.02)  # the first window at max running: one lifetime
    s.controller.observe(Window(20_000.0))  # 1127 -> 564
    assert s.controller.settling() and s.window_s(2.0) == pytest.approx(10.0, rel=0.02)
    s.controller.observe(Window(15_000.0))  # the transient: dropped
    assert not s.controller.settling() and s.window_s(2.0) == pytest.approx(20.0, rel=0.02)


def test_the_dispatcher_measures_one_lifetime_in_the_ramp_when_answers_end_apart() -> None:
    """A dataset's answers (latencies 1-7 s) end apart: the ramp's window is one recent lifetime, and the window says
    so to the controller. Answers alike (uniform work's waves) keep two."""
    from servefleet.generate.dispatch import _Server
    from servefleet.generate.endpoints import Target
    from servefleet.generate.health import HealthPolicy

    s = _Server(Target("a", "http://127.0.0.1:1"), ConcurrencyController.auto(None), HealthPolicy())
    s.load.available = True
    for _ in range(200):
        s.stats.requests += 1
        s.stats.add_latency(4.0)
    assert s.window_s(2.0) == pytest.approx(8.0) and not s.measure(s.window_start + 1, 1.0).spread
    for i in range(200):
        s.stats.requests += 1
        s.stats.add_latency(1.0 + 6.0 * ((i * 37) % 64) / 63)  # 1-7 s, every 64 answers the same mix
    lifetime = s.stats.lifetime_s()
    assert s.window_s(2.0) == pytest.approx(lifetime) and s.measure(s.window_start + 1, 1.0).spread


def test_the_capacity_start_begins_at_the_largest_cuda_graph_batch_when_it_is_below_max_running() -> None:
    """vLLM on the H200: max running 1024, graphs up to 512; 1127 (max running + 10 %) and 564 both ran eager steps."""
    c = ConcurrencyController.auto(1024, graph_batch=512)
    assert (c.limit, c.source) == (512, "capacity") and "CUDA graph" in c.reason
    assert (
        ConcurrencyController.auto(256, graph_batch=512).limit == ConcurrencyController.auto(256).limit
    )  # graphs cover it all
    assert ConcurrencyController.auto(None, graph_batch=512).phase == "ramp"  # no max running: the ramp as before


def test_a_fleet_servers_target_carries_its_graph_batch() -> None:
    from types import SimpleNamespace

    from servefleet.capacity import Capacity
    from servefleet.generate.endpoints import from_endpoint

    ep = SimpleNamespace(
        name="a",
        base_url="http://127.0.0.1:1",
        served_model="m",
        capacity=Capacity(max_running_requests=1024, graph_batch_max=512),
    )
    assert from_endpoint(ep).graph_batch == 512


def noisy_at_256(low: float = 32_382.0, high: float = 37_500.0) -> ConcurrencyController:
    """The issue-25 H200 run (uniform work, --max-num-seqs 1024, graphs up to 512): 512 gave 32,618 tok/s, 256 two
    windows that swing (``low`` then ``high``: 34,941 in the mean, +7.1 %), then it tried 128. Returned with the
    limit at 128, its first window (the transient of lowering) not yet seen."""
    c = ConcurrencyController.auto(1024, graph_batch=512)
    c.observe(Window(32_618.0))  # one window at the start: then half as many
    assert c.limit == 256
    assert not c.observe(Window(25_000.0))  # the transient after lowering: dropped
    c.observe(Window(low))
    c.observe(Window(high))
    assert c.limit == 128 and c.best_limit == 256 and c.noisy() and c.window_factor() == 2.0
    return c


def windows_at(c: ConcurrencyController, limit: int) -> int:
    return sum(1 for n, _ in c.history if n == limit)


def test_with_waves_a_loss_far_beyond_their_swing_is_decided_by_one_window() -> None:
    """The H200 run spent 63.7 s (60 % of its 106-s job) at 128, three doubled windows, though its first judged
    window already read -32 %: the windows at 256 spread by 15 %, so -32 % is no wave."""
    c = noisy_at_256()
    assert c.spread() == pytest.approx(0.146, abs=0.002)
    assert not c.observe(Window(18_000.0))  # the transient of lowering: dropped
    assert c.observe(Window(23_623.0))  # the first judged window: -32.4 %
    assert c.limit == c.best_limit == 256 and windows_at(c, 128) == 2
    assert "128 gives 23,623 tok/s (-32.4% vs 256): back to 256" in c.reason


@pytest.mark.parametrize(
    ("low", "high", "loss"),
    [
        (32_382.0, 37_500.0, 0.10),  # spread 15 %: -10 % is a small difference inside the swing
        (30_882.0, 39_000.0, 0.20),  # spread 23 %: -20 % is large but still inside the swing
    ],
)
def test_with_waves_a_loss_inside_their_swing_still_takes_confirming_windows(
    low: float, high: float, loss: float
) -> None:
    c = noisy_at_256(low, high)
    assert c.spread() > loss
    assert not c.observe(Window(18_000.0))  # the transient: dropped
    tps = c.best_tps() * (1 - loss)
    assert not c.observe(Window(tps))  # one window inside the swing decides nothing
    assert c.limit == 128 and c.best_limit == 256
    changed = [c.observe(Window(tps)) for _ in range(CONFIRM)]
    assert changed == [False] * (CONFIRM - 1) + [True] and c.limit == 256  # CONFIRM + 1 windows: a loss
    assert windows_at(c, 128) == CONFIRM + 2


def test_with_waves_a_gain_far_beyond_their_swing_is_kept_after_one_window() -> None:
    c = noisy_at_256()
    c.observe(Window(18_000.0))  # transient at 128
    for _ in range(CONFIRM + 1):  # -32 %: back to 256 (however many windows that takes; the test above counts them)
        if c.observe(Window(23_623.0)):
            break
    assert c.limit == 256
    assert not c.observe(Window(30_000.0))  # the transient of going back: dropped
    c.observe(Window(34_941.0))  # at the best again (its windows still swing): try above
    up = c.limit
    assert up > 256 and c.noisy()
    assert not c.observe(Window(30_000.0))  # the transient of a change with waves: dropped
    assert c.observe(Window(c.best_tps() * 1.3))  # +30 %, twice the swing: kept, and the next step tried
    assert c.best_limit == up and c.limit > up and windows_at(c, up) == 2
    assert f"{up} gives" in c.reason and "+30.0% vs 256" in c.reason


def test_a_step_far_below_the_best_is_judged_one_lifetime_in() -> None:
    """The H100 run (vLLM 0.26, --max-num-seqs 1024, graphs up to 512): from the bench's 512 the step to 589 ran
    eager steps at 25-30k tok/s against ~43k for all of its 12-s window. Cut one lifetime in, it is decided there."""
    c = ConcurrencyController.auto(1024, bench_concurrency=512, graph_batch=512)
    c.observe(Window(43_492.0))
    assert c.limit == 589 and c.best_limit == 512
    assert not c.clearly_worse(Window(36_000.0))  # -17 %: a whole window decides that
    assert not c.clearly_worse(Window(28_000.0, saturated=False))  # the limit not kept in flight: teaches nothing
    cut = Window(28_387.0, lifetimes=1.1, cut=True)
    assert c.clearly_worse(cut)
    assert c.observe(cut) and c.limit == 512
    assert "in its first 1.1 request lifetimes" in c.reason and "-34.7%" in c.reason


def test_nothing_on_trial_or_a_swing_that_wide_is_not_cut_short() -> None:
    c = ConcurrencyController.auto(1024, bench_concurrency=512)
    assert not c.clearly_worse(Window(1_000.0))  # at the best: nothing on trial
    c.observe(Window(40_000.0))  # at 512: then 589
    c.observe(Window(36_000.0))
    c.observe(Window(36_000.0))  # at 589: -10 % over two windows, a loss
    assert c.limit == c.best_limit == 512 and c.settling()  # back at the best: the transient, dropped
    assert not c.clearly_worse(Window(1_000.0))
    # waves: windows at the best that swing by 16 % make -30 % a swing, not a cliff (twice the swing is the bar)
    w = noisy_at_256(low=32_000.0, high=37_500.0)
    assert w.limit == 128 and w.settling()
    w.observe(Window(20_000.0))  # the transient after lowering: dropped
    assert not w.clearly_worse(Window(24_000.0)) and w.clearly_worse(Window(21_000.0))


def test_the_dispatcher_cuts_a_probe_short_on_the_servers_own_counter() -> None:
    """One lifetime (and a few scrapes) into the step, the server's counter already reads a third lower: the window
    ends there; before that, or without the server's counter, it runs its length."""
    from servefleet.generate.dispatch import _Server
    from servefleet.generate.endpoints import Target
    from servefleet.generate.health import HealthPolicy
    from servefleet.generate.server_load import LoadSample

    s = _Server(
        Target("a", "http://127.0.0.1:1"), ConcurrencyController.auto(1024, bench_concurrency=512), HealthPolicy()
    )
    for _ in range(50):
        s.stats.requests += 1
        s.stats.add_latency(3.0)
    s.controller.observe(Window(43_000.0))  # 512 -> 589
    t0 = s.window_start
    s.load.samples.extend(LoadSample(t0 + 0.5 * i, 28_000.0 * 0.5 * i, None, None, 589.0, 0.0) for i in range(9))
    s.ticks = s.saturated_ticks = 8
    assert s.window_s(2.0) > 3.0
    assert s.cut_short(t0 + 2.5, 2.5, 2.0) is None  # under one lifetime (3 s)
    s.load.available = True
    cut = s.cut_short(t0 + 4.0, 4.0, 2.0)
    assert cut is not None and cut.cut and cut.tps == pytest.approx(28_000.0)
    assert cut.lifetimes == pytest.approx(4.0 / 3.0)
    s.load.available = False  # our own answers come in lumps: never cut on them
    assert s.cut_short(t0 + 4.0, 4.0, 2.0) is None


def log_linear(points: list[tuple[int, float]]) -> Curve:
    """A curve through measured (concurrency, tok/s) points: proportional below the first, log-linear between, flat
    past the last."""

    def f(n: int) -> float:
        if n <= points[0][0]:
            return points[0][1] * n / points[0][0]
        for (a, ta), (b, tb) in zip(points, points[1:], strict=False):
            if n <= b:
                return ta + (tb - ta) * math.log(n / a) / math.log(b / a)
        return points[-1][1]

    return f


def h100_variable_curve() -> Curve:
    """vLLM 0.26 on an H100 (2026-12-06), variable work (max_tokens 64-768): the --url job's windows read 12.5k / 17.0k /
    21.0k / 23.0k tok/s at 32 / 64 / 128 / 256 and the fixed job 24.9k at 512 (--max-num-seqs 1024); past 512 assumed to
    decline (the KV cache was 59 % full at 512). Log-linear between the points."""
    return log_linear(
        [(32, 12_500.0), (64, 17_000.0), (128, 21_000.0), (256, 23_000.0), (512, 24_900.0), (1024, 21_000.0)]
    )


@pytest.mark.parametrize("seed", range(4))
def test_a_ramp_that_still_grows_below_its_step_tries_one_more_doubling(seed: int) -> None:
    """The H100 --url job on variable work: 128 -> 256 grew 7 % (under GROW) with the server's queue empty; the ramp
    stopped there with 256 as its ceiling, and the job ran 0.83 of a fixed 512. Growth that is still there (beyond
    MARGIN) is evidence the knee is above: one more doubling, judged as a step on trial, and never past it."""
    curve = h100_variable_curve()
    c = ConcurrencyController.auto(None)
    limits = drive(c, curve, 30, noise=0.01, seed=seed, capacity=1024)
    assert 512 in limits and max(limits) <= 512, limits
    assert curve(c.best_limit) >= 0.97 * best_of(curve, 1024), (c.best_limit, c.history)


def test_a_doubling_that_loses_goes_back_and_tries_between() -> None:
    """When the doubling after the ramp loses, the knee is between the best and it: the next step is up, not down
    (the ramp measured below already)."""
    c = ConcurrencyController.auto(None)
    c.limit = c.best_limit = 128
    c.observe(Window(20_000.0, queued=0, running=128, lifetimes=2.5))
    assert c.limit == 256
    assert c.observe(Window(21_500.0, queued=0, running=256, lifetimes=2.5))  # +7.5 %: still grows, under GROW
    assert c.limit == 512 and c.phase == "probe" and c.ceiling == 512 and "still grows at 256" in c.reason
    assert c.observe(Window(15_000.0, queued=0, running=512))  # -30 %: decided by one window
    assert c.limit == 256 and "back to 256" in c.reason
    assert not c.observe(Window(19_000.0))  # the transient of going back: dropped
    c.observe(Window(21_500.0))
    assert c.limit == 340 and "above the best so far, 256" in c.reason


def h100_variable_curve_second() -> Curve:
    """The same job on another H100 (2026-12-06, a host that gave ~30 % less): the --url ramp read 9.3k at 32 and
    10.2k at 64 (+9.9 %, under GROW), the doubling to 128 13.6k (+33.7 %); the fixed job held 18.0k at 512 and the
    bench read 17.4k at 256, 20.3k at 512. Log-linear between the points, past 512 assumed to decline."""
    return log_linear(
        [(32, 9_300.0), (64, 10_200.0), (128, 13_600.0), (256, 17_400.0), (512, 19_500.0), (1024, 16_000.0)]
    )


@pytest.mark.parametrize("seed", range(4))
def test_a_doubling_that_wins_a_ramp_step_resumes_the_ramp(seed: int) -> None:
    """The second H100 --url job on variable work: the doubling after the ramp won +33.7 % at 128, and the search
    then stayed under it (96, 110, 118, 119: held 128, 0.66 of a fixed 512). A win that large says the ramp stopped
    too soon: it goes on doubling from there."""
    curve = h100_variable_curve_second()
    c = ConcurrencyController.auto(None)
    limits = drive(c, curve, 30, noise=0.01, seed=seed, capacity=1024)
    assert limits[:3] == [64, 128, 256], limits  # the ramp, the doubling on trial, the ramp again
    assert curve(c.best_limit) >= 0.97 * best_of(curve, 1024), (c.best_limit, c.history)


def test_a_doubling_that_wins_by_less_than_a_ramp_step_ends_the_search_there() -> None:
    """Past a doubling that grew 7-9 % the H100 lost (681: -11 % to -33 %): a small win is the ceiling, and the
    closer steps go below it."""
    c = ConcurrencyController.auto(None)
    c.limit = c.best_limit = 128
    c.observe(Window(20_000.0, queued=0, running=128, lifetimes=2.5))
    assert c.limit == 256
    assert c.observe(Window(21_500.0, queued=0, running=256, lifetimes=2.5))  # +7.5 %: the doubling to 512 on trial
    assert c.limit == 512 and c.phase == "probe"
    assert not c.observe(Window(23_500.0, queued=0, running=512))  # +9.3 %: not decided by one window
    assert c.observe(Window(23_300.0, queued=0, running=512))
    assert c.phase == "probe" and c.ceiling == 512 and c.best_limit == 512 and c.limit < 512


def h100_variable_curve_fourth() -> Curve:
    """The same job on a third H100 (2026-12-06, fourth lease): the --url ramp read ~11.4k / 14.5k / 20k / 23k / 28k /
    29.4k tok/s at 32 / 64 / 128 / 256 / 512 / 1024 with the server's queue empty (--max-num-seqs 1024)."""
    return log_linear(
        [(32, 11_400.0), (64, 14_500.0), (128, 20_000.0), (256, 23_000.0), (512, 28_000.0), (1024, 29_400.0)]
    )


@pytest.mark.parametrize("seed", range(4))
def test_a_step_on_trial_past_the_servers_slots_goes_back_to_them_at_once(seed: int) -> None:
    """That ramp grew +5 % from 512 to 1024 (under GROW), so the doubling to 2048 went on trial: vLLM ran 1024 and
    queued the rest, the trial read the same tokens/s as 1024 (equal going up is kept) and 2048 stayed. The server's
    gauges say it runs 1024: the first window there moves the limit to 1024 plus headroom, and nothing above."""
    curve = h100_variable_curve_fourth()
    c = ConcurrencyController.auto(None)
    limits = drive(c, curve, 6, noise=0.01, seed=seed, capacity=1024)
    assert limits[:5] == [64, 128, 256, 512, 1024] and limits[5] == 2048, limits  # the doubling on trial
    assert drive(c, curve, 1, capacity=1024) == [1024 + headroom(1024)]
    assert "server full at 1024 running" in c.reason and "2048 only waits in its queue" in c.reason
    limits = drive(c, curve, 30, noise=0.01, seed=seed, capacity=1024)
    assert max(limits) <= 1024 + headroom(1024), limits
    assert curve(min(c.best_limit, 1024)) >= 0.97 * best_of(curve, 1024), (c.best_limit, c.history)


def test_a_step_on_trial_past_the_servers_slots_is_cut_short_on_its_gauges() -> None:
    """One lifetime in, the window's gauges already say the server runs fewer than we send: judged there, not after a
    window of lifetimes lengthened by the queue. A queue under the headroom is the batch kept full: not cut."""
    c = ConcurrencyController.auto(None)
    c.limit = c.best_limit = 512
    c.observe(Window(28_000.0, queued=0, running=512, lifetimes=2.5))
    c.observe(Window(29_400.0, queued=0, running=1024, lifetimes=2.5))  # +5 %: 2048 on trial
    assert c.limit == 2048 and c.phase == "probe"

    def cut(queued: float, running: float) -> Window | None:
        return c.cut_short(8.0, 6.0, 2.0, lambda: 5, True, lambda: Window(29_300.0, queued=queued, running=running))

    assert cut(0.0, 2048) is None  # all of it runs
    assert cut(1024.0, 1024) is not None and cut(1024.0, 1024).cut  # type: ignore[union-attr]
    assert c.cut_short(8.0, 6.0, 2.0, lambda: 5, False, lambda: Window(29_300.0, queued=1024, running=1024)) is None
    assert c.observe(Window(29_300.0, queued=1024, running=1024, cut=True)) and c.limit == 1024 + headroom(1024)
    # from a bench point at the slots: the step above it is the slots plus headroom (more pays only on evidence)
    b = ConcurrencyController.auto(1024, bench_concurrency=1024)
    b.observe(Window(30_000.0))
    assert b.limit == 1178 and b.ceiling == room(1024)
    assert b.observe(Window(30_000.0, queued=154, running=1024)) and b.limit == 1024 + headroom(1024) == b.ceiling
    assert b._over_slots(Window(30_000.0, queued=50, running=1024)) is None  # inside the headroom: the batch kept full
    # a bench point above the slots stays the best: the ceiling never goes below it
    q = ConcurrencyController.auto(None, bench_concurrency=192)  # --url: the bench's point, slots unknown
    q.observe(Window(5_000.0))
    assert q.limit > 192
    q.observe(Window(5_000.0, queued=80, running=128))
    assert q.limit == q.best_limit == 192 and q.ceiling == 192


def test_a_step_on_trial_trimmed_to_the_servers_slots_keeps_its_windows_and_is_judged() -> None:
    """The eleventh H100 lease's variable --url job: 512 read 24,357 tok/s (+14 % over the step before, under GROW),
    so 1024 went on trial. vLLM ran 929, then 918, then 910 (long answers filling its KV cache), each window a new bound
    (the slots plus headroom: 1022, 1010, 1001), and each restarted the trial: 200 of the job's 218 s on trial, never
    judged. The server runs the same full batch at the trimmed limit, so the windows measured above it still count."""
    c = ConcurrencyController.auto(None)
    c.limit = c.best_limit = 256
    c.observe(Window(21_400.0, queued=0, running=256, lifetimes=2.5))
    assert c.limit == 512
    assert c.observe(Window(24_357.0, queued=0, running=512, lifetimes=2.5))
    assert c.limit == 1024  # the doubling on trial
    assert c.observe(Window(23_100.0, queued=95, running=929, lifetimes=1.1, cut=True))
    assert c.limit == 929 + headroom(929) and c.phase == "probe"
    assert "server full at 929 running" in c.reason and "1024 only waits in its queue" in c.reason
    assert c.observe(Window(23_500.0, queued=104, running=918, lifetimes=1.1, cut=True))  # judged: -4.3 %
    assert c.limit == c.best_limit == 512 and "back to 512" in c.reason, c.reason


@pytest.mark.parametrize("seed", range(3))
def test_where_a_queue_was_shown_to_pay_a_step_into_it_is_not_cut(seed: int) -> None:
    """vLLM-CPU again, with its gauges: 128 running, the rest waiting, and throughput still growing up to 192 in flight
    (the API process refills the batch late). Once a window has shown that the queue pays, the steps into it (up to
    half as much again) are judged on their tokens/s, not ended for the queue they make."""
    rng = random.Random(seed)
    curve = plateau(192)
    c = ConcurrencyController.auto(128)
    for _ in range(40):
        n = c.limit
        c.observe(Window(curve(n) * (1 + rng.uniform(-0.02, 0.02)), queued=max(0, n - 128), running=min(n, 128)))
    assert 180 <= c.best_limit <= room(128), c.history


def test_answers_that_end_apart_ramp_x4_on_one_lifetime_windows() -> None:
    """The fourth lease's variable --url job took 25.5 s to 90 % of its steady rate: x2 steps (25-40 % growth a
    doubling is not in proportion) on windows of two lifetimes, four of them from 32 to 512. A dataset's answers end
    apart: no waves, so one lifetime is window enough and any growth is x4, the first window's too: 512 in two
    judged windows. The same windows of uniform work (answers alike) keep the wave rules."""
    curve = h100_variable_curve_fourth()
    c = ConcurrencyController.auto(None)

    def window(lifetimes: float = 1.1, spread: bool = True) -> bool:
        n = c.limit
        return c.observe(
            Window(
                curve(min(n, 1024)), queued=max(0, n - 1024), running=min(n, 1024), lifetimes=lifetimes, spread=spread
            )
        )

    assert window() and c.limit == 128 and "x4" in c.reason
    assert window() and c.limit == 512
    assert curve(512) >= 0.9 * best_of(curve, 1024)
    assert not window(lifetimes=0.8)  # under one lifetime: still the new requests' prefill
    assert window() and c.limit == 2048  # +40 %: x4 again; the server's queue then says where its slots end
    assert not window() and c.limit == 2048  # one window of queue may be admission
    assert window() and c.limit == 1024 + headroom(1024) and "full at 1024 running" in c.reason
    for _ in range(30):
        window(lifetimes=2.5)
    assert max(limit for limit, _ in c.history[7:]) <= 1024 + headroom(1024)
    assert curve(min(c.best_limit, 1024)) >= 0.97 * best_of(curve, 1024), (c.best_limit, c.history)

    u = ConcurrencyController.auto(None)  # uniform work: the same windows
    assert (
        u.observe(Window(curve(32), queued=0, running=32, lifetimes=1.1)) and u.limit == 64
    )  # x2: nothing to compare
    assert not u.observe(Window(curve(64), queued=0, running=64, lifetimes=1.1))  # one lifetime: the wave, not judged
    assert u.observe(Window(curve(64), queued=0, running=64, lifetimes=2.1)) and u.limit == 128  # +27 %: x2


@pytest.mark.parametrize("seed", range(4))
def test_a_peak_at_the_start_costs_one_window_of_answers_that_end_apart(seed: int) -> None:
    """The blind x4 from 32 on a server that peaks at 32 (the sim's): 128 reads below 32, the ramp ends there and
    the search settles at the peak. What the x4 costs is one window of one lifetime."""
    curve = peaked(32, decline=0.004)
    c = ConcurrencyController.auto(None)
    rng = random.Random(seed)
    judged = []
    for _ in range(30):
        n = c.limit
        judged.append(n)
        c.observe(Window(curve(n) * (1 + rng.uniform(-0.02, 0.02)), queued=0, running=n, lifetimes=1.1, spread=True))
    assert judged[:2] == [32, 128] and judged[2] == 32, judged
    assert judged.count(128) == 1
    assert curve(c.best_limit) >= 0.95 * best_of(curve, 128), c.history


@pytest.mark.parametrize("seed", range(3))
def test_slots_learned_in_the_ramp_open_to_a_queue_that_pays(seed: int) -> None:
    """vLLM-CPU through --url: the ramp finds 128 running and the rest queued, and throughput still grows up to 192
    in flight (its API process refills the batch late). The ceiling from the ramp is the slots plus headroom, as
    from the capacity figure, and a step down that loses there opens the room above."""
    rng = random.Random(seed)
    curve = plateau(192)
    c = ConcurrencyController.auto(None)
    for _ in range(40):
        n = c.limit
        c.observe(Window(curve(n) * (1 + rng.uniform(-0.02, 0.02)), queued=max(0, n - 128), running=min(n, 128)))
    assert 180 <= c.best_limit <= room(128), c.history


def test_a_ramp_step_past_the_servers_slots_ends_on_its_gauges_not_after_lifetimes_of_queue() -> None:
    """The fifth H100 lease: x4 from 512 to 2048, vLLM ran 870-1024 and queued the rest, and the ramp waited two
    windows of one lifetime each (40 s with the queue) before learning the slots: 87 s at 2048. A queue that never
    empties over a window while we send more than the server runs plus headroom ends the window after the minimum;
    two such windows (the first may be the burst being admitted) and the limit is the slots plus headroom."""
    c = ConcurrencyController.auto(None)
    c.limit = c.best_limit = 512
    c.observe(Window(28_000.0, queued=0, running=512, lifetimes=1.2, spread=True))
    assert c.limit == 2048 and c.phase == "ramp"

    def cut(span: float, queued: float, running: float, own: bool = True, scrapes: int = 4) -> Window | None:
        return c.cut_short(
            span,
            40.0,
            2.0,
            lambda: scrapes,
            own,
            lambda: Window(29_000.0, queued=queued, running=running, spread=True),
        )

    assert cut(1.5, 1000, 1024) is None  # under the minimum
    assert cut(2.5, 1000, 1024, scrapes=2) is None  # too few scrapes
    assert cut(2.5, 1000, 1024, own=False) is None  # no gauges
    assert cut(2.5, 0, 2048) is None  # all of it runs
    assert cut(2.5, 0, 1024) is None  # not handed to the engine yet (vLLM-CPU's API process): not a queue
    first = cut(2.5, 142, 1024)
    assert first is not None and first.cut
    assert not c.observe(first) and c.limit == 2048  # one window of queue may be the burst being admitted
    second = cut(2.5, 1022, 1024)
    assert second is not None and c.observe(second)
    assert c.limit == c.ceiling == 1024 + headroom(1024) and "full at 1024 running" in c.reason
    # at the slots plus headroom a queue is the batch kept full: no cut
    r = ConcurrencyController.auto(None)
    r.limit = 1024 + headroom(1024)
    assert r.cut_short(2.5, 40.0, 2.0, lambda: 4, True, lambda: Window(29_000.0, queued=100, running=1024)) is None


def test_the_dispatcher_cuts_a_ramp_window_on_the_servers_queue() -> None:
    """The dispatcher's side: in the ramp, with the server's gauges scraped, a window at 2048 whose queue stayed full
    ends after the minimum window, long before one lifetime of 40 s."""
    from servefleet.generate.dispatch import _Server
    from servefleet.generate.endpoints import Target
    from servefleet.generate.health import HealthPolicy
    from servefleet.generate.server_load import LoadSample

    s = _Server(Target("a", "http://127.0.0.1:1"), ConcurrencyController.auto(None), HealthPolicy())
    s.load.available = True
    for _ in range(64):
        s.stats.requests += 1
        s.stats.add_latency(40.0)
    s.controller.limit = 2048
    t0 = s.window_start
    s.load.samples.extend(LoadSample(t0 + 0.5 * i, 28_000.0 * 0.5 * i, None, None, 1024.0, 1000.0) for i in range(7))
    s.ticks = s.saturated_ticks = 6
    assert s.window_s(2.0) == pytest.approx(80.0)  # answers alike: two lifetimes
    assert s.cut_short(t0 + 1.5, 1.5, 2.0) is None
    cut = s.cut_short(t0 + 3.0, 3.0, 2.0)
    assert cut is not None and cut.cut and cut.queued == 1000.0 and cut.running == 1024.0


def test_the_dispatcher_cuts_a_ramp_window_on_the_queue_now_not_on_the_raises_first_scrapes() -> None:
    """The ninth H100 lease: x4 from 512 to 2048, and the window began (0.5 s after the raise) with two scrapes of no
    queue while the new requests were on their way; then vLLM ran ~940 and queued ~1,100. The fewest waiting over the
    window stayed 0, so the window was never cut and ran its lifetime: 50 s at 2048. The cut reads the last scrapes."""
    from servefleet.generate.dispatch import _Server
    from servefleet.generate.endpoints import Target
    from servefleet.generate.health import HealthPolicy
    from servefleet.generate.server_load import LATELY, LoadSample

    s = _Server(Target("a", "http://127.0.0.1:1"), ConcurrencyController.auto(None), HealthPolicy())
    s.load.available = True
    for _ in range(64):
        s.stats.requests += 1
        s.stats.add_latency(30.0)
        s.stats.add_latency(50.0)  # answers that end apart: ramp windows of one lifetime
    s.controller.limit, s.controller.best_limit = 2048, 512
    t0 = s.window_start
    gauges = [(511.0, 0.0), (507.0, 0.0), (945.0, 362.0), (1023.0, 555.0), (1021.0, 1021.0), (1003.0, 1042.0)]
    s.load.samples.extend(
        LoadSample(t0 + 0.5 * i, 25_000.0 * 0.5 * i, None, None, running, waiting)
        for i, (running, waiting) in enumerate(gauges)
    )
    s.ticks = s.saturated_ticks = 6
    assert s.window_s(2.0) > 30.0
    whole = s.measure(t0 + 2.5, 2.5)
    assert whole.queued == 0.0 and whole.queued_lately == min(w for _, w in gauges[-LATELY:])
    cut = s.cut_short(t0 + 2.5, 2.5, 2.0)
    assert cut is not None and cut.cut and cut.queued == 555.0 and cut.running == 1023.0
    assert not s.controller.observe(cut) and s.controller.limit == 2048  # the first may be a burst being admitted
    s.window_start = t0 + 2.6
    s.load.samples.extend(LoadSample(t0 + 2.5 + 0.5 * i, 0.0, None, None, 940.0, 1100.0) for i in range(1, 6))
    second = s.cut_short(t0 + 5.0, 2.4, 2.0)
    assert second is not None and s.controller.observe(second)
    assert s.controller.limit == 940 + headroom(940) and "full at 940 running" in s.controller.reason
    # a queue that emptied in the last scrapes is room: no cut
    s.controller.limit, s.controller.phase, s.controller.best_limit = 2048, "ramp", 512
    s.window_start = t0 + 5.0
    s.load.samples.extend(
        LoadSample(t0 + 5.0 + 0.5 * i, 0.0, None, None, 1024.0, w) for i, w in [(1, 900.0), (2, 0.0)]
    )
    assert s.cut_short(t0 + 7.5, 2.5, 2.0) is None


def test_with_waves_from_a_high_first_wave_a_step_far_below_is_still_cut_one_lifetime_in() -> None:
    """The ninth H100 lease (uniform work, --fleet, max running 1024, graphs up to 512): the capacity start's first wave
    read 46,733 tok/s at 512 and a later window 35,085, a 28 % swing, so twice the swing asked for -57 % before a cut;
    681 read -40 % to -60 % and ran its whole window, 50 s of a 115-s job. A whole lifetime that far below is no wave:
    past EARLY_MAX the swing no longer raises the bar."""
    c = ConcurrencyController.auto(1024, graph_batch=512)
    c.observe(Window(46_733.0))  # the first wave: then half as many
    assert not c.observe(Window(20_000.0))  # the transient after lowering: dropped
    assert c.observe(Window(22_329.0, lifetimes=1.5, cut=True)) and c.limit == 512  # -52 %: back to 512
    assert not c.observe(Window(30_000.0))  # back at the best: dropped
    assert c.observe(Window(35_085.0)) and c.limit == 681
    assert 2 * c.spread() > EARLY_MAX and c.noisy()
    assert not c.observe(Window(26_000.0))  # the transient of the raise: dropped
    assert not c.clearly_worse(Window(25_500.0))  # -38 %: inside the bar, a whole window decides
    cut = c.cut_short(12.0, 9.0, 2.0, lambda: 9, True, lambda: Window(22_000.0))
    assert cut is not None and c.clearly_worse(cut)
    assert c.observe(cut) and c.limit == 512 and "-46.2% vs 512" in c.reason


def test_a_step_down_is_cut_short_too_and_the_best_limit_never() -> None:
    """cut_short ends a step below the best as well as above it when it reads far below; never the best itself."""
    c = ConcurrencyController.auto(1024)  # 1127, halving down
    c.observe(Window(30_000.0))
    assert c.limit < c.best_limit
    assert not c.observe(Window(20_000.0))  # the transient after lowering: dropped

    def cut(tps: float) -> Window | None:
        return c.cut_short(8.0, 6.0, 2.0, lambda: 5, True, lambda: Window(tps))

    assert cut(29_000.0) is None
    assert cut(15_000.0) is not None
    c.limit = c.best_limit
    assert cut(15_000.0) is None


def _at_best_after_the_ramp(left: float | None) -> ConcurrencyController:
    """The tenth H100 lease's uniform --url job: the ramp read 34,312 tok/s at 256 and 29,457 at 512, so it went back
    to 256; ``left``: the seconds the job has left, probe windows of 10 s where they do not swing."""
    c = ConcurrencyController.auto(None)
    c.job_left_s, c.probe_window_s = left, 10.0
    for tps in (8_000.0, 16_000.0, 34_312.0, 29_457.0):  # 32, x2 64, x4 256, x2 512: stopped growing
        c.observe(Window(tps))
    assert c.limit == c.best_limit == 256 and c.phase == "probe"
    assert not c.observe(Window(25_000.0))  # the transient after lowering: dropped
    return c


def test_a_step_around_the_best_is_taken_only_while_the_job_has_time_to_earn_it_back() -> None:
    """The tenth H100 lease (uniform work, 12,000 prompts, --url): 340 was on trial 64 s of the job's last 77 s (windows
    swinging: the transient, then three of 20 s) and lost 9.6 %; the job ran at 0.86 of a fixed 256. A step whose
    windows take more than TRIAL_SHARE of what is left is not taken: the best is held, and the reason says why."""
    short = _at_best_after_the_ramp(65.0)
    assert not short.observe(Window(31_000.0))  # the best's second window: swinging 10 %, so windows twice as long
    assert short.noisy() and short.step_cost_s() == pytest.approx((1 + CONFIRM + 1) * 2 * 10.0)
    assert short.limit == 256 and short.phase == "hold"
    assert "256 held (32,656 tok/s): a step around it would take ~80 s of the job's ~65 s left" in short.reason
    for left in (None, 4 * 80.0):  # a job of unknown size, or one with the time: the step is tried
        long = _at_best_after_the_ramp(left)
        assert long.observe(Window(31_000.0)) and long.limit == 340 and "trying 340" in long.reason


def test_the_coarse_search_steps_are_taken_however_little_of_the_job_is_left() -> None:
    """Halving from the capacity start, and the doubling after a ramp that still grew, can gain a factor: they are not
    held for the time left (the H200's best was a quarter of max running)."""
    c = ConcurrencyController.auto(1024, graph_batch=512)
    c.job_left_s, c.probe_window_s = 5.0, 10.0
    assert c.observe(Window(30_000.0)) and c.limit == 256
    s = ConcurrencyController.auto(None)
    s.job_left_s, s.probe_window_s = 5.0, 10.0
    for tps in (8_000.0, 16_000.0, 30_000.0, 31_500.0):  # +5 % from 256 to 512: the knee is above
        s.observe(Window(tps))
    assert s.limit == 1024 and "at most 1024" in s.reason


def test_the_dispatcher_gives_the_controller_the_time_the_job_has_left() -> None:
    """The dispatcher's side: before a window is judged, the controller learns the job's time left (at its rate so
    far) and what a probe window lasts; a job of unknown size sets no bound."""
    from servefleet.generate.dispatch import Dispatcher
    from servefleet.generate.endpoints import Target
    from servefleet.generate.server_load import LoadSample
    from servefleet.generate.stats import JobStats

    def judged(to_send: int) -> ConcurrencyController:
        stats = JobStats(to_send=to_send, done=3_000)
        d = Dispatcher([Target("a", "http://127.0.0.1:1")], client=None, out=None, on_failure=print, stats=stats)  # type: ignore[arg-type]
        (s,) = d.servers
        s.controller = _at_best_after_the_ramp(None)
        s.load.available = True
        for _ in range(64):
            s.stats.requests += 1
            s.stats.add_latency(3.0)
        t0 = s.window_start
        stats.started = t0 + 12.0 - 30.0  # 3,000 of 12,000 in 30 s: 90 s left
        s.load.samples.extend(LoadSample(t0 + 0.5 * i, 31_000.0 * 0.5 * i, None, None, 256.0, 0.0) for i in range(25))
        s.ticks = s.saturated_ticks = 100
        assert s.probe_window_s(2.0) == pytest.approx(10.0)  # 5 x the minimum window: longer than two lifetimes
        d._tick_window(s, t0 + 12.0)
        return s.controller

    held = judged(12_000)
    assert held.job_left_s == pytest.approx(90.0) and held.limit == 256 and held.phase == "hold"
    assert "~80 s of the job's ~90 s left" in held.reason
    unknown = judged(0)
    assert unknown.job_left_s is None and unknown.limit == 340
