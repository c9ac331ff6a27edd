"""``--prompt-logprobs K``: each prompt token's logprob and top K alternatives as compact columns.

Asked as vLLM has it (``prompt_logprobs: K`` on completions and chat). vLLM answers a list with one item per prompt
token -- on completions in each choice, on chat at the top of the answer -- the first ``null`` (nothing comes before
it), each other ``{token_id: {logprob, rank, decoded_token}}`` with the prompt token first, then the top K (K + 1
entries when the prompt token is not among them). Stored per row, from the second prompt token on:

* ``prompt_logprobs`` -- ``list<float32>``: each prompt token's logprob;
* ``prompt_logprob_token_ids`` -- ``list<int32>``: the prompt tokens' ids;
* ``prompt_top_logprobs`` / ``prompt_top_token_ids`` -- ``list<fixed_size_list<float32|int32, K>>``: the K
  alternatives at each position, best first (padded with NaN / -1 where the engine gave fewer).
"""

from __future__ import annotations

import math
from typing import Any

from servefleet.generate.logprobs import Logprobs

__all__ = ["request_fields", "parse_prompt_logprobs", "raw_prompt_logprobs", "refuse_without_prompt_logprobs"]


def request_fields(k: int) -> dict[str, Any]:
    return {"prompt_logprobs": k}


def raw_prompt_logprobs(obj: dict[str, Any], choice: dict[str, Any]) -> tuple[Any, Any]:
    """The answer's prompt logprobs and prompt token ids, wherever the endpoint puts them (choice or top)."""
    raw = choice.get("prompt_logprobs")
    if raw is None:
        raw = obj.get("prompt_logprobs")
    ids = choice.get("prompt_token_ids")
    return raw, ids if ids is not None else obj.get("prompt_token_ids")


def parse_prompt_logprobs(raw: Any, k: int, prompt_token_ids: Any = None) -> Logprobs | None:
    """``None`` when the answer has none (the engine ignored the field)."""
    if not isinstance(raw, list):
        return None
    ids_known = isinstance(prompt_token_ids, list) and len(prompt_token_ids) == len(raw)
    lps: list[float] = []
    ids: list[int] = []
    top_lps: list[list[float]] = []
    top_ids: list[list[int]] = []
    for i, pos in enumerate(raw):
        if not isinstance(pos, dict) or not pos:
            continue  # the first prompt token: no logprob
        entries = [(_tid(key), v if isinstance(v, dict) else {"logprob": v}) for key, v in pos.items()]
        chosen = prompt_token_ids[i] if ids_known else entries[0][0]  # vLLM puts the prompt token first
        mine = next((v for t, v in entries if t == chosen), entries[0][1])
        lps.append(_num(mine.get("logprob")))
        ids.append(chosen if isinstance(chosen, int) else -1)
        ranked = sorted(entries, key=lambda e: (_rank(e[1]), -_num(e[1].get("logprob"))))[:k]
        top_lps.append([_num(v.get("logprob")) for _, v in ranked] + [math.nan] * (k - len(ranked)))
        top_ids.append([t for t, _ in ranked] + [-1] * (k - len(ranked)))
    return Logprobs(lps, ids, top_lps, top_ids)


def _tid(key: Any) -> int:
    try:
        return int(key)
    except (TypeError, ValueError):
        return -1


def _rank(v: dict[str, Any]) -> float:
    r = v.get("rank")
    return float(r) if isinstance(r, int) and not isinstance(r, bool) else math.inf


def _num(v: Any) -> float:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else math.nan


async def refuse_without_prompt_logprobs(
    targets: list[Any], client: Any, endpoint: str, k: int, model: str | None
) -> None:
    """One one-token request with prompt logprobs per server before the job: a server that answers it without them
    (its engine cannot give them) refuses the job (ConfigError, exit 3); one that fails otherwise is left to the job."""
    import asyncio

    from servefleet.errors import ConfigError
    from servefleet.generate.client import Completion

    async def one(t: Any) -> str | None:
        body: dict[str, Any] = {"max_tokens": 1, "model": model or t.served_model or "", **request_fields(k)}
        text = "the prompt of a probe"  # several tokens: the first has no logprob
        body.update({"messages": [{"role": "user", "content": text}]} if endpoint == "chat" else {"prompt": text})
        result = await client.complete(t.base_url, endpoint, body)
        if isinstance(result, Completion) and (result.prompt_logprobs is None or not result.prompt_logprobs.logprobs):
            return t.name
        return None

    without = [n for n in await asyncio.gather(*(one(t) for t in targets)) if n is not None]
    if without:
        raise ConfigError(
            f"--prompt-logprobs {k}: {', '.join(without)} answered a request asking for prompt logprobs without "
            "them (its engine cannot give them, or not on this endpoint); drop --prompt-logprobs or leave those servers out"
        )
