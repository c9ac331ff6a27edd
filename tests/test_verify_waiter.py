"""wait_for_server against real detached processes (a stdlib toy server) and real files."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest

from conftest import async_wait_until, free_port
from servefleet.catalog import Category, State
from servefleet.hosts.local import LocalHost
from servefleet.verify.verdict import Verdict
from servefleet.verify.waiter import WaitTarget, wait_for_server
from test_verify_support import ToyEngine, toy_server_argv

pytestmark = pytest.mark.timeout(60)


class Launcher:
    """Starts toy servers detached, like the fleet layer does, and kills their groups afterwards."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.host = LocalHost()
        self.pgids: list[int] = []

    async def start(self, mode: str, port: int, name: str = "srv", env: dict[str, str] | None = None) -> WaitTarget:
        log = self.tmp_path / f"{name}.log"
        status = self.tmp_path / f"{name}.status"
        pgid = await self.host.spawn_detached(
            toy_server_argv(self.tmp_path, mode, port), log_path=str(log), status_path=str(status), env=env
        )
        self.pgids.append(pgid)
        return WaitTarget(
            base_url=f"http://127.0.0.1:{port}",
            engine=ToyEngine(),
            host=self.host,
            log_path=str(log),
            pgid=pgid,
            status_path=str(status),
        )

    def cleanup(self) -> None:
        for pgid in self.pgids:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.fixture
def launcher(tmp_path: Path):
    lau = Launcher(tmp_path)
    yield lau
    lau.cleanup()


async def test_ready_with_capacity_and_updates(launcher: Launcher, port: int) -> None:
    target = await launcher.start("ready", port)
    updates: list[Verdict] = []
    verdict = await wait_for_server(target, timeout_s=20, stall_s=10, on_update=updates.append)
    assert verdict.state is State.READY, verdict
    assert verdict.engine == "toy"
    assert verdict.capacity.kv_cache_tokens == 4096 and verdict.capacity.max_running_requests == 8
    assert "smoke request answered" in verdict.message
    assert updates[-1].state is State.READY
    assert any(u.progress == "loading weights" for u in updates)
    # every watcher was cancelled on return
    assert [t for t in asyncio.all_tasks() if t is not asyncio.current_task()] == []


class LaggingLogHost(LocalHost):
    """A local host whose log follower has not delivered a byte yet (a busy machine: the port answers first)."""

    def watch(self, log_path, offset=0, **kw):
        async def nothing_yet():
            await asyncio.Event().wait()
            yield b""

        return nothing_yet()


async def test_ready_before_the_follower_read_the_log_still_has_the_logs_capacity(
    launcher: Launcher, port: int
) -> None:
    """CI once saw READY with no capacity: the probe and the smoke request answered before the follower read
    the capacity line the server had written ahead of them. On ready, the log is read to its end."""
    target = await launcher.start("ready", port)
    target.host = LaggingLogHost()
    verdict = await wait_for_server(target, timeout_s=20, stall_s=10)
    assert verdict.state is State.READY, verdict
    assert verdict.capacity.kv_cache_tokens == 4096 and verdict.capacity.max_running_requests == 8, verdict.capacity


async def test_fatal_line_then_exit(launcher: Launcher, port: int) -> None:
    target = await launcher.start("fatal_exit", port)
    verdict = await wait_for_server(target, timeout_s=20, stall_s=10)
    assert verdict.state is State.FAILED and verdict.category is Category.GPU_OOM
    assert verdict.evidence is not None and verdict.evidence.line_no == 5
    assert "Not enough memory" in verdict.evidence.text
    assert verdict.excerpt_start == 2 and "Traceback (most recent call last):" in verdict.excerpt


async def test_exit_zero_after_fatal_is_failed(launcher: Launcher, port: int) -> None:
    target = await launcher.start("exit0_after_fatal", port)
    verdict = await wait_for_server(target, timeout_s=20, stall_s=10)
    assert verdict.state is State.FAILED and verdict.category is Category.GPU_OOM


async def test_fatal_line_while_process_hangs(launcher: Launcher, port: int) -> None:
    target = await launcher.start("fatal_hang", port)
    verdict = await wait_for_server(target, timeout_s=20, stall_s=10)
    assert verdict.state is State.FAILED and verdict.category is Category.GPU_OOM and verdict.exit_code is None


async def test_exit_without_signature_reports_code_and_error_line(launcher: Launcher, port: int) -> None:
    target = await launcher.start("exit_plain", port)
    verdict = await wait_for_server(target, timeout_s=20, stall_s=10)
    assert verdict.state is State.FAILED and verdict.category is Category.OTHER
    assert verdict.exit_code == 3 and "exited with code 3" in verdict.message
    assert verdict.evidence is not None and "something nobody recognises" in verdict.evidence.text


@pytest.mark.parametrize("whole_group", [True, False])
async def test_silent_sigkill_is_killed(launcher: Launcher, port: int, whole_group: bool) -> None:
    target = await launcher.start("silent_kill", port)
    task = asyncio.create_task(wait_for_server(target, timeout_s=20, stall_s=10))
    log = Path(target.log_path)
    await async_wait_until(
        lambda: _async(log.exists() and b"Load weight begin" in log.read_bytes()), what="server log"
    )
    if whole_group:  # the wrapper dies too: no status file is ever written
        os.killpg(target.pgid, signal.SIGKILL)
    else:  # only the server: the wrapper records 137
        os.kill(_server_pid(log), signal.SIGKILL)
    verdict = await task
    assert verdict.state is State.FAILED and verdict.category is Category.KILLED, verdict
    if not whole_group:  # the wrapper's sh says "Killed" in the log, then records 137
        assert verdict.exit_code == 137 or (verdict.evidence is not None and verdict.evidence.text.endswith("Killed"))


async def test_stall_when_nothing_moves(launcher: Launcher, port: int) -> None:
    target = await launcher.start("hang", port)
    verdict = await wait_for_server(target, timeout_s=20, stall_s=1.0)
    assert verdict.state is State.STALLED
    assert verdict.message.startswith("stalled: no log output and no change of the HTTP probe for 1s")
    assert verdict.progress == "loading weights"


async def test_overall_timeout(launcher: Launcher, port: int) -> None:
    target = await launcher.start("hang", port)
    verdict = await wait_for_server(target, timeout_s=0.8, stall_s=100)
    assert verdict.state is State.STALLED and verdict.message.startswith("timed out after 0.8s")


async def test_missing_log_path_is_said_plainly(tmp_path: Path) -> None:
    missing = tmp_path / "nope" / "server.log"
    updates: list[Verdict] = []
    target = WaitTarget(base_url=f"http://127.0.0.1:{free_port()}", engine=ToyEngine(), log_path=str(missing))
    verdict = await wait_for_server(target, timeout_s=10, stall_s=0.6, on_update=updates.append)
    said = f"log file {missing} does not exist (is the path right?)"
    assert verdict.state is State.STALLED and said in verdict.message
    assert any(u.message == said and u.state is not State.STALLED for u in updates)


async def test_port_held_by_another_process_is_not_our_server(launcher: Launcher, port: int) -> None:
    other = await launcher.start("ready", port, name="other")
    assert (await wait_for_server(other, timeout_s=20, stall_s=10, smoke=False)).state is State.READY
    ours = await launcher.start("exit_plain", port, name="ours")  # never binds; exits with 3 after 0.3 s
    updates: list[Verdict] = []
    verdict = await wait_for_server(ours, timeout_s=20, stall_s=10, on_update=updates.append)
    assert verdict.state is State.FAILED and verdict.category is Category.PORT_IN_USE, verdict
    assert "held by pid" in verdict.message
    assert any(u.state is State.LOADING and "not from our server" in (u.message or "") for u in updates)


async def test_identity_by_served_model_without_pgid(launcher: Launcher, port: int) -> None:
    target = await launcher.start("ready", port)
    ok = WaitTarget(base_url=target.base_url, engine=ToyEngine(), served_model="toy-model")
    assert (await wait_for_server(ok, timeout_s=20, stall_s=10)).state is State.READY
    wrong = WaitTarget(base_url=target.base_url, engine=ToyEngine(), served_model="llama-70b")
    verdict = await wait_for_server(wrong, timeout_s=20, stall_s=0.5)
    assert verdict.state is State.STALLED
    assert "/v1/models lists toy-model, not 'llama-70b'" in verdict.message


async def test_die_on_first_request_caught_by_smoke(launcher: Launcher, port: int) -> None:
    target = await launcher.start("die_on_first_request", port)
    verdict = await wait_for_server(target, timeout_s=20, stall_s=10)
    assert verdict.state is State.FAILED and verdict.category is Category.GPU_OOM, verdict
    assert "CUDA out of memory" in verdict.evidence.text


async def test_die_on_first_request_passes_without_smoke(launcher: Launcher, port: int) -> None:
    target = await launcher.start("die_on_first_request", port)
    verdict = await wait_for_server(target, timeout_s=20, stall_s=10, smoke=False)
    assert verdict.state is State.READY


async def test_smoke_http_error_is_a_startup_failure(launcher: Launcher, port: int) -> None:
    target = await launcher.start("smoke_500", port)
    verdict = await wait_for_server(target, timeout_s=20, stall_s=10)
    assert verdict.state is State.FAILED and verdict.category is Category.OTHER
    assert "HTTP 500" in verdict.message and "head size 80" in verdict.message


async def test_truncated_log_restarts_numbering_and_offset_keeps_file_numbers(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text("old attempt\nRuntimeError: Not enough memory. old\n==== launch ====\n")
    offset = log.stat().st_size
    target = WaitTarget(
        base_url=f"http://127.0.0.1:{free_port()}", engine=ToyEngine(), log_path=str(log), log_offset=offset
    )
    task = asyncio.create_task(wait_for_server(target, timeout_s=20, stall_s=10))
    with log.open("a") as fh:
        fh.write("Load weight begin\nOSError: [Errno 98] Address already in use\n")
    verdict = await task
    assert verdict.category is Category.PORT_IN_USE and verdict.evidence.line_no == 5  # the file's numbering

    log.write_text("".join(f"loading line {i}\n" for i in range(20)))
    loading = asyncio.Event()
    target = WaitTarget(base_url=f"http://127.0.0.1:{free_port()}", engine=ToyEngine(), log_path=str(log))
    task = asyncio.create_task(
        wait_for_server(
            target, timeout_s=20, stall_s=10, on_update=lambda v: loading.set() if v.state is State.LOADING else None
        )
    )
    await asyncio.wait_for(loading.wait(), 10)  # the first lines were read
    log.write_text("x\nModuleNotFoundError: No module named 'fa'\n")  # truncated in place (smaller)
    verdict = await task
    assert verdict.category is Category.IMPORT_ERROR and verdict.evidence.line_no == 2, verdict


async def test_partial_fatal_line_at_exit_is_read(tmp_path: Path, port: int) -> None:
    host = LocalHost()
    log, status = tmp_path / "p.log", tmp_path / "p.status"
    argv = ["sh", "-c", "printf 'Load weight begin\\nOSError: [Errno 98] Address already in use'; sleep 0.3; exit 1"]
    pgid = await host.spawn_detached(argv, log_path=str(log), status_path=str(status))
    target = WaitTarget(
        base_url=f"http://127.0.0.1:{port}",
        engine=ToyEngine(),
        host=host,
        log_path=str(log),
        pgid=pgid,
        status_path=str(status),
    )
    verdict = await wait_for_server(target, timeout_s=20, stall_s=10)
    assert verdict.category is Category.PORT_IN_USE and verdict.evidence.line_no == 2


class _LaggingFollower(LocalHost):
    """A local host whose log follower never catches up: it reads nothing (a busy machine)."""

    async def follow(self, path: str, offset: int = 0):  # type: ignore[no-untyped-def, override]
        await asyncio.Event().wait()
        yield b""  # pragma: no cover - never reached


async def test_the_log_is_read_to_its_end_when_the_exit_is_seen_before_the_follower_read_it(
    tmp_path: Path, port: int
) -> None:
    """The exit (a SIGKILL code, as SGLang's launcher kills itself after its child's error) is
    applied only after the rest of the log: the fatal line there decides, not the code."""
    log, status = tmp_path / "k.log", tmp_path / "k.status"
    log.write_bytes(
        b"Load weight begin\nRuntimeError: Not enough memory. Please try to increase --mem-fraction-static.\nKilled\n"
    )
    status.write_text("137\n")
    target = WaitTarget(
        base_url=f"http://127.0.0.1:{port}",
        engine=ToyEngine(),
        host=_LaggingFollower(),
        log_path=str(log),
        status_path=str(status),
        first_line_no=1,
    )
    verdict = await wait_for_server(target, timeout_s=20, stall_s=10)
    assert verdict.category is Category.GPU_OOM and verdict.evidence.line_no == 2, verdict


def _async(value: bool):
    async def inner() -> bool:
        return value

    return inner()


def _server_pid(log: Path) -> int:
    first = log.read_text().splitlines()[0]
    return int(first.rsplit("pid", 1)[1])


class _NobodyListens:
    """A host on which no listening socket is visible (another namespace, or ours just closed)."""

    async def port_holder(self, port: int):
        return None


async def test_identity_when_the_server_stops_answering_is_not_a_wrong_identity() -> None:
    from servefleet.http import probe_client
    from servefleet.verify.probe import Prober

    async with probe_client() as client:
        prober = Prober(client, f"http://127.0.0.1:{free_port()}", _NobodyListens(), pgid=12345, served_model="m")
        ok, detail = await prober.identity()
        assert ok is None and "stopped answering" in detail
        anyone = Prober(client, f"http://127.0.0.1:{free_port()}", _NobodyListens(), pgid=12345)
        assert (await anyone.identity())[0] is True  # nothing to check against: the probe's 2xx stands


async def test_cancelling_the_wait_cancels_every_watcher(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text("Load weight begin\n")
    seen = asyncio.Event()
    target = WaitTarget(
        base_url=f"http://127.0.0.1:{free_port()}", engine=ToyEngine(), log_path=str(log), pgid=os.getpgid(0)
    )
    task = asyncio.create_task(
        wait_for_server(target, timeout_s=30, stall_s=30, on_update=lambda v: seen.set() if v.progress else None)
    )
    await asyncio.wait_for(seen.wait(), 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert [t for t in asyncio.all_tasks() if t is not asyncio.current_task()] == []
