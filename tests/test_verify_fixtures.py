"""The verify layer on the engines' hand-assembled real-format logs (tests/fixtures/logs/EXPECTED.json),
with the real engine profiles: `diagnose` (auto-detected and explicit engine) and the live state
machine fed the same log in byte chunks must agree."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servefleet.catalog import State
from servefleet.engines.registry import get_engine
from servefleet.verify.diagnose import diagnose_text
from servefleet.verify.events import LogLines, ProcessExit
from servefleet.verify.logtext import LineSplitter
from servefleet.verify.machine import ReadinessMachine

LOGS = Path(__file__).resolve().parent / "fixtures" / "logs"
EXPECTED = json.loads((LOGS / "EXPECTED.json").read_text()) if (LOGS / "EXPECTED.json").exists() else {}
pytestmark = pytest.mark.skipif(not EXPECTED, reason="no fixture logs")


def _check(verdict, want: dict) -> None:
    assert verdict.state.value == want["state"], verdict
    assert (verdict.category.value if verdict.category else None) == want["category"]
    assert verdict.evidence is not None and want["evidence_substring"] in verdict.evidence.text
    if want.get("hint_substring"):  # the hint names the engine's own flag or file
        assert verdict.hint is not None and want["hint_substring"] in verdict.hint, verdict.hint
    for key, value in want.get("capacity", {}).items():
        assert getattr(verdict.capacity, key) == value, key
    if "phase" in want:  # a memory failure names the start-up phase it happened in
        assert verdict.phase == want["phase"], verdict.phase


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_diagnose_auto_detects_engine(name: str) -> None:
    want = EXPECTED[name]
    verdict = diagnose_text((LOGS / name).read_bytes().decode("utf-8", errors="replace"))
    assert verdict.engine == want["engine"]
    _check(verdict, want)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_diagnose_with_explicit_engine(name: str) -> None:
    want = EXPECTED[name]
    _check(
        diagnose_text((LOGS / name).read_bytes().decode("utf-8", errors="replace"), get_engine(want["engine"])), want
    )


@pytest.mark.parametrize("chunk", [7, 4096])
@pytest.mark.parametrize("name", sorted(n for n, w in EXPECTED.items() if w["state"] == "failed"))
def test_live_machine_agrees_with_diagnose(name: str, chunk: int) -> None:
    """Fed in byte chunks (partial lines included), with the engine detected live, then the exit."""
    want = EXPECTED[name]
    data = (LOGS / name).read_bytes()
    machine = ReadinessMachine(None, now=0.0, log_path=str(LOGS / name), smoke=False)
    splitter = LineSplitter()
    t = 0.0
    for i in range(0, len(data), chunk):
        t += 0.001
        lines = splitter.feed(data[i : i + chunk])
        if lines:
            machine.feed(LogLines(tuple(lines)), t)
    rest = splitter.flush()
    if rest:
        machine.feed(LogLines(tuple(rest)), t)
    machine.feed(ProcessExit(1), t + 0.01)
    verdict = machine.verdict(t + 0.01)
    assert verdict.state is State.FAILED
    assert verdict.engine == want["engine"]
    expected = diagnose_text(data.decode("utf-8", errors="replace"))
    assert verdict.category == expected.category and verdict.evidence == expected.evidence
    assert verdict.phase == expected.phase == want.get("phase", expected.phase)
