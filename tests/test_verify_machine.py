"""The readiness state machine, driven by tables of events with a fake clock (no I/O)."""

from __future__ import annotations

import pytest

from servefleet.catalog import Category, State
from servefleet.verify.events import (
    LogGrew,
    LogLines,
    LogMissing,
    LogTruncated,
    ProbeOutcome,
    ProbeResult,
    ProcessExit,
    SmokeResult,
    Tick,
)
from servefleet.verify.machine import (
    SMOKE_GRACE_S,
    WRAPPER_GRACE_S,
    WRAPPER_MAX_S,
    ReadinessMachine,
    describe_exit,
    message_shape,
)
from test_verify_support import OtherToyEngine, ToyEngine

OOM = "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static."
REFUSED = ProbeResult(ProbeOutcome.REFUSED, detail="connection refused")
LOADING_503 = ProbeResult(ProbeOutcome.HTTP, 503, "/health", "GET /health -> 503")
OK = ProbeResult(ProbeOutcome.OK, 200, "/health", "GET /health -> 200")
WRONG = ProbeResult(
    ProbeOutcome.WRONG_IDENTITY, 200, "/health", "port 9 is held by pid 1 (process group 1), not by process group 5"
)


def lines(*text: str) -> LogLines:
    return LogLines(tuple(text))


def run(
    events, *, smoke=False, engine=None, stall_s=300.0, timeout_s=1800.0, log_path="/tmp/x.log", pgid=5, **kw
) -> ReadinessMachine:
    """Feed (time, event) pairs; stop at the first terminal state like the waiter does."""
    m = ReadinessMachine(
        engine if engine is not None else ToyEngine(),
        now=0.0,
        smoke=smoke,
        stall_s=stall_s,
        timeout_s=timeout_s,
        log_path=log_path,
        pgid=pgid,
        port=9,
        **kw,
    )
    for t, event in events:
        m.feed(event, t)
        if m.wants_smoke:
            m.smoke_started()
        if m.done:
            break
    return m


# (name, events, smoke, state, category, evidence line or None, exit code)
TABLE = [
    (
        "ready by probe",
        [(0.1, lines("Load weight begin")), (0.2, REFUSED), (0.3, OK)],
        False,
        State.READY,
        None,
        None,
        None,
    ),
    (
        "ready line alone is not ready",
        [(0.1, lines("Load weight begin", "The server is fired up and ready to roll!")), (0.2, REFUSED)],
        False,
        State.LOADING,
        None,
        None,
        None,
    ),
    (
        "fatal line fails at once",
        [(0.1, lines("Load weight begin", OOM)), (0.2, REFUSED)],
        False,
        State.FAILED,
        Category.GPU_OOM,
        2,
        None,
    ),
    (
        "fatal line wins over a later OK probe",
        [(0.1, lines(OOM)), (0.2, OK)],
        False,
        State.FAILED,
        Category.GPU_OOM,
        1,
        None,
    ),
    (
        "ready line before fatal (uvicorn trap)",
        [
            (
                0.1,
                lines(
                    "Uvicorn running", "The server is fired up and ready to roll!", "OSError: Address already in use"
                ),
            )
        ],
        False,
        State.FAILED,
        Category.PORT_IN_USE,
        3,
        None,
    ),
    (
        "exit 0 after a fatal line is failed",
        [(0.1, lines(OOM)), (0.2, ProcessExit(0))],
        False,
        State.FAILED,
        Category.GPU_OOM,
        1,
        None,
    ),
    (
        "exit 137 without a line is killed",
        [(0.1, lines("Load weight begin")), (0.5, ProcessExit(137))],
        False,
        State.FAILED,
        Category.KILLED,
        None,
        137,
    ),
    ("exit -9 is killed", [(0.5, ProcessExit(-9))], False, State.FAILED, Category.KILLED, None, -9),
    (
        "group gone without a status file is killed",
        [(0.5, ProcessExit(None, killed=True))],
        False,
        State.FAILED,
        Category.KILLED,
        None,
        None,
    ),
    (
        "Killed line then exit 1",
        [(0.1, lines("Load weight begin", "Killed")), (0.2, ProcessExit(1))],
        False,
        State.FAILED,
        Category.KILLED,
        2,
        None,
    ),
    (
        "pid gone, code unknown, silent log is killed",
        [(0.1, lines("Load weight begin")), (0.5, ProcessExit(None, note="pid 7 is not a child"))],
        False,
        State.FAILED,
        Category.KILLED,
        None,
        None,
    ),
    (
        "pid gone, code unknown, an error line is other",
        [(0.1, lines("Load weight begin", "KeyError: 'rope'")), (0.5, ProcessExit(None))],
        False,
        State.FAILED,
        Category.OTHER,
        2,
        None,
    ),
    (
        "exit 1 without signature is other",
        [(0.1, lines("Load weight begin")), (0.2, ProcessExit(1))],
        False,
        State.FAILED,
        Category.OTHER,
        None,
        1,
    ),
    (
        "exit without signature uses the last error line",
        [(0.1, lines("Load weight begin", "KeyError: 'rope'")), (0.2, ProcessExit(1))],
        False,
        State.FAILED,
        Category.OTHER,
        2,
        1,
    ),
    ("exit 0 before ready is a failure", [(0.2, ProcessExit(0))], False, State.FAILED, Category.OTHER, None, 0),
    (
        "wrong identity then our exit is port_in_use",
        [(0.1, WRONG), (0.2, ProcessExit(1))],
        False,
        State.FAILED,
        Category.PORT_IN_USE,
        None,
        1,
    ),
    ("wrong identity while alive keeps waiting", [(0.1, WRONG), (0.2, WRONG)], False, State.LOADING, None, None, None),
    (
        "smoke ok makes ready",
        [(0.1, OK), (0.2, SmokeResult(True, "POST /v1/completions -> 200"))],
        True,
        State.READY,
        None,
        None,
        None,
    ),
    ("probe ok waits for the smoke", [(0.1, OK), (0.2, OK)], True, State.LOADING, None, None, None),
    (
        "smoke failure then fatal line: the line is the cause",
        [
            (0.1, OK),
            (0.2, SmokeResult(False, "server disconnected")),
            (0.25, lines("RuntimeError: CUDA out of memory")),
        ],
        True,
        State.FAILED,
        Category.GPU_OOM,
        1,
        None,
    ),
    (
        "smoke failure then exit without a line",
        [(0.1, OK), (0.2, SmokeResult(False, "HTTP 500")), (0.3, ProcessExit(1))],
        True,
        State.FAILED,
        Category.OTHER,
        None,
        1,
    ),
    (
        "smoke failure alone fails after the grace",
        [(0.1, OK), (0.2, SmokeResult(False, "HTTP 500")), (0.2 + SMOKE_GRACE_S, Tick())],
        True,
        State.FAILED,
        Category.OTHER,
        None,
        None,
    ),
    (
        "wrapper waits for a cause from a child",
        [(0.1, lines("Rank 0 scheduler is dead.")), (0.15, lines("[TP1] " + OOM))],
        False,
        State.FAILED,
        Category.GPU_OOM,
        2,
        None,
    ),
    (
        "wrapper alone fails after the grace",
        [(0.1, lines("Rank 0 scheduler is dead.")), (0.1 + WRAPPER_GRACE_S, Tick())],
        False,
        State.FAILED,
        Category.OTHER,
        None,
        None,
    ),
    (
        "wrapper blocks a ready probe",
        [(0.1, lines("Rank 0 scheduler is dead.")), (0.15, OK)],
        False,
        State.LOADING,
        None,
        None,
        None,
    ),
    (
        "wrapper then exit 137 is not killed: a child failed",
        [(0.1, lines("ValueError: bad", "Rank 0 scheduler is dead.")), (0.15, ProcessExit(137))],
        False,
        State.FAILED,
        Category.OTHER,
        1,
        137,
    ),
]


@pytest.mark.parametrize(
    ("name", "events", "smoke", "state", "category", "line_no", "exit_code"), TABLE, ids=[t[0] for t in TABLE]
)
def test_machine_table(name, events, smoke, state, category, line_no, exit_code) -> None:
    m = run(events, smoke=smoke)
    v = m.verdict(events[-1][0])
    assert v.state is state, v
    assert v.category == category
    assert (v.evidence.line_no if v.evidence else None) == line_no
    if exit_code is not None:
        assert v.exit_code == exit_code
    if state is State.FAILED:
        assert v.hint


def test_states_launching_then_loading() -> None:
    m = ReadinessMachine(ToyEngine(), now=0.0, log_path="/x")
    assert m.state is State.LAUNCHING
    m.feed(REFUSED, 0.1)
    assert m.state is State.LAUNCHING  # nothing answered, nothing written
    m.feed(LOADING_503, 0.2)
    assert m.state is State.LOADING
    m2 = ReadinessMachine(ToyEngine(), now=0.0, log_path="/x")
    m2.feed(LogGrew("Loading 10%"), 0.1)
    assert m2.state is State.LOADING and m2.verdict(0.1).last_line == "Loading 10%"


def test_stall_when_neither_log_nor_probe_moves() -> None:
    m = run([(0.1, lines("Load weight begin")), (0.2, REFUSED), (5.0, REFUSED), (10.0, Tick())], stall_s=10)
    assert m.state is State.LOADING
    m.feed(Tick(), 10.1)
    assert m.state is State.LOADING  # the first probe answer (0.2 s) was the last change
    m.feed(Tick(), 10.2)
    v = m.verdict(10.2)
    assert v.state is State.STALLED and v.message.startswith(
        "stalled: no log output and no change of the HTTP probe for 10s"
    )
    assert v.progress == "loading weights"


def test_visible_progress_is_not_a_stall() -> None:
    events = [(t / 2, lines(f"Loading shard {t}")) for t in range(1, 60)] + [(30.0, REFUSED), (30.1, Tick())]
    m = run(events, stall_s=5)
    assert m.state is State.LOADING


def test_probe_change_is_progress() -> None:
    m = run([(0.1, REFUSED), (4.0, LOADING_503), (8.0, LOADING_503), (8.5, Tick())], stall_s=5, log_path=None)
    assert m.state is State.LOADING
    m.feed(Tick(), 9.1)
    assert m.state is State.STALLED
    assert "no change of the HTTP probe" in m.verdict(9.1).message


def test_overall_timeout_is_stalled_with_message() -> None:
    events = [(t * 1.0, lines(f"progress {t}")) for t in range(1, 8)]
    m = run(events + [(7.5, Tick())], timeout_s=7.5, stall_s=100)
    v = m.verdict(7.5)
    assert v.state is State.STALLED and v.message.startswith("timed out after 7.5s")
    assert v.elapsed_s == 7.5


def test_missing_log_is_said_plainly_and_ends_in_stall() -> None:
    m = run([(0.0, LogMissing()), (0.1, REFUSED)], log_path="/no/such.log", stall_s=3)
    v = m.verdict(0.2)
    assert v.message == "log file /no/such.log does not exist (is the path right?)"
    m.feed(Tick(), 3.5)
    v = m.verdict(3.5)
    assert v.state is State.STALLED and "log file /no/such.log does not exist (is the path right?)" in v.message


def test_log_appearing_clears_the_message() -> None:
    m = run([(0.0, LogMissing()), (1.0, LogMissing(present=True)), (1.1, lines("Load weight begin"))])
    assert m.verdict(1.2).message is None


def test_silent_log_while_alive_is_said() -> None:
    m = run([(0.1, REFUSED), (12.0, REFUSED)], stall_s=100)
    assert "has not grown in 12s while the process lives" in m.verdict(12.0).message
    m2 = run([(0.1, lines("Load weight begin")), (15.0, REFUSED)], stall_s=100)
    assert "no new log output for 15s" in m2.verdict(15.0).message


def test_truncation_restarts_line_numbers() -> None:
    m = run([(0.1, lines("a", "b", "c")), (0.2, LogTruncated()), (0.3, lines("x", OOM))])
    v = m.verdict(0.3)
    assert v.state is State.FAILED and v.evidence.line_no == 2


def test_first_line_number_follows_the_offset() -> None:
    m = run([(0.1, lines("x", OOM))], first_line_no=41)
    assert m.verdict(0.1).evidence.line_no == 42


def test_engine_detected_from_the_log_reclassifies_history() -> None:
    # Before detection the union of the given engines applies; after it, the detected one's rules.
    m = ReadinessMachine(None, now=0.0, log_path="/x", engines=[OtherToyEngine(), ToyEngine()])
    m.feed(lines("booting", "Load weight begin"), 0.1)
    assert m.engine is None
    m.feed(lines("toy-engine v1 ready soon"), 0.2)
    assert m.engine is not None and m.engine.name == "toy"
    assert m.verdict(0.2).progress == "loading weights"
    m.feed(lines(OOM), 0.3)
    v = m.verdict(0.3)
    assert v.state is State.FAILED and v.engine == "toy" and v.evidence.line_no == 4


def test_lines_after_the_cause_fill_the_excerpt() -> None:
    m = run([(0.1, lines("a", "b", OOM))])
    assert m.done
    m.feed(lines("c", "d", "e", "f"), 0.2)  # drained by the waiter after the verdict
    v = m.verdict(0.2)
    assert v.excerpt == ["a", "b", OOM, "c", "d", "e"]
    assert v.elapsed_s == 0.1  # the verdict's time is the cause's


@pytest.mark.parametrize(
    ("code", "killed", "words"),
    [
        (1, False, "exited with code 1"),
        (0, False, "exited with code 0"),
        (137, False, "SIGKILL (exit code 137)"),
        (143, False, "SIGTERM (exit code 143)"),
        (-11, False, "SIGSEGV (exit code -11)"),
        (None, True, "killed (SIGKILL"),
        (None, False, "exit code unknown"),
    ],
)
def test_describe_exit(code, killed, words) -> None:
    assert words in describe_exit(code, killed)


def test_message_shape_ignores_ticking_numbers() -> None:
    assert message_shape("no new log output for 12s") == message_shape("no new log output for 13s")
    assert message_shape(None) is None


def test_wrapper_grace_extends_while_the_log_streams() -> None:
    frames = [(0.1 + 0.1 * i, lines(f'  File "x.py", line {i}')) for i in range(1, 15)]
    m = run([(0.1, lines("Rank 0 scheduler is dead."))] + frames + [(1.55, lines(OOM))])
    assert m.verdict(1.55).category is Category.GPU_OOM  # quiet gaps stayed under the grace
    endless = [(0.1 + 0.1 * i, lines(f"frame {i}")) for i in range(1, 40)]
    m = run([(0.1, lines("Rank 0 scheduler is dead."))] + endless)
    v = m.verdict(5.0)
    assert v.state is State.FAILED and v.category is Category.OTHER
    assert v.elapsed_s == pytest.approx(0.1 + WRAPPER_MAX_S, abs=0.11)


def test_a_terminal_verdict_does_not_carry_a_stale_live_message() -> None:
    m = run([(0.1, WRONG), (0.2, lines(OOM))])
    v = m.verdict(0.3)
    assert v.state is State.FAILED and v.category is Category.GPU_OOM
    assert v.message is None


def test_a_smoke_answer_after_a_wrapper_line_is_not_ready() -> None:
    m = run(
        [
            (0.1, OK),
            (0.15, lines("Rank 0 scheduler is dead.")),
            (0.2, SmokeResult(True, "200")),
            (0.2 + WRAPPER_GRACE_S, Tick()),
        ],
        smoke=True,
    )
    assert m.verdict(0.5).state is State.FAILED
