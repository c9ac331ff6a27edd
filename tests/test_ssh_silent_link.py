"""A link that goes SILENT (packets dropped, no socket closed) against the sshd in its own network
namespace: `ip link set lo down` inside the namespace drops every packet between the relay and
sshd, while the client's side of the connection stays open, as with a dead router or a VPN that
lost its route. Keep-alives decide: a quiet session on a live link is answered and survives; on
the silent link, commands (running or new) are reported unreachable within the alive timeout
rather than after TCP's minutes or keep-alives plus a connect timeout."""

from __future__ import annotations

import asyncio
import subprocess
import time
from pathlib import Path

import pytest

from servefleet.errors import HostUnreachable
from servefleet.hosts.ssh import SSHHost
from servefleet.hosts.ssh_options import SSHSpec

ALIVE_TIMEOUT = 3  # seconds: a keep-alive after 1 s of silence, two more unanswered = dead
SLACK = 4.0  # the keep-alive timer's phase (up to one interval), the watcher, a loaded 2-core CI


def _link(netns: str, state: str) -> None:
    subprocess.run(["ip", "netns", "exec", netns, "ip", "link", "set", "lo", state], check=True)


@pytest.fixture
def netns_sshd(tmp_path: Path):
    from sshd import NetnsSSHServer, netns_unavailable_reason, require

    require(netns_unavailable_reason())
    server = NetnsSSHServer(tmp_path / "sshd-ns").start()
    try:
        yield server
    finally:
        if server.netns:
            subprocess.run(["ip", "netns", "exec", server.netns, "ip", "link", "set", "lo", "up"], capture_output=True)
        server.stop()


@pytest.mark.timeout(90)
async def test_silent_link_is_unreachable_within_the_alive_timeout_and_quiet_sessions_live(
    netns_sshd, tmp_path: Path
) -> None:
    spec = netns_sshd.spec(
        workdir=str(tmp_path),
        options=netns_sshd.client_options(),
        connect_timeout=10,
        **SSHSpec.alive_settings(ALIVE_TIMEOUT),
    )
    assert spec.alive_timeout == ALIVE_TIMEOUT
    host = SSHHost(spec)
    log = tmp_path / "quiet.log"
    log.write_bytes(b"first\n")
    follow = host.follow(str(log))
    try:
        # 1. Live link: a follow and a command that stay quiet for longer than the alive timeout
        #    are not cut (the server answers the keep-alives).
        assert await asyncio.wait_for(follow.__anext__(), 20) == b"first\n"
        starts = host.pool.starts
        quiet = await host.run(["sh", "-c", f"sleep {ALIVE_TIMEOUT + 2}; echo done"])
        assert quiet.returncode == 0 and quiet.stdout.strip() == "done"
        with log.open("ab") as fh:
            fh.write(b"second\n")
        assert await asyncio.wait_for(follow.__anext__(), 10) == b"second\n"
        assert host.pool.starts == starts  # nothing reconnected

        # 2. The link goes silent under a running command, and a new command is asked on it.
        running = asyncio.ensure_future(host.run(["sleep", "60"]))
        await asyncio.sleep(0.5)  # let its session open on the live link (not synchronisation of a result)
        _link(netns_sshd.netns, "down")
        started = time.monotonic()
        new = asyncio.ensure_future(host.file_size(str(log)))  # idempotent: would be retried on a mere drop
        results = await asyncio.wait_for(asyncio.gather(running, new, return_exceptions=True), 60)
        elapsed = time.monotonic() - started
        for result in results:
            assert isinstance(result, HostUnreachable), results
        assert any(getattr(r, "reason", None) == "link went silent" for r in results), results
        assert "keep-alives" in str(results[0])
        # without the fix: keep-alives (45 s) plus ConnectTimeout (10 s) for the retried read
        assert elapsed < ALIVE_TIMEOUT + SLACK, elapsed

        # 3. The link comes back: the next command reconnects.
        _link(netns_sshd.netns, "up")
        back = await asyncio.wait_for(host.run(["echo", "back"]), 30)
        assert back.stdout.strip() == "back" and host.pool.starts > starts
    finally:
        await follow.aclose()
        await host.close()


@pytest.mark.timeout(90)
async def test_a_wait_on_a_silent_link_is_unreachable_within_the_alive_timeout(netns_sshd, tmp_path: Path) -> None:
    """A wait asks no command per poll any more: the remote watcher's stream (its heartbeat and
    the master's keep-alives) is what must notice the silence, within the alive timeout."""
    import os
    import signal

    from servefleet.verify.waiter import WaitTarget, wait_for_server

    spec = netns_sshd.spec(
        workdir=str(tmp_path),
        options=netns_sshd.client_options(),
        connect_timeout=10,
        **SSHSpec.alive_settings(ALIVE_TIMEOUT),
    )
    host = SSHHost(spec)
    log, status = tmp_path / "loading.log", tmp_path / "loading.status"
    pgid = await host.spawn_detached(
        ["sh", "-c", "echo Loading; exec sleep 120"], log_path=str(log), status_path=str(status)
    )
    try:
        target = WaitTarget(
            base_url=await host.url_for(8),
            engine=None,
            host=host,
            log_path=str(log),
            pgid=pgid,
            status_path=str(status),
            port=8,
        )
        waiting = asyncio.ensure_future(wait_for_server(target, timeout_s=120, stall_s=120, smoke=False))
        deadline = time.monotonic() + 20
        while not (log.exists() and b"Loading" in log.read_bytes()):
            assert time.monotonic() < deadline, "the server never started"
            await asyncio.sleep(0.1)
        await asyncio.sleep(
            1.5
        )  # the watcher's stream is up and has sent a heartbeat (not synchronisation of a result)
        assert not waiting.done()
        commands = host.commands
        _link(netns_sshd.netns, "down")
        started = time.monotonic()
        with pytest.raises(HostUnreachable, match="silent"):
            await asyncio.wait_for(waiting, 60)
        elapsed = time.monotonic() - started
        assert elapsed < ALIVE_TIMEOUT + SLACK, elapsed
        assert host.commands - commands <= 2  # at most a restarted watcher, no polling
    finally:
        _link(netns_sshd.netns, "up")
        os.killpg(pgid, signal.SIGKILL)
        await host.close()
