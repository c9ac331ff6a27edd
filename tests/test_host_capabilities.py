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


@pytest.mark.parametrize(("text", "seconds"), [
    ("1:00", 60.0), ("59", 3540.0), ("2:03:04", 7384.0), ("1-00:00:00", 86400.0), ("3-4:05:06", 273906.0),
    ("UNLIMITED", None), ("INVALID", None), ("", None), ("NOT_SET", None),
])
def test_slurm_durations(text: str, seconds: float | None) -> None:
    assert slurm_seconds(text) == seconds


def test_remaining_time_only_for_a_running_job_with_a_limit() -> None:
    assert JobInfo("1", "RUNNING", used="0:20", limit="1:00").remaining_s == 40.0
    assert JobInfo("1", "RUNNING", used="1:10", limit="1:00").remaining_s == 0.0
    assert JobInfo("1", "PENDING", used="0:00", limit="1:00").remaining_s is None
    assert JobInfo("1", "RUNNING", used="0:20", limit="UNLIMITED").remaining_s is None
