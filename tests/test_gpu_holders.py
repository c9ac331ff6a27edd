"""Who holds the GPU (issue 25.6): before launching, ``up`` lists the compute processes on the
server's GPUs (``nvidia-smi``; here a fake one on PATH printing nvidia-smi's CSV), warns about the
ones outside the fleet and names them in the verdict of a memory failure. Locally and over a real
sshd, where the question rides in the adopt-check batch."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import free_port
from servefleet.catalog import Category, State
from servefleet.fleet import Fleet
from servefleet.fleet.gpu_holders import describe_holder, foreign_holders, host_gpu_apps
from servefleet.fleet.hosts import HostBinding
from servefleet.hosts.gpu_apps import GpuApp, parse_gpu_apps
from servefleet.hosts.local import LocalHost

UUID0 = "GPU-5f1e0a6c-0b0e-7a2d-91c3-1d0f9e2b7a40"
UUID1 = "GPU-c2a7e3b1-44d9-1b6e-8f02-93aa10c5d7e1"


def fake_nvidia_smi(folder: Path, apps: list[tuple[str, int, str, int]], *, fail: bool = False) -> Path:
    """A ``nvidia-smi`` printing what the real one prints for the two queries up asks
    (``--format=csv,noheader,nounits``): two GPUs and ``apps`` (uuid, pid, name, MiB)."""
    folder.mkdir(parents=True, exist_ok=True)
    gpus = f"0, {UUID0}\n1, {UUID1}\n"
    listing = "".join(f"{u}, {p}, {n}, {m}\n" for u, p, n, m in apps)
    body = (
        "echo 'NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver.'; exit 9"
        if fail
        else f"case \"$*\" in\n*--query-gpu=index,uuid*) printf '%s' '{gpus}';;\n"
        f"*--query-compute-apps=gpu_uuid,pid,process_name,used_memory*) printf '%s' '{listing}';;\n*) exit 2;;\nesac"
    )
    script = folder / "nvidia-smi"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)
    return folder


@pytest.fixture
def stranger():
    """A process outside any fleet (its own session), standing in for another user's engine."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
    yield proc
    proc.kill()
    proc.wait()


def test_the_report_is_read_into_processes_with_their_gpu_index_and_group() -> None:
    report = (
        f"gpu, 0, {UUID0}\ngpu, 1, {UUID1}\n"
        f"app, {UUID0}, 4242, VLLM::EngineCore, 106496\napp, {UUID1}, 77, python3, a, b, [N/A]\n"
        "pgid, 4242, 4200\nnonsense\n"
    )
    apps = parse_gpu_apps(report)
    assert apps == [
        GpuApp(0, UUID0, 4242, "VLLM::EngineCore", 106496, 4200),
        GpuApp(1, UUID1, 77, "python3, a, b", None, None),
    ]
    assert describe_holder(apps[0]) == "GPU 0: 104 GiB held by pid 4242 VLLM::EngineCore, not in this fleet"
    assert describe_holder(apps[1]) == "GPU 1: memory (amount unknown) held by pid 77 python3, a, b, not in this fleet"
    # in the fleet: its group is a fleet server's; on another GPU: not this server's business
    assert foreign_holders(apps, {4200}, None) == [apps[1]]
    assert foreign_holders(apps, set(), frozenset({"1"})) == [apps[1]]
    assert foreign_holders(apps, set(), frozenset({UUID0})) == [apps[0]]


async def test_a_host_without_nvidia_smi_or_a_driver_lists_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    binding = HostBinding("local", LocalHost(), str(tmp_path))
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    assert await host_gpu_apps(binding) == []
    monkeypatch.setenv("PATH", f"{fake_nvidia_smi(tmp_path / 'bin', [], fail=True)}:/usr/bin:/bin")
    assert await host_gpu_apps(binding) == []


def write_fleet(tmp_path: Path, host: str = "") -> Path:
    path = tmp_path / "fleet.toml"
    path.write_text(
        '[fleet]\nname = "g"\ntimeout = 60\nstall = 30\n' + host + '[defaults]\nengine = "sim"\nmodel = "sim-m"\n'
        f'[[servers]]\nname = "oom"\nport = {free_port()}\ngpus = [0]\n'
        'args = ["--style", "vllm", "--load-time", "0.3", "--fail-at-startup", "gpu_oom"]\n'
    )
    return path


async def test_up_names_the_foreign_holder_of_its_gpu_before_launch_and_in_the_oom_verdict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fleets, stranger
) -> None:
    ours = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
    try:
        bin_dir = fake_nvidia_smi(
            tmp_path / "bin", [(UUID0, stranger.pid, "VLLM::EngineCore", 106496), (UUID1, 99999, "python3", 2048)]
        )  # GPU 1: not this server's
        monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
        fleet = fleets(Fleet.load(write_fleet(tmp_path)))
        outcomes = await fleet.start()
        named = f"GPU 0: 104 GiB held by pid {stranger.pid} VLLM::EngineCore, not in this fleet"
        assert outcomes["oom"].gpu_holders == (named,)
        verdict = (await fleet.wait(outcomes, smoke=False))["oom"]
        assert verdict.state == State.FAILED and verdict.category == Category.GPU_OOM
        assert named in (verdict.message or ""), verdict
        # a fleet server's own process on that GPU (its group is the recorded one) is not named
        record = fleet.store.load("oom")
        assert record is not None
        bin_dir = fake_nvidia_smi(tmp_path / "bin2", [(UUID0, ours.pid, "VLLM::EngineCore", 106496)])
        monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
        fleet.store.save(record.model_copy(update={"pgid": ours.pid}))
        from servefleet.fleet.gpu_holders import holder_notes

        apps = {"local": await host_gpu_apps(fleet.binding("local"))}
        assert [a.pid for a in apps["local"]] == [ours.pid]
        assert holder_notes(apps, {ours.pid}, frozenset({"0"}), "local") == []
    finally:
        ours.kill()
        ours.wait()


async def test_a_holder_that_came_after_the_launch_is_named_in_the_oom_verdict_as_the_host_lists_it_then(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fleets, stranger
) -> None:
    """On a shared card the process that took the memory often started, or grew, while the server
    loaded: the verdict names the holders as the host lists them at the failure, not before launch."""
    bin_dir = fake_nvidia_smi(tmp_path / "bin", [(UUID0, stranger.pid, "python3", 512)])  # a CUDA context
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    fleet = fleets(Fleet.load(write_fleet(tmp_path)))
    outcomes = await fleet.start()
    assert outcomes["oom"].gpu_holders == (f"GPU 0: 0.5 GiB held by pid {stranger.pid} python3, not in this fleet",)
    # while it loads: the stranger takes 70 GiB, and a second one starts on the card
    fake_nvidia_smi(bin_dir, [(UUID0, stranger.pid, "python3", 71680), (UUID0, os.getpid(), "train.py", 4096)])
    verdict = (await fleet.wait(outcomes, smoke=False))["oom"]
    assert verdict.category == Category.GPU_OOM, verdict
    assert f"GPU 0: 70 GiB held by pid {stranger.pid} python3, not in this fleet" in (verdict.message or ""), verdict
    assert f"GPU 0: 4.0 GiB held by pid {os.getpid()} train.py" in (verdict.message or ""), verdict
    assert "0.5 GiB" not in (verdict.message or "")


def test_up_cli_warns_before_the_server_loads(tmp_path: Path, stranger) -> None:
    bin_dir = fake_nvidia_smi(tmp_path / "bin", [(UUID0, stranger.pid, "VLLM::EngineCore", 106496)])
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    path = write_fleet(tmp_path)
    try:
        run = subprocess.run(
            [sys.executable, "-m", "servefleet.cli.main", "up", str(path), "--json"],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env=env,
            timeout=90,
        )
    finally:
        subprocess.run(
            [sys.executable, "-m", "servefleet.cli.main", "down", str(path)],
            capture_output=True,
            cwd=tmp_path,
            env=env,
            timeout=60,
        )
    named = f"GPU 0: 104 GiB held by pid {stranger.pid} VLLM::EngineCore, not in this fleet"
    assert f"warning: oom: {named}" in run.stderr, run.stderr
    import json

    (server,) = json.loads(run.stdout)["servers"]
    assert server["gpu_holders"] == [named] and named in server["verdict"]["message"]


@pytest.fixture
def sshd_with_fake_gpu(tmp_path_factory: pytest.TempPathFactory):
    """A real sshd whose sessions find a fake nvidia-smi first on PATH (sshd_config SetEnv)."""
    from sshd import SSHServer, sshd_unavailable_reason

    reason = sshd_unavailable_reason()
    if reason:
        pytest.skip(reason)
    root = tmp_path_factory.mktemp("sshd-gpu")
    server = SSHServer(root, extra_config=(f"SetEnv PATH={root / 'bin'}:/usr/local/bin:/usr/bin:/bin",)).start()
    yield server, root / "bin"
    server.stop()


async def test_over_ssh_the_holders_come_in_the_one_adopt_check_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fleets, stranger, sshd_with_fake_gpu
) -> None:
    from test_ssh_fleet import write_fleet as write_ssh_fleet

    server, bin_dir = sshd_with_fake_gpu
    fake_nvidia_smi(bin_dir, [(UUID0, stranger.pid, "VLLM::EngineCore", 106496)])

    from servefleet.hosts.gpu_apps import gpu_apps_argv

    asked_alone: list[str] = []

    def own_command() -> list[str]:
        asked_alone.append("asked")
        return gpu_apps_argv()

    monkeypatch.setattr("servefleet.fleet.gpu_holders.gpu_apps_argv", own_command)
    path, _ = write_ssh_fleet(tmp_path, server, {"oom": ["--style", "vllm", "--fail-at-startup", "gpu_oom"]})
    with path.open("a") as f:
        f.write("gpus = [0]\n")
    fleet = fleets(Fleet.load(path))
    outcomes = await fleet.start()
    named = f"GPU 0: 104 GiB held by pid {stranger.pid} VLLM::EngineCore, not in this fleet"
    assert outcomes["oom"].gpu_holders == (named,)
    assert asked_alone == [], "before launch, the GPU processes of an SSH host are asked outside the batch"
    verdict = (await fleet.wait(outcomes, smoke=False))["oom"]
    assert verdict.category == Category.GPU_OOM and named in (verdict.message or ""), verdict
