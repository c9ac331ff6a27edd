"""`servefleet diagnose` and `servefleet wait` through a real subprocess: exit codes, JSON, words."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import free_port, wait_until
from test_verify_support import toy_server_argv

pytestmark = pytest.mark.timeout(90)

OOM = "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static."
SGLANG_OOM_LOG = (
    "[2026-11-30 10:00:00] server_args=ServerArgs(model_path='m', port=30000)\n"
    "[2026-11-30 10:00:01 TP0] Load weight begin. avail mem=70.00 GB\n"
    "[2026-11-30 10:00:02 TP0] Traceback (most recent call last):\n"
    f"[2026-11-30 10:00:02 TP0] {OOM}\n"
    "[2026-11-30 10:00:02] Received sigquit from a child process. It usually means the child failed.\n"
)


def servefleet(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """The real console entry point in a subprocess (exit codes and streams as a script sees them)."""
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    return subprocess.run(
        [sys.executable, "-m", "servefleet.cli.main", *args], capture_output=True, text=True, timeout=timeout, env=env
    )


def servefleet_inproc(*args: str) -> subprocess.CompletedProcess[str]:
    """The same command in this process (typer's runner): much faster than a fresh interpreter."""
    from typer.testing import CliRunner

    from servefleet.cli.main import app

    res = CliRunner(env={"COLUMNS": "200", "NO_COLOR": "1"}).invoke(app, list(args))
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        raise res.exception
    return subprocess.CompletedProcess(list(args), res.exit_code, res.stdout, res.stderr)


def test_diagnose_failed_log_json(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text(SGLANG_OOM_LOG)
    res = servefleet("diagnose", str(log), "--json")
    assert res.returncode == 1, res.stderr
    out = json.loads(res.stdout)
    assert {"state", "category", "engine", "evidence", "hint", "capacity"} <= set(out)
    assert out["state"] == "failed" and out["category"] == "gpu_oom" and out["engine"] == "sglang"
    assert out["evidence"] == {"line_no": 4, "text": f"[2026-11-30 10:00:02 TP0] {OOM}"}
    assert "--mem-fraction-static" in out["hint"]


def test_diagnose_human_output_shows_evidence_excerpt_and_hint(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text(SGLANG_OOM_LOG)
    res = servefleet_inproc("diagnose", str(log))
    assert res.returncode == 1
    assert "failed: gpu_oom" in res.stdout
    assert "evidence, line 4:" in res.stdout and "hint:" in res.stdout
    assert "> 4 │" in res.stdout  # the excerpt marks the evidence line


def test_diagnose_loading_and_ready_exit_zero(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text("[2026-11-30 10:00:01 TP0] Load weight begin. avail mem=70.00 GB\n")
    res = servefleet_inproc("diagnose", str(log), "--json", "--engine", "sglang")
    assert res.returncode == 0 and json.loads(res.stdout)["state"] == "loading"
    log.write_text("[2026-11-30 10:00:09] The server is fired up and ready to roll!\n")
    res = servefleet_inproc("diagnose", str(log), "--json")
    assert res.returncode == 0 and json.loads(res.stdout)["state"] == "ready"


def test_diagnose_missing_and_empty_files(tmp_path: Path) -> None:
    res = servefleet_inproc("diagnose", str(tmp_path / "nope.log"))
    assert res.returncode == 3
    assert f"log file {tmp_path / 'nope.log'} does not exist (is the path right?)" in res.stderr.replace("\n", "")
    empty = tmp_path / "empty.log"
    empty.write_text("")
    res = servefleet_inproc("diagnose", str(empty), "--json")
    assert res.returncode == 0
    assert json.loads(res.stdout)["state"] == "loading" and "empty" in json.loads(res.stdout)["message"]


def test_diagnose_unknown_engine_is_a_usage_error(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text("x\n")
    res = servefleet_inproc("diagnose", str(log), "--engine", "nosuch", "--json")
    assert res.returncode == 3 and "unknown engine" in json.loads(res.stdout)["error"]["message"]


@pytest.fixture
def toy(tmp_path: Path):
    """Start a toy server detached (own process group); yields (port, pid, log path)."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(mode: str) -> tuple[int, int, Path]:
        port = free_port()
        log = tmp_path / f"{mode}.log"
        fh = log.open("wb")
        proc = subprocess.Popen(
            toy_server_argv(tmp_path, mode, port), stdout=fh, stderr=subprocess.STDOUT, start_new_session=True
        )
        procs.append(proc)
        return port, proc.pid, log

    yield start
    for proc in procs:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def test_wait_ready_json(toy) -> None:
    port, pid, log = toy("ready")
    res = servefleet(
        "wait", "--url", f"http://127.0.0.1:{port}", "--log", str(log), "--pid", str(pid), "--timeout", "30", "--json"
    )
    assert res.returncode == 0, res.stdout + res.stderr
    out = json.loads(res.stdout)
    assert out["state"] == "ready" and out["category"] is None


def test_wait_failed_exit_one(toy) -> None:
    port, pid, log = toy("fatal_exit")
    res = servefleet(
        "wait",
        "--url",
        f"http://127.0.0.1:{port}",
        "--log",
        str(log),
        "--pid",
        str(pid),
        "--engine",
        "sglang",
        "--timeout",
        "30",
    )
    assert res.returncode == 1, res.stdout + res.stderr
    assert "failed: gpu_oom" in res.stdout and "evidence, line 5:" in res.stdout


def test_wait_stalled_exit_two(toy) -> None:
    port, pid, log = toy("hang")
    wait_until(lambda: log.exists() and log.stat().st_size > 0, what="toy log")
    res = servefleet_inproc(
        "wait", "--url", f"http://127.0.0.1:{port}", "--log", str(log), "--pid", str(pid), "--stall", "1", "--json"
    )
    assert res.returncode == 2
    assert json.loads(res.stdout)["state"] == "stalled"
    res = servefleet_inproc(
        "wait", "--url", f"http://127.0.0.1:{port}", "--log", str(log), "--pid", str(pid), "--stall", "1"
    )
    assert res.returncode == 2
    assert "loading · loading weights" in res.stderr  # plain status lines when not on a terminal
    assert "stalled" in res.stdout and "no change of the HTTP probe for 1s" in res.stdout.replace("\n", "")


def test_wait_missing_log_says_so(tmp_path: Path) -> None:
    missing = tmp_path / "x.log"
    res = servefleet_inproc(
        "wait", "--url", f"http://127.0.0.1:{free_port()}", "--log", str(missing), "--stall", "1", "--timeout", "5"
    )
    assert res.returncode == 2
    said = f"log file {missing} does not exist (is the path right?)"
    assert said in res.stderr.replace("\n", "")
    assert said in res.stdout.replace("\n", "")


def test_wait_usage_errors() -> None:
    res = servefleet_inproc("wait", "--url", "localhost:1234", "--json")
    assert res.returncode == 3 and "not an http(s) URL" in json.loads(res.stdout)["error"]["message"]
    res = servefleet_inproc("wait", "--url", "http://127.0.0.1:1", "--pid", "999999999")
    assert res.returncode == 3 and "no process with pid" in res.stderr


def test_wait_pid_of_a_shell_child_killed_while_loading_is_killed(tmp_path: Path) -> None:
    """Issue 12, item 5: a server started as a plain child of a live shell shares the shell's process
    group, which lives on after the server is SIGKILLed. `wait --pid` used to watch only the group
    and said `stalled` at the timeout; the pid's death is the server's death."""
    port = free_port()
    log = tmp_path / "sim.log"
    sim = shlex.join(
        [sys.executable, "-m", "servefleet.sim", "--style", "vllm", "--port", str(port), "--load-time", "120"]
    )
    # Only the server's output goes to the log (the shell's own "Killed" report would be evidence);
    # the shell lives on after it, like a terminal's, and so does its process group.
    shell = subprocess.Popen(
        ["bash", "-c", f'{sim} > {shlex.quote(str(log))} 2>&1 & echo "$!"; wait; exec sleep 300'],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        server = int(shell.stdout.readline())
        assert os.getpgid(server) == shell.pid != server  # not a group leader: the shell leads the group
        wait_until(
            lambda: log.exists() and b"Initializing a V1 LLM engine" in log.read_bytes(),
            timeout=60,
            what="the sim to start loading",
        )
        waiter = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "servefleet.cli.main",
                "wait",
                "--url",
                f"http://127.0.0.1:{port}",
                "--log",
                str(log),
                "--pid",
                str(server),
                "--timeout",
                "60",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "COLUMNS": "400", "NO_COLOR": "1"},
        )
        first = waiter.stderr.readline()  # the first status line: the watchers are running
        assert "loading" in first, first + waiter.stderr.read()
        os.kill(server, signal.SIGKILL)
        out, err = waiter.communicate(timeout=60)
        assert shell.poll() is None  # the shell (and so the group) is still alive
        out = " ".join(out.split())
        assert waiter.returncode == 1 and out.startswith("failed: killed"), (
            out + err
        )  # not `stalled` after the timeout
        assert (
            f"pid {server} is not a child of servefleet: only its parent (pid {shell.pid}) could read its exit code"
            in out
        )
        assert "the process is gone (exit code unknown)" in out  # no code is made up
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(shell.pid, signal.SIGKILL)
        shell.wait()
