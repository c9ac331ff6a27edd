"""Fleets on an SSH host: the fleet layer over SSHHost and a real sshd on 127.0.0.1 (the
"remote"), simulated engines as servers. Launch → ready through the forward, a remote failure
diagnosed, the link cut mid-wait, a killed server, an unreachable host, a model path full of shell
syntax, adoption from a machine that has only the fleet file, and `down` leaving nothing behind."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import psutil
import pytest

from conftest import async_wait_until, free_port
from servefleet.catalog import Category, State
from servefleet.errors import HostUnreachable
from servefleet.fleet import Fleet, Liveness
from servefleet.hosts.ssh import SSHHost

WEIRD_MODEL = "models/my model 'v2' \"q\" $(touch pwned) `id`"
SECRET = "hf_RemoteSecret42"


def group_members(pgid: int) -> list[int]:
    found = []
    for proc in psutil.process_iter(["pid", "status"]):
        try:
            if proc.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(proc.info["pid"]) == pgid:
                found.append(proc.info["pid"])
        except (ProcessLookupError, psutil.Error):
            continue
    return found


def write_fleet(
    tmp_path: Path,
    server,
    servers: dict[str, list[str]],
    *,
    port: int | None = None,
    models: dict[str, str] | None = None,
    timeout: float = 60,
    stall: float = 30,
) -> tuple[Path, dict[str, int]]:
    """A fleet of sim servers on host "rig" (the sshd), remote work folder under tmp_path."""
    ports = {name: free_port() for name in servers}
    remote = tmp_path / "remote home"
    remote.mkdir(exist_ok=True)
    parts = [
        f'[fleet]\nname = "rf"\ntimeout = {timeout}\nstall = {stall}\n',
        "[hosts.rig]\n"
        f'ssh = "{server.destination}"\nport = {port or server.port}\n'
        f'identity_file = "{server.identity_file}"\nknown_hosts = "{server.known_hosts}"\n'
        f'config_file = "{server.client_config()}"\nworkdir = {json.dumps(str(remote))}\n'
        f'python = "{sys.executable}"\nconnect_timeout = 3\n'
        f'env = {{ HF_TOKEN = "{SECRET}" }}\n',
        '[defaults]\nengine = "sim"\nmodel = "sim-m"\nhost = "rig"\nargs = ["--load-time", "0.3"]\n',
    ]
    for name, args in servers.items():
        model = (models or {}).get(name)
        extra = f"model = {json.dumps(model)}\n" if model else ""
        parts.append(f'[[servers]]\nname = "{name}"\nport = {ports[name]}\nargs = {json.dumps(args)}\n{extra}')
    path = tmp_path / "fleet.toml"
    path.write_text("\n".join(parts))
    return path, ports


def cli(*args: str, cwd: Path, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "servefleet.cli.main", *args], capture_output=True, text=True, cwd=cwd, timeout=timeout
    )


async def test_remote_up_ready_adopt_from_a_new_machine_and_down(sshd_server, tmp_path: Path, fleets) -> None:
    model_dir = tmp_path / "remote home" / WEIRD_MODEL
    model_dir.mkdir(parents=True)
    path, ports = write_fleet(tmp_path, sshd_server, {"w": ["--style", "vllm"]}, models={"w": str(model_dir)})
    fleet = fleets(Fleet.load(path))

    verdicts = await fleet.up(smoke=True)
    assert {n: v.state for n, v in verdicts.items()} == {"w": State.READY}, verdicts
    records = {n: fleet.store.load(n) for n in ("w",)}
    work = tmp_path / "remote home" / "rf"
    for name, record in records.items():
        assert record.host == "rig" and group_members(record.pgid)
        assert record.log_path == str(work / "logs" / f"{name}.log")  # absolute on the remote
        remote_record = work / "state" / f"{name}.json"  # written next to the server as well
        assert stat.S_IMODE(remote_record.stat().st_mode) == 0o600
        assert json.loads(remote_record.read_text())["pgid"] == record.pgid
        assert SECRET not in remote_record.read_text()
    # the model path reached the engine literally (no shell ever parsed it)
    assert str(model_dir) in Path(records["w"].log_path).read_text()
    assert not (tmp_path / "remote home" / "pwned").exists() and not (Path.home() / "pwned").exists()

    # ready servers are reached through a local forward, not their remote port
    endpoints = {e.name: e for e in await fleet.ready_endpoints()}
    assert set(endpoints) == {"w"}
    for name, ep in endpoints.items():
        assert ep.base_url.startswith("http://127.0.0.1:") and not ep.base_url.endswith(f":{ports[name]}")
        async with aiohttp.ClientSession() as session, session.get(f"{ep.base_url}/v1/models") as resp:
            assert resp.status == 200
    assert endpoints["w"].served_model == str(model_dir)

    # a new machine with only the fleet file: the local state is gone, the remote one is found
    await fleet.close()
    shutil.rmtree(tmp_path / ".servefleet")
    res = cli("status", "--json", "--fleet", str(path), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    seen = {s["name"]: s for s in json.loads(res.stdout)["servers"]}
    assert {n: (s["state"], s["pid"]) for n, s in seen.items()} == {n: ("ready", r.pgid) for n, r in records.items()}
    again = fleets(Fleet.load(path))
    outcomes = await again.start()
    assert {n: o.action.value for n, o in outcomes.items()} == {"w": "adopted"}

    # down, from yet another process: nothing left running on the remote, records removed
    res = cli("down", "--json", "--fleet", str(path), cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    for name, record in records.items():
        assert group_members(record.pgid) == []
        assert not (work / "state" / f"{name}.json").exists()
    statuses = {s.name: s.state for s in await fleets(Fleet.load(path)).status()}
    assert statuses == {"w": Liveness.NOT_LAUNCHED}


async def test_remote_failure_is_diagnosed_and_a_killed_server_detected(sshd_server, tmp_path: Path, fleets) -> None:
    path, _ = write_fleet(tmp_path, sshd_server, {"oom": ["--fail-at-startup", "gpu_oom"], "ok": []})
    fleet = fleets(Fleet.load(path))
    verdicts = await fleet.up(smoke=False)
    oom = verdicts["oom"]
    assert oom.state == State.FAILED and oom.category == Category.GPU_OOM and oom.evidence is not None
    lines = Path(fleet.store.load("oom").log_path).read_text().splitlines()
    assert lines[oom.evidence.line_no - 1].strip().endswith(oom.evidence.text.strip()[-40:])
    assert verdicts["ok"].state == State.READY

    # `servefleet tunnel ok`: another process exposes the remote server on a chosen local port
    local = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "servefleet.cli.main",
            "tunnel",
            "ok",
            "--json",
            "--local-port",
            str(local),
            "--fleet",
            str(path),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONFAULTHANDLER": "1"},
    )
    try:
        line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 60)
        assert line, proc.stderr.read()
        opened = json.loads(line)
        assert opened["url"] == f"http://127.0.0.1:{local}" and opened["host"] == "rig"
        async with aiohttp.ClientSession() as session, session.get(f"{opened['url']}/v1/models") as resp:
            assert resp.status == 200 and "sim-m" in await resp.text()
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            code = await asyncio.to_thread(proc.wait, 30)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGABRT)  # PYTHONFAULTHANDLER: every thread's stack to stderr
            proc.wait(10)
            raise AssertionError(f"tunnel did not end on SIGINT:\n{proc.stderr.read()[-6000:]}") from None
        assert code == 0, proc.stderr.read()
    with pytest.raises(OSError):  # closed with the tunnel
        await asyncio.open_connection("127.0.0.1", local)

    record = fleet.store.load("ok")
    os.killpg(record.pgid, signal.SIGKILL)  # the remote server dies (same machine)

    async def dead() -> bool:
        states = {s.name: s for s in await fleet.status()}
        return states["ok"].state == Liveness.DEAD

    await async_wait_until(dead, timeout=20, what="the killed remote server to show as dead")


async def test_wait_survives_the_ssh_link_dropping(sshd_server, tmp_path: Path, fleets) -> None:
    path, ports = write_fleet(tmp_path, sshd_server, {"slow": ["--load-time", "4", "--shards", "8"]})
    fleet = fleets(Fleet.load(path))
    outcomes = await fleet.start()
    record = outcomes["slow"].record
    waiting = asyncio.ensure_future(fleet.wait(outcomes, smoke=False))
    log = Path(record.log_path)
    await async_wait_until(lambda: _loading(log), timeout=20, what="the server to start loading")
    host = fleet.binding("rig").host
    assert isinstance(host, SSHHost)
    starts = host.pool.starts
    for pid in host.pool.master_pids():  # the link drops in the middle of the wait
        os.kill(pid, signal.SIGKILL)
    verdict = (await asyncio.wait_for(waiting, 60))["slow"]
    assert verdict.state == State.READY, verdict
    assert host.pool.starts > starts  # reconnected
    assert group_members(record.pgid)  # the same server, never relaunched
    assert fleet.store.load("slow").pgid == record.pgid


async def _loading(log: Path) -> bool:
    return log.exists() and b"Loading" in log.read_bytes()


async def test_unreachable_host_is_reported_within_the_connect_timeout(sshd_server, tmp_path: Path, fleets) -> None:
    path, _ = write_fleet(tmp_path, sshd_server, {"a": []}, port=free_port())
    fleet = fleets(Fleet.load(path))
    started = time.monotonic()
    with pytest.raises(HostUnreachable, match="connection refused"):
        await fleet.up()
    assert time.monotonic() - started < 3 + 2
    res = cli("status", "--fleet", str(path), cwd=tmp_path)
    assert res.returncode == 4, res.stdout + res.stderr  # ExitCode.UNREACHABLE
    assert "unreachable" in (res.stdout + res.stderr)


async def test_two_hosts_one_in_its_own_network_namespace(sshd_server, tmp_path: Path, fleets) -> None:
    """Two "hosts" with separate network stacks serve the same port number; each forward reaches
    its own server."""
    from sshd import NetnsSSHServer, netns_unavailable_reason, require

    require(netns_unavailable_reason())
    other = NetnsSSHServer(tmp_path / "sshd-ns").start()
    try:
        port = free_port()  # the same port on both hosts: only separate network stacks allow it
        hosts = []
        for name, srv in (("rig", sshd_server), ("ns", other)):
            work = tmp_path / f"work-{name}"
            hosts.append(
                f"[hosts.{name}]\n"
                f'ssh = "{srv.destination}"\nport = {srv.port}\nidentity_file = "{srv.identity_file}"\n'
                f'known_hosts = "{srv.known_hosts}"\nconfig_file = "{srv.client_config()}"\n'
                f'workdir = "{work}"\npython = "{sys.executable}"\nconnect_timeout = 5\n'
            )
        servers = "".join(
            f'[[servers]]\nname = "on-{h}"\nhost = "{h}"\nport = {port}\nserved_model_name = "model-on-{h}"\n'
            for h in ("rig", "ns")
        )
        path = tmp_path / "fleet.toml"
        path.write_text(
            '[fleet]\nname = "two"\ntimeout = 60\nstall = 30\n\n'
            + "\n".join(hosts)
            + '\n[defaults]\nengine = "sim"\nmodel = "sim-m"\nargs = ["--load-time", "0.3"]\n\n'
            + servers
        )
        fleet = fleets(Fleet.load(path))
        verdicts = await fleet.up(smoke=False)
        assert {n: v.state for n, v in verdicts.items()} == {"on-rig": State.READY, "on-ns": State.READY}, verdicts
        endpoints = {e.name: e.base_url for e in await fleet.ready_endpoints()}
        assert len(set(endpoints.values())) == 2
        async with aiohttp.ClientSession() as session:
            for name, url in endpoints.items():
                async with session.get(f"{url}/v1/models") as resp:
                    assert f"model-{name}" in await resp.text()
        results = await fleet.down(grace_s=5)
        assert all(r.ok and r.was_running for r in results.values()), results
    finally:
        other.stop()


@pytest.mark.engine
@pytest.mark.timeout(900)
async def test_transformers_serve_on_the_ssh_host(sshd_server, tmp_path: Path, fleets) -> None:
    """The real `transformers serve` on the SSH host: a tiny model in a folder whose name needs
    quoting, ready through the forward, one real completion through it, `down` leaves nothing."""
    from servefleet.modelgen import build_tiny_model, spec_from_preset

    model = tmp_path / "remote home" / "tiny model 'q'"
    build_tiny_model(model, spec_from_preset("tiny", seed=3))
    path, _ = write_fleet(
        tmp_path, sshd_server, {"tf": ["--device", "cpu"]}, models={"tf": str(model)}, timeout=600, stall=300
    )
    text = (
        path.read_text()
        .replace('engine = "sim"', 'engine = "transformers"')
        .replace('args = ["--load-time", "0.3"]\n', 'env = { HF_HUB_OFFLINE = "1", OMP_NUM_THREADS = "1" }\n')
    )
    path.write_text(text)
    fleet = fleets(Fleet.load(path))
    verdict = (await fleet.up(smoke=True))["tf"]
    assert verdict.state == State.READY, verdict
    (endpoint,) = await fleet.ready_endpoints()
    body = {"model": str(model), "prompt": "The server is", "max_tokens": 4}
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{endpoint.base_url}/v1/completions", json=body) as resp,
    ):
        answer = await resp.json()
    assert answer["choices"][0]["text"].strip() and 1 <= answer["usage"]["completion_tokens"] <= 4
    pgid = fleet.store.load("tf").pgid
    result = (await fleet.down(grace_s=20))["tf"]
    assert result.ok and result.port_free
    assert group_members(pgid) == []
