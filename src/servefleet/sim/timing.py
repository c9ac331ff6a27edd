"""The cost of one batched step, in both timing modes (used by the scheduler and by :mod:`.theory`).

``knee`` (the old model): a step of ``B`` requests costs ``decode_ms + decode_ms_per_running * B``.
Throughput rises with the batch and flattens at ``max_running``: any controller that climbs looks
perfect on it.

``realistic`` (the default): the same two terms plus a super-linear one,

    step_ms(B) = decode_ms + decode_ms_per_running * B + u * (B / peak_batch) ** p

with ``u = decode_ms / (p - 1)`` so that throughput ``B / step_ms(B)`` peaks exactly at ``peak_batch``
(d/dB of B/step is zero there), and ``p`` chosen so that throughput at twice the peak batch is
``decline_at_2x_peak`` of the peak. Fitted to vLLM 0.26 on one H200 (0.44 B Llama, 256 in / 256 out,
non-streaming, ``--max-num-seqs 1024``; ``benchmarks/results/gpu/2026-12-01/solo``): 28.5k / 28.7k / 23.4k output
tok/s at 256 / 512 / 1024 running, a lone request at ~490 tok/s. Scaled: the defaults keep the H200's
shape (lone step / linear part at the peak ~0.14, peak at half of max running, 0.81 at twice the peak)
at a speed a 2-core test machine can drive (``decode_ms`` is the time scale).

Streaming costs the API process one event per step per request (several tokens per event with
speculative decoding); in realistic mode those events leave at most ``api_events_per_s`` a second
(default: 0.62 x the peak decode rate, the H200's 18-19k streaming vs ~30k non-streaming), so
streaming throughput flattens while the engine could go faster.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

__all__ = ["H200_VLLM", "StepModel", "step_model", "tokens_after", "STREAM_SHARE_OF_PEAK"]

# H200, vLLM 0.26: streaming flattened at ~18.5k tok/s while non-streaming decode peaked near 30k.
STREAM_SHARE_OF_PEAK = 0.62

# The fit at full scale (SimConfig fields): a lone request's step ~2 ms (486 tok/s streamed at C=1),
# 28 us per running request, peak at 512 of --max-num-seqs 1024, KV as the server reported it.
# Theory at 256 in / 256 out: 27.2k / 29.4k / 23.9k non-streaming at 256 / 512 / 1024, streaming 18.5k.
H200_VLLM: dict[str, float | int | str] = {
    "timing": "realistic",
    "decode_ms": 2.04,
    "decode_ms_per_running": 0.0282,
    "prefill_ms_per_1k_tokens": 0.5,
    "max_running": 1024,
    "kv_tokens": 672352,
}


def tokens_after(decode_steps: int, tokens_per_step: float) -> int:
    """Tokens a request has after ``decode_steps`` steps past its prefill step (not counting the prefill
    token). A fractional mean (2.5) alternates whole counts (2, 3, 2, 3, ...), so the sum stays exact."""
    return math.floor(decode_steps * tokens_per_step + 1e-9)


@dataclass(frozen=True)
class StepModel:
    """Step cost as a function of the batch; ``exponent`` is None in knee mode (no super-linear term)."""

    decode_ms: float
    per_running_ms: float
    peak_batch: int | None
    exponent: float | None
    api_events_per_s: float | None  # None: streaming events cost nothing (knee mode, instant)

    @property
    def superlinear_ms(self) -> float:
        if self.exponent is None:
            return 0.0
        return self.decode_ms / (self.exponent - 1.0)

    def step_ms(self, batch: int) -> float:
        """Milliseconds of one decode step with ``batch`` requests (prefill not included)."""
        ms = self.decode_ms + self.per_running_ms * batch
        if self.exponent is not None and self.peak_batch:
            ms += self.superlinear_ms * (batch / self.peak_batch) ** self.exponent
        return ms

    def decode_tokens_per_s(self, batch: int, tokens_per_step: float = 1.0) -> float:
        ms = self.step_ms(batch)
        return math.inf if ms <= 0 else batch * tokens_per_step * 1000.0 / ms


def _fit_exponent(decode_ms: float, linear_at_peak_ms: float, decline: float) -> float:
    """The ``p`` for which throughput at 2 x peak_batch is ``decline`` x the peak (bisection: the
    difference below is positive near p=1 and negative for large p)."""

    def gap(p: float) -> float:
        u = decode_ms / (p - 1.0)
        at_peak = decode_ms + linear_at_peak_ms + u
        at_twice = decode_ms + 2 * linear_at_peak_ms + u * 2.0**p
        return 2 * at_peak - decline * at_twice  # throughput ratio 2*at_peak/at_twice vs decline

    lo, hi = 1.0 + 1e-9, 64.0
    if gap(hi) > 0:
        return hi
    for _ in range(200):
        mid = (lo + hi) / 2
        if gap(mid) > 0:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


@lru_cache(maxsize=256)
def step_model(
    timing: str,
    decode_ms: float,
    per_running_ms: float,
    peak_batch: int,
    decline: float,
    api_events_per_s: float | None,
    instant: bool,
) -> StepModel:
    """The step model of one configuration (cached: the scheduler asks at every step)."""
    if timing == "knee" or instant:
        return StepModel(decode_ms, per_running_ms, None, None, None)
    exponent = _fit_exponent(decode_ms, per_running_ms * peak_batch, decline)
    partial = StepModel(decode_ms, per_running_ms, peak_batch, exponent, None)
    events = api_events_per_s
    if events is None:
        events = STREAM_SHARE_OF_PEAK * partial.decode_tokens_per_s(peak_batch)
    return StepModel(decode_ms, per_running_ms, peak_batch, exponent, events)
