"""The job's input, streamed: JSONL (OpenAI batch format or the simple form) and Parquet.

Two accepted shapes of a record (one JSONL line, or one Parquet row):

* **OpenAI batch format** -- ``{"custom_id": "...", "method": "POST", "url": "/v1/chat/completions",
  "body": {"messages": [...], "max_tokens": 512, ...}}``; ``url`` chooses chat or completions (when
  absent, ``messages`` means chat and ``prompt`` means completions).
* **simple form** -- a request body with an id: ``{"id": "...", "prompt": "..."}`` or
  ``{"id": "...", "messages": [...], "temperature": 0.7}``. Every key but ``id`` is part of the body.

Records are numbered by *line* (1-based line number in a JSONL file, 1-based row number in a Parquet
file): rejects, failures and output rows all carry it, so a person can find the input again.

Nothing here holds the whole input: :func:`iter_raw` streams it, :func:`parse_object` judges one
record, and the pre-pass (:mod:`servefleet.generate.prepass`) keeps 8-byte hashes, not ids.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

from servefleet.generate.logprobs import request_fields

__all__ = [
    "Endpoint",
    "InputKind",
    "PromptRecord",
    "Reject",
    "RequestDefaults",
    "detect_kind",
    "iter_raw",
    "iter_pending",
    "input_stat",
    "file_sha256",
    "parse_object",
    "parse_raw",
    "ENDPOINT_PATHS",
    "N_BESIDE_SAMPLES",
]

Endpoint = Literal["chat", "completions"]
InputKind = Literal["jsonl", "parquet"]
Mode = Literal["auto", "chat", "completions"]

ENDPOINT_PATHS: dict[str, str] = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
_URL_ENDPOINTS: dict[str, Endpoint] = {
    "/v1/chat/completions": "chat",
    "/chat/completions": "chat",
    "/v1/completions": "completions",
    "/completions": "completions",
}
_MAX_ID_CHARS = 512
N_BESIDE_SAMPLES = "own 'n' beside --samples"  # a reject reason the runner turns into a refusal of the job
_EXCERPT_CHARS = 200


@dataclass(frozen=True)
class RequestDefaults:
    """What a record does not say itself: filled into the body when the key is absent."""

    max_tokens: int | None = None
    temperature: float | None = None
    mode: Mode = "auto"  # auto: messages -> chat, prompt -> completions
    token_ids: bool = False  # ask for output token ids (vLLM: return_token_ids)
    samples: int | None = None  # --samples K: a record's own `n` is refused (the job then stops: runner.py)
    logprobs: int | None = None  # --logprobs K: ask each answer's token logprobs with K alternatives (logprobs.py)
    prompt_logprobs: int | None = None  # --prompt-logprobs K: and the prompt's (prompt_logprobs.py)


@dataclass(frozen=True, slots=True)
class PromptRecord:
    """One valid request: its id, where it came from, which endpoint and the body (no model yet)."""

    line: int
    id: str
    endpoint: Endpoint
    body: dict[str, Any]
    sample: int | None = None  # --samples: the first sample this request answers (samples.py)
    choices: int = 1  # completions it asks for (n)


@dataclass(frozen=True, slots=True)
class Reject:
    """An input record that will not be sent, and why (written to the rejects file)."""

    line: int
    reason: str
    id: str | None = None
    text: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"line": self.line, "id": self.id, "reason": self.reason, "text": self.text}


def detect_kind(path: str) -> InputKind:
    """Parquet by suffix, JSONL otherwise."""
    return "parquet" if path.lower().endswith((".parquet", ".pq")) else "jsonl"


# ---- streaming ----------------------------------------------------------------------------------


def iter_raw(
    path: str,
    *,
    on_bytes: Callable[[bytes], None] | None = None,
    chunk_bytes: int = 4 << 20,
) -> Iterator[tuple[int, bytes | dict[str, Any]]]:
    """Yield ``(line, raw)`` for every record: the bytes of a JSONL line (no newline), or a Parquet
    row as a dict. ``on_bytes`` sees every byte of the file once (the pre-pass hashes it)."""
    if detect_kind(path) == "parquet":
        yield from _iter_parquet(path, on_bytes)
        return
    line = 0
    rest = b""
    with open(path, "rb") as f:
        while True:
            chunk = f.read(chunk_bytes)
            if not chunk:
                break
            if on_bytes is not None:
                on_bytes(chunk)
            parts = (rest + chunk).split(b"\n") if rest else chunk.split(b"\n")
            rest = parts.pop()
            for raw in parts:
                line += 1
                yield line, raw
    if rest:
        yield line + 1, rest


def iter_pending(
    path: str, skip: bytearray, skip_code: int = 1, chunk_bytes: int = 4 << 20
) -> Iterator[tuple[int, bytes | dict[str, Any]]]:
    """Like :func:`iter_raw`, but without the records whose ``skip[line - 1]`` is ``skip_code``.
    For JSONL a chunk whose lines are all skipped costs one count (resuming a job with 900,000
    of 1,000,000 lines done reaches the first pending line in a tenth of a second, not seconds)."""
    n = len(skip)
    if detect_kind(path) == "parquet":
        for line, record in _iter_parquet(path, None):
            if line > n or skip[line - 1] != skip_code:
                yield line, record
        return
    line = 0
    rest = b""
    with open(path, "rb") as f:
        while True:
            chunk = f.read(chunk_bytes)
            if not chunk:
                break
            data = rest + chunk if rest else chunk
            cut = data.rfind(b"\n")
            if cut < 0:
                rest = data
                continue
            rest = data[cut + 1 :]
            count = data.count(b"\n", 0, cut + 1)
            if line + count <= n and skip.count(skip_code, line, line + count) == count:
                line += count  # every line of this chunk is skipped
                continue
            for raw in data[: cut + 1].split(b"\n")[:-1]:
                line += 1
                if line > n or skip[line - 1] != skip_code:
                    yield line, raw
    if rest and (line + 1 > n or skip[line] != skip_code):
        yield line + 1, rest


def _iter_parquet(path: str, on_bytes: Callable[[bytes], None] | None) -> Iterator[tuple[int, dict[str, Any]]]:
    import pyarrow.parquet as pq

    if on_bytes is not None:  # the fingerprint covers the file's bytes, whatever its encoding
        with open(path, "rb") as f:
            while chunk := f.read(4 << 20):
                on_bytes(chunk)
    line = 0
    with pq.ParquetFile(path) as pf:
        for batch in pf.iter_batches(batch_size=2048):
            for row in batch.to_pylist():
                line += 1
                yield line, {k: v for k, v in row.items() if v is not None}


# ---- judging one record -------------------------------------------------------------------------


def parse_raw(line: int, raw: bytes | dict[str, Any], defaults: RequestDefaults) -> PromptRecord | Reject | None:
    """Judge one raw record. ``None`` for a blank line (skipped silently, not a reject)."""
    if isinstance(raw, dict):
        return parse_object(line, raw, defaults)
    stripped = raw.strip()
    if not stripped:
        return None
    try:
        obj = json.loads(stripped.decode("utf-8"))
    except UnicodeDecodeError as exc:
        return Reject(line, f"not UTF-8: {exc.reason} at byte {exc.start}", text=_excerpt(stripped))
    except ValueError as exc:
        return Reject(line, f"invalid JSON: {exc}", text=_excerpt(stripped))
    if not isinstance(obj, dict):
        return Reject(line, f"a record must be a JSON object, not {type(obj).__name__}", text=_excerpt(stripped))
    record = parse_object(line, obj, defaults)
    if isinstance(record, Reject) and not record.text:
        return Reject(record.line, record.reason, record.id, _excerpt(stripped))
    return record


def parse_object(line: int, obj: dict[str, Any], defaults: RequestDefaults) -> PromptRecord | Reject:
    """Judge one decoded record (a JSONL object or a Parquet row)."""
    if "custom_id" in obj or "body" in obj:
        return _parse_batch(line, obj, defaults)
    return _parse_simple(line, obj, defaults)


def _parse_batch(line: int, obj: dict[str, Any], defaults: RequestDefaults) -> PromptRecord | Reject:
    rid, problem = _check_id(obj.get("custom_id"), "custom_id")
    if problem:
        return Reject(line, problem, rid)
    assert rid is not None  # _check_id gives an id whenever it finds no problem
    body = obj.get("body")
    if isinstance(body, str):  # Parquet files often carry the body as JSON text
        try:
            body = json.loads(body)
        except ValueError as exc:
            return Reject(line, f"body is not valid JSON: {exc}", rid)
    if not isinstance(body, dict):
        return Reject(line, "batch record without an object 'body'", rid)
    method = obj.get("method", "POST")
    if not isinstance(method, str) or method.upper() != "POST":
        return Reject(line, f"method must be POST, not {method!r}", rid)
    endpoint: Endpoint | None = None
    url = obj.get("url")
    if url is not None:
        endpoint = _URL_ENDPOINTS.get(str(url).split("?")[0].rstrip("/"))
        if endpoint is None:
            return Reject(line, f"unsupported url {url!r} (use /v1/chat/completions or /v1/completions)", rid)
    return _finish(line, rid, dict(body), endpoint, defaults)


def _parse_simple(line: int, obj: dict[str, Any], defaults: RequestDefaults) -> PromptRecord | Reject:
    rid, problem = _check_id(obj.get("id"), "id")
    if problem:
        return Reject(line, problem, rid)
    assert rid is not None  # _check_id gives an id whenever it finds no problem
    body = {k: v for k, v in obj.items() if k != "id"}
    return _finish(line, rid, body, None, defaults)


def _finish(
    line: int, rid: str, body: dict[str, Any], endpoint: Endpoint | None, defaults: RequestDefaults
) -> PromptRecord | Reject:
    messages = body.get("messages")
    prompt = body.get("prompt")
    if messages is not None and prompt is not None:
        return Reject(line, "both 'messages' and 'prompt' given", rid)
    if messages is not None:
        problem = _check_messages(messages)
        if problem:
            return Reject(line, problem, rid)
        if defaults.mode == "completions" or endpoint == "completions":
            return Reject(
                line, "'messages' need the chat endpoint (--completions or a completions url was given)", rid
            )
        endpoint = "chat"
    elif prompt is not None:
        problem = _check_prompt(prompt)
        if problem:
            return Reject(line, problem, rid)
        if endpoint is None:
            endpoint = "chat" if defaults.mode == "chat" else "completions"
        if endpoint == "chat":
            if not isinstance(prompt, str):
                return Reject(line, "a token-id prompt cannot be sent to the chat endpoint", rid)
            body.pop("prompt")
            body["messages"] = [{"role": "user", "content": prompt}]
    else:
        return Reject(line, "no 'prompt' or 'messages'", rid)
    if defaults.samples is not None and "n" in body:
        return Reject(line, f"{N_BESIDE_SAMPLES}: n={body['n']!r} in the record and --samples {defaults.samples}", rid)
    n = body.get("n", 1)
    if n != 1:
        return Reject(line, f"n={n!r} is not supported (one completion per id)", rid)
    # Bulk generation reads whole responses; a streamed answer would only cost parsing.
    body.pop("stream", None)
    body.pop("stream_options", None)
    if defaults.max_tokens is not None and "max_tokens" not in body and "max_completion_tokens" not in body:
        body["max_tokens"] = defaults.max_tokens
    if defaults.temperature is not None and "temperature" not in body:
        body["temperature"] = defaults.temperature
    if defaults.token_ids:
        body.setdefault("return_token_ids", True)
    if defaults.logprobs is not None:
        for key, value in request_fields(endpoint, defaults.logprobs).items():
            body.setdefault(key, value)
    if defaults.prompt_logprobs is not None:
        body.setdefault("prompt_logprobs", defaults.prompt_logprobs)
    return PromptRecord(line, rid, endpoint, body)


def _check_id(value: Any, field: str) -> tuple[str | None, str | None]:
    if isinstance(value, bool) or value is None:
        return None, f"missing or invalid '{field}'" if value is None else f"'{field}' must be a string or an integer"
    if isinstance(value, int):
        value = str(value)
    if not isinstance(value, str):
        return None, f"'{field}' must be a string or an integer, not {type(value).__name__}"
    if not value:
        return None, f"empty '{field}'"
    if len(value) > _MAX_ID_CHARS:
        return value[:64] + "...", f"'{field}' longer than {_MAX_ID_CHARS} characters"
    return value, None


def _check_messages(messages: Any) -> str | None:
    if not isinstance(messages, list) or not messages:
        return "'messages' must be a non-empty list"
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            return f"messages[{i}] must be an object with a string 'role'"
        if "content" in m and m["content"] is not None and not isinstance(m["content"], (str, list)):
            return f"messages[{i}].content must be a string or a list of parts"
    return None


def _check_prompt(prompt: Any) -> str | None:
    if isinstance(prompt, str):
        return None if prompt else "empty 'prompt'"
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return None  # token ids
    return "'prompt' must be a non-empty string or a list of token ids (one prompt per record)"


def _excerpt(raw: bytes) -> str:
    text = raw[: _EXCERPT_CHARS * 4].decode("utf-8", errors="replace")
    return text if len(text) <= _EXCERPT_CHARS else text[:_EXCERPT_CHARS] + "..."


def file_sha256(path: str) -> str:
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(4 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def input_stat(path: str) -> tuple[int, int]:
    """(size, mtime_ns) of the input: the cheap half of its fingerprint."""
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns
