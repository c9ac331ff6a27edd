"""The sim's timing model, in closed form, so tests and benchmarks can say what to expect.

The scheduler (:mod:`servefleet.sim.scheduler`) runs one loop of batched steps, like a
continuous-batching engine:

* at each step boundary it admits waiting requests, FIFO, while ``running < max_running`` and the
  KV tokens reserved (``prompt + max_tokens`` per request) fit in ``kv_tokens``;
* a step costs ``decode_ms + decode_ms_per_running * B`` milliseconds for a batch of ``B`` requests,
  plus ``prefill_ms_per_1k_tokens * P / 1000`` for each request admitted at that step (prefill is
  mixed into the step, as in vLLM's chunked prefill);
* the step that admits a request yields its first token (prefill samples one token); every later
  step yields ``tokens_per_step`` tokens per request (> 1 models speculative decoding), one SSE chunk
  per step.

So a request of ``P`` prompt and ``N`` output tokens needs ``S = 1 + ceil((N - 1) / k)`` steps. With
``C`` clients each sending its next request as soon as the last one ends, the batch holds
``B = min(C, max_running, kv_tokens // (P + N))`` requests; while they run, ``B`` new prefills are
paid, so ``B`` requests complete every

    cycle_ms = S * (decode_ms + decode_ms_per_running * B) + B * prefill_ms_per_1k_tokens * P / 1000

and the output throughput is ``B * N / cycle_ms * 1000`` tokens/s. Per-request speed falls as ``B``
grows while the total plateaus near ``k * 1000 / decode_ms_per_running`` -- the knee of a real
throughput-vs-concurrency curve -- and stops growing at ``max_running``.

Client turnaround is ignored: a closed-loop client whose request ends while others run usually misses
one step before its next request is admitted (a queue beyond ``max_running`` hides this, and so does
an idle server), so measured throughput below saturation sits up to ``1/(S+1)`` under the formula.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from servefleet.sim.config import SimConfig

__all__ = ["SteadyState", "steady_state", "theoretical_output_tokens_per_s", "steps_per_request", "curve", "dry_run_report"]


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


def steps_per_request(output_tokens: int, tokens_per_step: int) -> int:
    """Steps a request of ``output_tokens`` takes: one prefill step (1 token), then k per step."""
    if output_tokens <= 0:
        return 0
    return 1 + math.ceil((output_tokens - 1) / tokens_per_step)


def steady_state(config: SimConfig, concurrency: int, *, prompt_tokens: int = 128, output_tokens: int = 128) -> SteadyState:
    """The steady state of ``concurrency`` closed-loop clients sending requests of the given lengths."""
    if concurrency < 1:
        raise ValueError("concurrency must be >= 1")
    if output_tokens < 1:
        raise ValueError("output_tokens must be >= 1")
    need = prompt_tokens + output_tokens
    kv_fit = config.kv_tokens // need if need > 0 else concurrency
    batch = max(1, min(concurrency, config.max_running, kv_fit))
    steps = steps_per_request(output_tokens, config.tokens_per_step)
    step_ms = config.decode_ms + config.decode_ms_per_running * batch
    prefill_ms = config.prefill_ms_per_1k_tokens * prompt_tokens / 1000.0
    cycle_ms = steps * step_ms + batch * prefill_ms
    if cycle_ms <= 0:
        return SteadyState(concurrency, batch, steps, step_ms, 0.0, 0.0, math.inf, math.inf)
    throughput = batch * output_tokens / cycle_ms * 1000.0
    queue_ms = max(0.0, concurrency / batch - 1.0) * cycle_ms  # closed loop: the rest wait their turn
    return SteadyState(
        concurrency=concurrency,
        batch=batch,
        steps=steps,
        step_ms=step_ms,
        request_latency_s=(queue_ms + cycle_ms) / 1000.0,
        ttft_s=(queue_ms + step_ms + prefill_ms) / 1000.0,
        output_tokens_per_s=throughput,
        per_request_tokens_per_s=output_tokens / cycle_ms * 1000.0,
    )


def theoretical_output_tokens_per_s(config: SimConfig, concurrency: int, *, prompt_tokens: int = 128, output_tokens: int = 128) -> float:
    """Output tokens/s the sim sustains with ``concurrency`` closed-loop clients (``ignore_eos`` requests
    of exactly ``output_tokens``). ``math.inf`` in instant mode. See the module docstring for the formula."""
    return steady_state(config, concurrency, prompt_tokens=prompt_tokens, output_tokens=output_tokens).output_tokens_per_s


def curve(config: SimConfig, concurrencies: list[int] | None = None, *, prompt_tokens: int = 128,
          output_tokens: int = 128) -> list[SteadyState]:
    """Steady states along a concurrency sweep (default: powers of two up to twice --max-running)."""
    if concurrencies is None:
        concurrencies, c = [], 1
        while c <= 2 * config.max_running:
            concurrencies.append(c)
            c *= 2
    return [steady_state(config, c, prompt_tokens=prompt_tokens, output_tokens=output_tokens) for c in concurrencies]


def dry_run_report(config: SimConfig) -> dict[str, Any]:
    """What ``--dry-run --json`` prints: the resolved configuration and its theoretical curve."""
    prompt, output = 128, config.default_max_tokens
    return {"config": config.model_dump(mode="json"), "prompt_tokens": prompt, "output_tokens": output,
            "instant": config.instant,
            "curve": [{k: (None if isinstance(v, float) and math.isinf(v) else v) for k, v in asdict(s).items()}
                      for s in curve(config, prompt_tokens=prompt, output_tokens=output)]}
