"""The coordinator process itself: its open-file limit and its garbage-collector settings."""

from __future__ import annotations

import gc
import json
import resource
import subprocess

import pytest

from conftest import SimProcess
from servefleet.generate import runner
from test_generate_sim import INSTANT_SIM, committed_ids, generate_argv, write_prompts


@pytest.fixture(scope="module")
def wide_sim(tmp_path_factory: pytest.TempPathFactory):
    log = tmp_path_factory.mktemp("sim") / "sim.log"
    proc = SimProcess(*INSTANT_SIM, "--max-running", "2048", log_path=log).start().wait_ready()
    yield proc
    proc.stop()


def _low_nofile(limit: int):
    def apply() -> None:
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
    return apply


def test_more_requests_in_flight_than_the_soft_open_file_limit_still_completes(wide_sim, tmp_path):
    """Every request in flight holds a socket: with a soft limit of 256 and 600 in flight, connects
    failed with EMFILE ("Too many open files") until generate raised the soft limit to the hard one."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2048:
        pytest.skip(f"hard open-file limit {hard} leaves no room to raise")
    n = 1500
    src = write_prompts(tmp_path / "in.jsonl", n)
    out = tmp_path / "out"
    argv = generate_argv(src, out, "--url", wide_sim.url, extra=("--concurrency", "600", "--max-attempts", "1"))
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=180, preexec_fn=_low_nofile(256))
    report = json.loads(proc.stdout)
    assert report["status"] == "complete", (report["status"], report.get("events"), proc.stderr[-2000:])
    assert report["failed"] == 0 and report["retries"] == 0
    assert sorted(committed_ids(out)) == sorted(f"p{i}" for i in range(n))
    assert any("open-file limit raised from 256" in e for e in report["events"]), report["events"]


def test_raise_open_files_limit_keeps_a_higher_soft_limit_and_reports_what_it_changed():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(128, soft), hard))
        changed = runner.raise_open_files_limit(cap=512)
        assert changed == (min(128, soft), min(512, hard) if hard != resource.RLIM_INFINITY else 512)
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == changed[1]
        assert runner.raise_open_files_limit(cap=256) is None  # never lowered
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_fewer_collections_restores_the_settings_when_the_last_overlapping_run_ends():
    before = gc.get_threshold()
    a, b = runner.fewer_collections(), runner.fewer_collections()
    a.__enter__()
    assert gc.get_threshold() == runner.GC_THRESHOLDS and gc.get_freeze_count() > 0
    b.__enter__()
    a.__exit__(None, None, None)  # overlapping, not nested: the first to start ends first
    assert gc.get_threshold() == runner.GC_THRESHOLDS and gc.get_freeze_count() > 0
    b.__exit__(None, None, None)
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0
