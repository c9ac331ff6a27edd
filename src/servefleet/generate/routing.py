"""Which server may answer which request when the fleet's servers serve different models.

A server serves every model its ``/v1/models`` lists (LoRA adapters included). The job is *routed* when the
fleet serves more than one model, or ``--models`` sends every record to several: a request then goes only
to a server that serves the model it asks for -- the record's own ``model`` field, or the ``--models`` entry
it was made for. A record whose model no server serves is refused before anything is sent (exit 3).

A fleet of one model keeps the old rule: every request asks the server's own model (a batch file written
for another API often names a model the fleet does not have), unless ``--model`` names one.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import TYPE_CHECKING

from servefleet.errors import ConfigError
from servefleet.generate.endpoints import Target
from servefleet.generate.inputs import PromptRecord

if TYPE_CHECKING:
    from servefleet.generate.client import Client

__all__ = ["served", "with_models", "check_routes", "model_for"]


def served(target: Target) -> tuple[str, ...]:
    return target.models or ((target.served_model,) if target.served_model else ())


async def with_models(targets: list[Target], client: Client) -> list[Target]:
    """Each target with every model its /v1/models lists (a fleet's targets know only the served name)."""

    async def one(t: Target) -> Target:
        if t.models:
            return t
        listed = await client.models(t.base_url)
        return replace(t, models=tuple(listed)) if listed else t

    return list(await asyncio.gather(*(one(t) for t in targets)))


def check_routes(
    targets: list[Target], record_models: dict[str, int], *, job_model: str | None, models: tuple[str, ...] | None
) -> bool:
    """Whether requests are routed by model; refuses (ConfigError) what no server could answer."""
    fleet = {m for t in targets for m in served(t)}
    have = ", ".join(sorted(fleet)) or "none listed"
    if models:
        if job_model:
            raise ConfigError("--model and --models exclude each other: --models sends every record to each model")
        missing = [m for m in models if m not in fleet]
        if missing:
            raise ConfigError(f"--models: no server of the fleet serves {', '.join(missing)} (it serves: {have})")
        return True
    if job_model or len(fleet) <= 1:
        return False
    unserved = {m: n for m, n in record_models.items() if m not in fleet}
    if unserved:
        shown = ", ".join(f"{m!r} ({n:,} records)" for m, n in sorted(unserved.items())[:5])
        raise ConfigError(
            f"the fleet's servers serve different models ({have}) and records are routed by their 'model' field, "
            f"but no server serves {shown}; fix those records, start a server for them, or give --model NAME"
        )
    return True


def model_for(job_model: str | None, record: PromptRecord, target: Target, routed: bool) -> str | None:
    """The model a request asks for on ``target``."""
    if job_model:
        return job_model
    own = record.body.get("model")
    if routed and isinstance(own, str):
        return own
    return target.served_model or own
