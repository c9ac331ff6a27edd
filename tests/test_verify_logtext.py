"""Line normalisation and incremental splitting (servefleet.verify.logtext)."""

from __future__ import annotations

import pytest

from servefleet.verify.logtext import MAX_DISPLAY, LineSplitter, display_text, match_text, strip_ansi


@pytest.mark.parametrize(
    ("raw", "display", "match"),
    [
        # vLLM V1 process prefixes, coloured as on a terminal; the level header stays
        (
            "\x1b[1;36m(EngineCore_DP0 pid=123)\x1b[0;0m ERROR 11-30 10:00:00 [core.py:12] boom",
            "(EngineCore_DP0 pid=123) ERROR 11-30 10:00:00 [core.py:12] boom",
            "ERROR 11-30 10:00:00 [core.py:12] boom",
        ),
        (
            "(APIServer pid=1) INFO 11-30 10:00:00 [api_server.py:1] Starting",
            "(APIServer pid=1) INFO 11-30 10:00:00 [api_server.py:1] Starting",
            "INFO 11-30 10:00:00 [api_server.py:1] Starting",
        ),
        ("(VllmWorker rank=0 pid=5) INFO x", "(VllmWorker rank=0 pid=5) INFO x", "INFO x"),
        ("(RayWorkerWrapper pid=77, ip=10.0.0.2) hello", "(RayWorkerWrapper pid=77, ip=10.0.0.2) hello", "hello"),
        # stacked prefixes
        ("(APIServer pid=1) (EngineCore_DP0 pid=2) text", "(APIServer pid=1) (EngineCore_DP0 pid=2) text", "text"),
        # SGLang: timestamp + ranks, main process timestamp only, bare rank
        (
            "[2026-11-30 10:00:00 TP1] Load weight begin.",
            "[2026-11-30 10:00:00 TP1] Load weight begin.",
            "Load weight begin.",
        ),
        ("[2026-11-30 10:00:00 DP0 TP3 EP3] x", "[2026-11-30 10:00:00 DP0 TP3 EP3] x", "x"),
        ("[2026-11-30 10:00:00] main says", "[2026-11-30 10:00:00] main says", "main says"),
        ("[TP0] rank says", "[TP0] rank says", "rank says"),
        # not a prefix: brackets with other content stay
        ("[1, 2] is a list", "[1, 2] is a list", "[1, 2] is a list"),
        ("(no pid here) text", "(no pid here) text", "(no pid here) text"),
        # line endings and progress bars redrawn with bare \r: the last frame
        ("plain line\r", "plain line", "plain line"),
        ("Loading 10%\rLoading 50%\rLoading 100%\r", "Loading 100%", "Loading 100%"),
        (
            "\x1b[32mINFO\x1b[0m:     Uvicorn running on http://127.0.0.1:8000",
            "INFO:     Uvicorn running on http://127.0.0.1:8000",
            "INFO:     Uvicorn running on http://127.0.0.1:8000",
        ),
        ("", "", ""),
    ],
)
def test_display_and_match_text(raw: str, display: str, match: str) -> None:
    assert display_text(raw) == display
    assert match_text(raw) == match


def test_strip_ansi_handles_osc_and_controls() -> None:
    assert strip_ansi("\x1b]8;;http://x\x07link\x1b]8;;\x07 \x1b[2Kdone\x00") == "link done"


def test_display_text_is_capped_but_match_text_is_not() -> None:
    raw = "x" * (MAX_DISPLAY + 500) + " CUDA out of memory"
    assert len(display_text(raw)) == MAX_DISPLAY
    assert match_text(raw).endswith("CUDA out of memory")


def test_splitter_holds_partial_line_until_complete() -> None:
    s = LineSplitter()
    assert s.feed(b"first\nsec") == ["first"]
    assert s.pending == "sec"
    assert s.feed(b"ond") == []
    assert s.feed(b" line\r\nthird\n") == ["second line", "third"]
    assert s.pending == ""
    assert s.flush() == []


def test_splitter_mixed_endings_and_empty_lines() -> None:
    s = LineSplitter()
    assert s.feed(b"a\r\n\nb\n\r\nc") == ["a", "", "b", ""]
    assert s.flush() == ["c"]
    assert s.flush() == []


def test_splitter_decodes_utf8_cut_between_chunks() -> None:
    data = "température 100 °C\n".encode()
    s = LineSplitter()
    out = []
    for i in range(len(data)):  # one byte at a time
        out += s.feed(data[i : i + 1])
    assert out == ["température 100 °C"]


def test_splitter_reset_forgets_partial_line() -> None:
    s = LineSplitter()
    s.feed(b"half a li")
    s.reset()
    assert s.feed(b"new\n") == ["new"]


def test_splitter_trims_endless_progress_bar() -> None:
    s = LineSplitter(max_pending=1024)
    for i in range(500):
        s.feed(f"\rLoading {i:4d}/500".encode())
    assert s.pending.endswith("Loading  499/500")
    assert len(s._pending) <= 1024
    lines = s.feed(b"\n")
    assert len(lines) == 1 and display_text(lines[0]) == "Loading  499/500"
