"""Diagnosing a log of any size in bounded time and memory.

A real vLLM log of a long job is a start-up (a few hundred KB), then millions of request and
metrics lines, then maybe a crash with its traceback at the end -- or a fatal block somewhere in the
middle followed by shutdown noise. A verdict needs three places of it: the start-up (engine,
capacity, progress), the first fatal block after the last ready line, and the end. So:

* a log (from ``start``, the current launch's first byte) of at most ``cap`` bytes is read whole;
* a bigger one: its first ``head`` and last ``tail`` bytes are read and classified. The part between
  is scanned at disk speed for block markers (``prefilter.marker_words``: error, exception,
  traceback, killed, ... and the profile's ready and wrapper words; one Aho-Corasick automaton over
  raw bytes, in ``logscan``), counting newlines on the way so that line numbers stay exact. Each
  line holding a marker is classified with the engine's signatures (at most ``max_hits`` kinds of
  lines, digits aside; after that only ready and launch lines are looked for), and windows around the first fatal line, the first wrapper
  line, the error lines and the last ready line since then are read and classified together with
  the head and the tail, in file order, with ``LogClassifier.gap`` between windows;
* the verdict's ``skipped`` says what was read: "read 2.1 MB of 1.0 GB: first 1 MB, ...".

Blind spot, said plainly: in the skipped middle, a fatal line with no marker word is seen only
inside the window of the first fatal line that has one (fatal blocks end in an exception line:
"...Error: ...", "Killed", "Segmentation fault"); a spelling outside ``BLOCK_MARKERS`` (e.g.
"eRRor") is no marker. The launch marker of servefleet's appended logs is a marker: the last one starts
the attempt, wherever it is.
"""

from __future__ import annotations

import os
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from servefleet.engines.base import EngineProfile
from servefleet.verify.classify import AnyEngine, LogClassifier, detect_engine
from servefleet.verify.diagnose import ATTEMPT_MARKER, diagnose_lines, split_lines, unknown_verdict, verdict_of
from servefleet.verify.logscan import Scan, scan_middle
from servefleet.verify.notalog import not_a_log
from servefleet.verify.verdict import Verdict

if TYPE_CHECKING:  # only annotations: a local diagnose loads neither the host layer nor asyncio
    from servefleet.hosts.base import Host

T = TypeVar("T")

__all__ = [
    "ByteSource",
    "FileSource",
    "HostSource",
    "Bounds",
    "LogWindow",
    "WindowRead",
    "diagnose_source",
    "diagnose_file",
    "read_big_log",
    "line_number_at",
    "human_bytes",
]

MiB = 1024 * 1024
FATAL_BEFORE = 16 * 1024  # bytes kept before the first fatal line (the traceback above it)
FATAL_AFTER = 64 * 1024  # ... and after it (ranks repeating it, the wrappers, the exit)
POINT = 4 * 1024  # each side of a ready, wrapper or error line kept for its excerpt


class ByteSource(Protocol):
    """Where the log's bytes come from: a local file, or a host's file."""

    async def size(self) -> int | None: ...

    async def read(self, offset: int, length: int) -> bytes: ...


class FileSource:
    """A local file, read with pread (no shared file position)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)

    async def size(self) -> int | None:
        try:
            return os.stat(self.path).st_size
        except FileNotFoundError:
            return None

    async def read_into(self, offset: int, view: memoryview) -> int:
        """Fill ``view`` from ``offset`` (fewer bytes at the end of the file): the scan reuses one buffer."""
        fd = os.open(self.path, os.O_RDONLY)
        try:
            got = 0
            while got < len(view):
                n = os.preadv(fd, [view[got:]], offset + got)
                if n == 0:
                    break
                got += n
            return got
        finally:
            os.close(fd)

    async def read(self, offset: int, length: int) -> bytes:
        fd = os.open(self.path, os.O_RDONLY)
        try:
            first = os.pread(fd, length, offset)
            if len(first) == length or not first:
                return first  # the usual case: one read, no copy
            out = bytearray(first)
            while len(out) < length:
                piece = os.pread(fd, length - len(out), offset + len(out))
                if not piece:
                    break
                out += piece
            return bytes(out)
        finally:
            os.close(fd)


class HostSource:
    """A file on any Host (``host.file_size`` / ``host.read_bytes``)."""

    def __init__(self, host: Host, path: str) -> None:
        self.host = host
        self.path = path

    async def size(self) -> int | None:
        return await self.host.file_size(self.path)

    async def read(self, offset: int, length: int) -> bytes:
        return await self.host.read_bytes(self.path, offset, length)


@dataclass(frozen=True)
class Bounds:
    """How much of a big log is read. Tests shrink these to take the bounded path on a few KB."""

    cap: int = 4 * MiB  # a log (from the start offset) up to this size is read whole
    head: int = 1 * MiB
    tail: int = MiB // 2  # the end: a crash's last lines (a first fatal line before it is found by the scan)
    chunk: int = 4 * MiB  # scan step of the middle
    max_hits: int = (
        5_000  # kinds (digits aside) of marker lines classified in the middle; then only ready/launch lines
    )


@dataclass
class _Window:
    start: int  # byte offsets, start at a line start
    end: int
    what: str
    line_no: int | None = None  # of the line at ``start``, when known
    anchor: tuple[int, int] | None = None  # (offset, line number) of a line inside, when start's is not known
    aligned: bool = True  # ``start`` is a line start (windows around a scanned line are not, at first)


def human_bytes(n: int) -> str:
    for unit, size in (("GB", 1024**3), ("MB", MiB), ("KB", 1024)):
        if n >= size:
            value = n / size
            return f"{value:.1f} {unit}" if value < 100 else f"{value:.0f} {unit}"
    return f"{n} B"


async def diagnose_file(
    path: str | os.PathLike[str], engine: EngineProfile | None = None, *, start: int = 0, bounds: Bounds = Bounds()
) -> Verdict:
    """``diagnose_source`` of a local file."""
    return await diagnose_source(FileSource(path), engine, start=start, bounds=bounds)


def diagnose_local_file(
    path: str | os.PathLike[str], engine: EngineProfile | None = None, *, start: int = 0, bounds: Bounds = Bounds()
) -> Verdict:
    """``diagnose_file`` without an event loop: a local file's reads never wait, so `servefleet
    diagnose` does not pay for starting asyncio (its start-up is part of the interface)."""
    return run_without_loop(diagnose_file(path, engine, start=start, bounds=bounds))


def run_without_loop(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine that never waits on I/O (a bare ``await asyncio.sleep(0)`` is fine) to its end."""
    try:
        while True:
            if coro.send(None) is not None:  # a future: this coroutine needs a real event loop
                coro.close()
                raise RuntimeError("the coroutine waited on I/O: run it with asyncio.run")
    except StopIteration as done:
        return done.value  # StopIteration.value is Any; it is the coroutine's T


async def diagnose_source(
    source: ByteSource, engine: EngineProfile | None = None, *, start: int = 0, bounds: Bounds = Bounds()
) -> Verdict:
    """The verdict of the log from byte ``start`` on (the current launch; 0: the whole file).
    Line numbers are the file's own. Raises FileNotFoundError when there is no log."""
    size = await source.size()
    if size is None:
        raise FileNotFoundError(getattr(source, "path", "log"))
    start = max(0, min(start, size))
    first_line = await line_number_at(source, start, bounds.chunk)
    span = size - start
    if span <= max(bounds.cap, bounds.head + bounds.tail):
        lines = split_lines((await source.read(start, span)).decode("utf-8", errors="replace"))
        return _renumbered(diagnose_lines(lines, engine), first_line - 1)
    read = await _read_windows(source, engine, start, size, first_line, bounds)
    if engine is None:
        reason = not_a_log([line for window in read.windows for line in window.lines])
        if reason is not None:
            return unknown_verdict(reason).model_copy(update={"skipped": read.skipped})
    clf = LogClassifier(read.profile if read.profile is not None else AnyEngine())
    for window in read.windows:
        if window.gap_before:
            clf.gap()
        for i, raw in enumerate(window.lines):
            clf.feed(window.line_no + i, raw)
    empty = not any(
        line.strip() for window in read.windows for line in window.lines
    )  # a launch marker as the last line
    return verdict_of(clf, read.profile, empty=empty, first=read.first_line - 1).model_copy(
        update={"skipped": read.skipped}
    )


@dataclass(frozen=True)
class LogWindow:
    """Lines of a bounded read: ``lines[0]`` is line ``line_no`` of the file; ``gap_before``: lines
    were skipped between the previous window and this one."""

    line_no: int
    lines: list[str]
    gap_before: bool


@dataclass(frozen=True)
class WindowRead:
    """What a bounded read kept of a big log, in file order, and what it says about the rest."""

    windows: list[LogWindow]
    profile: EngineProfile | None  # the engine detected from the start-up (or the one given)
    skipped: str
    first_line: int  # the attempt's first line
    end: int  # the offset just after the last complete line read (where a follower goes on)


async def read_big_log(
    source: ByteSource, engine: EngineProfile | None = None, *, start: int = 0, bounds: Bounds = Bounds()
) -> WindowRead | None:
    """The bounded read of the log from ``start``, or None when that part is small enough to be
    read whole (``cap``). For a live wait: catch up on a big log, then follow it from ``end``.
    A partial last line (still being written) is left to the follower."""
    size = await source.size()
    if size is None or size - start <= max(bounds.cap, bounds.head + bounds.tail):
        return None
    tail = await source.read(max(start, size - bounds.tail), bounds.tail)
    complete = size - (len(tail) - (tail.rfind(b"\n") + 1))  # the last complete line's end
    if complete - start <= max(bounds.cap, bounds.head + bounds.tail):
        return None
    first_line = await line_number_at(source, start, bounds.chunk)
    return await _read_windows(source, engine, start, complete, first_line, bounds)


def _renumbered(verdict: Verdict, shift: int) -> Verdict:
    """A verdict of lines numbered from 1, moved to the file's numbering."""
    if shift == 0:
        return verdict
    update: dict[str, object] = {}
    if verdict.evidence is not None:
        update["evidence"] = verdict.evidence.model_copy(update={"line_no": verdict.evidence.line_no + shift})
    if verdict.excerpt_start is not None:
        update["excerpt_start"] = verdict.excerpt_start + shift
    return verdict.model_copy(update=update)


async def line_number_at(source: ByteSource, offset: int, chunk: int = 4 * MiB) -> int:
    """1 + the newlines before ``offset`` (counted chunk by chunk: memory stays bounded)."""
    count, pos = 0, 0
    while pos < offset:
        data = await source.read(pos, min(chunk, offset - pos))
        if not data:
            break
        count += data.count(b"\n")
        pos += len(data)
    return count + 1


async def _read_windows(
    source: ByteSource, engine: EngineProfile | None, start: int, size: int, first_line: int, bounds: Bounds
) -> WindowRead:
    head_bytes = await source.read(start, bounds.head)
    head_end = start + (head_bytes.rfind(b"\n") + 1 or len(head_bytes))
    tail_from = size - bounds.tail
    tail_bytes = await source.read(tail_from, bounds.tail)
    cut = tail_bytes.find(b"\n")
    tail_start = tail_from + cut + 1 if 0 <= cut < len(tail_bytes) - 1 else tail_from
    tail_start = max(tail_start, head_end)
    head_lines = head_bytes[: head_end - start].count(b"\n")

    scan_profile = (
        engine
        if engine is not None
        else detect_engine(split_lines(head_bytes[: head_end - start].decode("utf-8", errors="replace")))
    )
    scan = Scan()
    middle_line = first_line + head_lines
    await scan_middle(source, head_end, tail_start, middle_line, scan_profile or AnyEngine(), bounds, scan)
    tail_line = middle_line + scan.lines

    # The last launch marker starts the attempt: in the tail, the middle, or the head.
    seg_start, seg_line = start, first_line
    tail_marker = _last_marker(tail_bytes[tail_start - tail_from :])
    head_marker = _last_marker(head_bytes[: head_end - start])
    if tail_marker is not None:
        seg_start = tail_start + tail_marker[0]
        seg_line = tail_line + tail_marker[1]
    elif scan.launch is not None:
        seg_start, seg_line = scan.launch
    elif head_marker is not None:
        seg_start, seg_line = start + head_marker[0], first_line + head_marker[1]

    windows: list[_Window] = []
    if seg_start < head_end:
        windows.append(_Window(seg_start, head_end, "start-up", seg_line))
    elif seg_start < tail_start:
        windows.append(_Window(seg_start, min(seg_start + bounds.head, tail_start), "start-up", seg_line))
    if seg_start < tail_start:
        seg = scan.segment
        if seg.fatal is not None:
            windows.append(_around(seg.fatal, FATAL_BEFORE, FATAL_AFTER, "first fatal block"))
        for point, what in (
            (scan.ready, "last ready line"),
            (seg.wrapper, "first wrapper line"),
            (seg.exc_before_wrapper, "error line"),
            (seg.last_exc, "last error line"),
        ):
            if (
                point is not None
                and point[0] >= seg_start
                and (seg.fatal is None or what in ("last ready line", "first wrapper line"))
            ):
                windows.append(_around(point, POINT, POINT, what))
    windows.append(
        _Window(max(tail_start, seg_start), size, "end", tail_line if seg_start <= tail_start else seg_line)
    )
    windows = _merged([w for w in windows if w.end > w.start], seg_start, size)

    # Read and classify the windows in file order.
    profile = engine
    texts: list[tuple[_Window, list[str]]] = []
    for w in windows:
        data = await _window_bytes(source, w, start, head_bytes, tail_from, tail_bytes)
        if w.line_no is None and w.anchor is not None:  # a window around a scanned line: number its first line
            w.line_no = w.anchor[1] - data[: w.anchor[0] - w.start].count(b"\n")
        texts.append((w, split_lines(data.decode("utf-8", errors="replace"))))
    if profile is None:  # the scan's guess, unless a later launch marker moved the start-up
        profile = (
            scan_profile if seg_start < head_end else ((detect_engine(texts[0][1]) if texts else None) or scan_profile)
        )
    kept: list[LogWindow] = []
    prev_end = None
    for w, lines in texts:
        kept.append(
            LogWindow(w.line_no if w.line_no is not None else 1, lines, prev_end is not None and w.start != prev_end)
        )
        prev_end = w.end
    read = sum(w.end - w.start for w in windows)
    return WindowRead(kept, profile, _skipped_words(windows, read, size - start, scan, bounds), seg_line, size)


def _around(point: tuple[int, int], before: int, after: int, what: str) -> _Window:
    offset, _ = point
    return _Window(max(0, offset - before), offset + after, what, anchor=point, aligned=offset - before <= 0)


def _merged(windows: list[_Window], seg_start: int, size: int) -> list[_Window]:
    """Sorted, overlapping windows joined, clipped to the attempt and the file."""
    out: list[_Window] = []
    for w in sorted(windows, key=lambda w: w.start):
        w.end = min(w.end, size)
        if w.start <= seg_start:
            w.start, w.aligned = seg_start, True
        if out and w.start <= out[-1].end:
            last = out[-1]
            if w.end > last.end:
                last.end = w.end
                if w.what not in last.what:
                    last.what += f" + {w.what}"
            continue
        out.append(w)
    return out


async def _window_bytes(source: ByteSource, w: _Window, start: int, head: bytes, tail_from: int, tail: bytes) -> bytes:
    """A window's bytes, cut to whole lines (from memory when it lies in the head or the tail)."""
    lo = w.start if w.aligned else w.start - 1  # one byte before: is the window's start a line start?
    if start <= lo and w.end <= start + len(head):
        data = head[lo - start : w.end - start]
    elif tail_from <= lo and w.end <= tail_from + len(tail):
        data = tail[lo - tail_from : w.end - tail_from]
    else:
        data = await source.read(lo, w.end - lo)
    if not w.aligned:  # around a scanned line: start at the first line start in the window
        lead = data.find(b"\n")
        lead = lead if 0 <= lead < (w.anchor[0] - lo if w.anchor else len(data)) else 0
        data = data[lead + 1 :]
        w.start = lo + lead + 1
        w.aligned = True
    cut = data.rfind(b"\n")
    if cut >= 0 and w.end < tail_from + len(tail):  # not the end of the file: drop a partial last line
        w.end = w.start + cut + 1
        data = data[: cut + 1]
    return data


def _last_marker(data: bytes) -> tuple[int, int] | None:
    """(offset after, newlines up to and including) the last launch marker line in ``data``."""
    pos = data.rfind(b"==== servefleet launch")
    while pos >= 0:
        line_start = data.rfind(b"\n", 0, pos) + 1
        end = data.find(b"\n", pos)
        end = len(data) if end < 0 else end + 1
        if line_start == pos and ATTEMPT_MARKER.match(
            data[line_start:end].decode("utf-8", errors="replace").rstrip("\r\n")
        ):
            return end, data.count(b"\n", 0, end)
        pos = data.rfind(b"==== servefleet launch", 0, pos)
    return None


def _skipped_words(windows: list[_Window], read: int, total: int, scan: Scan, bounds: Bounds) -> str:
    parts = []
    for w in windows:
        where = f", from line {w.line_no:,}" if w.line_no is not None else ""
        parts.append(f"{w.what} ({human_bytes(w.end - w.start)}{where})")
    words = f"read {human_bytes(read)} of {human_bytes(total)}: " + ", ".join(parts)
    words += f"; the rest was scanned for error, ready and launch lines ({scan.hits:,} found"
    if scan.budget_spent:
        words += f"; {bounds.max_hits:,} kinds of them classified, no fatal line among them, and after that only ready and launch lines were looked for"
    return words + ")"
