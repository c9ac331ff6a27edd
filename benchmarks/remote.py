"""Remote fleets over SSH: one multiplexed master per host against one fresh connection per command.

The "remote" is a real OpenSSH server on 127.0.0.1 (the test rig, tests/sshd.py; install it with
scripts/ci-sshd-setup.sh). For N = 1, 8 and 32 simulated servers (``python -m servefleet.sim``)
it times, for each transport:

- **launch** — what ``up`` does per server before waiting: write the state record, start the
  server detached (``setsid`` + wrapper, confirmed alive), write the record again with its pgid;
- **status** (per question) — what ``status`` did per server until it was batched: read the
  record, check the process group is alive, ask who holds the port (identity): 3 remote
  commands per server;
- **status** (batched) — what ``servefleet status`` does now (fleet/status.py): every question
  about every server of the host (state record, group alive, leader's command line, exit-code
  file, port holder, the log when the group is gone) in ONE remote command (hosts/ssh_batch.py).

Each phase starts from a new SSHHost, as a new CLI invocation would, so the multiplexed figure
includes starting its master. Both transports run at most 8 commands at a time: sshd's defaults
allow 10 sessions per connection (MaxSessions) and 10 unauthenticated connections (MaxStartups).
Between the phases (not timed) the benchmark waits until every server listens, and after them
kills every server.

The naive transport is SSHHost with ``multiplex=False``: the same remote programs, but each one
a full ``ssh`` connection (ControlMaster=no, ControlPath=none): key exchange, authentication and
a login shell per command.

Run:  .venv/bin/python benchmarks/remote.py                 (several minutes on 2 cores: the naive
                                                            transport at N=32 dominates)
      .venv/bin/python benchmarks/remote.py --sizes 1 8    (a quicker subset)
      .venv/bin/python benchmarks/remote.py --login-rc     (let bash read ~/.bashrc per command)
      .venv/bin/python benchmarks/remote.py --only status  (multiplexed transport only: status per
                                                            question vs batched, compared with the
                                                            figures in results/remote.json)
      .venv/bin/python benchmarks/remote.py --up           (`servefleet up` of N = 1 and 4 servers
                                                            loading 4.8 s: remote commands per
                                                            server, local CPU; the polling wait
                                                            and the remote watcher side by side)
Writes benchmarks/results/remote.json (``--only status``: remote-status.json; ``--up``:
remote-up.json) and prints a table.

``--up`` runs the fleet layer itself (Fleet.start, then Fleet.wait, smoke request included) from
a new Fleet per round. ``poll`` is the wait every SSH host had before the remote watcher (the
status file every 50 ms, the process group every 100 ms, each an ssh command), obtained by hiding
SSHHost.watch so the waiter falls back to it; ``watch`` is the shipped path (hosts/ssh_follow.py
watch). Remote commands are counted by SSHHost.commands and, independently, from the sessions
the rig's sshd logs. Both modes launch the same way (one remote command per server: Host.launch),
so their ``launch`` counts are equal; only the wait differs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from servefleet.hosts.local import LocalHost
from servefleet.hosts.questions import Alive, Owns, Port, Question, Read, ReadIfDead
from servefleet.hosts.ssh import SSHHost

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
from sshd import SSHServer, sshd_unavailable_reason  # noqa: E402 - after the sys.path.insert above

RESULTS = Path(__file__).resolve().parent / "results" / "remote.json"
STATUS_RESULTS = RESULTS.with_name("remote-status.json")
CONCURRENCY = 8


def free_ports(n: int) -> list[int]:
    import socket

    socks, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


def sim_argv(port: int, name: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "servefleet.sim",
        "--port",
        str(port),
        "--served-model-name",
        name,
        "--load-time",
        "0.5",
        "--log-interval",
        "60",
    ]


async def launch(host: SSHHost, work: Path, ports: list[int]) -> dict[str, int]:
    async def one(i: int, port: int) -> tuple[str, int]:
        name = f"sim{i:02d}"
        state = str(work / "state" / f"{name}.json")
        record: dict[str, Any] = {"name": name, "port": port, "status": "launching"}
        await host.write_bytes(state, json.dumps(record).encode())
        pgid = await host.spawn_detached(
            sim_argv(port, name),
            log_path=str(work / "logs" / f"{name}.log"),
            status_path=str(work / "run" / f"{name}.status"),
            env={"PYTHONUNBUFFERED": "1"},
        )
        record.update(pgid=pgid, status="launched")
        await host.write_bytes(state, json.dumps(record).encode())
        return name, pgid

    return dict(await asyncio.gather(*(one(i, p) for i, p in enumerate(ports))))


async def status(host: SSHHost, work: Path, names: list[str]) -> dict[str, dict[str, Any]]:
    async def one(name: str) -> tuple[str, dict[str, Any]]:
        record = json.loads(await host.read_bytes(str(work / "state" / f"{name}.json")))
        alive = await host.group_alive(record["pgid"])
        holder = await host.port_holder(record["port"])
        ours = holder is not None and holder.pgid == record["pgid"]
        return name, {"alive": alive, "listening": holder is not None, "ours": ours}

    return dict(await asyncio.gather(*(one(n) for n in names)))


async def status_batched(host: SSHHost, work: Path, names: list[str]) -> dict[str, dict[str, Any]]:
    """The questions of ``servefleet status`` (fleet/status.py: prefetch_questions plus the
    record) for every server, in one batch. The records are read in the same batch as everything
    else here because the benchmark's servers have no local record; `servefleet status` reads
    local records from disk and needs a second batch only when it rediscovers remote ones."""
    await host.connect()
    records = {
        n: json.loads(p.read_bytes()) for n in names for p in [work / "state" / f"{n}.json"]
    }  # pgid/port: known to the caller
    ops: list[Question] = []
    for name, rec in records.items():
        log = str(work / "logs" / f"{name}.log")
        ops += [
            Read(str(work / "state" / f"{name}.json")),
            Alive(rec["pgid"]),
            Owns(rec["pgid"], log),
            Read(str(work / "run" / f"{name}.status")),
            Port(rec["port"]),
            ReadIfDead(rec["pgid"], Read(log, 0, 8 * 1024 * 1024)),
        ]
    answers = await host.batch(ops)
    report = {}
    for name, rec in records.items():
        holder = answers[Port(rec["port"])]
        alive = answers[Alive(rec["pgid"])]
        ours = (
            alive
            and holder is not None
            and holder.pgid == rec["pgid"]
            and answers[Owns(rec["pgid"], str(work / "logs" / f"{name}.log"))] is True
        )
        assert json.loads(answers[Read(str(work / "state" / f"{name}.json"))]) == rec
        report[name] = {"alive": alive, "listening": holder is not None, "ours": ours}
    return report


async def wait_listening(ports: list[int], timeout: float = 180.0) -> None:
    local = LocalHost()  # the "remote" is this machine: checking locally keeps SSH out of it
    deadline = time.monotonic() + timeout
    pending = set(ports)
    while pending:
        if time.monotonic() > deadline:
            raise RuntimeError(f"servers on ports {sorted(pending)} did not listen within {timeout}s")
        for port in list(pending):
            if await local.port_holder(port) is not None:
                pending.discard(port)
        await asyncio.sleep(0.1)


async def kill_all(pgids: list[int]) -> None:
    for pgid in pgids:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    local = LocalHost()
    deadline = time.monotonic() + 30
    while any([await local.group_alive(p) for p in pgids]) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)


async def one_round(server: SSHServer, n: int, multiplex: bool, login_rc: bool, root: Path) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix=f"n{n}-{'mux' if multiplex else 'naive'}-", dir=root))
    options = {} if login_rc else server.client_options()
    spec = server.spec(
        workdir=str(work), multiplex=multiplex, max_sessions=CONCURRENCY, options=options, connect_timeout=10
    )
    ports = free_ports(n)
    host = SSHHost(spec)
    t0 = time.perf_counter()
    pgids = await launch(host, work, ports)
    launch_s = time.perf_counter() - t0
    masters = host.pool.starts if host.pool else 0
    commands = {"launch": host.commands}
    await host.close()
    timings: dict[str, float] = {}
    try:
        await wait_listening(ports)
        # each variant from a new SSHHost (a new `servefleet status` invocation), alternating
        # which goes first so neither always pays for a cold page cache
        variants = [("status_s", status), ("status_batched_s", status_batched)]
        for key, fn in variants if n % 2 == 0 else variants[::-1]:
            host = SSHHost(spec)
            t0 = time.perf_counter()
            report = await fn(host, work, sorted(pgids))
            timings[key] = time.perf_counter() - t0
            commands[key.removesuffix("_s")] = host.commands
            await host.close()
            assert all(r["alive"] and r["ours"] for r in report.values()), (key, report)
    finally:
        await kill_all(list(pgids.values()))
    # remote commands actually run (the probe each new SSHHost runs first included)
    return {
        "n": n,
        "transport": "multiplexed" if multiplex else "naive",
        "launch_s": launch_s,
        **timings,
        "masters_started": masters,
        "commands": commands,
    }


def median_row(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out = dict(rows[0])
    for key in ("launch_s", "status_s", "status_batched_s"):
        out[key] = statistics.median(r[key] for r in rows)
        out[f"{key}_all"] = [round(r[key], 4) for r in rows]
    return out


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    reason = sshd_unavailable_reason()
    if reason:
        raise SystemExit(f"cannot run: {reason}")
    load_before = os.getloadavg()
    root = Path(tempfile.mkdtemp(prefix="sf-remote-bench-"))
    server = SSHServer(root / "sshd").start()
    rows: list[dict[str, Any]] = []
    try:
        for n in args.sizes:
            for multiplex in (True,) if args.only == "status" else (True, False):
                runs = [await one_round(server, n, multiplex, args.login_rc, root) for _ in range(args.repeats)]
                rows.append(median_row(runs))
    finally:
        server.stop()
    by = {(r["n"], r["transport"]): r for r in rows}
    ratios = []
    for n in args.sizes:
        mux = by[(n, "multiplexed")]
        entry: dict[str, Any] = {"n": n, "status_per_question_over_batched": mux["status_s"] / mux["status_batched_s"]}
        previous = _previous_status(n)
        if previous is not None:
            entry["previous_status_s"] = previous
            entry["previous_over_batched"] = previous / mux["status_batched_s"]
        if (n, "naive") in by:
            naive = by[(n, "naive")]
            entry.update(
                launch_ratio=naive["launch_s"] / mux["launch_s"],
                status_ratio=naive["status_s"] / mux["status_s"],
                status_batched_ratio=naive["status_batched_s"] / mux["status_batched_s"],
            )
        ratios.append(entry)
    return {
        "benchmark": "remote",
        "what": "launch and status of N sim servers on an SSH host: multiplexed master vs one ssh connection per command; status one question at a time vs one batch per host",
        "only": args.only,
        "sizes": args.sizes,
        "repeats": args.repeats,
        "concurrency": CONCURRENCY,
        "login_rc": args.login_rc,
        "rows": rows,
        "ratios": ratios,
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "ssh": _ssh_version(),
            "load_avg_before": load_before,
            "load_avg_after": os.getloadavg(),
        },
    }


def _previous_status(n: int) -> float | None:
    """The multiplexed status figure for ``n`` in results/remote.json as it was before status was
    batched (per-question rows only: a row with ``status_batched_s`` is already a new run)."""
    try:
        old = json.loads(RESULTS.read_text())
    except (OSError, ValueError):
        return None
    for row in old.get("rows", []):
        if row.get("n") == n and row.get("transport") == "multiplexed" and "status_batched_s" not in row:
            return float(row["status_s"])
    for ratio in old.get("ratios", []):  # a newer file keeps the pre-batching figure here
        if ratio.get("n") == n and "previous_status_s" in ratio:
            return float(ratio["previous_status_s"])
    return None


def _ssh_version() -> str:
    return subprocess.run(["ssh", "-V"], capture_output=True, text=True).stderr.strip()


def render(result: dict[str, Any]) -> None:
    table = Table(title="SSH host: launch and status of N sim servers (median seconds)")
    for col in (
        "N",
        "transport",
        "launch s",
        "status s (per question)",
        "status s (batched)",
        "masters",
        "commands launch/status/batched",
    ):
        table.add_column(col, justify="right" if col not in ("transport",) else "left")
    for r in result["rows"]:
        c = r["commands"]
        table.add_row(
            str(r["n"]),
            r["transport"],
            f"{r['launch_s']:.3f}",
            f"{r['status_s']:.3f}",
            f"{r['status_batched_s']:.3f}",
            str(r["masters_started"]),
            f"{c['launch']}/{c['status']}/{c['status_batched']}",
        )
    console = Console()
    console.print(table)
    load = result["machine"]
    console.print(
        f"load average before/after: {load['load_avg_before'][0]:.1f} / {load['load_avg_after'][0]:.1f} on {load['cpus']} CPUs"
    )
    for r in result["ratios"]:
        line = f"N={r['n']}: status per question / batched = {r['status_per_question_over_batched']:.1f}x"
        if "previous_over_batched" in r:
            line += f"; previous results/remote.json status {r['previous_status_s']:.3f}s / batched = {r['previous_over_batched']:.1f}x"
        if "launch_ratio" in r:
            line += f"; naive / multiplexed = {r['launch_ratio']:.1f}x launch, {r['status_ratio']:.1f}x status, {r['status_batched_ratio']:.1f}x batched status"
        console.print(line)


# ---- up: launch + wait of N slow-loading servers, the remote commands it costs -----------------

UP_RESULTS = RESULTS.with_name("remote-up.json")


def write_up_fleet(server: SSHServer, work: Path, n: int, load_s: float, engine: str = "sim") -> Path:
    """A fleet of ``n`` servers on the rig: sim servers loading for ``load_s`` seconds, or
    (``engine="vllm"``) vLLM's CPU build serving the tiny test model, as tests/test_real_vllm.py."""
    remote = work / "remote"
    remote.mkdir(parents=True, exist_ok=True)
    if engine == "vllm":
        from real_engines import VLLM_ARGS, VLLM_ENV, build_tiny_model, engine_python

        model = build_tiny_model(work / "tiny-model")
        env = ", ".join(f"{k} = {json.dumps(v)}" for k, v in VLLM_ENV.items())
        defaults = (
            f'[defaults]\nengine = "vllm"\nmodel = {json.dumps(str(model))}\nhost = "rig"\npython = {json.dumps(str(engine_python("vllm")))}\n'
            f"args = {json.dumps(list(VLLM_ARGS))}\nenv = {{ {env} }}\n"
        )
        timeout = 900
    else:
        defaults = f'[defaults]\nengine = "sim"\nmodel = "sim-m"\nhost = "rig"\nargs = ["--load-time", "{load_s}", "--shards", "8"]\n'
        timeout = load_s * 4 + 60
    parts = [
        f'[fleet]\nname = "bench"\ntimeout = {timeout}\nstall = 300\n',
        f'[hosts.rig]\nssh = "{server.destination}"\nport = {server.port}\n'
        f'identity_file = "{server.identity_file}"\nknown_hosts = "{server.known_hosts}"\n'
        f'config_file = "{server.client_config()}"\nworkdir = {json.dumps(str(remote))}\n'
        f'python = "{sys.executable}"\nconnect_timeout = 10\n',
        defaults,
    ]
    for i, port in enumerate(free_ports(n)):
        parts.append(f'[[servers]]\nname = "s{i:02d}"\nport = {port}\n')
    path = work / "fleet.toml"
    path.write_text("\n".join(parts))
    return path


@contextlib.contextmanager
def waiting_mode(mode: str):
    """``poll``: the waiter's polling path (what every SSH wait did before the remote watcher),
    by hiding SSHHost's ``watch`` capability for the run; ``watch``: as shipped."""
    saved = SSHHost.__dict__.get("watch")
    if mode == "poll" and saved is not None:
        delattr(SSHHost, "watch")
    try:
        yield
    finally:
        if saved is not None and "watch" not in SSHHost.__dict__:
            SSHHost.watch = saved  # type: ignore[attr-defined]  # restoring the method patched above


def _sshd_sessions(server: SSHServer) -> int:
    """Remote commands the rig's sshd has started (LogLevel VERBOSE logs each session)."""
    return server.log_file.read_bytes().count(b"Starting session: command")


def _cpu_s() -> float:
    self_, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return self_.ru_utime + self_.ru_stime + kids.ru_utime + kids.ru_stime


async def up_round(
    server: SSHServer, n: int, load_s: float, mode: str, root: Path, engine: str = "sim", smoke: bool = True
) -> dict[str, Any]:
    from servefleet.fleet import Fleet

    work = Path(tempfile.mkdtemp(prefix=f"up-n{n}-{mode}-", dir=root))
    fleet = Fleet.load(write_up_fleet(server, work, n, load_s, engine))
    try:
        with waiting_mode(mode):
            sessions0 = _sshd_sessions(server)
            cpu0, t0 = _cpu_s(), time.perf_counter()
            outcomes = await fleet.start()
            host = fleet.binding("rig").host
            assert isinstance(host, SSHHost)
            launched, sessions1 = host.commands, _sshd_sessions(server)
            verdicts = await fleet.wait(outcomes, smoke=smoke)
            wall, cpu = time.perf_counter() - t0, _cpu_s() - cpu0
            total, sessions2 = host.commands, _sshd_sessions(server)
        states = {name: v.state.value for name, v in verdicts.items()}
        # a real engine's failure is recorded (the commands it cost count as well), a sim's is a bug here
        assert engine != "sim" or set(states.values()) == {"ready"}, verdicts
    finally:
        await fleet.down(grace_s=2)
        await fleet.close()
    return {
        "n": n,
        "mode": mode,
        "engine": engine,
        "smoke": smoke,
        "states": states,
        "failures": {
            name: f"{v.category.value if v.category else ''}: {v.evidence.text if v.evidence else v.message}"
            for name, v in verdicts.items()
            if v.state.value != "ready"
        },
        "load_s": load_s if engine == "sim" else None,
        "up_s": wall,
        "local_cpu_s": cpu,
        "commands": {"launch": launched, "wait": total - launched, "total": total},
        "sshd_sessions": {
            "launch": sessions1 - sessions0,
            "wait": sessions2 - sessions1,
        },  # the same, as sshd counted them
        "wait_commands_per_server": (total - launched) / n,
        "commands_per_server": total / n,
        "commands_per_s": total / wall,
    }


def watcher_loop_cpu(seconds: float = 10.0) -> dict[str, float]:
    """What one remote watcher costs the remote host while its server loads: CPU of the WATCH
    loop (and the ``sleep`` it forks every tick) run here on a live process group, without tail."""
    from servefleet.hosts import ssh_scripts

    group = subprocess.Popen(["sleep", str(seconds + 30)], start_new_session=True)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    loop = subprocess.Popen(
        ssh_scripts.watch_argv(None, 0, True, "0" * 32, group.pid, "/nonexistent/status", 1),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(seconds)
    loop.terminate()
    loop.wait()
    elapsed = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    group.kill()
    group.wait()
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return {"seconds": elapsed, "cpu_s": cpu, "percent_of_a_core": 100 * cpu / elapsed}


async def up_async(args: argparse.Namespace) -> dict[str, Any]:
    reason = sshd_unavailable_reason()
    if reason:
        raise SystemExit(f"cannot run: {reason}")
    load_before = os.getloadavg()
    root = Path(tempfile.mkdtemp(prefix="sf-remote-up-"))
    server = SSHServer(root / "sshd").start()
    rows: list[dict[str, Any]] = []
    try:
        for n in args.sizes:
            for mode in args.modes:
                runs = [
                    await up_round(server, n, args.load_time, mode, root, args.engine, not args.no_smoke)
                    for _ in range(args.repeats)
                ]
                row = dict(runs[0])
                for key in (
                    "up_s",
                    "local_cpu_s",
                    "commands_per_s",
                    "wait_commands_per_server",
                    "commands_per_server",
                ):
                    row[key] = statistics.median(r[key] for r in runs)
                    row[f"{key}_all"] = [round(r[key], 3) for r in runs]
                row["commands_all"] = [r["commands"] for r in runs]
                rows.append(row)
    finally:
        server.stop()
    by = {(r["n"], r["mode"]): r for r in rows}
    ratios = []
    for n in args.sizes:
        if (n, "poll") in by and (n, "watch") in by:
            poll, watch = by[(n, "poll")], by[(n, "watch")]
            ratios.append(
                {
                    "n": n,
                    "wait_commands_poll_over_watch": poll["wait_commands_per_server"]
                    / max(watch["wait_commands_per_server"], 1e-9),
                    "local_cpu_poll_over_watch": poll["local_cpu_s"] / watch["local_cpu_s"],
                    "up_s_poll_over_watch": poll["up_s"] / watch["up_s"],
                }
            )
    return {
        "benchmark": "remote-up",
        "what": "servefleet up (Fleet.start + Fleet.wait) of N slow-loading sim servers on an SSH host: remote commands (SSHHost.commands: one per ssh client process that runs a "
        "remote program), wall time and local CPU (this process + its children: the ssh clients); wait = polling ssh commands (poll) vs one remote watcher per server "
        "(watch)",
        "engine": args.engine,
        "sizes": args.sizes,
        "modes": args.modes,
        "load_time_s": args.load_time if args.engine == "sim" else None,
        "repeats": args.repeats,
        "rows": rows,
        "ratios": ratios,
        "watcher_loop_cpu": watcher_loop_cpu(),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "ssh": _ssh_version(),
            "load_avg_before": load_before,
            "load_avg_after": os.getloadavg(),
        },
    }


def render_up(result: dict[str, Any]) -> None:
    what = (
        f"loading {result['load_time_s']}s each" if result.get("engine", "sim") == "sim" else f"of {result['engine']}"
    )
    table = Table(title=f"servefleet up over SSH: N servers {what} (median of {result['repeats']})")
    for col in (
        "N",
        "wait",
        "up s",
        "local CPU s",
        "commands launch/wait/total",
        "sshd sessions launch/wait",
        "wait cmds/server",
        "cmds/server",
        "cmds/s",
    ):
        table.add_column(col, justify="left" if col == "wait" else "right")
    for r in result["rows"]:
        c = r["commands"]
        sessions = r["sshd_sessions"]
        table.add_row(
            str(r["n"]),
            r["mode"],
            f"{r['up_s']:.2f}",
            f"{r['local_cpu_s']:.2f}",
            f"{c['launch']}/{c['wait']}/{c['total']}",
            f"{sessions['launch']}/{sessions['wait']}",
            f"{r['wait_commands_per_server']:.1f}",
            f"{r['commands_per_server']:.1f}",
            f"{r['commands_per_s']:.1f}",
        )
    console = Console()
    console.print(table)
    loop = result["watcher_loop_cpu"]
    console.print(
        f"one remote watcher loop: {loop['cpu_s']:.3f} s CPU in {loop['seconds']:.1f} s ({loop['percent_of_a_core']:.2f}% of a core) on the remote"
    )
    for r in result["ratios"]:
        console.print(
            f"N={r['n']}: poll / watch = {r['wait_commands_poll_over_watch']:.1f}x wait commands, {r['local_cpu_poll_over_watch']:.1f}x local CPU, "
            f"{r['up_s_poll_over_watch']:.2f}x up time"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--login-rc",
        action="store_true",
        help="let bash read the login user's ~/.bashrc for every command (as on many real hosts)",
    )
    parser.add_argument(
        "--only",
        choices=["all", "status"],
        default="all",
        help="status: the multiplexed transport only (status per question vs batched); writes remote-status.json",
    )
    parser.add_argument(
        "--up",
        action="store_true",
        help="measure `servefleet up` (launch + wait) of slow-loading servers instead: remote commands per server, polling wait vs "
        "remote watcher; writes remote-up.json",
    )
    parser.add_argument(
        "--modes",
        nargs="+",
        choices=["poll", "watch"],
        default=["poll", "watch"],
        help="with --up: which wait paths to run, side by side",
    )
    parser.add_argument(
        "--load-time", type=float, default=4.8, help="with --up: seconds each sim server takes to load"
    )
    parser.add_argument(
        "--no-smoke",
        action="store_true",
        help="with --up: ready at the HTTP probe, without the one-token smoke request",
    )
    parser.add_argument(
        "--engine",
        choices=["sim", "vllm"],
        default="sim",
        help="with --up: the servers: simulated, or vLLM's CPU build with the tiny test model "
        "(scripts/install-real-engines.sh; run it under flock /tmp/servefleet-heavy.lock)",
    )
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if args.up:
        args.sizes = args.sizes if args.sizes != [1, 8, 32] else [1, 4]
        args.out = args.out or UP_RESULTS
        result = asyncio.run(up_async(args))
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
        render_up(result)
        print(f"wrote {args.out}")
        return
    args.out = args.out or (STATUS_RESULTS if args.only == "status" else RESULTS)
    result = asyncio.run(main_async(args))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    render(result)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
