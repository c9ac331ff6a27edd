"""``--logprobs K``: each answer's token logprobs as compact columns.

Asked as the OpenAI API has it (chat: ``logprobs: true, top_logprobs: K``; completions: ``logprobs: K``) plus
vLLM's ``return_tokens_as_token_ids`` (tokens come back as ``token_id:N``: ids, not strings that do not
round-trip). Stored per row:

* ``logprobs`` -- ``list<float32>``: the chosen token's logprob at each position;
* ``logprob_token_ids`` -- ``list<int32>``: the chosen token ids (null when the engine gave token strings);
* ``top_logprobs`` / ``top_token_ids`` -- ``list<fixed_size_list<float32|int32, K>>``: the K alternatives at each
  position, best first (padded with NaN / -1 where the engine gave fewer).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

__all__ = ["Logprobs", "parse_logprobs", "request_fields", "has_logprobs"]

_PREFIX = "token_id:"


@dataclass(frozen=True, slots=True)
class Logprobs:
    logprobs: list[float]
    token_ids: list[int] | None
    top_logprobs: list[list[float]]
    top_token_ids: list[list[int]] | None


def request_fields(endpoint: str, k: int) -> dict[str, Any]:
    if endpoint == "chat":
        return {"logprobs": True, "top_logprobs": k, "return_tokens_as_token_ids": True}
    return {"logprobs": k, "return_tokens_as_token_ids": True}


def has_logprobs(choice: dict[str, Any]) -> bool:
    lp = choice.get("logprobs")
    return isinstance(lp, dict) and bool(lp.get("content") or lp.get("token_logprobs"))


def _tid(token: Any) -> int | None:
    if isinstance(token, str) and token.startswith(_PREFIX):
        try:
            return int(token[len(_PREFIX) :])
        except ValueError:
            return None
    return None


def parse_logprobs(raw: Any, k: int) -> Logprobs | None:
    """:func:`parse_logprobs_general`, with a fast path for vLLM's completions shape (every token ``token_id:N``,
    every logprob a float): the per-token Python work is most of a logprobs job's coordinator CPU."""
    if isinstance(raw, dict) and isinstance(raw.get("token_logprobs"), list) and isinstance(raw.get("tokens"), list):
        try:
            return _fast_completions(raw, k)
        except (TypeError, ValueError, AttributeError):
            pass
    return parse_logprobs_general(raw, k)


def _fast_completions(raw: dict[str, Any], k: int) -> Logprobs | None:
    tokens, lps = raw["tokens"], raw["token_logprobs"]
    n = len(lps)
    if len(tokens) != n or any(t[:9] != _PREFIX for t in tokens):
        raise ValueError("not token ids")
    ids = [int(t[9:]) for t in tokens]
    lps = [float(v) for v in lps]
    tops = raw.get("top_logprobs") or []
    if len(tops) != n:
        raise ValueError("top_logprobs not aligned")
    top_lps: list[list[float]] = []
    top_ids: list[list[int]] = []
    by_value = itemgetter(1)
    for d in tops:
        alts = sorted(d.items(), key=by_value, reverse=True)[:k]
        vals = [float(v) for _, v in alts]
        keys = [int(t[9:]) for t, _ in alts]
        if len(alts) < k:
            vals += [math.nan] * (k - len(alts))
            keys += [-1] * (k - len(alts))
        top_lps.append(vals)
        top_ids.append(keys)
    return Logprobs(lps, ids, top_lps, top_ids)


def parse_logprobs_general(raw: Any, k: int) -> Logprobs | None:
    """The chat shape (``content: [{token, logprob, top_logprobs: [{token, logprob}]}]``) or the completions
    shape (``tokens``, ``token_logprobs``, ``top_logprobs: [{token: logprob}]``)."""
    if not isinstance(raw, dict):
        return None
    lps: list[float] = []
    ids: list[int | None] = []
    top_lps: list[list[float]] = []
    top_ids: list[list[int | None]] = []
    content = raw.get("content")
    if isinstance(content, list):
        for pos in content:
            lps.append(_num(pos.get("logprob")))
            ids.append(_tid(pos.get("token")))
            alts = pos.get("top_logprobs") or []
            top_lps.append(_pad([_num(a.get("logprob")) for a in alts[:k]], k, math.nan))
            top_ids.append(_pad([_tid(a.get("token")) for a in alts[:k]], k, -1))
    elif isinstance(raw.get("token_logprobs"), list):
        tops = raw.get("top_logprobs") or []
        for i, (tok, lp) in enumerate(zip(raw.get("tokens") or [], raw["token_logprobs"], strict=False)):
            lps.append(_num(lp))
            ids.append(_tid(tok))
            alts = sorted((tops[i] or {}).items(), key=lambda kv: -_num(kv[1]))[:k] if i < len(tops) else []
            top_lps.append(_pad([_num(v) for _, v in alts], k, math.nan))
            top_ids.append(_pad([_tid(t) for t, _ in alts], k, -1))
    else:
        return None
    known = all(i is not None for i in ids)
    top_known = all(i is not None for row in top_ids for i in row)
    return Logprobs(lps, ids if known else None, top_lps, top_ids if top_known else None)  # type: ignore[arg-type]


def _num(v: Any) -> float:
    return float(v) if isinstance(v, (int, float)) else math.nan


def _pad(values: list[Any], k: int, fill: Any) -> list[Any]:
    return values + [fill] * (k - len(values)) if len(values) < k else values


async def refuse_without_logprobs(targets: list[Any], client: Any, endpoint: str, k: int, model: str | None) -> None:
    """One one-token request with logprobs per server before the job: a server that answers it without
    logprobs (its engine cannot give them) refuses the job (ConfigError, exit 3). A server that fails the
    probe otherwise is left to the job (its failures are counted there)."""
    import asyncio

    from servefleet.errors import ConfigError
    from servefleet.generate.client import Completion

    async def one(t: Any) -> str | None:
        body: dict[str, Any] = {"max_tokens": 1, "model": model or t.served_model or "", **request_fields(endpoint, k)}
        body.update({"messages": [{"role": "user", "content": "ping"}]} if endpoint == "chat" else {"prompt": "ping"})
        result = await client.complete(t.base_url, endpoint, body)
        if isinstance(result, Completion) and (result.logprobs is None or not result.logprobs.logprobs):
            return t.name
        return None

    without = [n for n in await asyncio.gather(*(one(t) for t in targets)) if n is not None]
    if without:
        raise ConfigError(
            f"--logprobs {k}: {', '.join(without)} answered a request asking for logprobs without them (its engine "
            "cannot give them, or not on this endpoint); drop --logprobs or leave those servers out"
        )
