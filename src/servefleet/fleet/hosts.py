"""Maps a fleet's host names to ``Host`` objects and to the paths a server uses on that host.

``local`` is built in. ``[hosts.NAME]`` tables describe SSH hosts (``_connect_ssh``) and Slurm
hosts (``kind = "slurm"``, fleet/slurm_binding.py), each built into one ``HostBinding``: the
lifecycle only ever talks to ``HostBinding``.
"""

from __future__ import annotations

import posixpath
import sys

from servefleet.errors import ConfigError
from servefleet.fleet.binding import HostBinding
from servefleet.fleet.slurm_binding import connect_slurm
from servefleet.fleet.spec import LOCAL, FleetSpec, HostSpec
from servefleet.hosts.local import LocalHost
from servefleet.hosts.ssh import SSHHost

__all__ = ["HostBinding", "HostPool"]


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
            return connect_slurm(
                spec, self.fleet, _connect_ssh(spec, self.fleet) if spec.ssh else None, lambda: self.fleet
            )
        return _connect_ssh(spec, self.fleet)

    async def close(self) -> None:
        bindings, self._bindings = list(self._bindings.values()), {}
        for binding in bindings:
            await binding.host.close()


def _connect_ssh(spec: HostSpec, fleet: FleetSpec) -> HostBinding:
    """The SSH seam: an SSHHost (connects on first use) and this fleet's folder on that host,
    ``<workdir>/<fleet name>``. A ``~`` in the work folder is replaced by the remote home as
    soon as the host connects (HostBinding.expand), so the paths in state records are the ones
    the remote processes were given (the lifecycle recognises its servers by their log path)."""
    ssh_spec = spec.ssh_spec  # the fleet file's settings, checked when it was read
    host = SSHHost(ssh_spec)
    binding = HostBinding(
        name=spec.name,
        host=host,
        work_dir=posixpath.join(spec.workdir, fleet.name),
        cwd=spec.workdir,  # stays as written (SSHHost expands it): part of the spec hash
        env={},  # the host's env travels with every command of SSHHost already
        python=spec.python or "python3",
        remote_state=True,
        expand=host.resolve,
    )
    return binding
