"""Servers as Slurm jobs, against a real one-node Slurm (tests/slurm_rig.py), simulated engines as
the servers: launched with sbatch and verified ready, a failure diagnosed from the job's log, a
job pending for GPUs reported as pending (not stalled), down leaving no job, status asking the
scheduler once per host, and the login-node path over the real sshd.

Needs Slurm installed (scripts/ci-slurm-setup.sh); fails with that command when it is missing,
and is skipped only with SERVEFLEET_SKIP_SLURM=1.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from pathlib import Path

import aiohttp
import pytest

from conftest import PYTHON
from parquet_read import read_parquet
from servefleet.catalog import Category, State
from servefleet.fleet.core import Fleet
from servefleet.fleet.status import Liveness
from slurm_rig import SlurmCluster

pytestmark = pytest.mark.filterwarnings("ignore::ResourceWarning")


def fleet_text(
    cluster: SlurmCluster,
    shared: Path,
    servers: dict[str, list[str]],
    *,
    host_extra: str = "",
    defaults_extra: str = "",
) -> str:
    text = (
        f'[fleet]\nname = "sl"\ntimeout = 60\nstall = 20\n\n'
        f'[hosts.cluster]\nkind = "slurm"\nworkdir = "{shared}"\npoll_interval = 0.2\ntime = "10"\n'
        f'env = {{ SLURM_CONF = "{cluster.conf}" }}\n{host_extra}\n'
        f'[defaults]\nengine = "sim"\nmodel = "sim-m"\nhost = "cluster"\nargs = ["--load-time", "0.3"]\n{defaults_extra}\n'
    )
    for i, (name, args) in enumerate(servers.items()):
        quoted = ", ".join(f'"{a}"' for a in args)
        text += f'\n[[servers]]\nname = "{name}"\nport = {31100 + i}\nargs = [{quoted}]\n'
    return text


def write_fleet(tmp_path: Path, cluster: SlurmCluster, servers: dict[str, list[str]], **kw: str) -> Path:
    path = tmp_path / "fleet.toml"
    path.write_text(fleet_text(cluster, tmp_path / "shared", servers, **kw))
    return path


def our_jobs(cluster: SlurmCluster, live: bool = True) -> list[str]:
    return [j for j in (cluster.live_jobs() if live else cluster.jobs()) if "servefleet-sl-" in j]


async def test_servers_start_as_jobs_and_are_verified_ready(slurm: SlurmCluster, tmp_path: Path, fleets) -> None:
    fleet = fleets(Fleet.load(write_fleet(tmp_path, slurm, {"a": [], "b": []})))
    verdicts = await fleet.up()
    assert {n: v.state for n, v in verdicts.items()} == {"a": State.READY, "b": State.READY}, verdicts
    jobs = our_jobs(slurm)
    assert sorted(j.split()[2] for j in jobs) == ["servefleet-sl-a", "servefleet-sl-b"]
    assert all(j.split()[1] == "RUNNING" for j in jobs)
    records = {n: await fleet.record(n) for n in ("a", "b")}
    assert {str(r.pgid) for r in records.values()} == {j.split()[0] for j in jobs}  # the job id is the "group"
    # Each job picked its own port on the node and wrote it down; the relay reaches it.
    wheres = [(tmp_path / "shared" / "sl" / "run" / f"{n}.where").read_text() for n in ("a", "b")]
    ports = {dict(line.split("=") for line in w.split())["port"] for w in wheres}
    assert len(ports) == 2 and not ports & {"31100", "31101"}
    statuses = {s.name: s for s in await fleet.status()}
    assert {n: s.state for n, s in statuses.items()} == {"a": Liveness.READY, "b": Liveness.READY}
    async with aiohttp.ClientSession() as session:
        async with session.post(
            statuses["a"].base_url + "/v1/completions", json={"model": "sim-m", "prompt": "hi", "max_tokens": 3}
        ) as resp:
            assert resp.status == 200
            assert (await resp.json())["choices"]
    # up again adopts the running jobs instead of submitting new ones.
    before = slurm.jobs()
    again = await fleet.up()
    assert all(v.state == State.READY for v in again.values())
    assert slurm.jobs() == before

    results = await fleet.down()
    assert all(r.ok and r.was_running for r in results.values()), results
    assert our_jobs(slurm) == []  # confirmed ended: none pending, running or completing
    assert fleet.store.load("a") is None


async def test_a_failure_is_diagnosed_from_the_jobs_log(slurm: SlurmCluster, tmp_path: Path, fleets) -> None:
    fleet = fleets(Fleet.load(write_fleet(tmp_path, slurm, {"oom": ["--fail-at-startup", "gpu_oom"]})))
    verdict = (await fleet.up())["oom"]
    assert verdict.state == State.FAILED, verdict
    assert verdict.category == Category.GPU_OOM, verdict
    assert verdict.evidence is not None
    assert our_jobs(slurm) == []


async def test_a_job_killed_by_the_scheduler_is_reported_with_its_end_state(
    slurm: SlurmCluster, tmp_path: Path, fleets
) -> None:
    """A server that never gets ready, its job cancelled: category killed, Slurm's word and hint."""
    fleet = fleets(Fleet.load(write_fleet(tmp_path, slurm, {"slow": ["--load-time", "60"]})))
    outcomes = await fleet.start()
    job = str(outcomes["slow"].record.pgid)
    waiting = asyncio.create_task(fleet.wait(outcomes))
    for _ in range(200):
        if any(j.startswith(job + " RUNNING") for j in slurm.jobs()):
            break
        await asyncio.sleep(0.05)
    slurm.run("scancel", job)
    verdict = (await asyncio.wait_for(waiting, 60))["slow"]
    assert verdict.state == State.FAILED
    assert verdict.category == Category.KILLED
    assert f"Slurm job {job} ended CANCELLED" in (verdict.message or "")
    assert "sacct" in (verdict.hint or "")
    status = (await fleet.status())[0]
    assert status.state == Liveness.DEAD
    assert f"Slurm job {job} ended CANCELLED" in (status.detail or "")


async def test_a_job_pending_for_gpus_is_pending_not_stalled(slurm: SlurmCluster, tmp_path: Path, fleets) -> None:
    hog = slurm.run(
        "sbatch", "--parsable", "--gres=gpu:2", "--job-name=gpu-hog", "--output=/dev/null", "--wrap", "sleep 300"
    ).stdout.strip()
    try:
        path = write_fleet(tmp_path, slurm, {"gpu": []}, host_extra='gres = "gpu:1"\n')
        fleet = fleets(Fleet.load(path))
        seen: list[str] = []
        # stall = 1 s: a pending job must not be called stalled however long it waits.
        verdict = (await fleet.up(timeout_s=4, stall_s=1, on_update=lambda _n, v: seen.append(v.message or "")))["gpu"]
        assert verdict.state == State.STALLED
        assert "timed out after 4s" in (verdict.message or "")
        assert "pending in the scheduler's queue (Resources)" in (verdict.message or "")
        assert any("pending in the scheduler's queue" in m for m in seen)
        status = (await fleet.status())[0]
        assert status.state == Liveness.LOADING
        assert "pending (Resources)" in (status.detail or "")
        slurm.run("scancel", hog)  # the GPUs free up: the job runs and the server gets ready
        verdict = (await fleet.up(timeout_s=30))["gpu"]
        assert verdict.state == State.READY, verdict
        await fleet.down()
        assert our_jobs(slurm) == []
    finally:
        slurm.run("scancel", hog, check=False)


async def test_status_asks_the_scheduler_once_per_host(slurm: SlurmCluster, tmp_path: Path, fleets) -> None:
    fleet = fleets(Fleet.load(write_fleet(tmp_path, slurm, {f"s{i}": [] for i in range(3)})))
    verdicts = await fleet.up()
    assert all(v.state == State.READY for v in verdicts.values()), verdicts
    host = fleet.binding("cluster").host
    if host._asking is not None:  # the last wait's question, still on its way: not the status's
        await host._asking
    host._jobs_at = -1.0  # nothing cached: the status must ask
    before = host.scheduler_calls
    statuses = await fleet.status()
    assert [s.state for s in statuses] == [Liveness.READY] * 3
    assert host.scheduler_calls - before == 1
    await fleet.down()
    assert our_jobs(slurm) == []


async def test_login_node_path_over_ssh(slurm: SlurmCluster, sshd_server, tmp_path: Path, fleets) -> None:
    """Submitted on a "login node" reached over the real sshd: sbatch/squeue/scancel run there,
    the server is reached through an SSH forward."""
    if shutil.which("sbatch") is None:
        pytest.fail("sbatch is missing", pytrace=False)
    host_extra = (
        f'ssh = "{sshd_server.destination}"\nport = {sshd_server.port}\nidentity_file = "{sshd_server.identity_file}"\n'
        f'known_hosts = "{sshd_server.known_hosts}"\npython = "{os.sys.executable}"\n'
        f'venv = "{Path(os.sys.executable).parent.parent}"\n'
    )
    path = write_fleet(tmp_path, slurm, {"remote": []}, host_extra=host_extra)
    text = path.read_text().replace(
        f'env = {{ SLURM_CONF = "{slurm.conf}" }}',
        f'env = {{ SLURM_CONF = "{slurm.conf}", PYTHONPATH = "{os.environ.get("PYTHONPATH", "")}" }}',
    )
    path.write_text(text)
    fleet = fleets(Fleet.load(path))
    verdict = (await fleet.up())["remote"]
    assert verdict.state == State.READY, verdict
    host = fleet.binding("cluster").host
    assert host.transport.commands > 0  # the scheduler was asked over SSH
    status = (await fleet.status())[0]
    assert status.state == Liveness.READY
    await fleet.down()
    assert our_jobs(slurm) == []


def _prompts(path: Path, n: int) -> Path:
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"id": f"p{i}", "prompt": f"prompt {i}"}) + "\n")
    return path


def _committed(out: Path) -> list[str]:
    return [
        i
        for shard in sorted((out / "shards").glob("part-*.parquet"))
        for i in read_parquet(shard, columns=["id"]).column("id").to_pylist()
    ]


def _two_host_fleet(slurm: SlurmCluster, tmp_path: Path, sim: list[str]) -> Path:
    """ "steady" on a host with a 10-minute limit, "short" on a second table of the same cluster
    with a 1-minute one (Slurm's smallest)."""
    text = fleet_text(slurm, tmp_path / "shared", {"steady": sim, "short": sim}).replace(
        "timeout = 60", "timeout = 60\nsmoke = false"
    )
    table = text.split("[hosts.cluster]\n", 1)[1].split("[defaults]")[0]
    text = text.replace("[defaults]", "[hosts.minute]\n" + table.replace('time = "10"', 'time = "1"') + "[defaults]")
    text = text.replace('name = "short"\n', 'name = "short"\nhost = "minute"\n')
    path = tmp_path / "fleet.toml"
    path.write_text(text)
    return path


async def _generate(path: Path, tmp_path: Path, n: int, *, during=None) -> dict:  # type: ignore[no-untyped-def]
    """generate over the fleet in a subprocess; ``during`` runs once a first shard is committed."""
    src = _prompts(tmp_path / "in.jsonl", n)
    out = tmp_path / "out"
    argv = [
        PYTHON,
        "-m",
        "servefleet.cli.main",
        "generate",
        "-i",
        str(src),
        "-o",
        str(out),
        "--fleet",
        str(path),
        "--max-tokens",
        "4",
        "--concurrency",
        "4",
        "--shard-rows",
        "50",
        "--json",
    ]
    proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        if during is not None:
            async with asyncio.timeout(60):
                while not ((out / "shards").is_dir() and list((out / "shards").glob("part-*"))):
                    await asyncio.sleep(0.05)
            during()
        stdout, stderr = await asyncio.wait_for(proc.communicate(), 300)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0, stderr.decode()[-3000:]
    report = json.loads(stdout)
    assert report["status"] == "complete", report
    assert sorted(_committed(out)) == sorted(f"p{i}" for i in range(n))  # every prompt, exactly once
    return report


FAST = ["--max-running", "4", "--decode-ms", "2", "--decode-ms-per-running", "0", "--prefill-ms-per-1k-tokens", "0"]


async def test_generate_survives_a_cancelled_job(slurm: SlurmCluster, tmp_path: Path, fleets) -> None:
    """A server's job scancelled mid-job: taken out, its prompts re-queued, a new job submitted
    and used; every prompt answered exactly once."""
    fleet = fleets(Fleet.load(_two_host_fleet(slurm, tmp_path, FAST)))
    assert all(v.state == State.READY for v in (await fleet.up()).values())
    job = (await fleet.record("steady")).pgid
    report = await _generate(fleet.spec.path, tmp_path, 600, during=lambda: slurm.run("scancel", str(job)))
    steady = {s["name"]: s for s in report["servers"]}["steady"]
    assert steady["outages"] == 1 and steady["restarts"] == 1 and steady["state"] == "up", report["events"]
    assert any("steady: back in service" in e for e in report["events"])
    states = {j.split()[0]: j.split()[1] for j in slurm.jobs()}
    assert states[str(job)] == "CANCELLED"
    new = (await fleet.record("steady")).pgid
    assert new != job and states[str(new)] == "RUNNING"  # a new job, not the old one adopted
    await fleet.down()
    assert our_jobs(slurm) == []


async def test_generate_drains_a_server_on_its_jobs_advance_notice(
    slurm: SlurmCluster, tmp_path: Path, fleets
) -> None:
    """The advance notice of a time limit (sbatch --signal=B:USR1@N, delivered here at once with
    scancel --batch --signal=USR1, as slurmctld delivers it): the server gets no new requests,
    is restarted once its last one is answered, and nothing is re-queued for it."""
    fleet = fleets(Fleet.load(_two_host_fleet(slurm, tmp_path, FAST)))
    assert all(v.state == State.READY for v in (await fleet.up()).values())
    job = (await fleet.record("steady")).pgid
    report = await _generate(
        fleet.spec.path, tmp_path, 2500, during=lambda: slurm.run("scancel", "--batch", "--signal=USR1", str(job))
    )
    events = report["events"]
    assert any("steady: draining" in e for e in events), events
    assert any(
        "steady: taken out (drained before its announced end); 0 in-flight requests re-queued" in e for e in events
    ), events
    assert report["requeued"] == 0 and report["retries"] == 0
    steady = {s["name"]: s for s in report["servers"]}["steady"]
    assert steady["restarts"] == 1 and steady["state"] == "up"
    assert (await fleet.record("steady")).pgid != job
    await fleet.down()
    assert our_jobs(slurm) == []


@pytest.mark.slow
async def test_generate_survives_a_time_limit(slurm: SlurmCluster, tmp_path: Path, fleets) -> None:
    """A server whose job hits its time limit mid-job (1 minute, Slurm's smallest; the controller
    enforces limits every 30 s, so it ends 60-90 s after it started: this test takes ~100 s)."""
    slow = [
        "--max-running",
        "4",
        "--decode-ms",
        "60",
        "--decode-ms-per-running",
        "0",
        "--prefill-ms-per-1k-tokens",
        "0",
    ]
    fleet = fleets(Fleet.load(_two_host_fleet(slurm, tmp_path, slow)))
    assert all(v.state == State.READY for v in (await fleet.up()).values())
    job = (await fleet.record("short")).pgid
    report = await _generate(fleet.spec.path, tmp_path, 900)  # ~105 s at ~8.5 answers/s
    short = {s["name"]: s for s in report["servers"]}["short"]
    assert short["restarts"] >= 1 and short["state"] == "up", report["events"]
    assert {j.split()[0]: j.split()[1] for j in slurm.jobs()}[str(job)] == "TIMEOUT"
    await fleet.down()
    assert our_jobs(slurm) == []
