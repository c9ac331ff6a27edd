"""Who listens on a local port when psutil's socket table may not be read (``psutil.AccessDenied``):
/proc/net/tcp{,6} with the /proc/PID/fd socket inodes, then `ss -ltnp`, then a bind test -- and the
pre-launch port check and the identity check by socket owner that rest on it, each saying which
evidence it used. AccessDenied is injected at the psutil boundary; one test drops root for real."""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from conftest import free_port
from servefleet.catalog import Category, State
from servefleet.fleet import Fleet
from servefleet.hosts import local_ports
from servefleet.hosts.local import LocalHost
from servefleet.hosts.local_ports import BIND_EVIDENCE, PROC_EVIDENCE, SS_EVIDENCE, port_holder_fallback
from servefleet.http import probe_client
from servefleet.verify.probe import Prober

# /proc/net/tcp as the kernel writes it: 127.0.0.1:8000 and 0.0.0.0:30000 listening, one connection
PROC_TCP = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 41234 1 0000000000000000 100 0 0 10 0
   1: 00000000:7530 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 41299 1 0000000000000000 100 0 0 10 0
   2: 0100007F:1F40 0100007F:D2F0 01 00000000:00000000 00:00000000 00000000     0        0 41300 1 0000000000000000 20 4 30 10 -1
"""
PROC_TCP6 = """\
  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000001000000:1F41 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 51234 1 0000000000000000 100 0 0 10 0
"""
SS = """\
LISTEN 0      4096       127.0.0.1:8000       0.0.0.0:*    users:(("python3",pid=4242,fd=7))
LISTEN 0      128        0.0.0.0:30000        0.0.0.0:*
LISTEN 0      511        [::1]:8001           [::]:*       users:(("node",pid=77,fd=20))
"""


def test_listening_inodes_of_a_port() -> None:
    assert local_ports.listening_inodes(PROC_TCP, 8000) == [41234]  # not the connection's 41300
    assert local_ports.listening_inodes(PROC_TCP, 30000) == [41299]
    assert local_ports.listening_inodes(PROC_TCP, 8001) == []
    assert local_ports.listening_inodes(PROC_TCP6, 8001) == [51234]


def test_parse_ss() -> None:
    assert local_ports.parse_ss(SS, 8000) == (True, 4242)
    assert local_ports.parse_ss(SS, 30000) == (True, None)  # another user's: ss cannot name it
    assert local_ports.parse_ss(SS, 8001) == (True, 77)
    assert local_ports.parse_ss(SS, 800) == (False, None)


@pytest.fixture
def listener() -> Iterator[int]:
    """A socket of this process listening on a loopback port."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


@pytest.fixture
def no_socket_table(monkeypatch: pytest.MonkeyPatch) -> None:
    """psutil's socket table refused, as where it needs privileges (macOS, hardened kernels)."""

    def denied(*args: object, **kwargs: object) -> None:
        raise psutil.AccessDenied(msg="net_connections needs root here")

    monkeypatch.setattr(psutil, "net_connections", denied)


async def test_access_denied_falls_back_to_proc(no_socket_table: None, listener: int) -> None:
    holder = await LocalHost().port_holder(listener)
    assert holder is not None and holder.pid == os.getpid() and holder.pgid == os.getpgid(0)
    assert holder.evidence == PROC_EVIDENCE
    assert await LocalHost().port_holder(free_port()) is None


async def test_psutil_is_the_first_evidence(listener: int) -> None:
    holder = await LocalHost().port_holder(listener)
    assert holder is not None and holder.pid == os.getpid() and holder.evidence == "psutil"


@pytest.mark.skipif(shutil.which("ss") is None, reason="iproute2's ss is not installed")
def test_without_proc_ss_answers(tmp_path: Path, listener: int) -> None:
    holder = port_holder_fallback(listener, proc=str(tmp_path))  # a /proc without net/tcp
    assert holder is not None and holder.evidence == SS_EVIDENCE and holder.pid == os.getpid()
    assert port_holder_fallback(free_port(), proc=str(tmp_path)) is None


def test_without_proc_or_ss_a_bind_test_answers(
    tmp_path: Path, listener: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(local_ports.shutil, "which", lambda name: None)
    holder = port_holder_fallback(listener, proc=str(tmp_path))
    assert holder is not None and holder.evidence == BIND_EVIDENCE and holder.pid is None
    assert port_holder_fallback(free_port(), proc=str(tmp_path)) is None


def test_the_bind_test_sees_an_ipv6_listener() -> None:
    try:
        sock = socket.socket(socket.AF_INET6)
        sock.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback here")
    with sock:
        sock.listen()
        assert local_ports.bind_test(sock.getsockname()[1])


# ---- what rests on it --------------------------------------------------------------------------
async def test_prelaunch_check_still_refuses_a_taken_port(
    tmp_path: Path, no_socket_table: None, listener: int
) -> None:
    path = tmp_path / "fleet.toml"
    path.write_text(
        f'[fleet]\nname = "t"\ntimeout = 30\n\n[[servers]]\nname = "a"\nengine = "sim"\nmodel = "m"\nport = {listener}\n'
    )
    fleet = Fleet.load(path)
    try:
        verdict = (await fleet.up())["a"]
    finally:
        await fleet.down(grace_s=2)
        await fleet.close()
    assert (verdict.state, verdict.category) == (State.FAILED, Category.PORT_IN_USE)
    assert f"pid {os.getpid()}" in verdict.message and f"seen by {PROC_EVIDENCE}" in verdict.message
    assert "nothing was launched" in verdict.message


async def test_identity_check_still_names_a_foreign_owner(no_socket_table: None, listener: int) -> None:
    # our server's group is another one (a sleeper in its own session); the port is this process's
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        async with probe_client() as client:
            prober = Prober(client, f"http://127.0.0.1:{listener}", LocalHost(), pgid=other.pid, port=listener)
            ok, detail = await prober.identity()
    finally:
        other.kill()
        other.wait()
    assert ok is False
    assert f"held by pid {os.getpid()}" in detail and f"seen by {PROC_EVIDENCE}" in detail


# ---- as an unprivileged user, for real ------------------------------------------------------------
def _unprivileged_check(root_port: int, out: multiprocessing.connection.Connection) -> None:
    """Runs in a forked child that dropped root: the real psutil check, then the /proc fallback."""
    try:
        if os.geteuid() == 0:
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)  # nobody
        with socket.socket() as mine:
            mine.bind(("127.0.0.1", 0))
            mine.listen()
            own_port = mine.getsockname()[1]
            result = {"uid": os.geteuid(), "pid": os.getpid()}
            for name, port in (("root", root_port), ("own", own_port)):
                real = LocalHost._port_holder(port)
                fallback = port_holder_fallback(port)
                result[name] = [None if h is None else [h.pid, h.evidence] for h in (real, fallback)]
        out.send(json.dumps(result))
    except BaseException as exc:  # report, never hang the parent
        out.send(json.dumps({"error": repr(exc)}))


def test_as_an_unprivileged_user_a_root_socket_still_counts() -> None:
    """Tests run as root; the child drops to `nobody` (the check runs in-process when already
    unprivileged). A listener of another (root's) process: taken, owner hidden. Its own: its pid.
    The other listener is a separate process, so the forked child does not inherit its socket."""
    other = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import socket, sys, time\ns = socket.socket(); s.bind(('127.0.0.1', 0)); "
            "s.listen(); print(s.getsockname()[1], flush=True); time.sleep(120)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        root_port = int(other.stdout.readline())
        ctx = multiprocessing.get_context("fork")
        parent, child = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_unprivileged_check, args=(root_port, child))
        proc.start()
        try:
            assert parent.poll(60), "the unprivileged child did not answer"
            result = json.loads(parent.recv())
        finally:
            proc.join(10)
    finally:
        other.kill()
        other.wait()
    assert "error" not in result, result
    assert result["uid"] != 0
    if os.geteuid() == 0:  # the other process is root's: invisible to nobody, but its port is taken
        assert result["root"] == [[None, "psutil"], [None, PROC_EVIDENCE]]
    else:  # same user: visible
        assert result["root"] == [[other.pid, "psutil"], [other.pid, PROC_EVIDENCE]]
    assert result["own"] == [[result["pid"], "psutil"], [result["pid"], PROC_EVIDENCE]]
