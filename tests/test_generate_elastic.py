"""The elastic job (generate/membership.py) on local simulated servers: a server started by another
terminal's `up --only` joins a running `generate --fleet`; a dead member of a counted template is
replaced and joins; --release-tail stops the servers the tail would leave idle and --down-after
the rest, leaving no process; every prompt answered exactly once throughout. Bad input (a count
below 1, --release-tail / --down-after with --url servers) is refused with the key or option
named (exit 3) before anything starts. The Slurm side: tests/test_slurm_elastic.py."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from conftest import PYTHON, free_port, wait_until
from servefleet.errors import ConfigError
from servefleet.fleet import Fleet
from servefleet.fleet.loader import load_fleet_file
from servefleet.generate.handover import due, margin_problem, successor_name
from servefleet.generate.membership import ReplaceBudget, idle_at_tail, plan_round
from test_generate_sim import FAST_SIM, committed_ids, generate_argv, shard_count, write_prompts

SERVEFLEET = [PYTHON, "-m", "servefleet.cli.main"]


def fleet_file(tmp_path: Path, servers: dict[str, tuple[list[str], int | None]]) -> Path:
    """``servers``: name -> (extra sim args, count or None)."""
    path = tmp_path / "fleet.toml"
    text = '[fleet]\nname = "el"\ntimeout = 60\nstall = 30\n'
    for name, (args, count) in servers.items():
        port = free_port() if count is None else _free_run(count)
        text += (
            f'\n[[servers]]\nname = "{name}"\nengine = "sim"\nmodel = "sim-7b"\nport = {port}\n'
            + (f"count = {count}\n" if count is not None else "")
            + f"args = {json.dumps([*FAST_SIM, '--max-running', '8', *args])}\n"
        )
    path.write_text(text)
    return path


def _free_run(n: int) -> int:
    """A first port whose next ``n - 1`` are free too (a counted template's ports)."""
    for _ in range(50):
        first = free_port()
        if all(_free(first + i) for i in range(1, n)):
            return first
    raise AssertionError("no run of free ports")


def _free(port: int) -> bool:
    import socket

    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([*SERVEFLEET, *args], capture_output=True, text=True, timeout=timeout)


def statuses(fleet: Path) -> dict[str, dict]:
    async def ask() -> dict[str, dict]:
        async with Fleet.load(fleet) as f:
            return {s.name: s.to_json() for s in await f.status()}

    return asyncio.run(ask())


@pytest.fixture
def downs():
    started: list[Path] = []
    yield started.append
    for path in started:
        cli("down", "--fleet", str(path))


def start_job(tmp_path: Path, fleet: Path, n: int, *extra: str) -> tuple[subprocess.Popen, Path]:
    src = write_prompts(tmp_path / "in.jsonl", n)
    out = tmp_path / "out"
    argv = generate_argv(
        src,
        out,
        "--fleet",
        str(fleet),
        extra=(
            "--concurrency",
            "4",
            "--shard-rows",
            "20",
            "--shard-seconds",
            "0.3",
            "--watch-interval",
            "0.2",
            *extra,
        ),
    )
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_until(lambda: shard_count(out) >= 1 or proc.poll() is not None, timeout=60, what="the job's first shard")
    assert proc.poll() is None, proc.communicate()
    return proc, out


def finish(proc: subprocess.Popen) -> tuple[int, dict, str]:
    stdout, stderr = proc.communicate(timeout=180)
    try:
        return proc.returncode, json.loads(stdout), stderr
    except ValueError:
        raise AssertionError(f"no JSON report (rc {proc.returncode}):\n{stdout[-2000:]}\n{stderr[-3000:]}") from None


SLOW = ["--decode-ms", "30"]  # 200 prompts of 4 tokens at concurrency 4: ~6 s on one server


# ---- the pure decisions --------------------------------------------------------------------------


def test_a_round_verifies_ready_strangers_and_replaces_only_dead_members_of_a_count() -> None:
    states = {
        "w-0": "ready",
        "w-1": "dead",
        "w-2": "loading",
        "w-3": "not launched",
        "solo": "dead",
        "held": "ready",
        "mine": "ready",
    }
    plan = plan_round(states, known={"mine"}, held={"held"}, counted={"w-0", "w-1", "w-2", "w-3"})
    assert plan.verify == ("w-0",)  # "mine" is in the job already, "held" was stopped by the user
    assert plan.replace == ("w-1", "w-3")  # "solo" is no template's: a dead one is left alone; a loading one waits


def test_the_tail_releases_idle_servers_only_once_nothing_waits() -> None:
    assert idle_at_tail(None, {"a": 0, "b": 3}) == []  # the input is still being read
    assert idle_at_tail(2, {"a": 0, "b": 3}) == []  # prompts (or retries) wait for a server
    assert idle_at_tail(0, {"a": 0, "b": 3, "c": 0}) == ["a", "c"]
    # the last answer is in: the job ends now, nothing is released (CI saw "slow" released here)
    assert idle_at_tail(0, {"a": 0, "slow": 0}) == []


def test_replacements_are_limited_in_a_sliding_window() -> None:
    budget = ReplaceBudget(max_restarts=2, window_s=10.0)
    assert budget.take("w-0", 0.0) and budget.take("w-0", 1.0)
    assert not budget.take("w-0", 5.0)  # a crash loop
    assert budget.take("w-1", 5.0)  # per server
    assert budget.take("w-0", 10.5)  # the first one left the window


def test_a_handover_is_due_once_less_time_is_left_than_the_load_time_and_the_margin() -> None:
    assert not due(None, 30.0, 60.0)  # no time limit (or not running): left alone
    assert not due(100.0, 30.0, 60.0) and due(89.0, 30.0, 60.0)
    assert due(59.0, None, 60.0)  # never measured: the margin alone
    assert not due(
        10.0, 30.0, 60.0, limit_s=90.0
    )  # a whole limit within load time + margin: one handover after another
    assert [successor_name(n) for n in ("w-3", "w-3.h1", "w-3.h9", "a.b")] == ["w-3.h1", "w-3.h2", "w-3.h10", "a.b.h1"]


# ---- bad input -----------------------------------------------------------------------------------


def test_a_counted_template_stands_for_its_servers(tmp_path: Path) -> None:
    path = fleet_file(tmp_path, {"w": ([], 3), "solo": ([], None)})
    spec = load_fleet_file(path)
    assert spec.names == ["w-0", "w-1", "w-2", "solo"]
    ports = [spec.server(f"w-{i}").port for i in range(3)]
    assert ports == [ports[0], ports[0] + 1, ports[0] + 2]
    assert spec.counted == ["w-0", "w-1", "w-2"]


@pytest.mark.parametrize(
    ("count", "message"),
    [
        ("0", "count: must be at least 1, got 0"),
        ("-2", "count: must be at least 1, got -2"),
        ('"4"', "count: must be a whole number of servers, got '4'"),
    ],
)
def test_a_bad_count_is_refused_before_anything_starts(tmp_path: Path, count: str, message: str) -> None:
    path = fleet_file(tmp_path, {"w": ([], 2)})
    path.write_text(path.read_text().replace("count = 2", f"count = {count}"))
    with pytest.raises(ConfigError, match="servers"):
        load_fleet_file(path)
    proc = cli("up", str(path))
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert f'servers[0] "w": {message}' in proc.stderr, proc.stderr
    assert not (tmp_path / ".servefleet").exists()  # nothing started, not even a state folder


def test_a_template_field_written_in_the_file_is_refused(tmp_path: Path) -> None:
    path = fleet_file(tmp_path, {"w": ([], None)})
    path.write_text(path.read_text().replace('name = "w"', 'name = "w"\ntemplate = "x"'))
    with pytest.raises(ConfigError, match=r'servers\[0\] "w": template: unknown field'):
        load_fleet_file(path)


def test_a_handover_margin_not_shorter_than_a_time_limit_is_refused_before_anything_is_submitted(
    tmp_path: Path,
) -> None:
    path = tmp_path / "fleet.toml"
    path.write_text(
        f'[hosts.minute]\nkind = "slurm"\nworkdir = "{tmp_path}"\ntime = "1"\n\n'
        '[[servers]]\nname = "w"\ncount = 2\nengine = "sim"\nmodel = "m"\nhost = "minute"\nport = 30000\n'
    )
    hosts = load_fleet_file(path).hosts.values()
    assert margin_problem(59.0, hosts) is None
    assert "--handover-margin 60s is not shorter than the time limit of [hosts.minute] (time = '1': 60s)" in (
        margin_problem(60.0, hosts) or ""
    )
    src = write_prompts(tmp_path / "in.jsonl", 3)
    for margin, message in (
        ("2m", "--handover-margin 120s is not shorter than the time limit of [hosts.minute]"),
        ("soon", "--handover-margin 'soon': expected a duration above 0"),
    ):
        proc = subprocess.run(
            generate_argv(src, tmp_path / "out", "--fleet", str(path), extra=("--handover-margin", margin)),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 3 and message in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    assert (
        not (tmp_path / "out").exists() and not (tmp_path / ".servefleet").exists()
    )  # nothing read, nothing submitted


@pytest.mark.parametrize("flag", ["--release-tail", "--down-after", "--handover-margin"])
def test_stopping_flags_are_refused_for_url_servers(tmp_path: Path, flag: str) -> None:
    src = write_prompts(tmp_path / "in.jsonl", 3)
    proc = subprocess.run(
        generate_argv(
            src,
            tmp_path / "out",
            "--url",
            "http://127.0.0.1:9",
            extra=(flag, "1m") if flag == "--handover-margin" else (flag,),
        ),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert f"{flag}: only servers of a --fleet can be stopped" in proc.stdout + proc.stderr
    assert not (tmp_path / "out").exists()  # refused before anything was read or written


# ---- servers joining, replaced, released ---------------------------------------------------------


def test_a_server_started_by_another_terminal_joins_the_running_job(tmp_path: Path, downs) -> None:
    fleet = fleet_file(tmp_path, {"a": (SLOW, None), "b": (SLOW, None)})
    downs(fleet)
    up = cli("up", str(fleet), "--only", "a")
    assert up.returncode == 0, up.stdout + up.stderr
    proc, out = start_job(tmp_path, fleet, 200)
    up = cli("up", str(fleet), "--only", "b")  # another process, while the job runs
    assert up.returncode == 0, up.stdout + up.stderr
    rc, report, err = finish(proc)
    assert rc == 0 and report["status"] == "complete", err[-3000:]
    servers = {s["name"]: s for s in report["servers"]}
    assert servers["b"]["requests"] > 0 and servers["b"]["state"] == "up", report["events"]
    assert servers["a"]["requests"] + servers["b"]["requests"] == 200
    assert report["membership"]["joins"] == 1, report["membership"]
    assert any("s b: joined at http://127.0.0.1:" in e for e in report["events"]), report["events"]
    ids = committed_ids(out)
    assert sorted(ids) == sorted(f"p{i}" for i in range(200))  # exactly once


def test_a_dead_member_of_a_count_is_replaced_and_joins(tmp_path: Path, downs) -> None:
    fleet = fleet_file(tmp_path, {"w": (SLOW, 2)})
    downs(fleet)
    up = cli("up", str(fleet))
    assert up.returncode == 0, up.stdout + up.stderr
    record = json.loads((tmp_path / ".servefleet" / "el" / "w-1.json").read_text())
    os.killpg(record["pgid"], signal.SIGKILL)
    wait_until(lambda: statuses(fleet)["w-1"]["state"] == "dead", timeout=30, what="w-1 dead")
    proc, out = start_job(tmp_path, fleet, 200)
    rc, report, err = finish(proc)
    assert rc == 0 and report["status"] == "complete", err[-3000:]
    servers = {s["name"]: s for s in report["servers"]}
    assert servers["w-1"]["requests"] > 0, report["events"]  # the replacement served
    assert report["membership"]["replacements"] == 1 and report["membership"]["joins"] == 1, report["membership"]
    assert any("w-1: replaced (" in e for e in report["events"]), report["events"]
    assert sorted(committed_ids(out)) == sorted(f"p{i}" for i in range(200))
    assert json.loads((tmp_path / ".servefleet" / "el" / "w-1.json").read_text())["pgid"] != record["pgid"]


def test_release_tail_and_down_after_leave_no_server_running(tmp_path: Path, downs) -> None:
    """ "slow" answers a request in ~2 s, "a" and "b" in ~20 ms: at the tail they would wait idle for
    "slow"'s last requests; they are released, and --down-after stops the rest once complete. (A tail
    longer than the timeline's 1 s sampling, so the report can tell what the release gave back.)"""
    fleet = fleet_file(
        tmp_path,
        {"a": (["--decode-ms", "5"], None), "b": (["--decode-ms", "5"], None), "slow": (["--decode-ms", "500"], None)},
    )
    downs(fleet)
    up = cli("up", str(fleet))
    assert up.returncode == 0, up.stdout + up.stderr
    pgids = {
        n: json.loads((tmp_path / ".servefleet" / "el" / f"{n}.json").read_text())["pgid"] for n in ("a", "b", "slow")
    }
    proc, out = start_job(tmp_path, fleet, 400, "--release-tail", "--down-after")
    rc, report, err = finish(proc)
    assert rc == 0 and report["status"] == "complete", err[-3000:]
    released = [e for e in report["events"] if ": released at the tail (--release-tail)" in e]
    assert released and report["membership"]["releases"] == len(released), report["events"]
    assert "slow" not in " ".join(released)  # the one still working is not released
    assert "--down-after: the fleet is stopped" in (report["message"] or "")
    shown = cli("report", str(out), "--json")  # the report shows what the release gave back
    assert shown.returncode == 0, shown.stdout + shown.stderr
    tail = json.loads(shown.stdout)["tail"]
    assert tail["released"] == len(released) and tail["released_server_s"] > 0, tail
    assert tail["per_server"]["slow"]["released_s"] == 0 and tail["job_s"] == pytest.approx(
        report["wall_s"], abs=2.0
    ), tail
    assert 'id="tail"' in (out / "report.html").read_text()
    assert sorted(committed_ids(out)) == sorted(f"p{i}" for i in range(400))
    assert {n: s["state"] for n, s in statuses(fleet).items()} == {
        "a": "not launched",
        "b": "not launched",
        "slow": "not launched",
    }
    from servefleet.hosts.local import LocalHost

    assert not [
        n for n, pgid in pgids.items() if asyncio.run(LocalHost().group_alive(pgid))
    ]  # no process left (zombies aside)


# ---- what the job shows of it: progress, Prometheus, the report's timeline ----------------------


def test_the_timeline_counts_servers_in_service_and_marks_a_join() -> None:
    from servefleet.generate.stats import JobStats, ServerStats
    from servefleet.generate.timeline import Timeline

    stats = JobStats()
    stats.servers["a"] = ServerStats("a", "http://a", limit=4)
    tl = Timeline(started=0.0)
    tl.sample(0.5, stats)
    stats.servers["b"] = ServerStats("b", "http://b", limit=4)  # joined
    tl.sample(1.5, stats)
    stats.servers["a"].state = "stopped"  # released
    tl.sample(2.5, stats)
    out = tl.to_json()
    assert out["serving"] == [1, 2, 1]
    assert [(e["kind"], e["server"]) for e in out["events"]["items"]] == [("join", "b"), ("outage", "a")]
    from servefleet.cli.report_html import job_html
    from servefleet.generate.job_record import JobRecord, job_series

    record = JobRecord(destination="x", manifest={}, timelines=[{**out, "updated_unix": 3.0, "run_id": "r"}])
    series = job_series(record)
    assert series["job"]["serving"] == [1, 2, 1]
    page = job_html(series, {}, plan=None, plan_note=None, failures={}, manifest={})
    assert "Servers in service" in page and "join b" in page


def test_prometheus_and_progress_show_the_membership() -> None:
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    from servefleet.cli.generate_view import membership_text
    from servefleet.generate.metrics import JobMetrics
    from servefleet.generate.recorder import snapshot
    from servefleet.generate.stats import JobStats

    stats = JobStats(total=10)
    stats.width = 3
    stats.membership.update(joins=2, leaves=1, replacements=1, releases=0)
    with JobMetrics("127.0.0.1", 0) as metrics:
        metrics.attach(stats)
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics.port}/metrics", timeout=5) as resp:
            text = resp.read().decode()
    values = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }
    assert values[("servefleet_generate_servers_in_service", ())] == 3
    assert values[("servefleet_generate_membership_total", (("event", "joins"),))] == 2
    assert values[("servefleet_generate_membership_total", (("event", "replacements"),))] == 1
    snap = snapshot(stats, run_id="r", status="running", now=1.0, started=0.0, interval_s=2.0)
    assert snap["membership"] == {"joins": 2, "leaves": 1, "replacements": 1, "releases": 0} and snap["width"] == 3
    assert membership_text(3, snap["membership"]) == "3 in service, joins 2, leaves 1, replacements 1, releases 0"


async def test_a_round_that_fails_is_an_event_and_the_rounds_go_on() -> None:
    """A host failing mid-round (sbatch, SSH) must not end the job: before, the exception reached the
    dispatcher's background task handler and failed the whole run."""
    from types import SimpleNamespace

    from servefleet.generate.membership import ElasticRestarter
    from servefleet.generate.stats import JobStats

    starts = []

    class BrokenFleet:
        spec = SimpleNamespace(counted=[], names=["x"])
        store = SimpleNamespace(stop_mark=lambda name: None)

        async def status(self, names):
            return [SimpleNamespace(name="x", state="ready", detail=None)]

        async def start(self, names, honour_stops=False):
            starts.append(names)
            raise OSError("sbatch: connection refused")

    stats = JobStats()
    dispatcher = SimpleNamespace(stats=stats, known=set, in_service=dict, backlog=lambda: None)
    watch = asyncio.ensure_future(ElasticRestarter(BrokenFleet(), interval_s=0.01).watch(dispatcher))
    try:
        async with asyncio.timeout(10):
            while len(starts) < 3:
                await asyncio.sleep(0.01)
        assert not watch.done()
        assert any(
            "this round's joins, replacements or handovers failed (OSError: sbatch: connection refused)" in e
            for e in stats.events
        )
    finally:
        watch.cancel()
