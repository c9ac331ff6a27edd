"""A sound, cheap pre-filter for signature regexes: the literal text any match must contain.

Classifying a line runs every signature of a profile (60-150 regexes); patterns such as
``\\b\\w+ hit an exception`` cost tens of microseconds on a long line, so a 100,000-line log took
minutes. Most lines match nothing, and most patterns require some literal text (" hit an
exception", "Error"/"Exception", "ready to roll"). From the parsed regex we derive a set of strings
one of which must occur in every match (lower-cased, so the test also holds for case-insensitive
patterns); when none of them is in the lower-cased line the regex cannot match and is skipped.

The derivation only walks constructs whose content is certain to be in a match: literal runs of
the top-level concatenation, non-optional groups, every branch of an alternation, and repeats
with a minimum of one. Anything else ends a literal run. When no literal of at least
``MIN_LITERAL`` characters can be proven, the pattern is always run (never a false negative).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from typing import Any

try:  # Python 3.11+: the regex parser lives here (private but stable); sre_parse before
    from re import _constants as _c  # type: ignore[attr-defined]  # private module, absent from typeshed
    from re import _parser as _p  # type: ignore[attr-defined]  # private module, absent from typeshed
except ImportError:  # pragma: no cover
    import sre_constants as _c
    import sre_parse as _p

__all__ = [
    "required_literals",
    "may_match",
    "MIN_LITERAL",
    "BLOCK_MARKERS",
    "LAUNCH_MARKER",
    "spellings",
    "marker_words",
]

log = logging.getLogger(__name__)

MIN_LITERAL = 3
_REPEATS = {_c.MAX_REPEAT, _c.MIN_REPEAT} | ({_c.POSSESSIVE_REPEAT} if hasattr(_c, "POSSESSIVE_REPEAT") else set())
_CACHE: dict[int, tuple[re.Pattern[str], frozenset[str] | None]] = {}


def _required(items: Any) -> frozenset[str] | None:
    """Strings one of which every match of the sequence ``items`` contains (None: unknown)."""
    candidates: list[frozenset[str]] = []
    run: list[str] = []

    def flush() -> None:
        if run:
            candidates.append(frozenset(["".join(run)]))
            run.clear()

    for op, av in items:
        if op is _c.LITERAL:
            run.append(chr(av))
            continue
        flush()
        inner: frozenset[str] | None = None
        if op is _c.SUBPATTERN:
            inner = _required(av[-1])
        elif op is _c.BRANCH:
            parts = [_required(branch) for branch in av[1]]
            if parts and all(p is not None for p in parts):
                inner = frozenset().union(*(p for p in parts if p is not None))  # all are (checked above)
        elif op in _REPEATS and av[0] >= 1:
            inner = _required(av[2])
        if inner is not None:
            candidates.append(inner)
    flush()
    good = [c for c in candidates if c and min(len(s) for s in c) >= MIN_LITERAL]
    if not good:
        return None
    # The most selective: the set whose shortest string is longest.
    return max(good, key=lambda c: (min(len(s) for s in c), -len(c)))


def required_literals(pattern: re.Pattern[str]) -> frozenset[str] | None:
    """Lower-cased strings one of which any match of ``pattern`` contains, or None."""
    cached = _CACHE.get(id(pattern))
    if cached is not None and cached[0] is pattern:
        return cached[1]
    try:
        found = _required(_p.parse(pattern.pattern, pattern.flags))
    except Exception:  # an unusual construct: no pre-filter, the regex always runs
        log.debug("no pre-filter for %r", pattern.pattern, exc_info=True)
        found = None
    if found is not None:
        found = frozenset(s.lower() for s in found)
    _CACHE[id(pattern)] = (pattern, found)
    return found


def may_match(pattern: re.Pattern[str], lowered: str) -> bool:
    """False only when ``pattern`` certainly does not match the line (``lowered`` = line.lower())."""
    lits = required_literals(pattern)
    return lits is None or any(lit in lowered for lit in lits)


# ---- a bytes-level pre-filter for whole files (verify/bounded.py) ------------------------------
# Words that mark a fatal block in every engine's output: Python's traceback and exception lines,
# log levels (ERROR), process deaths and the wrappers' words, each in the spellings logs use.
# Classifying every line of a 1 GB log takes minutes; finding these in raw bytes with one
# Aho-Corasick automaton (SIMD-prefiltered) runs at disk speed, and only the lines that hold one
# (and the windows around the first fatal block) are then classified. Exact bytes, not
# case-folded: spellings outside these (e.g. "eRRor") are not markers.
BLOCK_MARKERS = (
    "rror",
    "RROR",
    "xception",
    "XCEPTION",
    "Traceback",
    "traceback",
    "TRACEBACK",
    "Killed",
    "killed",
    "KILLED",
    "fault",
    "Fault",
    "FAULT",
    "abort",
    "Abort",
    "ABORT",
    "ABRT",
    "fail",
    "Fail",
    "FAIL",
    "fatal",
    "Fatal",
    "FATAL",
    "Dead",
    "dead",
    "DEAD",
    "crash",
    "Crash",
    "CRASH",
    "out of memory",
    "Out of memory",
    "OUT OF MEMORY",
    "not enough",
    "Not enough",
    "NOT ENOUGH",
    "SIGQUIT",
    "sigquit",
    "SIGSEGV",
    "exiting due to",
)
LAUNCH_MARKER = "==== servefleet launch"


def spellings(pattern: re.Pattern[str]) -> frozenset[str] | None:
    """Strings one of which any match of ``pattern`` contains, as they appear in a log: exact
    for a case-sensitive pattern; lower, UPPER, Capitalised and Title spellings for one that
    ignores case. None when no literal can be proven."""
    try:
        found = _required(_p.parse(pattern.pattern, pattern.flags))
    except Exception:
        log.debug("no spellings for %r", pattern.pattern, exc_info=True)
        return None
    if found is None or not pattern.flags & re.IGNORECASE:
        return found
    return frozenset(v for lit in found for v in (lit.lower(), lit.upper(), lit.capitalize(), lit.title()))


def marker_words(extra: Iterable[str] = ()) -> list[str]:
    """The block markers, the launch marker, and those of ``extra`` (spellings of the profile's
    ready and wrapper literals) that no marker already finds."""
    words = set(BLOCK_MARKERS) | {LAUNCH_MARKER}
    for lit in extra:
        if not any(marker in lit for marker in BLOCK_MARKERS):
            words.add(lit)
    return sorted(words)
