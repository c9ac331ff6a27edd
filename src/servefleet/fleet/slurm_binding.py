"""A ``kind = "slurm"`` host of a fleet: the SlurmHost (hosts/slurm.py) over its transport, and
the two things only the fleet layer knows and the host needs: which server a port belongs to
(to find where its current job runs) and each server's port in the fleet file. Where the argv
carries the port is declared, not found: the binding's ``port_slot`` has the engine write
engines.base.PORT_SLOT there and the job puts the port it picks on its node in its place.
"""

from __future__ import annotations

import os
import posixpath
import sys
from collections.abc import Callable, Iterator, Mapping

from servefleet.engines.base import PORT_SLOT
from servefleet.fleet.binding import HostBinding
from servefleet.fleet.spec import FleetSpec, HostSpec, ServerSpec
from servefleet.hosts.local import LocalHost
from servefleet.hosts.slurm import SlurmHost, SlurmSpec
from servefleet.hosts.slurm_script import sbatch_options

__all__ = ["connect_slurm"]


def connect_slurm(
    spec: HostSpec, fleet: FleetSpec, ssh: HostBinding | None, current: Callable[[], FleetSpec] | None = None
) -> HostBinding:
    """``ssh``: the login node's binding when the table names one (its host is the transport and
    its work folder, ``~`` expanded on connect, is this fleet's folder), else this machine.
    ``current``: the fleet's servers now (a job's successor copies, generate/handover.py, join them)."""
    if ssh is not None:
        transport, work_dir, cwd, python, expand = (
            ssh.host,
            ssh.work_dir,
            ssh.cwd,
            spec.python or "python3",
            ssh.expand,
        )  # one folder on both
    else:
        transport = LocalHost()
        work_dir = posixpath.join(os.path.expanduser(spec.workdir), fleet.name)
        cwd, python, expand = str(fleet.path.parent), spec.python or sys.executable or "python3", None
    binding = HostBinding(
        name=spec.name,
        host=transport,
        work_dir=work_dir,
        cwd=cwd,
        env={},
        python=python,
        remote_state=True,
        expand=expand,
        port_slot=True,
    )

    def servers() -> dict[str, ServerSpec]:
        return {s.name: s for s in (current() if current is not None else fleet).servers if s.host == spec.name}

    def where_for_port(port: int) -> str | None:
        for server in servers().values():
            if server.port == port:
                return binding.status_path(server.name).removesuffix(".status") + ".where"
        return None

    slurm = SlurmSpec(
        name=spec.name,
        sbatch=tuple(sbatch_options(spec.slurm_options())),
        env=dict(spec.env),
        poll_interval=spec.poll_interval,
        port_range=spec.port_range,
        python=python,
        fleet=fleet.name,
        port_slot=PORT_SLOT,
        fleet_ports=_LivePorts(servers),  # live: a job's successor copies (generate/handover.py) join the fleet later
    )
    binding.host = SlurmHost(slurm, transport, where_for_port)
    return binding


class _LivePorts(Mapping[str, int]):
    """Each server's fleet-file port, read from the fleet's servers as they are now."""

    def __init__(self, servers: Callable[[], dict[str, ServerSpec]]) -> None:
        self._servers = servers

    def __getitem__(self, name: str) -> int:
        return self._servers()[name].port

    def __iter__(self) -> Iterator[str]:
        return iter(self._servers())

    def __len__(self) -> int:
        return len(self._servers())
