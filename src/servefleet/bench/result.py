"""The schema of RUN.json: one benchmark run of one server, all of its points.

Scripts and later tools (``compare``, ``plan``) read these files, so the names of the
contract fields are stable: ``points[].concurrency, requests, errors, duration_s,
requests_per_s, output_tokens_per_s, total_tokens_per_s, ttft_ms, tpot_ms, itl_ms, e2e_ms``
(each latency an object with ``mean, p50, p90, p99``) and ``client_bound``. New fields may be
added; none of those may be renamed.

``measured_mode`` says how the answers came: ``non-streaming`` (the default, the way a batch job runs:
throughput as ``generate`` will see it) or ``streaming`` (one event per token or step: the server's
API process can cap throughput well below what it generates, so use it for latency work). A
point's ``output_tokens_per_s`` is its steady rate (``steady``: ramp and drain kept out); its
latencies come from the client (streaming) or the engine's own ``/metrics`` histograms
(non-streaming), and ``latency_source`` says which.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from servefleet.capacity import Capacity

__all__ = [
    "SCHEMA_VERSION",
    "Stat",
    "ServerStats",
    "ClientCheck",
    "MeasuredMode",
    "Point",
    "ServerLatency",
    "SteadyWindow",
    "BenchConfig",
    "Target",
    "Environment",
    "Run",
    "load_run",
    "save_run",
]

SCHEMA_VERSION = 1

MeasuredMode = Literal["non-streaming", "streaming"]


class Stat(BaseModel):
    """Summary of one latency distribution, in milliseconds. ``n`` samples; all None when n == 0."""

    model_config = ConfigDict(extra="forbid")

    mean: float | None = None
    p50: float | None = None
    p90: float | None = None
    p99: float | None = None
    min: float | None = None
    max: float | None = None
    n: int = 0
    # From an engine histogram: the bucket (lower, upper; None = +Inf) each percentile fell in, so the
    # percentile is known only that finely; a percentile is None where its bucket was too coarse
    # (the first or the open last one). Empty for client timing (exact samples).
    resolution_ms: dict[str, tuple[float, float | None]] = Field(default_factory=dict)

    @property
    def coarse(self) -> bool:
        """A percentile was left out because its histogram bucket was too coarse to place it."""
        return any(getattr(self, name) is None for name in self.resolution_ms)


class ServerStats(BaseModel):
    """What the server itself said around one point (Prometheus ``/metrics``, SGLang ``/server_info``).

    Gauges are sampled during the point (``*_max``/``*_mean``); counters are differenced
    between the scrape before and the scrape after it.
    """

    model_config = ConfigDict(extra="forbid")

    source: list[str] = Field(default_factory=list)  # e.g. ["/metrics", "/server_info"]
    samples: int = 0
    running_mean: float | None = None
    running_max: float | None = None
    queued_mean: float | None = None
    queued_max: float | None = None
    kv_cache_usage_max: float | None = None  # fraction 0..1
    # Speculative decoding over the point: accepted / drafted tokens, and the mean number of
    # tokens emitted per verification step (1 + accepted / drafts, or SGLang's spec_accept_length).
    spec_acceptance_rate: float | None = None
    spec_accept_length: float | None = None
    generation_tokens: float | None = None  # server's own count of generated tokens during the point
    preemptions: float | None = None
    # share of the point's prompt tokens found in the engine's prefix cache (no prefill for them): a
    # bench whose prompts repeat, or share more prefixes than the job's, runs faster than the job will
    prefix_cache_hit_rate: float | None = None
    saturated: bool | None = None  # requests were queued, or running hit max_running_requests
    extra: dict[str, Any] = Field(default_factory=dict)


class ClientCheck(BaseModel):
    """The load generator watching itself: was the client, not the server, the limit?"""

    model_config = ConfigDict(extra="forbid")

    workers: int = 1
    cpu_percent_max: float | None = None  # busiest worker process, % of one core
    cpu_percent_total: float | None = None  # all workers together
    loop_lag_ms: Stat = Field(default_factory=Stat)
    host_cpu_percent: float | None = None  # whole machine, % of all cores
    reasons: list[str] = Field(default_factory=list)


class ServerLatency(BaseModel):
    """The engine's own latency histograms over one point's measured requests (``/metrics``, differenced
    after the warm-up and after the point). Means are exact, percentiles interpolated in buckets."""

    model_config = ConfigDict(extra="forbid")

    ttft_ms: Stat | None = None
    tpot_ms: Stat | None = None
    itl_ms: Stat | None = None
    e2e_ms: Stat | None = None
    metrics: dict[str, str] = Field(default_factory=dict)  # which histogram each came from


class SteadyWindow(BaseModel):
    """The part of a point when the load was steady: after the ramp (the first ``concurrency``
    answers: the users started together) and before the drain (no request started after it).
    Seconds from the point's first request."""

    model_config = ConfigDict(extra="forbid")

    start_s: float
    end_s: float
    output_tokens: float  # client side: each answer's tokens shared over its lifetime, the window's part
    output_tokens_per_s: float
    server_output_tokens_per_s: float | None = None  # the engine's generated-tokens counter over the window
    steady: bool  # the window held at least two typical request lifetimes
    reason: str | None = None  # why not steady (point too short)


class Point(BaseModel):
    """One load level: a fixed concurrency, or a Poisson request rate."""

    model_config = ConfigDict(extra="forbid")

    concurrency: int | None  # closed-loop users, or the in-flight cap in rate mode (None: no cap)
    request_rate: float | None = None  # Poisson arrivals per second (rate mode), else None
    requests: int  # measured requests sent (warm-up excluded), successes + errors
    successful: int
    errors: int
    errors_by_kind: dict[str, int] = Field(default_factory=dict)
    error_examples: dict[str, str] = Field(default_factory=dict)
    duration_s: float
    requests_per_s: float  # successful requests per second
    input_tokens: int
    output_tokens: int
    output_tokens_per_s: float  # the steady window's rate when the point had one (steady.steady), else over its span
    output_tokens_per_s_span: float | None = None  # first start to last end: ramp and drain included
    total_tokens_per_s: float
    output_tokens_per_s_per_request: Stat = Field(default_factory=Stat)  # per-user speed, tok/s
    ttft_ms: Stat
    tpot_ms: Stat
    itl_ms: Stat  # per token: a chunk carrying k tokens after a gap g counts k samples of g/k
    e2e_ms: Stat
    achieved_concurrency: float  # mean requests in flight (sum of latencies / duration)
    token_sources: dict[str, int] = Field(default_factory=dict)  # how output tokens were counted
    chunks_per_request: float | None = None
    tokens_per_chunk: float | None = None
    client_bound: bool
    client: ClientCheck = Field(default_factory=ClientCheck)
    server: ServerStats | None = None
    steady: SteadyWindow | None = None
    server_latency: ServerLatency | None = None
    latency_source: dict[str, str] = Field(default_factory=dict)  # ttft/tpot/itl -> "client" or "server:<metric>"


class BenchConfig(BaseModel):
    """How the run was asked for (enough to repeat it)."""

    model_config = ConfigDict(extra="forbid")

    mode: Literal["concurrency", "rate"] = "concurrency"
    concurrency: list[Annotated[int, Field(ge=1)]] = Field(default_factory=list)
    request_rates: list[Annotated[float, Field(gt=0, allow_inf_nan=False)]] = Field(default_factory=list)
    max_concurrency: int | None = Field(default=None, ge=1)  # in-flight cap in rate mode
    requests: int | None = Field(default=None, ge=1)  # per point
    duration_s: float | None = Field(default=None, gt=0)  # per point (alternative to requests)
    warmup: int | None = Field(default=None, ge=0)  # requests per point, not measured (None: one per connection)
    input_len: int | None = Field(default=None, ge=1)
    output_len: int | None = Field(default=None, ge=1)
    input_len_range: float = Field(default=0.0, ge=0, lt=1)  # uniform +-fraction around input_len
    output_len_range: float = Field(default=0.0, ge=0, lt=1)
    dataset: str | None = None
    api: Literal["chat", "completions"] = "chat"
    stream: bool = False  # non-streaming by default: the way a batch job (generate) runs
    ignore_eos: bool | None = None
    temperature: float | None = None
    extra_body: dict[str, Any] = Field(default_factory=dict)
    workers: int = Field(default=1, ge=1)
    seed: int = 0
    timeout_s: float = Field(default=600.0, gt=0)


class Target(BaseModel):
    model_config = ConfigDict(extra="forbid")

    label: str
    base_url: str
    model: str | None = None
    engine: str | None = None
    engine_version: str | None = None


class Environment(BaseModel):
    model_config = ConfigDict(extra="forbid")

    servefleet_version: str
    python: str
    platform: str
    hostname: str
    cpu_count: int | None = None
    aiohttp_version: str | None = None
    event_loop: str | None = None


class Run(BaseModel):
    """A whole RUN.json."""

    model_config = ConfigDict(extra="forbid")

    schema_version: int = SCHEMA_VERSION
    tool: str = "servefleet bench"
    created_at: str  # ISO 8601, UTC
    target: Target
    config: BenchConfig
    capacity: Capacity | None = None
    server_info: dict[str, Any] = Field(default_factory=dict)  # trimmed engine info (e.g. /server_info)
    workload: dict[str, Any] = Field(default_factory=dict)  # how prompts were made and counted
    environment: Environment
    measured_mode: MeasuredMode | None = None  # filled from config.stream for runs written before it existed
    points: list[Point] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _mode(self) -> Run:
        if self.measured_mode is None:
            self.measured_mode = "streaming" if self.config.stream else "non-streaming"
        return self

    @property
    def streaming(self) -> bool:
        return self.measured_mode == "streaming"

    @property
    def label(self) -> str:
        return self.target.label

    def best_point(self) -> Point | None:
        """The point with the highest output token throughput."""
        return max(self.points, key=lambda p: p.output_tokens_per_s, default=None)


def save_run(run: Run, path: str | Path) -> Path:
    """Write atomically (temp file + rename) so a crash never leaves half a RUN.json."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(run.model_dump_json(indent=2) + "\n")
    tmp.replace(path)
    return path


def load_run(path: str | Path) -> Run:
    """Read and validate a RUN.json (pydantic raises ValidationError on a bad file)."""
    return Run.model_validate(json.loads(Path(path).read_text()))
