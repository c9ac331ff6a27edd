"""Waiting for a server: the I/O edge around the readiness state machine.

Two watchers run concurrently and turn what they see into events on one queue: the host's watch
stream (hosts/watch.py: the log as it grows, split into lines here, a scheduler's queue, then the
exit: the detach wrapper's status file for the code, a group that vanished, the one process a
user pointed at) and the HTTP prober (every ``PROBE_INTERVAL_S``, at once when a ready line
appears). The machine decides; this module only feeds it, starts the smoke request when asked,
and reads capacity from the server once it is ready.

Every watch stream delivers the log to its end before the exit (hosts/watch.py until_exit), so the
last lines a dying server wrote are classified before its exit code is; a last line without its
newline is complete once the process is gone. One path for every host: SSH's stream costs one
remote command per server, a local one polls the disk and the process table.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from servefleet.catalog import State
from servefleet.engines.base import EngineProfile, Probe
from servefleet.errors import HostError
from servefleet.hosts.base import Host, Truncated
from servefleet.hosts.capabilities import batching_of
from servefleet.hosts.local import LocalHost
from servefleet.hosts.watch import Exited, LogAbsent, Pending, WatchHost, WatchItem, poll_watch
from servefleet.http import probe_client
from servefleet.verify.bounded import Bounds, HostSource, line_number_at, read_big_log
from servefleet.verify.events import Event, LogGrew, LogLines, LogMissing, LogTruncated, ProcessExit, Queued, Tick
from servefleet.verify.logtext import LineSplitter
from servefleet.verify.machine import ReadinessMachine, message_shape
from servefleet.verify.probe import Prober, port_of
from servefleet.verify.verdict import Verdict

__all__ = ["WaitTarget", "wait_for_server", "PROBE_INTERVAL_S"]

PROBE_INTERVAL_S = 0.05
TICK_S = 0.1
LIVE_LINE_EVERY_S = 0.25
CATCH_UP_BYTES = 1024 * 1024  # what is read of the log past the follower once the server is ready
FINAL_PROBE_S = 0.5  # the probe made when the process exits, to tell port_in_use from other  # on_update for a new last log line, at most this often


@dataclass
class WaitTarget:
    """What to wait for. Only ``base_url`` is required; every other clue makes the verdict surer."""

    base_url: str  # e.g. http://127.0.0.1:30000
    engine: EngineProfile | None  # None = detect from the log
    host: Host = field(default_factory=LocalHost)
    log_path: str | None = None
    log_offset: int = 0  # start following here (restart appends to the same log)
    pgid: int | None = None  # process group of the launched server (liveness + identity)
    pid: int | None = None  # the server's own pid, watched itself: its group can outlive it (a shell's group)
    status_path: str | None = None  # detach wrapper's exit-code file
    served_model: str | None = None  # expected name in /v1/models (identity when pgid unknown)
    port: int | None = None  # the server's port on its host, when base_url is a forward (SSH)
    probe: Probe | None = None  # overrides the engine's probe (the `openai` engine's ready path)
    log_bounds: Bounds = field(default_factory=Bounds)  # how much of a big existing log is read to catch up
    # The log's line number at log_offset when the launch just counted it (Host.launch): a fresh
    # launch, so neither that count nor a catch-up read is needed (no remote command).
    first_line_no: int | None = None


@dataclass
class _Crashed:
    """A watcher failed (e.g. the host became unreachable): the wait raises its error."""

    error: BaseException


class _LogState:
    def __init__(self, offset: int) -> None:
        self.offset = offset
        self.splitter = LineSplitter()


async def wait_for_server(
    target: WaitTarget,
    *,
    timeout_s: float = 1800,
    stall_s: float = 300,
    smoke: bool = True,
    on_update: Callable[[Verdict], None] | None = None,
) -> Verdict:
    """Wait until the server is ready, failed or stalled, and say which (and why)."""
    clock = time.monotonic
    host = target.host
    # A big log already there (attaching to a long-running server) is caught up on with the same
    # bounded read as `diagnose`, then followed from where that read ended.
    fresh = target.first_line_no is not None
    caught_up = (
        await read_big_log(
            HostSource(host, target.log_path), target.engine, start=target.log_offset, bounds=target.log_bounds
        )
        if target.log_path and not fresh
        else None
    )
    first_line_no = (
        target.first_line_no
        if target.first_line_no is not None
        else await _line_number_at(host, target.log_path, target.log_offset)
    )
    machine = ReadinessMachine(
        target.engine if target.engine is not None or caught_up is None else caught_up.profile,
        now=clock(),
        timeout_s=timeout_s,
        stall_s=stall_s,
        smoke=smoke,
        log_path=target.log_path,
        pgid=target.pgid,
        port=target.port if target.port is not None else port_of(target.base_url),
        first_line_no=first_line_no,
        probe=target.probe,
    )
    queue: asyncio.Queue[Event | _Crashed] = asyncio.Queue()
    wake = asyncio.Event()
    log = _LogState(target.log_offset)
    emitter = _Emitter(on_update)
    if caught_up is not None:
        for window in caught_up.windows:
            machine.feed(LogLines(tuple(window.lines), first_line_no=window.line_no), clock())
        machine.skipped = caught_up.skipped
        log.offset = caught_up.end

    async with probe_client() as client:
        prober = Prober(
            client, target.base_url, host, pgid=target.pgid, port=machine.port, served_model=target.served_model
        )
        prober.work_ahead(lambda: (machine.engine or EngineProfile(), smoke))
        tasks = [_start(_probe_loop(prober, machine, queue, wake), queue)]
        follower: asyncio.Task[None] | None = _start(
            _watch_server(_watch_stream(host, target, log.offset), log, queue), queue
        )
        smoke_task: asyncio.Task[None] | None = None
        try:
            try:
                while not machine.done:
                    event = await _next_event(queue)
                    if isinstance(event, _Crashed):
                        raise event.error
                    if isinstance(event, ProcessExit):
                        if follower is not None:
                            await _stop(follower)
                            follower = None
                            # the stream delivered the log up to the exit: nothing left to read
                            _drain_before_exit(log, queue, machine, clock)
                        if not machine.done:  # who answers on the port now? (another process: port_in_use)
                            with contextlib.suppress(TimeoutError):
                                async with asyncio.timeout(FINAL_PROBE_S):
                                    final = await prober.probe(machine.probe_spec)
                                machine.feed(final, clock())
                    ready_line = machine.clf.ready_line
                    machine.feed(event, clock())
                    if machine.clf.ready_line is not ready_line:
                        wake.set()  # a ready line: probe now rather than at the next interval
                    if machine.wants_smoke:
                        machine.smoke_started()
                        smoke_task = asyncio.create_task(_smoke(prober, machine.engine or EngineProfile(), queue))
                    emitter.emit(machine.verdict(clock()))
                # Lines already read after the cause complete its excerpt.
                while not queue.empty():
                    pending = queue.get_nowait()
                    if isinstance(pending, LogLines):
                        machine.feed(pending, clock())
                if (
                    follower is not None
                    and target.log_path
                    and batching_of(host) is None
                    and machine.verdict(clock()).state is State.READY
                ):
                    # The port answered before the follower read the lines written ahead of it (a busy host):
                    # the log's capacity lines (KV tokens, max running) are read to its end now, not lost. Not
                    # where a round trip costs (SSH: its follower is a stream, and a start has its command budget).
                    await _stop(follower)
                    follower = None
                    await _catch_up(HostSource(host, target.log_path), log, machine, clock)
            finally:
                for task in [*tasks, follower, smoke_task]:
                    if task is not None:
                        await _stop(task)
            verdict = machine.verdict(clock())
            if verdict.state is State.READY:  # endpoint facts first, the log's fill the gaps
                found = await prober.capacity(machine.engine or EngineProfile())
                verdict = verdict.model_copy(update={"capacity": found.merge(verdict.capacity)})
        finally:
            await prober.close()
    emitter.emit(verdict, force=True)
    return verdict


# ---- watchers ---------------------------------------------------------------------------------
# asyncio.timeout rather than asyncio.wait_for throughout: on Python 3.11, wait_for can swallow a
# cancellation that arrives as its inner future completes, and a cancelled wait must end.
async def _next_event(queue: asyncio.Queue) -> Event | _Crashed:
    try:
        async with asyncio.timeout(TICK_S):
            return await queue.get()
    except TimeoutError:
        return Tick()


def _start(coro, queue: asyncio.Queue) -> asyncio.Task[None]:
    async def guarded() -> None:
        try:
            await coro
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # surfaced by the main loop
            queue.put_nowait(_Crashed(exc))

    return asyncio.create_task(guarded())


async def _stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task


def _watch_stream(host: Host, target: WaitTarget, offset: int) -> AsyncIterator[WatchItem]:
    """The host's watch stream; the one polled from its primitives where it has none, for a
    process of the user's (``pid``), or with no process to watch (the log alone)."""
    if (
        isinstance(host, WatchHost)
        and target.pid is None
        and (target.pgid is not None or target.status_path is not None)
    ):
        return host.watch(target.log_path, offset, pgid=target.pgid, status_path=target.status_path)
    return poll_watch(host, target.log_path, offset, pgid=target.pgid, status_path=target.status_path, pid=target.pid)


async def _watch_server(stream: AsyncIterator[WatchItem], log: _LogState, queue: asyncio.Queue) -> None:
    """The watch stream as the machine's events."""
    async for item in stream:
        if isinstance(item, Exited):
            queue.put_nowait(ProcessExit(item.code, killed=item.killed, note=item.note, hint=item.hint))
            return
        if isinstance(item, Pending):
            queue.put_nowait(Queued(item.reason, item.waited_s, item.job_id))
            continue
        if isinstance(item, LogAbsent):
            queue.put_nowait(LogMissing(present=item.present))
            continue
        _log_item(item, log, queue)


def _log_item(item: bytes | Truncated, log: _LogState, queue: asyncio.Queue) -> None:
    if isinstance(item, Truncated):
        log.splitter.reset()
        log.offset = item.offset
        queue.put_nowait(LogTruncated())
        return
    log.offset += len(item)
    lines = log.splitter.feed(item)
    queue.put_nowait(LogLines(tuple(lines)) if lines else LogGrew(log.splitter.pending))


def _drain_before_exit(
    log: _LogState, queue: asyncio.Queue, machine: ReadinessMachine, clock: Callable[[], float]
) -> None:
    """Classify everything the process wrote before it exited (a last line without its newline
    included), then let the exit be applied."""
    held: list[Event | _Crashed] = []
    while not queue.empty():
        event = queue.get_nowait()
        if isinstance(event, (LogLines, LogGrew, LogTruncated, LogMissing)):
            machine.feed(event, clock())
        else:
            held.append(event)
    for event in held:
        queue.put_nowait(event)
    lines = log.splitter.flush()
    if lines:
        machine.feed(LogLines(tuple(lines)), clock())


async def _catch_up(source: HostSource, log: _LogState, machine: ReadinessMachine, clock: Callable[[], float]) -> None:
    """The log from where the follower stopped to its end (at most ``CATCH_UP_BYTES``), as lines for the machine."""
    with contextlib.suppress(OSError, HostError):  # best effort: the verdict stands without them
        size = await source.size()
        if size is None or size <= log.offset:
            return
        data = await source.read(log.offset, min(size - log.offset, CATCH_UP_BYTES))
        log.offset += len(data)
        lines = log.splitter.feed(data)
        if lines:
            machine.feed(LogLines(tuple(lines)), clock())


async def _probe_loop(prober: Prober, machine: ReadinessMachine, queue: asyncio.Queue, wake: asyncio.Event) -> None:
    while True:
        queue.put_nowait(await prober.probe(machine.probe_spec))
        wake.clear()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(PROBE_INTERVAL_S):
                await wake.wait()


async def _smoke(prober: Prober, profile: EngineProfile, queue: asyncio.Queue) -> None:
    queue.put_nowait(await prober.smoke(profile))


async def _line_number_at(host: Host, path: str | None, offset: int) -> int:
    """The line number of the byte at ``offset`` (a restart appends to the same log)."""
    if not path or offset <= 0:
        return 1
    try:  # 16 MB at a time: an offset deep in a big log is not read into memory whole, and a remote
        # host answers a usual prefix in one command
        return await line_number_at(HostSource(host, path), offset, chunk=16 * 1024 * 1024)
    except FileNotFoundError:
        return 1


class _Emitter:
    """Calls on_update when the state, progress, category or message changes (a message whose
    only change is a ticking number does not count), and for a new last log line at most
    every LIVE_LINE_EVERY_S."""

    def __init__(self, callback: Callable[[Verdict], None] | None) -> None:
        self.callback = callback
        self.key: tuple | None = None
        self.line: str | None = None
        self.line_at = 0.0

    def emit(self, verdict: Verdict, force: bool = False) -> None:
        if self.callback is None:
            return
        key = (verdict.state, verdict.progress, verdict.category, message_shape(verdict.message))
        now = time.monotonic()
        line_due = verdict.last_line != self.line and now - self.line_at >= LIVE_LINE_EVERY_S
        if force or key != self.key or line_due:
            self.key = key
            self.line = verdict.last_line
            self.line_at = now
            self.callback(verdict)
