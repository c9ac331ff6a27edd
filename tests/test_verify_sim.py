"""wait_for_server against the simulated engine (real processes, the engines' real failure texts),
launched detached exactly as the fleet layer launches servers, with the real `sim` profile."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest

from conftest import async_wait_until, free_port
from servefleet.catalog import Category, State
from servefleet.engines.registry import get_engine
from servefleet.hosts.local import LocalHost
from servefleet.verify.waiter import WaitTarget, wait_for_server

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def sim(tmp_path: Path):
    pgids: list[int] = []
    host = LocalHost()

    async def start(style: str, *args: str, engine: str | None = "sim") -> WaitTarget:
        port = free_port()
        log, status = tmp_path / f"{port}.log", tmp_path / f"{port}.status"
        argv = [
            sys.executable,
            "-m",
            "servefleet.sim",
            "--style",
            style,
            "--port",
            str(port),
            "--model",
            "sim-model",
            *args,
        ]
        pgid = await host.spawn_detached(argv, log_path=str(log), status_path=str(status))
        pgids.append(pgid)
        return WaitTarget(
            base_url=f"http://127.0.0.1:{port}",
            engine=get_engine(engine) if engine else None,
            host=host,
            log_path=str(log),
            pgid=pgid,
            status_path=str(status),
            served_model="sim-model",
        )

    yield start
    for pgid in pgids:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.parametrize("style", ["sglang", "vllm"])
async def test_sim_ready_with_capacity(sim, style: str) -> None:
    target = await sim(style, "--load-time", "0.5", "--max-running", "12", "--kv-tokens", "50000")
    verdict = await wait_for_server(target, timeout_s=60, stall_s=30)
    assert verdict.state is State.READY, verdict
    assert verdict.capacity.max_running_requests == 12
    assert verdict.capacity.kv_cache_tokens == 50000


@pytest.mark.parametrize(
    ("style", "category"),
    [
        ("sglang", "gpu_oom"),
        ("vllm", "config_error"),
        ("sglang", "killed"),
    ],
)
async def test_sim_startup_failure_category(sim, style: str, category: str) -> None:
    target = await sim(style, "--load-time", "0.3", "--fail-at-startup", category)
    verdict = await wait_for_server(target, timeout_s=60, stall_s=30)
    assert verdict.state is State.FAILED and verdict.category == Category(category), verdict
    assert verdict.evidence is not None and verdict.hint


async def test_sim_engine_auto_detected(sim) -> None:
    target = await sim("vllm", "--load-time", "0.3", "--fail-at-startup", "model_not_found", engine=None)
    verdict = await wait_for_server(target, timeout_s=60, stall_s=30)
    assert verdict.state is State.FAILED and verdict.category is Category.MODEL_NOT_FOUND
    assert verdict.engine == "vllm"


async def test_sim_fail_after_ready_is_not_ready(sim) -> None:
    target = await sim("sglang", "--load-time", "0.3", "--fail-after-ready", "gpu_oom")
    verdict = await wait_for_server(target, timeout_s=60, stall_s=30)
    assert verdict.state is State.FAILED and verdict.category is Category.GPU_OOM, verdict


async def test_sim_die_on_first_request_caught_by_smoke(sim) -> None:
    target = await sim("sglang", "--load-time", "0.3", "--die-on-first-request")
    verdict = await wait_for_server(target, timeout_s=60, stall_s=30)
    assert verdict.state is State.FAILED, verdict


async def test_sim_hang_loading_stalls(sim) -> None:
    target = await sim("sglang", "--load-time", "2", "--hang-loading")  # prints 40% of 2 s, then silence
    # The sim's imports can take seconds on a busy machine: start the stall clock once it logs.
    await async_wait_until(lambda: _nonempty(Path(target.log_path)), timeout=60, what="sim log")
    verdict = await wait_for_server(target, timeout_s=60, stall_s=1.5)
    assert verdict.state is State.STALLED, verdict
    assert verdict.progress is not None and "no log output" in verdict.message


async def _nonempty(path: Path) -> bool:
    return path.exists() and path.stat().st_size > 0
