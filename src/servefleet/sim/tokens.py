"""A deterministic fake tokenizer and the text the sim "generates".

One token is a run of word characters or a single punctuation character (``\\w+|[^\\w\\s]``); the
same rule counts prompt tokens, answers ``/tokenize`` and -- because every generated token is a plain
word with a leading space -- re-counts the completion to exactly ``completion_tokens``.

Generated text is a slice of one precomputed string, so producing ``n`` tokens costs one slice, not
``n`` string operations (the instant mode relies on this).
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Sequence
from typing import Any

__all__ = ["count_tokens", "tokenize", "render_chat", "TextBank", "request_hash"]

_TOKEN = re.compile(r"\w+|[^\w\s]")
VOCAB_SIZE = 32000

# 64 plain words: each is exactly one token under _TOKEN.
_WORDS = (
    "the of and to in is was for on that with as by it at from his an were are which this be or has had "
    "one first new their after who also its two been they not but have into more time other some "
    "over only all years these may most such than when where many during then between both each "
    "through until"
).split()
assert len(_WORDS) == 64


def tokenize(text: str) -> list[str]:
    return _TOKEN.findall(text)


def count_tokens(text: str) -> int:
    return len(_TOKEN.findall(text))


def token_ids(text: str) -> list[int]:
    """Stable ids for ``/tokenize`` (crc32 of the token, folded into a 32k vocabulary)."""
    return [zlib.crc32(tok.encode()) % VOCAB_SIZE for tok in _TOKEN.findall(text)]


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # [{"type": "text", "text": ...}, {"type": "image_url", ...}]
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return str(content)


def render_chat(messages: Sequence[dict[str, Any]]) -> str:
    """A ChatML-like rendering of chat messages; its token count is the chat prompt's size."""
    parts = [f"<|im_start|>{m.get('role', 'user')}\n{_content_text(m.get('content'))}<|im_end|>\n" for m in messages]
    parts.append("<|im_start|>assistant\n")
    return "".join(parts)


def request_hash(text: str, seed: int, salt: int = 0) -> int:
    """A 32-bit hash of a prompt, mixed with the seed: drives output text and EOS length."""
    return zlib.crc32(text.encode("utf-8", "surrogatepass"), (seed * 2654435761 + salt) & 0xFFFFFFFF)


class TextBank:
    """Precomputed generated text: token ``i`` of a request starting at word ``s`` is ``" " + WORDS[(s+i) % 64]``.

    ``text(start, a, b)`` returns tokens ``[a, b)`` as one slice of a long string.
    """

    def __init__(self, max_tokens: int) -> None:
        n = max_tokens + len(_WORDS) + 1
        words = [" " + _WORDS[i % len(_WORDS)] for i in range(n)]
        self._text = "".join(words)
        offsets = [0] * (n + 1)
        pos = 0
        for i, w in enumerate(words):
            offsets[i] = pos
            pos += len(w)
        offsets[n] = pos
        self._off = offsets
        self.capacity = max_tokens

    def text(self, start: int, a: int, b: int) -> str:
        s = start % len(_WORDS)
        return self._text[self._off[s + a] : self._off[s + b]]
