"""The Slurm host's pure parts, with tables: squeue parsing, job states, end-state reports,
sbatch options, the port slot, and the fleet file's Slurm fields."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from servefleet.engines.base import PORT_SLOT
from servefleet.errors import ConfigError
from servefleet.fleet.loader import load_fleet_file
from servefleet.hosts.base import DETACH_SCRIPT
from servefleet.hosts.local import LocalHost
from servefleet.hosts.slurm_queue import end_report, is_alive, parse_squeue, squeue_argv
from servefleet.hosts.slurm_script import JOB, parse_submitted, sbatch_options


def test_squeue_lines_are_parsed_and_odd_lines_skipped() -> None:
    out = (
        "41|PENDING|Resources||2026-12-01T11:00:00|0:00|10:00|servefleet-f-a\n"
        "42|RUNNING|None|gpu-07|2026-12-01T11:00:01|1:02|10:00|name|with|bars\n"
        "garbage line\n"
        "43|COMPLETING|NonZeroExitCode|gpu-07|2026-12-01T11:00:02|0:09|UNLIMITED|x\n"
    )
    jobs = parse_squeue(out)
    assert set(jobs) == {"41", "42", "43"}
    assert jobs["41"].pending and jobs["41"].reason == "Resources" and jobs["41"].submitted.minute == 0
    assert (
        not jobs["42"].pending
        and jobs["42"].reason == ""
        and jobs["42"].nodes == "gpu-07"
        and jobs["42"].name == "name|with|bars"
    )
    assert jobs["43"].state == "COMPLETING"


@pytest.mark.parametrize(
    ("state", "alive"),
    [
        ("PENDING", True),
        ("RUNNING", True),
        ("COMPLETING", True),
        ("SUSPENDED", True),
        ("CONFIGURING", True),
        ("COMPLETED", False),
        ("FAILED", False),
        ("TIMEOUT", False),
        ("CANCELLED", False),
        ("PREEMPTED", False),
        ("NODE_FAIL", False),
        ("OUT_OF_MEMORY", False),
        ("BOOT_FAIL", False),
        ("DEADLINE", False),
    ],
)
def test_job_states_alive_or_ended(state: str, alive: bool) -> None:
    assert is_alive(state) is alive


@pytest.mark.parametrize(
    ("state", "killed", "words", "hint_words"),
    [
        ("TIMEOUT", True, "time limit of 1:00", "raise `time` in [hosts.c]"),
        ("PREEMPTED", True, "preempted", "qos"),
        ("NODE_FAIL", True, "on gpu-07: the node failed", "--exclude=gpu-07"),
        ("OUT_OF_MEMORY", True, "memory allocation", "raise `mem`"),
        ("CANCELLED", True, "cancelled", "sacct"),
        ("FAILED", False, "ended FAILED (NonZeroExitCode)", None),
        ("COMPLETED", False, "ended COMPLETED", None),
    ],
)
def test_end_states_map_to_killed_or_the_logs_own_diagnosis(
    state: str, killed: bool, words: str, hint_words: str | None
) -> None:
    reason = "NonZeroExitCode" if state == "FAILED" else ""
    job = parse_squeue(f"7|{state}|{reason}|gpu-07|2026-12-01T11:00:00|1:00|1:00|x\n")["7"]
    report = end_report(job, "7", "c")
    assert report.killed is killed
    assert words in report.note and "Slurm job 7" in report.note
    if hint_words is None:
        assert report.hint is None  # the server's own exit and log decide
    else:
        assert hint_words in (report.hint or "")


def test_a_job_the_scheduler_forgot_is_said_so() -> None:
    report = end_report(None, "9", "c")
    assert "no longer known" in report.note and not report.killed


def test_squeue_asks_about_every_state_of_my_jobs_in_one_call() -> None:
    argv = squeue_argv()
    assert argv[0] == "squeue" and "--states=all" in argv and "--me" in argv and "--noheader" in argv


def test_sbatch_options_use_sbatchs_names_and_extra_args_come_last() -> None:
    opts = {
        "partition": "gpu",
        "account": "p1",
        "qos": None,
        "time": "04:00:00",
        "gres": "gpu:h100:1",
        "gpus": None,
        "cpus": 8,
        "mem": "64G",
        "constraint": "h100",
        "sbatch_args": ["--exclusive", "--time=01:00:00"],
    }
    assert sbatch_options(opts) == [
        "--partition=gpu",
        "--account=p1",
        "--time=04:00:00",
        "--gres=gpu:h100:1",
        "--cpus-per-task=8",
        "--mem=64G",
        "--constraint=h100",
        "--exclusive",
        "--time=01:00:00",
    ]


def test_an_engine_writes_the_port_slot_where_its_port_goes_and_records_keep_the_port(tmp_path: Path) -> None:
    """The seam is declared, not found by building the argv twice: a Slurm binding's launch gives
    its host the engine's argv with PORT_SLOT where the port goes; what records and hashes see is
    the argv with the fleet file's port."""
    from servefleet.fleet.binding import HostBinding
    from servefleet.fleet.lifecycle import resolve_launch
    from servefleet.fleet.spec import ServerSpec

    server = ServerSpec(name="a", engine="vllm", model="m", port=30000, args=["--max-model-len", "30000"])
    plain = resolve_launch(server, HostBinding("local", LocalHost(), str(tmp_path)), "f.toml")
    slotted = resolve_launch(server, HostBinding("c", LocalHost(), str(tmp_path), port_slot=True), "f.toml")
    assert plain.host_argv is None and "30000" in plain.argv
    assert slotted.host_argv is not None and slotted.host_argv.count(PORT_SLOT) == 1
    assert (
        slotted.host_argv[slotted.host_argv.index(PORT_SLOT) - 1] == "--port"
    )  # not the equal-looking --max-model-len 30000
    assert slotted.argv == plain.argv
    fixed = resolve_launch(
        server.model_copy(update={"args": ("--port", "30000")}),
        HostBinding("c", LocalHost(), str(tmp_path), port_slot=True),
        "f.toml",
    )
    assert PORT_SLOT not in " ".join(
        fixed.host_argv or []
    )  # the port was fixed in the fleet file's args: nothing to replace


def test_the_job_script_puts_its_port_in_the_slot(tmp_path: Path) -> None:
    """JOB run by hand (no Slurm): the port it picks replaces the slot, wherever an argument
    carries it, and where it runs is written to the .where file."""
    log, status, where = tmp_path / "s.log", tmp_path / "s.status", tmp_path / "s.where"
    server = ["sh", "-c", 'echo "$@"', "sh", "--len", "30000", f"--port={PORT_SLOT}", f"--metrics=:{PORT_SLOT}"]
    argv = [
        "sh",
        "-c",
        JOB,
        "sh",
        str(log),
        str(status),
        str(where),
        "30000",
        PORT_SLOT,
        "25000",
        "1000",
        "python3",
        DETACH_SCRIPT,
        *server,
    ]
    env = {"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": "7", "PICK": "import sys; print(25123)"}
    subprocess.run(argv, env=env, check=True, timeout=30)
    assert "port=25123" in where.read_text() and "job=7" in where.read_text()
    assert "--len 30000 --port=25123 --metrics=:25123" in log.read_text()
    assert status.read_text().strip() == "0"


def test_the_job_script_keeps_a_port_fixed_in_args(tmp_path: Path) -> None:
    log, status, where = tmp_path / "s.log", tmp_path / "s.status", tmp_path / "s.where"
    server = ["sh", "-c", 'echo "$@"', "sh", "--port", "8000"]
    argv = [
        "sh",
        "-c",
        JOB,
        "sh",
        str(log),
        str(status),
        str(where),
        "8000",
        PORT_SLOT,
        "25000",
        "1000",
        "python3",
        DETACH_SCRIPT,
        *server,
    ]
    env = {"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": "7", "PICK": "import sys; print(25123)"}
    subprocess.run(argv, env=env, check=True, timeout=30)
    assert "port=8000" in where.read_text() and "--port 8000" in log.read_text()


def test_a_submission_reports_its_job_id() -> None:
    assert parse_submitted("log 10 2\n1234\nalive\n") == "1234"
    with pytest.raises(ValueError):
        parse_submitted("sbatch: error\n")


def _fleet(tmp_path: Path, host: str) -> Path:
    path = tmp_path / "f.toml"
    path.write_text(
        f'[hosts.c]\n{host}\n[[servers]]\nname = "a"\nengine = "sim"\nmodel = "m"\nport = 1234\nhost = "c"\n'
    )
    return path


def test_the_fleet_file_takes_slurm_hosts(tmp_path: Path) -> None:
    spec = load_fleet_file(
        _fleet(tmp_path, 'kind = "slurm"\npartition = "gpu"\ntime = 60\ngpus = 1\nsbatch_args = ["--exclusive"]')
    )
    host = spec.hosts["c"]
    assert host.kind == "slurm" and host.ssh is None and host.time == "60"
    assert sbatch_options(host.slurm_options()) == ["--partition=gpu", "--time=60", "--gpus=1", "--exclusive"]


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ('partition = "gpu"', "ssh: required field is missing"),  # an ssh host without its destination
        ('kind = "slurm"\npartiton = "gpu"', "partiton"),  # a typo is not silently ignored
        ('kind = "slurm"\nport_range = [80, 90]', "port_range"),
        ('kind = "pbs"', "kind"),
    ],
)
def test_bad_slurm_tables_are_refused(tmp_path: Path, table: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_fleet_file(_fleet(tmp_path, table))


def test_the_slurm_example_loads() -> None:
    spec = load_fleet_file(Path(__file__).resolve().parent.parent / "examples" / "slurm.toml")
    host = spec.hosts["cluster"]
    assert host.kind == "slurm" and host.ssh
    assert "--gpus=1" in sbatch_options(host.slurm_options())


async def test_servers_on_a_slurm_host_never_wait_for_a_shared_gpu(tmp_path: Path) -> None:
    """Start ordering must not ask the submitting machine for GPU drivers: jobs get their own GPUs."""
    from servefleet.fleet.hosts import HostPool
    from servefleet.fleet.start_order import host_has_gpus

    spec = load_fleet_file(_fleet(tmp_path, 'kind = "slurm"'))
    binding = HostPool(spec).get("c")

    async def refuse(*_a, **_k):  # type: ignore[no-untyped-def]
        raise AssertionError("asked the submitting machine")

    binding.host.transport.run = refuse  # type: ignore[attr-defined]
    assert await host_has_gpus(binding) is False


async def test_the_relay_follows_the_current_target_and_refuses_while_there_is_none() -> None:
    import asyncio

    from servefleet.hosts.slurm_relay import Relay

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"from upstream:" + await reader.readline())
        await writer.drain()
        writer.close()

    upstream = await asyncio.start_server(echo, "127.0.0.1", 0)
    target: list[tuple[str, int] | None] = [None]

    async def resolve() -> tuple[str, int] | None:
        return target[0]

    relay = Relay(resolve)
    port = await relay.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)  # pending: closed at once
        assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()
        target[0] = ("127.0.0.1", upstream.sockets[0].getsockname()[1])
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"hi\n")
        assert await asyncio.wait_for(reader.read(), 5) == b"from upstream:hi\n"
        writer.close()
        idle_reader, idle_writer = await asyncio.open_connection("127.0.0.1", port)  # a keep-alive one, left open
        await asyncio.sleep(0.05)
    finally:
        await relay.close()
        upstream.close()
    assert await asyncio.wait_for(idle_reader.read(), 5) == b""  # close() ended it
    idle_writer.close()
    assert relay._pipes == set()


class _FakeTransport:
    """Answers every command with one canned result; counts them."""

    name = "local"

    def __init__(self, code: int, stdout: str = "", stderr: str = "") -> None:
        self.result = (code, stdout, stderr)
        self.asked: list[list[str]] = []

    async def run(self, argv, *, timeout=None, check=True, input=None):  # type: ignore[no-untyped-def]
        from servefleet.hosts.base import CommandResult

        self.asked.append(list(argv))
        return CommandResult(tuple(argv), *self.result)

    async def close(self) -> None:
        return None


def _host(transport: _FakeTransport):  # type: ignore[no-untyped-def]
    from servefleet.hosts.slurm import SlurmHost, SlurmSpec

    return SlurmHost(SlurmSpec(name="c", env={"SLURM_CONF": "/x.conf"}), transport, lambda _p: None)


async def test_a_controller_that_does_not_answer_is_host_unreachable() -> None:
    from servefleet.errors import HostError, HostUnreachable

    host = _host(_FakeTransport(1, stderr="squeue: error: Unable to contact slurm controller (connect failure)"))
    with pytest.raises(HostUnreachable, match="does not answer"):
        await host.group_alive(5)
    other = _host(_FakeTransport(1, stderr="squeue: error: Invalid user"))
    with pytest.raises(HostError, match="squeue failed: squeue: error: Invalid user"):
        await other.group_alive(5)


async def test_servers_asking_at_once_share_one_squeue() -> None:
    import asyncio

    transport = _FakeTransport(
        0, "5|RUNNING|None|n1|2026-12-01T11:00:00|0:10|10:00|a\n6|PENDING|Priority||2026-12-01T11:00:00|0:00|10:00|b\n"
    )
    host = _host(transport)
    alive = await asyncio.gather(*(host.group_alive(j) for j in (5, 6, 7, 5, 6)))
    assert alive == [True, True, False, True, True]
    assert len(transport.asked) == 1
    assert transport.asked[0][:2] == ["env", "SLURM_CONF=/x.conf"] and transport.asked[0][2] == "squeue"
    assert (await host.queued(6) or "").startswith("job 6 pending (Priority) for ")
    assert await host.queued(5) is None
    assert len(transport.asked) == 1  # still within poll_interval: no second question


# ---- the watch stream: the whole log before the exit -------------------------------------------
# The end of a real SGLang-style start-up that fails for GPU memory (the sim's text, as a Slurm
# job's log held it): the cause, then the launcher SIGKILLs itself (exit 137, no error of its own).
_OOM_LOG = b"""[2026-12-01 14:44:02 TP0] Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16, avail mem=63.42 GB, mem usage=15.08 GB.
[2026-12-01 14:44:02 TP0] Scheduler hit an exception: Traceback (most recent call last):
  File "/usr/local/lib/python3.12/dist-packages/sglang/srt/managers/scheduler.py", line 2890, in run_scheduler_process
    scheduler = Scheduler(server_args, port_args, gpu_id, tp_rank, moe_ep_rank, pp_rank, dp_rank)
  File "/usr/local/lib/python3.12/dist-packages/sglang/srt/model_executor/model_runner.py", line 1235, in init_memory_pool
    raise RuntimeError(
RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. Current value: mem_fraction_static=0.88

[2026-12-01 14:44:02] Received sigquit from a child process. It usually means the child failed.
Killed
"""
_LOADING_LOG = b"[2026-12-01 14:44:02 TP0] Load weight begin. avail mem=78.50 GB\n"
_MARKER = b"==> servefleet: launch attempt\n"


class _LaggingTransport:
    """A local transport whose log follower lags: it delivers ``first`` bytes and then nothing (the
    rest is on disk, not yet read), and whose ``squeue`` says the job has already ended."""

    name = "local"

    def __init__(self, squeue: str, first: int) -> None:
        from servefleet.hosts.local import LocalHost

        self.files = LocalHost()
        self.squeue = squeue
        self.first = first

    async def run(self, argv, *, timeout=None, check=True, input=None):  # type: ignore[no-untyped-def]
        from servefleet.hosts.base import CommandResult

        assert "squeue" in argv, argv
        return CommandResult(tuple(argv), 0, self.squeue, "")

    async def read_bytes(self, path: str, offset: int = 0, limit: int | None = None) -> bytes:
        return await self.files.read_bytes(path, offset, limit)

    async def file_size(self, path: str) -> int | None:
        return await self.files.file_size(path)

    async def follow(self, path: str, offset: int = 0):  # type: ignore[no-untyped-def]
        import asyncio

        if self.first:
            yield (await self.files.read_bytes(path, offset, self.first))
        await asyncio.Event().wait()  # lagging: the rest is never read by the follower

    async def close(self) -> None:
        return None


def _ended_job(tmp_path: Path, state: str, body: bytes, code: str | None, first: int = 0):  # type: ignore[no-untyped-def]
    """A Slurm host whose job 7 has ended in ``state``, its log (``body`` after an earlier
    attempt's marker) and status file (``code``) on disk, its follower behind by all but ``first``."""
    from servefleet.hosts.slurm import SlurmHost, SlurmSpec

    log, status = tmp_path / "oom.log", tmp_path / "oom.status"
    log.write_bytes(_MARKER + body)
    if code is not None:
        status.write_text(code + "\n")
    reason = {"TIMEOUT": "TimeLimit", "CANCELLED": "None"}.get(state, "None")
    squeue = f"7|{state}|{reason}|n1|2026-12-01T11:00:00|0:03|10:00|servefleet-sl-oom\n"
    host = SlurmHost(SlurmSpec(name="c", poll_interval=0.05), _LaggingTransport(squeue, first), lambda _p: None)
    return host, str(log), str(status)


@pytest.mark.parametrize("first", [0, 100])  # the follower read nothing / stopped mid-line
async def test_watch_yields_the_whole_log_before_the_exit_when_the_follower_lags(tmp_path: Path, first: int) -> None:
    from servefleet.hosts.watch import Exited

    host, log, status = _ended_job(tmp_path, "COMPLETED", _OOM_LOG, "137", first)
    items = [item async for item in host.watch(log, len(_MARKER), pgid=7, status_path=status)]
    assert b"".join(i for i in items if isinstance(i, bytes)) == _OOM_LOG  # every byte, once, in order
    assert items[-1] == Exited(137, killed=False, note="Slurm job 7 ended COMPLETED")


@pytest.mark.parametrize(
    ("state", "body", "code", "category", "words"),
    [
        # The CI flake: the job ended (COMPLETED, the launcher's SIGKILL of itself: 137) before the
        # follower read the cause; the verdict must come from the log, not from the exit code.
        ("COMPLETED", _OOM_LOG, "137", "gpu_oom", "Not enough memory"),
        # A scheduler end state that alone means killed does not overrule the log's cause either.
        ("CANCELLED", _OOM_LOG, None, "gpu_oom", "Not enough memory"),
        # A log with no error: the scheduler's end state decides.
        ("TIMEOUT", _LOADING_LOG, None, "killed", "Slurm job 7 ended TIMEOUT (TimeLimit): it reached its time limit"),
    ],
)
async def test_the_jobs_log_decides_the_category_even_when_the_end_is_seen_first(
    tmp_path: Path, state: str, body: bytes, code: str | None, category: str, words: str
) -> None:
    from conftest import free_port
    from servefleet.engines.registry import get_engine
    from servefleet.verify.waiter import WaitTarget, wait_for_server

    host, log, status = _ended_job(tmp_path, state, body, code)
    target = WaitTarget(
        base_url=f"http://127.0.0.1:{free_port()}",
        engine=get_engine("sim"),
        host=host,
        log_path=log,
        log_offset=len(_MARKER),
        pgid=7,
        status_path=status,
        first_line_no=2,
    )
    verdict = await wait_for_server(target, timeout_s=30, stall_s=30, smoke=False)
    assert verdict.state.value == "failed"
    assert verdict.category is not None and verdict.category.value == category, verdict
    assert words in ((verdict.evidence.text if verdict.evidence else "") + (verdict.message or ""))


async def test_a_relay_that_cannot_resolve_its_target_closes_the_connection_and_logs_why(
    caplog: pytest.LogCaptureFixture,
) -> None:
    import asyncio
    import logging

    from servefleet.hosts.slurm_relay import Relay

    async def resolve() -> tuple[str, int] | None:
        raise ValueError("a garbled .where file")

    relay = Relay(resolve)
    port = await relay.start()
    try:
        with caplog.at_level(logging.DEBUG, logger="servefleet.hosts.slurm_relay"):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            assert await asyncio.wait_for(reader.read(), 5) == b""
            writer.close()
    finally:
        await relay.close()
    [record] = [r for r in caplog.records if r.name == "servefleet.hosts.slurm_relay"]
    assert "ValueError: a garbled .where file" in record.getMessage()
