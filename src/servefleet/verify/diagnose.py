"""Diagnosing a finished or partial log: pure text in, a Verdict out.

Used by ``servefleet diagnose`` on any server's log (not only ones servefleet launched) and by the
live state machine to turn its classifier's findings into a verdict.
"""

from __future__ import annotations

import re
from typing import Any

from servefleet.catalog import DEFAULT_HINTS, Category, State
from servefleet.engines.base import EngineProfile
from servefleet.verify.classify import AnyEngine, Finding, LogClassifier, detect_engine
from servefleet.verify.notalog import not_a_log
from servefleet.verify.startup_phases import phase_times
from servefleet.verify.verdict import Evidence, Verdict

__all__ = [
    "diagnose_text",
    "diagnose_lines",
    "verdict_of",
    "finding_fields",
    "split_lines",
    "last_attempt_start",
    "ATTEMPT_MARKER",
    "unknown_verdict",
]


def split_lines(text: str) -> list[str]:
    """Lines of a whole log (``\\n`` and ``\\r\\n``); a partial last line counts as a line."""
    if not text:
        return []
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return lines


# The fleet layer appends each launch attempt to the same log below this marker
# (servefleet.fleet.lifecycle.LAUNCH_MARKER): only the last attempt tells the server's state.
ATTEMPT_MARKER = re.compile(r"^==== servefleet launch .*====\s*$")
_ATTEMPT_MARKER = ATTEMPT_MARKER


def last_attempt_start(lines: list[str]) -> int:
    """Index of the first line of the last launch attempt in a servefleet-managed log (0 if none)."""
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith("==== servefleet launch") and _ATTEMPT_MARKER.match(lines[i].rstrip("\r")):
            return i + 1
    return 0


def finding_fields(finding: Finding, category: Category | None = None, hint: str | None = None) -> dict[str, Any]:
    """Verdict fields for a finding: category, evidence, hint and the excerpt around it."""
    sig = finding.signal
    cat = category or sig.category or Category.OTHER
    return {
        "category": cat,
        "evidence": Evidence(line_no=sig.line_no, text=sig.text),
        "hint": hint or sig.hint or DEFAULT_HINTS[cat],
        "excerpt": finding.excerpt,
        "excerpt_start": finding.excerpt_start,
        "phase": finding.phase if cat is Category.GPU_OOM else None,
    }


def diagnose_text(text: str, engine: EngineProfile | None = None) -> Verdict:
    """Classify a whole log. ``engine`` None detects it from the log's own lines."""
    return diagnose_lines(split_lines(text), engine)


def diagnose_lines(lines: list[str], engine: EngineProfile | None = None) -> Verdict:
    """The verdict of a log given as raw lines (line 1 first).

    failed: a fatal signature after the last READY line (the first such is the root cause), or a
            wrapper line that says start-up failed without a recognised cause above it;
    ready:  a READY line with no failure after it (a log cannot prove the probe; it is the log's word);
    loading otherwise — a log alone cannot show a stall, which needs a clock;
    unknown (only when no engine was given): the file is not a server log (binary, a document), or
            no line of it is one any engine prints.
    """
    given = engine is not None
    if not given:
        reason = not_a_log(lines)
        if reason is not None:
            return unknown_verdict(reason)
        engine = detect_engine(lines)
    profile = engine if engine is not None else AnyEngine()
    clf = LogClassifier(profile)
    first = last_attempt_start(lines)
    for no, raw in enumerate(lines[first:], start=first + 1):
        clf.feed(no, raw)
    empty = not any(line.strip() for line in lines[first:])
    if not given and engine is None and not empty and not _saw_anything(clf):
        return unknown_verdict("no line of it is one a known engine prints (no engine, error, progress or ready line)")
    return verdict_of(clf, engine, empty=empty, first=first)


def unknown_verdict(reason: str) -> Verdict:
    """The outcome for a file that is not a recognised server log (`diagnose` exits 3 on it)."""
    return Verdict(
        state=State.UNKNOWN,
        message=f"not a recognised server log: {reason}",
        hint="give the server's log file (pass --engine NAME to classify it as that engine's log anyway)",
    )


def _saw_anything(clf: LogClassifier) -> bool:
    return (
        clf.fatal_since_ready is not None
        or clf.first_wrapper is not None
        or clf.ready_line is not None
        or clf.last_exception is not None
        or clf.progress is not None
        or bool(clf.capacity.model_dump(exclude_defaults=True))
    )


def verdict_of(clf: LogClassifier, engine: EngineProfile | None, *, empty: bool = False, first: int = 0) -> Verdict:
    """The verdict of a classifier that has been fed a log (whole, or the windows of a bounded read).
    ``empty``: the attempt has no output; ``first``: lines before the attempt (for the words)."""
    name = engine.name if engine is not None else None
    phases, clock = phase_times(clf.marks, clf.ready_mark)
    common: dict[str, Any] = {
        "engine": name,
        "progress": clf.progress,
        "capacity": clf.capacity,
        "last_line": clf.last_text,
        "startup_phases": phases,
        "startup_clock": clock,
    }

    if clf.fatal_since_ready is not None:
        return Verdict(state=State.FAILED, **common, **finding_fields(clf.fatal_since_ready))
    if clf.wrapper_since_ready is not None:
        wrapper = clf.wrapper_since_ready.signal
        said = f"line {wrapper.line_no} says start-up failed ({wrapper.text.strip()[:160]})"
        guess = clf.best_unrecognised()
        if guess is not None and guess.signal.line_no < wrapper.line_no:
            return Verdict(
                state=State.FAILED,
                message=f"{said}; no recognised cause above it, the nearest error line is shown",
                **common,
                **finding_fields(guess),
            )
        return Verdict(
            state=State.FAILED,
            category=Category.OTHER,
            hint=DEFAULT_HINTS[Category.OTHER],
            message=f"{said}, but no recognised cause is above it",
            excerpt=clf.first_wrapper.excerpt if clf.first_wrapper else [],
            excerpt_start=clf.first_wrapper.excerpt_start if clf.first_wrapper else None,
            **common,
        )
    if clf.ready_line is not None:  # the log's word for it (a live wait needs the probe's too)
        ready = clf.ready_line
        return Verdict(
            state=State.READY,
            evidence=Evidence(line_no=ready.line_no, text=ready.text),
            message="the log says ready (a log cannot prove it: `servefleet wait` asks the server)",
            **common,
        )
    if empty:
        said = "the log is empty" if first == 0 else f"the last launch attempt (after line {first}) has no output yet"
        return Verdict(
            state=State.LOADING, message=f"{said} (a server killed while importing can leave an empty log)", **common
        )
    message = None
    if clf.last_exception is not None:
        exc = clf.last_exception.signal
        message = f"no recognised failure or ready line; last error-like line {exc.line_no}: {exc.text.strip()[:160]}"
    return Verdict(state=State.LOADING, message=message, **common)
