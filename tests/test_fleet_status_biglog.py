"""`status` of a server whose current attempt left a log longer than one read (DIAGNOSE_LIMIT):
its verdict comes from the bounded reader `diagnose` uses, so a crash at the end of a big log is
seen (a read of the first DIAGNOSE_LIMIT bytes alone calls it loading), with the file's own line
numbers, and a launch offset still keeps an earlier run's lines out."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from biglog import write_log
from servefleet.catalog import Category, State
from servefleet.engines.registry import get_engine
from servefleet.fleet import status as fleet_status
from servefleet.fleet.hosts import HostBinding
from servefleet.fleet.state import ServerState
from servefleet.hosts.local import LocalHost


def _record(log: Path, offset: int = 0) -> ServerState:
    return ServerState(
        fleet="f",
        name="a",
        engine="vllm",
        host="local",
        port=1,
        pgid=1,
        argv=[],
        log_path=str(log),
        status_path=str(log.with_suffix(".status")),
        log_offset=offset,
        launched_at=datetime.now(UTC),
        spec_hash="x",
    )


@pytest.fixture
def small_limit(monkeypatch: pytest.MonkeyPatch) -> int:
    limit = 256 * 1024  # the bounded path on a log of a few MB, as on a real one of gigabytes
    monkeypatch.setattr(fleet_status, "DIAGNOSE_LIMIT", limit)
    return limit


async def test_a_crash_at_the_end_of_a_big_attempt_is_diagnosed(tmp_path: Path, small_limit: int) -> None:
    big = write_log(tmp_path / "a.log", 6 * 1024 * 1024, "end")
    binding = HostBinding(name="local", host=LocalHost(), work_dir=str(tmp_path))
    verdict = await fleet_status.diagnose_attempt(binding, _record(big.path), get_engine("vllm"))
    assert (verdict.state, verdict.category) == (State.FAILED, Category.GPU_OOM), verdict
    assert verdict.evidence is not None and verdict.evidence.line_no >= big.fatal_line
    assert verdict.skipped  # it says what it did not read


async def test_a_small_attempt_after_a_big_earlier_run_is_read_from_its_offset(
    tmp_path: Path, small_limit: int
) -> None:
    big = write_log(tmp_path / "a.log", 2 * 1024 * 1024, "end")  # the earlier run crashed
    offset = big.path.stat().st_size
    with big.path.open("ab") as fh:  # this launch: a healthy start-up so far
        fh.write(b"INFO 12-01 09:00:00 [api_server.py:1] vLLM API server version 0.32.0\n")
    binding = HostBinding(name="local", host=LocalHost(), work_dir=str(tmp_path))
    verdict = await fleet_status.diagnose_attempt(binding, _record(big.path, offset), get_engine("vllm"))
    assert verdict.state is not State.FAILED, verdict


async def test_a_missing_log_is_no_verdict_of_failure(tmp_path: Path) -> None:
    binding = HostBinding(name="local", host=LocalHost(), work_dir=str(tmp_path))
    verdict = await fleet_status.diagnose_attempt(binding, _record(tmp_path / "none.log"), get_engine("vllm"))
    assert verdict.state is not State.FAILED


async def test_an_attempt_over_one_read_but_within_the_bounded_readers_cap_is_read_whole(
    tmp_path: Path, small_limit: int
) -> None:
    big = write_log(tmp_path / "a.log", 1024 * 1024, "end")  # over DIAGNOSE_LIMIT, under the bounded reader's cap
    binding = HostBinding(name="local", host=LocalHost(), work_dir=str(tmp_path))
    verdict = await fleet_status.diagnose_attempt(binding, _record(big.path), get_engine("vllm"))
    assert (verdict.state, verdict.category) == (State.FAILED, Category.GPU_OOM), verdict
    assert verdict.evidence is not None and verdict.evidence.line_no >= big.fatal_line
    assert verdict.skipped is None  # nothing was left out
