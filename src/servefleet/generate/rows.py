"""The rows one answer becomes: one, or one per choice of an answer to ``n = K`` (``--samples``)."""

from __future__ import annotations

import json

from servefleet.generate.client import Completion
from servefleet.generate.inputs import PromptRecord
from servefleet.generate.shards import OutputRow
from servefleet.http import FailureKind, RequestFailure

__all__ = ["rows_of", "short_of_choices"]


def short_of_choices(record: PromptRecord, c: Completion) -> RequestFailure | None:
    """An answer with fewer choices than the request's ``n``: not an answer (asked again)."""
    got = len(c.choices) or 1
    if got >= record.choices:
        return None
    return RequestFailure(FailureKind.PROTOCOL, f"asked n={record.choices}, the answer has {got} choices")


def rows_of(
    r: PromptRecord, c: Completion, *, server: str, attempts: int, latency: float, body: dict, store_request: bool
) -> list[OutputRow]:
    model = c.model or body.get("model")
    request = json.dumps(body, ensure_ascii=False) if store_request else None
    if not c.choices:
        row = OutputRow(
            id=r.id,
            line=r.line,
            text=c.text,
            finish_reason=c.finish_reason,
            prompt_tokens=c.prompt_tokens,
            completion_tokens=c.completion_tokens,
            model=model,
            server=server,
            attempts=attempts,
            latency_s=latency,
            reasoning=c.reasoning,
            token_ids=c.token_ids,
            request=request,
            sample=r.sample,
        )
        if c.logprobs is not None:
            _with_logprobs(row, c)
        _with_prompt_logprobs(row, c)
        return [row]
    first = r.sample or 0
    rows = []
    for i, ch in enumerate(c.choices[: r.choices]):
        row = OutputRow(
            id=r.id,
            line=r.line,
            text=ch.text,
            finish_reason=ch.finish_reason,
            prompt_tokens=c.prompt_tokens,
            completion_tokens=ch.completion_tokens if ch.completion_tokens is not None else _count(ch),
            model=model,
            server=server,
            attempts=attempts,
            latency_s=latency,
            reasoning=ch.reasoning,
            token_ids=ch.token_ids,
            request=request,
            sample=first + i,
        )
        if ch.logprobs is not None:
            _with_logprobs(row, ch)
        _with_prompt_logprobs(row, c)
        rows.append(row)
    return rows


def _with_logprobs(row: OutputRow, c: Completion) -> None:
    lp = c.logprobs
    assert lp is not None
    row.logprobs, row.logprob_token_ids, row.top_logprobs, row.top_token_ids = (
        lp.logprobs,
        lp.token_ids,
        lp.top_logprobs,
        lp.top_token_ids,
    )


def _with_prompt_logprobs(row: OutputRow, c: Completion) -> None:
    lp = c.prompt_logprobs  # the answer's, the same for each of its choices
    if lp is not None:
        row.prompt_logprobs, row.prompt_logprob_token_ids, row.prompt_top_logprobs, row.prompt_top_token_ids = (
            lp.logprobs,
            lp.token_ids,
            lp.top_logprobs,
            lp.top_token_ids,
        )


def _count(c: Completion) -> int | None:
    """A choice's own token count when its answer shows it (logprobs: one per token)."""
    return len(c.logprobs.logprobs) if c.logprobs is not None else None
