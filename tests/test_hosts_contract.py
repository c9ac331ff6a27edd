"""One contract every Host implementation passes (the fsspec "abstract tests" shape): each test
receives a ``host`` fixture — LocalHost, and SSHHost reaching a real sshd on 127.0.0.1 — plus a
work folder on that host. The SSH "remote" is this machine, so tests may prepare files directly;
everything they assert goes through the Host interface.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import aiohttp
import pytest

from conftest import async_wait_until, free_port
from servefleet.errors import CommandError, HostError
from servefleet.hosts.base import Host, Truncated
from servefleet.hosts.local import LocalHost

WEIRD = "a b 'quoted' \"dq\" $(touch pwned) `touch pwned2` ; & | * ~ $HOME \\ ünï"


@pytest.fixture(params=["local", "ssh"])
async def host(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Host]:
    if request.param == "local":
        h: Host = LocalHost()
    else:
        from servefleet.hosts.ssh import SSHHost

        server = request.getfixturevalue("sshd_server")
        h = SSHHost(server.spec(workdir=str(tmp_path / "remote")))
    yield h
    await h.close()


@pytest.fixture
def work(tmp_path: Path) -> Path:
    path = tmp_path / "work dir"  # a space in every path the contract uses
    path.mkdir()
    return path


async def next_within(agen: AsyncIterator[bytes | Truncated], timeout: float) -> bytes | Truncated:
    return await asyncio.wait_for(agen.__anext__(), timeout)


async def collect(
    agen: AsyncIterator[bytes | Truncated],
    until: Callable[[list[bytes | Truncated]], bool],
    timeout: float = 15.0,
    items: list[bytes | Truncated] | None = None,
) -> list[bytes | Truncated]:
    """Append items from ``agen`` to ``items`` until ``until(items)`` holds; fail after ``timeout``."""
    items = [] if items is None else items
    deadline = time.monotonic() + timeout
    while not until(items):
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"follow did not deliver the expected items within {timeout}s: {items!r}")
        items.append(await next_within(agen, left))
    return items


def after_last_truncation(items: list[bytes | Truncated]) -> bytes | None:
    """The bytes after the last Truncated marker, or None when there is none."""
    for i in range(len(items) - 1, -1, -1):
        if isinstance(items[i], Truncated):
            return b"".join(x for x in items[i + 1 :] if isinstance(x, bytes))
    return None


# -- run ------------------------------------------------------------------------------------


async def test_run_returns_output_and_codes(host: Host) -> None:
    result = await host.run(["sh", "-c", "echo out; echo err >&2; exit 0"])
    assert result.returncode == 0 and result.stdout == "out\n" and result.stderr == "err\n"
    failed = await host.run(["sh", "-c", "echo nope >&2; exit 7"], check=False)
    assert failed.returncode == 7 and "nope" in failed.stderr
    with pytest.raises(CommandError) as info:
        await host.run(["sh", "-c", "echo broken >&2; exit 3"])
    assert info.value.returncode == 3 and "broken" in str(info.value)
    fed = await host.run(["cat"], input=b"fed through stdin\n")
    assert fed.stdout == "fed through stdin\n"


async def test_arguments_reach_the_program_literally(host: Host, work: Path) -> None:
    result = await host.run(["printf", "%s\\n", WEIRD, "", "two\nlines"], timeout=30)
    assert result.stdout == f"{WEIRD}\n\ntwo\nlines\n"
    assert not (Path.home() / "pwned").exists() and not (work / "pwned").exists()


# -- detached processes ---------------------------------------------------------------------


async def test_spawn_detached_leads_its_group_and_is_signalled(host: Host, work: Path) -> None:
    log, status = str(work / "srv.log"), str(work / "state" / "srv.status")
    pgid = await host.spawn_detached(
        ["sh", "-c", 'echo "arg=$1 env=$SF_TEST_VAR cwd=$(pwd)"; exec sleep 60', "sh", WEIRD],
        log_path=log,
        status_path=status,
        env={"SF_TEST_VAR": "v a l"},
        cwd=str(work),
    )
    assert await host.group_alive(pgid)
    ids = await host.run(["ps", "-o", "pid=,pgid=,sid=", "-p", str(pgid)])
    assert ids.stdout.split() == [str(pgid)] * 3  # session and group leader: pid == pgid == sid

    async def logged() -> bool:
        return b"arg=" in await host.read_bytes(log)

    await async_wait_until(logged, what="the server's first log line")
    assert (await host.read_bytes(log)).decode() == f"arg={WEIRD} env=v a l cwd={work}\n"

    await host.signal_group(pgid, signal.SIGTERM)

    async def gone() -> bool:
        return not await host.group_alive(pgid)

    await async_wait_until(gone, what="the group to exit after SIGTERM")
    await async_wait_until(lambda: _exists(host, status), what="the status file")
    assert (await host.read_bytes(status)).strip() == b"143"  # sleep died of SIGTERM (128 + 15)


async def _exists(host: Host, path: str) -> bool:
    return await host.file_size(path) is not None


async def test_sigkill_of_the_group_leaves_no_status(host: Host, work: Path) -> None:
    status = str(work / "k.status")
    pgid = await host.spawn_detached(["sleep", "60"], log_path=str(work / "k.log"), status_path=status)
    assert await host.group_alive(pgid)
    await host.signal_group(pgid, signal.SIGKILL)

    async def gone() -> bool:
        return not await host.group_alive(pgid)

    await async_wait_until(gone, what="the group to die")
    assert await host.file_size(status) is None  # no status file + dead group => killed
    await host.signal_group(pgid, signal.SIGTERM)  # a group that is gone is not an error
    assert not await host.group_alive(2**22 + 12345)


async def test_exit_code_is_recorded(host: Host, work: Path) -> None:
    status = str(work / "e.status")
    pgid = await host.spawn_detached(
        ["sh", "-c", "echo bye; exit 3"], log_path=str(work / "e.log"), status_path=status
    )
    await async_wait_until(lambda: _exists(host, status), what="the status file")
    assert (await host.read_bytes(status)).strip() == b"3"

    async def gone() -> bool:  # the wrapper exits right after writing the status file
        return not await host.group_alive(pgid)

    await async_wait_until(gone, what="the wrapper to exit")
    assert await host.read_bytes(str(work / "e.log")) == b"bye\n"


async def test_launch_marks_the_log_counts_its_lines_and_starts_the_server(host: Host, work: Path) -> None:
    log, status = work / "logs dir" / "l $(x).log", work / "run dir" / "l.status"
    log.parent.mkdir()
    log.write_bytes(b"earlier run\nits last line was cut")  # a previous attempt died mid-line
    status.parent.mkdir()
    status.write_text("9\n")  # the previous attempt's exit code: stale
    marker = f"==== launch {WEIRD} ===="
    launched = await host.launch(
        ["sh", "-c", 'echo "up $GREETING"; exec sleep 60'],
        log_path=str(log),
        status_path=str(status),
        marker=marker,
        env={"GREETING": "hi there"},
    )
    try:
        before = f"earlier run\nits last line was cut\n{marker}\n".encode()
        assert launched.log_offset == len(before) and launched.line_no == 4  # the byte after the marker starts line 4
        assert launched.state == "alive" and launched.code is None
        assert await host.group_alive(launched.pgid)
        assert not status.exists()  # the stale status file went before the server started

        async def first_line() -> bool:
            return log.read_bytes().startswith(before + b"up hi there\n")

        await async_wait_until(first_line, what="the server's first line after the marker")
    finally:
        await host.signal_group(launched.pgid, signal.SIGKILL)


async def test_launch_into_a_new_log_and_a_server_that_exits_at_once(host: Host, work: Path) -> None:
    log, status = work / "fresh" / "n.log", work / "fresh" / "n.status"
    launched = await host.launch(
        ["sh", "-c", "exit 5"], log_path=str(log), status_path=str(status), marker="==== m ===="
    )
    assert launched.log_offset == len(b"==== m ====\n") and launched.line_no == 2
    assert log.stat().st_mode & 0o777 == 0o600 and (log.parent.stat().st_mode & 0o777) == 0o700
    await async_wait_until(lambda: _exists(host, str(status)), what="the status file")
    assert status.read_text().strip() == "5"
    assert launched.state in ("alive", "exited")  # it may still be exiting when the launch looks
    if launched.state == "exited":
        assert launched.code == 5


async def test_launch_that_cannot_write_its_log_starts_nothing(host: Host, work: Path) -> None:
    blocker = work / "not a folder"
    blocker.write_text("a file where the log's folder should be")
    with pytest.raises(Exception) as info:
        await host.launch(
            ["sh", "-c", f"touch {str(work / 'started')!r}"],
            log_path=str(blocker / "x.log"),
            status_path=str(work / "x.status"),
            marker="m",
        )
    assert isinstance(info.value, (HostError, OSError)), info.value
    assert not (work / "started").exists()


# -- files ----------------------------------------------------------------------------------


async def test_read_bytes_and_file_size(host: Host, work: Path) -> None:
    path = work / "data $(x).bin"
    payload = bytes(range(256)) * 64
    path.write_bytes(payload)
    assert await host.file_size(str(path)) == len(payload)
    assert await host.read_bytes(str(path)) == payload
    assert await host.read_bytes(str(path), 100, 50) == payload[100:150]
    assert await host.read_bytes(str(path), len(payload) - 3) == payload[-3:]
    assert await host.read_bytes(str(path), len(payload) + 10) == b""
    assert await host.file_size(str(work / "missing")) is None
    with pytest.raises(FileNotFoundError):
        await host.read_bytes(str(work / "missing"))


async def test_write_bytes_is_private_and_atomic(host: Host, work: Path) -> None:
    path = work / "deep" / "er" / "state 'one'.json"
    await host.write_bytes(str(path), b"first")
    await host.write_bytes(str(path), b"\x00second\xff" * 1000)
    assert path.read_bytes() == b"\x00second\xff" * 1000
    assert path.stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]  # no temporary left behind
    await host.remove(str(path))
    assert not path.exists()
    await host.remove(str(path))  # missing is fine


# -- follow ---------------------------------------------------------------------------------


async def test_follow_streams_growth_from_an_offset(host: Host, work: Path) -> None:
    path = work / "grow.log"
    path.write_bytes(b"skip-me\nline 1\n")
    agen = host.follow(str(path), offset=8)
    try:
        items = await collect(agen, lambda xs: b"".join(x for x in xs if isinstance(x, bytes)) == b"line 1\n")
        with path.open("ab") as fh:
            fh.write(b"line 2\npartial")
        await collect(
            agen, lambda xs: b"".join(x for x in xs if isinstance(x, bytes)).endswith(b"partial"), items=items
        )
        assert b"".join(x for x in items if isinstance(x, bytes)) == b"line 1\nline 2\npartial"
        assert not any(isinstance(x, Truncated) for x in items)
    finally:
        await agen.aclose()


async def test_follow_waits_for_a_missing_file(host: Host, work: Path) -> None:
    path = work / "later.log"
    agen = host.follow(str(path))
    try:
        first = asyncio.ensure_future(next_within(agen, 15))
        await asyncio.sleep(0)  # the follower is running; the file does not exist yet
        path.write_bytes(b"hello\n")
        assert await first == b"hello\n"
    finally:
        await agen.aclose()


async def test_follow_reports_truncation(host: Host, work: Path) -> None:
    path = work / "trunc.log"
    path.write_bytes(b"old one\nold two\n")
    agen = host.follow(str(path))
    try:
        await collect(agen, lambda xs: b"".join(x for x in xs if isinstance(x, bytes)) == b"old one\nold two\n")
        path.write_bytes(b"")  # truncated in place
        items = await collect(agen, lambda xs: any(isinstance(x, Truncated) for x in xs))
        assert items[-1] == Truncated(0)
        with path.open("ab") as fh:
            fh.write(b"new\n")
        await collect(agen, lambda xs: after_last_truncation(xs) == b"new\n", items=items)
    finally:
        await agen.aclose()


async def test_follow_notices_a_replaced_file(host: Host, work: Path) -> None:
    path = work / "rot.log"
    path.write_bytes(b"generation 1\n")
    agen = host.follow(str(path))
    try:
        await collect(agen, lambda xs: b"".join(x for x in xs if isinstance(x, bytes)) == b"generation 1\n")
        fresh = work / "rot.log.new"
        fresh.write_bytes(b"generation 2, a longer first line\n")
        os.replace(fresh, path)
        await collect(agen, lambda xs: after_last_truncation(xs) == b"generation 2, a longer first line\n")
    finally:
        await agen.aclose()


async def test_follow_from_beyond_the_end_is_a_truncation(host: Host, work: Path) -> None:
    path = work / "short.log"
    path.write_bytes(b"tiny\n")
    agen = host.follow(str(path), offset=1000)
    try:
        items = await collect(agen, lambda xs: after_last_truncation(xs) == b"tiny\n")
        assert isinstance(items[0], Truncated)
    finally:
        await agen.aclose()


# -- ports ----------------------------------------------------------------------------------


async def _start_http(host: Host, work: Path) -> tuple[int, int]:
    (work / "hello.txt").write_text("served through the host\n")
    port = free_port()
    pgid = await host.spawn_detached(
        [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", "--directory", str(work), str(port)],
        log_path=str(work / "http.log"),
        status_path=str(work / "http.status"),
    )

    async def listening() -> bool:
        return await host.port_holder(port) is not None

    await async_wait_until(listening, timeout=20, what="the HTTP server to listen")
    return port, pgid


async def test_port_holder_names_our_group(host: Host, work: Path) -> None:
    assert await host.port_holder(free_port()) is None
    port, pgid = await _start_http(host, work)
    try:
        holder = await host.port_holder(port)
        assert holder is not None and holder.pgid == pgid and holder.pid is not None
    finally:
        await host.signal_group(pgid, signal.SIGKILL)


async def test_url_for_reaches_a_server_on_the_host(host: Host, work: Path) -> None:
    port, pgid = await _start_http(host, work)
    try:
        url = await host.url_for(port)
        assert url.startswith("http://127.0.0.1:")
        assert await host.url_for(port) == url  # one forward per port
        async with aiohttp.ClientSession() as session, session.get(f"{url}/hello.txt") as resp:
            assert resp.status == 200
            assert await resp.text() == "served through the host\n"
    finally:
        await host.signal_group(pgid, signal.SIGKILL)


async def test_failures_are_host_errors(host: Host, work: Path) -> None:
    with pytest.raises(HostError):
        await host.run(["/nonexistent/program"])


async def _child_pid(host: Host, log: str) -> int:
    async def logged() -> bool:
        return await host.file_size(log) is not None and b"child=" in await host.read_bytes(log)

    await async_wait_until(logged, what="the child's pid in the log")
    return int((await host.read_bytes(log)).decode().split("child=")[1].split()[0])


@pytest.mark.parametrize("reaped", [True, False], ids=["reaped-by-its-shell", "zombie"])
async def test_pid_status_sees_a_child_die_while_its_group_lives(host: Host, work: Path, reaped: bool) -> None:
    # A plain child of a live shell shares the shell's group: the group outlives it (issue 12, item 5).
    log = str(work / "p.log")
    then = "wait; exec sleep 60" if reaped else "exec sleep 60"  # exec'd sleep never reaps: a zombie stays
    pgid = await host.spawn_detached(
        ["sh", "-c", f'sleep 60 & echo "child=$!"; {then}'], log_path=log, status_path=str(work / "p.status")
    )
    try:
        child = await _child_pid(host, log)
        alive = await host.pid_status(child)
        assert alive.alive and alive.ppid is not None and alive.started is not None
        await host.run(["kill", "-9", str(child)])

        want = "gone" if reaped else "zombie"  # reaped: a zombie for an instant first

        async def dead() -> bool:
            return (await host.pid_status(child)).state == want

        await async_wait_until(dead, what=f"pid_status to see the child {want}")
        after = await host.pid_status(child)
        if reaped:
            assert after.state == "gone" and after.code is None
        else:
            assert after.state == "zombie" and after.code == -signal.SIGKILL
        assert await host.group_alive(pgid)  # the group lives on: group liveness alone misses this death
        assert (await host.pid_status(2**22 + 12345)).state == "gone"
    finally:
        await host.signal_group(pgid, signal.SIGKILL)
