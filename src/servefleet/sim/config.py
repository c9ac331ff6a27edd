"""The simulated engine's configuration: one pydantic model, the single source of its CLI options.

Every field becomes a command-line option (``--max-running``, ``--fail-at-startup``, ...; see
:mod:`servefleet.sim.cli_args`), so ``python -m servefleet.sim`` and ``servefleet sim`` take exactly
the same options. Some fields also answer to the real engines' flag names (``--max-running-requests``
/ ``--max-num-seqs``, ``--max-total-tokens``, ``--max-model-len``, ``--model-path``, ``--tp-size``), so
a fleet file written for SGLang or vLLM can point at the sim with few changes.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from servefleet.catalog import Category
from servefleet.sim.timing import StepModel, step_model

__all__ = ["SimConfig", "Style", "Timing", "DEFAULT_VERSIONS", "option_aliases"]

Style = Literal["sglang", "vllm"]
Timing = Literal["realistic", "knee"]

# Step-cost defaults per timing mode: realistic keeps the H200's shape at max running 64 (see .timing).
_DECODE_MS = {"realistic": 1.0, "knee": 10.0}
_PER_RUNNING_MS = {"realistic": 0.22, "knee": 0.1}
_REALISTIC_ONLY = ("peak_batch", "decline_at_2x_peak", "api_events_per_s")

# Versions whose log format the styles reproduce (SGLang 0.5.x main-process/TP-rank prefixes;
# vLLM 0.11 V1 engine with "(APIServer pid=N)" / "(EngineCore_DP0 pid=N)" prefixes).
DEFAULT_VERSIONS: dict[str, str] = {"sglang": "0.5.2", "vllm": "0.11.0"}
DEFAULT_PORTS: dict[str, int] = {"sglang": 30000, "vllm": 8000}


def _alias(*names: str) -> dict[str, Any]:
    return {"aliases": list(names)}


class SimConfig(BaseModel):
    """What the simulated server looks like, how fast it is, and which faults it injects."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # ---- identity -------------------------------------------------------------------------------
    style: Style = Field(
        "sglang", description="engine whose log format, endpoints' flavour and failure texts to imitate"
    )
    host: str = Field("127.0.0.1", description="address to bind")
    port: int | None = Field(
        None,
        ge=0,
        le=65535,
        description="port to bind (default: 30000 for sglang, 8000 for vllm; 0: any free port, printed in the log)",
    )
    model: str = Field(
        "sim-model",
        description="model path or repo id (printed in the log; served name by default)",
        json_schema_extra=_alias("--model-path"),
    )
    served_model_name: str | None = Field(None, description="name listed by /v1/models (default: --model)")
    engine_version: str | None = Field(None, description="version string to report (default: per style)")
    logprobs: bool = Field(
        True,
        description="answer token logprobs when a request asks (--no-logprobs: the field stays null, as "
        "from an engine without them)",
    )
    lora_adapters: str | None = Field(
        None,
        description="comma-separated LoRA adapter names, listed by /v1/models after the base "
        "model and accepted as a request's model (as vLLM's --lora-modules)",
    )

    # ---- capacity -------------------------------------------------------------------------------
    max_running: int = Field(
        64,
        ge=1,
        description="requests decoded at once; the rest queue FIFO",
        json_schema_extra=_alias("--max-running-requests", "--max-num-seqs"),
    )
    kv_tokens: int = Field(
        262144,
        ge=1,
        description="KV-cache tokens; a request reserves prompt+max_tokens on admission",
        json_schema_extra=_alias("--max-total-tokens"),
    )
    context_length: int = Field(
        32768, ge=2, description="longest prompt+completion accepted", json_schema_extra=_alias("--max-model-len")
    )
    tp: int = Field(
        1,
        ge=1,
        le=64,
        description="tensor-parallel ranks (per-rank log lines are repeated)",
        json_schema_extra=_alias("--tp-size", "--tensor-parallel-size"),
    )
    mem_fraction_static: float = Field(
        0.88, gt=0, le=1, description="cosmetic: SGLang's memory flag, printed in server_args"
    )
    gpu_memory_utilization: float = Field(
        0.9, gt=0, le=1, description="cosmetic: vLLM's memory flag, printed in its args"
    )

    # ---- timing model (see servefleet.sim.timing and servefleet.sim.theory) ----------------------
    timing: Timing = Field(
        "realistic",
        description="step-time model: realistic (throughput peaks at --peak-batch and "
        "declines past it; streamed events cost the API process) or knee (the old model: flat at max running)",
    )
    prefill_ms_per_1k_tokens: float = Field(
        20.0, ge=0, description="prefill cost added to the step that admits a request"
    )
    decode_ms: float = Field(
        _DECODE_MS["realistic"],
        ge=0,
        description=f"fixed cost of one batched decode step ({_DECODE_MS['knee']} with --timing knee)",
    )
    decode_ms_per_running: float = Field(
        _PER_RUNNING_MS["realistic"],
        ge=0,
        description=f"extra step cost per request in the batch ({_PER_RUNNING_MS['knee']} with --timing knee)",
    )
    peak_batch: int | None = Field(
        None,
        ge=1,
        description="realistic: batch of best throughput (default: half of --max-running, "
        "as vLLM on an H200 peaked at 512 with --max-num-seqs 1024)",
    )
    decline_at_2x_peak: float = Field(
        0.81,
        gt=0,
        lt=1,
        description="realistic: throughput at twice --peak-batch, as a share of the peak (H200: 23.4k / 28.7k)",
    )
    api_events_per_s: float | None = Field(
        None,
        gt=0,
        description="realistic: streamed events (one per step per request) the "
        "API process sends a second (default: 0.62 x the peak decode rate, as on the H200)",
    )
    tokens_per_step: float = Field(
        1,
        ge=1,
        le=64,
        description="mean tokens per request per step (>1 models speculative decoding; "
        "fractional = mean acceptance length, e.g. 2.5)",
    )
    speculative_algorithm: str | None = Field(
        None, description="name reported when --tokens-per-step > 1 (default EAGLE)"
    )
    spec_ms_per_running: float = Field(
        0.0,
        ge=0,
        description="speculative (--tokens-per-step > 1): extra step cost per running request "
        "(verifying its drafts), so the gain of speculative decoding fades as the batch grows",
    )
    default_max_tokens: int = Field(256, ge=1, description="max_tokens when a request gives none")
    eos_rate: float = Field(0.5, ge=0, le=1, description="share of requests without ignore_eos that stop early (EOS)")

    # ---- start-up log ---------------------------------------------------------------------------
    load_time: float = Field(2.0, ge=0, description="seconds the start-up log is spread over before ready")
    shards: int = Field(4, ge=1, le=1000, description="checkpoint shards in the loading progress lines")
    color: bool = Field(False, description="ANSI colours in the log, like engines on a terminal")
    access_log: bool = Field(False, description="uvicorn-style access line per HTTP request")
    log_interval: float = Field(10.0, gt=0, description="seconds between vLLM-style throughput lines while busy")
    children: int = Field(
        0, ge=0, le=16, description="idle child processes to start (like scheduler/detokenizer ranks)"
    )
    seed: int = Field(0, description="seed of every pseudo-random choice (EOS lengths, fault draws)")

    # ---- faults ---------------------------------------------------------------------------------
    fail_at_startup: Category | None = Field(
        None, description="fail while loading, printing this style's real text for the category"
    )
    fail_variant: int = Field(0, ge=0, description="which of the category's texts to print (several exist for some)")
    fail_after_ready: Category | None = Field(None, description="fail after the HTTP server is up, during warm-up")
    fail_delay: float | None = Field(
        None, ge=0, description="seconds into loading (or after the server is up) the failure happens"
    )
    server_info: bool = Field(
        True,
        description="serve /server_info (SGLang's shape, with max running); --no-server-info: "
        "404 as real vLLM, whose capacity a client then cannot read (generate --url ramps)",
    )
    fail_exit_code: int | None = Field(
        None, ge=0, le=255, description="override the realistic exit status of a failure"
    )
    hang_loading: bool = Field(False, description="print some progress, then stay alive and silent forever")
    crash_after: int | None = Field(None, ge=0, description="exit abruptly after this many completed requests")
    crash_mode: Literal["exit", "kill"] = Field("exit", description="how --crash-after ends: os._exit(1) or SIGKILL")
    die_on_first_request: bool = Field(False, description="pass /health, then crash on the first completion")
    error_rate: float = Field(0.0, ge=0, le=1, description="share of completions answered 500")
    rate_limit_rate: float = Field(0.0, ge=0, le=1, description="share of completions answered 429")
    slow_rate: float = Field(0.0, ge=0, le=1, description="share of completions delayed by --slow-ms before admission")
    slow_ms: float = Field(1000.0, ge=0, description="delay of a slow request")

    @model_validator(mode="before")
    @classmethod
    def _mode_defaults(cls, data: Any) -> Any:
        """The step-cost defaults depend on --timing (a knee sim keeps its old speeds)."""
        if isinstance(data, dict):
            timing = data.get("timing", "realistic")
            if timing in _DECODE_MS:
                data = dict(data)
                data.setdefault("decode_ms", _DECODE_MS[timing])
                data.setdefault("decode_ms_per_running", _PER_RUNNING_MS[timing])
        return data

    @model_validator(mode="after")
    def _check(self) -> SimConfig:
        if self.timing == "knee":
            given = [n for n in _REALISTIC_ONLY if n in self.model_fields_set]
            if given:
                raise ValueError(f"--{given[0].replace('_', '-')} belongs to --timing realistic, not knee")
        elif self.decode_ms == 0 and not self.instant:
            raise ValueError(
                "--timing realistic needs --decode-ms > 0 (the peak is fitted from it); use --timing knee for a "
                "step cost without a fixed part"
            )
        if self.fail_at_startup is not None and self.fail_after_ready is not None:
            raise ValueError("--fail-at-startup and --fail-after-ready exclude each other")
        if self.hang_loading and (self.fail_at_startup is not None or self.fail_after_ready is not None):
            raise ValueError("--hang-loading excludes --fail-at-startup / --fail-after-ready")
        if self.error_rate + self.rate_limit_rate > 1:
            raise ValueError("--error-rate + --rate-limit-rate must not exceed 1")
        return self

    # ---- derived --------------------------------------------------------------------------------
    @property
    def served_name(self) -> str:
        return self.served_model_name or self.model

    @property
    def adapters(self) -> tuple[str, ...]:
        return tuple(a for a in (self.lora_adapters or "").split(",") if a)

    @property
    def bind_port(self) -> int:
        """The port to bind: --port, else the style's engine default."""
        if self.port is not None:
            return self.port
        return DEFAULT_PORTS[self.style]

    @property
    def version(self) -> str:
        return self.engine_version or DEFAULT_VERSIONS[self.style]

    @property
    def speculative(self) -> bool:
        return self.tokens_per_step > 1

    @property
    def spec_draft_tokens(self) -> int:
        """Draft tokens per step (what --num-speculative-tokens would be): the mean length rounded up, less one."""
        return math.ceil(self.tokens_per_step) - 1

    @property
    def resolved_peak_batch(self) -> int:
        return self.peak_batch if self.peak_batch is not None else max(1, self.max_running // 2)

    @property
    def steps(self) -> StepModel:
        """The step-cost model of this configuration (servefleet.sim.timing)."""
        per_running = self.decode_ms_per_running + (self.spec_ms_per_running if self.speculative else 0.0)
        return step_model(
            self.timing,
            self.decode_ms,
            per_running,
            self.resolved_peak_batch,
            self.decline_at_2x_peak,
            self.api_events_per_s,
            self.instant,
        )

    @property
    def spec_algorithm(self) -> str | None:
        if not self.speculative:
            return None
        return self.speculative_algorithm or "EAGLE"

    @property
    def instant(self) -> bool:
        """No time model at all: answers as fast as the HTTP stack allows (client-overhead benchmarks)."""
        return self.decode_ms == 0 and self.decode_ms_per_running == 0 and self.prefill_ms_per_1k_tokens == 0


def option_aliases(name: str) -> list[str]:
    """Extra flag names of a SimConfig field (real engines' names for the same thing)."""
    extra = SimConfig.model_fields[name].json_schema_extra
    if isinstance(extra, dict):
        return list(extra.get("aliases", []))  # type: ignore[arg-type]  # a JSON value to mypy; always a list of names here
    return []
