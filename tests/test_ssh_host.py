"""SSHHost against a real OpenSSH server on 127.0.0.1: what only an SSH host can get wrong —
dropped links, unreachable hosts, host keys, session limits, quoting through a remote shell."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from conftest import async_wait_until, free_port, wait_until
from servefleet.errors import CommandError, HostUnreachable
from servefleet.hosts.base import Truncated
from servefleet.hosts.ssh import SSHHost

COUNT = 300  # lines the writer prints, 10 ms apart: the follow is cut while it still writes
WRITER = ["sh", "-c", f'i=0; while [ $i -lt {COUNT} ]; do echo "line $i"; i=$((i+1)); sleep 0.01; done']


@pytest.fixture
async def host(sshd_server, tmp_path: Path) -> AsyncIterator[SSHHost]:
    h = SSHHost(sshd_server.spec(workdir=str(tmp_path / "remote")))
    yield h
    await h.close()


async def read_until(agen: AsyncIterator[bytes | Truncated], done, timeout: float = 30.0) -> bytes:
    buf = b""
    deadline = time.monotonic() + timeout
    while not done(buf):
        item = await asyncio.wait_for(agen.__anext__(), max(0.01, deadline - time.monotonic()))
        assert isinstance(item, bytes), f"unexpected {item!r} after {buf[-200:]!r}"
        buf += item
    return buf


async def _gone(host: SSHHost, pgid: int) -> bool:
    return not await host.group_alive(pgid)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


# -- dropped links --------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["sigkill-master", "ssh-O-exit"])
async def test_follow_resumes_after_the_link_drops_without_losing_a_line(
    host: SSHHost, tmp_path: Path, how: str
) -> None:
    log = str(tmp_path / "count.log")
    pgid = await host.spawn_detached(WRITER, log_path=log, status_path=str(tmp_path / "count.status"))
    agen = host.follow(log)
    try:
        buf = await read_until(agen, lambda b: b.count(b"\n") >= 40)
        starts = host.pool.starts
        masters = host.pool.master_pids()
        assert masters
        if how == "sigkill-master":
            for pid in masters:
                os.kill(pid, signal.SIGKILL)
        else:
            await host.disconnect()
        assert not (await host.file_size(str(tmp_path / "count.status")))  # the writer still writes
        buf += await read_until(agen, lambda b: (buf + b).endswith(f"line {COUNT - 1}\n".encode()))
    finally:
        await agen.aclose()
    assert buf.decode().splitlines() == [f"line {i}" for i in range(COUNT)]  # nothing lost, nothing twice
    assert host.pool.starts > starts  # it really reconnected
    assert not set(masters) & set(host.pool.master_pids())
    await host.signal_group(pgid, signal.SIGKILL)


async def test_remote_process_survives_the_masters_death(host: SSHHost, tmp_path: Path) -> None:
    pgid = await host.spawn_detached(
        ["sleep", "60"], log_path=str(tmp_path / "s.log"), status_path=str(tmp_path / "s.status")
    )
    for pid in host.pool.master_pids():
        os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not any(pid_alive(p) for p in host.pool.master_pids()), what="the master to die")
    assert await host.group_alive(pgid)  # reconnects, and the server is still there
    await host.signal_group(pgid, signal.SIGKILL)


async def test_the_remote_tail_ends_with_its_session(host: SSHHost, tmp_path: Path) -> None:
    log = tmp_path / "lonely $(x).log"
    log.write_bytes(b"x\n")
    agen = host.follow(str(log))
    try:
        assert await asyncio.wait_for(agen.__anext__(), 15) == b"x\n"
    finally:
        await agen.aclose()

    def tails() -> list[str]:
        out = subprocess.run(["pgrep", "-f", "lonely"], capture_output=True, text=True).stdout
        return out.split()

    # tail --pid=$PPID notices within a second that its ssh session is gone.
    wait_until(lambda: not tails(), timeout=10, what="the remote tail to exit")


async def test_url_for_survives_a_master_restart(host: SSHHost, tmp_path: Path) -> None:
    (tmp_path / "f.txt").write_text("ok\n")
    port = free_port()
    pgid = await host.spawn_detached(
        [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", "--directory", str(tmp_path), str(port)],
        log_path=str(tmp_path / "h.log"),
        status_path=str(tmp_path / "h.status"),
    )
    try:

        async def listening() -> bool:
            return await host.port_holder(port) is not None

        await async_wait_until(listening, timeout=20, what="the HTTP server")
        url = await host.url_for(port)
        for pid in host.pool.master_pids():
            os.kill(pid, signal.SIGKILL)
        wait_until(lambda: not any(pid_alive(p) for p in host.pool.master_pids()), what="the master to die")
        assert await host.url_for(port) == url  # the forward is re-added on the new master
        async with aiohttp.ClientSession() as session, session.get(f"{url}/f.txt") as resp:
            assert await resp.text() == "ok\n"
    finally:
        await host.signal_group(pgid, signal.SIGKILL)


async def test_follow_gives_up_when_the_host_stays_away(tmp_path: Path) -> None:
    from sshd import SSHServer

    server = SSHServer(tmp_path / "sshd").start()
    host = SSHHost(server.spec(workdir=str(tmp_path), reconnect_s=2.0, connect_timeout=2))
    try:
        log = tmp_path / "x.log"
        log.write_bytes(b"hello\n")
        agen = host.follow(str(log))
        assert await asyncio.wait_for(agen.__anext__(), 15) == b"hello\n"
        server.stop()  # no new connections from now on
        for pid in host.pool.master_pids():
            os.kill(pid, signal.SIGKILL)
        started = time.monotonic()
        with pytest.raises(HostUnreachable, match="could not reconnect"):
            await asyncio.wait_for(agen.__anext__(), 30)
        assert time.monotonic() - started < 15
    finally:
        server.stop()
        await host.close()


# -- unreachable hosts, keys ----------------------------------------------------------------


async def test_closed_port_is_unreachable_at_once(sshd_server) -> None:
    host = SSHHost(sshd_server.spec(port=free_port(), connect_timeout=3))
    started = time.monotonic()
    with pytest.raises(HostUnreachable, match="connection refused") as info:
        await host.run(["true"])
    assert time.monotonic() - started < 3
    assert info.value.reason == "connection refused"
    await host.close()


async def test_silent_host_is_unreachable_within_the_connect_timeout(sshd_server) -> None:
    # A listener that never speaks SSH: the TCP connect succeeds, the banner never comes.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        host = SSHHost(sshd_server.spec(port=silent.getsockname()[1], connect_timeout=2))
        started = time.monotonic()
        with pytest.raises(HostUnreachable, match="timed out"):
            await host.connect()
        elapsed = time.monotonic() - started
        await host.close()
    assert 1.5 < elapsed < 2 + 3


async def test_unknown_host_key_is_refused_unless_accept_new(sshd_server, tmp_path: Path) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    strict = SSHHost(sshd_server.spec(known_hosts=str(empty)))
    with pytest.raises(HostUnreachable, match="host key verification failed"):
        await strict.run(["true"])
    await strict.close()
    tofu = SSHHost(sshd_server.spec(known_hosts=str(empty), strict_host_key="accept-new"))
    assert (await tofu.run(["echo", "trusted"])).stdout == "trusted\n"
    await tofu.close()
    assert "ssh-ed25519" in empty.read_text()  # learned on first use, checked from now on


async def test_wrong_key_is_an_authentication_failure(sshd_server, tmp_path: Path) -> None:
    key = tmp_path / "stranger"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    host = SSHHost(sshd_server.spec(identity_file=str(key)))
    with pytest.raises(HostUnreachable, match="authentication failed"):
        await host.connect()
    await host.close()


async def test_a_command_exiting_255_is_not_a_dead_link(host: SSHHost) -> None:
    with pytest.raises(CommandError) as info:
        await host.run(["sh", "-c", "echo my own failure >&2; exit 255"])
    assert info.value.returncode == 255 and not isinstance(info.value, HostUnreachable)


# -- multiplexing ---------------------------------------------------------------------------


async def test_many_commands_share_one_master_within_max_sessions(host: SSHHost) -> None:
    # 24 concurrent commands against a stock sshd (MaxSessions 10): queued, none refused.
    results = await asyncio.gather(*(host.run(["sh", "-c", f"sleep 0.2; echo {i}"]) for i in range(24)))
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(24)]
    assert host.pool.starts == 1 and len(host.pool.masters) == 1


async def test_followers_beyond_max_sessions_open_more_masters(host: SSHHost, tmp_path: Path) -> None:
    paths = [tmp_path / f"f{i}.log" for i in range(12)]
    for i, p in enumerate(paths):
        p.write_bytes(f"file {i}\n".encode())
    agens = [host.follow(str(p)) for p in paths]
    try:
        firsts = await asyncio.gather(*(asyncio.wait_for(a.__anext__(), 30) for a in agens))
        assert firsts == [f"file {i}\n".encode() for i in range(12)]
        assert len(host.pool.masters) >= 2  # 12 streams do not fit one connection's sessions
        # short commands still find a slot while every follower holds its session
        assert (await host.run(["echo", "still here"])).stdout == "still here\n"
        with paths[11].open("ab") as fh:
            fh.write(b"more\n")
        assert await asyncio.wait_for(agens[11].__anext__(), 15) == b"more\n"
    finally:
        for a in agens:
            await a.aclose()


async def test_close_stops_the_masters_and_leaves_servers_running(sshd_server, tmp_path: Path) -> None:
    host = SSHHost(sshd_server.spec(workdir=str(tmp_path)))
    pgid = await host.spawn_detached(
        ["sleep", "60"], log_path=str(tmp_path / "c.log"), status_path=str(tmp_path / "c.status")
    )
    masters = host.pool.master_pids()
    await host.close()
    wait_until(lambda: not any(pid_alive(p) for p in masters), what="the masters to exit")
    assert os.getpgid(pgid) == pgid  # the server (same machine) is still running
    os.killpg(pgid, signal.SIGKILL)


async def test_direct_mode_needs_no_master(sshd_server, tmp_path: Path) -> None:
    host = SSHHost(sshd_server.spec(workdir=str(tmp_path), multiplex=False))
    assert host.pool is None
    assert (await host.run(["echo", "direct"])).stdout == "direct\n"
    log = tmp_path / "d.log"
    log.write_bytes(b"direct follow\n")
    agen = host.follow(str(log))
    assert await asyncio.wait_for(agen.__anext__(), 15) == b"direct follow\n"
    await agen.aclose()
    await host.close()


# -- quoting and secrets ----------------------------------------------------------------------


async def test_model_path_with_shell_syntax_reaches_the_program_literally(host: SSHHost, tmp_path: Path) -> None:
    model = tmp_path / "models" / "my model 'v2' \"q\" $(touch pwned) `id` ; rm -rf x"
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    log = tmp_path / "logs $(whoami)" / "server 'a'.log"
    status = tmp_path / "run" / "s;t.status"
    pgid = await host.spawn_detached(
        ["ls", "-d", "--", str(model)], log_path=str(log), status_path=str(status), cwd=str(tmp_path)
    )
    wait_until(status.exists, what="the status file")
    assert status.read_text().strip() == "0"
    assert log.read_text() == f"{model}\n"
    assert not (tmp_path / "pwned").exists() and not (Path.home() / "pwned").exists()
    await async_wait_until(lambda: _gone(host, pgid), what="the wrapper to exit")


async def test_secrets_in_env_never_reach_a_command_line(host: SSHHost, tmp_path: Path) -> None:
    pgid = await host.spawn_detached(
        ["sleep", "60"],
        log_path=str(tmp_path / "e.log"),
        status_path=str(tmp_path / "e.status"),
        env={"SF_SECRET_TOKEN": "tok-3141592653"},
    )
    try:
        members = [
            int(p) for p in subprocess.run(["pgrep", "-g", str(pgid)], capture_output=True, text=True).stdout.split()
        ]
        assert members
        for pid in members:
            assert b"tok-3141592653" not in Path(f"/proc/{pid}/cmdline").read_bytes()
        environs = [Path(f"/proc/{pid}/environ").read_bytes() for pid in members]
        assert any(b"SF_SECRET_TOKEN=tok-3141592653" in e for e in environs)
    finally:
        await host.signal_group(pgid, signal.SIGKILL)


async def test_tilde_paths_are_the_remote_home(sshd_server, tmp_path: Path) -> None:
    """``~`` is expanded with the remote home (learned at connect), never by a shell; the fleet's
    binding turns its work folder absolute when the host connects."""
    from servefleet.fleet.hosts import _connect_ssh
    from servefleet.fleet.spec import HostSpec

    folder = f".sf-test-{os.getpid()}-{os.urandom(3).hex()}"
    host = SSHHost(sshd_server.spec(workdir=f"~/{folder}"))
    made: Path | None = None
    try:
        await host.connect()
        home = Path(host.home)
        made = home / folder
        assert host.workdir == str(home / folder)
        pgid = await host.spawn_detached(
            ["pwd"], log_path=f"~/{folder}/logs/p.log", status_path=f"~/{folder}/p.status"
        )
        wait_until((home / folder / "p.status").exists, what="the status file")
        assert (home / folder / "logs" / "p.log").read_text() == f"{home / folder}\n"  # cwd: the work folder
        assert await host.read_bytes(f"~/{folder}/logs/p.log") == f"{home / folder}\n".encode()
        await async_wait_until(lambda: _gone(host, pgid), what="the wrapper to exit")

        class FakeFleet:
            name = "fl"
            path = tmp_path / "fleet.toml"

        spec = HostSpec(
            name="rig",
            ssh=sshd_server.destination,
            port=sshd_server.port,
            identity_file=sshd_server.identity_file,
            known_hosts=sshd_server.known_hosts,
            config_file=sshd_server.client_config(),
            workdir=f"~/{folder}",
        )
        binding = _connect_ssh(spec, FakeFleet)  # type: ignore[arg-type]  # a fake fleet stands in for the real one
        assert binding.log_path("s") == f"~/{folder}/fl/logs/s.log"  # not connected yet
        assert await binding.host.file_size(binding.log_path("s")) is None  # connects
        assert binding.log_path("s") == str(home / folder / "fl" / "logs" / "s.log")
        await binding.host.close()
    finally:
        await host.close()
        if made is not None:
            shutil.rmtree(made, ignore_errors=True)
