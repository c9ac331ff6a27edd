"""The simulated engine (``python -m servefleet.sim``): an OpenAI-compatible aiohttp server that
prints the start-up log of a real engine (``--style sglang`` by default, or ``--style vllm``).

Because it prints the real engines' text -- capacity lines, failures by category -- its profile is
the union of the SGLang and vLLM signatures and capacity parsers, and it reads capacity from the
SGLang-style ``/server_info`` it serves. Readiness is ``/health``.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import TYPE_CHECKING, ClassVar

from servefleet.capacity import Capacity
from servefleet.engines import native_args as na
from servefleet.engines import sglang, vllm
from servefleet.engines.base import (
    EngineProfile,
    LatencyMetrics,
    LaunchSpec,
    MemoryPhases,
    Probe,
    ServingMetrics,
    Signature,
    TokenizeEndpoint,
)
from servefleet.engines.generic import build_signatures, has_flag

if TYPE_CHECKING:
    from servefleet.http import HttpClient

__all__ = ["SimEngine"]

# The simulator's own flags (servefleet.sim.config: each field is --field-name, some with the real
# engines' names as aliases). Not imported from servefleet.sim: real work never imports the sim.
ARGS = na.ArgTable(
    na.Flag(("--model", "--model-path"), "model"),
    na.Flag(("--served-model-name",), "served_model_name"),
    na.Flag(("--port",), "port", na.to_int),
    na.Flag(("--host",), "host"),
    na.Flag(("--tp", "--tp-size", "--tensor-parallel-size"), "tensor_parallel_size", na.to_int),
    na.Flag(("--max-running", "--max-running-requests", "--max-num-seqs"), "max_running_requests", na.to_int),
    na.Flag(("--mem-fraction-static", "--gpu-memory-utilization"), "memory_fraction", na.to_float),
    na.Flag(("--context-length", "--max-model-len"), "context_length", na.to_int),
    na.Flag(("--tokens-per-step",), "speculative", na.to_int, key="tokens_per_step"),
    na.Flag(("--speculative-algorithm",), "speculative", key="speculative_algorithm"),
)

_SGLANG = sglang.SGLangEngine()
_VLLM = vllm.VLLMEngine()


class SimEngine(EngineProfile):
    name: ClassVar[str] = "sim"
    probe: ClassVar[Probe] = Probe(("/health",))
    # SGLang's first: where both know a line (uvicorn's "Application startup complete."), SGLang's
    # reading (progress, not ready) is the cautious one; the probe decides readiness anyway.
    signatures: ClassVar[tuple[Signature, ...]] = build_signatures(
        sglang.OWN_SIGNATURES + vllm.OWN_SIGNATURES, sglang.HINTS
    )
    detect: ClassVar[tuple[re.Pattern[str], ...]] = (re.compile(r"\bservefleet[. ]sim\b"),)
    memory_flag: ClassVar[str | None] = "--kv-tokens"
    memory_settled: ClassVar[tuple[re.Pattern[str], ...]] = (
        sglang.SGLangEngine.memory_settled + vllm.VLLMEngine.memory_settled
    )
    # both engines' phases; where a progress label means another phase in each, SGLang's (its lines win above too)
    memory_phases: ClassVar[MemoryPhases] = MemoryPhases(
        sglang.MEMORY_PHASES.frames + vllm.MEMORY_PHASES.frames,
        vllm.MEMORY_PHASES.progress + sglang.MEMORY_PHASES.progress,
    )
    supports_ignore_eos: ClassVar[bool] = True
    arg_table: ClassVar[na.ArgTable] = ARGS
    # The sim publishes both families; vLLM's names first (they include per-request TPOT).
    latency_metrics: ClassVar[LatencyMetrics | None] = LatencyMetrics(
        ttft=vllm.LATENCY_METRICS.ttft + sglang.LATENCY_METRICS.ttft,
        tpot=vllm.LATENCY_METRICS.tpot + sglang.LATENCY_METRICS.tpot,
        itl=vllm.LATENCY_METRICS.itl + sglang.LATENCY_METRICS.itl,
        e2e=vllm.LATENCY_METRICS.e2e + sglang.LATENCY_METRICS.e2e,
    )
    # Both families' load series (servefleet.sim.info), vLLM's first; it has no preemptions, engine
    # steps or acceptance rate to publish.
    serving_metrics: ClassVar[ServingMetrics] = replace(
        ServingMetrics.union(vllm.SERVING_METRICS, sglang.SERVING_METRICS),
        preemptions=(),
        steps=(),
        spec_accept_rate=(),
    )
    # It serves SGLang's info document and answers /tokenize in vLLM's shape (servefleet.sim.server).
    info_paths: ClassVar[tuple[str, ...]] = sglang.INFO_PATHS
    tokenize: ClassVar[TokenizeEndpoint | None] = replace(vllm.TOKENIZE, label="sim")

    def log_time(self, line: str) -> float | None:
        found = _SGLANG.log_time(line)
        return found if found is not None else _VLLM.log_time(line)

    def build_argv(self, spec: LaunchSpec) -> list[str]:
        """``python -m servefleet.sim --style sglang --host H --port P --model M [--served-model-name S]
        EXTRA...`` (``--style`` in the extra args replaces the default; ``command`` replaces the
        launcher). The simulator's own options (``--max-running``, ``--kv-tokens``,
        ``--fail-at-startup CATEGORY``...) go in the extra args untouched."""
        native = self.launch_args(spec)
        argv = list(spec.command) or [spec.python, "-m", "servefleet.sim"]
        extra = spec.extra_args
        if not has_flag(extra, "--style"):
            argv += ["--style", "sglang"]
        if "host" not in native:
            argv += ["--host", spec.host]
        if "port" not in native:
            argv += ["--port", spec.port_arg]
        if "model" not in native:
            argv += ["--model", spec.model]
        if spec.served_model_name and "served_model_name" not in native:
            argv += ["--served-model-name", spec.served_model_name]
        return argv + list(extra)

    def capacity_from_line(self, line: str) -> Capacity | None:
        return _SGLANG.capacity_from_line(line) or _VLLM.capacity_from_line(line)

    async def capacity_from_server(self, client: HttpClient, base_url: str) -> Capacity:
        return await _SGLANG.capacity_from_server(client, base_url)
