"""generate stops when it cannot go on, and says why: a hang-up (SIGHUP) commits first, as SIGTERM
does; the only server gone for good ends the run stalled (exit 2) after --give-up-after; a commit
that cannot be written (the disk is full) ends the run at once, named, with a non-zero exit.

The CLI runs in a subprocess against the simulator in a subprocess; signals are sent for real (a
pseudo-terminal is closed under the job), the disk is really full (a small tmpfs)."""

from __future__ import annotations

import asyncio
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

from conftest import FAST_SIM, PYTHON, SimProcess, wait_until
from parquet_read import read_parquet

SLOW_SIM = ("--load-time", "0", "--decode-ms", "20", "--decode-ms-per-running", "0", "--prefill-ms-per-1k-tokens", "0")


@pytest.fixture(scope="module")
def slow_sim(tmp_path_factory: pytest.TempPathFactory):
    """About 100 answers a second: a job of a few thousand prompts is still running when the test acts."""
    proc = (
        SimProcess(*SLOW_SIM, "--max-running", "8", log_path=tmp_path_factory.mktemp("sim") / "sim.log")
        .start()
        .wait_ready()
    )
    yield proc
    proc.stop()


def write_prompts(path: Path, n: int) -> Path:
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"id": f"p{i}", "prompt": f"prompt {i}"}) + "\n")
    return path


def generate_argv(src: Path, out: Path, *extra: str) -> list[str]:
    return [
        PYTHON,
        "-m",
        "servefleet.cli.main",
        "generate",
        "-i",
        str(src),
        "-o",
        str(out),
        "--max-tokens",
        "4",
        *extra,
    ]


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
        self.output = bytearray()
        self._open = True
        self._reader = threading.Thread(target=self._drain, daemon=True)

    def start(self, argv: list[str]) -> subprocess.Popen:
        def controlling_tty() -> None:  # in the child: a new session whose terminal this is
            os.setsid()
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)

        proc = subprocess.Popen(
            argv, stdin=self.slave, stdout=self.slave, stderr=self.slave, preexec_fn=controlling_tty
        )
        os.close(self.slave)
        self._reader.start()
        return proc

    def _drain(self) -> None:
        while self._open:
            ready, _, _ = select.select([self.master], [], [], 0.05)
            if ready:
                with contextlib.suppress(OSError):
                    self.output += os.read(self.master, 65536)

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


def test_a_detached_job_outlives_its_terminal_and_progress_follows_it_to_the_end(slow_sim, tmp_path):
    n = 200
    src = write_prompts(tmp_path / "in.jsonl", n)
    out = tmp_path / "out"
    log = tmp_path / "job.log"
    terminal = Terminal()
    parent = terminal.start(
        generate_argv(src, out, "--url", slow_sim.url, "--shard-rows", "50", "--detach", "--log", str(log), "--json")
    )
    started: dict = {}
    try:
        assert parent.wait(timeout=60) == 0
        started = json.loads(bytes(terminal.output).decode().strip().splitlines()[-1])
        assert started["detached"] and started["log"] == str(log)
        terminal.hang_up()  # the terminal that started it is gone; the job is not
        follow = subprocess.run(
            [PYTHON, "-m", "servefleet.cli.main", "progress", str(out), "-f", "--interval", "0.5"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert follow.returncode == 0, follow.stdout[-2000:] + follow.stderr[-2000:]
        wait_until(
            lambda: not os.path.exists(f"/proc/{started['pid']}") or _zombie(started["pid"]),
            timeout=30,
            what="the job to exit",
        )
    except BaseException:  # the job may still be running: it is ours to end
        if started.get("pid"):
            with contextlib.suppress(ProcessLookupError):
                os.kill(started["pid"], 9)
        raise
    assert sorted(committed_ids(out)) == sorted(f"p{i}" for i in range(n))
    assert json.loads((out / "job.json").read_text())["runs"][-1]["status"] == "complete"
    assert '"status": "complete"' in log.read_text()  # its report, in its log


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")
    except OSError:
        return True


def test_a_detached_job_that_ends_before_sending_gives_its_exit_code_and_why(tmp_path):
    proc = subprocess.run(
        generate_argv(
            tmp_path / "missing.jsonl",
            tmp_path / "out",
            "--url",
            "http://127.0.0.1:9",
            "--detach",
            "--log",
            str(tmp_path / "job.log"),
        ),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "missing.jsonl: no such file" in proc.stderr


# ---- the only --url server dies ------------------------------------------------------------------


def test_the_only_url_server_dead_for_good_ends_the_run_stalled_after_give_up_after(tmp_path):
    sim = SimProcess(*SLOW_SIM, "--max-running", "8", log_path=tmp_path / "sim.log").start().wait_ready()
    src = write_prompts(tmp_path / "in.jsonl", 3000)
    out = tmp_path / "out"
    argv = generate_argv(src, out, "--url", sim.url, "--give-up-after", "3s", "--shard-rows", "10", "--json")
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: answered(out) >= 20 or proc.poll() is not None, timeout=60, what="20 answered rows")
        sim.stop()  # SIGKILL: it never answers again
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        sim.stop()
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 2, stderr[-3000:]  # stalled: the exit code --help promises
    report = json.loads(stdout)
    assert report["status"] == "stalled" and report["servers"][0]["state"] == "gone"
    assert "--give-up-after 3s" in report["message"]
    assert any("given up if it does not within 3s" in e for e in report["events"])
    ids = committed_ids(out)
    assert len(ids) == report["committed"] == len(set(ids)) and report["remaining"] == 3000 - len(ids)


def test_the_eta_is_unknown_while_no_server_is_up():
    from servefleet.cli.generate_view import format_eta
    from servefleet.generate.stats import JobStats, ServerStats

    stats = JobStats(total=100, to_send=100, done=50, started=0.0)
    stats.servers["a"] = ServerStats("a", "http://127.0.0.1:1", state="up")
    stats.servers["b"] = ServerStats("b", "http://127.0.0.1:2", state="gone")
    assert stats.eta_s(now=10.0) == pytest.approx(10.0)
    stats.servers["a"].state = "down"  # taken out, being waited for: nothing serves
    assert stats.eta_s(now=10.0) is None and format_eta(stats.eta_s(now=10.0)) == "--"


@pytest.mark.parametrize(("text", "seconds"), [("90s", 90), ("10m", 600), ("1h30m", 5400), ("45", 45), ("1.5m", 90)])
def test_give_up_after_reads_durations(text, seconds):
    from servefleet.cli.generate_cmd import parse_duration

    assert parse_duration(text) == seconds


@pytest.mark.parametrize("bad", ["soon", "-5s", "0"])
def test_a_bad_give_up_after_is_a_usage_error_naming_the_option(tmp_path, bad):
    src = write_prompts(tmp_path / "in.jsonl", 1)
    proc = subprocess.run(
        generate_argv(src, tmp_path / "out", "--url", "http://127.0.0.1:9", "--give-up-after", bad),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 3 and "--give-up-after" in proc.stderr, proc.stderr
    assert not (tmp_path / "out").exists()


# ---- the disk is full ----------------------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path):
    """``(folder, limit_child, grow)``: a folder where a job runs out of room after a few hundred
    rows. A 192 KiB tmpfs where this process may mount one (root: CI), so the job meets a real
    ENOSPC; elsewhere a plain folder and a file-size limit in the job's process (RLIMIT_FSIZE:
    a real EFBIG). ``grow()`` gives room again (a bigger tmpfs, or no limit)."""
    folder = tmp_path / "disk"
    folder.mkdir()
    mounted = (
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=192k", "tmpfs", str(folder)], capture_output=True
        ).returncode
        == 0
    )
    state = {"limit": not mounted}

    def limit_child() -> None:
        if state["limit"]:
            import resource
            import signal

            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of a killed process
            resource.setrlimit(resource.RLIMIT_FSIZE, (4 << 10, 4 << 10))

    def grow() -> None:
        if mounted:
            subprocess.run(["mount", "-o", "remount,size=16m", str(folder)], check=True)
        state["limit"] = False

    try:
        yield folder, limit_child, grow, ("No space left on device" if mounted else os.strerror(27))
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(folder)], check=False)


def test_a_full_disk_ends_the_run_at_once_naming_the_path_and_what_was_lost_then_resume_completes(
    small_disk, tmp_path
):
    folder, limit_child, grow, strerror = small_disk
    sim = SimProcess(*FAST_SIM, "--max-running", "16", log_path=tmp_path / "sim.log").start().wait_ready()
    n = 3000
    src = write_prompts(tmp_path / "in.jsonl", n)
    out = folder / "out"
    argv = generate_argv(src, out, "--url", sim.url, "--shard-rows", "50", "--store-request", "--json")
    try:
        # before the fix the committer died silently and the run waited for ever (killed after the timeout)
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=90, preexec_fn=limit_child)
        assert proc.returncode == 1, proc.stderr[-3000:]
        error = json.loads(proc.stdout)["error"]
        assert error["kind"] == "failed" and error["exit_code"] == 1
        message = error["message"]
        assert strerror in message and str(out) in message, message
        committed = len(committed_ids(out))
        assert f"were not committed (a resumed run asks them again), {committed:,} were in this run" in message
        uncommitted = int(message.split(" answered rows were not committed")[0].rsplit("; ", 1)[1].replace(",", ""))
        assert uncommitted > 0 and committed + uncommitted < n
        assert not (out / ".staging").exists() or not list((out / ".staging").iterdir())  # no half-written shard left
        assert "Traceback" not in proc.stderr
        grow()  # room again: the same command resumes and finishes, every id once
        again = subprocess.run(argv, capture_output=True, text=True, timeout=120, preexec_fn=limit_child)
    finally:
        sim.stop()
    assert again.returncode == 0, again.stderr[-3000:]
    report = json.loads(again.stdout)
    assert report["status"] == "complete" and report["done_before"] == committed
    assert sorted(committed_ids(out)) == sorted(f"p{i}" for i in range(n))


class _Ledger:
    """Stages anything; every publish fails with ``error``."""

    def __init__(self, error: OSError) -> None:
        self.error = error
        self.publishes = 0

    def stage(self, buffer):
        from servefleet.generate.ledger import LedgerEntry, Staged

        return Staged(
            "/dest/.staging/tmp1.parquet",
            LedgerEntry("part-r-000001.parquet", "r", "sha", buffer.ids(), buffer.lines(), 0, 0),
        )

    def publish(self, staged):
        self.publishes += 1
        raise self.error


@pytest.mark.parametrize(("code", "publishes"), [(28, 1), (30, 1), (5, 2)])  # ENOSPC, EROFS: at once; EIO: retried
async def test_a_commit_error_that_waiting_does_not_mend_breaks_the_committer_at_once(code, publishes):
    from servefleet.generate.committer import Committer
    from servefleet.generate.shards import OutputRow, ShardBuffer, ShardLimits, shard_schema
    from servefleet.generate.stats import JobStats

    ledger = _Ledger(OSError(code, os.strerror(code)))
    committer = Committer(
        ledger,
        ShardBuffer(shard_schema(False, False), ShardLimits(1, 1 << 20, 60)),
        JobStats(),  # type: ignore[arg-type]
        commit_attempts=2,
        retry_delay_s=0.01,
    )
    committer.start()
    committer.add(
        OutputRow(
            id="a",
            line=1,
            text="x",
            finish_reason="stop",
            prompt_tokens=1,
            completion_tokens=1,
            model="m",
            server="s",
            attempts=1,
            latency_s=0.1,
        )
    )
    await asyncio.wait_for(committer.broken.wait(), 10)
    assert ledger.publishes == publishes and committer.error is ledger.error
    assert committer.failed_shard == "/dest/.staging/tmp1.parquet"
    await asyncio.wait_for(committer.close(), 5)  # returns: nothing more is committed
    assert committer.backlogged  # the dispatcher waits for room, and hears why there is none
    with pytest.raises(OSError):
        await asyncio.wait_for(committer.wait_room(), 5)
