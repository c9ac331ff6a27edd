"""Turning raw log bytes into lines a signature can match.

Engine logs are written by several processes at once, through terminals' habits: ANSI colour codes,
``\\r\\n`` and bare ``\\r`` (progress bars redrawn in place), and per-process prefixes that differ per
engine and version (``[2026-11-30 10:00:00 TP1]``, ``(EngineCore_DP0 pid=123)``, ``(VllmWorker rank=0
pid=5)``). Signatures are written against the message, so the prefixes go; level/timestamp headers
such as vLLM's ``INFO 11-30 10:00:00 [file.py:12]`` or uvicorn's ``INFO:`` stay, untouched, because
they carry meaning (ERROR vs WARNING) and signatures are searched, not anchored at the header.

Two shapes of text exist: the *display* text (ANSI codes and line endings gone, prefixes kept: the
evidence a person reads, with its rank) and the *match* text (prefixes stripped too).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

__all__ = [
    "strip_ansi",
    "display_text",
    "match_text",
    "strip_prefixes",
    "LineSplitter",
    "MAX_DISPLAY",
]

# CSI sequences (colours, cursor moves), OSC sequences (titles, hyperlinks) and two-byte escapes.
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-Z\\-_]")
# Other C0 control characters a log has no business carrying (tabs are kept).
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")

# Per-process prefixes, stripped (possibly stacked) from the start of a line:
#   vLLM / Ray:  "(EngineCore_DP0 pid=123) ", "(APIServer pid=1) ", "(VllmWorker rank=0 pid=5) ",
#                "(RayWorkerWrapper pid=77, ip=10.0.0.2) "  -- anything in parentheses naming a pid
#   SGLang:      "[2026-11-30 10:00:00 TP1] ", "[2026-11-30 10:00:00 DP0 TP3 EP3] ", "[TP0] ",
#                "[2026-11-30 10:00:00] " (the main process)
_PID_PREFIX = re.compile(r"^\([^()]*\bpid=\d+[^()]*\)\s*")
_RANKS = r"(?:(?:DP|TP|PP|EP|CP|MOE_EP|ATTN_TP|ATTN_DP|RANK)\s*\d+\s*)+"
_STAMP = r"\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?"
_RANK_PREFIX = re.compile(rf"^\[(?:{_STAMP}\s*(?:{_RANKS})?|{_RANKS})\]\s*")

MAX_DISPLAY = 2000  # characters of a line kept for evidence and excerpts


def strip_ansi(text: str) -> str:
    """Remove ANSI escape sequences and stray control characters."""
    if "\x1b" in text:
        text = _ANSI.sub("", text)
    return _CONTROL.sub("", text)


def _last_segment(line: str) -> str:
    """What a terminal would show for a line redrawn with bare ``\\r`` (a progress bar)."""
    line = line.rstrip("\r")
    if "\r" not in line:
        return line
    for segment in reversed(line.split("\r")):
        if segment.strip():
            return segment
    return ""


def display_text(raw: str) -> str:
    """The line as a person should read it: ANSI codes and line endings gone, prefixes kept."""
    text = strip_ansi(_last_segment(raw.rstrip("\n"))).rstrip()
    if len(text) > MAX_DISPLAY:
        text = text[: MAX_DISPLAY - 3] + "..."
    return text


def strip_prefixes(text: str) -> str:
    """Remove stacked per-process prefixes from an already ANSI-free line."""
    while True:
        stripped = _PID_PREFIX.sub("", text, count=1)
        stripped = _RANK_PREFIX.sub("", stripped, count=1)
        if stripped == text:
            return text
        text = stripped


def match_text(raw: str) -> str:
    """The line signatures are searched in: display text without per-process prefixes.

    Unlike the display text it is not shortened: a cause can sit at the end of a long line."""
    text = strip_ansi(_last_segment(raw.rstrip("\n"))).strip()
    return strip_prefixes(text)


@dataclass
class LineSplitter:
    """Incremental splitter of byte chunks into complete lines.

    A partial last line is held back until its newline arrives (or ``flush`` at the end), so a
    line is never matched half-written. Lines are split on ``\\n`` only (``\\r\\n`` loses its
    ``\\r``; bare ``\\r`` stays inside the line for ``display_text``), which keeps line numbers equal
    to those of ``grep -n`` and editors. Bytes are decoded per complete line, so a UTF-8 character
    cut between two chunks is decoded whole.
    """

    max_pending: int = 256 * 1024
    _pending: bytearray = field(default_factory=bytearray)

    def feed(self, chunk: bytes) -> list[str]:
        self._pending += chunk
        if b"\n" not in chunk:
            self._trim()
            return []
        *complete, rest = bytes(self._pending).split(b"\n")
        self._pending = bytearray(rest)
        self._trim()
        return [_decode(line) for line in complete]

    def flush(self) -> list[str]:
        """The held-back partial line as a final line (the writer has exited), if any."""
        if not self._pending:
            return []
        line = _decode(bytes(self._pending))
        self._pending.clear()
        return [line]

    def reset(self) -> None:
        """Forget the partial line (the file was truncated or replaced)."""
        self._pending.clear()

    @property
    def pending(self) -> str:
        """The partial line as displayed now (e.g. a progress bar being redrawn)."""
        return display_text(_decode(bytes(self._pending[-4096:])))

    def _trim(self) -> None:
        # A progress bar redrawn with bare \r for minutes never ends its line: keep its last frame.
        if len(self._pending) > self.max_pending:
            cut = self._pending.rfind(b"\r", 0, len(self._pending) - 1)
            keep = self._pending[cut + 1 :] if cut >= 0 else self._pending[-self.max_pending // 2 :]
            self._pending = bytearray(keep[-self.max_pending // 2 :])


def _decode(data: bytes) -> str:
    return data.decode("utf-8", errors="replace").rstrip("\r")
