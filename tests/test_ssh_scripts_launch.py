"""ssh_scripts.parse_launch: the one answer of a remote launch (MARK's "log SIZE LINES", the
launcher's pid and the group's state), and what it refuses (no sshd)."""

from __future__ import annotations

import pytest

from servefleet.hosts import ssh_scripts as scripts
from servefleet.hosts.base import Launched


def test_parse_launch_reads_the_framed_answer_after_any_login_noise() -> None:
    # LINES counts the newlines before the marker: the marker is on line LINES + 1
    assert scripts.parse_launch("welcome to the box\nlog 120 7\n4242\nalive\n") == Launched(
        4242, 120, 8, "alive", None
    )
    assert scripts.parse_launch("log    9     1\n77\nexited 3\n") == Launched(77, 9, 2, "exited", 3)
    assert scripts.parse_launch("log 9 1\n77\ngone\n") == Launched(77, 9, 2, "gone", None)


@pytest.mark.parametrize("out", ["", "log 9 1\n", "4242\nalive\n", "log 9 1\n77\nwhat\n", "log x 1\n77\nalive\n"])
def test_parse_launch_refuses_an_answer_that_is_not_one(out: str) -> None:
    with pytest.raises(ValueError):
        scripts.parse_launch(out)


def test_mark_argv_runs_the_launcher_after_the_marker() -> None:
    launcher = scripts.launch_argv(["sh", "-c", "wrapper"], "/l og", "/st atus")
    argv = scripts.mark_argv(launcher, "/l og", "/st atus", "==== m $(x) ====")
    assert (
        argv[:7] == ["sh", "-c", scripts.MARK, "sh", "/l og", "/st atus", "==== m $(x) ===="] and argv[7:] == launcher
    )
