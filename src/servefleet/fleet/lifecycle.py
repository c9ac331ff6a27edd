"""The life of one server: resolve its launch, adopt it if it already runs, launch it detached,
and stop its whole process group. Every step goes through a ``HostBinding``, never ``os``
directly, so the same code drives local, SSH and Slurm hosts.

Ownership is checked before anything is signalled or adopted: a recorded process group counts as
ours only while the group lives and the host does not say it is another's (``Host.owns`` with the
server's log path: on Linux hosts the detach wrapper carries it on its command line, a Slurm host
asks the scheduler for the job's name) — a pgid reused by an unrelated process after a reboot is
never killed.
"""

from __future__ import annotations

import asyncio
import signal
import time
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from servefleet.catalog import DEFAULT_HINTS, Category, State
from servefleet.engines.base import PORT_SLOT, EngineProfile, LaunchSpec
from servefleet.engines.registry import get_engine
from servefleet.errors import ConfigError, EngineError, HostError, LaunchError
from servefleet.fleet import questions
from servefleet.fleet.hosts import HostBinding
from servefleet.fleet.spec import ServerSpec
from servefleet.fleet.state import ServerState, StateStore, is_secret_name, mask_argv, mask_env, spec_hash, utcnow
from servefleet.hosts.base import UnitHost
from servefleet.hosts.capabilities import units_of
from servefleet.hosts.questions import ask
from servefleet.hosts.ssh_systemd import unit_name
from servefleet.verify.verdict import Verdict

if TYPE_CHECKING:
    from servefleet.fleet.start_order import Settled, StartQueue

__all__ = [
    "Action",
    "Launchable",
    "StartOutcome",
    "StopResult",
    "resolve_launch",
    "owns_group",
    "start_server",
    "adopt_running",
    "launch_server",
    "stop_server",
    "read_exit_code",
    "save_record",
    "LAUNCH_MARKER",
]

LAUNCH_MARKER = "==== servefleet launch {time} ===="


class Action(StrEnum):
    LAUNCHED = "launched"  # started now
    ADOPTED = "adopted"  # already running (ours): not relaunched
    BLOCKED = "blocked"  # port held by another process: nothing launched
    FAILED = "failed"  # could not be started at all
    QUEUED = "queued"  # shares a GPU with a server still starting: launched once that one settles
    HELD = "held"  # stopped or drained by the user: a job's restart does not start it again


@dataclass(frozen=True)
class Launchable:
    """Everything needed to launch one server, resolved from the spec, its host and its engine."""

    server: ServerSpec
    binding: HostBinding
    profile: EngineProfile
    launch: LaunchSpec
    argv: list[str]
    env: dict[str, str]  # what servefleet adds to the host's environment
    served_model: str | None
    digest: str
    # What the host is given: ``argv``, or where the host picks the port (binding.port_slot) the
    # same argv with engines.base.PORT_SLOT where the port goes.
    host_argv: list[str] | None = None

    @property
    def name(self) -> str:
        return self.server.name


@dataclass(frozen=True)
class StartOutcome:
    """What ``start`` did with one server. A value: a later step (a queued server's turn, the
    wait's stop of a failed one) makes a new outcome (``dataclasses.replace``), never edits one."""

    name: str
    action: Action
    record: ServerState | None = None
    verdict: Verdict | None = None  # set when there is nothing to wait for (blocked, failed)
    message: str | None = None  # e.g. "running with an older spec"
    spec_changed: bool = False
    waits_for: tuple[str, ...] = ()  # QUEUED: the siblings it starts after
    started_after: tuple[Settled, ...] = ()  # once launched after siblings on its GPU settled
    after_failure: str | None = None  # failed verdict: "stopped" | "kept running (--keep-failed)" | ...
    item: Launchable | None = None  # QUEUED: what to launch when its turn comes
    queue: StartQueue | None = None  # the call's start order (None: nothing shares a GPU)
    log_line_no: int | None = None  # LAUNCHED: the log's line number at record.log_offset (the wait need not count it)
    gpu_holders: tuple[str, ...] = ()  # before launch: processes outside the fleet on its GPUs


@dataclass
class StopResult:
    name: str
    was_running: bool
    signal: str | None = None  # the strongest signal that was needed: "SIGTERM" or "SIGKILL"
    port_free: bool = True
    port_holder_pid: int | None = None
    message: str = ""
    survived_kill: bool = False  # the group was still alive after SIGKILL and kill_wait_s

    @property
    def ok(self) -> bool:
        # a port another process holds is a failure to free it only where our server held it: `down` of a server
        # that was never launched (its port taken, `up` refused it) stopped nothing and still says who holds the port
        return (self.port_free or not self.was_running) and not self.survived_kill


def resolve_launch(server: ServerSpec, binding: HostBinding, fleet_label: str) -> Launchable:
    """Build argv and env from the engine profile; engine complaints become ConfigErrors that name
    the server."""
    env = {**binding.env, **server.env}
    launch = LaunchSpec(
        model=server.model or "",
        port=server.port,
        host=server.bind,
        gpus=server.gpus,
        served_model_name=server.served_model_name,
        extra_args=tuple(server.args),
        python=server.python or binding.python,
        command=tuple(server.command or ()),
        ready_path=server.ready_path,
        env=env,
        port_slot=binding.port_slot,
    )
    profile = get_engine(server.engine)
    try:
        host_argv = list(profile.build_argv(launch))
        argv = [arg.replace(PORT_SLOT, str(server.port)) for arg in host_argv]  # what records, hashes and users see
        full_env = {**profile.build_env(launch), **env}
        served = profile.served_name(launch) or None  # none: no identity by model name
    except (EngineError, ValueError) as exc:
        raise ConfigError(f'{fleet_label}: server "{server.name}": engine {server.engine}: {exc}') from exc
    payload = {"argv": argv, "env": full_env, "cwd": binding.cwd, "host": binding.name}
    if _unit_host(binding) is not None:
        payload["launcher"] = "systemd-run"  # switching launchers is a changed spec (restart applies it)
    digest = spec_hash(payload)
    return Launchable(
        server, binding, profile, launch, argv, full_env, served, digest, host_argv if binding.port_slot else None
    )


def _unit_host(binding: HostBinding) -> UnitHost | None:
    """The host, when it starts servers as systemd --user units (launcher = "systemd-run")."""
    units = units_of(binding.host)
    return units if units is not None and units.launcher == "systemd-run" else None


async def owns_group(binding: HostBinding, record: ServerState, *, alive: bool | None = None) -> bool:
    """Whether the recorded process group is alive and still the one we launched (``alive``: the
    group's liveness when the caller just asked; not asked again)."""
    host = binding.host
    if not (await ask(host, questions.alive(record)) if alive is None else alive):
        return False
    return await ask(host, questions.owner(record)) is not False  # None (cannot tell): trust the live group


async def read_exit_code(binding: HostBinding, record: ServerState) -> int | None:
    """The exit code the detach wrapper recorded, or None (still running, or killed with it)."""
    raw = await ask(binding.host, questions.exit_code(record))
    if raw is None:
        return None
    try:
        return int(raw.decode().strip())
    except ValueError:
        return None


async def save_record(store: StateStore, binding: HostBinding, record: ServerState) -> None:
    """Write the record locally and, for remote hosts, next to the server too."""
    store.save(record)
    if binding.remote_state:
        await binding.host.write_bytes(binding.state_path(record.name), record.to_bytes())


async def load_record(store: StateStore, binding: HostBinding, name: str) -> ServerState | None:
    """The local record, else (remote hosts) the copy on the host, rediscovered and saved locally."""
    record = store.load(name)
    if record is None and binding.remote_state:
        raw = await ask(binding.host, questions.remote_record(binding, name))
        if raw is None:
            return None
        record = store._parse(store.path_for(name), raw, name)
        store.save(record)
    return record


async def _describe_pid(binding: HostBinding, pid: int | None) -> str:
    if pid is None:
        return "another process (pid not visible)"
    cmd = await binding.host.command_line(pid) or ""
    if len(cmd) > 80:
        cmd = cmd[:77] + "..."
    return f"pid {pid} ({cmd})" if cmd else f"pid {pid}"


async def start_server(item: Launchable, store: StateStore, fleet_name: str) -> StartOutcome:
    """Adopt the server if it already runs, refuse when its port is taken, else launch it."""
    record = await load_record(store, item.binding, item.name)
    return await adopt_running(item, record) or await launch_server(item, store, fleet_name, previous=record)


async def adopt_running(item: Launchable, record: ServerState | None) -> StartOutcome | None:
    """The ADOPTED outcome when ``record`` (the server's, from load_record) is running and ours."""
    binding, name = item.binding, item.name
    if record is not None and await owns_group(binding, record):
        changed = record.spec_hash != item.digest
        msg = f"already running (pgid {record.pgid}, launched {record.launched_at:%Y-%m-%d %H:%M:%S}Z)"
        if changed:
            msg += f"; the fleet file changed since: `servefleet restart {name}` applies it"
        return StartOutcome(name, Action.ADOPTED, record=record, message=msg, spec_changed=changed)
    return None


async def port_blocked(item: Launchable, holder: Any, record: ServerState | None = None) -> StartOutcome:
    """The BLOCKED outcome of a server whose port another process (``holder``, a PortHolder) listens on."""
    who = await _describe_pid(item.binding, holder.pid)
    seen = f" (seen by {holder.evidence})" if holder.evidence else ""
    msg = f"port {item.server.port} is already in use by {who}{seen}; nothing was launched"
    verdict = Verdict(
        state=State.FAILED,
        category=Category.PORT_IN_USE,
        engine=item.server.engine,
        hint=DEFAULT_HINTS[Category.PORT_IN_USE],
        message=msg,
        elapsed_s=0.0,
    )
    return StartOutcome(item.name, Action.BLOCKED, record=record, verdict=verdict, message=msg)


def held_elsewhere(item: Launchable, blocked: list[str]) -> StartOutcome:
    """The BLOCKED outcome of a server not launched because other servers' ports are taken: `up`
    refuses before launching anything, so that nothing runs half a fleet."""
    msg = f"not launched: the port of {', '.join(blocked)} is held by another process, and up launches nothing then"
    verdict = Verdict(
        state=State.FAILED,
        engine=item.server.engine,
        message=msg,
        elapsed_s=0.0,
        hint="free the port (or change it in the fleet file), then run `servefleet up` again",
    )
    return StartOutcome(item.name, Action.BLOCKED, verdict=verdict, message=msg)


async def launch_server(
    item: Launchable,
    store: StateStore,
    fleet_name: str,
    *,
    previous: ServerState | None = None,
    started_after: list[dict[str, Any]] | None = None,
    port_checked: bool = False,
) -> StartOutcome:
    """Refuse when the port is taken, else launch the server (its adopt check was done before;
    ``previous``: the record it found, not running). ``started_after``: the siblings on its GPU it
    waited for, kept in its record. ``port_checked``: the caller asked for the port's holder just
    before (`up`'s refusal of held ports), so it is not asked again (one remote command less)."""
    binding, name, port = item.binding, item.name, item.server.port
    host = binding.host
    record = previous
    holder = None if port_checked else await ask(host, questions.port(port))
    if holder is not None:
        return await port_blocked(item, holder, record)

    units = _unit_host(binding)
    unit: str | None = None
    if units is not None:
        # Before anything is written or started: a host without a usable user manager (or
        # without lingering) fails here, with what is missing and what to do.
        try:
            await units.check_units()
        except LaunchError as exc:
            hint = "enable lingering on the host (loginctl enable-linger USER) or use the default setsid launcher"
            verdict = Verdict(
                state=State.FAILED,
                category=Category.OTHER,
                engine=item.server.engine,
                hint=hint,
                message=str(exc),
                elapsed_s=0.0,
            )
            return StartOutcome(name, Action.FAILED, verdict=verdict, message=str(exc))
        unit = unit_name(fleet_name, name)

    log_path, status_path = binding.log_path(name), binding.status_path(name)
    launched_at = utcnow()
    marker = LAUNCH_MARKER.format(time=launched_at.isoformat(timespec="seconds"))
    try:  # marker, log offset, stale status file, spawn, liveness: one remote command on ssh hosts
        if units is not None and unit is not None:
            launched = await units.launch_unit(
                item.host_argv or item.argv,
                unit=unit,
                log_path=log_path,
                status_path=status_path,
                marker=marker,
                env=item.env,
                cwd=binding.cwd,
            )
        else:
            launched = await host.launch(
                item.host_argv or item.argv,
                log_path=log_path,
                status_path=status_path,
                marker=marker,
                env=item.env,
                cwd=binding.cwd,
            )
    except Exception as exc:  # a host that cannot start anything: a launch failure, not a crash
        msg = f"could not launch: {exc}"
        verdict = Verdict(
            state=State.FAILED, category=Category.OTHER, engine=item.server.engine, message=msg, elapsed_s=0.0
        )
        return StartOutcome(name, Action.FAILED, verdict=verdict, message=msg)

    secrets = [v for k, v in item.env.items() if is_secret_name(k)]
    record = ServerState(
        fleet=fleet_name,
        name=name,
        engine=item.server.engine,
        host=binding.name,
        port=port,
        bind=item.server.bind,
        pgid=launched.pgid,
        unit=unit,
        argv=mask_argv(item.argv, secrets),
        env=mask_env(item.env),
        cwd=binding.cwd,
        log_path=log_path,
        status_path=status_path,
        log_offset=launched.log_offset,
        launched_at=launched_at,
        spec_hash=item.digest,
        served_model=item.served_model,
        probe_paths=list(item.profile.probe_for(item.launch).paths),
        started_after=list(started_after or []),
    )
    await save_record(store, binding, record)
    # Only what the launch itself saw: a later death is the wait's (its watcher reports the exit).
    message = None
    if launched.state != "alive":
        code = launched.code
        message = "exited at once" + (f" with code {code}" if code is not None else "") + f"; see {log_path}"
    return StartOutcome(name, Action.LAUNCHED, record=record, message=message, log_line_no=launched.line_no)


async def stop_server(
    record: ServerState, binding: HostBinding, grace_s: float = 15.0, kill_wait_s: float = 10.0
) -> StopResult:
    """SIGTERM the whole process group, SIGKILL what is left after ``grace_s``, then confirm that
    no process of the group remains and the port is free."""
    host = binding.host
    result = StopResult(record.name, was_running=False)
    units = units_of(binding.host) if record.unit else None
    alive = await host.group_alive(record.pgid)  # asked once: a dead group costs no second question
    if await owns_group(binding, record, alive=alive):
        result.was_running = True
        # The user manager signals the unit's whole cgroup (KillMode=control-group): also
        # processes that left the process group. Our own clock decides when to escalate, and the
        # group is signalled as well whenever the manager cannot be asked.
        if not (units is not None and record.unit and await _stop_unit(units, record.unit)):
            await host.signal_group(record.pgid, signal.SIGTERM)
        result.signal = "SIGTERM"
        if not await _wait_gone(binding, record.pgid, grace_s):
            if units is not None and record.unit:
                await _stop_unit(units, record.unit, force=True)
            await host.signal_group(record.pgid, signal.SIGKILL)
            result.signal = "SIGKILL"
            if not await _wait_gone(binding, record.pgid, kill_wait_s):
                result.message = f"process group {record.pgid} is still running after SIGKILL"
                result.survived_kill = True
                result.port_free = False
                return result
    elif alive:
        result.message = f"pgid {record.pgid} now belongs to another process; not signalled (stale record)"

    # The listening socket closes with its process; allow the kernel a moment to drop it.
    deadline = time.monotonic() + 2.0
    holder = await host.port_holder(record.port)
    while holder is not None and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
        holder = await host.port_holder(record.port)
    if holder is not None:
        result.port_free = False
        result.port_holder_pid = holder.pid
        who = await _describe_pid(binding, holder.pid)
        result.message = (result.message + "; " if result.message else "") + f"port {record.port} is held by {who}"
    elif not result.message:
        how = {"SIGTERM": "stopped", "SIGKILL": f"killed (did not stop within {grace_s:g}s of SIGTERM)"}
        result.message = how.get(result.signal or "", "was not running")
    return result


async def _stop_unit(units: UnitHost, unit: str, force: bool = False) -> bool:
    """Ask the user manager to stop (or SIGKILL) a unit; False when it could not be asked."""
    try:
        await units.stop_unit(unit, force=force)
    except HostError:
        return False
    return True


async def _wait_gone(binding: HostBinding, pgid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while True:
        if not await binding.host.group_alive(pgid):
            return True
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(0.05)
