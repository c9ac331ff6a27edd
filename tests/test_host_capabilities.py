"""The declared capabilities (hosts/capabilities.py): each host kind is found by type, and the
scheduler's remaining time is read from squeue's own duration formats."""

from __future__ import annotations

import pytest

from servefleet.hosts.capabilities import batching_of, connecting_of, scheduler_of
from servefleet.hosts.local import LocalHost
from servefleet.hosts.slurm import SlurmHost, SlurmSpec
from servefleet.hosts.slurm_queue import JobInfo, slurm_seconds


def test_a_slurm_host_is_a_scheduler_and_a_local_host_is_not() -> None:
    local = LocalHost()
    slurm = SlurmHost(SlurmSpec(name="s"), local, lambda _port: None)
    assert scheduler_of(slurm) is slurm
    assert scheduler_of(local) is None
    assert connecting_of(slurm) is slurm
    assert batching_of(local) is None


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("1:00", 60.0),
        ("59", 3540.0),
        ("2:03:04", 7384.0),
        ("1-00:00:00", 86400.0),
        ("3-4:05:06", 273906.0),
        ("1-2", 93600.0),
        ("1-2:30", 95400.0),  # sbatch's days-hours[:minutes]
        ("UNLIMITED", None),
        ("INVALID", None),
        ("", None),
        ("NOT_SET", None),
    ],
)
def test_slurm_durations(text: str, seconds: float | None) -> None:
    assert slurm_seconds(text) == seconds


def test_remaining_time_only_for_a_running_job_with_a_limit() -> None:
    assert JobInfo("1", "RUNNING", used="0:20", limit="1:00").remaining_s == 40.0
    assert JobInfo("1", "RUNNING", used="1:10", limit="1:00").remaining_s == 0.0
    assert JobInfo("1", "PENDING", used="0:00", limit="1:00").remaining_s is None
    assert JobInfo("1", "RUNNING", used="0:20", limit="UNLIMITED").remaining_s is None


def test_each_host_kind_declares_its_optional_parts_by_type() -> None:
    from servefleet.fleet.prefetch import PrefetchedHost
    from servefleet.hosts.capabilities import jobs_own_gpus
    from servefleet.hosts.questions import Answering
    from servefleet.hosts.ssh import SSHHost
    from servefleet.hosts.ssh_options import SSHSpec

    local = LocalHost()
    ssh = SSHHost(SSHSpec(name="s", destination="127.0.0.1"))
    slurm = SlurmHost(SlurmSpec(name="c"), ssh, lambda _port: None)
    assert (batching_of(ssh), connecting_of(ssh), scheduler_of(ssh)) == (ssh, ssh, None)
    assert (batching_of(slurm), connecting_of(slurm), scheduler_of(slurm)) == (None, slurm, slurm)
    assert (batching_of(local), connecting_of(local), scheduler_of(local)) == (None, None, None)
    assert [jobs_own_gpus(h) for h in (local, ssh, slurm)] == [False, False, True]
    view = PrefetchedHost(ssh)
    assert isinstance(view, Answering) and not isinstance(ssh, Answering) and view.inner is ssh


def test_the_fleet_restarter_declares_holds_and_notices() -> None:
    from servefleet.generate.endpoints import FleetRestarter, Holding, Retiring

    restarter = FleetRestarter(fleet=None)
    assert isinstance(restarter, Holding) and isinstance(restarter, Retiring)

    class RestartsOnly:
        async def restart(self, name, on_event):  # type: ignore[no-untyped-def]
            return None

    assert not isinstance(RestartsOnly(), Holding) and not isinstance(RestartsOnly(), Retiring)
