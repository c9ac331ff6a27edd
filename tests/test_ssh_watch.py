"""Waiting over SSH with one remote watcher per server (hosts/ssh_follow.watch) against a real
sshd on 127.0.0.1: what a wait costs in remote commands however long the server loads, the exit
code and the log's last lines arriving through the watcher, and a watcher that dies or goes
quiet under a wait. Remote commands are counted twice: by SSHHost.commands and, independently,
by the sessions sshd itself logs ("Starting session: command", LogLevel VERBOSE)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path

import psutil
import pytest

from conftest import async_wait_until, free_port
from servefleet.catalog import Category, State
from servefleet.engines.registry import get_engine
from servefleet.fleet import Fleet
from servefleet.hosts.ssh import SSHHost
from servefleet.hosts.watch import Exited, LogAbsent, WatchHost
from servefleet.verify.waiter import WaitTarget, wait_for_server
from test_ssh_fleet import group_members, write_fleet

WAIT_COMMANDS = 5  # the bound per server and start, whatever its duration
ALIVE_TIMEOUT = 3


def sshd_sessions(server) -> int:
    """Remote commands sshd has started so far (each mux client or direct connection runs one)."""
    return server.log_file.read_bytes().count(b"Starting session: command")


def fleet_file(tmp_path: Path, server, servers: dict[str, list[str]]) -> Path:
    path, _ports = write_fleet(tmp_path, server, servers, timeout=120, stall=60)
    text = path.read_text().replace(
        "connect_timeout = 3\n", f"connect_timeout = 3\nalive_timeout = {ALIVE_TIMEOUT}\n", 1
    )
    path.write_text(text)
    return path


async def start(fleets, path: Path):
    fleet = fleets(Fleet.load(path))
    outcomes = await fleet.start()
    host = fleet.binding("rig").host
    assert isinstance(host, SSHHost) and isinstance(host, WatchHost)
    return fleet, outcomes, host


def watcher_processes(log_path: str) -> dict[str, list[psutil.Process]]:
    """The remote watcher of ``log_path``: its sh loop(s) and its tail (the "remote" is this machine)."""
    found: dict[str, list[psutil.Process]] = {"loop": [], "tail": []}
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        if log_path not in cmd:
            continue
        if cmd[:2] == ["sh", "-c"] and "watch_loop" in cmd[2]:
            found["loop"].append(proc)
        elif cmd and os.path.basename(cmd[0]) == "tail" and "-F" in cmd:
            found["tail"].append(proc)
    return found


# -- the bound ----------------------------------------------------------------------------------


async def test_a_slow_start_costs_at_most_five_remote_commands_for_its_wait(
    sshd_server, tmp_path: Path, fleets
) -> None:
    path = fleet_file(tmp_path, sshd_server, {"slow": ["--load-time", "6", "--shards", "12"]})
    fleet, outcomes, host = await start(fleets, path)
    commands, sessions = host.commands, sshd_sessions(sshd_server)
    started = time.monotonic()
    verdict = (await fleet.wait(outcomes, smoke=True))["slow"]
    elapsed = time.monotonic() - started
    assert verdict.state is State.READY, verdict
    assert verdict.progress  # the loading lines arrived through the watcher
    # Long enough that polling the status file and the group (~25 commands a second) would have
    # cost well over a hundred commands.
    assert elapsed > 4, elapsed
    assert host.commands - commands <= WAIT_COMMANDS, host.commands - commands
    assert sshd_sessions(sshd_server) - sessions <= WAIT_COMMANDS, sshd_sessions(sshd_server) - sessions


async def test_a_whole_start_costs_at_most_five_remote_commands_per_server(
    sshd_server, tmp_path: Path, fleets
) -> None:
    """Launch and wait of four slow-loading servers on one host: at most 5 remote commands each
    (the launch, its record, the watcher, the identity check, the verdict's record) plus the
    host's own two (connect probe, adopt-check batch). The second start appends to the same logs:
    the line numbers the launch counted are the files' own."""
    names = ["s0", "s1", "s2", "s3"]
    path = fleet_file(tmp_path, sshd_server, {n: ["--load-time", "5", "--shards", "10"] for n in names})
    for attempt in range(2):
        fleet = fleets(Fleet.load(path))
        host = fleet.binding("rig").host
        assert isinstance(host, SSHHost) and host.commands == 0
        sessions = sshd_sessions(sshd_server)
        started = time.monotonic()
        outcomes = await fleet.start()
        assert all(o.action.value == "launched" for o in outcomes.values()), outcomes
        verdicts = await fleet.wait(outcomes, smoke=True)
        assert all(v.state is State.READY and v.progress for v in verdicts.values()), verdicts
        assert time.monotonic() - started > 4  # polling (~25 commands a second per server) would cost hundreds
        bound = WAIT_COMMANDS * len(names) + 2
        assert host.commands <= bound, host.commands
        assert sshd_sessions(sshd_server) - sessions <= bound, sshd_sessions(sshd_server) - sessions
        for name in names:
            record = await fleet.record(name)
            assert record is not None
            text = Path(record.log_path).read_bytes()
            assert text[: record.log_offset].endswith(b" ====\n")  # this attempt starts after its marker
            assert outcomes[name].log_line_no == text[: record.log_offset].count(b"\n") + 1
            assert text[: record.log_offset].count(b"==== servefleet launch") == attempt + 1
        await fleet.down(grace_s=2)


# -- failure paths ------------------------------------------------------------------------------


async def test_a_server_dying_while_loading_is_diagnosed(sshd_server, tmp_path: Path, fleets) -> None:
    args = ["--load-time", "30", "--fail-at-startup", "gpu_oom", "--fail-delay", "3"]
    path = fleet_file(tmp_path, sshd_server, {"oom": args})
    fleet, outcomes, host = await start(fleets, path)
    sessions = sshd_sessions(sshd_server)
    started = time.monotonic()
    # keep_failed: count the wait's own commands (stopping a failed server, `up`'s default, is not the wait)
    verdict = (await asyncio.wait_for(fleet.wait(outcomes, smoke=False, keep_failed=True), 60))["oom"]
    assert verdict.state is State.FAILED and verdict.category is Category.GPU_OOM, verdict
    assert verdict.evidence is not None  # the fatal lines came through the watcher
    assert time.monotonic() - started < 20  # at the death, not at the 30 s load or the timeout
    assert sshd_sessions(sshd_server) - sessions <= WAIT_COMMANDS


async def test_an_exit_while_loading_reaches_the_verdict_with_its_code(sshd_server, tmp_path: Path) -> None:
    """Nothing in the log says why: the exit code, read remotely by the watcher from the
    wrapper's status file, is the whole diagnosis."""
    host = SSHHost(sshd_server.spec(workdir=str(tmp_path / "remote")))
    try:
        log, status = tmp_path / "e.log", tmp_path / "e.status"
        pgid = await host.spawn_detached(
            ["sh", "-c", "echo starting up; sleep 3; exit 7"], log_path=str(log), status_path=str(status)
        )
        port = free_port()  # nobody listens: the probe is refused throughout
        target = WaitTarget(
            base_url=await host.url_for(port),
            engine=get_engine("sim"),
            host=host,
            log_path=str(log),
            pgid=pgid,
            status_path=str(status),
            port=port,
        )
        commands, sessions = host.commands, sshd_sessions(sshd_server)
        verdict = await asyncio.wait_for(wait_for_server(target, timeout_s=60, stall_s=30, smoke=False), 30)
        assert verdict.state is State.FAILED and verdict.exit_code == 7, verdict
        assert "7" in (verdict.message or ""), verdict
        assert host.commands - commands <= WAIT_COMMANDS and sshd_sessions(sshd_server) - sessions <= WAIT_COMMANDS
    finally:
        await host.close()


@pytest.mark.parametrize("what", ["server", "group"])
async def test_a_killed_server_is_reported_through_the_watcher(sshd_server, tmp_path: Path, fleets, what: str) -> None:
    path = fleet_file(tmp_path, sshd_server, {"k": ["--load-time", "60", "--shards", "30"]})
    fleet, outcomes, host = await start(fleets, path)
    record = outcomes["k"].record
    waiting = asyncio.ensure_future(fleet.wait(outcomes, smoke=False))
    log = Path(record.log_path)
    await async_wait_until(lambda: _loading(log), timeout=30, what="the server to start loading")
    await async_wait_until(
        lambda: _has_watcher(record.log_path), timeout=30, interval=0.2, what="the remote watcher to run"
    )
    if what == "server":  # the engine dies, its wrapper records 128 + SIGKILL
        for pid in group_members(record.pgid):
            if pid != record.pgid:
                os.kill(pid, signal.SIGKILL)
    else:  # the whole group, wrapper included: no status file at all
        os.killpg(record.pgid, signal.SIGKILL)
    killed_at = time.monotonic()
    verdict = (await asyncio.wait_for(waiting, 30))["k"]
    assert verdict.state is State.FAILED and verdict.category is Category.KILLED, verdict
    assert time.monotonic() - killed_at < 10


@pytest.mark.parametrize("part", ["loop", "tail"])
async def test_a_killed_watcher_is_replaced_and_the_wait_goes_on(
    sshd_server, tmp_path: Path, fleets, part: str
) -> None:
    """The watcher's loop killed: its heartbeat stops, the stream is restarted after
    alive_timeout. Its tail killed: the stream ends and is restarted. Either way the wait still
    sees the server die, and it does not hang."""
    path = fleet_file(tmp_path, sshd_server, {"w": ["--load-time", "60", "--shards", "30"]})
    fleet, outcomes, host = await start(fleets, path)
    record = outcomes["w"].record
    waiting = asyncio.ensure_future(fleet.wait(outcomes, smoke=False))
    await async_wait_until(lambda: _loading(Path(record.log_path)), timeout=30, what="the server to start loading")
    await async_wait_until(
        lambda: _has_watcher(record.log_path), timeout=30, interval=0.2, what="the remote watcher to run"
    )
    first = watcher_processes(record.log_path)
    old = {p.pid for p in first["loop"] + first["tail"]}
    for proc in first[part]:
        proc.kill()

    async def replaced() -> bool:
        now = watcher_processes(record.log_path)
        return bool(now["loop"]) and not {p.pid for p in now["loop"]} & old

    await async_wait_until(replaced, timeout=ALIVE_TIMEOUT + 15, interval=0.2, what="a new remote watcher")
    assert not waiting.done()
    os.killpg(record.pgid, signal.SIGKILL)
    verdict = (await asyncio.wait_for(waiting, 30))["w"]
    assert verdict.state is State.FAILED and verdict.category is Category.KILLED, verdict


async def _loading(log: Path) -> bool:
    return log.exists() and b"Loading" in log.read_bytes()


async def _has_watcher(log_path: str) -> bool:
    found = watcher_processes(log_path)
    return bool(found["loop"] and found["tail"])


# -- SSHHost.watch itself -----------------------------------------------------------------------


@pytest.fixture(params=["multiplexed", "direct"])
async def host(request: pytest.FixtureRequest, sshd_server, tmp_path: Path) -> AsyncIterator[SSHHost]:
    """Over the master connection, and without one (``multiplex = false``: one connection per
    command, so the watcher's stream is a connection of its own)."""
    h = SSHHost(
        sshd_server.spec(
            workdir=str(tmp_path / "remote"), multiplex=request.param == "multiplexed", **_alive(ALIVE_TIMEOUT)
        )
    )
    yield h
    await h.close()


def _alive(timeout: int) -> dict[str, int]:
    from servefleet.hosts.ssh_options import SSHSpec

    return SSHSpec.alive_settings(timeout)


async def collect(agen: AsyncIterator, timeout: float = 30.0) -> list:
    items = []
    async with asyncio.timeout(timeout):
        async for item in agen:
            items.append(item)
    return items


async def test_watch_delivers_the_whole_log_then_the_exit_code(host: SSHHost, tmp_path: Path) -> None:
    log, status = tmp_path / "a.log", tmp_path / "a.status"
    log.write_bytes(b"earlier run\n")
    offset = log.stat().st_size
    # many lines written right before the exit: they must all come before Exited
    script = 'i=0; while [ $i -lt 2000 ]; do echo "line $i"; i=$((i+1)); done; sleep 1; echo last; exit 3'
    pgid = await host.spawn_detached(["sh", "-c", script], log_path=str(log), status_path=str(status))
    items = await collect(host.watch(str(log), offset, pgid=pgid, status_path=str(status)))
    assert items[-1] == Exited(3)
    data = b"".join(i for i in items if isinstance(i, bytes))
    assert data == log.read_bytes()[offset:] and data.endswith(b"last\n")


async def test_watch_ignores_an_earlier_status_file_while_the_group_lives(host: SSHHost, tmp_path: Path) -> None:
    # The status file the watcher reads is ours here (not the wrapper's), so the test decides
    # when it goes and comes: an earlier attempt's "99" first, then this attempt's "5".
    log, status = tmp_path / "b.log", tmp_path / "b.status"
    status.write_text("99\n")
    pgid = await host.spawn_detached(["sleep", "60"], log_path=str(log), status_path=str(tmp_path / "wrapper.status"))
    watching = host.watch(str(log), pgid=pgid, status_path=str(status))
    try:
        first = asyncio.ensure_future(_next_fate(watching))
        await async_wait_until(lambda: _has_loop_for(pgid), timeout=20, interval=0.2, what="the watcher to run")
        await asyncio.sleep(1.0)  # the watcher looks every 0.1 s: time enough to (wrongly) report 99
        assert not first.done()
        status.unlink()  # as the wrapper's own `rm -f` at the start of an attempt
        await asyncio.sleep(0.5)
        status.write_text("5\n")
        assert await asyncio.wait_for(first, 20) == Exited(5)
    finally:
        first.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await first
        await watching.aclose()
        os.killpg(pgid, signal.SIGKILL)


async def _next_fate(watching: AsyncIterator) -> Exited:
    async for item in watching:
        if isinstance(item, Exited):
            return item
    raise AssertionError("the watch ended without an exit")


async def test_watch_without_a_log_and_a_group_killed_outright(host: SSHHost, tmp_path: Path) -> None:
    log, status = tmp_path / "c.log", tmp_path / "c.status"
    pgid = await host.spawn_detached(["sleep", "60"], log_path=str(log), status_path=str(status))
    watching = asyncio.ensure_future(collect(host.watch(None, pgid=pgid, status_path=str(status))))
    await async_wait_until(lambda: _has_loop_for(pgid), timeout=20, interval=0.2, what="the watcher to run")
    os.killpg(pgid, signal.SIGKILL)
    assert await asyncio.wait_for(watching, 20) == [Exited(None, killed=True)]


async def test_watch_reports_a_missing_log_and_its_appearance(host: SSHHost, tmp_path: Path) -> None:
    log, status = tmp_path / "later" / "d.log", tmp_path / "d.status"
    pgid = await host.spawn_detached(["sleep", "60"], log_path=str(tmp_path / "other.log"), status_path=str(status))
    watching = host.watch(str(log), pgid=pgid, status_path=str(status))
    try:
        assert await asyncio.wait_for(watching.__anext__(), 20) == LogAbsent()
        log.parent.mkdir()
        log.write_bytes(b"hello\n")
        got = [await asyncio.wait_for(watching.__anext__(), 20)]
        while not any(isinstance(i, bytes) for i in got):
            got.append(await asyncio.wait_for(watching.__anext__(), 20))
        assert got[0] == LogAbsent(present=True) and b"".join(i for i in got if isinstance(i, bytes)) == b"hello\n"
        os.killpg(pgid, signal.SIGKILL)
        item = await asyncio.wait_for(watching.__anext__(), 20)
        assert item == Exited(None, killed=True)
    finally:
        await watching.aclose()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)


async def _has_loop_for(pgid: int) -> bool:
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        if cmd[:2] == ["sh", "-c"] and "watch_loop" in cmd[2] and str(pgid) in cmd[3:]:
            return True
    return False
