"""The engine profile contract: everything engine-specific, and nothing else.

An engine profile knows how to build its launch command, which HTTP probe proves readiness,
which log lines mean ready / progress / fatal (and in which category), and how to read capacity
from its info endpoint and its log. Adding an engine means adding one module and one registry line.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from enum import StrEnum
from functools import lru_cache
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from servefleet.capacity import Capacity
from servefleet.catalog import DEFAULT_HINTS, Category
from servefleet.engines.native_args import ArgTable, NativeArgs
from servefleet.errors import EngineError

if TYPE_CHECKING:
    from servefleet.http import HttpClient

__all__ = [
    "SignalKind",
    "Signature",
    "LaunchSpec",
    "EngineProfile",
    "LatencyMetrics",
    "ServingMetrics",
    "Probe",
    "TokenizeEndpoint",
    "MemoryPhases",
    "AT_LOAD",
    "PROFILING",
    "KV_CACHE",
    "WARMING_UP",
    "CUDA_GRAPHS",
    "SAMPLER_WARMUP",
    "DUMMY_RUN",
    "WARMUP_REQUEST",
    "FIRST_REQUEST",
    "seconds_in_year",
    "PORT_SLOT",
]

# Where a launch's port goes when the host picks it only when the server starts (a Slurm job picks a
# free port on its node): the argv carries this token and the host replaces it (hosts/slurm_script.py).
PORT_SLOT = "@servefleet-port@"


class SignalKind(StrEnum):
    READY = "ready"  # the server says it serves (evidence only: the HTTP probe decides)
    PROGRESS = "progress"  # still loading: shards, CUDA graphs, compilation, warm-up
    FATAL = "fatal"  # a root cause, with a category
    WRAPPER = "wrapper"  # a fatal-looking line that points at a cause above it
    BENIGN = "benign"  # looks alarming but is not a failure (warnings); shields other patterns


@dataclass(frozen=True)
class Signature:
    """One recognisable log line. ``pattern`` is searched in a normalised line (ANSI codes and
    per-process prefixes such as ``[TP0]`` or ``(EngineCore_DP0 pid=12)`` already stripped)."""

    pattern: re.Pattern[str]
    kind: SignalKind
    category: Category | None = None
    hint: str | None = None
    label: str | None = None  # short progress label, e.g. "loading weights"

    @classmethod
    def fatal(cls, regex: str, category: Category, hint: str | None = None, flags: int = 0) -> Signature:
        return cls(re.compile(regex, flags), SignalKind.FATAL, category, hint or DEFAULT_HINTS[category])

    @classmethod
    def progress(cls, regex: str, label: str, flags: int = 0) -> Signature:
        return cls(re.compile(regex, flags), SignalKind.PROGRESS, label=label)

    @classmethod
    def ready(cls, regex: str, flags: int = 0) -> Signature:
        return cls(re.compile(regex, flags), SignalKind.READY, label="ready")

    @classmethod
    def wrapper(cls, regex: str, flags: int = 0) -> Signature:
        return cls(re.compile(regex, flags), SignalKind.WRAPPER)

    @classmethod
    def benign(cls, regex: str, flags: int = 0) -> Signature:
        return cls(re.compile(regex, flags), SignalKind.BENIGN)


# The start-up phases a memory failure is placed in (``gpu_oom`` verdicts name one), in words that
# follow "out of GPU memory".
AT_LOAD = "at load"
PROFILING = "while profiling memory"
KV_CACHE = "while allocating the KV cache"
WARMING_UP = "while warming up"
CUDA_GRAPHS = "while warming up (CUDA-graph capture)"
SAMPLER_WARMUP = "while warming up (sampler warm-up)"
DUMMY_RUN = "while warming up (dummy run)"
WARMUP_REQUEST = "at the warm-up request"
FIRST_REQUEST = "at the first request"  # after the log said ready (the smoke request, during `up`)


@dataclass(frozen=True)
class MemoryPhases:
    """Where in start-up an engine's memory failure happened. ``frames``: patterns of its
    traceback frames (or of the error text itself) naming the phase, most specific first (a CUDA
    graph captured inside the warm-up is the capture); ``progress``: the phase of each progress
    label, for a failure whose traceback names none. After the log's ready line: FIRST_REQUEST."""

    frames: tuple[tuple[re.Pattern[str], str], ...] = ()
    progress: tuple[tuple[str, str], ...] = ()  # (progress label, phase)

    @staticmethod
    def of(frames: Sequence[tuple[str, str]] = (), progress: Sequence[tuple[str, str]] = ()) -> MemoryPhases:
        return MemoryPhases(tuple((re.compile(r), phase) for r, phase in frames), tuple(progress))


def seconds_in_year(month: int, day: int, hh: int, mm: int, ss: int) -> float | None:
    """A log timestamp without its year as seconds since 1 January of a leap year (any 29 February
    fits): what ``EngineProfile.log_time`` returns, for differences within one start-up."""
    if not (1 <= month <= 12 and 1 <= day <= 31):
        return None
    return (_DAYS_BEFORE[month - 1] + day - 1) * 86400.0 + hh * 3600 + mm * 60 + ss


_DAYS_BEFORE = (0, 31, 60, 91, 121, 152, 182, 213, 244, 274, 305, 335)


@dataclass(frozen=True)
class LatencyMetrics:
    """Names of the latency histograms (seconds) an engine publishes on ``/metrics``, each a list of
    names to try in order (releases rename them). ``bench`` reads them around a point, so a
    non-streaming point still gets the engine's own TTFT and TPOT."""

    ttft: tuple[str, ...] = ()
    tpot: tuple[str, ...] = ()  # per request: (end - first token) / (tokens - 1)
    itl: tuple[str, ...] = ()  # per decode iteration of each request
    e2e: tuple[str, ...] = ()


@dataclass(frozen=True)
class ServingMetrics:
    """Names of the load and progress series an engine publishes on ``/metrics``, each a tuple of
    names to try in order (releases rename them). ``bench`` samples the gauges during a point and
    differences the counters around it; ``generate`` watches them while a job runs."""

    running: tuple[str, ...] = ()  # gauge: requests in the running batch
    queued: tuple[str, ...] = ()  # gauge: requests waiting for a slot
    kv_usage: tuple[str, ...] = ()  # gauge: KV-cache use, a fraction in [0, 1] (per series: never summed)
    generation_tokens: tuple[str, ...] = ()  # counter: output tokens generated
    prompt_tokens: tuple[str, ...] = ()  # counter: prompt tokens prefilled
    steps: tuple[str, ...] = ()  # counter: engine steps (prefill chunks included)
    preemptions: tuple[str, ...] = ()  # counter: requests preempted
    # prefix caching: prompt tokens looked up in the engine's prefix cache, and those found there (no prefill)
    prefix_looked_up: tuple[str, ...] = ()
    prefix_hits: tuple[str, ...] = ()
    # speculative decoding: vLLM's counters (drafts, draft tokens, accepted tokens) ...
    spec_drafts: tuple[str, ...] = ()
    spec_draft_tokens: tuple[str, ...] = ()
    spec_accepted_tokens: tuple[str, ...] = ()
    # ... or SGLang's gauges (mean accepted length per step, acceptance rate)
    spec_accept_length: tuple[str, ...] = ()
    spec_accept_rate: tuple[str, ...] = ()

    @classmethod
    def union(cls, *sets: ServingMetrics) -> ServingMetrics:
        """Field by field, the names of ``sets`` in their order, each once: what to read from a
        server that may be any of their engines."""
        return cls(**{f.name: tuple(dict.fromkeys(n for s in sets for n in getattr(s, f.name))) for f in fields(cls)})


@dataclass(frozen=True)
class TokenizeEndpoint:
    """How an engine's server counts the tokens of a text (``bench`` sizes its prompts with it):
    POST ``path`` with the text in ``text_field``, the ``fixed`` fields (no special tokens added) and,
    where the engine takes one, the model in ``model_field``. The count is in the answer as
    ``answer``: ``"count"`` (an integer field), ``"tokens"`` (the length of a list field) or
    ``"list"`` (the answer is the list of tokens). Two engines speaking the same shape compare
    equal (``label`` names it and is not compared), so a server of unknown engine is asked once."""

    label: str = field(compare=False)
    text_field: str
    path: str = "/tokenize"
    fixed: tuple[tuple[str, Any], ...] = ()
    model_field: str | None = None
    answer: Literal["count", "tokens", "list"] = "count"

    def body(self, text: str, model: str | None) -> dict[str, Any]:
        body: dict[str, Any] = {self.text_field: text, **dict(self.fixed)}
        if self.model_field and model:
            body[self.model_field] = model
        return body

    def count(self, answer: Any) -> int:
        """The token count in the decoded JSON ``answer``; ValueError when it is not of this shape."""
        if self.answer == "list":
            if isinstance(answer, list):
                return len(answer)
        elif isinstance(answer, dict):
            value = answer.get(self.answer)
            if self.answer == "count" and isinstance(value, int) and not isinstance(value, bool):
                return value
            if self.answer == "tokens" and isinstance(value, list):
                return len(value)
        raise ValueError(f"{self.path} answered without a token {self.answer} ({type(answer).__name__})")


@dataclass(frozen=True)
class Probe:
    """An HTTP readiness probe: GET each path in order; the first that answers 2xx proves readiness.
    A 404 on one path moves on to the next (older versions lack newer endpoints)."""

    paths: tuple[str, ...]
    timeout_s: float = 2.0


@dataclass(frozen=True)
class LaunchSpec:
    """The engine-facing view of one server of a fleet."""

    model: str
    port: int
    host: str = "127.0.0.1"
    gpus: tuple[int, ...] | None = None
    served_model_name: str | None = None
    extra_args: tuple[str, ...] = ()
    python: str = "python3"  # interpreter for engines started with `python -m`
    command: tuple[str, ...] = ()  # `openai` engine: the user's own command; else an override
    ready_path: str | None = None  # `openai` engine: the readiness path given by the user
    env: dict[str, str] = field(default_factory=dict)
    port_slot: bool = False  # the argv carries PORT_SLOT where the port goes (the host picks the port)

    @property
    def port_arg(self) -> str:
        """The port as an engine writes it into its argv (every engine: ``["--port", spec.port_arg]``)."""
        return PORT_SLOT if self.port_slot else str(self.port)


class EngineProfile:
    """Base class of engine profiles. Subclasses set the class attributes and override methods."""

    name: ClassVar[str]
    probe: ClassVar[Probe] = Probe(("/health", "/v1/models"))
    signatures: ClassVar[tuple[Signature, ...]] = ()
    # Lines that identify this engine in a log of unknown origin (for `diagnose --engine auto`).
    detect: ClassVar[tuple[re.Pattern[str], ...]] = ()
    # Lines after which the server allocates no more device memory while starting (KV cache and
    # CUDA graphs): a server sharing its GPU may then start profiling memory (`up` orders them).
    # Empty: readiness is the signal.
    memory_settled: ClassVar[tuple[re.Pattern[str], ...]] = ()
    # Which start-up phase a memory failure happened in (MemoryPhases): only the progress phases when empty.
    memory_phases: ClassVar[MemoryPhases] = MemoryPhases()
    # Engine-native flag names the hints and the fleet layer use (None where there is no such flag).
    memory_flag: ClassVar[str | None] = None
    supports_ignore_eos: ClassVar[bool] = False  # accepts `ignore_eos` in a completion request
    # How a running server of unknown engine shows it is this one (`bench` on a bare URL), checked in
    # the order of engines.registry.recognise: the ``owned_by`` of its /v1/models entries, keys of
    # its info document, a prefix of its Prometheus metric names.
    models_owner: ClassVar[str | None] = None
    info_keys: ClassVar[tuple[str, ...]] = ()
    metrics_prefix: ClassVar[str | None] = None
    # The engine-native flags that set facts servefleet depends on (served name, port, host, ...):
    # read from the user's args, so a vLLM user's own `--served-model-name` is what is requested.
    arg_table: ClassVar[ArgTable] = ArgTable()

    # ---- engine-native arguments ----------------------------------------------------------------
    def arg_table_for(self, command: Sequence[str] = ()) -> ArgTable:
        """The flag table for a launch ``command`` (one engine may run as different programs)."""
        return self.arg_table

    def native_args(self, args: Sequence[str], command: Sequence[str] = ()) -> NativeArgs:
        """What the engine-native ``args`` say about the facts servefleet needs; parsed once per
        distinct argument list."""
        return _read_args(self.arg_table_for(tuple(command)), tuple(str(a) for a in args))

    def launch_args(self, spec: LaunchSpec) -> NativeArgs:
        """The native args of a launch; a value that disagrees with the spec is an EngineError (the
        fleet loader reports such conflicts first, naming the fleet file's field)."""
        native = self.native_args(spec.extra_args, spec.command)
        for name, ours in (
            ("model", spec.model or None),
            ("port", spec.port),
            ("host", spec.host),
            ("served_model_name", spec.served_model_name),
        ):
            theirs = native.values.get(name)
            if ours is not None and theirs is not None and str(theirs) != str(ours):
                raise EngineError(
                    f"{native.spelled[name]!r} in args disagrees with {name} {ours!r}; set it in one place"
                )
        return native

    latency_metrics: ClassVar[LatencyMetrics | None] = None  # None: no latency histograms on /metrics
    serving_metrics: ClassVar[ServingMetrics] = ServingMetrics()  # empty: no load series on /metrics
    # The server's info document (GET, JSON object), newest path first: bench records it and reads
    # speculative acceptance from it, recognise() reads its keys. Empty: the engine serves none.
    info_paths: ClassVar[tuple[str, ...]] = ()
    tokenize: ClassVar[TokenizeEndpoint | None] = None  # None: the server cannot count tokens

    # ---- launch -------------------------------------------------------------------------------
    def build_argv(self, spec: LaunchSpec) -> list[str]:
        raise NotImplementedError

    def build_env(self, spec: LaunchSpec) -> dict[str, str]:
        """Environment added to the host's for this server (GPUs, engine switches)."""
        env = dict(spec.env)
        if spec.gpus is not None:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in spec.gpus)
        return env

    def served_name(self, spec: LaunchSpec) -> str:
        """The model name the server lists in /v1/models (used for identity checks and requests):
        the fleet file's ``served_model_name``, else the engine-native flag in the args, else the model."""
        return (
            spec.served_model_name or self.native_args(spec.extra_args, spec.command).served_model_name or spec.model
        )

    def probe_for(self, spec: LaunchSpec | None) -> Probe:
        return self.probe

    # ---- log ----------------------------------------------------------------------------------
    def log_time(self, line: str) -> float | None:
        """The engine's own timestamp on a display-text log line, as seconds on a clock whose
        differences are real (no date, time zone or year needed), or None (no timestamp)."""
        return None

    def capacity_from_line(self, line: str) -> Capacity | None:
        """Capacity facts found in one normalised log line, or None."""
        return None

    def serving_stall(self, text: str) -> str | None:
        """Whether the engine's own periodic statistics, in ``text`` (the end of a serving server's
        log), say it has stopped: nothing generated over its last interval with requests running.
        The words of that stall, or None (no such statistics, or progress). A live API process can
        go on answering the probe while the engine behind it is stuck or stopped."""
        return None

    # ---- launch facts -------------------------------------------------------------------------
    def model_config_path(self, argv: Sequence[str]) -> str | None:
        """The local model folder a launch ``argv`` loads, whose ``config.json`` holds facts the
        engine never prints (context length); None when there is none to read."""
        return None

    def capacity_from_launch(self, argv: Sequence[str], model_config: dict[str, Any] | None) -> Capacity:
        """Capacity facts fixed by the launch itself (its flags, the model's ``config.json``), for
        engines that neither print nor serve them. The lowest priority: the log and the info
        endpoint win."""
        return Capacity()

    # ---- endpoints ----------------------------------------------------------------------------
    async def capacity_from_server(self, client: HttpClient, base_url: str) -> Capacity:
        """Capacity facts read from the server's info endpoints (empty when it has none)."""
        return Capacity()

    def smoke_request(self, served_name: str) -> tuple[str, dict[str, Any]]:
        """A one-token request that proves the server answers: (path, JSON body)."""
        return "/v1/completions", {"model": served_name, "prompt": "Hello", "max_tokens": 1, "temperature": 0}


@lru_cache(maxsize=512)
def _read_args(table: ArgTable, args: tuple[str, ...]) -> NativeArgs:
    return table.read(args)
