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


def rows_of(r: PromptRecord, c: Completion, *, server: str, attempts: int, latency: float, body: dict,
            store_request: bool) -> list[OutputRow]:
    model = c.model or body.get("model")
    request = json.dumps(body, ensure_ascii=False) if store_request else None
    if not c.choices:
        return [OutputRow(
            id=r.id, line=r.line, text=c.text, finish_reason=c.finish_reason, prompt_tokens=c.prompt_tokens,
            completion_tokens=c.completion_tokens, model=model, server=server, attempts=attempts, latency_s=latency,
            reasoning=c.reasoning, token_ids=c.token_ids, request=request, sample=r.sample,
        )]
    first = r.sample or 0
    return [OutputRow(
        id=r.id, line=r.line, text=ch.text, finish_reason=ch.finish_reason, prompt_tokens=c.prompt_tokens,
        completion_tokens=ch.completion_tokens, model=model, server=server, attempts=attempts, latency_s=latency,
        reasoning=ch.reasoning, token_ids=ch.token_ids, request=request, sample=first + i,
    ) for i, ch in enumerate(c.choices[: r.choices])]
