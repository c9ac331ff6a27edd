"""A chained traceback names its first exception first: the last-resort match on it ("JSONDecodeError: ...")
is provisional, and the recognised cause printed below it ("OSError: It looks like the config file at ...
is not a valid JSON file.") takes its place -- in `diagnose` and in the live machine alike. Not across a
wrapper or ready line, and not from far away."""

from __future__ import annotations

from pathlib import Path

from servefleet.catalog import Category, State
from servefleet.engines.registry import get_engine
from servefleet.verify.classify import PROVISIONAL_LINES
from servefleet.verify.diagnose import diagnose_text
from servefleet.verify.events import LogLines, ProcessExit, Tick
from servefleet.verify.logtext import LineSplitter
from servefleet.verify.machine import WRAPPER_GRACE_S, ReadinessMachine

REAL = Path(__file__).resolve().parent / "fixtures" / "logs" / "real" / "heldout" / "vllm_corrupt_config.log"
FIRST = "json.decoder.JSONDecodeError: Expecting property name enclosed in double quotes: line 1 column 60 (char 59)"
NAMED = "OSError: It looks like the config file at '/m/config.json' is not a valid JSON file."


def test_the_named_cause_below_a_chained_exception_is_the_diagnosis() -> None:
    verdict = diagnose_text(REAL.read_text(errors="replace"))
    assert verdict.category is Category.MODEL_NOT_FOUND, verdict
    assert verdict.evidence is not None and "is not a valid JSON file" in verdict.evidence.text


def test_the_live_machine_waits_for_the_named_cause() -> None:
    """Fed in small chunks while the process runs: it does not fail on the first exception line."""
    data = REAL.read_bytes()
    machine = ReadinessMachine(None, now=0.0, smoke=False)
    splitter, t = LineSplitter(), 0.0
    for i in range(0, len(data), 64):
        lines = splitter.feed(data[i : i + 64])
        if lines:
            machine.feed(LogLines(tuple(lines)), t)
            assert machine.verdict(t).category in (None, Category.MODEL_NOT_FOUND), machine.verdict(t)
    t += WRAPPER_GRACE_S + 0.05
    machine.feed(Tick(), t)
    verdict = machine.verdict(t)
    assert verdict.state is State.FAILED and verdict.category is Category.MODEL_NOT_FOUND, verdict


def test_an_unrecognised_exception_alone_fails_after_the_grace_or_at_exit() -> None:
    for end in ("tick", "exit"):
        machine = ReadinessMachine(get_engine("vllm"), now=0.0, smoke=False)
        machine.feed(LogLines(("Traceback (most recent call last):", FIRST)), 1.0)
        assert machine.verdict(1.0).state is not State.FAILED
        machine.feed(Tick() if end == "tick" else ProcessExit(1), 1.0 + WRAPPER_GRACE_S + 0.01)
        verdict = machine.verdict(1.0 + WRAPPER_GRACE_S + 0.01)
        assert (
            verdict.state is State.FAILED and verdict.category is Category.OTHER and FIRST in verdict.evidence.text
        ), end


def test_no_replacement_across_a_wrapper_or_from_far_away() -> None:
    vllm = get_engine("vllm")
    wrapped = diagnose_text(
        "\n".join([FIRST, "RuntimeError: Engine core initialization failed. See root cause above.", NAMED]), vllm
    )
    assert wrapped.evidence is not None and wrapped.evidence.text == FIRST
    far = diagnose_text("\n".join([FIRST, *(['  File "x.py", line 1, in f'] * PROVISIONAL_LINES), NAMED]), vllm)
    assert far.evidence is not None and far.evidence.text == FIRST
    near = diagnose_text(
        "\n".join([FIRST, "", "During handling of the above exception, another exception occurred:", NAMED]), vllm
    )
    assert near.category is Category.MODEL_NOT_FOUND and near.evidence is not None and near.evidence.text == NAMED
