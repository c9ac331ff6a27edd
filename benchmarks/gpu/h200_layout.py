"""Where the H200 run keeps things, and the exact commands and fleet files it uses.

Pure and standard-library only: the driver must start on the GPU machine before servefleet's own
dependencies are installed there, and the test checks these files and command lines without a GPU.
One ``Layout`` is made per work folder and saved as ``layout.json`` in it, so stages run in separate
invocations (``setup`` in one device command, ``all`` in the next) agree on ports and paths.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

__all__ = [
    "Layout",
    "Settings",
    "FailureCase",
    "PORT_NAMES",
    "whole_toml",
    "NGRAM_CONFIG",
    "JOB_PROMPTS",
    "JOB_OUTPUT_TOKENS",
    "PLAN_GPUS",
    "free_port",
    "fleet_toml",
    "failures_toml",
    "failure_cases",
    "vllm_bench_argv",
    "servefleet_argv",
]

# The speculative configuration of the issue: n-gram prompt lookup, 4 draft tokens.
NGRAM_CONFIG = '{"method":"ngram","num_speculative_tokens":4,"prompt_lookup_max":4,"prompt_lookup_min":2}'
JOB_PROMPTS = 902_087  # the real job the plan is for
JOB_OUTPUT_TOKENS = 1_800  # mean output tokens per prompt of that job
PLAN_GPUS = "1,8,64"
SERVED_NAME = "sf-realistic"  # what /v1/models lists on both servers
# Environment the vLLM servers get on top of gpu-setup.sh's exports (flashinfer is not installed).
VLLM_ENV = {"VLLM_USE_FLASHINFER_SAMPLER": "0", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}


PORT_NAMES = ("plain", "ngram", "oom", "missing", "badarg", "sigkill", "portheld", "portup", "whole")


def free_port() -> int:
    """A port nobody listens on now (bind to port 0 on loopback and read what the kernel gave)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Settings:
    """What the run measures; the defaults fit the two-command device budget (README)."""

    rehearse: bool = False
    concurrency: str = "1,4,16,64,256"
    point_seconds: float = 6.0  # per bench point (closed loop; in-flight requests drain after it)
    input_len: int = 256
    output_len: int = 256
    vllm_bench_concurrency: str = "256,64"  # first = most important (the plateau point)
    vllm_bench_waves: int = 2  # requests per A/B point = max(waves x concurrency, 256)
    max_model_len: int = 4096
    max_num_seqs: int = 256
    gpu_util: float = 0.45
    stagger: str = "kv"  # kv | serial | none: when the second server starts
    up_timeout: float = 600.0
    failure_timeout: float = 300.0
    budget_s: float | None = None  # stop starting stages past this many seconds
    generate_prompts: int = 20_000  # the generate stage (a third command, not in `all`)
    generate_max_tokens: int = 256
    generate_kill_after: float = 60.0  # seconds into the job: SIGKILL the ngram server
    generate_timeout: float = 900.0
    # ---- run 2 (issue 17 step 2, h200_run2.py) ----
    whole_util: float = 0.90  # the server given the whole GPU
    whole_max_seqs: int = 1024
    nostream_concurrency: str = "256,512,1024"  # bench in the job's mode on the whole-GPU server
    nostream_point_seconds: float = 15.0
    whole_prompts: int = 20_000  # generate on the whole-GPU server (same workload as the bench)
    shared_point_seconds: float = 8.0  # bench-shared: one non-streaming point per shared server
    kill_prompts: int = 34_000  # generate over the shared fleet, ngram SIGKILLed after kill_after
    kill_after: float = 20.0
    hang_prompts: int = 25_000  # generate over the shared fleet, plain's EngineCore SIGSTOPped
    hang_stop_after: float = 25.0
    hang_after: float = 20.0  # generate --hang-after
    hang_gap: float = 5.0  # faults: seconds between ngram answering again and the SIGSTOP
    ab_stream_concurrency: str = "256,512"  # streaming A/B against vllm bench serve on the whole-GPU server
    ab_stream_waves: int = 8  # requests per A/B point = waves x concurrency
    ab_shared_concurrency: str = "256,64"  # the same A/B on the shared plain server (the first run's levels)
    ab_min_requests: int = 1024  # ... with at least this many requests per point
    faults_prompts: int = 28_000  # faults: one job, ngram SIGKILLed then plain's EngineCore SIGSTOPped
    rank_prompts: int = 6_000  # rank-jobs: one job per shared server, each alone, to check the plan's order
    # ---- several GPUs (issue 18, h200_multi.py) ----
    gpus: int | None = None  # servers / GPUs of the multi group (None: all visible; rehearsal 3)
    multi_concurrency: str = "512,1024"  # the non-streaming bench of one of them
    multi_point_seconds: float = 15.0
    multi_prompts_per_gpu: int = 12_000  # generate: the same job over 1, 2, 4 (8) servers (~2-3 min each)
    multi_kill_after: float = 40.0  # the fault job: SIGKILL the last server this many s in
    multi_fault_prompts: int = 0  # the fault job's prompts (0: twice the largest scale job's)

    def levels(self) -> list[int]:
        return [int(x) for x in self.concurrency.split(",") if x.strip()]

    def nostream_levels(self) -> list[int]:
        return [int(x) for x in self.nostream_concurrency.split(",") if x.strip()]

    def ab_stream_levels(self) -> list[int]:
        return [int(x) for x in self.ab_stream_concurrency.split(",") if x.strip()]

    def ab_shared_levels(self) -> list[int]:
        return [int(x) for x in self.ab_shared_concurrency.split(",") if x.strip()]

    def multi_levels(self) -> list[int]:
        return [int(x) for x in self.multi_concurrency.split(",") if x.strip()]

    def vllm_levels(self) -> list[int]:
        return [int(x) for x in self.vllm_bench_concurrency.split(",") if x.strip()]


@dataclass
class Layout:
    """Paths and ports of one run. ``work`` holds the model, fleet files and servefleet's state;
    ``results`` everything that is kept; ``out`` the few files that come back from the device."""

    repo: str
    work: str
    out: str
    python: str
    rehearse: bool
    ports: dict[str, int] = field(default_factory=dict)

    @classmethod
    def load_or_create(cls, repo: Path, work: Path, out: Path, rehearse: bool) -> Layout:
        path = work / "layout.json"
        if path.exists():
            data = json.loads(path.read_text())
            if data.get("rehearse") == rehearse:
                layout = cls(**{**data, "out": str(out), "python": sys.executable})
                for name in PORT_NAMES:  # a layout.json from an older driver: ports added since
                    layout.ports.setdefault(name, free_port())
                layout.save()
                return layout
        layout = cls(
            repo=str(repo),
            work=str(work),
            out=str(out),
            python=sys.executable,
            rehearse=rehearse,
            ports={name: free_port() for name in PORT_NAMES},
        )
        layout.save()
        return layout

    def save(self) -> None:
        Path(self.work).mkdir(parents=True, exist_ok=True)
        (Path(self.work) / "layout.json").write_text(json.dumps(asdict(self), indent=2) + "\n")

    # ---- paths ------------------------------------------------------------------------------
    def path(self, *parts: str) -> Path:
        return Path(self.work).joinpath(*parts)

    @property
    def results(self) -> Path:
        return self.path("results")

    @property
    def model(self) -> Path:
        return self.path("model")

    @property
    def main_fleet(self) -> Path:
        return self.path("fleet-main.toml")

    @property
    def whole_fleet(self) -> Path:
        return self.path("fleet-whole.toml")

    @property
    def failures_fleet(self) -> Path:
        return self.path("fleet-failures.toml")

    @property
    def port_fleet(self) -> Path:
        return self.path("fleet-portheld.toml")

    def log_of(self, fleet: str, server: str) -> Path:
        """servefleet's log of a fleet server (``state_dir`` is set in the fleet files)."""
        return self.path("state", fleet, "logs", f"{server}.log")

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.ports[name]}"


# ---- fleet files --------------------------------------------------------------------------------
def _toml(value: object) -> str:
    """A TOML value: JSON's string and number syntax is valid TOML; lists and inline tables by hand."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float, str)):
        return json.dumps(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"no TOML form for {value!r}")


def _render(header: dict[str, object], defaults: dict[str, object], servers: list[dict[str, object]]) -> str:
    lines = ["# Written by benchmarks/gpu/h200.py; regenerated on every run.", "", "[fleet]"]
    lines += [f"{k} = {_toml(v)}" for k, v in header.items()]
    lines += ["", "[defaults]"] + [f"{k} = {_toml(v)}" for k, v in defaults.items()]
    for server in servers:
        lines += ["", "[[servers]]"] + [f"{k} = {_toml(v)}" for k, v in server.items()]
    return "\n".join(lines) + "\n"


def _engine_defaults(layout: Layout, settings: Settings, model: str | None = None) -> dict[str, object]:
    """Engine, model and the arguments both main servers share. Rehearsal: the same vLLM engine
    profile, but the command is servefleet's sim printing vLLM's log (it takes the same
    --model/--host/--port/--served-model-name/--max-num-seqs/--max-model-len/--gpu-memory-utilization)."""
    out: dict[str, object] = {"engine": "vllm", "model": model or str(layout.model), "served_model_name": SERVED_NAME}
    if layout.rehearse:
        out["command"] = [layout.python, "-m", "servefleet.sim", "--style", "vllm"]
    else:
        out["python"] = layout.python
        out["env"] = dict(VLLM_ENV)
    return out


def _sim_timing() -> list[str]:
    """Rehearsal only: a start-up of a few seconds and a batch-friendly decode model."""
    return ["--load-time", "3", "--decode-ms", "8", "--decode-ms-per-running", "0.05"]


def fleet_toml(layout: Layout, settings: Settings) -> str:
    """The main fleet: plain and n-gram speculative vLLM sharing GPU 0 at --gpu-memory-utilization 0.45 each."""
    shared = [
        "--gpu-memory-utilization",
        str(settings.gpu_util),
        "--max-model-len",
        str(settings.max_model_len),
        "--max-num-seqs",
        str(settings.max_num_seqs),
    ]
    if layout.rehearse:
        shared += _sim_timing()
        ngram = ["--tokens-per-step", "3", "--speculative-algorithm", "ngram"]
    else:
        ngram = ["--speculative-config", NGRAM_CONFIG]
    # gpus in the rehearsal too: servefleet orders servers that share a GPU by the fleet file, so the
    # rehearsal exercises that ordering (the sim ignores CUDA_VISIBLE_DEVICES).
    defaults = {**_engine_defaults(layout, settings), "args": shared, "gpus": [0]}
    header = {
        "name": "main",
        "state_dir": str(layout.path("state", "main")),
        "timeout": settings.up_timeout,
        "stall": 240,
        "smoke": True,
    }
    servers = [
        {"name": "plain", "port": layout.ports["plain"]},
        {"name": "ngram", "port": layout.ports["ngram"], "args": ngram},
    ]
    return _render(header, defaults, servers)


def whole_toml(layout: Layout, settings: Settings) -> str:
    """Run 2's fleet of one plain vLLM server given the whole of GPU 0 (0.90, up to 1,024 running)."""
    args = [
        "--gpu-memory-utilization",
        str(settings.whole_util),
        "--max-model-len",
        str(settings.max_model_len),
        "--max-num-seqs",
        str(settings.whole_max_seqs),
    ]
    if layout.rehearse:
        args += _sim_timing()
    defaults = {**_engine_defaults(layout, settings), "args": args}
    if not layout.rehearse:
        defaults["gpus"] = [0]
    header = {
        "name": "whole",
        "state_dir": str(layout.path("state", "whole")),
        "timeout": settings.up_timeout,
        "stall": 240,
        "smoke": True,
    }
    return _render(header, defaults, [{"name": "whole", "port": layout.ports["whole"]}])


@dataclass(frozen=True)
class FailureCase:
    """One real failure: how it is provoked and which category servefleet must name."""

    name: str
    expected: str  # servefleet category
    how: str  # in words, for the report
    via: str  # "up" (fleet server), "wait" (launched by hand), "up-blocked"
    args: tuple[str, ...] = ()
    model: str | None = None
    fixture: str | None = None  # scenario part of the kept log's name (None: no log)

    def fixture_name(self, rehearse: bool) -> str | None:
        """tests/fixtures/logs/real naming: engine+version, machine, scenario."""
        if self.fixture is None:
            return None
        return f"{'sim_rehearsal' if rehearse else 'vllm026_h200'}_{self.fixture}.log"


def failure_cases(layout: Layout) -> list[FailureCase]:
    """The five failures of the issue, plus servefleet's own refusal to launch onto a held port."""
    missing = str(layout.path("no-such-model"))
    eager = () if layout.rehearse else ("--enforce-eager",)  # fails or is killed sooner: no torch.compile
    sim = layout.rehearse
    return [
        FailureCase(
            "oom",
            "gpu_oom",
            "--gpu-memory-utilization 0.01: too little memory for the KV cache",
            "up",
            ("--gpu-memory-utilization", "0.01", *eager) + (("--fail-at-startup", "gpu_oom") if sim else ()),
            fixture="gpu_util_too_low",
        ),
        FailureCase(
            "missing",
            "model_not_found",
            f"--model {missing} (no such folder)",
            "up",
            ("--gpu-memory-utilization", "0.05") + (("--fail-at-startup", "model_not_found") if sim else ()),
            model=missing,
            fixture="missing_model",
        ),
        FailureCase(
            "badarg",
            "config_error",
            "--gpu-memory-utilization abc (not a number)",
            "up",
            ("--gpu-memory-utilization", "abc"),
            fixture="bad_argument",
        ),
        FailureCase(
            "sigkill",
            "killed",
            "SIGKILL to the server's process group while it loads",
            "up",
            ("--gpu-memory-utilization", "0.05", *eager) + (("--load-time", "30") if sim else ()),
            fixture="killed_loading",
        ),
        FailureCase(
            "portheld",
            "port_in_use",
            "vLLM started by hand on a port another process listens on",
            "wait",
            ("--gpu-memory-utilization", "0.05"),
            fixture="port_in_use",
        ),
        FailureCase(
            "portup",
            "port_in_use",
            "servefleet up onto a port another process listens on",
            "up-blocked",
            ("--gpu-memory-utilization", "0.05"),
        ),
    ]


def failures_toml(layout: Layout, settings: Settings, cases: list[FailureCase]) -> str:
    """The failure fleet: the ``up`` cases, one server each (servefleet starts them one after another: one GPU)."""
    defaults = _engine_defaults(layout, settings)
    defaults["args"] = ["--max-model-len", str(settings.max_model_len)]
    if not layout.rehearse:
        defaults["gpus"] = [0]
    header = {
        "name": "failures",
        "state_dir": str(layout.path("state", "failures")),
        "timeout": settings.failure_timeout,
        "stall": 180,
        "smoke": True,
    }
    servers = []
    for case in cases:
        if case.via != "up":
            continue
        server: dict[str, object] = {"name": case.name, "port": layout.ports[case.name], "args": list(case.args)}
        if case.model:
            server["model"] = case.model
        servers.append(server)
    return _render(header, defaults, servers)


def port_toml(layout: Layout, settings: Settings, case: FailureCase) -> str:
    """A one-server fleet whose port the driver holds: ``up`` must refuse to launch and name the holder."""
    defaults = {**_engine_defaults(layout, settings), "args": list(case.args)}
    header = {"name": "portheld", "state_dir": str(layout.path("state", "portheld")), "timeout": 60, "stall": 60}
    return _render(header, defaults, [{"name": case.name, "port": layout.ports[case.name]}])


def manual_argv(layout: Layout, case: FailureCase) -> list[str]:
    """The command a person would type to start the server by hand (the ``wait`` case)."""
    port = str(layout.ports[case.name])
    if layout.rehearse:
        head = [layout.python, "-m", "servefleet.sim", "--style", "vllm"]
    else:
        head = [layout.python, "-m", "vllm.entrypoints.openai.api_server"]
    return [
        *head,
        "--model",
        str(layout.model),
        "--served-model-name",
        SERVED_NAME,
        "--host",
        "127.0.0.1",
        "--port",
        port,
        *case.args,
    ]


# ---- other tools' command lines ---------------------------------------------------------------------
def servefleet_argv(layout: Layout, *args: str) -> list[str]:
    """servefleet through the interpreter running the driver (no reliance on PATH or console scripts)."""
    return [layout.python, "-m", "servefleet.cli.main", *args]


def vllm_bench_argv(
    layout: Layout,
    settings: Settings,
    concurrency: int,
    prompts: int,
    result_dir: Path,
    filename: str,
    server: str = "plain",
) -> list[str]:
    """``vllm bench serve`` (vLLM 0.26 flags) against the plain server: the same random 256/256
    workload, ignore_eos, greedy, closed loop at ``concurrency``; the JSON goes to result_dir/filename.
    Module form, because /tmp/site has no ``vllm`` console script."""
    return [
        layout.python,
        "-m",
        "vllm.entrypoints.cli.main",
        "bench",
        "serve",
        "--backend",
        "openai",
        "--base-url",
        layout.url(server),
        "--endpoint",
        "/v1/completions",
        "--model",
        SERVED_NAME,
        "--tokenizer",
        str(layout.model),
        "--dataset-name",
        "random",
        "--random-input-len",
        str(settings.input_len),
        "--random-output-len",
        str(settings.output_len),
        "--num-prompts",
        str(prompts),
        "--max-concurrency",
        str(concurrency),
        "--ignore-eos",
        "--temperature",
        "0",
        "--percentile-metrics",
        "ttft,tpot,itl,e2el",
        "--metric-percentiles",
        "50,90,99",
        "--disable-tqdm",
        "--save-result",
        "--result-dir",
        str(result_dir),
        "--result-filename",
        filename,
    ]


def child_env(layout: Layout) -> dict[str, str]:
    """The environment of every command the driver runs: the caller's (gpu-setup.sh's exports), with
    the carried servefleet wheels and, when the editable install did not work, the source tree first."""
    env = dict(os.environ)
    front = []
    if Path("/tmp/sf-site").is_dir() and not layout.rehearse:
        front.append("/tmp/sf-site")
    if Path(layout.work, "use-src-path").exists():
        front.append(str(Path(layout.repo) / "src"))
    if front:
        env["PYTHONPATH"] = os.pathsep.join(front + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env
