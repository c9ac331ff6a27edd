"""The SSH host: the Host contract over the system OpenSSH client.

Every command is an argument list quoted as a whole with ``shlex.join`` and carried as a mux
client of a master connection (see ssh_master.py), so a model path with spaces, quotes or
``$(...)`` reaches the remote program literally and a command costs no handshake. Servers are
started fully detached on the remote (``setsid`` + the same wrapper as local hosts), so they
survive the SSH link (or, with ``launcher = "systemd-run"``, as transient units of the user's
service manager: see ssh_systemd.py); their logs are followed by one streaming ``tail -F`` per log, which
reconnects and resumes from the last delivered byte when the link drops (ssh_follow.py). A wait
watches each server with one remote watcher (``watch``: log, exit code and a heartbeat on one
session) rather than polling with a command every few tens of milliseconds.

Failures are translated once, here: ssh's exit 255 with a connection-level message becomes
HostUnreachable (within ConnectTimeout), anything else the remote command's CommandError. A link
that goes silent (packets dropped) is noticed by the master's keep-alives (``alive_timeout``,
~16 s by default): commands on it are stopped and reported unreachable at once, never left to
fall back to a fresh connection that would wait out ConnectTimeout as well. ``status`` asks a
whole fleet's questions in one remote command per host (``batch``, ssh_batch.py).
"""

from __future__ import annotations

import asyncio
import shlex
import subprocess
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from servefleet.errors import CommandError, HostError, HostUnreachable, LaunchError
from servefleet.hosts import ssh_follow
from servefleet.hosts import ssh_scripts as scripts
from servefleet.hosts import ssh_systemd as units
from servefleet.hosts.base import (
    CommandResult,
    Launched,
    PortHolder,
    Truncated,
    detach_argv,
    loopback_for,
    proc_command_line,
    proc_owns,
)
from servefleet.hosts.pidstat import GONE, PidStatus, parse_proc_stat
from servefleet.hosts.piped import reap, start_piped
from servefleet.hosts.ssh_batch import Op, batch_argv, chunk_ops, parse_batch
from servefleet.hosts.ssh_master import Master, MasterPool, free_local_port
from servefleet.hosts.ssh_options import SSHSpec, classify_ssh_failure, ssh_argv, ssh_error
from servefleet.hosts.watch import WatchItem
from servefleet.sockets import open_connection

__all__ = ["SSHHost", "SSHSpec"]

MASTER_WATCH_S = 0.5  # how often a running command looks whether its master still lives


class SSHHost:
    """One remote host reached with the system ``ssh``. Create it cheaply; the first call
    connects (starts the master). ``close()`` stops the masters; servers keep running."""

    def __init__(self, spec: SSHSpec, *, control_folder: str | None = None) -> None:
        self.spec = spec
        self.name = spec.label
        self.pool = MasterPool(spec, control_folder) if spec.multiplex else None
        self._direct_slots = asyncio.Semaphore(spec.max_sessions)  # stays under sshd's MaxStartups
        self._direct_forwards: dict[tuple[str, int], tuple[int, asyncio.subprocess.Process]] = {}
        self._facts: dict[str, str] | None = None
        self._units_error: LaunchError | bool | None = None  # check_units' answer, once asked
        self._units_lock = asyncio.Lock()  # servers start concurrently: one check per host
        self._connect_lock = asyncio.Lock()
        self.commands = 0  # remote commands run (each one ssh client process); benchmarks read it

    # -- connection -------------------------------------------------------------------------

    async def connect(self) -> None:
        """Start the master (if multiplexing) and learn the remote's home folder and tools.
        Raises HostUnreachable within the connect timeout when the host cannot be reached."""
        async with self._connect_lock:
            if self._facts is not None:
                return
            code, out, err = await self._exec(
                scripts.probe_argv(), timeout=self.spec.connect_timeout * 2 + 10, probe=True, retry=True
            )
            if code != 0:
                raise ssh_error(self.spec, ["probe"], code, err.decode(errors="replace"))
            facts = scripts.parse_probe(out.decode(errors="replace"))
            if not facts.get("home"):
                raise HostError(f"ssh host {self.name!r}: could not learn the remote home folder")
            self._facts = facts

    @property
    def home(self) -> str:
        if self._facts is None:
            raise HostError("SSHHost.connect() has not run yet")
        return self._facts["home"]

    @property
    def workdir(self) -> str:
        """The remote work folder, ``~`` expanded (after connect())."""
        return self.expand(self.spec.workdir)

    @property
    def tail_has_pid(self) -> bool:
        return bool(self._facts and self._facts.get("tailpid") == "1")

    def expand(self, path: str) -> str:
        """Expand a leading ``~`` with the remote home (paths are quoted, so the remote shell
        never does it)."""
        if path == "~" or path.startswith("~/"):
            return self.home.rstrip("/") + path[1:]
        return path

    def resolve(self, path: str) -> str:
        """``expand`` once connected; before that, the path as written (the fleet layer's work
        folders: records name the paths the remote processes see)."""
        return self.expand(path) if self._facts is not None else path

    async def _path(self, path: str) -> str:
        if path.startswith("~"):
            await self.connect()
            return self.expand(path)
        return path

    async def disconnect(self) -> None:
        """Stop the master connections without closing the host (the next call reconnects):
        what a dropped link looks like, on purpose."""
        if self.pool is not None:
            await self.pool.exit_all()

    async def close(self) -> None:
        if self.pool is not None:
            await self.pool.close()
        for _local, proc in self._direct_forwards.values():
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        self._direct_forwards.clear()

    # -- commands ---------------------------------------------------------------------------

    async def _exec(
        self,
        argv: Sequence[str],
        *,
        input: bytes | None = None,
        timeout: float | None = None,
        probe: bool = False,
        retry: bool = False,
    ) -> tuple[int, bytes, bytes]:
        """Run ``argv`` on the remote; (exit code, stdout, stderr) of the remote command.

        A connection failure raises HostUnreachable instead (see classify_ssh_failure); the first
        call connects. ``retry``: the command is idempotent (reads, checks, atomic writes), so
        when the link drops under it, reconnect once and run it again — a wait or a status must
        ride out a dropped link. Commands that start things are never repeated."""
        if self._facts is None and not probe:
            await self.connect()
        remote = shlex.join(argv)
        attempts = 2 if retry else 1
        loop = asyncio.get_running_loop()
        for attempt in range(attempts):
            self.commands += 1
            started = loop.time()
            if self.pool is None:
                async with self._direct_slots:
                    code, out, err = await self._client(
                        ssh_argv(self.spec, "direct", None, flags=["-T"], remote=remote), input, timeout
                    )
                lost = code == 255 and classify_ssh_failure(code, err.decode(errors="replace")) is not None
            else:
                async with self.pool.session() as master:
                    code, out, err = await self._client(
                        ssh_argv(self.spec, "client", master.path, flags=["-T"], remote=remote), input, timeout, master
                    )
                    # A mux client whose master dies mid-command may exit 255 without a word:
                    # the master's socket tells a dropped link from a command that exited 255.
                    lost = code == 255 and (
                        classify_ssh_failure(code, err.decode(errors="replace")) is not None
                        or not self.pool.alive(master)
                    )
                    if lost:
                        self.pool.suspect(master)
            if not lost:
                return code, out, err
            text = err.decode(errors="replace")
            if (
                self.pool is not None
                and classify_ssh_failure(code, text) in (None, "master connection lost")
                and loop.time() - started >= self.spec.alive_interval
            ):
                # The master died under a command that had waited a keep-alive interval or more:
                # its keep-alives went unanswered, the link is silent (packets dropped, not a
                # closed socket). Reconnecting would only wait out ConnectTimeout on top.
                raise ssh_error(
                    self.spec,
                    argv[:1],
                    255,
                    text
                    + f"\nno answer to keep-alives for ~{self.spec.alive_timeout}s: the link went silent (alive_timeout)",
                )
            if attempt + 1 < attempts and classify_ssh_failure(code, text) in (
                None,
                "master connection lost",
                "connection closed",
            ):
                continue  # the link dropped under an idempotent command: reconnect and repeat
            if classify_ssh_failure(code, text) is None:
                text += "\nmux_client: the master connection was lost during the command"
            raise ssh_error(self.spec, argv[:1], code, text)
        raise AssertionError("unreachable")  # pragma: no cover

    async def _client(
        self, argv: list[str], input: bytes | None, timeout: float | None, master: Master | None = None
    ) -> tuple[int, bytes, bytes]:
        """One ssh client process. With ``master``: should that master die while the client
        runs, the client is stopped at once. A mux client that loses its master before its
        session was confirmed would otherwise fall back to a connection of its own, which on a
        silent link waits out ConnectTimeout (and would run the command a second time on a
        link that comes back); reconnecting is the pool's decision."""
        proc = await start_piped(argv, has_input=input is not None, cannot="cannot run the ssh client")
        try:
            master_lost = False
            if master is None or self.pool is None:
                out, err = await asyncio.wait_for(proc.communicate(input), timeout)
            else:
                out, err, master_lost = await asyncio.wait_for(self._communicate_while(proc, input, master), timeout)
        except TimeoutError:
            await reap(proc)
            raise HostError(f"command on ssh host {self.name!r} timed out after {timeout}s") from None
        except BaseException:
            await reap(proc)
            raise
        if master_lost:
            return 255, out, err
        return proc.returncode if proc.returncode is not None else 255, out, err

    async def _communicate_while(
        self, proc: asyncio.subprocess.Process, input: bytes | None, master: Master
    ) -> tuple[bytes, bytes, bool]:
        """``proc.communicate`` while ``master`` lives; (stdout, stderr, whether it died first)."""
        assert self.pool is not None
        talk = asyncio.ensure_future(proc.communicate(input))
        try:
            while True:
                done, _ = await asyncio.wait({talk}, timeout=MASTER_WATCH_S)
                if done:
                    out, err = talk.result()
                    return out, err, False
                if not self.pool.alive(master):
                    break
            if proc.returncode is None:
                proc.kill()
            try:
                # A client falling back to a connection of its own may have started a
                # ProxyCommand that inherited (and still holds) our pipes: do not wait for EOF.
                out, err = await asyncio.wait_for(asyncio.shield(talk), 0.5)
            except TimeoutError:
                out, err = b"", b""
                transport = getattr(proc, "_transport", None)  # close our ends of those pipes
                if transport is not None:
                    transport.close()
            return out, err + b"\nmux_client: the master connection was lost during the command\n", True
        finally:
            if not talk.done():
                talk.cancel()

    def _failed(self, shown: Sequence[str], code: int, err: bytes) -> CommandError:
        """A remote command failed (link failures never get here: _exec raises them)."""
        return CommandError(list(shown), code, err.decode(errors="replace"))

    async def run(
        self,
        argv: Sequence[str],
        *,
        timeout: float | None = None,
        check: bool = True,
        input: bytes | None = None,
    ) -> CommandResult:
        remote = scripts.with_prelude(argv, venv=self.spec.venv, env=self.spec.env)
        code, out, err = await self._exec(remote, input=input, timeout=timeout)
        if code != 0 and check:
            raise self._failed(argv, code, err)
        return CommandResult(tuple(argv), code, out.decode(errors="replace"), err.decode(errors="replace"))

    async def spawn_detached(
        self,
        argv: Sequence[str],
        *,
        log_path: str,
        status_path: str,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> int:
        await self.connect()
        log_path, status_path = self.expand(log_path), self.expand(status_path)
        launch = scripts.launch_argv(detach_argv(argv, log_path, status_path), log_path, status_path)
        out, err = await self._run_launcher(launch, argv, env, cwd)
        lines = out.decode(errors="replace").split()  # the pid the launcher prints first: the new group
        if not lines or not lines[0].isdigit():
            raise HostError(f"the remote launcher on {self.name!r} did not report a pid: {out!r} {err!r}")
        return int(lines[0])

    async def launch(
        self,
        argv: Sequence[str],
        *,
        log_path: str,
        status_path: str,
        marker: str,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> Launched:
        """``Host.launch`` in ONE remote command: the marker, the log's size and line count
        (ssh_scripts.MARK), then the setsid launcher (``launch_unit``: the systemd-run one) —
        each removes the stale status file, starts the wrapper and reports its group's state."""
        return await self._launch_marked(
            argv, None, log_path=log_path, status_path=status_path, marker=marker, env=env, cwd=cwd
        )

    async def launch_unit(
        self,
        argv: Sequence[str],
        *,
        unit: str,
        log_path: str,
        status_path: str,
        marker: str,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> Launched:
        """``launch`` as the transient ``systemd --user`` unit ``unit`` (the UnitHost capability)."""
        return await self._launch_marked(
            argv, unit, log_path=log_path, status_path=status_path, marker=marker, env=env, cwd=cwd
        )

    async def _launch_marked(
        self,
        argv: Sequence[str],
        unit: str | None,
        *,
        log_path: str,
        status_path: str,
        marker: str,
        env: Mapping[str, str] | None,
        cwd: str | None,
    ) -> Launched:
        await self.connect()
        log_path, status_path = self.expand(log_path), self.expand(status_path)
        wrapper = detach_argv(argv, log_path, status_path)
        if unit is None:
            launcher = scripts.launch_argv(wrapper, log_path, status_path)
        else:
            await self.check_units()
            launcher = units.launch_argv(unit, wrapper, log_path, status_path)
        out, err = await self._run_launcher(scripts.mark_argv(launcher, log_path, status_path, marker), argv, env, cwd)
        try:
            return scripts.parse_launch(out.decode(errors="replace"))
        except ValueError:
            raise HostError(
                f"the remote launcher on {self.name!r} did not report the launch: {out!r} {err!r}"
            ) from None

    async def _run_launcher(
        self, launch: Sequence[str], argv: Sequence[str], env: Mapping[str, str] | None, cwd: str | None
    ) -> tuple[bytes, bytes]:
        """Run a launcher program in the server's folder with the venv on PATH, the environment
        on its stdin; (stdout, stderr). Never repeated: it starts things."""
        remote = scripts.with_prelude(launch, cwd=self.expand(cwd) if cwd else self.workdir, venv=self.spec.venv)
        stdin = scripts.env_lines({**self.spec.env, **(env or {})})
        code, out, err = await self._exec(remote, input=stdin, timeout=self.spec.connect_timeout * 2 + 30)
        if code != 0:
            error = self._failed(["spawn_detached", *argv], code, err)
            raise HostError(
                f"cannot start {shlex.join(argv)[:200]!s} on ssh host {self.name!r}: {err.decode(errors='replace').strip()[-300:]}"
            ) from error
        return out, err

    # -- systemd-run launcher (ssh_systemd.py): the UnitHost capability --------------------

    @property
    def launcher(self) -> str:
        return self.spec.launcher

    async def check_units(self) -> None:
        """Raise LaunchError (saying what is missing and what to do) unless ``systemd-run
        --user`` works on the host and lingering is enabled. Asked once per SSHHost."""
        async with self._units_lock:
            if self._units_error is None:
                code, out, err = await self._exec(
                    scripts.with_prelude(units.check_argv(), venv=self.spec.venv), retry=True
                )
                if code != 0:
                    raise self._failed(["check systemd-run"], code, err)
                facts = units.parse_check(out.decode(errors="replace"))
                self._units_error = units.check_error(self.name, f"[hosts.{self.name}]", facts) or False
        if self._units_error:
            raise LaunchError(str(self._units_error))

    async def stop_unit(self, unit: str, *, force: bool = False) -> None:
        """Ask the user manager to stop ``unit`` (SIGTERM to its whole cgroup; without waiting),
        or with ``force`` SIGKILL it. A unit that is gone already is not an error."""
        argv = units.kill_argv(unit) if force else units.stop_argv(unit)
        code, _out, err = await self._exec(scripts.with_prelude(argv, venv=self.spec.venv), retry=True)
        if code != 0:
            error = self._failed(["systemctl", "--user", "kill" if force else "stop", unit], code, err)
            raise HostError(
                f"cannot stop unit {unit} on {self.name!r}: {err.decode(errors='replace').strip()[-300:]}"
            ) from error

    # -- files ------------------------------------------------------------------------------

    async def read_bytes(self, path: str, offset: int = 0, limit: int | None = None) -> bytes:
        path = await self._path(path)
        if limit is not None and limit <= 0:
            if await self.file_size(path) is None:
                raise FileNotFoundError(path)
            return b""
        code, out, err = await self._exec(scripts.read_argv(path, offset, limit), retry=True)
        if code == scripts.MISSING_RC:
            raise FileNotFoundError(path)
        if code != 0:
            raise self._failed(["read", path], code, err)
        return out

    async def file_size(self, path: str) -> int | None:
        path = await self._path(path)
        code, out, err = await self._exec(scripts.size_argv(path), retry=True)
        if code == scripts.MISSING_RC:
            return None
        if code != 0:
            raise self._failed(["size", path], code, err)
        return int(out.split()[0])

    def follow(self, path: str, offset: int = 0) -> AsyncIterator[bytes | Truncated]:
        return ssh_follow.follow(self, path, offset)

    def watch(
        self, log_path: str | None, offset: int = 0, *, pgid: int | None = None, status_path: str | None = None
    ) -> AsyncIterator[WatchItem]:
        """The WatchHost capability: log, exit and liveness of one server from one remote
        watcher (ssh_follow.watch), what a wait uses instead of polling."""
        return ssh_follow.watch(self, log_path, offset, pgid=pgid, status_path=status_path)

    async def write_bytes(self, path: str, data: bytes, mode: int = 0o600) -> None:
        path = await self._path(path)
        code, _out, err = await self._exec(scripts.write_argv(path, mode), input=data, retry=True)
        if code != 0:
            raise self._failed(["write", path], code, err)

    async def remove(self, path: str) -> None:
        path = await self._path(path)
        code, _out, err = await self._exec(scripts.remove_argv(path), retry=True)
        if code != 0:
            raise self._failed(["rm", "-f", path], code, err)

    # -- many questions, one command (ssh_batch.py) -----------------------------------------

    async def batch(self, ops: Sequence[Op]) -> dict[Op, Any]:
        """Answer ``ops`` (liveness, file reads and sizes, port holders) with one remote command
        (one per ~96 KiB of arguments): what ``status`` asks about a whole fleet. Paths must be
        absolute. Raises HostUnreachable for the link, HostError when the answers are garbled."""
        await self.connect()

        async def one(chunk: list[Op]) -> dict[Op, Any]:
            argv, token = batch_argv(chunk)
            code, out, err = await self._exec(argv, retry=True)
            if code != 0:
                raise self._failed(["batch", f"{len(chunk)} questions"], code, err)
            return parse_batch(chunk, out, token)

        answers: dict[Op, Any] = {}
        for part in await asyncio.gather(*(one(c) for c in chunk_ops(list(ops)))):
            answers.update(part)
        return answers

    # -- processes and ports ----------------------------------------------------------------

    async def owns(self, group: int, marker: str) -> bool | None:
        return await proc_owns(self, group, marker)  # one remote read of the leader's command line

    async def command_line(self, pid: int) -> str | None:
        return await proc_command_line(self, pid)

    async def group_alive(self, pgid: int) -> bool:
        code, _out, err = await self._exec(scripts.group_alive_argv(pgid), retry=True)
        if code in (0, 1):
            return code == 0
        raise self._failed(["group_alive", str(pgid)], code, err)

    async def pid_status(self, pid: int) -> PidStatus:
        code, out, err = await self._exec(scripts.pid_stat_argv(pid), retry=True)
        if code == scripts.MISSING_RC:
            return GONE
        if code != 0:
            raise self._failed(["pid_status", str(pid)], code, err)
        return parse_proc_stat(out.decode(errors="replace"))

    async def signal_group(self, pgid: int, signum: int) -> None:
        code, _out, err = await self._exec(scripts.signal_argv(pgid, signum), retry=True)
        if code != 0:
            error = self._failed(["kill", f"-{int(signum)}", f"-{pgid}"], code, err)
            raise HostError(
                f"cannot signal process group {pgid} on {self.name!r}: {err.decode(errors='replace').strip()}"
            ) from error

    async def port_holder(self, port: int) -> PortHolder | None:
        code, out, err = await self._exec(scripts.port_holder_argv(port), retry=True)
        if code != 0:
            raise self._failed(["port_holder", str(port)], code, err)
        return scripts.parse_port_holder(out.decode(errors="replace"))

    async def url_for(self, port: int, bind_host: str = "127.0.0.1", local_port: int | None = None) -> str:
        """``http://127.0.0.1:LOCAL`` forwarded to ``bind_host:port`` on the remote; one forward
        per port, kept until close() (and re-added if the master restarts). ``local_port``
        asks for a given local port (`servefleet tunnel --local-port`); default: a free one."""
        await self.connect()
        target = loopback_for(bind_host)
        if self.pool is not None:
            local = await self.pool.forward(target, port, local_port)
        else:
            local = await self._direct_forward(target, port, local_port)
        return f"http://127.0.0.1:{local}"

    async def _direct_forward(self, host: str, port: int, local_port: int | None = None) -> int:
        """Without a master: one background ``ssh -N -L`` process per forward."""
        key = (host, port)
        if key in self._direct_forwards and self._direct_forwards[key][1].returncode is None:
            return self._direct_forwards[key][0]
        local = local_port or free_local_port()
        target = f"[{host}]" if ":" in host else host
        argv = ssh_argv(
            self.spec,
            "direct",
            None,
            flags=["-N", "-T", "-o", "ExitOnForwardFailure=yes", "-L", f"127.0.0.1:{local}:{target}:{port}"],
        )
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        deadline = asyncio.get_running_loop().time() + self.spec.connect_timeout * 2 + 5
        while asyncio.get_running_loop().time() < deadline:
            if proc.returncode is not None:
                err = (await proc.stderr.read()).decode(errors="replace") if proc.stderr else ""
                raise ssh_error(self.spec, argv, proc.returncode or 255, err)
            try:
                # a connection to itself would read as the forward up (servefleet/sockets.py)
                _reader, writer = await open_connection("127.0.0.1", local)
                writer.close()
                self._direct_forwards[key] = (local, proc)
                return local
            except OSError:
                await asyncio.sleep(0.05)
        proc.kill()
        await proc.wait()
        raise HostUnreachable(f"ssh host {self.name!r}: the forward to {host}:{port} did not come up")
