"""A serving server whose API answers its probe while the engine behind it has stopped: ``status``
says ``hung`` from the engine's own statistics at the end of the current attempt's log
(``EngineProfile.serving_stall``; vLLM's ``Engine 000: Avg prompt throughput … Running: N reqs``).

The engine-side cases read real vLLM logs (the H200's EngineCore SIGSTOPped mid-job, and healthy
start-ups); the status cases run a vLLM-style sim server under the vLLM profile and write real
statistics lines into its log, which is what ``status`` reads.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import free_port
from servefleet.engines.registry import get_engine
from servefleet.fleet import Fleet, Liveness

FIXTURES = Path(__file__).parent / "fixtures" / "logs"
SIGSTOPPED = FIXTURES / "serving" / "vllm026_h200_enginecore_sigstop.log"
STALLED = (
    "(APIServer pid=589) INFO 12-01 14:52:29 [loggers.py:310] Engine 000: Avg prompt throughput: 0.0 tokens/s, "
    "Avg generation throughput: 0.0 tokens/s, Running: 256 reqs, Waiting: 26 reqs, GPU KV cache usage: 14.4%, "
    "Prefix cache hit rate: 0.0%"
)
MOVING = (
    STALLED.replace("14:52:29", "14:52:39")
    .replace("Avg prompt throughput: 0.0", "Avg prompt throughput: 19556.3")
    .replace("Avg generation throughput: 0.0", "Avg generation throughput: 18434.7")
)
IDLE = STALLED.replace("Running: 256 reqs, Waiting: 26 reqs", "Running: 0 reqs, Waiting: 0 reqs")


def test_vllm_names_the_stall_of_a_sigstopped_engine_core() -> None:
    stall = get_engine("vllm").serving_stall(SIGSTOPPED.read_text())
    assert stall is not None
    assert "engine 000" in stall and "12-01 14:52:29" in stall and "256 requests running and 26 waiting" in stall


@pytest.mark.parametrize("log", sorted((FIXTURES / "real").glob("vllm026_h200_ready_*.log")), ids=lambda p: p.name)
def test_healthy_vllm_logs_show_no_stall(log: Path) -> None:
    assert get_engine("vllm").serving_stall(log.read_text(errors="replace")) is None


def test_only_each_engines_last_statistics_line_counts() -> None:
    vllm = get_engine("vllm")
    assert vllm.serving_stall(f"{STALLED}\n{MOVING}\n") is None  # it moved again
    assert vllm.serving_stall(f"{MOVING}\n{STALLED}\n") is not None
    assert vllm.serving_stall(f"{MOVING}\n{IDLE}\n") is None  # nothing to do is not a stall
    rank1 = STALLED.replace("Engine 000", "Engine 001")
    got = vllm.serving_stall(f"{MOVING}\n{rank1}\n")  # data parallel: one stopped rank is named
    assert got is not None and got.startswith("engine 001")
    assert vllm.serving_stall("") is None


def test_engines_without_statistics_lines_never_call_a_stall() -> None:
    for name in ("sglang", "llamacpp", "transformers", "sim"):
        assert get_engine(name).serving_stall(f"{STALLED}\n") is None


def _vllm_style_sim_fleet(tmp_path: Path) -> Path:
    path = tmp_path / "fleet.toml"
    path.write_text(
        '[fleet]\nname = "st"\ntimeout = 30\nstall = 15\n\n'
        f'[defaults]\nengine = "vllm"\nmodel = "sim-m"\n'
        f"command = {json.dumps([sys.executable, '-m', 'servefleet.sim', '--style', 'vllm'])}\n"
        'args = ["--load-time", "0.2"]\n\n'
        f'[[servers]]\nname = "v"\nport = {free_port()}\n'
    )
    return path


async def test_status_says_hung_from_the_current_attempts_statistics(tmp_path: Path, fleets) -> None:
    fleet = fleets(Fleet.load(_vllm_style_sim_fleet(tmp_path)))
    assert (await fleet.up())["v"].state.value == "ready"
    log = Path(fleet.store.load("v").log_path)
    assert (await fleet.status())[0].state == Liveness.READY

    with log.open("a") as fh:  # what vLLM logs when its engine core stops under a live API
        fh.write(f"{MOVING}\n{STALLED}\n")
    st = (await fleet.status())[0]
    assert st.state == Liveness.HUNG
    assert "256 requests running" in (st.detail or "") and "servefleet restart v" in (st.detail or "")
    assert (await fleet.ready_endpoints()) == []  # a job does not start on it

    with log.open("a") as fh:
        fh.write(f"{MOVING}\n")
    assert (await fleet.status())[0].state == Liveness.READY

    with log.open("a") as fh:  # stopped again; then a restart: the old attempt's lines no longer count
        fh.write(f"{STALLED}\n")
    assert (await fleet.status())[0].state == Liveness.HUNG
    assert (await fleet.restart("v")).state.value == "ready"
    assert STALLED in log.read_text()  # still in the (appended) log, before the new attempt's marker
    assert (await fleet.status())[0].state == Liveness.READY


def test_status_exits_2_for_a_hung_server(tmp_path: Path) -> None:
    path = _vllm_style_sim_fleet(tmp_path)
    cli = [sys.executable, "-m", "servefleet.cli.main"]
    up = subprocess.run([*cli, "up", str(path), "--json"], capture_output=True, text=True, timeout=90)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        log = Path(json.loads(up.stdout)["servers"][0]["log_path"])
        with log.open("a") as fh:
            fh.write(f"{STALLED}\n")
        st = subprocess.run(
            [*cli, "status", "--fleet", str(path), "--json"], capture_output=True, text=True, timeout=60
        )
        assert st.returncode == 2, st.stdout + st.stderr
        server = json.loads(st.stdout)["servers"][0]
        assert server["state"] == "hung" and "engine 000" in server["detail"]
    finally:
        subprocess.run([*cli, "down", "--fleet", str(path), "--json"], capture_output=True, text=True, timeout=60)
