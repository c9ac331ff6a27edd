"""Classifying log lines against an engine profile: pure, no I/O, no clock.

The rules (README "Failure categories", issue 2):

* the ROOT CAUSE is the first FATAL signature — tracebacks repeated per rank or child, and the
  wrapper lines printed after them, do not change it;
* a BENIGN signature shields its line (a warning that mentions an error is not one);
* WRAPPER lines ("Engine core initialization failed. See root cause above") confirm a failure but
  are never the diagnosis: they point above themselves;
* READY lines are evidence only (uvicorn can print "Application startup complete" before a fatal
  error); PROGRESS lines give the live label ("loading weights").

``LogClassifier`` is incremental (the live wait feeds it line by line); ``diagnose_text`` runs it
over a finished or partial log.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from servefleet.capacity import Capacity
from servefleet.catalog import DEFAULT_HINTS, Category
from servefleet.engines.base import FIRST_REQUEST, EngineProfile, MemoryPhases, SignalKind, Signature
from servefleet.engines.generic import FALLBACK
from servefleet.errors import EngineError
from servefleet.verify.logtext import display_text, match_text
from servefleet.verify.prefilter import required_literals
from servefleet.verify.startup_phases import Mark

log = logging.getLogger(__name__)

__all__ = [
    "Signal",
    "Finding",
    "LogClassifier",
    "AnyEngine",
    "available_engines",
    "detect_engine",
    "match_signature",
    "ShapeMatcher",
    "detect_texts",
    "EXCERPT_CONTEXT",
]

EXCERPT_CONTEXT = 3  # lines before and after the evidence

# Process-death lines any engine's log can end with (a shell or the C runtime prints them).
_GENERIC: tuple[Signature, ...] = (
    Signature.fatal(r"^(?:.*: line \d+: +\d+ )?Killed(?:\s|$)", Category.KILLED),
    Signature.fatal(
        r"^(?:.*: line \d+: +\d+ )?(?:Segmentation fault|Aborted|Bus error)(?: \(core dumped\))?\s*(?:\S.*)?$",
        Category.OTHER,
        hint="the server crashed in native code; read the excerpt, and try another engine version",
    ),
)
# A Python exception line ("ValueError: ...", "torch.OutOfMemoryError: ...") that no signature knows:
# the best evidence when a server dies without a recognised cause.
_EXCEPTION = re.compile(r"^(?:[A-Za-z_][\w]*\.)*[A-Z]\w*(?:Error|Exception|Exit|Interrupt|Failure)\b(?::|$)")


@dataclass(frozen=True)
class Signal:
    """One classified line."""

    line_no: int
    text: str  # display text
    kind: SignalKind
    category: Category | None = None
    hint: str | None = None
    label: str | None = None
    provisional: bool = False  # the last-resort "some exception" signature: a named cause below may replace it


# A chained traceback prints the first exception first ("JSONDecodeError: ...", then "During handling of
# the above exception ..." and "OSError: It looks like the config file ... is not a valid JSON file."): a
# last-resort match is replaced by a recognised cause that follows it within this many lines, before
# any wrapper or ready line.
PROVISIONAL_LINES = 200
_PROVISIONAL = frozenset(id(s) for s in FALLBACK)


@dataclass
class Finding:
    """A line worth reporting, with the lines around it (the *after* lines fill in as they come)."""

    signal: Signal
    before: list[tuple[int, str]]
    after: list[tuple[int, str]] = field(default_factory=list)
    phase: str | None = None  # a memory failure's start-up phase ("while profiling memory", ...)

    @property
    def excerpt(self) -> list[str]:
        return [t for _, t in self.before] + [self.signal.text] + [t for _, t in self.after]

    @property
    def excerpt_start(self) -> int:
        return self.before[0][0] if self.before else self.signal.line_no


def match_signature(text: str, signatures: Sequence[Signature]) -> Signature | None:
    """The signature a match-text line carries: BENIGN shields the line; otherwise the first match
    in the profile's declared order, then the generic process-death lines."""
    lowered = text.lower()
    hit: Signature | None = None
    for sig, lits, benign in _plan(signatures):
        if hit is not None and not benign:
            continue  # only a shield can still change the answer
        if lits is not None:  # the regex needs one of these strings: skip it when none is there
            for lit in lits:
                if lit in lowered:
                    break
            else:
                continue
        if sig.pattern.search(text):
            if benign:
                return sig
            hit = sig
    if hit is not None:
        return hit
    for sig, lits, _ in _plan(_GENERIC):
        if (lits is None or any(lit in lowered for lit in lits)) and sig.pattern.search(text):
            return sig
    return None


class ShapeMatcher:
    """``match_signature`` for many similar lines (a bounded scan's marker lines: the same request
    error a million times, only its numbers changing), with a cache keyed by the line's *shape*:
    every digit zeroed. A pattern whose text has no digit and no ``\\d`` treats all digits alike
    (\\w, ., \\S and negated classes do not tell 3 from 7), so its answer is the same for two lines of
    one shape and is cached; the few patterns that name digits ("signal 9", "[Errno 98]") run on
    every line. ``new_shape`` says whether the last line's shape was seen before."""

    _ZERO = str.maketrans("123456789", "000000000")
    _NAMES_DIGITS = re.compile(r"\d|\\d")

    def __init__(self, signatures: Sequence[Signature], max_shapes: int = 50_000) -> None:
        self.plan = _plan(signatures)
        blind = [i for i, (sig, _, _) in enumerate(self.plan) if not self._NAMES_DIGITS.search(sig.pattern.pattern)]
        self.blind = tuple(blind)
        self.sensitive = tuple(i for i in range(len(self.plan)) if i not in set(blind))
        self.max_shapes = max_shapes
        self.cache: dict[str, tuple[int | None, int | None]] = {}
        self.new_shape = False

    def _first(self, indices: tuple[int, ...], text: str, lowered: str) -> tuple[int | None, int | None]:
        """(first benign, first other) index among ``indices`` whose pattern matches."""
        hit = None
        for i in indices:
            sig, lits, benign = self.plan[i]
            if hit is not None and not benign:
                continue
            if lits is not None and not any(lit in lowered for lit in lits):
                continue
            if sig.pattern.search(text):
                if benign:
                    return i, hit
                hit = i
        return None, hit

    def match(self, text: str) -> Signature | None:
        lowered = text.lower()
        key = text.translate(self._ZERO)
        cached = self.cache.get(key)
        self.new_shape = cached is None
        if cached is None:
            if len(self.cache) >= self.max_shapes:
                self.cache.clear()
            cached = self.cache[key] = self._first(self.blind, text, lowered)
        live = self._first(self.sensitive, text, lowered)
        benigns = [i for i in (cached[0], live[0]) if i is not None]
        if benigns:
            return self.plan[min(benigns)][0]
        hits = [i for i in (cached[1], live[1]) if i is not None]
        if hits:
            return self.plan[min(hits)][0]
        for sig, lits, _ in _plan(_GENERIC):
            if (lits is None or any(lit in lowered for lit in lits)) and sig.pattern.search(text):
                return sig
        return None


_Plan = tuple[tuple[Signature, tuple[str, ...] | None, bool], ...]
_PLANS: dict[int, tuple[Sequence[Signature], _Plan]] = {}


def _plan(signatures: Sequence[Signature]) -> _Plan:
    """Each signature with the literals its regex requires (see ``prefilter``), computed once."""
    cached = _PLANS.get(id(signatures))
    if cached is not None and cached[0] is signatures:
        return cached[1]
    plan = tuple(
        (
            sig,
            tuple(lits) if (lits := required_literals(sig.pattern)) is not None else None,
            sig.kind is SignalKind.BENIGN,
        )
        for sig in signatures
    )
    _PLANS[id(signatures)] = (signatures, plan)
    return plan


class AnyEngine(EngineProfile):
    """Every known engine at once, for a log whose engine is not known (yet).

    Shields of every engine apply; a fatal line is the first match in engine order. Its hint is the
    engine's own only when every engine knows the line and gives it the same hint (the shared
    boundary cases); else the category's engine-neutral hint: one engine's advice (llama.cpp's flags for an
    out-of-memory line) misleads on a log of another engine."""

    name = "unknown"

    def __init__(self, engines: Sequence[EngineProfile] | None = None) -> None:
        self.engines = list(engines) if engines is not None else available_engines()
        hints: dict[tuple[str, int], set[str | None]] = {}
        known_by: dict[tuple[str, int], set[str]] = {}
        for engine in self.engines:
            for sig in engine.signatures:
                key = (sig.pattern.pattern, sig.pattern.flags)
                hints.setdefault(key, set()).add(sig.hint)
                known_by.setdefault(key, set()).add(engine.name)
        seen: set[tuple[str, int]] = set()
        sigs: list[Signature] = []
        for engine in self.engines:
            for sig in engine.signatures:
                key = (sig.pattern.pattern, sig.pattern.flags)
                if key in seen:
                    continue
                seen.add(key)
                shared = len(known_by[key]) == len(self.engines) and hints[key] == {sig.hint}
                if sig.category is not None and sig.hint is not None and not shared:
                    sig = dataclasses.replace(sig, hint=DEFAULT_HINTS[sig.category])
                sigs.append(sig)
        self.signatures = tuple(sigs)  # type: ignore[misc]  # instance value of a ClassVar
        self.memory_phases = MemoryPhases(  # type: ignore[misc]  # instance value of a ClassVar
            tuple(f for e in self.engines for f in e.memory_phases.frames),
            tuple(p for e in self.engines for p in e.memory_phases.progress),
        )

    def log_time(self, line: str) -> float | None:
        for engine in self.engines:
            found = engine.log_time(line)
            if found is not None:
                return found
        return None

    def capacity_from_line(self, line: str) -> Capacity | None:
        for engine in self.engines:
            found = engine.capacity_from_line(line)
            if found is not None:
                return found
        return None


def available_engines() -> list[EngineProfile]:
    """Every registered engine profile that imports (a missing optional module is skipped)."""
    from servefleet.engines.registry import engine_names, get_engine

    found = []
    for name in engine_names():
        try:
            found.append(get_engine(name))
        except (EngineError, ImportError, AttributeError) as exc:
            log.debug("engine profile %r not loadable, left out of auto-detection: %s", name, exc)
            continue
    return found


# Engines that are not the origin of a log when a real engine also matches: the simulated engine
# prints other engines' formats, and `openai` is any command at all.
_LAST_RESORT = ("openai",)


def detect_engine(
    lines: Iterable[str], engines: Sequence[EngineProfile] | None = None, max_lines: int = 5000
) -> EngineProfile | None:
    """The engine whose ``detect`` patterns match the most lines (match text) of a log, or None."""
    engines = list(engines) if engines is not None else available_engines()
    scores = {e.name: 0 for e in engines}
    for i, line in enumerate(lines):
        if i >= max_lines:
            break
        texts = detect_texts(line)
        for engine in engines:
            if any(p.search(t) for p in engine.detect for t in texts):
                scores[engine.name] += 1
    best: EngineProfile | None = None
    best_key = (0, 0)
    for engine in engines:
        key = (scores[engine.name], 0 if engine.name in _LAST_RESORT else 1)
        if key[0] > 0 and key > best_key:
            best, best_key = engine, key
    return best


def detect_texts(raw: str) -> tuple[str, ...]:
    """The forms of a line ``detect`` patterns are tried on: the match text, and the display text
    (per-process prefixes such as ``[2026-11-30 10:00:00 TP0]`` identify an engine too)."""
    match = match_text(raw)
    display = display_text(raw)
    return (match,) if display == match else (match, display)


class LogClassifier:
    """Feeds normalised lines through one engine profile and remembers what matters.

    ``first_fatal`` is the root cause of a live attempt; ``fatal_since_ready`` is the root cause of
    a finished log (a READY line after a failure means a later, successful attempt).
    """

    def __init__(self, profile: EngineProfile) -> None:
        self.profile = profile
        self.lines_seen = 0
        self.last_line_no = 0
        self.last_text: str | None = None
        self.first_fatal: Finding | None = None
        self.fatal_since_ready: Finding | None = None
        self.first_wrapper: Finding | None = None
        self.wrapper_since_ready: Finding | None = None
        self.last_exception: Finding | None = None  # unrecognised exception line (see _EXCEPTION)
        self.exception_before_wrapper: Finding | None = None
        self.ready_line: Signal | None = None
        self._marks_at = 0  # line of the last wrapper or ready line (a provisional cause is not replaced across one)
        self.progress: str | None = None
        self.capacity = Capacity()
        self._parser_failed = False  # a broken capacity parser is logged once, not on every line
        self._recent: deque[tuple[int, str]] = deque(maxlen=EXCERPT_CONTEXT)
        self._open: list[Finding] = []  # findings still collecting their *after* lines
        self._phase_hits: set[int] = set()  # memory_phases.frames seen since the last progress mark
        # start-up timing (startup_phases.py): the first mark of each progress label, and ready's
        self.marks: list[Mark] = []
        self.ready_mark: Mark | None = None
        self.last_log_s: float | None = None  # the engine's last timestamp before ready
        self.now: float | None = None  # set by a live reader: its clock, for the lines it feeds now

    def feed(self, line_no: int, raw: str) -> Signal | None:
        """Classify one raw line (ANSI codes, prefixes and all); return its signal, if any."""
        text = display_text(raw)
        match = match_text(raw)
        self.lines_seen += 1
        self.last_line_no = line_no
        if text:
            self.last_text = text
        for finding in self._open:
            finding.after.append((line_no, text))
        self._open = [f for f in self._open if len(f.after) < EXCERPT_CONTEXT]

        if text and self.ready_mark is None:
            stamp = self.profile.log_time(text)
            if stamp is not None:
                self.last_log_s = stamp
        if match and ('File "' in match or "memory" in match):  # a traceback frame, or an error naming its phase
            for k, (pattern, _) in enumerate(self.profile.memory_phases.frames):
                if pattern.search(match):
                    self._phase_hits.add(k)
        signal = None
        sig = match_signature(match, self.profile.signatures) if match else None
        if sig is not None and sig.kind is not SignalKind.BENIGN:
            hint = sig.hint or (DEFAULT_HINTS[sig.category] if sig.category else None)
            signal = Signal(
                line_no, text, sig.kind, sig.category, hint, sig.label, provisional=id(sig) in _PROVISIONAL
            )
            self._record(signal)
        elif sig is None and match and _EXCEPTION.search(match):
            self.last_exception = self._finding(
                Signal(line_no, text, SignalKind.FATAL, Category.OTHER, DEFAULT_HINTS[Category.OTHER])
            )

        if match:
            try:
                found = self.profile.capacity_from_line(match)
            except Exception:  # a parser bug must not break the verification loop
                if not self._parser_failed:
                    self._parser_failed = True
                    log.warning(
                        "%s: the capacity parser failed on log line %d", self.profile.name, line_no, exc_info=True
                    )
                found = None
            if found is not None:
                if not found.source:
                    found = found.model_copy(
                        update={"source": {k: f"log:{line_no}" for k in found.model_dump(exclude_defaults=True)}}
                    )
                self.capacity = found.merge(self.capacity)
        self._recent.append((line_no, text))
        return signal

    def gap(self) -> None:
        """Lines were skipped here (a bounded read of a big log): the lines before the gap are not
        the context of the lines after it, nor the reverse."""
        self._recent.clear()
        self._open = []

    def _record(self, signal: Signal) -> None:
        if signal.kind is SignalKind.FATAL:
            if self.first_fatal is None or self._replaces(self.first_fatal, signal):
                self.first_fatal = self._finding(signal)
            if self.fatal_since_ready is None or self._replaces(self.fatal_since_ready, signal):
                self.fatal_since_ready = (
                    self.first_fatal if self.first_fatal.signal is signal else self._finding(signal)
                )
            return
        if signal.kind in (SignalKind.WRAPPER, SignalKind.READY):
            self._marks_at = signal.line_no
        if signal.kind in (SignalKind.PROGRESS, SignalKind.READY):
            self._phase_hits.clear()
        if signal.kind is SignalKind.WRAPPER:
            if self.first_wrapper is None:
                self.first_wrapper = self._finding(signal)
                self.exception_before_wrapper = self.last_exception
            if self.wrapper_since_ready is None:
                self.wrapper_since_ready = (
                    self.first_wrapper if self.first_wrapper.signal is signal else self._finding(signal)
                )
        elif signal.kind is SignalKind.READY:
            if self.ready_mark is None:
                self.ready_mark = Mark("ready", signal.line_no, self.last_log_s, self.now)
            self.ready_line = signal
            self.fatal_since_ready = None
            self.wrapper_since_ready = None
            self.last_exception = None
        elif signal.kind is SignalKind.PROGRESS:
            self.progress = signal.label or self.progress
            if signal.label and self.ready_mark is None and (not self.marks or self.marks[-1].label != signal.label):
                self.marks.append(Mark(signal.label, signal.line_no, self.last_log_s, self.now))

    def _replaces(self, found: Finding, signal: Signal) -> bool:
        """Whether ``signal`` (a named cause) takes the place of a provisional ``found`` of the same traceback."""
        old = found.signal
        return (
            old.provisional
            and not signal.provisional
            and self._marks_at < old.line_no
            and signal.line_no - old.line_no <= PROVISIONAL_LINES
        )

    @property
    def cause_is_provisional(self) -> bool:
        """The root cause so far is only the last-resort match: a named cause may still follow it."""
        return self.first_fatal is not None and self.first_fatal.signal.provisional

    def _memory_phase(self) -> str | None:
        """The start-up phase of a memory failure at this line: the most specific phase its
        traceback names, else the log's ready line or the last progress label says."""
        phases = self.profile.memory_phases
        if self._phase_hits:
            return phases.frames[min(self._phase_hits)][1]
        if self.ready_line is not None:
            return FIRST_REQUEST
        return dict(phases.progress).get(self.progress or "")

    def _finding(self, signal: Signal) -> Finding:
        finding = Finding(signal, list(self._recent))
        if signal.category is Category.GPU_OOM:
            finding.phase = self._memory_phase()
        self._open.append(finding)
        return finding

    def best_unrecognised(self) -> Finding | None:
        """Evidence for a failure no signature names: the exception line just above the first
        wrapper line, else the last unrecognised exception line."""
        return self.exception_before_wrapper or self.last_exception
