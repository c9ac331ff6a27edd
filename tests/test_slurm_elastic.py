"""The elastic job against the real one-node Slurm (tests/slurm_rig.py), simulated engines in the
jobs: a counted template's jobs that leave PENDING while `generate --fleet` runs join it; a job
scancelled mid-job is replaced because of the count; --release-tail and --down-after leave no job;
every prompt answered exactly once. Needs Slurm (scripts/ci-slurm-setup.sh); runs on the session's
cluster (conftest.py `slurm`), as test_slurm_fleet."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from conftest import PYTHON, async_wait_until
from servefleet.fleet.core import Fleet
from slurm_rig import SlurmCluster
from test_slurm_fleet import _committed, _prompts

pytestmark = pytest.mark.filterwarnings("ignore::ResourceWarning")


SIM = [
    "--load-time",
    "0.3",
    "--max-running",
    "4",
    "--decode-ms",
    "20",
    "--decode-ms-per-running",
    "0",
    "--prefill-ms-per-1k-tokens",
    "0",
]


def counted_fleet(
    tmp_path: Path, cluster: SlurmCluster, count: int, *, host_extra: str = "", time: str = "10"
) -> Path:
    args = ", ".join(f'"{a}"' for a in SIM)
    path = tmp_path / "fleet.toml"
    path.write_text(
        f'[fleet]\nname = "el"\ntimeout = 60\nstall = 20\n\n'
        f'[hosts.cluster]\nkind = "slurm"\nworkdir = "{tmp_path / "shared"}"\npoll_interval = 0.2\ntime = "{time}"\n'
        f'env = {{ SLURM_CONF = "{cluster.conf}" }}\n{host_extra}\n'
        f'[[servers]]\nname = "w"\ncount = {count}\nengine = "sim"\nmodel = "sim-m"\nhost = "cluster"\nport = 31200\nargs = [{args}]\n'
    )
    return path


def our_jobs(cluster: SlurmCluster) -> list[str]:
    return [j for j in cluster.live_jobs() if "servefleet-el-" in j]


async def start_generate(tmp_path: Path, fleet: Path, n: int, *extra: str) -> tuple[asyncio.subprocess.Process, Path]:
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
        str(fleet),
        "--max-tokens",
        "4",
        "--concurrency",
        "4",
        "--shard-rows",
        "50",
        "--watch-interval",
        "0.3",
        "--json",
        *extra,
    ]
    proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)

    async def sending() -> bool:
        assert proc.returncode is None, await proc.communicate()
        return (out / "shards").is_dir() and bool(list((out / "shards").glob("part-*")))

    try:
        await async_wait_until(sending, timeout=60, interval=0.05, what="the job's first shard")
    except AssertionError:
        proc.kill()
        _, stderr = await proc.communicate()
        raise AssertionError(f"no shard within 60 s; the job said:\n{stderr.decode()[-3000:]}") from None
    return proc, out


async def finish(proc: asyncio.subprocess.Process) -> dict:
    stdout, stderr = await asyncio.wait_for(proc.communicate(), 240)
    assert proc.returncode == 0, stderr.decode()[-3000:]
    report = json.loads(stdout)
    assert report["status"] == "complete", report
    return report


def joined(out: Path) -> int:
    progress = out / "progress.json"
    return json.loads(progress.read_text()).get("membership", {}).get("joins", 0) if progress.is_file() else 0


async def test_pending_jobs_join_the_running_job_when_they_start(slurm: SlurmCluster, tmp_path: Path, fleets) -> None:
    """Three jobs of 5 CPUs on a 16-CPU node where two other jobs hold 11: one runs, two wait
    PENDING (Resources). Each hold ended in turn lets one more run; both join; exactly once."""
    slurm.wait_idle()  # the session's cluster: an earlier test's job may still be completing
    hogs = [
        slurm.run(
            "sbatch",
            "--parsable",
            f"--cpus-per-task={c}",
            "--job-name=cpu-hog",
            "--output=/dev/null",
            "--wrap",
            "sleep 300",
        ).stdout.strip()
        for c in (6, 5)
    ]
    try:
        fleet = fleets(Fleet.load(counted_fleet(tmp_path, slurm, 3, host_extra="cpus = 5\n")))
        await fleet.start()

        async def one_ready() -> bool:
            return len(await fleet.ready_endpoints()) == 1

        await async_wait_until(one_ready, timeout=60, interval=0.2, what="one server ready")
        states = sorted(j.split()[1] for j in our_jobs(slurm))
        assert states == ["PENDING", "PENDING", "RUNNING"], states
        proc, out = await start_generate(tmp_path, fleet.spec.path, 900)
        for hog, joins in zip(hogs[::-1], (1, 2), strict=True):
            slurm.run("scancel", hog)

            async def in_the_job(joins: int = joins) -> bool:
                return joined(out) >= joins or proc.returncode is not None

            await async_wait_until(in_the_job, timeout=60, interval=0.1, what=f"join {joins}")
        report = await finish(proc)
        assert report["membership"]["joins"] == 2, report["events"]
        servers = {s["name"]: s for s in report["servers"]}
        assert sorted(servers) == ["w-0", "w-1", "w-2"] and all(s["requests"] > 0 for s in servers.values()), report[
            "servers"
        ]
        assert sorted(_committed(out)) == sorted(f"p{i}" for i in range(900))  # exactly once
        await fleet.down()
        assert our_jobs(slurm) == []
    finally:
        for hog in hogs:
            slurm.run("scancel", hog, check=False)


async def test_a_cancelled_job_is_replaced_and_release_tail_with_down_after_leave_no_job(
    slurm: SlurmCluster, tmp_path: Path, fleets
) -> None:
    fleet = fleets(Fleet.load(counted_fleet(tmp_path, slurm, 2)))
    assert all(v.state == "ready" for v in (await fleet.up()).values())
    job = (await fleet.record("w-0")).pgid
    proc, out = await start_generate(tmp_path, fleet.spec.path, 600, "--release-tail", "--down-after")
    slurm.run("scancel", str(job))
    report = await finish(proc)
    assert report["membership"]["replacements"] >= 1, report["events"]
    assert any("w-0: back in service" in e for e in report["events"]), report["events"]
    states = {j.split()[0]: j.split()[1] for j in slurm.jobs()}
    assert states[str(job)] == "CANCELLED"
    assert sum(1 for j in slurm.jobs() if "servefleet-el-w-0" in j) >= 2  # a new job was submitted for it
    assert sorted(_committed(out)) == sorted(f"p{i}" for i in range(600))  # exactly once
    assert "--down-after: the fleet is stopped" in (report["message"] or "")
    assert our_jobs(slurm) == []  # none pending, running or completing


async def test_a_server_near_its_time_limit_hands_over_to_a_successor_that_serves_first(
    slurm: SlurmCluster, tmp_path: Path, fleets
) -> None:
    """A 1-minute job (Slurm's smallest limit) and a 50 s margin: a successor is submitted within
    seconds of the start, joins, and only then is the old job drained and cancelled (and so on: each
    successor is due ~7 s after it starts). Servers in service, sampled each second, never drop to 0."""
    fleet = fleets(Fleet.load(counted_fleet(tmp_path, slurm, 1, time="1")))
    path = fleet.spec.path
    assert all(v.state == "ready" for v in (await fleet.up()).values())
    old_job = (await fleet.record("w-0")).pgid
    proc, out = await start_generate(tmp_path, path, 400, "--handover-margin", "50s", "--down-after")
    report = await finish(proc)
    events = report["events"]
    assert report["membership"]["handovers"] >= 1, events
    for old, new in (("w-0", "w-0.h1"), ("w-0.h1", "w-0.h2")):
        drained = [
            i
            for i, e in enumerate(events)
            if f"{old}: handed over to {new} (its job's time limit is near): draining" in e
        ]
        if old == "w-0" or drained:
            joined = next(i for i, e in enumerate(events) if f"{new}: joined at" in e)
            assert joined < drained[0], events  # the successor served before the old one stopped taking requests
    servers = {s["name"]: s for s in report["servers"]}
    assert servers["w-0.h1"]["requests"] > 0 and servers["w-0"]["state"] == "stopped", report["servers"]
    states = {j.split()[0]: j.split()[1] for j in slurm.jobs()}
    assert states[str(old_job)] == "CANCELLED"  # handed over, not timed out
    timeline = json.loads(next((out / "timeline").glob("*.json")).read_text())
    serving = timeline["serving"]
    assert min(serving[1:-1]) >= 1, serving  # never without a server
    assert sorted(_committed(out)) == sorted(f"p{i}" for i in range(400))  # exactly once
    assert our_jobs(slurm) == []
