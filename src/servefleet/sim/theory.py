"""The sim's timing model, in closed form, so tests and benchmarks can say what to expect.

The scheduler (:mod:`servefleet.sim.scheduler`) runs one loop of batched steps, like a
continuous-batching engine:

* at each step boundary it admits waiting requests, FIFO, while ``running < max_running`` and the
  KV tokens reserved (``prompt + max_tokens`` per request) fit in ``kv_tokens``;
* a decode step of ``B`` requests costs ``step_ms(B)`` (:mod:`servefleet.sim.timing`): in ``knee``
  timing ``decode_ms + decode_ms_per_running * B``; in ``realistic`` timing (the default) that plus a
  super-linear term, so that throughput peaks at ``peak_batch`` and declines past it. The step that
  admits a request adds ``prefill_ms_per_1k_tokens * P / 1000`` for it (prefill mixed into the step,
  as in vLLM's chunked prefill);
* the step that admits a request yields its first token (prefill samples one token); every later
  step yields ``tokens_per_step`` tokens per request on average (> 1 models speculative decoding),
  one SSE chunk per step.

So a request of ``P`` prompt and ``N`` output tokens needs ``S = 1 + ceil((N - 1) / k)`` steps. With
``C`` clients each sending its next request as soon as the last one ends, the batch holds
``B = min(C, max_running, kv_tokens // (P + N))`` requests; while they run, ``B`` new prefills are
paid, so ``B`` requests complete every

    cycle_ms = S * step_ms(B) + B * prefill_ms_per_1k_tokens * P / 1000

and the non-streaming output throughput is ``B * N / cycle_ms * 1000`` tokens/s. In knee timing it
plateaus near ``k * 1000 / decode_ms_per_running`` and stops growing at ``max_running``; in realistic
timing it is highest at ``B = peak_batch`` (when the prefill share is small) and lower on both sides.

Streaming, realistic timing: the API process sends at most ``api_events_per_s`` events a second, one
per step per request, so streaming throughput is ``min(non-streaming, api_events_per_s * N / S)``:
flat, whatever the concurrency, once the events are the bottleneck (the H200's 18-19k tok/s against
28-34k without streaming). Near the crossing the measured curve is rounder than this minimum.

Client turnaround is ignored: a closed-loop client whose request ends while others run usually misses
one step before its next request is admitted (a queue beyond ``max_running`` hides this, and so does
an idle server), so measured throughput below saturation sits up to ``1/(S+1)`` under the formula.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from servefleet.sim.config import SimConfig

__all__ = [
    "SteadyState",
    "best_concurrency",
    "steady_state",
    "theoretical_output_tokens_per_s",
    "steps_per_request",
    "curve",
    "dry_run_report",
]


@dataclass(frozen=True)
class SteadyState:
    concurrency: int
    batch: int  # requests decoding at once
    steps: int  # steps one request takes
    step_ms: float  # decode step cost at that batch (without prefill)
    request_latency_s: float  # one request, end to end, queue wait included
    ttft_s: float  # time to first token: queue wait, then one step with its own prefill
    output_tokens_per_s: float  # whole server
    per_request_tokens_per_s: float  # decode speed of one request while it runs
    itl_ms: float = 0.0  # mean gap per token after the first, as a streaming client sees it


def steps_per_request(output_tokens: int, tokens_per_step: float) -> int:
    """Steps a request of ``output_tokens`` takes: one prefill step (1 token), then k per step (a mean)."""
    if output_tokens <= 0:
        return 0
    return 1 + math.ceil((output_tokens - 1) / tokens_per_step - 1e-9)


def steady_state(
    config: SimConfig, concurrency: int, *, prompt_tokens: int = 128, output_tokens: int = 128, stream: bool = False
) -> SteadyState:
    """The steady state of ``concurrency`` closed-loop clients sending requests of the given lengths,
    streamed or not (streaming differs only where the API process's events are the bottleneck)."""
    if concurrency < 1:
        raise ValueError("concurrency must be >= 1")
    if output_tokens < 1:
        raise ValueError("output_tokens must be >= 1")
    need = prompt_tokens + output_tokens
    kv_fit = config.kv_tokens // need if need > 0 else concurrency
    batch = max(1, min(concurrency, config.max_running, kv_fit))
    steps = steps_per_request(output_tokens, config.tokens_per_step)
    step_ms = config.steps.step_ms(batch)
    prefill_ms = config.prefill_ms_per_1k_tokens * prompt_tokens / 1000.0
    cycle_ms = steps * step_ms + batch * prefill_ms
    if cycle_ms <= 0:
        return SteadyState(concurrency, batch, steps, step_ms, 0.0, 0.0, math.inf, math.inf, 0.0)
    throughput = batch * output_tokens / cycle_ms * 1000.0
    queue_ms = max(0.0, concurrency / batch - 1.0) * cycle_ms  # closed loop: the rest wait their turn
    latency_ms = queue_ms + cycle_ms
    ttft_ms = queue_ms + step_ms + prefill_ms
    events = config.steps.api_events_per_s
    itl_ms = (latency_ms - ttft_ms) / max(output_tokens - 1, 1)
    if stream and events is not None and events * output_tokens / steps < throughput:
        # The API process is the bottleneck: the events of the batch's requests leave in turn, so one
        # request's events are ``batch / events`` apart; a closed loop of C clients then waits
        # ``C * S / events`` per request (Little's law), the rest of it before the first event.
        throughput = events * output_tokens / steps
        gap_ms = batch / events * 1000.0
        latency_ms = concurrency * steps / events * 1000.0
        ttft_ms = max(latency_ms - (steps - 1) * gap_ms, ttft_ms)
        itl_ms = (steps - 1) * gap_ms / max(output_tokens - 1, 1)
    return SteadyState(
        concurrency=concurrency,
        batch=batch,
        steps=steps,
        step_ms=step_ms,
        request_latency_s=latency_ms / 1000.0,
        ttft_s=ttft_ms / 1000.0,
        output_tokens_per_s=throughput,
        per_request_tokens_per_s=output_tokens / cycle_ms * 1000.0,
        itl_ms=itl_ms,
    )


def theoretical_output_tokens_per_s(
    config: SimConfig, concurrency: int, *, prompt_tokens: int = 128, output_tokens: int = 128, stream: bool = False
) -> float:
    """Output tokens/s the sim sustains with ``concurrency`` closed-loop clients (``ignore_eos`` requests
    of exactly ``output_tokens``), non-streaming unless ``stream``. ``math.inf`` in instant mode. See
    the module docstring for the formula."""
    return steady_state(
        config, concurrency, prompt_tokens=prompt_tokens, output_tokens=output_tokens, stream=stream
    ).output_tokens_per_s


def best_concurrency(
    config: SimConfig, *, prompt_tokens: int = 128, output_tokens: int = 128, stream: bool = False
) -> int:
    """The concurrency of highest theoretical throughput (1 .. 2 x max running; the lowest of ties)."""
    best, best_tps = 1, -1.0
    for c in range(1, 2 * config.max_running + 1):
        tps = theoretical_output_tokens_per_s(
            config, c, prompt_tokens=prompt_tokens, output_tokens=output_tokens, stream=stream
        )
        if tps > best_tps * (1 + 1e-12):
            best, best_tps = c, tps
    return best


def curve(
    config: SimConfig,
    concurrencies: list[int] | None = None,
    *,
    prompt_tokens: int = 128,
    output_tokens: int = 128,
    stream: bool = False,
) -> list[SteadyState]:
    """Steady states along a concurrency sweep (default: powers of two up to twice --max-running)."""
    if concurrencies is None:
        concurrencies, c = [], 1
        while c <= 2 * config.max_running:
            concurrencies.append(c)
            c *= 2
    return [
        steady_state(config, c, prompt_tokens=prompt_tokens, output_tokens=output_tokens, stream=stream)
        for c in concurrencies
    ]


def _finite(state: SteadyState) -> dict[str, Any]:
    return {k: (None if isinstance(v, float) and math.isinf(v) else v) for k, v in asdict(state).items()}


def dry_run_report(config: SimConfig) -> dict[str, Any]:
    """What ``--dry-run --json`` prints: the resolved configuration and its theoretical curve
    (non-streaming; ``streaming_output_tokens_per_s`` beside each point)."""
    prompt, output = 128, config.default_max_tokens
    points = []
    for s in curve(config, prompt_tokens=prompt, output_tokens=output):
        point = _finite(s)
        streamed = theoretical_output_tokens_per_s(
            config, s.concurrency, prompt_tokens=prompt, output_tokens=output, stream=True
        )
        point["streaming_output_tokens_per_s"] = None if math.isinf(streamed) else streamed
        points.append(point)
    steps = config.steps
    return {
        "config": config.model_dump(mode="json"),
        "prompt_tokens": prompt,
        "output_tokens": output,
        "instant": config.instant,
        "timing": config.timing,
        "peak_batch": steps.peak_batch,
        "exponent": steps.exponent,
        "api_events_per_s": steps.api_events_per_s,
        "best_concurrency": None
        if config.instant
        else best_concurrency(config, prompt_tokens=prompt, output_tokens=output),
        "curve": points,
    }
