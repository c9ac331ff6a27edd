"""The Slurm host: servers as Slurm jobs, one job per server, through ``sbatch``.

A Slurm host is a submitting machine (this one, or a login node reached over SSH: the
``transport``, a LocalHost or an SSHHost) and a shared filesystem that it and the compute nodes
see alike. Everything that is a file (logs, exit codes, records) goes through the transport as on
any host; what differs is the process: a server's "process group" is its Slurm job, so the id the
layers above keep as ``pgid`` is the job id, and

- ``launch`` writes the launch marker and submits the job in one command (slurm_script.py);
- ``group_alive`` asks the scheduler, and a fleet's servers share one ``squeue`` answer per host
  (all of the user's jobs, every state), however many ask at once: ``status`` costs one scheduler
  call per host, and waiting servers one per ``poll_interval`` per host, not per server;
- ``signal_group`` is ``scancel`` (``--signal=KILL`` for SIGKILL); the job counts as alive until
  it has left COMPLETING, so ``down`` confirms the job has ended;
- ``watch`` (the WatchHost capability) streams the log, reports ``Pending`` with the scheduler's
  reason while the job waits (the waiter does not count that time as a stall), and ends with the
  log read to its end (hosts/watch.py until_exit), then the exit: the wrapper's code, and how the
  scheduler ended the job (slurm_queue.end_report);
- ``url_for`` is a local relay (slurm_relay.py) to wherever the current job's server listens.

The host knows nothing about engines: the argv it is given carries ``spec.port_slot`` (a token the
fleet layer had the engine write where its port goes, engines/base.py PORT_SLOT) and the job puts
the port it picks there.
"""

from __future__ import annotations

import asyncio
import posixpath
import signal
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from servefleet.errors import CommandError, HostError, HostUnreachable, LaunchError
from servefleet.hosts import slurm_script as scripts
from servefleet.hosts.base import CommandResult, FilesThrough, Host, Launched, PortHolder
from servefleet.hosts.capabilities import connecting_of
from servefleet.hosts.pidstat import GONE, PidStatus
from servefleet.hosts.slurm_queue import JobInfo, end_report, is_alive, parse_squeue, squeue_argv
from servefleet.hosts.slurm_relay import Relay
from servefleet.hosts.ssh_scripts import env_lines, mark_argv, parse_launch
from servefleet.hosts.watch import Exited, Pending, WatchItem, read_rest, until_exit

__all__ = ["SlurmSpec", "SlurmHost"]

END_WAIT_S = 30.0  # after the wrapper's exit: how long to wait for the job's final state


@dataclass(frozen=True)
class SlurmSpec:
    name: str
    sbatch: tuple[str, ...] = ()  # sbatch options from the host's table (slurm_script.sbatch_options)
    env: Mapping[str, str] = field(default_factory=dict)  # for every Slurm command and every job
    poll_interval: float = 5.0  # seconds between scheduler questions while waiting
    port_range: tuple[int, int] = (20000, 40000)
    python: str = "python3"  # on the nodes: picks the port (the engine's own interpreter by default)
    fleet: str = "fleet"
    # The token the argv carries where the server's port goes; the job replaces it with the port
    # it picks on its node. No argument carries it: the fleet file's args fixed the port.
    port_slot: str = "@port@"
    fleet_ports: Mapping[str, int] = field(default_factory=dict)  # server name -> its port in the fleet file


class SlurmHost(FilesThrough):
    """Implements the Host contract (and WatchHost) for servers run as Slurm jobs."""

    launcher = "sbatch"
    # The scheduler gives each job GPUs of its own: servers here never share one, so start
    # ordering (fleet/start_order.py) does not make them wait for each other.
    jobs_own_gpus = True

    def __init__(self, spec: SlurmSpec, transport: Host, where_for_port: Callable[[int], str | None]) -> None:
        """``where_for_port``: a server's ``.where`` file by its fleet port (the fleet layer knows it)."""
        self.spec = spec
        self.name = spec.name
        self.transport = transport
        self.files_host = transport  # the job's files are on the shared filesystem, read from the login node
        self.where_for_port = where_for_port
        self.scheduler_calls = 0  # sbatch/squeue/scancel commands run; benchmarks read it
        self._jobs: dict[str, JobInfo] = {}
        self._jobs_at = -1.0  # monotonic time of the last squeue answer
        self._asking: asyncio.Task[None] | None = None
        self._submitted: dict[str, float] = {}
        self._relays: dict[int, Relay] = {}

    # ---- scheduler ------------------------------------------------------------------------
    def _cmd(self, argv: Sequence[str]) -> list[str]:
        env = [f"{k}={v}" for k, v in self.spec.env.items()]
        return ["env", *env, *argv] if env and self._local else list(argv)

    @property
    def _local(self) -> bool:
        return self.transport.name == "local"  # an SSHHost sets its env on every command itself

    async def _scheduler(
        self, argv: Sequence[str], *, input: bytes | None = None, timeout: float = 60.0
    ) -> CommandResult:
        self.scheduler_calls += 1
        try:
            return await self.transport.run(self._cmd(argv), timeout=timeout, check=False, input=input)
        except HostError:
            raise
        except OSError as exc:
            raise HostError(f"slurm host {self.name!r}: cannot run {argv[0]}: {exc}") from exc

    async def jobs(self, max_age: float | None = None) -> dict[str, JobInfo]:
        """This user's jobs as the scheduler sees them: one ``squeue`` answer shared by every
        caller for ``max_age`` seconds (default: the poll interval)."""
        max_age = self.spec.poll_interval if max_age is None else max_age
        if time.monotonic() - self._jobs_at <= max_age and self._jobs_at >= 0:
            return self._jobs
        if self._asking is None or self._asking.done():
            self._asking = asyncio.ensure_future(self._ask())
        await asyncio.shield(self._asking)
        return self._jobs

    async def _ask(self) -> None:
        asked_at = time.monotonic()
        result = await self._scheduler(squeue_argv())
        if result.returncode != 0:
            said = result.stderr.strip()[-300:]
            if "contact slurm controller" in said or "Socket timed out" in said or "Connection refused" in said:
                raise HostUnreachable(
                    f"slurm host {self.name!r}: the Slurm controller does not answer ({said}); try `squeue --me` there"
                )
            raise HostError(f"slurm host {self.name!r}: squeue failed: {said}")
        self._jobs = parse_squeue(result.stdout)
        self._jobs_at = asked_at

    async def job(self, job_id: int | str) -> JobInfo | None:
        key = str(job_id)
        jobs = await self.jobs()
        if key not in jobs and self._submitted.get(key, -1.0) >= self._jobs_at:
            jobs = await self.jobs(max_age=0)  # submitted after that answer: ask again
        return jobs.get(key)

    # ---- the Host contract ----------------------------------------------------------------
    async def connect(self) -> None:
        """Connect the transport (an SSH login node: its "~" work folder becomes absolute)."""
        transport = connecting_of(self.transport)
        if transport is not None:
            await transport.connect()

    async def run(
        self, argv: Sequence[str], *, timeout: float | None = None, check: bool = True, input: bytes | None = None
    ) -> CommandResult:
        return await self.transport.run(argv, timeout=timeout, check=check, input=input)

    async def spawn_detached(
        self,
        argv: Sequence[str],
        *,
        log_path: str,
        status_path: str,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> int:
        raise LaunchError("a Slurm host starts servers as jobs (launch), not as detached processes")

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
        """The marker, the log's size, and the job's submission, in one command on the submitting host."""
        where = _where_path(status_path)
        name = status_path.rsplit("/", 1)[-1].removesuffix(".status")
        args = scripts.job_args(
            argv,
            log_path=log_path,
            status_path=status_path,
            where_path=where,
            fleet_port=self.spec.fleet_ports.get(name, 0),
            port_slot=self.spec.port_slot,
            port_range=self.spec.port_range,
            python=self.spec.python,
        )
        sbatch = [
            "sbatch",
            "--parsable",
            f"--job-name={scripts.job_name(self.spec.fleet, name)}",
            f"--output={log_path}",
            "--open-mode=append",
            *(["--chdir", cwd] if cwd else []),
            *self.spec.sbatch,
        ]
        jobfile = where.removesuffix(".where") + ".sbatch"
        submit = scripts.submit_argv(
            jobfile=jobfile, where_path=where, status_path=status_path, cwd=cwd, sbatch=sbatch, args=args
        )
        command = self._cmd(mark_argv(submit, log_path, status_path, marker))
        self.scheduler_calls += 1
        result = await self.transport.run(
            command, timeout=120, check=False, input=env_lines({**self.spec.env, **(env or {})})
        )
        if result.returncode != 0:
            raise HostError(f"slurm host {self.name!r}: could not submit the job: {result.stderr.strip()[-500:]}")
        try:
            launched = parse_launch(result.stdout)
        except ValueError:
            raise HostError(
                f"slurm host {self.name!r}: the submission did not report a job id: {result.stdout!r} {result.stderr!r}"
            ) from None
        self._submitted[str(launched.pgid)] = time.monotonic()
        return launched

    async def group_alive(self, pgid: int) -> bool:
        """Whether job ``pgid`` is pending, running or still completing."""
        job = await self.job(pgid)
        return job is not None and is_alive(job.state)

    async def owns(self, group: int, marker: str) -> bool | None:
        """Whether job ``group`` is the server's whose log is ``marker``, by the job's name
        (slurm_script.job_name): job ids are not reused, so this is a second look, not the only
        one; None when the scheduler no longer knows the job or printed no name."""
        job = await self.job(group)
        if job is None or not job.name:
            return None
        server = posixpath.basename(marker).removesuffix(".log")
        return job.name == scripts.job_name(self.spec.fleet, server)

    async def command_line(self, pid: int) -> str | None:
        return None  # servers here are jobs on other nodes: no process of theirs is visible here

    async def queued(self, job_id: int) -> str | None:
        """ "job 42 pending (Resources) for 12s" while the job waits to run, else None."""
        job = await self.job(job_id)
        if job is None or not job.pending:
            return None
        waited = _since(job.submitted)
        return f"job {job_id} pending ({job.reason or job.state})" + (
            f" for {waited:.0f}s" if waited is not None else ""
        )

    async def ended(self, job_id: int) -> str | None:
        """How an ended job ended ("Slurm job 42 ended TIMEOUT: ..."), while the scheduler still
        knows it; None for a live job or one it has forgotten."""
        job = await self.job(job_id)
        if job is None or is_alive(job.state):
            return None
        return end_report(job, str(job_id), self.name).note

    async def remaining_s(self, job_id: int) -> float | None:
        """Seconds before job ``job_id``'s time limit, from the shared ``squeue`` answer (its
        granularity: the poll interval); None without a limit, before it runs or once forgotten."""
        job = await self.job(job_id)
        return None if job is None else job.remaining_s

    async def noticed(self, job_id: int, status_path: str) -> bool:
        """Whether job ``job_id`` got its advance notice (sbatch ``--signal=B:USR1@N``): its end
        is near; the job wrote its id to ``<status>.notice``."""
        try:
            raw = await self.transport.read_bytes(status_path + ".notice")
        except FileNotFoundError:
            return False
        return raw.decode(errors="replace").strip() == str(job_id)

    async def pid_status(self, pid: int) -> PidStatus:
        return GONE  # servers on a Slurm host are jobs: there is no pid of theirs to watch here

    async def signal_group(self, pgid: int, signum: int) -> None:
        """``scancel`` the job (SIGKILL: ``scancel --signal=KILL --full``); a job that has ended is
        not an error."""
        argv = (
            ["scancel", str(pgid)] if signum != signal.SIGKILL else ["scancel", "--signal=KILL", "--full", str(pgid)]
        )
        result = await self._scheduler(argv)
        self._jobs_at = -1.0  # the next question sees the cancellation
        if (
            result.returncode != 0
            and "Invalid job id" not in result.stderr
            and "already completing or completed" not in result.stderr
        ):
            error = CommandError(argv, result.returncode, result.stderr)
            raise HostError(
                f"slurm host {self.name!r}: {' '.join(argv)} failed: {result.stderr.strip()[-300:]}"
            ) from error

    async def port_holder(self, port: int) -> PortHolder | None:
        return None  # the port is chosen on the node when the job starts: nothing holds it beforehand

    async def url_for(self, port: int, bind_host: str = "127.0.0.1", local_port: int | None = None) -> str:
        """A local relay to the server whose fleet port is ``port``, wherever its current job runs
        (one per port, kept until close(); ``local_port``: `servefleet tunnel --local-port`)."""
        relay = self._relays.get(port)
        if relay is None:
            relay = Relay(lambda: self._target(port, bind_host))
            await relay.start(local_port or 0)
            self._relays[port] = relay
        return f"http://127.0.0.1:{relay.port}"

    async def where(self, port: int) -> dict[str, str] | None:
        """What the server's current job wrote about where it runs (job, node, port), or None."""
        path = self.where_for_port(port)
        if path is None:
            return None
        try:
            raw = await self.transport.read_bytes(path)
        except FileNotFoundError:
            return None
        facts = dict(line.split("=", 1) for line in raw.decode(errors="replace").splitlines() if "=" in line)
        return facts if facts.get("port", "").isdigit() else None

    async def _target(self, port: int, bind_host: str) -> tuple[str, int] | None:
        facts = await self.where(port)
        if facts is None:
            return None
        node_port = int(facts["port"])
        # A server bound to every address is reached at its node; one bound to an address (the
        # default 127.0.0.1) only there, which is right when jobs run where servefleet does.
        target = facts.get("node", "127.0.0.1") if bind_host in ("0.0.0.0", "::", "") else bind_host
        if self._local:
            return target, node_port
        url = await self.transport.url_for(node_port, target)  # through the login node (an SSH forward)
        local = url.rsplit(":", 1)[-1]
        return "127.0.0.1", int(local)

    async def close(self) -> None:
        relays, self._relays = list(self._relays.values()), {}
        for relay in relays:
            await relay.close()
        await self.transport.close()

    # ---- the WatchHost capability ---------------------------------------------------------
    def watch(
        self, log_path: str | None, offset: int = 0, *, pgid: int | None = None, status_path: str | None = None
    ) -> AsyncIterator[WatchItem]:
        """The log as it grows (the transport's follower), ``Pending`` while the job waits for
        resources, then the rest of the log and ``Exited`` (hosts/watch.py until_exit: the
        follower may lag behind the exit, the log is read to its end before it)."""
        log = self.transport.follow(log_path, offset) if log_path else None
        return until_exit(
            log, self._exits(pgid, status_path), offset, lambda at: read_rest(self.transport, log_path or "", at)
        )

    async def _exits(self, pgid: int | None, status_path: str | None) -> AsyncIterator[Pending | Exited]:
        """The job's wait in the queue, then its end: the status file, or the scheduler's word."""
        stale = status_path is not None and await self.transport.file_size(status_path) is not None
        last_pending: tuple[str, str] | None = None
        while True:
            job = await self.job(pgid) if pgid is not None else None
            if job is not None and job.pending:
                key = (job.state, job.reason)
                if key != last_pending:
                    last_pending = key
                    yield Pending(job.reason or job.state, _since(job.submitted), job_id=str(pgid))
            elif job is not None and job.state == "RUNNING":
                stale = False  # the job removed any earlier status file when it started
            code_seen = (
                status_path is not None and not stale and await self.transport.file_size(status_path) is not None
            )
            if code_seen or job is None or not is_alive(job.state):
                yield await self._exited(pgid, status_path, job)  # slurmstepd's own last lines are in the log by then
                return
            deadline = time.monotonic() + self.spec.poll_interval
            while (left := deadline - time.monotonic()) > 0:
                await asyncio.sleep(min(left, 0.1))
                if (
                    status_path is not None
                    and not stale
                    and self._local
                    and await self.transport.file_size(status_path) is not None
                ):
                    break  # the wrapper recorded an exit: look at the job now

    async def _exited(self, pgid: int | None, status_path: str | None, job: JobInfo | None) -> Exited:
        """The exit, once the scheduler has settled the job's end state (bounded wait)."""
        deadline = time.monotonic() + END_WAIT_S
        while pgid is not None and job is not None and is_alive(job.state) and time.monotonic() < deadline:
            await asyncio.sleep(min(self.spec.poll_interval, 0.5))
            job = (await self.jobs(max_age=min(self.spec.poll_interval, 0.5))).get(str(pgid))
        code = None
        if status_path is not None:
            try:
                code = int((await self.transport.read_bytes(status_path)).decode().strip())
            except (FileNotFoundError, ValueError):
                code = None
        report = end_report(job, str(pgid), self.name)
        return Exited(code, killed=report.killed, note=report.note, hint=report.hint)


def _where_path(status_path: str) -> str:
    return status_path.removesuffix(".status") + ".where"


def _since(submitted: datetime | None) -> float | None:
    if submitted is None:
        return None
    return max(0.0, (datetime.now() - submitted).total_seconds())  # squeue prints the cluster's local time
