"""Maps a fleet's host names to ``Host`` objects and to the paths a server uses on that host.

``local`` is built in. ``[hosts.NAME]`` tables describe SSH hosts; their transport arrives with
the SSH issue: it plugs in at ``_connect_ssh`` (one function returning a ``HostBinding``) and
nothing above this module changes — the lifecycle only ever talks to ``HostBinding``.
"""

from __future__ import annotations

import posixpath
import sys
from dataclasses import dataclass, field

from servefleet.errors import ConfigError
from servefleet.fleet.spec import LOCAL, FleetSpec, HostSpec
from servefleet.hosts.base import Host
from servefleet.hosts.local import LocalHost

__all__ = ["HostBinding", "HostPool"]


@dataclass
class HostBinding:
    """One fleet host: the transport and where this fleet keeps its files on it.

    ``work_dir`` holds ``logs/<server>.log`` and ``run/<server>.status`` on the host itself. For a
    remote host ``remote_state`` is true: the state record is also written there, so a new local
    machine with only the fleet file can rediscover running servers.
    """

    name: str
    host: Host
    work_dir: str
    cwd: str | None = None  # working folder of launched servers (relative model paths)
    env: dict[str, str] = field(default_factory=dict)  # added to every server's env on this host
    python: str = "python3"  # interpreter when a server does not name one
    remote_state: bool = False

    def log_path(self, server: str) -> str:
        return posixpath.join(self.work_dir, "logs", f"{server}.log")

    def status_path(self, server: str) -> str:
        return posixpath.join(self.work_dir, "run", f"{server}.status")

    def state_path(self, server: str) -> str:
        return posixpath.join(self.work_dir, "state", f"{server}.json")


class HostPool:
    """Opens each host of a fleet once, on first use, and closes them all at the end."""

    def __init__(self, fleet: FleetSpec) -> None:
        self.fleet = fleet
        self._bindings: dict[str, HostBinding] = {}

    def get(self, name: str) -> HostBinding:
        binding = self._bindings.get(name)
        if binding is None:
            binding = self._connect(name)
            self._bindings[name] = binding
        return binding

    def _connect(self, name: str) -> HostBinding:
        if name == LOCAL:
            return HostBinding(
                name=LOCAL,
                host=LocalHost(),
                work_dir=str(self.fleet.state_dir),
                cwd=str(self.fleet.path.parent),
                # The interpreter running servefleet: the sim and `python -m` engines installed
                # next to it work without configuration; set `python` per server otherwise.
                python=sys.executable or "python3",
            )
        spec = self.fleet.hosts.get(name)
        if spec is None:
            known = ", ".join([LOCAL, *self.fleet.hosts])
            raise ConfigError(f"{self.fleet.path.name}: unknown host {name!r} (known: {known})")
        if spec.kind == "slurm":
            from servefleet.fleet.slurm_binding import connect_slurm

            return connect_slurm(spec, self.fleet, _connect_ssh(spec, self.fleet) if spec.ssh else None, lambda: self.fleet)
        return _connect_ssh(spec, self.fleet)

    async def close(self) -> None:
        bindings, self._bindings = list(self._bindings.values()), {}
        for binding in bindings:
            await binding.host.close()


def _connect_ssh(spec: HostSpec, fleet: FleetSpec) -> HostBinding:
    """The SSH seam: an SSHHost (connects on first use) and this fleet's folder on that host,
    ``<workdir>/<fleet name>``. A ``~`` in the work folder is replaced by the remote home as
    soon as the host connects, so the paths in state records are the ones the remote processes
    were given (the lifecycle recognises its servers by their log path)."""
    from servefleet.hosts.ssh import SSHHost
    from servefleet.hosts.ssh_options import SSHSpec

    if spec.ssh is None:  # the spec's own check makes `ssh` required for kind = "ssh"
        raise ConfigError(f"[hosts.{spec.name}]: an SSH host needs ssh = \"user@host\"")
    alive = SSHSpec.alive_settings(spec.alive_timeout)
    try:
        ssh_spec = SSHSpec(
            destination=spec.ssh,
            name=spec.name,
            port=spec.port,
            user=spec.user,
            identity_file=spec.identity_file,
            jump=spec.jump,
            known_hosts=spec.known_hosts,
            strict_host_key=spec.strict_host_key,
            config_file=spec.config_file,
            workdir=spec.workdir,
            env=dict(spec.env),
            venv=spec.venv,
            connect_timeout=spec.connect_timeout,
            alive_interval=alive["alive_interval"],
            alive_count_max=alive["alive_count_max"],
            launcher=spec.launcher,
        )
    except ConfigError as exc:
        raise ConfigError(f"{fleet.path.name}: [hosts.{spec.name}]: {exc}") from exc
    host = SSHHost(ssh_spec)
    binding = HostBinding(
        name=spec.name,
        host=host,
        work_dir=posixpath.join(spec.workdir, fleet.name),
        cwd=spec.workdir,  # stays as written (SSHHost expands it): part of the spec hash
        env={},  # the host's env travels with every command of SSHHost already
        python=spec.python or "python3",
        remote_state=True,
    )

    def absolute_work_dir(connected: SSHHost) -> None:
        binding.work_dir = connected.expand(binding.work_dir)

    host.on_connect.append(absolute_work_dir)
    return binding
