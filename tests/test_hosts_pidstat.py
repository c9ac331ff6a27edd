"""Parsing /proc/PID/stat (hosts.pidstat): odd command names, zombies' exit status, garbage."""

from __future__ import annotations

import os
import signal
import subprocess

from conftest import wait_until
from servefleet.hosts.pidstat import GONE, parse_proc_stat, read_pid_status

# Fields after the command name: state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt
# utime stime cutime cstime priority nice threads itrealvalue starttime ... exit_code (field 52).
TAIL = " ".join(["0"] * 29)


def stat_line(comm: str, state: str, exit_code: int | None = 0) -> str:
    fields = [state, "41", "40", "40", "0", "-1", "4194560"] + ["0"] * 12 + ["123456"] + TAIL.split()
    if exit_code is not None:
        fields.append(str(exit_code))
    else:
        fields = fields[:30]
    return f"77 ({comm}) " + " ".join(fields) + "\n"


def test_command_names_with_spaces_and_parentheses() -> None:
    st = parse_proc_stat(stat_line("python -m x) (y", "S"))
    assert st.alive and st.ppid == 41 and st.started == 123456 and st.code is None


def test_zombie_exit_status_in_waitpid_form() -> None:
    assert parse_proc_stat(stat_line("srv", "Z", 9)).code == -9  # killed by SIGKILL
    assert parse_proc_stat(stat_line("srv", "Z", 3 << 8)).code == 3  # exit(3)
    old_kernel = parse_proc_stat(stat_line("srv", "Z", None))
    assert old_kernel.state == "zombie" and old_kernel.code is None


def test_garbled_lines_are_gone() -> None:
    assert parse_proc_stat("") == GONE
    assert parse_proc_stat("77 (srv) S 1 2") == GONE
    assert parse_proc_stat("no parentheses at all") == GONE


def test_real_processes_alive_zombie_and_gone() -> None:
    me = read_pid_status(os.getpid())
    assert me.alive and me.ppid == os.getppid()
    proc = subprocess.Popen(["sleep", "60"])
    try:
        os.kill(proc.pid, signal.SIGKILL)
        wait_until(lambda: read_pid_status(proc.pid).state == "zombie", what="the killed child to become a zombie")
        assert read_pid_status(proc.pid).code == -signal.SIGKILL
    finally:
        proc.wait()
    assert read_pid_status(proc.pid) == GONE
