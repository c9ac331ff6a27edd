"""``generate --preview N``: the first N records sent as the job would send them, answers shown, nothing committed.

The destination is not opened (no lock, no job.json, no shard): a preview before a million-prompt run costs
N requests and leaves nothing behind. Each record goes to one server (round robin), with the body the job
would send (defaults filled in, the model the server would be asked for).
"""

from __future__ import annotations

import asyncio
import itertools
import os
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from servefleet.errors import ConfigError
from servefleet.generate.client import Client, Completion
from servefleet.generate.endpoints import Target, targets_from_urls
from servefleet.generate.inputs import PromptRecord, RequestDefaults, iter_raw, parse_raw
from servefleet.generate.routing import check_routes, model_for, served, with_models
from servefleet.generate.samples import choose_mode, expand

if TYPE_CHECKING:
    from servefleet.generate.runner import GenerateConfig

__all__ = ["PreviewRow", "PreviewReport", "first_records", "run_preview"]

TEXT_CHARS = 2000  # of each answer shown


@dataclass
class PreviewRow:
    id: str
    line: int
    server: str
    endpoint: str
    request: dict[str, Any]
    text: str | None = None
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    error: str | None = None


@dataclass
class PreviewReport:
    status: str  # preview (every record answered) | preview_failed (some failed)
    input: str
    rows: list[PreviewRow] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"status": self.status, "input": self.input, "committed": 0, "rows": [asdict(r) for r in self.rows]}


def first_records(path: str, n: int, defaults: RequestDefaults) -> list[PromptRecord]:
    """The first ``n`` valid records; fewer than ``n`` in the whole input is a usage error (exit 3)."""
    if n < 1:
        raise ConfigError(f"--preview {n}: expected a number of records of at least 1")
    if not os.path.isfile(path):
        raise ConfigError(f"--input {path}: no such file")
    out: list[PromptRecord] = []
    for line, raw in iter_raw(path):
        rec = parse_raw(line, raw, defaults)
        if isinstance(rec, PromptRecord):
            out.append(rec)
            if len(out) == n:
                return out
    raise ConfigError(
        f"--preview {n}: the input has only {len(out)} valid records; give --preview {len(out) or 1} or less"
    )


async def run_preview(
    config: GenerateConfig, n: int, *, targets: list[Target] | None = None, records: list[PromptRecord] | None = None
) -> PreviewReport:
    """Send the first ``n`` records (or ``records``: what the job's expansion made of them) once each."""
    if records is None:
        records = first_records(config.input, n, config.defaults())
    async with Client(
        request_timeout_s=config.request_timeout_s,
        api_key=config.api_key.get_secret_value() if config.api_key else None,
    ) as client:
        if targets is None:
            targets = await targets_from_urls(config.urls, client, config.max_running)
        if not targets:
            raise ConfigError("no ready servers: give --url URL or a --fleet with ready servers")
        targets = await with_models(targets, client)
        if (
            config.params.samples is not None
        ):  # each record's first request, as the job sends it (n=K, or sample 0's seed)
            mode = choose_mode(config.sample_mode, records=len(records), servers=len(targets))
            records = [expand(rec, config.params.samples, mode)[0] for rec in records]
        own: dict[str, int] = {}
        for rec in records:
            if isinstance(m := rec.body.get("model"), str):
                own[m] = own.get(m, 0) + 1
        routed = check_routes(targets, own, job_model=config.params.model, models=config.params.models)
        turn = itertools.count()

        def server_for(rec: PromptRecord) -> Target:
            m = rec.body.get("model")
            fit = [t for t in targets if m in served(t)] if routed and isinstance(m, str) else targets
            return fit[next(turn) % len(fit)]

        rows = await asyncio.gather(
            *(_one(client, rec, server_for(rec), config.params.model, routed) for rec in records)
        )
    status = "preview_failed" if any(r.error for r in rows) else "preview"
    return PreviewReport(status, config.input, list(rows))


async def _one(client: Client, rec: PromptRecord, target: Target, model: str | None, routed: bool) -> PreviewRow:
    chosen = model_for(model, rec, target, routed)  # as the dispatcher asks
    body = rec.body if chosen is None else {**rec.body, "model": chosen}
    row = PreviewRow(rec.id, rec.line, target.name, rec.endpoint, body)
    result = await client.complete(target.base_url, rec.endpoint, body)
    if isinstance(result, Completion):
        row.text = result.text[:TEXT_CHARS]
        row.finish_reason, row.prompt_tokens, row.completion_tokens = (
            result.finish_reason,
            result.prompt_tokens,
            result.completion_tokens,
        )
    else:
        row.error = result.describe()
    return row
