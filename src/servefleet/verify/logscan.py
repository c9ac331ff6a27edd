"""The middle scan of a bounded read (``bounded``): at disk speed over the part of a big log
between its start-up and its end, find the lines that can decide a verdict.

One Aho-Corasick automaton finds the lines holding a block marker (``prefilter.marker_words``);
each is classified (``ShapeMatcher``: one kind of line, digits aside, is classified once), and
what matters since the last ready line is kept: the first fatal line, the first wrapper line, the
error lines, the last ready line and the last launch marker. Newlines are counted on the way, so
every kept line has its line number in the file. Once the first fatal line is known (or the
budget of kinds spent), a second automaton looks for ready and launch lines alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from servefleet.engines.base import EngineProfile, SignalKind
from servefleet.verify.classify import _EXCEPTION, ShapeMatcher
from servefleet.verify.diagnose import ATTEMPT_MARKER
from servefleet.verify.logtext import match_text
from servefleet.verify.prefilter import LAUNCH_MARKER, marker_words, spellings

if TYPE_CHECKING:
    from servefleet.verify.bounded import Bounds, ByteSource

__all__ = ["Scan", "Segment", "scan_middle"]


@dataclass
class Segment:
    """What the middle scan keeps since the last ready line (reset by a ready or launch line)."""

    fatal: tuple[int, int] | None = None  # (offset, line number) of the first fatal line
    wrapper: tuple[int, int] | None = None
    exc_before_wrapper: tuple[int, int] | None = None
    last_exc: tuple[int, int] | None = None


@dataclass
class Scan:
    segment: Segment = field(default_factory=Segment)
    ready: tuple[int, int] | None = None
    launch: tuple[int, int] | None = None  # (offset after the marker line, its line number + 1)
    hits: int = 0
    classified: int = 0
    lines: int = 0  # newlines in the scanned part
    budget_spent: bool = False  # max_hits kinds of lines classified with no fatal line among them

    def full(self, bounds: Bounds) -> bool:
        """Whether any marker line can still matter (else only ready and launch lines can)."""
        return self.segment.fatal is None and self.classified < bounds.max_hits


class _Finder:
    """All marker hits in a buffer, by one Aho-Corasick automaton (ahocorasick_rs: leftmost-first,
    which lets it use its SIMD prefilter: GB/s on log text)."""

    def __init__(self, words: list[str]) -> None:
        import ahocorasick_rs as ac

        self.automaton = ac.BytesAhoCorasick([w.encode() for w in words], matchkind=ac.MATCHKIND_LEFTMOST_FIRST)

    def starts(self, buf: bytes | bytearray, pos: int, stop: int) -> list[int]:
        view = memoryview(buf)[pos:stop]
        return [pos + start for _, start, _ in self.automaton.find_matches_as_indexes(view)]


def _profile_words(profile: EngineProfile) -> tuple[list[str], list[str]]:
    """Spellings of the profile's ready and wrapper literals (marker extras), and of the ready ones alone."""
    extra: list[str] = []
    ready: list[str] = []
    for sig in profile.signatures:
        if sig.kind in (SignalKind.READY, SignalKind.WRAPPER):
            lits = spellings(sig.pattern)
            if lits:
                extra.extend(lits)
                if sig.kind is SignalKind.READY:
                    ready.extend(lits)
    return extra, ready


async def scan_middle(
    source: ByteSource, begin: int, end: int, first_line: int, profile: EngineProfile, bounds: Bounds, scan: Scan
) -> None:
    extra, ready_spellings = _profile_words(profile)
    # Once the first fatal line is known (or the budget spent) only a ready or launch line can
    # change the verdict: a second automaton looks for those alone (shutdown noise is full of "error").
    finders = (_Finder(marker_words(extra)), _Finder(sorted({*ready_spellings, LAUNCH_MARKER})))
    ready_words = sorted({w.lower() for w in ready_spellings})
    matcher = ShapeMatcher(profile.signatures)
    carry = b""  # a line cut by the previous chunk's end
    pos = begin
    line_base = first_line
    read_into = getattr(source, "read_into", None)  # a local file: one buffer for every chunk
    chunk = bytearray(bounds.chunk) if read_into is not None else None
    data: bytes | bytearray  # the shared chunk buffer, or what the source returned
    while pos < end or carry:
        want = min(bounds.chunk, end - pos)
        if pos >= end:
            data, n = b"", 0
        elif read_into is not None and chunk is not None:
            data, n = chunk, await read_into(pos, memoryview(chunk)[:want])
        else:
            data = await source.read(pos, want)
            n = len(data)
        pos += n
        last = pos >= end or n == 0  # the part ends at a line start (the tail's): nothing to carry
        if carry:  # finish the cut line first, in a small buffer (the chunk itself is never copied)
            nl = data.find(b"\n", 0, n)
            if nl < 0 and not last and len(carry) + n < 2 * bounds.chunk:
                carry += bytes(data[:n])  # one long line so far: wait for its end
                continue
            cut = n if nl < 0 else nl + 1
            joined = carry + bytes(data[:cut])
            line_base = _scan_part(
                joined, 0, len(joined), pos - n - len(carry), line_base, finders, matcher, ready_words, bounds, scan
            )
            carry, begin_at = b"", cut
        else:
            begin_at = 0
        stop = n if last else data.rfind(b"\n", begin_at, n) + 1
        if stop <= begin_at and not last:  # no line end in the rest of the chunk
            carry = bytes(data[begin_at:n])
            continue
        line_base = _scan_part(data, begin_at, stop, pos - n, line_base, finders, matcher, ready_words, bounds, scan)
        carry = bytes(data[stop:n])
        if n == 0:
            break


def _scan_part(
    buf: bytes | bytearray,
    begin: int,
    stop: int,
    offset: int,
    line_base: int,
    finders: tuple[_Finder, _Finder],
    matcher: ShapeMatcher,
    ready_words: list[str],
    bounds: Bounds,
    scan: Scan,
) -> int:
    """Scan the whole lines ``buf[begin:stop]`` (``buf[0]`` is at file offset ``offset``); the line number after them."""
    _scan_chunk(buf, begin, stop, offset, line_base, finders, matcher, ready_words, bounds, scan)
    newlines = buf.count(b"\n", begin, stop)
    scan.lines += newlines
    return line_base + newlines


def _scan_chunk(
    buf: bytes | bytearray,
    begin: int,
    stop: int,
    offset: int,
    line_base: int,
    finders: tuple[_Finder, _Finder],
    matcher: ShapeMatcher,
    ready_words: list[str],
    bounds: Bounds,
    scan: Scan,
) -> None:
    at, at_line = begin, line_base  # a cursor, so that numbering the hits costs one pass over the chunk
    i = begin
    mode = scan.full(bounds)
    hits = finders[0 if mode else 1].starts(buf, begin, stop)
    k = 0
    while k < len(hits):
        hit = hits[k]
        k += 1
        if hit < i:
            continue  # another marker on a line already handled
        ls = max(buf.rfind(b"\n", begin, hit) + 1, begin)
        le = buf.find(b"\n", hit, stop)
        le = stop if le < 0 else le
        at_line += buf.count(b"\n", at, ls)
        at = ls
        _on_hit(buf[ls:le], offset + ls, at_line, le + 1 - ls, matcher, ready_words, bounds, scan)
        i = le + 1
        if scan.full(bounds) != mode and i < stop:  # the mode changed: look again from here
            mode = scan.full(bounds)
            hits, k = finders[0 if mode else 1].starts(buf, i, stop), 0


def _on_hit(
    raw_bytes: bytes | bytearray,
    offset: int,
    line_no: int,
    length: int,
    matcher: ShapeMatcher,
    ready_words: list[str],
    bounds: Bounds,
    scan: Scan,
) -> None:
    scan.hits += 1
    raw = raw_bytes.decode("utf-8", errors="replace").rstrip("\r")
    if raw.startswith("==== servefleet launch") and ATTEMPT_MARKER.match(raw):
        scan.segment = Segment()
        scan.ready = None
        scan.launch = (offset + length, line_no + 1)
        return
    seg = scan.segment
    text = match_text(raw)
    lowered = text.lower()
    if not scan.full(bounds) and not any(word in lowered for word in ready_words):
        return  # only a ready line can still change the verdict
    sig = matcher.match(text) if text else None
    if matcher.new_shape:  # the budget counts kinds of lines: a request error repeated a million times is one
        scan.classified += 1
        if scan.classified >= bounds.max_hits and seg.fatal is None:
            scan.budget_spent = True
    point = (offset, line_no)
    if sig is None:
        if text and _EXCEPTION.search(text):
            seg.last_exc = point
        return
    if sig.kind is SignalKind.READY:
        scan.segment = Segment()
        scan.ready = point
    elif sig.kind is SignalKind.FATAL and seg.fatal is None:
        seg.fatal = point
    elif sig.kind is SignalKind.WRAPPER and seg.wrapper is None:
        seg.wrapper = point
        seg.exc_before_wrapper = seg.last_exc
