"""The host contract every host kind passes — local, SSH (the real sshd on 127.0.0.1) and Slurm
(the real one-node Slurm, jobs submitted from this machine): files, a server-like process's
launch, identity (``Host.owns``), stop, and the optional capabilities each kind declares
(hosts/capabilities.py, found by type). A new host kind adds itself to ``KINDS`` and to the
``DECLARED`` table below (README "Adding a host kind").
"""

from __future__ import annotations

import signal
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import async_wait_until
from servefleet.hosts.base import Host, UnitHost
from servefleet.hosts.capabilities import Batching, Connecting, Scheduler
from servefleet.hosts.local import LocalHost
from servefleet.hosts.questions import Answering
from servefleet.hosts.watch import WatchHost

pytestmark = pytest.mark.filterwarnings("ignore::ResourceWarning")

KINDS = ["local", "ssh", "slurm"]
CAPABILITIES = {
    "Scheduler": Scheduler,
    "Connecting": Connecting,
    "Batching": Batching,
    "Answering": Answering,
    "UnitHost": UnitHost,
    "WatchHost": WatchHost,
}
DECLARED = {
    "local": {"WatchHost"},  # a polled watch stream (hosts/watch.poll_watch)
    "ssh": {"Connecting", "Batching", "UnitHost", "WatchHost"},
    "slurm": {"Scheduler", "Connecting", "WatchHost"},
}
FLEET = "hc"  # the Slurm host's fleet: its jobs are named servefleet-hc-SERVER


@dataclass
class Kind:
    name: str
    host: Host
    work: Path  # a folder the host sees at the same path (Slurm: shared with the node)


@pytest.fixture(params=KINDS)
async def kind(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Kind]:
    work = tmp_path / "work dir"
    work.mkdir()
    host: Host
    if request.param == "local":
        host = LocalHost()
    elif request.param == "ssh":
        from servefleet.hosts.ssh import SSHHost

        host = SSHHost(request.getfixturevalue("sshd_server").spec(workdir=str(tmp_path / "remote")))
    else:
        from servefleet.hosts.slurm import SlurmHost, SlurmSpec

        cluster = request.getfixturevalue("slurm")
        spec = SlurmSpec(
            name="cluster",
            sbatch=("--time=5",),
            env={"SLURM_CONF": str(cluster.conf)},
            poll_interval=0.2,
            python=sys.executable,
            fleet=FLEET,
        )
        host = SlurmHost(spec, LocalHost(), lambda _port: None)
    yield Kind(request.param, host, work)
    await host.close()


def test_each_kind_declares_exactly_its_capabilities(kind: Kind) -> None:
    assert isinstance(kind.host, Host)
    found = {name for name, protocol in CAPABILITIES.items() if isinstance(kind.host, protocol)}
    assert found == DECLARED[kind.name]


async def test_files(kind: Kind) -> None:
    host, path = kind.host, str(kind.work / "sub" / "f.bin")
    await host.write_bytes(path, b"0123456789")
    assert await host.read_bytes(path) == b"0123456789"
    assert await host.read_bytes(path, 3, 4) == b"3456"
    assert await host.file_size(path) == 10
    await host.remove(path)
    await host.remove(path)  # a missing file is not an error
    assert await host.file_size(path) is None
    with pytest.raises(FileNotFoundError):
        await host.read_bytes(path)


async def test_a_launched_server_is_owned_alive_and_stopped(kind: Kind) -> None:
    """``owns`` tells our group from a group of another server (another log: another marker);
    the group is alive until signalled, then gone."""
    host, work = kind.host, kind.work
    log, status = str(work / "logs" / "a.log"), str(work / "run" / "a.status")
    (work / "run").mkdir()
    launched = await host.launch(
        ["sh", "-c", "echo serving; exec sleep 60"], log_path=log, status_path=status, marker="==== m ===="
    )
    try:
        assert (launched.state, launched.log_offset, launched.line_no) == (
            "alive",
            len(b"==== m ====\n"),
            2,
        )  # this attempt starts after its marker
        assert await host.group_alive(launched.pgid)
        await async_wait_until(lambda: _has(host, log, b"serving"), timeout=30, what="the server's first line")
        assert (await host.read_bytes(log)).startswith(b"==== m ====\n")
        assert await host.owns(launched.pgid, log) is True
        assert await host.owns(launched.pgid, str(work / "logs" / "b.log")) is False
    finally:
        await host.signal_group(launched.pgid, signal.SIGTERM)

    async def gone() -> bool:
        return not await host.group_alive(launched.pgid)

    await async_wait_until(gone, timeout=30, what="the group to end")


async def test_a_gone_group_is_not_owned_and_has_no_command_line(kind: Kind) -> None:
    """An id no live group has: ``owns`` cannot say it is ours (None or False, never True)."""
    unused = 2**22 - 7
    assert not await kind.host.group_alive(unused)
    assert await kind.host.owns(unused, "/nowhere.log") is not True
    assert await kind.host.command_line(unused) is None


async def _has(host: Host, path: str, text: bytes) -> bool:
    try:
        return text in await host.read_bytes(path)
    except FileNotFoundError:
        return False
