"""The sim's read-only endpoints' bodies: /metrics (Prometheus text), /server_info, /v1/models.

Metric names are the engines' own, both families at once so a client written for either finds
them: vLLM's ``vllm:num_requests_running``, ``vllm:num_requests_waiting``, ``vllm:kv_cache_usage_perc``
(and the older ``vllm:gpu_cache_usage_perc``), ``vllm:prompt_tokens_total``,
``vllm:generation_tokens_total``, ``vllm:spec_decode_num_{accepted,draft}_tokens_total``,
``vllm:prefix_cache_{queries,hits}_total`` (``sim/prefix_cache.py``); SGLang's
``sglang:num_running_reqs``, ``sglang:num_queue_reqs``, ``sglang:token_usage``, ``sglang:cached_tokens_total``,
``sglang:num_used_tokens``, ``sglang:gen_throughput``, ``sglang:spec_accept_length``. KV usage is a
fraction in [0, 1] in both, as upstream reports it.

``/server_info`` (and the older ``/get_server_info``) has SGLang's shape: the server arguments
flattened, ``max_total_num_tokens``, ``internal_states`` with ``effective_max_running_requests_per_dp``
and, when speculative, ``avg_spec_accept_length``, and ``version``.
"""

from __future__ import annotations

import time
from typing import Any

from servefleet.sim.config import SimConfig
from servefleet.sim.scheduler import Histogram, Stats
from servefleet.sim.styles import Memory

__all__ = ["metrics_text", "server_info", "models_body", "model_info"]


def _family(lines: list[str], name: str, kind: str, doc: str, value: float, labels: str) -> None:
    lines.append(f"# HELP {name} {doc}")
    lines.append(f"# TYPE {name} {kind}")
    lines.append(f"{name}{{{labels}}} {float(value)!r}")


def _histogram(lines: list[str], name: str, doc: str, hist: Histogram, labels: str) -> None:
    lines.append(f"# HELP {name} {doc}")
    lines.append(f"# TYPE {name} histogram")
    running = 0
    for bound, n in zip((*hist.bounds, None), hist.counts, strict=True):
        running += n
        le = "+Inf" if bound is None else repr(float(bound))
        lines.append(f'{name}_bucket{{{labels},le="{le}"}} {float(running)!r}')
    lines.append(f"{name}_sum{{{labels}}} {float(hist.sum)!r}")
    lines.append(f"{name}_count{{{labels}}} {float(hist.count)!r}")


def metrics_text(cfg: SimConfig, stats: Stats, now: float | None = None) -> str:
    now = time.monotonic() if now is None else now
    usage = stats.used_tokens / cfg.kv_tokens
    name = cfg.served_name.replace("\\", "\\\\").replace('"', '\\"')
    vl = f'engine="0",model_name="{name}"'
    sg = f'model_name="{name}",engine_type="unified",tp_rank="0",pp_rank="0"'
    out: list[str] = []
    _family(
        out, "vllm:num_requests_running", "gauge", "Number of requests in model execution batches.", stats.running, vl
    )
    _family(
        out, "vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.", stats.waiting, vl
    )
    _family(out, "vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", usage, vl)
    _family(out, "vllm:gpu_cache_usage_perc", "gauge", "GPU KV-cache usage. 1 means 100 percent usage.", usage, vl)
    _family(
        out,
        "vllm:prompt_tokens_total",
        "counter",
        "Number of prefill tokens processed.",
        stats.prompt_tokens_total,
        vl,
    )
    _family(
        out,
        "vllm:generation_tokens_total",
        "counter",
        "Number of generation tokens processed.",
        stats.generation_tokens_total,
        vl,
    )
    _family(
        out,
        "vllm:prefix_cache_queries_total",
        "counter",
        "Prefix cache queries, in terms of number of queried tokens.",
        stats.prefix.looked_up,
        vl,
    )
    _family(
        out,
        "vllm:prefix_cache_hits_total",
        "counter",
        "Prefix cache hits, in terms of number of cached tokens.",
        stats.prefix.hits,
        vl,
    )
    _family(
        out,
        "vllm:request_success_total",
        "counter",
        "Count of successfully processed requests.",
        stats.requests_finished,
        vl,
    )
    if cfg.speculative:
        _family(
            out,
            "vllm:spec_decode_num_drafts_total",
            "counter",
            "Number of spec decoding drafts.",
            stats.spec_drafts_total,
            vl,
        )
        _family(
            out,
            "vllm:spec_decode_num_draft_tokens_total",
            "counter",
            "Number of draft tokens.",
            stats.spec_draft_total,
            vl,
        )
        _family(
            out,
            "vllm:spec_decode_num_accepted_tokens_total",
            "counter",
            "Number of accepted tokens.",
            stats.spec_accepted_total,
            vl,
        )
    _family(out, "sglang:num_running_reqs", "gauge", "The number of running requests.", stats.running, sg)
    _family(out, "sglang:num_queue_reqs", "gauge", "The number of requests in the waiting queue.", stats.waiting, sg)
    _family(out, "sglang:num_used_tokens", "gauge", "The number of used tokens.", stats.used_tokens, sg)
    _family(out, "sglang:token_usage", "gauge", "The token usage.", usage, sg)
    _family(
        out, "sglang:gen_throughput", "gauge", "The generation throughput (token/s).", stats.gen_throughput(now), sg
    )
    _family(
        out,
        "sglang:prompt_tokens_total",
        "counter",
        "Number of prefill tokens processed.",
        stats.prompt_tokens_total,
        sg,
    )
    _family(
        out,
        "sglang:generation_tokens_total",
        "counter",
        "Number of generation tokens processed.",
        stats.generation_tokens_total,
        sg,
    )
    _family(out, "sglang:num_requests_total", "counter", "Number of requests processed.", stats.requests_finished, sg)
    _family(
        out,
        "sglang:cached_tokens_total",
        "counter",
        "Number of cached prompt tokens by source.",
        stats.prefix.hits,
        f'{sg},cache_source="device"',
    )
    for prefix, labels in (("vllm", vl), ("sglang", sg)):
        _histogram(
            out,
            f"{prefix}:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            stats.ttft,
            labels,
        )
        _histogram(
            out,
            f"{prefix}:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            stats.itl,
            labels,
        )
        _histogram(
            out,
            f"{prefix}:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            stats.e2e,
            labels,
        )
    _histogram(
        out,
        "vllm:request_time_per_output_token_seconds",
        "Histogram of time_per_output_token_seconds per request.",
        stats.tpot,
        vl,
    )
    if cfg.speculative:
        _family(
            out,
            "sglang:spec_accept_length",
            "gauge",
            "The average acceptance length of speculative decoding.",
            float(cfg.tokens_per_step),
            sg,
        )
    return "\n".join(out) + "\n"


def server_info(cfg: SimConfig, stats: Stats, port: int) -> dict[str, Any]:
    mem = Memory.of(cfg)
    spec = cfg.spec_algorithm
    state: dict[str, Any] = {
        "last_gen_throughput": stats.gen_throughput(time.monotonic()),
        "memory_usage": {
            "weight": round(mem.weights, 2),
            "kvcache": round(mem.kv_k + mem.kv_v, 2),
            "token_capacity": cfg.kv_tokens,
            "graph": 0.41,
        },
        "effective_max_running_requests_per_dp": cfg.max_running,
    }
    if spec:
        state["avg_spec_accept_length"] = float(cfg.tokens_per_step)
    return {
        "model_path": cfg.model,
        "tokenizer_path": cfg.model,
        "served_model_name": cfg.served_name,
        "host": cfg.host,
        "port": port,
        "mem_fraction_static": cfg.mem_fraction_static,
        "max_running_requests": cfg.max_running,
        "max_total_tokens": cfg.kv_tokens,
        "context_length": cfg.context_length,
        "chunked_prefill_size": 8192,
        "max_prefill_tokens": 16384,
        "tp_size": cfg.tp,
        "dp_size": 1,
        "page_size": 1,
        "random_seed": cfg.seed,
        "speculative_algorithm": spec,
        "speculative_num_steps": cfg.spec_draft_tokens if spec else None,
        "speculative_eagle_topk": 1 if spec else None,
        "speculative_num_draft_tokens": cfg.spec_draft_tokens + 1 if spec else None,
        "max_total_num_tokens": cfg.kv_tokens,
        "max_req_input_len": cfg.context_length - 1,
        "internal_states": [state],
        "version": cfg.version,
    }


def models_body(cfg: SimConfig, created: int) -> dict[str, Any]:
    base = {
        "id": cfg.served_name,
        "object": "model",
        "created": created,
        "owned_by": cfg.style,
        "root": cfg.model,
        "parent": None,
        "max_model_len": cfg.context_length,
    }
    adapters = [{**base, "id": name, "root": name, "parent": cfg.served_name} for name in cfg.adapters]
    return {"object": "list", "data": [base, *adapters]}


def model_info(cfg: SimConfig) -> dict[str, Any]:
    """SGLang's /get_model_info (and /model_info)."""
    return {
        "model_path": cfg.model,
        "tokenizer_path": cfg.model,
        "is_generation": True,
        "preferred_sampling_params": None,
        "weight_version": "default",
        "has_image_understanding": False,
        "has_audio_understanding": False,
    }
