"""The steady part of one bench point, and its output rate with ramp and drain left out.

A closed-loop point starts its users together: the first wave of answers is a synchronised batch
(every prefill at once) until the first ``concurrency`` answers are back -- the ramp. Once the last
request has gone out, the ones in flight finish at falling concurrency -- the drain. Tokens over
first start to last end mix both into the rate, more so the shorter the point. The window here runs from the ``concurrency``-th answer to the
last request's start (rate mode: from one median request lifetime in).

Client side, each answer's tokens are spread evenly over its lifetime and the window's share is
counted: exact in aggregate for a full window, whether the answer streamed or not. The server's
generated-tokens counter, sampled during the point, gives the same rate from the engine's side.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from servefleet.bench.result import SteadyWindow

__all__ = ["steady_window", "counter_rate", "MIN_LIFETIMES"]

MIN_LIFETIMES = 2.0  # a window shorter than this many median request lifetimes is not steady


def steady_window(spans: Sequence[tuple[float, float, int]], concurrency: int | None) -> SteadyWindow | None:
    """``spans``: (start, end, output tokens) of each successful answer, perf_counter seconds."""
    if not spans:
        return None
    starts = np.array([s for s, _, _ in spans], dtype=float)
    ends = np.array([e for _, e, _ in spans], dtype=float)
    tokens = np.array([n for _, _, n in spans], dtype=float)
    t0 = float(starts.min())
    life = ends - starts
    median_life = float(np.median(life))
    if concurrency and len(ends) > concurrency:
        ramp_end = float(np.sort(ends)[concurrency - 1])
    else:
        ramp_end = t0 + median_life
    drain_start = float(starts.max())
    if drain_start <= ramp_end:
        return SteadyWindow(
            start_s=ramp_end - t0,
            end_s=drain_start - t0,
            output_tokens=0.0,
            output_tokens_per_s=0.0,
            steady=False,
            reason="no steady part: the point ended its ramp after its last request "
            "started (give more requests or a longer --duration)",
        )
    overlap = np.clip(np.minimum(ends, drain_start) - np.maximum(starts, ramp_end), 0.0, None)
    share = np.divide(overlap, life, out=np.zeros_like(overlap), where=life > 0)
    in_window = float((tokens * share).sum())
    seconds = drain_start - ramp_end
    steady = seconds >= MIN_LIFETIMES * median_life
    reason = (
        None
        if steady
        else (
            f"steady part {seconds:.1f} s is under {MIN_LIFETIMES:g} request lifetimes "
            f"({median_life:.1f} s each): make the point longer"
        )
    )
    return SteadyWindow(
        start_s=ramp_end - t0,
        end_s=drain_start - t0,
        output_tokens=in_window,
        output_tokens_per_s=in_window / seconds,
        steady=steady,
        reason=reason,
    )


def counter_rate(samples: Sequence[tuple[float, float]], start: float, end: float) -> float | None:
    """Rate of a counter over [start, end] from (time, value) samples inside it (None: under two
    samples or under a second between them)."""
    inside = [(t, v) for t, v in samples if start <= t <= end]
    if len(inside) < 2:
        return None
    (ta, va), (tb, vb) = inside[0], inside[-1]
    if tb - ta < 1.0 or vb < va:
        return None
    return (vb - va) / (tb - ta)
