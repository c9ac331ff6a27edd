"""The optional parts of the host contract, declared: what a host can do beyond ``Host`` (files and
processes). The fleet and generate layers ask for a capability through the functions here, by
type, never by an attribute name a type checker cannot see: a typo is an error, not a feature
silently off.

- ``Scheduler``: servers are scheduler jobs (Slurm). A server's "process group" is its job id; the
  scheduler says whether it waits (``queued``), how it ended (``ended``), whether its end is near
  (``noticed``, ``remaining_s``) and it gives each job GPUs of its own (``jobs_own_gpus``).
- ``Connecting``: a host that needs connecting before use (SSH's master connection, a login node).
- ``Batching``: a host where a round trip costs (SSH): several questions answered in one command.
- ``Answering`` (hosts/questions.py): a view of a host answering questions from a batch asked
  earlier (fleet/prefetch.PrefetchedHost).
- ``UnitHost`` (hosts/base.py) and ``WatchHost`` (hosts/watch.py) are the others.

A view (``Answering``) declares only ``Host``: the ``*_of`` helpers look behind it (``inner``), so a
capability is found on the host itself whichever way the caller holds it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from servefleet.hosts.base import UnitHost
from servefleet.hosts.questions import Answering
from servefleet.hosts.slurm_queue import JobInfo

__all__ = [
    "Scheduler",
    "Connecting",
    "Batching",
    "scheduler_of",
    "connecting_of",
    "batching_of",
    "units_of",
    "jobs_own_gpus",
]


@runtime_checkable
class Scheduler(Protocol):
    """A host whose servers are scheduler jobs; job ids stand where other hosts have process groups."""

    jobs_own_gpus: bool  # each job gets GPUs of its own: servers here never wait for each other's GPUs

    async def jobs(self, max_age: float | None = None) -> Mapping[str, JobInfo]:
        """This user's jobs as the scheduler sees them (one shared answer for ``max_age`` seconds)."""
        ...

    async def queued(self, job_id: int) -> str | None:
        """Why job ``job_id`` still waits to run ("job 42 pending (Resources) for 12s"), or None."""
        ...

    async def ended(self, job_id: int) -> str | None:
        """How an ended job ended, while the scheduler still knows it; None for a live job."""
        ...

    async def noticed(self, job_id: int, status_path: str) -> bool:
        """Whether the job got its advance notice of its end (sbatch ``--signal``)."""
        ...

    async def remaining_s(self, job_id: int) -> float | None:
        """Seconds left before the job's time limit ends it; None when it has no limit, has not
        started, or the scheduler does not know it."""
        ...


@runtime_checkable
class Connecting(Protocol):
    async def connect(self) -> None:
        """Open what the host needs before its first command (idempotent)."""
        ...


@runtime_checkable
class Batching(Protocol):
    async def batch(self, ops: Sequence[Any]) -> dict[Any, Any]:
        """Answer several questions (hosts/ssh_batch.Op) in one round trip."""
        ...


def _behind(host: object) -> object:
    """The host itself behind a view answering from a batch (fleet/prefetch.PrefetchedHost)."""
    return host.inner if isinstance(host, Answering) else host


def scheduler_of(host: object) -> Scheduler | None:
    host = _behind(host)
    return host if isinstance(host, Scheduler) else None


def connecting_of(host: object) -> Connecting | None:
    host = _behind(host)
    return host if isinstance(host, Connecting) else None


def batching_of(host: object) -> Batching | None:
    host = _behind(host)
    return host if isinstance(host, Batching) else None


def units_of(host: object) -> UnitHost | None:
    """The host as a starter of systemd --user units (whichever launcher it is set to use)."""
    host = _behind(host)
    return host if isinstance(host, UnitHost) else None


def jobs_own_gpus(host: object) -> bool:
    """Whether each server on ``host`` is given GPUs of its own (a scheduler's host): never shared."""
    scheduler = scheduler_of(host)
    return scheduler is not None and scheduler.jobs_own_gpus
