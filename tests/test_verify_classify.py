"""Root-cause selection and log diagnosis, table-driven (servefleet.verify.classify / diagnose)."""

from __future__ import annotations

import logging

import pytest

from servefleet.capacity import Capacity
from servefleet.catalog import Category, State
from servefleet.engines.base import SignalKind
from servefleet.verify.classify import AnyEngine, LogClassifier, detect_engine, match_signature
from servefleet.verify.diagnose import diagnose_text, last_attempt_start, split_lines
from test_verify_support import OtherToyEngine, ToyEngine

TOY = ToyEngine()
OOM = "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static."


def diag(text: str):
    return diagnose_text(text, TOY)


# (name, log text, state, category, evidence line number or None, text the evidence must contain)
CASES = [
    (
        "oom after loading",
        "toy-engine v1\nLoad weight begin\n" + OOM + "\n",
        State.FAILED,
        Category.GPU_OOM,
        3,
        "Not enough memory",
    ),
    (
        "root cause before wrapper lines",
        "Load weight begin\nTraceback (most recent call last):\n  File x\n" + OOM + "\nRank 0 scheduler is dead.\n"
        "RuntimeError: Engine core initialization failed. See root cause above.\n",
        State.FAILED,
        Category.GPU_OOM,
        4,
        "Not enough memory",
    ),
    (
        "wrapper printed before the cause is flushed",
        "Load weight begin\nRank 0 scheduler is dead.\nTraceback:\nOSError: [Errno 98] Address already in use\n",
        State.FAILED,
        Category.PORT_IN_USE,
        4,
        "Address already in use",
    ),
    (
        "per-rank duplicates keep the first cause",
        "[2026-11-30 10:00:00 TP0] " + OOM + "\n[2026-11-30 10:00:00 TP1] " + OOM + "\n"
        "[2026-11-30 10:00:00 TP1] OSError: Address already in use\n",
        State.FAILED,
        Category.GPU_OOM,
        1,
        "TP0",
    ),
    (
        "ANSI colours and vLLM prefixes",
        "\x1b[1;36m(EngineCore_DP0 pid=12)\x1b[0;0m ERROR 11-30 10:00:00 [core.py:1] torch.OutOfMemoryError: CUDA out of memory.\n",
        State.FAILED,
        Category.GPU_OOM,
        1,
        "(EngineCore_DP0 pid=12) ERROR",
    ),
    (
        "CRLF line endings keep line numbers",
        "a\r\nb\r\nc\r\nModuleNotFoundError: No module named 'flashinfer'\r\n",
        State.FAILED,
        Category.IMPORT_ERROR,
        4,
        "flashinfer",
    ),
    (
        "partial last line still counts",
        "Load weight begin\nOSError: [Errno 98] Address already in use",
        State.FAILED,
        Category.PORT_IN_USE,
        2,
        "Errno 98",
    ),
    (
        "benign warnings are not failures",
        "WARNING: No module named 'vllm_flash_attn', falling back\nIgnore import error when loading sglang.srt.models.x: No module named 'y'\n"
        "Load weight begin\n",
        State.LOADING,
        None,
        None,
        None,
    ),
    (
        "ready line is the log's word for ready",
        "Load weight begin\nThe server is fired up and ready to roll!\n",
        State.READY,
        None,
        2,
        "ready to roll",
    ),
    (
        "a fatal after the ready line (uvicorn before the error) fails",
        "Uvicorn running\nThe server is fired up and ready to roll!\nOSError: [Errno 98] Address already in use\n",
        State.FAILED,
        Category.PORT_IN_USE,
        3,
        "Errno 98",
    ),
    (
        "a ready line after a failure is a later, successful attempt",
        OOM + "\nLoad weight begin\nThe server is fired up and ready to roll!\n",
        State.READY,
        None,
        3,
        "ready to roll",
    ),
    ("a shell's Killed line", "Load weight begin\nKilled\n", State.FAILED, Category.KILLED, 2, "Killed"),
    (
        "wrapper without a recognised cause: nearest error line is the evidence",
        "Load weight begin\nTraceback (most recent call last):\nValueError: head_dim 80 unsupported\nRank 0 scheduler is dead.\n",
        State.FAILED,
        Category.OTHER,
        3,
        "head_dim 80",
    ),
    ("still loading", "toy-engine v1\nLoad weight begin\nCapture cuda graph begin\n", State.LOADING, None, None, None),
]


@pytest.mark.parametrize(
    ("name", "text", "state", "category", "line_no", "contains"), CASES, ids=[c[0] for c in CASES]
)
def test_diagnose_table(
    name: str, text: str, state: State, category: Category | None, line_no: int | None, contains: str | None
) -> None:
    verdict = diag(text)
    assert verdict.state is state, verdict
    assert verdict.category == category
    if line_no is None:
        assert verdict.evidence is None
    else:
        assert verdict.evidence is not None and verdict.evidence.line_no == line_no
        assert contains in verdict.evidence.text
        assert "\x1b" not in verdict.evidence.text and "\r" not in verdict.evidence.text
        assert verdict.hint or state is State.READY


def test_wrapper_alone_is_failed_without_evidence_and_says_so() -> None:
    verdict = diag("Load weight begin\nRank 0 scheduler is dead.\n")
    assert verdict.state is State.FAILED and verdict.category is Category.OTHER
    assert verdict.evidence is None
    assert "line 2 says start-up failed" in (verdict.message or "")


def test_excerpt_has_three_lines_each_side() -> None:
    lines = [f"line {i}" for i in range(1, 11)]
    lines[5] = OOM  # line 6
    verdict = diag("\n".join(lines) + "\n")
    assert verdict.evidence is not None and verdict.evidence.line_no == 6
    assert verdict.excerpt == ["line 3", "line 4", "line 5", OOM, "line 7", "line 8", "line 9"]
    assert verdict.excerpt_start == 3


def test_excerpt_at_start_of_file() -> None:
    verdict = diag(OOM + "\nnext\n")
    assert verdict.excerpt == [OOM, "next"] and verdict.excerpt_start == 1


def test_progress_label_is_the_last_progress_line_and_capacity_is_read() -> None:
    verdict = diag("Load weight begin\nmax_total_num_tokens=4096, max_running_requests=8\nCapture cuda graph begin\n")
    assert verdict.progress == "capturing CUDA graphs"
    assert verdict.capacity.kv_cache_tokens == 4096
    assert verdict.capacity.max_running_requests == 8
    assert verdict.capacity.source["kv_cache_tokens"] == "log:2"


@pytest.mark.parametrize("text", ["", "\n\n", "   \n"])
def test_empty_log_is_said_plainly(text: str) -> None:
    verdict = diag(text)
    assert verdict.state is State.LOADING
    assert "empty" in (verdict.message or "")


def test_only_the_last_launch_attempt_counts() -> None:
    text = (
        "==== servefleet launch 2026-11-30T10:00:00 ====\n" + OOM + "\n"
        "==== servefleet launch 2026-11-30T10:05:00 ====\nLoad weight begin\n"
    )
    verdict = diag(text)
    assert verdict.state is State.LOADING and verdict.progress == "loading weights"
    assert last_attempt_start(split_lines(text)) == 3
    # the numbering is the file's
    failed = diag(text + "OSError: Address already in use\n")
    assert failed.evidence is not None and failed.evidence.line_no == 5


def test_unrecognised_exception_is_mentioned_while_loading() -> None:
    verdict = diag("Load weight begin\nKeyError: 'rope_scaling'\n")
    assert verdict.state is State.LOADING
    assert "line 2" in (verdict.message or "") and "rope_scaling" in (verdict.message or "")


def test_benign_shields_a_line_that_also_matches_a_fatal() -> None:
    sig = match_signature("Ignore import error when loading x: No module named 'y'", TOY.signatures)
    assert sig is not None and sig.kind is SignalKind.BENIGN


def test_classifier_first_fatal_vs_fatal_since_ready() -> None:
    clf = LogClassifier(TOY)
    clf.feed(1, OOM)
    clf.feed(2, "The server is fired up and ready to roll!")
    assert clf.first_fatal is not None and clf.first_fatal.signal.line_no == 1
    assert clf.fatal_since_ready is None
    clf.feed(3, "OSError: Address already in use")
    assert clf.fatal_since_ready is not None and clf.fatal_since_ready.signal.category is Category.PORT_IN_USE


def test_detect_engine_by_banner() -> None:
    engines = [TOY, OtherToyEngine()]
    assert detect_engine(["hello", "othertoy starting up"], engines).name == "othertoy"
    assert detect_engine(["\x1b[1m(APIServer pid=1) toy-engine v1\x1b[0m"], engines).name == "toy"
    assert detect_engine(["nothing known here"], engines) is None


def test_any_engine_unions_signatures() -> None:
    anyone = AnyEngine([TOY, OtherToyEngine()])
    clf = LogClassifier(anyone)
    clf.feed(1, "kaboom")
    assert clf.first_fatal is not None and clf.first_fatal.signal.category is Category.OTHER
    assert anyone.capacity_from_line("max_total_num_tokens=1, max_running_requests=2").kv_cache_tokens == 1


def test_shape_matcher_answers_as_match_signature_on_every_fixture_line() -> None:
    """ShapeMatcher caches by shape (digits zeroed) for the patterns that name no digit: on every
    fixture line, the same lines with other digits, and again (cached), it agrees with match_signature."""
    import random
    import re
    from pathlib import Path

    from servefleet.verify.classify import AnyEngine, ShapeMatcher, available_engines, match_signature
    from servefleet.verify.logtext import match_text

    logs = Path(__file__).resolve().parent / "fixtures" / "logs"
    texts = [
        match_text(line)
        for p in sorted(logs.rglob("*.log"))
        for line in p.read_bytes().decode("utf-8", "replace").splitlines()
    ]
    rnd = random.Random(7)
    varied = [re.sub(r"\d", lambda _: str(rnd.randint(0, 9)), t) for t in texts]
    varied += [
        "Exit code: -9",
        "Exit code: -1",
        "[Errno 98] Address in use",
        "[Errno 97] Address in use",
        "signal 9",
        "signal 7",
    ]
    for profile in [*available_engines(), AnyEngine()]:
        matcher = ShapeMatcher(profile.signatures)
        for text in texts + varied + texts:
            assert matcher.match(text) is match_signature(text, profile.signatures), (profile.name, text)
    assert len(texts) > 1000


def test_a_capacity_parser_that_raises_leaves_a_log_record_and_the_classifier_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class BrokenParser(ToyEngine):
        def capacity_from_line(self, line: str) -> Capacity | None:
            raise IndexError("no such group")

    clf = LogClassifier(BrokenParser())
    with caplog.at_level(logging.WARNING, logger="servefleet.verify.classify"):
        clf.feed(1, "max_total_num_tokens=4096, max_running_requests=8")
        clf.feed(2, "OSError: Address already in use")
    assert clf.capacity.is_empty()
    assert clf.first_fatal is not None and clf.first_fatal.signal.category is Category.PORT_IN_USE
    [record] = [r for r in caplog.records if r.name == "servefleet.verify.classify"]
    assert "line 1" in record.getMessage() and record.exc_info is not None and record.exc_info[0] is IndexError
