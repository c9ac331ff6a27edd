"""Fail-fast: stop a job whose answers are mostly failures, or mostly cut at ``max_tokens``.

A broken chat template or a ``max_tokens`` far too small shows in the first answers; without this the
job would spend the whole input on it. Judged over the first ``first`` answers (M), then over a rolling
window of the last ``window`` answers: when the share of failed requests is above ``max_failure_rate``,
or the share of answers with ``finish_reason == "length"`` is above ``max_length_rate``, ``tripped`` is
set (the runner ends the run on it, exit 1) and :meth:`FailFast.message` says which share, with
examples and a hint. An answer is a request's final outcome: a row, or a request that failed every attempt.

It sits between the dispatcher and where its outcomes go (:class:`Watched` wraps the row sink and the
failure callback), so the dispatcher knows nothing of it.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from servefleet.generate.dispatch import RowSink, Ticket
    from servefleet.generate.shards import OutputRow
    from servefleet.http import RequestFailure

__all__ = ["FailFastPolicy", "FailFast", "Watched"]

_OK, _FAILED, _LENGTH = 0, 1, 2
_EXAMPLES = 3


@dataclass(frozen=True)
class FailFastPolicy:
    max_failure_rate: float | None = None  # 0..1; None: never stop on failures
    max_length_rate: float | None = None  # 0..1; None: never stop on answers cut at max_tokens
    first: int = 20  # M: no verdict before this many answers
    window: int = 200  # then over the last this many

    @property
    def active(self) -> bool:
        return self.max_failure_rate is not None or self.max_length_rate is not None


class FailFast:
    def __init__(self, policy: FailFastPolicy) -> None:
        self.policy = policy
        self.recent: deque[int] = deque(maxlen=max(policy.window, policy.first))
        self.failed = 0  # in the window
        self.length = 0
        self.answers = 0
        self.tripped = asyncio.Event()
        self.reason: str | None = None
        self.failures: deque[str] = deque(maxlen=_EXAMPLES)
        self.cut: deque[str] = deque(maxlen=_EXAMPLES)

    def answered(self, row: OutputRow) -> None:
        if row.finish_reason == "length":
            self.cut.append(f"{row.id}: {row.completion_tokens} tokens, ends {row.text[-80:]!r}")
            self._add(_LENGTH)
        else:
            self._add(_OK)

    def gave_up(self, rid: str, error: str) -> None:
        self.failures.append(f"{rid}: {error}")
        self._add(_FAILED)

    def _add(self, outcome: int) -> None:
        if len(self.recent) == self.recent.maxlen:
            old = self.recent[0]
            self.failed -= old == _FAILED
            self.length -= old == _LENGTH
        self.recent.append(outcome)
        self.failed += outcome == _FAILED
        self.length += outcome == _LENGTH
        self.answers += 1
        if self.tripped.is_set() or self.answers < self.policy.first:
            return
        n = len(self.recent)
        p = self.policy
        if p.max_failure_rate is not None and self.failed / n > p.max_failure_rate:
            self.reason = "failures"
        elif p.max_length_rate is not None and self.length / n > p.max_length_rate:
            self.reason = "length"
        if self.reason is not None:
            self.tripped.set()

    def message(self) -> str:
        n = len(self.recent)
        p = self.policy
        if self.reason == "failures":
            return (
                f"fail-fast: {self.failed} of the last {n} answers failed ({self.failed / n:.0%} > --max-failure-rate "
                f"{p.max_failure_rate:g}) after {self.answers} answers; examples: "
                + "; ".join(self.failures)
                + ". Is the request right (the chat template, the model name, max_tokens against the context length)? "
                "`generate --preview 3` shows the requests and the answers"
            )
        return (
            f"fail-fast: {self.length} of the last {n} answers were cut at max_tokens (finish_reason=length: "
            f"{self.length / n:.0%} > --max-length-rate {p.max_length_rate:g}) after {self.answers} answers; examples: "
            + "; ".join(self.cut)
            + ". Is --max-tokens too small for these answers, or does the template never let the "
            "model stop (a missing end-of-turn token)? `generate --preview 3` shows the answers"
        )


class Watched:
    """The dispatcher's row sink and failure callback, with every outcome shown to ``watch`` first."""

    def __init__(self, out: RowSink, on_failure: Callable[[Ticket, RequestFailure], None], watch: FailFast) -> None:
        self.out = out
        self._on_failure = on_failure
        self.watch = watch

    def add(self, row: OutputRow) -> None:
        self.watch.answered(row)
        self.out.add(row)

    @property
    def backlogged(self) -> bool:
        return self.out.backlogged

    async def wait_room(self) -> None:
        await self.out.wait_room()

    def on_failure(self, ticket: Ticket, failure: RequestFailure) -> None:
        self.watch.gave_up(ticket.record.id, failure.describe())
        self._on_failure(ticket, failure)
