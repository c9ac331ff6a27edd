"""The fleet lifecycle with real detached processes (simulated engine): up, adopt, status from
another process, down, port conflicts, failures, crashes and restart."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import aiohttp
import psutil
import pytest
from typer.testing import CliRunner

from conftest import async_wait_until, free_port, wait_until
from servefleet.catalog import Category, State
from servefleet.cli.main import app
from servefleet.fleet import Action, Fleet, Liveness, StopResult

SECRET = "hf_SuperSecretValue123"


def group_members(pgid: int) -> list[psutil.Process]:
    """Live (non-zombie) processes of a process group."""
    found = []
    for proc in psutil.process_iter(["pid", "status"]):
        try:
            if proc.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(proc.info["pid"]) == pgid:
                found.append(proc)
        except (ProcessLookupError, psutil.Error):
            continue
    return found


def port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def write_fleet(
    tmp_path: Path, servers: dict[str, list[str]], *, timeout: float = 30, stall: float = 15
) -> tuple[Path, dict[str, int]]:
    """A fleet file of sim servers: name -> extra sim args. Returns the path and the ports."""
    ports = {name: free_port() for name in servers}
    parts = [
        f'[fleet]\nname = "t"\ntimeout = {timeout}\nstall = {stall}\n',
        f'[defaults]\nengine = "sim"\nmodel = "sim-m"\nargs = ["--load-time", "0.3"]\nenv = {{ HF_TOKEN = "{SECRET}" }}\n',
    ]
    for name, args in servers.items():
        parts.append(f'[[servers]]\nname = "{name}"\nport = {ports[name]}\nargs = {json.dumps(args)}\n')
    path = tmp_path / "fleet.toml"
    path.write_text("\n".join(parts))
    return path, ports


def cli(*args: str, cwd: Path | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """The real CLI in a new process (no state shared with the test)."""
    return subprocess.run(
        [sys.executable, "-m", "servefleet.cli.main", *args], capture_output=True, text=True, cwd=cwd, timeout=timeout
    )


@pytest.fixture
async def cleanup():
    """Stop every fleet a test brought up, whatever happened."""
    fleets: list[Fleet] = []
    yield fleets.append
    for fleet in fleets:
        await fleet.down(grace_s=2)
        await fleet.close()


async def test_up_adopt_status_down(tmp_path: Path, cleanup) -> None:
    path, ports = write_fleet(tmp_path, {"a": [], "b": ["--style", "vllm"]})
    fleet = Fleet.load(path)
    cleanup(fleet)

    verdicts = await fleet.up(smoke=True)
    assert {n: v.state for n, v in verdicts.items()} == {"a": State.READY, "b": State.READY}, verdicts
    assert verdicts["a"].capacity.max_running_requests  # capacity read from the server

    state_dir = tmp_path / ".servefleet" / "t"
    records = {n: fleet.store.load(n) for n in ("a", "b")}
    for name, record in records.items():
        file = state_dir / f"{name}.json"
        assert stat.S_IMODE(file.stat().st_mode) == 0o600
        assert record.port == ports[name] and record.pgid > 0 and record.engine == "sim"
        assert record.last_verdict["state"] == "ready" and record.ready_at is not None
        assert record.env["HF_TOKEN"] == "***"
        assert group_members(record.pgid)
        log = Path(record.log_path).read_bytes()
        assert log.count(b"==== servefleet launch ") == 1
        assert log[: record.log_offset].endswith(b"====\n")  # this attempt starts after its marker
    for file in state_dir.rglob("*"):  # secrets never reach any state file
        if file.is_file() and file.suffix in (".json", ".status"):
            assert SECRET not in file.read_text()

    # up again, from a fresh Fleet object: adopted, not relaunched
    again = Fleet.load(path)
    cleanup(again)
    outcomes = await again.start()
    assert {n: o.action for n, o in outcomes.items()} == {"a": Action.ADOPTED, "b": Action.ADOPTED}
    assert {n: o.record.pgid for n, o in outcomes.items()} == {n: r.pgid for n, r in records.items()}
    assert all(v.state == State.READY for v in (await again.wait(outcomes, smoke=False)).values())
    assert Path(records["a"].log_path).read_bytes().count(b"==== servefleet launch ") == 1

    # a second process (the real CLI) sees the same fleet, from the fleet file's folder
    res = cli("status", "--json", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    seen = {s["name"]: s for s in json.loads(res.stdout)["servers"]}
    assert {n: (s["state"], s["pid"]) for n, s in seen.items()} == {n: ("ready", r.pgid) for n, r in records.items()}
    assert seen["a"]["capacity"]["max_running_requests"] >= 1

    endpoints = await fleet.ready_endpoints()
    assert {e.name: e.base_url for e in endpoints} == {n: f"http://127.0.0.1:{p}" for n, p in ports.items()}
    assert all(e.served_model == "sim-m" for e in endpoints)

    # down: nothing of either group is left, the ports are free, the records are gone
    results = await Fleet.load(path).down(grace_s=5)
    assert all(r.was_running and r.port_free and r.ok and r.signal == "SIGTERM" for r in results.values()), results
    for name, record in records.items():
        assert group_members(record.pgid) == []
        assert port_free(ports[name])
        assert fleet.store.load(name) is None
    statuses = {s.name: s.state for s in await fleet.status()}
    assert statuses == {"a": Liveness.NOT_LAUNCHED, "b": Liveness.NOT_LAUNCHED}


async def test_port_held_by_another_process_is_reported_before_launch(tmp_path: Path, cleanup) -> None:
    path, ports = write_fleet(tmp_path, {"a": []})
    holder = socket.socket()
    holder.bind(("127.0.0.1", ports["a"]))
    holder.listen()
    try:
        fleet = Fleet.load(path)
        cleanup(fleet)
        verdicts = await fleet.up()
        outcome_record = fleet.store.load("a")
    finally:
        holder.close()
    verdict = verdicts["a"]
    assert verdict.state == State.FAILED and verdict.category == Category.PORT_IN_USE
    assert f"pid {os.getpid()}" in verdict.message and "nothing was launched" in verdict.message
    assert outcome_record is None  # nothing launched, nothing recorded
    assert not (tmp_path / ".servefleet" / "t" / "logs" / "a.log").exists()


async def test_startup_failure_gives_category_and_dead_status(tmp_path: Path, cleanup) -> None:
    path, _ = write_fleet(tmp_path, {"oom": ["--fail-at-startup", "gpu_oom"]})
    fleet = Fleet.load(path)
    cleanup(fleet)
    verdict = (await fleet.up())["oom"]
    assert verdict.state == State.FAILED and verdict.category == Category.GPU_OOM
    assert verdict.evidence is not None and verdict.hint
    record = fleet.store.load("oom")
    assert record.last_verdict["category"] == "gpu_oom"
    # the evidence line number counts from the top of the (appended) log file
    lines = Path(record.log_path).read_text().splitlines()
    assert lines[verdict.evidence.line_no - 1].strip().endswith(verdict.evidence.text.strip()[-40:])

    # the verdict comes with the fatal line; the process may take a moment more to exit
    async def exited() -> bool:
        return not await fleet.binding("local").host.group_alive(record.pgid)

    await async_wait_until(exited, timeout=30, what="the failed server to exit")
    (status,) = await fleet.status()
    assert status.state == Liveness.DEAD and status.exit_code not in (None, 0)
    assert status.category == "gpu_oom"


async def test_crash_after_ready_shows_dead_then_restart_brings_it_back(tmp_path: Path, cleanup) -> None:
    path, ports = write_fleet(tmp_path, {"c": ["--crash-after", "1"]})
    fleet = Fleet.load(path)
    cleanup(fleet)
    assert (await fleet.up(smoke=False))["c"].state == State.READY
    first = fleet.store.load("c")
    async with aiohttp.ClientSession() as session:
        body = {"model": "sim-m", "prompt": "hi", "max_tokens": 2}
        async with session.post(f"http://127.0.0.1:{ports['c']}/v1/completions", json=body) as resp:
            await resp.read()

    async def gone() -> bool:
        return not await fleet.binding("local").host.group_alive(first.pgid)

    await async_wait_until(gone, timeout=30, what="the server to crash after its first request")
    (status,) = await fleet.status()
    assert status.state == Liveness.DEAD
    assert status.exit_code is not None or "killed" in (status.detail or "")

    verdict = await fleet.restart("c", smoke=False)
    assert verdict.state == State.READY
    second = fleet.store.load("c")
    assert second.pgid != first.pgid and second.log_offset > first.log_offset
    assert Path(second.log_path).read_bytes().count(b"==== servefleet launch ") == 2
    (status,) = await fleet.status()
    assert status.state == Liveness.READY


def test_a_server_that_cannot_be_stopped_is_not_started_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """restart refuses to start a second copy next to an old process it could not stop (the two would
    fight for the port and the GPU): ``Fleet.restart`` says so in its verdict, and ``servefleet
    restart`` -- the same library code, ``Fleet.relaunch`` -- exits 1 with the same words."""
    path, _ = write_fleet(tmp_path, {"a": []})
    stuck = StopResult(
        "a",
        was_running=True,
        signal="SIGKILL",
        port_free=False,
        port_holder_pid=4242,
        message="port 1 still held by pid 4242",
    )
    relaunched = []
    relaunch = Fleet.relaunch

    async def down(self, names=None, *, grace_s=15.0):
        return {"a": stuck}

    async def start(self, names=None):
        raise AssertionError("started although the old process could not be stopped")

    async def spy(self, name, **kwargs):
        relaunched.append(name)
        return await relaunch(self, name, **kwargs)

    monkeypatch.setattr(Fleet, "down", down)
    monkeypatch.setattr(Fleet, "start", start)
    monkeypatch.setattr(Fleet, "relaunch", spy)
    verdict = asyncio.run(Fleet.load(path).restart("a"))
    assert verdict.state == State.FAILED and verdict.message == "could not stop a: port 1 still held by pid 4242"
    code, out, err = run_cli("restart", "a", "--fleet", str(path))
    assert code == 1 and "could not stop a: port 1 still held by pid 4242" in " ".join(err.split()), out + err
    assert relaunched == ["a", "a"]


async def test_down_never_signals_a_reused_pgid(tmp_path: Path) -> None:
    """A record whose pgid now belongs to an unrelated process must not kill that process."""
    path, _ = write_fleet(tmp_path, {"a": []})
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        fleet = Fleet.load(path)
        from servefleet.fleet.state import ServerState, utcnow

        fleet.store.save(
            ServerState(
                fleet="t",
                name="a",
                engine="sim",
                host="local",
                port=free_port(),
                pgid=stranger.pid,
                argv=["x"],
                log_path=str(tmp_path / "a.log"),
                status_path=str(tmp_path / "a.status"),
                launched_at=utcnow(),
                spec_hash="x",
            )
        )
        (status,) = await fleet.status()
        assert status.state == Liveness.STALE
        result = (await fleet.down(grace_s=1))["a"]
        assert not result.was_running and "stale record" in result.message
        assert stranger.poll() is None  # still alive
        assert fleet.store.load("a") is None
    finally:
        stranger.kill()
        stranger.wait()


def run_cli(*args: str) -> tuple[int, str, str]:
    """The CLI in this process (faster than a subprocess; the status test uses a real one)."""
    runner = CliRunner()
    res = runner.invoke(app, list(args))
    return res.exit_code, res.stdout, res.stderr


def test_cli_up_failure_status_logs_down_and_config_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path, ports = write_fleet(tmp_path, {"bad": ["--fail-at-startup", "model_not_found"]})
    monkeypatch.chdir(tmp_path)  # commands below find the fleet through ./.servefleet
    try:
        code, out, err = run_cli("up", str(path))
        assert code == 1, out + err
        assert "failed (model_not_found)" in out and "hint:" in out and str(tmp_path / ".servefleet") in out
        pgid = json.loads((tmp_path / ".servefleet" / "t" / "bad.json").read_text())["pgid"]
        wait_until(lambda: not group_members(pgid), timeout=30, what="the failed server to exit")
        code, out, _ = run_cli("status", "--json")
        (srv,) = json.loads(out)["servers"]
        assert srv["state"] == "dead" and srv["category"] == "model_not_found" and srv["exit_code"] not in (None, 0)
        assert code == 1  # a server down: status says so in its exit code too (0 only when all are ready)
        code, out, _ = run_cli("logs", "bad", "-n", "3")
        assert code == 0 and len(out.splitlines()) == 3
        code, out, err = run_cli("logs", "nope")
        assert code == 3 and "no server named 'nope'" in err
        code, out, err = run_cli("restart", "bad", "--json")
        assert code == 1, out + err
        (srv,) = json.loads(out)["servers"]
        assert srv["action"] == "launched" and srv["verdict"]["category"] == "model_not_found"
        assert Path(srv["log_path"]).read_bytes().count(b"==== servefleet launch ") == 2
    finally:
        code, out, err = run_cli("down", "--json")
    assert code == 0, out + err
    assert json.loads(out)["servers"][0]["port_free"] is True

    broken = tmp_path / "broken.toml"
    broken.write_text('[[servers]]\nname = "x"\nport = 99999\nengine = "sim"\nmodel = "m"\n')
    code, _, err = run_cli("up", str(broken))
    assert code == 3
    assert 'broken.toml: servers[0] "x": port: must be between 1 and 65535' in " ".join(err.split())
    nowhere = tmp_path / "nowhere"
    nowhere.mkdir()
    monkeypatch.chdir(nowhere)
    code, _, err = run_cli("status")
    assert code == 3 and "no fleet file" in err


STUBBORN = r"""
import http.server, json, signal, sys
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # only SIGKILL stops this one


class Handler(http.server.BaseHTTPRequestHandler):
    def _send(self, body):
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self._send({"object": "list", "data": [{"id": "stub", "object": "model"}]})

    def do_POST(self):
        self._send({"choices": [{"text": "x", "index": 0}], "usage": {"completion_tokens": 1}})

    def log_message(self, *args):
        pass


server = http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Handler)
print("Uvicorn running on http://127.0.0.1:%s" % sys.argv[1], flush=True)
server.serve_forever()
"""


async def test_openai_command_sigkill_escalation_and_changed_spec(tmp_path: Path, cleanup) -> None:
    """A server that ignores SIGTERM is killed after the grace period, with nothing left over;
    a fleet file changed under a running server is noticed on adopt, not silently applied."""
    port = free_port()
    (tmp_path / "stub.py").write_text(STUBBORN)

    def fleet_file(level: str) -> Path:
        path = tmp_path / "fleet.toml"
        path.write_text(
            textwrap.dedent(f'''
            [[servers]]
            name = "s"
            engine = "openai"
            port = {port}
            served_model_name = "stub"
            command = [{json.dumps(sys.executable)}, "stub.py", "{port}"]
            env = {{ LEVEL = "{level}", MY_API_KEY = "{SECRET}" }}
        ''')
        )
        return path

    # two `up` at once (two terminals): one launches, the other waits for the lock and adopts
    fleet, twin = Fleet.load(fleet_file("1")), Fleet.load(fleet_file("1"))
    cleanup(fleet)
    cleanup(twin)
    first, second = await asyncio.gather(fleet.start(), twin.start())
    assert sorted([first["s"].action, second["s"].action]) == [Action.ADOPTED, Action.LAUNCHED]
    assert first["s"].record.pgid == second["s"].record.pgid
    assert (await fleet.wait(first, timeout_s=20))["s"].state == State.READY
    record = fleet.store.load("s")
    assert SECRET not in fleet.store.path_for("s").read_text()

    changed = Fleet.load(fleet_file("2"))
    cleanup(changed)
    outcome = (await changed.start())["s"]
    assert outcome.action == Action.ADOPTED and outcome.spec_changed and "servefleet restart s" in outcome.message
    assert outcome.record.pgid == record.pgid
    (status,) = await changed.status()
    assert status.state == Liveness.READY and status.spec_changed

    result = (await changed.down(grace_s=0.3))["s"]
    assert result.was_running and result.signal == "SIGKILL" and result.ok
    assert group_members(record.pgid) == [] and port_free(port)


def test_stop_result_ok_is_decided_by_its_fields_not_by_its_message() -> None:
    """Before: ``ok`` looked for "still running" in the message, so a port holder whose command
    line said so made a clean stop a failure, and a rewording would have hidden a real one."""
    from servefleet.fleet.lifecycle import StopResult

    worded = StopResult(
        "a", was_running=False, port_free=False, message="port 8000 is held by pid 7 (sh -c echo still running)"
    )
    assert worded.ok  # never ours to free: `down` of a server that was not running
    assert not StopResult("a", was_running=True, signal="SIGKILL", survived_kill=True, port_free=False, message="").ok
    assert not StopResult(
        "a", was_running=True, signal="SIGTERM", port_free=False, port_holder_pid=9, message="held"
    ).ok
    assert StopResult("a", was_running=True, signal="SIGTERM").ok


def test_a_start_outcome_is_a_value() -> None:
    import dataclasses

    from servefleet.fleet.lifecycle import Action, StartOutcome

    outcome = StartOutcome("a", Action.QUEUED, waits_for=("b",))
    with pytest.raises(dataclasses.FrozenInstanceError):
        outcome.message = "patched"  # type: ignore[misc]
    later = dataclasses.replace(outcome, action=Action.LAUNCHED, after_failure="stopped")
    assert (outcome.action, outcome.after_failure, later.action, later.after_failure) == (
        Action.QUEUED,
        None,
        Action.LAUNCHED,
        "stopped",
    )
