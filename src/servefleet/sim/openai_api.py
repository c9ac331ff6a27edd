"""OpenAI-compatible request parsing and response encoding (completions and chat).

Parsing turns a JSON body into a :class:`Job` (prompt size, how many tokens it will produce and why it
stops); encoding builds the response bodies and SSE chunks from precomputed byte prefixes, so a
streamed step costs one small string join. Field names and shapes follow vLLM/SGLang's OpenAI
servers: ``usage`` on every non-streaming answer, ``stream_options.include_usage`` for a final usage
chunk, ``ignore_eos`` / ``min_tokens`` (vLLM/SGLang extensions), ``max_completion_tokens``.
"""

from __future__ import annotations

import itertools
import json
import time
from dataclasses import dataclass
from typing import Any

from servefleet.sim.config import SimConfig
from servefleet.sim.tokens import VOCAB_SIZE, count_tokens, render_chat, request_hash, token_ids, tokenize

__all__ = ["ApiError", "Job", "parse_job", "error_body", "full_body", "StreamEncoder", "DONE"]

DONE = b"data: [DONE]\n\n"
_ids = itertools.count(1)


class ApiError(Exception):
    """A request the server refuses, with the OpenAI error shape."""

    def __init__(self, status: int, message: str, kind: str = "BadRequestError") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind


def error_body(status: int, message: str, kind: str) -> dict[str, Any]:
    return {"object": "error", "message": message, "type": kind, "param": None, "code": status}


@dataclass
class Job:
    chat: bool
    prompt_text: str
    prompt_tokens: int
    max_tokens: int
    target: int  # tokens it will produce
    finish_reason: str  # "length" | "stop"
    stream: bool
    include_usage: bool
    start: int  # where its text starts in the TextBank
    rid: str
    created: int
    model: str
    more: tuple[tuple[int, int, str], ...] = ()  # n > 1: (start, target, finish_reason) of choices 1..n-1
    logprobs: int | None = (
        None  # alternatives per token asked (chat top_logprobs, completions logprobs); None: none asked
    )
    ids_as_tokens: bool = False  # vLLM's return_tokens_as_token_ids
    prompt_logprobs: int | None = None  # vLLM's prompt_logprobs: alternatives per prompt token; None: none asked


def _prompt(body: dict[str, Any]) -> tuple[str, int]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        return prompt, count_tokens(prompt)
    if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
        return " ".join(map(str, prompt)), len(prompt)
    if isinstance(prompt, list):
        raise ApiError(400, "batched prompts are not supported by the simulator; send one prompt per request")
    raise ApiError(400, "prompt must be a string or a list of token ids")


def _int_field(body: dict[str, Any], *names: str) -> int | None:
    for name in names:
        value = body.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise ApiError(400, f"{name} must be an integer")
        return value
    return None


def parse_job(body: Any, *, chat: bool, cfg: SimConfig) -> Job:
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    model = body.get("model")
    if cfg.style == "vllm" and model is not None and model != cfg.served_name and model not in cfg.adapters:
        raise ApiError(404, f"The model `{model}` does not exist.", "NotFoundError")
    answered_by = model if isinstance(model, str) and model in cfg.adapters else cfg.served_name
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise ApiError(400, "messages must be a non-empty list of objects")
        text = render_chat(messages)
        prompt_tokens = count_tokens(text)
    else:
        text, prompt_tokens = _prompt(body)
    if prompt_tokens == 0:
        raise ApiError(400, "The decoder prompt cannot be empty")
    n = body.get("n") or 1
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ApiError(400, "n must be a positive integer")
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise ApiError(400, "seed must be an integer")
    room = cfg.context_length - prompt_tokens
    max_tokens = _int_field(body, "max_completion_tokens", "max_tokens") if chat else _int_field(body, "max_tokens")
    if max_tokens is None:
        max_tokens = min(cfg.default_max_tokens, max(room, 1))
    if max_tokens < 1:
        raise ApiError(400, f"max_tokens must be at least 1, got {max_tokens}.")
    if prompt_tokens + max_tokens > cfg.context_length:
        kind = "messages" if chat else "prompt"
        raise ApiError(
            400,
            f"This model's maximum context length is {cfg.context_length} tokens. However, you requested "
            f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the {kind}, {max_tokens} in the completion). "
            "Please reduce the length of the messages or completion.",
        )
    if prompt_tokens + max_tokens > cfg.kv_tokens:
        raise ApiError(
            400,
            f"The request needs {prompt_tokens + max_tokens} KV-cache tokens, more than the "
            f"{cfg.kv_tokens} the server has.",
        )
    stream = bool(body.get("stream", False))
    options = body.get("stream_options") or {}
    include_usage = bool(stream and isinstance(options, dict) and options.get("include_usage"))
    if n > 1 and stream:
        raise ApiError(400, "n > 1 with stream is not supported by the simulator")
    min_tokens = _int_field(body, "min_tokens") or 0
    # choice i of a request with a seed draws as a request of n=1 with seed + i would (vLLM's parallel sampling)
    adapter = answered_by if answered_by != cfg.served_name else None
    asked = body.get("top_logprobs", 0) if chat and body.get("logprobs") else (None if chat else body.get("logprobs"))
    logprobs = int(asked or 0) if cfg.logprobs and asked is not None and asked is not False else None
    prompt_k = _int_field(body, "prompt_logprobs")
    if prompt_k is not None and stream and cfg.logprobs:
        raise ApiError(400, "`prompt_logprobs` are not available when `stream=True`.")
    draws = [
        _draw(
            text,
            cfg,
            max_tokens,
            min_tokens,
            bool(body.get("ignore_eos", False)),
            None if seed is None else seed + i,
            i,
            adapter,
        )
        for i in range(n)
    ]
    start, target, finish = draws[0]
    prefix = "chatcmpl-" if chat else "cmpl-"
    return Job(
        chat=chat,
        prompt_text=text,
        prompt_tokens=prompt_tokens,
        max_tokens=max_tokens,
        target=target,
        finish_reason=finish,
        stream=stream,
        include_usage=include_usage,
        start=start,
        rid=f"{prefix}sim{next(_ids):08x}",
        created=int(time.time()),
        model=answered_by,
        more=tuple(draws[1:]),
        logprobs=logprobs,
        ids_as_tokens=bool(body.get("return_tokens_as_token_ids")),
        prompt_logprobs=prompt_k if cfg.logprobs else None,
    )


def _draw(
    text: str,
    cfg: SimConfig,
    max_tokens: int,
    min_tokens: int,
    ignore_eos: bool,
    seed: int | None,
    choice: int,
    model: str | None = None,
) -> tuple[int, int, str]:
    """Where an answer's text starts, how long it is and why it stops: a function of the prompt and the seed."""
    if model is not None:  # an adapter answers otherwise than its base model
        text = f"{text}\x00model={model}"
    if seed is not None:
        text = f"{text}\x00seed={seed}"
    elif choice:
        text = f"{text}\x00choice={choice}"
    h = request_hash(text, cfg.seed, max_tokens)
    target, finish = max_tokens, "length"
    if not ignore_eos and cfg.eos_rate > 0 and (h & 0xFFFF) / 65536.0 < cfg.eos_rate:
        target = 1 + (h >> 16) % max_tokens
        finish = "stop" if target < max_tokens else "length"
    if target < min(min_tokens, max_tokens):
        target = min(min_tokens, max_tokens)
        finish = "stop" if target < max_tokens else "length"
    return h % 64, target, finish


def _usage(job: Job, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": job.prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": job.prompt_tokens + completion_tokens,
    }


def full_body(job: Job, text: str, more: list[str] | None = None) -> dict[str, Any]:
    """A non-streaming answer (always with ``usage``); ``more``: the texts of choices 1..n-1."""
    choices = [_choice(job.chat, 0, text, job.finish_reason)]
    choices += [
        _choice(job.chat, i, t, finish)
        for i, (t, (_, _, finish)) in enumerate(zip(more or [], job.more, strict=True), 1)
    ]
    if job.logprobs is not None:
        for c, t in zip(choices, [text, *(more or [])], strict=True):
            c["logprobs"] = _logprobs(job, t)
    kind = "chat.completion" if job.chat else "text_completion"
    answer = {
        "id": job.rid,
        "object": kind,
        "created": job.created,
        "model": job.model,
        "choices": choices,
        "usage": _usage(job, job.target + sum(t for _, t, _ in job.more)),
    }
    if job.prompt_logprobs is not None:  # as vLLM: at the top on chat, in each choice on completions
        prompt = _prompt_logprobs(job.prompt_text, job.prompt_logprobs)
        for c in [answer] if job.chat else choices:
            c["prompt_logprobs"] = prompt
    return answer


def _prompt_logprobs(text: str, k: int) -> list[dict[str, dict[str, Any]] | None]:
    """Deterministic prompt logprobs in vLLM's shape: none for the first token; then the prompt token first with its
    rank (1 + id % 4, so at times outside the top ``k``), then the top ``k`` by rank."""
    out: list[dict[str, dict[str, Any]] | None] = [None]
    for w, i in list(zip(tokenize(text), token_ids(text), strict=True))[1:]:
        lp, rank = -((i % 500) / 100.0), 1 + i % 4
        pos = {str(i): {"logprob": lp, "rank": rank, "decoded_token": w}}
        for j in range(1, k + 1):
            alt = i if j == rank else (i + 7 * j) % VOCAB_SIZE
            pos.setdefault(str(alt), {"logprob": lp - (j - rank) * 0.5, "rank": j, "decoded_token": f"alt{j}"})
        out.append(pos)
    return out


def _logprobs(job: Job, text: str) -> dict[str, Any]:
    """Deterministic logprobs of an answer's tokens: the chosen one first, then ``job.logprobs`` alternatives."""
    k = job.logprobs or 0
    words = tokenize(text)
    ids = token_ids(text)
    name = (lambda i, w: f"token_id:{i}") if job.ids_as_tokens else (lambda i, w: w)
    positions = []
    for w, i in zip(words, ids, strict=True):
        lp = -((i % 500) / 100.0)
        alts = [(i, " " + w, lp)] + [((i + j) % VOCAB_SIZE, f" alt{j}", lp - j) for j in range(1, k)]
        positions.append((name(i, " " + w), lp, [(name(a, s), v) for a, s, v in alts[:k]]))
    if job.chat:
        return {
            "content": [
                {
                    "token": t,
                    "logprob": lp,
                    "bytes": None,
                    "top_logprobs": [{"token": a, "logprob": v, "bytes": None} for a, v in top],
                }
                for t, lp, top in positions
            ]
        }
    return {
        "tokens": [t for t, _, _ in positions],
        "token_logprobs": [lp for _, lp, _ in positions],
        "top_logprobs": [dict(top) for _, _, top in positions],
        "text_offset": None,
    }


def _choice(chat: bool, index: int, text: str, finish: str) -> dict[str, Any]:
    if chat:
        return {
            "index": index,
            "message": {"role": "assistant", "content": text, "reasoning_content": None, "tool_calls": []},
            "logprobs": None,
            "finish_reason": finish,
            "stop_reason": None,
        }
    return {"index": index, "text": text, "logprobs": None, "finish_reason": finish, "stop_reason": None}


class StreamEncoder:
    """SSE chunks of one streamed answer: ``data: {...}\\n\\n`` per step, a usage chunk, ``data: [DONE]``."""

    def __init__(self, job: Job) -> None:
        self.job = job
        model = json.dumps(job.model)
        kind = "chat.completion.chunk" if job.chat else "text_completion"
        self._head = f'data: {{"id":"{job.rid}","object":"{kind}","created":{job.created},"model":{model},"choices":[{{"index":0,'
        self._envelope = f'data: {{"id":"{job.rid}","object":"{kind}","created":{job.created},"model":{model},'

    def role(self) -> bytes:
        """Chat streams open with the assistant role and empty content, as vLLM and SGLang do."""
        if not self.job.chat:
            return b""
        return (
            self._head + '"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}\n\n'
        ).encode()

    def chunk(self, text: str, finish: str | None) -> bytes:
        fin = "null" if finish is None else f'"{finish}"'
        if self.job.chat:
            body = f'"delta":{{"content":{json.dumps(text)}}},"logprobs":null,"finish_reason":{fin}}}]}}\n\n'
        else:
            body = f'"text":{json.dumps(text)},"logprobs":null,"finish_reason":{fin},"stop_reason":null}}]}}\n\n'
        return (self._head + body).encode()

    def usage(self, completion_tokens: int) -> bytes:
        if not self.job.include_usage:
            return b""
        return (
            self._envelope
            + f'"choices":[],"usage":{json.dumps(_usage(self.job, completion_tokens), separators=(",", ":"))}}}\n\n'
        ).encode()
