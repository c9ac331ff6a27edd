"""The GPU drivers' shared stage runner (benchmarks/gpu/stages.py): order, budget, the stages that
always run, a blocking stage, failures recorded, checkpoints and the JSON record; and its command
form, which runs a shell driver's stages one process each."""

from __future__ import annotations

import json
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GPU = ROOT / "benchmarks" / "gpu"
sys.path.insert(0, str(GPU))

from stages import Blocked, Stage, main, run_stages, seconds_left, short_of  # noqa: E402 - after the sys.path.insert above


def _record(ran: list[str], name: str, result: object = None):  # type: ignore[no-untyped-def]
    def run(timings: list[dict]) -> object:
        ran.append(name)
        return result

    return run


def test_stages_run_in_order_and_an_error_does_not_stop_the_rest(tmp_path: Path) -> None:
    ran: list[str] = []

    def boom(_timings: list[dict]) -> None:
        ran.append("bench")
        raise ValueError("no server")

    said: list[str] = []
    timings, failed = run_stages(
        [
            Stage("up", _record(ran, "up")),
            Stage("bench", boom),
            Stage("plan", _record(ran, "plan", {"skipped": "no runs"})),
            Stage("down", _record(ran, "down"), always=True),
        ],
        say=said.append,
        summary_path=tmp_path / "stages.json",
    )
    assert ran == ["up", "bench", "plan", "down"] and failed
    assert [t["status"] for t in timings] == ["ok", "error: ValueError: no server", "skipped (no runs)", "ok"]
    assert any("Traceback" in line for line in said)
    assert json.loads((tmp_path / "stages.json").read_text()) == {"stages": timings, "failed": True}


def test_past_the_budget_only_the_always_stages_run() -> None:
    ran: list[str] = []
    timings, failed = run_stages(
        [
            Stage("up", _record(ran, "up"), estimate_s=1.0),
            Stage("bench", _record(ran, "bench"), estimate_s=1e6),
            Stage("down", _record(ran, "down"), estimate_s=1e6, always=True),
        ],
        say=lambda _s: None,
        budget_s=100.0,
    )
    assert ran == ["up", "down"] and not failed
    assert {t["stage"]: t["status"] for t in timings} == {"up": "ok", "bench": "skipped (budget)", "down": "ok"}


def test_what_is_left_of_the_budget_and_when_a_step_is_short_of_it() -> None:
    t0 = time.monotonic() - 10.0
    left = seconds_left(100.0, t0)
    assert left is not None and 85.0 < left <= 90.0
    assert seconds_left(None, t0) is None and seconds_left(0.0, t0) is None  # no budget
    assert short_of(100.0, t0, 50.0) is None  # 90 left, 50 needed
    short = short_of(100.0, t0, 95.0)
    assert short is not None and 85.0 < short <= 90.0
    assert short_of(None, t0, 1e9) is None


def test_a_blocked_stage_skips_what_needs_it_and_fails_the_run() -> None:
    ran: list[str] = []

    def setup(_timings: list[dict]) -> None:
        raise Blocked("not ready", "no engine")

    timings, failed = run_stages(
        [Stage("setup", setup), Stage("up", _record(ran, "up")), Stage("down", _record(ran, "down"), always=True)],
        say=lambda _s: None,
    )
    assert ran == ["down"] and failed
    assert [t["status"] for t in timings] == ["not ready", "skipped (no engine)", "ok"]
    # blocked with nothing after it that needs it: recorded, not a failure
    timings, failed = run_stages(
        [Stage("setup", setup), Stage("down", _record(ran, "down"), always=True)], say=lambda _s: None
    )
    assert not failed and timings[0]["status"] == "not ready"


def test_a_checkpoint_follows_every_stage_but_the_always_ones_and_sees_the_running_one() -> None:
    seen: list[list[tuple[str, str]]] = []

    def checkpoint(timings: list[dict]) -> None:
        seen.append([(t["stage"], t["status"]) for t in timings])

    def collect(timings: list[dict]) -> None:  # a stage that packs the timings itself
        seen.append([(t["stage"], t["status"]) for t in timings])

    run_stages(
        [Stage("up", lambda _t: None), Stage("bench", lambda _t: None), Stage("collect", collect, always=True)],
        say=lambda _s: None,
        checkpoint=checkpoint,
    )
    assert seen == [
        [("up", "ok")],
        [("up", "ok"), ("bench", "ok")],
        [("up", "ok"), ("bench", "ok"), ("collect", "ok")],
    ]


def _driver(tmp_path: Path, smoke_rc: int) -> Path:
    script = tmp_path / "driver.sh"
    script.write_text(
        textwrap.dedent(f"""\
        # a shell driver: `--stage NAME [--budget S]` runs one stage
        while [ $# -gt 0 ]; do case "$1" in --stage) s=$2; shift 2 ;; --budget) b=$2; shift 2 ;; *) shift ;; esac; done
        echo "$s ${{b:-none}}" >> {tmp_path}/ran.txt
        [ "$s" = smoke ] && exit {smoke_rc}
        [ "$s" = up ] && exit 3
        exit 0
        """)
    )
    return script


@pytest.mark.parametrize("smoke_rc", [0, 1])
def test_the_command_runs_a_shell_drivers_stages_one_process_each(tmp_path: Path, smoke_rc: int) -> None:
    script = _driver(tmp_path, smoke_rc)
    rc = main(
        [
            "--script",
            str(script),
            "--budget",
            "500",
            "--always",
            "down",
            "--blocking",
            "smoke",
            "--summary",
            str(tmp_path / "stages.json"),
            "--log",
            str(tmp_path / "driver.log"),
            "--checkpoint",
            f"echo cp >> {tmp_path}/ran.txt",
            "setup",
            "smoke",
            "up",
            "down",
        ]
    )
    lines = (tmp_path / "ran.txt").read_text().split()
    ran = [w for w in lines if not w.isdigit()]
    summary = json.loads((tmp_path / "stages.json").read_text())
    statuses = {t["stage"]: t["status"] for t in summary["stages"]}
    if smoke_rc == 0:
        assert rc == 0 and ran == ["setup", "cp", "smoke", "cp", "up", "cp", "down", "cp"]
        assert statuses == {
            "setup": "ok",
            "smoke": "ok",
            "up": "rc=3",
            "down": "ok",
        }  # a stage's rc is recorded, no failure
    else:  # a failed smoke: up is skipped, down still runs; the checkpoint still comes last
        assert rc == 1 and ran == ["setup", "cp", "smoke", "cp", "down", "cp"]
        assert statuses == {"setup": "ok", "smoke": "failed (rc=1)", "up": "skipped (smoke failed)", "down": "ok"}
    assert "== smoke" in (tmp_path / "driver.log").read_text()
    budgets = [int(w) for w in lines if w.isdigit()]
    assert budgets and all(0 < b <= 500 for b in budgets)  # each stage is told what is left of the budget


@pytest.mark.engine
@pytest.mark.timeout(180)
def test_cpu_rehearsal_of_the_sglang_driver_through_the_stage_runner(tmp_path: Path) -> None:
    """sglang_h200.sh on the CPU (sglang/rehearse/: the sim in SGLang's style): setup, up of plain and
    down, each stage a process of its own run by stages.py, with the results checkpointed to $OUT."""
    import os
    import socket
    import subprocess

    sgw, out = tmp_path / "sgw", tmp_path / "out"
    (sgw / "model").mkdir(parents=True)
    (sgw / "model" / "config.json").write_text("{}")  # the rehearsal's engine loads no model
    env = {
        **os.environ,
        "SGL_SETUP": str(GPU / "sglang" / "rehearse" / "setup.sh"),
        "SGW": str(sgw),
        "OUT": str(out),
        "SGL_PY": sys.executable,
        "SGL_IMPORT_CHECK": "0",
        "FAKE_LOAD": "1",
        "UP_SERVERS": "plain",
    }
    proc = subprocess.run(
        ["bash", str(GPU / "sglang_h200.sh"), "--budget", "150", "setup", "up", "down"],
        capture_output=True,
        text=True,
        env=env,
        timeout=170,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    stages = json.loads((out / "stages.json").read_text())
    assert [(t["stage"], t["status"]) for t in stages["stages"]] == [("setup", "ok"), ("up", "ok"), ("down", "ok")]
    assert {"sglang-results.tar.gz", "summary.txt", "driver.log", "stages.json"} <= {p.name for p in out.iterdir()}
    summary = (out / "summary.txt").read_text()
    assert "up plain: ready" in summary and "max_total_num_tokens=" in summary
    assert "== up: ok" in (out / "driver.log").read_text()
    with socket.socket() as sock:
        assert sock.connect_ex(("127.0.0.1", 31000)) != 0, "plain outlived down"
