"""The status batch's view of a host (fleet/prefetch.PrefetchedHost) passes the Host contract
through, method by method, and nothing else: an attribute the real host has but ``Host`` does not
declare is an AttributeError on the view, so code that starts to depend on one fails loudly
instead of silently going around the batch. The host's optional capabilities are found behind the
view by type (hosts/capabilities.py)."""

from __future__ import annotations

import signal
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import pytest

from servefleet.fleet.prefetch import PrefetchedHost
from servefleet.hosts.base import CommandResult, Host, Launched, PidStatus, PortHolder, Truncated, UnitHost
from servefleet.hosts.capabilities import batching_of, connecting_of, jobs_own_gpus, scheduler_of, units_of
from servefleet.hosts.questions import Answering, Size, ask


class RecordingHost:
    """A fake host: every call is recorded with its arguments and answered with a token of its own.
    Beyond ``Host`` it is a UnitHost, a Scheduler and a Batching host, and has an undeclared
    ``commands`` counter (as SSHHost does)."""

    name = "fake"
    launcher = "systemd-run"
    jobs_own_gpus = True
    commands = 0

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    def _record(self, method: str, *args: Any, **kwargs: Any) -> str:
        self.calls.append((method, args, kwargs))
        return f"<{method}>"

    async def run(
        self, argv: Sequence[str], *, timeout: float | None = None, check: bool = True, input: bytes | None = None
    ) -> CommandResult:
        self._record("run", argv, timeout=timeout, check=check, input=input)
        return CommandResult(tuple(argv), 0, "out", "")

    async def spawn_detached(
        self,
        argv: Sequence[str],
        *,
        log_path: str,
        status_path: str,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> int:
        self._record("spawn_detached", argv, log_path=log_path, status_path=status_path, env=env, cwd=cwd)
        return 41

    async def launch(
        self,
        argv: Sequence[str],
        *,
        log_path: str,
        status_path: str,
        marker: str,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> Launched:
        self._record("launch", argv, log_path=log_path, status_path=status_path, marker=marker, env=env, cwd=cwd)
        return Launched(pgid=42, log_offset=7, line_no=3)

    async def read_bytes(self, path: str, offset: int = 0, limit: int | None = None) -> bytes:
        self._record("read_bytes", path, offset, limit)
        return b"bytes"

    async def file_size(self, path: str) -> int | None:
        self._record("file_size", path)
        return 99

    async def _chunks(self, path: str, offset: int) -> AsyncIterator[bytes | Truncated]:
        self._record("follow", path, offset)
        yield b"line\n"
        yield Truncated(0)

    def follow(self, path: str, offset: int = 0) -> AsyncIterator[bytes | Truncated]:
        return self._chunks(path, offset)

    async def write_bytes(self, path: str, data: bytes, mode: int = 0o600) -> None:
        self._record("write_bytes", path, data, mode)

    async def remove(self, path: str) -> None:
        self._record("remove", path)

    async def group_alive(self, pgid: int) -> bool:
        self._record("group_alive", pgid)
        return True

    async def owns(self, group: int, marker: str) -> bool | None:
        self._record("owns", group, marker)
        return False

    async def command_line(self, pid: int) -> str | None:
        self._record("command_line", pid)
        return "sleep 60"

    async def pid_status(self, pid: int) -> PidStatus:
        self._record("pid_status", pid)
        return PidStatus("zombie", code=3)

    async def signal_group(self, pgid: int, signum: int) -> None:
        self._record("signal_group", pgid, signum)

    async def port_holder(self, port: int) -> PortHolder | None:
        self._record("port_holder", port)
        return PortHolder(pid=5, pgid=5)

    async def url_for(self, port: int, bind_host: str = "127.0.0.1") -> str:
        self._record("url_for", port, bind_host)
        return f"http://{bind_host}:{port}"

    async def close(self) -> None:
        self._record("close")

    # -- beyond Host: capabilities (found behind the view by type) and an undeclared attribute ----

    async def check_units(self) -> None:
        self._record("check_units")

    async def launch_unit(self, argv: Sequence[str], **kwargs: Any) -> Launched:
        self._record("launch_unit", argv, **kwargs)
        return Launched(pgid=43, log_offset=0, line_no=1)

    async def stop_unit(self, unit: str, *, force: bool = False) -> None:
        self._record("stop_unit", unit, force=force)

    async def jobs(self, max_age: float | None = None) -> dict[str, Any]:
        return {}

    async def queued(self, job_id: int) -> str | None:
        return None

    async def ended(self, job_id: int) -> str | None:
        return None

    async def noticed(self, job_id: int, status_path: str) -> bool:
        return False

    async def remaining_s(self, job_id: int) -> float | None:
        return None

    async def batch(self, ops: Sequence[Any]) -> dict[Any, Any]:
        self._record("batch", list(ops))
        return {op: 1234 for op in ops}


async def test_every_host_method_goes_through_the_view_to_the_host() -> None:
    fake = RecordingHost()
    view: Host = PrefetchedHost(fake)
    assert isinstance(view, Host) and view.name == "fake"

    assert (await view.run(["true"], timeout=3.0, check=False, input=b"in")).stdout == "out"
    assert await view.spawn_detached(["a"], log_path="/l", status_path="/s", env={"K": "V"}, cwd="/w") == 41
    launched = await view.launch(["b"], log_path="/l", status_path="/s", marker="M", env=None, cwd=None)
    assert launched.pgid == 42
    assert await view.read_bytes("/f", 2, 5) == b"bytes"
    assert await view.file_size("/f") == 99
    assert [c async for c in view.follow("/f", 4)] == [b"line\n", Truncated(0)]
    await view.write_bytes("/f", b"data", 0o644)
    await view.remove("/f")
    assert await view.group_alive(42) is True
    assert await view.owns(42, "/l") is False
    assert await view.command_line(5) == "sleep 60"
    assert await view.pid_status(5) == PidStatus("zombie", code=3)
    await view.signal_group(42, signal.SIGTERM)
    assert await view.port_holder(8000) == PortHolder(pid=5, pgid=5)
    assert await view.url_for(8000, "::1") == "http://::1:8000"
    await view.close()

    assert fake.calls == [
        ("run", (["true"],), {"timeout": 3.0, "check": False, "input": b"in"}),
        ("spawn_detached", (["a"],), {"log_path": "/l", "status_path": "/s", "env": {"K": "V"}, "cwd": "/w"}),
        ("launch", (["b"],), {"log_path": "/l", "status_path": "/s", "marker": "M", "env": None, "cwd": None}),
        ("read_bytes", ("/f", 2, 5), {}),
        ("file_size", ("/f",), {}),
        ("follow", ("/f", 4), {}),
        ("write_bytes", ("/f", b"data", 0o644), {}),
        ("remove", ("/f",), {}),
        ("group_alive", (42,), {}),
        ("owns", (42, "/l"), {}),
        ("command_line", (5,), {}),
        ("pid_status", (5,), {}),
        ("signal_group", (42, signal.SIGTERM), {}),
        ("port_holder", (8000,), {}),
        ("url_for", (8000, "::1"), {}),
        ("close", (), {}),
    ]


@pytest.mark.parametrize("attribute", ["commands", "launcher", "launch_unit", "jobs_own_gpus", "queued", "batch"])
def test_an_attribute_host_does_not_declare_is_not_reachable_through_the_view(attribute: str) -> None:
    fake = RecordingHost()
    assert hasattr(fake, attribute)
    with pytest.raises(AttributeError):
        getattr(PrefetchedHost(fake), attribute)


def test_the_hosts_capabilities_are_found_behind_the_view_by_type() -> None:
    fake = RecordingHost()
    view = PrefetchedHost(fake)
    assert isinstance(view, Answering) and view.inner is fake
    # the view itself declares none of them ...
    assert not isinstance(view, UnitHost)
    # ... the helpers answer for the host behind it
    assert units_of(view) is fake and scheduler_of(view) is fake and batching_of(view) is fake
    assert connecting_of(view) is None  # the fake does not connect
    assert jobs_own_gpus(view) is True


async def test_a_question_the_batch_holds_is_not_asked_of_the_host() -> None:
    fake = RecordingHost()
    view = PrefetchedHost(fake)
    await view.prefetch([Size("/a")])
    assert await ask(view, Size("/a")) == 1234  # the batch's answer
    assert await ask(view, Size("/b")) == 99  # a miss: the host's own answer, counted
    assert [c[0] for c in fake.calls] == ["batch", "file_size"] and view.misses == [Size("/b")]
