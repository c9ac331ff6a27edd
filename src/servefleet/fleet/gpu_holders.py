"""Processes outside the fleet that hold memory on the GPUs a server is about to use.

Asked once per host before ``up`` launches there (over SSH inside the adopt-check batch, see
prefetch.py; locally one ``sh`` command): ``up`` warns about each such process. The verdict of a
memory failure (``gpu_oom``) names them ("GPU 0: 104 GiB held by pid 4242 VLLM::EngineCore, not
in this fleet") as the host lists them at the failure, asked again then: on a shared card the
holder is often a process that started, or grew, while the server was loading. A process is in
the fleet when its process group is the group of one of the fleet's recorded servers (each server
leads a group of its own, its engine's workers included).
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable, Mapping

from servefleet.errors import HostUnreachable
from servefleet.fleet.hosts import HostBinding
from servefleet.hosts.capabilities import jobs_own_gpus
from servefleet.hosts.gpu_apps import GpuApp, gpu_apps_argv, parse_gpu_apps
from servefleet.hosts.questions import GpuApps, answered

__all__ = ["host_gpu_apps", "foreign_holders", "describe_holder", "holder_notes"]

log = logging.getLogger(__name__)


async def host_gpu_apps(binding: HostBinding, *, fresh: bool = False) -> list[GpuApp]:
    """The compute processes on the host's GPUs; [] on a host without ``nvidia-smi`` and on a
    scheduler's host (a job there gets GPUs of its own, on a node not known yet). ``fresh``: asked
    now, not taken from the adopt checks' batch (at a memory failure, long after that batch)."""
    if jobs_own_gpus(binding.host):
        return []
    found = None if fresh else answered(binding.host, [GpuApps()])  # the adopt checks' batch
    text = found[0].decode(errors="replace") if found is not None and found[0] is not None else None
    if text is None:
        try:
            result = await binding.host.run(gpu_apps_argv(), timeout=30, check=False)
        except HostUnreachable:
            raise
        except Exception as exc:  # a warning's input: never the reason a launch fails
            log.warning("could not list the GPU processes on %s (%s: %s)", binding.name, type(exc).__name__, exc)
            return []
        if result.returncode != 0:
            return []
        text = result.stdout
    return parse_gpu_apps(text)


def _on(app: GpuApp, gpus: frozenset[str] | None) -> bool:
    """Whether ``app`` is on one of ``gpus`` (indices or uuids as the fleet file gives them;
    None: the server is not restricted, so every GPU of the host)."""
    if gpus is None:
        return True
    return (app.gpu_index is not None and str(app.gpu_index) in gpus) or app.gpu_uuid in gpus


def foreign_holders(apps: Iterable[GpuApp], fleet_pgids: Collection[int], gpus: frozenset[str] | None) -> list[GpuApp]:
    """The processes of ``apps`` on ``gpus`` that are not in a group of ``fleet_pgids``."""
    return [
        a for a in apps if _on(a, gpus) and (a.pgid is None or a.pgid not in fleet_pgids) and a.pid not in fleet_pgids
    ]


def _size(mib: int | None) -> str:
    if mib is None:
        return "memory (amount unknown)"
    gib = mib / 1024
    return f"{gib:.0f} GiB" if gib >= 10 else f"{gib:.1f} GiB"


def describe_holder(app: GpuApp) -> str:
    """ "GPU 0: 104 GiB held by pid 4242 VLLM::EngineCore, not in this fleet"."""
    gpu = f"GPU {app.gpu_index}" if app.gpu_index is not None else f"GPU {app.gpu_uuid}"
    name = f" {app.name}" if app.name else ""
    return f"{gpu}: {_size(app.used_mib)} held by pid {app.pid}{name}, not in this fleet"


def holder_notes(
    by_host: Mapping[str, list[GpuApp]], fleet_pgids: Collection[int], gpus: frozenset[str] | None, host: str
) -> list[str]:
    """The descriptions of the foreign holders on ``host``'s ``gpus``."""
    return [describe_holder(a) for a in foreign_holders(by_host.get(host, []), fleet_pgids, gpus)]
