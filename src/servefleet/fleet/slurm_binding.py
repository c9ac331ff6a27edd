"""A ``kind = "slurm"`` host of a fleet: the SlurmHost (hosts/slurm.py) over its transport, and
the two things only the fleet layer knows and the host needs: which server a port belongs to
(to find where its current job runs) and where its engine's argv carries the port (to rewrite it
with the port the job picks on its node).
"""

from __future__ import annotations

import os
import posixpath
import sys
from collections.abc import Callable

from servefleet.fleet.hosts import HostBinding
from servefleet.fleet.spec import FleetSpec, HostSpec, ServerSpec
from servefleet.hosts.local import LocalHost
from servefleet.hosts.slurm import SlurmHost, SlurmSpec, port_positions
from servefleet.hosts.slurm_script import sbatch_options

__all__ = ["connect_slurm"]


def connect_slurm(spec: HostSpec, fleet: FleetSpec, ssh: HostBinding | None, current: Callable[[], FleetSpec] | None = None) -> HostBinding:
    """``ssh``: the login node's binding when the table names one (its host is the transport and
    its work folder, ``~`` expanded on connect, is this fleet's folder), else this machine.
    ``current``: the fleet's servers now (a job's successor copies, generate/handover.py, join them)."""
    if ssh is not None:
        transport, work_dir, cwd, python = ssh.host, ssh.work_dir, ssh.cwd, spec.python or "python3"
    else:
        transport = LocalHost()
        work_dir = posixpath.join(os.path.expanduser(spec.workdir), fleet.name)
        cwd, python = str(fleet.path.parent), spec.python or sys.executable or "python3"
    binding = HostBinding(name=spec.name, host=transport, work_dir=work_dir, cwd=cwd, env={}, python=python, remote_state=True)
    if ssh is not None:
        def absolute(connected) -> None:
            binding.work_dir = connected.expand(posixpath.join(spec.workdir, fleet.name))

        ssh.host.on_connect.append(absolute)  # type: ignore[attr-defined]
    def servers() -> dict[str, ServerSpec]:
        return {s.name: s for s in (current() if current is not None else fleet).servers if s.host == spec.name}

    def where_for_port(port: int) -> str | None:
        for server in servers().values():
            if server.port == port:
                return binding.status_path(server.name).removesuffix(".status") + ".where"
        return None

    def port_plan(status_path: str) -> tuple[int, list[int]]:
        from servefleet.fleet.lifecycle import resolve_launch  # lifecycle imports this layer's hosts

        name = posixpath.basename(status_path).removesuffix(".status")
        server = servers().get(name)
        if server is None:
            return 0, []

        def build(port: int) -> list[str]:
            return resolve_launch(server.model_copy(update={"port": port}), binding, fleet.path.name).argv

        return server.port, port_positions(build, server.port)

    slurm = SlurmSpec(
        name=spec.name,
        sbatch=tuple(sbatch_options(spec.slurm_options())),
        env=dict(spec.env),
        poll_interval=spec.poll_interval,
        port_range=spec.port_range,
        python=python,
        fleet=fleet.name,
    )
    binding.host = SlurmHost(slurm, transport, where_for_port, port_plan)
    return binding
