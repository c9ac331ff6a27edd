"""The sim as a process: bind, play the start-up log over ``--load-time``, inject start-up faults,
become ready, serve until SIGTERM/SIGINT.

Order of events, as with the real engines:

1. argument/import failures happen before any log line (``--fail-at-startup config_error``);
2. the port is bound at once (``/health`` answers 503 while loading). If it is really taken, the
   style's own port-conflict text is printed where that engine would print it (vLLM at once, SGLang
   after loading, when uvicorn binds) and the process exits;
3. the timeline of :mod:`.styles` plays; an injected failure interrupts it at its natural point (or
   ``--fail-delay`` seconds in) with the text of :mod:`.failures`; ``--hang-loading`` stops printing
   there and stays alive;
4. the HTTP server "comes up" (uvicorn lines); ``--fail-after-ready`` fails here, ``--fail-delay``
   seconds later, with ``/health`` still 503; otherwise ``/health`` turns 200 and the ready line
   ("The server is fired up and ready to roll!" / "Application startup complete.") is printed at
   that moment.
"""

from __future__ import annotations

import asyncio
import errno
import os
import signal
import socket
import subprocess
import sys
from typing import NoReturn

from aiohttp import web

from servefleet.catalog import Category
from servefleet.sim.config import SimConfig
from servefleet.sim.failures import Failure, after_ready_failure, startup_failure
from servefleet.sim.logline import LogWriter, Renderer
from servefleet.sim.script import plan_startup
from servefleet.sim.server import SimServer
from servefleet.sim.styles import API, ENGINE, ready_lines, server_up_lines, shutdown_lines

__all__ = ["SimProcess", "run"]

_CHILD = "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    time.sleep(3600)\n"


class SimProcess:
    def __init__(self, cfg: SimConfig) -> None:
        self.cfg = cfg
        self.renderer = Renderer(cfg.style, tp=cfg.tp, color=cfg.color, pids={API: os.getpid()})
        self.log = LogWriter(self.renderer)
        self.children: list[subprocess.Popen[bytes]] = []
        self.server: SimServer | None = None
        self.runner: web.AppRunner | None = None

    # ---- ending the process ---------------------------------------------------------------------
    def exit_with(self, failure: Failure) -> NoReturn:
        """Print a failure's text and end as that engine does (exit status, or SIGKILL of itself)."""
        self.log.emit(failure.lines)
        if failure.kill_children:
            self._kill_children()
        code = self.cfg.fail_exit_code if self.cfg.fail_exit_code is not None else failure.exit_code
        if code is None:
            os.kill(os.getpid(), signal.SIGKILL)
            os._exit(
                137
            )  # not reached (SIGKILL ends the process); says so to the type checker, as exit_with is NoReturn
        os._exit(code)

    def hard_exit(self, mode: str) -> NoReturn:
        """An abrupt crash: no text, children left behind (as a crashed engine leaves them)."""
        if mode == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        os._exit(1)

    def _kill_children(self, grace_s: float = 0.0) -> None:
        """SIGTERM (with ``grace_s``) then SIGKILL the children, and reap them."""
        if grace_s > 0:
            for child in self.children:
                if child.poll() is None:
                    child.terminate()
            for child in self.children:
                try:
                    child.wait(timeout=grace_s)
                except subprocess.TimeoutExpired:
                    pass
        for child in self.children:
            if child.poll() is None:
                child.kill()
        for child in self.children:
            try:
                child.wait(timeout=2)
            except subprocess.TimeoutExpired:
                pass

    # ---- start-up -------------------------------------------------------------------------------
    def _bind(self) -> tuple[socket.socket | None, int]:
        cfg = self.cfg
        family = socket.AF_INET6 if ":" in cfg.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does
        try:
            sock.bind((cfg.host, cfg.bind_port))
        except OSError as exc:
            sock.close()
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return None, cfg.bind_port
            raise
        sock.listen(1024)
        sock.setblocking(False)
        return sock, sock.getsockname()[1]

    def _spawn_children(self) -> None:
        for _ in range(self.cfg.children):
            self.children.append(
                subprocess.Popen(
                    [sys.executable, "-c", _CHILD],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        if self.children:
            self.renderer.pids[ENGINE] = self.children[0].pid

    async def _play(self, port: int, failure: Failure | None) -> None:
        """Play the loading timeline in real time; a failure exits, a hang never returns."""
        cfg = self.cfg
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        plan = plan_startup(cfg, port, failure)
        for at, lines in plan.steps:
            await asyncio.sleep(max(0.0, t0 + at - loop.time()))
            self.log.emit(lines)
        if plan.outcome == "fail" and plan.failure is not None:
            await asyncio.sleep(max(0.0, t0 + (plan.fail_at_s or 0.0) - loop.time()))
            self.exit_with(plan.failure)
        if plan.outcome == "hang":
            await asyncio.Event().wait()  # alive, silent, never ready
        await asyncio.sleep(max(0.0, t0 + cfg.load_time - loop.time()))

    async def _life(self) -> None:
        cfg = self.cfg
        failure: Failure | None = None
        if cfg.fail_at_startup is not None:
            failure = startup_failure(cfg, cfg.fail_at_startup, cfg.bind_port)
            if failure.before_log and cfg.fail_delay is None:
                self.exit_with(failure)
        sock, port = self._bind()
        if sock is None:  # the port really is taken: the engine's own text, where it prints it
            failure = startup_failure(cfg.model_copy(update={"fail_variant": 0}), Category.PORT_IN_USE, port)
        elif failure is not None and cfg.fail_at_startup is not None:  # failure is set only when fail_at_startup is
            failure = startup_failure(cfg, cfg.fail_at_startup, port)  # now with the real port in its text
        self._spawn_children()
        if sock is not None:
            self.server = SimServer(cfg, self.log, port, self.exit_with, self.hard_exit)
            self.runner = web.AppRunner(self.server.app(), handler_cancellation=True, access_log=None)
            await self.runner.setup()
            await web.SockSite(self.runner, sock).start()
        await self._play(port, failure)
        assert self.server is not None
        self.log.emit(server_up_lines(cfg, port, os.getpid()))
        if cfg.fail_after_ready is not None:
            late = after_ready_failure(cfg, cfg.fail_after_ready, port)
            self.log.emit(late.prelude)
            await asyncio.sleep(cfg.fail_delay if cfg.fail_delay is not None else 0.2)
            self.exit_with(late)
        warm, ready = ready_lines(cfg, port)
        self.log.emit(warm)
        self.server.ready = True
        self.log.emit(ready)
        await asyncio.Event().wait()

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        life = asyncio.create_task(self._life(), name="sim-life")
        stopper = asyncio.create_task(stop.wait())
        await asyncio.wait({life, stopper}, return_when=asyncio.FIRST_COMPLETED)
        if life.done():
            life.result()  # an unexpected error surfaces with its traceback
        life.cancel()
        self.log.emit(shutdown_lines(self.cfg, os.getpid()))
        if self.runner is not None:
            try:
                await asyncio.wait_for(self.runner.cleanup(), timeout=3)
            except (TimeoutError, asyncio.CancelledError):
                pass
        self._kill_children(grace_s=2.0)
        return 0


def run(cfg: SimConfig) -> int:
    """Run the simulated engine in this process until it is stopped or fails."""
    return asyncio.run(SimProcess(cfg).run())
