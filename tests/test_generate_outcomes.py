"""generate stops when it cannot go on, and says why: a hang-up (SIGHUP) commits first, as SIGTERM
does; the only server gone for good ends the run stalled (exit 2) after --give-up-after; a commit
that cannot be written (the disk is full) ends the run at once, named, with a non-zero exit.

The CLI runs in a subprocess against the simulator in a subprocess; signals are sent for real (a
pseudo-terminal is closed under the job), the disk is really full (a small tmpfs)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pty
import select
import subprocess
import termios
import threading
from pathlib import Path

import pytest

from conftest import PYTHON, SimProcess, wait_until
from parquet_read import read_parquet

SLOW_SIM = ("--load-time", "0", "--decode-ms", "20", "--decode-ms-per-running", "0", "--prefill-ms-per-1k-tokens", "0")


@pytest.fixture(scope="module")
def slow_sim(tmp_path_factory: pytest.TempPathFactory):
    """About 100 answers a second: a job of a few thousand prompts is still running when the test acts."""
    proc = SimProcess(*SLOW_SIM, "--max-running", "8", log_path=tmp_path_factory.mktemp("sim") / "sim.log").start().wait_ready()
    yield proc
    proc.stop()


def write_prompts(path: Path, n: int) -> Path:
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"id": f"p{i}", "prompt": f"prompt {i}"}) + "\n")
    return path


def generate_argv(src: Path, out: Path, *extra: str) -> list[str]:
    return [PYTHON, "-m", "servefleet.cli.main", "generate", "-i", str(src), "-o", str(out), "--max-tokens", "4", *extra]


def committed_ids(out: Path) -> list[str]:
    ids: list[str] = []
    for shard in sorted((out / "shards").glob("*")):
        ids.extend(read_parquet(shard, columns=["id"]).column("id").to_pylist())
    return ids


def answered(out: Path) -> int:
    """Rows answered so far, from the job's own progress.json (written every --record-interval)."""
    try:
        return int(json.loads((out / "progress.json").read_text())["done"])
    except (OSError, ValueError, KeyError):
        return 0


# ---- SIGHUP: the terminal closed -----------------------------------------------------------------


class Terminal:
    """A pseudo-terminal that is the controlling terminal of the process started on it; what the
    process writes is read (and dropped) so it never blocks; ``hang_up()`` closes it as a terminal
    window or a dropped SSH session does: the kernel sends SIGHUP, later writes fail (EIO)."""

    def __init__(self) -> None:
        self.master, self.slave = pty.openpty()
        self._open = True
        self._reader = threading.Thread(target=self._drain, daemon=True)

    def start(self, argv: list[str]) -> subprocess.Popen:
        def controlling_tty() -> None:  # in the child: a new session whose terminal this is
            os.setsid()
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)

        proc = subprocess.Popen(argv, stdin=self.slave, stdout=self.slave, stderr=self.slave, preexec_fn=controlling_tty)
        os.close(self.slave)
        self._reader.start()
        return proc

    def _drain(self) -> None:
        while self._open:
            ready, _, _ = select.select([self.master], [], [], 0.05)
            if ready:
                with contextlib.suppress(OSError):
                    os.read(self.master, 65536)

    def hang_up(self) -> None:
        self._open = False
        self._reader.join()
        os.close(self.master)


def test_a_closed_terminal_sighup_commits_what_is_answered_and_exits_interrupted(slow_sim, tmp_path):
    src = write_prompts(tmp_path / "in.jsonl", 3000)
    out = tmp_path / "out"
    # no shard is due before the hang-up (1,000 rows, 10 min): what is committed, the hang-up committed
    terminal = Terminal()
    proc = terminal.start(generate_argv(src, out, "--url", slow_sim.url, "--shard-seconds", "600"))
    try:
        wait_until(lambda: answered(out) >= 20 or proc.poll() is not None, timeout=60, what="20 answered rows")
        assert proc.poll() is None and not committed_ids(out)
        terminal.hang_up()
        rc = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert rc == 130, f"exit {rc} (-1: killed by SIGHUP with nothing committed)"
    ids = committed_ids(out)
    assert len(ids) >= 20 and len(ids) == len(set(ids))
    run = json.loads((out / "job.json").read_text())["runs"][-1]
    assert run["status"] == "interrupted" and run["done"] == len(ids)
    assert json.loads((out / "report.json").read_text())["committed"] == len(ids)
