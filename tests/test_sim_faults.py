"""Process-level faults of the sim, as real subprocesses: every start-up failure category prints its
engine's text and exits as that engine does; a real port conflict; hang; fail after ready; crash after
N requests; death on the first request; graceful SIGTERM with child processes.

All processes start at once in one fixture (imports cost seconds on a busy 2-core machine), then
each test checks its own."""

from __future__ import annotations

import signal
import socket
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest

from conftest import SimProcess, wait_until
from servefleet.catalog import Category
from servefleet.sim.cli_args import parse_config
from servefleet.sim.failures import startup_failure
from servefleet.sim.script import transcript

pytestmark = pytest.mark.timeout(180)

FAST = ("--load-time", "0.3")
# The exit paths, one process each (every category's text and status is checked in-process, from the
# same Failure objects, in test_sim_signatures.py): a SGLang scheduler failure (it SIGKILLs its own
# tree), a SGLang launcher failure (1), an argparse error (2), a vLLM engine-core failure (1, here
# moved by --fail-delay), the OOM killer (SIGKILL, no text).
CATEGORY_RUNS = [
    ("sglang", Category.GPU_OOM),
    ("sglang", Category.MODEL_NOT_FOUND),
    ("vllm", Category.CONFIG_ERROR),
    ("vllm", Category.CUDA_DRIVER),
    ("sglang", Category.KILLED),
]
HANG_ARGS = ("--style", "sglang", "--load-time", "0.5", "--hang-loading")
SGLANG_MAIN_PROCESS = {Category.MODEL_NOT_FOUND, Category.PORT_IN_USE, Category.IMPORT_ERROR}


def _expected_status(style: str, category: Category) -> int:
    if category is Category.CONFIG_ERROR:
        return 2
    if category is Category.KILLED:
        return -signal.SIGKILL
    if style == "sglang" and category not in SGLANG_MAIN_PROCESS:
        return -signal.SIGKILL
    return 1


def _post(url: str, body: bytes = b'{"prompt": "hi", "max_tokens": 2, "ignore_eos": true}') -> int:
    req = urllib.request.Request(url + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return resp.status


@pytest.fixture(scope="module")
def procs(tmp_path_factory: pytest.TempPathFactory):
    folder: Path = tmp_path_factory.mktemp("simfaults")
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen(1)
    taken = held.getsockname()[1]
    specs: dict[str, tuple[str, ...]] = {
        f"{s}-{c.value}": ("--style", s, *FAST, "--fail-at-startup", c.value, "--tp", "2") for s, c in CATEGORY_RUNS
    }
    specs["vllm-cuda_driver"] = (
        "--style",
        "vllm",
        "--load-time",
        "30",
        "--fail-delay",
        "0.5",
        "--fail-at-startup",
        "cuda_driver",
        "--tp",
        "2",
    )
    specs.update(
        {
            "conflict-sglang": ("--style", "sglang", *FAST),
            "conflict-vllm": ("--style", "vllm", *FAST),
            "hang": HANG_ARGS,
            "after-ready-sglang": ("--style", "sglang", *FAST, "--fail-after-ready", "gpu_oom", "--fail-delay", "0.3"),
            "after-ready-vllm": ("--style", "vllm", *FAST, "--fail-after-ready", "nccl_or_distributed"),
            "crash-after": ("--style", "sglang", *FAST, "--crash-after", "3", "--decode-ms", "1"),
            "first-request-vllm": ("--style", "vllm", *FAST, "--die-on-first-request"),
            "sigterm": ("--style", "vllm", *FAST, "--children", "2"),
        }
    )
    out: dict[str, SimProcess] = {}
    try:
        for name, args in specs.items():
            port = taken if name.startswith("conflict") else None
            out[name] = SimProcess(*args, log_path=folder / f"{name}.log", port=port).start()
        yield out
    finally:
        held.close()
        for proc in out.values():
            proc.stop()


@pytest.mark.parametrize(("style", "category"), CATEGORY_RUNS, ids=[f"{s}-{c.value}" for s, c in CATEGORY_RUNS])
def test_startup_failure_prints_engine_text_and_exits(procs, style: str, category: Category) -> None:
    proc = procs[f"{style}-{category.value}"]
    status = proc.wait_exit(timeout=90)
    log = proc.log()
    assert status == _expected_status(style, category), log[-2000:]
    failure = startup_failure(parse_config(["--style", style, "--tp", "2"]), category, proc.port)
    # every message of the failure text is printed, in order (each found by its last line: the exception)
    lasts = [[p for p in line.text.split("\n") if p.strip()][-1] for line in failure.lines]
    positions = [log.find(last) for last in lasts]
    assert -1 not in positions and positions == sorted(positions), (lasts, log[-2000:])
    if category is Category.KILLED:
        assert "Traceback" not in log
    if category is Category.CONFIG_ERROR:
        assert "usage: " in log and ": error: " in log
    if style == "sglang" and _expected_status(style, category) == -signal.SIGKILL and category is not Category.KILLED:
        assert log.count("Scheduler hit an exception") in (0, 2)  # once per TP rank (--tp 2)
        assert log.rstrip().endswith("Received sigquit from a child process. It usually means the child failed.")
    if style == "vllm" and category in (
        Category.GPU_OOM,
        Category.NCCL_OR_DISTRIBUTED,
        Category.CUDA_DRIVER,
        Category.OTHER,
    ):
        assert "RuntimeError: Engine core initialization failed. See root cause above." in log.splitlines()[-1]


def test_real_port_conflict_prints_each_engines_text(procs) -> None:
    sglang, vllm = procs["conflict-sglang"], procs["conflict-vllm"]
    assert vllm.wait_exit(timeout=90) == 1 and sglang.wait_exit(timeout=90) == 1
    assert "OSError: [Errno 98] Address already in use" in vllm.log()
    assert "Loading safetensors" not in vllm.log()  # vLLM binds before loading anything
    text = sglang.log()
    # SGLang's uvicorn binds after loading: the capacity line and "startup complete" come before the error.
    assert (
        text.index("max_total_num_tokens=")
        < text.index("Application startup complete.")
        < text.index(
            f"[Errno 98] error while attempting to bind on address ('127.0.0.1', {sglang.port}): address already in use"
        )
    )


def test_hang_loading_stays_alive_and_silent(procs) -> None:
    proc = procs["hang"]
    # the last line printed before the hang point, whatever it is (waiting for an earlier one raced the rest)
    last = transcript(parse_config(list(HANG_ARGS))).rstrip().splitlines()[-1]
    assert "checkpoint shards" in last  # the hang point is inside weight loading
    marker = last.split("|")[0].strip()  # the percentage part, free of the timestamps and rates that vary
    wait_until(lambda: marker in proc.log(), timeout=90, what=f"the last line before the hang ({marker!r})")
    time_limit = 0.8  # the observation window: nothing may be printed in it, and the server stays up, not ready
    size = proc.log_path.stat().st_size
    deadline = time.monotonic() + time_limit
    while time.monotonic() < deadline:
        assert proc.proc.poll() is None and proc.log_path.stat().st_size == size
        assert proc.health() == 503
    assert "Load weight end" not in proc.log()


def test_fail_after_ready_never_becomes_healthy(procs) -> None:
    sglang, vllm = procs["after-ready-sglang"], procs["after-ready-vllm"]
    wait_until(lambda: "Uvicorn running on" in sglang.log(), timeout=90, what="uvicorn line")
    assert sglang.health() in (503, None)  # warm-up has not passed (or the process is already gone)
    assert sglang.wait_exit(timeout=30) == -signal.SIGKILL
    text = sglang.log()
    assert text.index("Uvicorn running on") < text.index("torch.OutOfMemoryError: CUDA out of memory.")
    assert "ready to roll" not in text
    assert vllm.wait_exit(timeout=90) == 0  # the API server shuts down cleanly after its engine died
    text = vllm.log()
    assert (
        text.index("Application startup complete.")
        < text.index("RuntimeError: NCCL error")
        < text.index("EngineDeadError")
    )


def test_fail_delay_moves_the_failure(procs) -> None:
    proc = procs["vllm-cuda_driver"]
    t0 = time.monotonic()
    assert proc.wait_exit(timeout=60) == 1  # long before its 30 s load time
    assert time.monotonic() - t0 < 30
    text = proc.log()
    assert "Automatically detected platform cuda." in text and "GPU KV cache size" not in text
    assert "Error 803: system has unsupported display driver / cuda driver combination" in text


def test_crash_after_n_requests(procs) -> None:
    proc = procs["crash-after"].wait_ready(timeout=90)
    assert [_post(proc.url) for _ in range(3)] == [200, 200, 200]  # the third answer arrives, then the crash
    assert proc.wait_exit(timeout=30) == 1
    assert "Traceback" not in proc.log()  # abrupt: no text
    with pytest.raises(OSError):
        _post(proc.url)


def test_die_on_first_request(procs) -> None:
    proc = procs["first-request-vllm"].wait_ready(timeout=90)
    assert proc.health() == 200
    with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
        _post(proc.url)
    assert proc.wait_exit(timeout=30) == 0  # vLLM's API server shuts down "cleanly" after its engine died
    text = proc.log()
    assert text.index("Application startup complete.") < text.index(
        "torch.AcceleratorError: CUDA error: an illegal memory access"
    )
    assert "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue." in text


def test_sigterm_is_graceful_and_takes_children(procs) -> None:
    proc = procs["sigterm"].wait_ready(timeout=90)
    children = psutil.Process(proc.proc.pid).children()
    assert len(children) == 2 and all(c.is_running() for c in children)
    assert f"(EngineCore_DP0 pid={children[0].pid})" in proc.log()  # the engine core is a real process
    proc.proc.send_signal(signal.SIGTERM)
    assert proc.wait_exit(timeout=30) == 0
    assert "Application shutdown complete." in proc.log()
    gone, alive = psutil.wait_procs(children, timeout=10)
    assert not alive


def test_port_is_free_after_exit(procs) -> None:
    proc = procs["sigterm"]
    proc.wait_exit(timeout=30)
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", proc.port))  # raises if anything still holds it
