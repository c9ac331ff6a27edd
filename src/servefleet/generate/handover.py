"""Handing a Slurm server over to a successor job before its time limit (``--handover-margin``).

When a server's job has less time left than the server took to get ready plus the margin, a
successor is submitted early: a copy of the server under the next name (``w-3`` -> ``w-3.h1`` ->
``w-3.h2``, with a port key of its own: a Slurm job picks its real port on its node). It
joins the job like any server that becomes ready (verified, admitted); only then is the old one
drained (no new requests, its in-flight ones finish) and its job cancelled. So the job keeps the
server's width through the queue wait and the load time instead of losing it at the limit. A job
without a time limit (``remaining_s`` None) is left alone. The host is asked only through the
``Scheduler`` capability (hosts/capabilities.py).

:func:`due`, :func:`successor_name` and :func:`margin_problem` are pure.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from servefleet.hosts.slurm_queue import slurm_seconds

if TYPE_CHECKING:
    from servefleet.fleet.spec import HostSpec

__all__ = ["due", "successor_name", "margin_problem", "Handover"]

_GENERATION = re.compile(r"^(?P<base>.+)\.h(?P<n>\d+)$")


def due(
    remaining_s: float | None, time_to_ready_s: float | None, margin_s: float, limit_s: float | None = None
) -> bool:
    """Whether a successor must be submitted now: never for a job without a limit, nor for one whose
    whole limit is not longer than the time to ready plus the margin (its successor would be due
    the moment it started: one handover after another)."""
    if remaining_s is None:
        return False
    needed = (time_to_ready_s or 0.0) + margin_s
    if limit_s is not None and limit_s <= needed:
        return False
    return remaining_s < needed


def successor_name(name: str) -> str:
    m = _GENERATION.match(name)
    return f"{m['base']}.h{int(m['n']) + 1}" if m else f"{name}.h1"


def margin_problem(margin_s: float, hosts: Iterable[HostSpec]) -> str | None:
    """Why ``--handover-margin`` cannot work with these Slurm hosts: not shorter than a time limit
    (every job would be handed over at its start); None when it can."""
    for host in hosts:
        if host.kind != "slurm" or host.time is None:
            continue
        limit = slurm_seconds(str(host.time))
        if limit is not None and margin_s >= limit:
            return (
                f"--handover-margin {margin_s:g}s is not shorter than the time limit of [hosts.{host.name}] "
                f"(time = {host.time!r}: {limit:g}s): every job would be handed over as soon as it starts"
            )
    return None


@dataclass
class Handover:
    old: str
    new: str
    remaining_s: float
    joined: bool = False
    stopping: bool = False
