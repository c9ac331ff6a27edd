"""Is this file a server log at all? ``diagnose`` is given any path: a README or a binary file must
not be diagnosed "failed: killed" or "loading" because one of its lines looks like a log's.

Pure: lines in, a reason out (None: it may be a log). Only asked when no engine was given, so a
log whose engine the user named is always classified.
"""

from __future__ import annotations

import re

__all__ = ["not_a_log"]

# Markdown structure no server prints: code fences and ATX headings ("## Usage").
_FENCE = re.compile(r"^\s{0,3}(?:```|~~~)")
_HEADING = re.compile(r"^#{1,6} \S")
_DOCUMENT_MARKS = 2  # two fences (one code block) or two headings
_BINARY_SHARE = 0.10  # control or undecodable characters beyond this share: not text


def not_a_log(lines: list[str]) -> str | None:
    """Why these lines are not a server log ("binary data", "a Markdown document"), or None."""
    text = "".join(lines)
    if text:
        odd = sum(1 for ch in text if ch == "\ufffd" or (ord(ch) < 32 and ch not in "\t\r\x1b"))
        if "\x00" in text or odd / len(text) > _BINARY_SHARE:
            return "binary data, not text"
    fences = sum(1 for line in lines if _FENCE.match(line))
    headings = sum(1 for line in lines if _HEADING.match(line))
    if fences >= _DOCUMENT_MARKS or headings >= _DOCUMENT_MARKS:
        return f"a Markdown document ({fences} code fence line(s), {headings} heading(s)), not a server's output"
    return None
