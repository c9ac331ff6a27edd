"""`servefleet diagnose` on the logs of real engine runs, kept in tests/fixtures/logs/real/ with their
verdicts in EXPECTED.json (scripts/record-real-engine-logs.py writes both from the scenarios of
tests/real_engines.py). No engine is needed: the signatures are checked against the engines' own
words even where the engines are not installed, and a new recording is one more case here."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from real_engines import EXPECTED, FIXTURES, LLAMACPP_HUGE_CTX, diagnose_logs
from servefleet.catalog import State
from servefleet.engines.registry import get_engine
from servefleet.verify.diagnose import diagnose_text
from servefleet.verify.events import LogLines
from servefleet.verify.logtext import LineSplitter
from servefleet.verify.machine import ReadinessMachine

RECORDED = sorted(EXPECTED)


def engine_of(name: str) -> str:
    """The engine a recording is named after: "vllm_kv_too_small.log" and "vllm026_h200_ready.log" -> "vllm"."""
    match = re.match(r"[a-z]+", name)
    assert match, name
    return match.group(0)


@pytest.fixture(scope="module")
def diagnosed() -> dict[str, tuple[int, dict[str, Any]]]:
    return diagnose_logs([FIXTURES / name for name in RECORDED])


def test_every_real_engine_has_recordings() -> None:
    assert {engine_of(name) for name in RECORDED} == {"vllm", "llamacpp", "sglang", "transformers"}


@pytest.mark.parametrize("name", RECORDED)
def test_diagnose_on_the_recorded_real_log(name: str, diagnosed: dict[str, tuple[int, dict[str, Any]]]) -> None:
    """The CLI with the engine auto-detected, then the library with the engine named, reach the recorded verdict."""
    want, engine = EXPECTED[name], engine_of(name)
    code, verdict = diagnosed[name]
    assert verdict["engine"] == (engine if want["detect"] else None)
    assert (verdict["state"], verdict["category"]) == (want["state"], want["category"]), verdict
    if want["evidence_substring"]:
        assert want["evidence_substring"] in verdict["evidence"]["text"]
    if want.get("hint_substring"):  # the hint names the engine's own flag or file
        assert want["hint_substring"] in verdict["hint"], verdict["hint"]
    for key, value in want.get("capacity", {}).items():
        assert verdict["capacity"][key] == value, key
    assert code == (1 if want["state"] == "failed" else 0)
    named = diagnose_text((FIXTURES / name).read_bytes().decode("utf-8", errors="replace"), get_engine(engine))
    assert (named.state.value, named.category.value if named.category else None) == (want["state"], want["category"])


def test_vllm_kv_failure_names_the_cause_above_the_wrappers() -> None:
    """The whole log: the engine core's ValueError, then its traceback again in the process's
    stderr, then the API server's "Engine core initialization failed. See root cause above."."""
    lines = (FIXTURES / "vllm_kv_too_small.log").read_text(errors="replace").splitlines()
    verdict = diagnose_text("\n".join(lines), get_engine("vllm"))
    wrapper = max(i for i, line in enumerate(lines, 1) if "Engine core initialization failed" in line)
    assert verdict.evidence is not None and verdict.evidence.line_no < wrapper
    assert lines[verdict.evidence.line_no - 1].startswith("(EngineCore")


def test_llamacpp_kv_failure_is_the_first_allocation_error() -> None:
    """ggml's "insufficient memory" comes first; "failed to allocate buffer for kv cache" and
    llama-cpp-python's "ValueError: Failed to create llama_context" follow it."""
    lines = (FIXTURES / "llamacpp_kv_too_small.log").read_text(errors="replace").splitlines()
    verdict = diagnose_text("\n".join(lines), get_engine("llamacpp"))
    later = max(i for i, line in enumerate(lines, 1) if "Failed to create llama_context" in line)
    assert verdict.evidence is not None and verdict.evidence.line_no < later
    assert verdict.capacity.context_length == LLAMACPP_HUGE_CTX


@pytest.mark.parametrize("name", [n for n in RECORDED if EXPECTED[n]["state"] in ("ready", "loading")])
def test_live_machine_does_not_fail_a_healthy_real_log(name: str) -> None:
    """`up` and `wait` judge a start-up line by line as it is written: a notice in a healthy log (SGLang
    0.5.17's "OpenAI Responses API (/v1/responses) disabled: ... init failed (ModuleNotFoundError ...)")
    must not end it as failed while the process still runs."""
    data = (FIXTURES / name).read_bytes()
    machine = ReadinessMachine(None, now=0.0, log_path=str(FIXTURES / name), smoke=False)
    splitter = LineSplitter()
    lines = splitter.feed(data) + splitter.flush()
    machine.feed(LogLines(tuple(lines)), 0.001)
    assert machine.verdict(0.002).state is not State.FAILED, machine.verdict(0.002)


HELDOUT = FIXTURES / "heldout"
HELDOUT_EXPECTED = json.loads((HELDOUT / "EXPECTED.json").read_text()) if (HELDOUT / "EXPECTED.json").exists() else {}


@pytest.mark.parametrize("name", sorted(HELDOUT_EXPECTED))
def test_diagnose_on_the_held_out_real_log(name: str) -> None:
    """The held-out recordings (labelled before they were first diagnosed; benchmarks/diagnose_accuracy.py
    --set heldout measured the rules on them before they were fixed on them): now diagnosed right too."""
    want = HELDOUT_EXPECTED[name]
    verdict = diagnose_text((HELDOUT / name).read_bytes().decode("utf-8", errors="replace"))
    assert verdict.engine == engine_of(name)
    assert (verdict.state.value, verdict.category.value if verdict.category else None) == (
        want["state"],
        want["category"],
    ), verdict
