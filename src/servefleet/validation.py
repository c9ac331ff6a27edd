"""Turn a pydantic ``ValidationError`` about user input into one ``ConfigError`` that names the
command-line option (or fleet-file field) and the allowed range, e.g.
``--output-tokens-mean must be greater than 0 (got -100)``.

The models hold the rules (``Field(ge=1)`` ...), so the library refuses the same input the CLI
does; this module only words the refusal for the person who typed it."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from pydantic import ValidationError

from servefleet.errors import OptionError

__all__ = ["OPTION_NAMES", "option_error", "build"]

T = TypeVar("T")

# Model fields whose command-line option is not simply --field-name (the CLI's spelling wins).
OPTION_NAMES: Mapping[str, str] = {
    "duration_s": "--duration",
    "request_rates": "--request-rate",
    "timeout_s": "--timeout",
    "gpu_mem_bytes": "--gpu-mem",
    "overhead_bytes_per_gpu": "--overhead",
    "request_timeout_s": "--request-timeout",
    "retry_base_s": "--backoff-base",
    "retry_cap_s": "--backoff-max",
    "shard_bytes": "--shard-mb",
    "health.hang_min_s": "--hang-after",
    "params.max_tokens": "--max-tokens",
    "params.temperature": "--temperature",
    "params.format": "--format",
    "params.mode": "--chat/--completions",
}


def _flag(loc: tuple[Any, ...], flags: Mapping[str, str]) -> str:
    key = ".".join(str(part) for part in loc if not isinstance(part, int)) or "value"
    if key in flags:
        return flags[key]
    return "--" + key.split(".")[-1].replace("_", "-")


def _wording(error: Mapping[str, Any]) -> str:
    msg = str(error.get("msg", "is invalid"))
    for prefix in ("Input should be ", "Value error, "):
        if msg.startswith(prefix):
            msg = ("must be " if prefix.startswith("Input") else "") + msg[len(prefix) :]
            break
    return msg


def option_error(exc: ValidationError, flags: Mapping[str, str] | None = None) -> OptionError:
    """One message for every problem in ``exc``; ``flags`` maps a field (``"prompts"``, or a dotted
    path for nested models) to the option a user typed (``"--prompts"``); unmapped fields are shown
    as ``--field-name``."""
    flags = {**OPTION_NAMES, **(flags or {})}
    parts = []
    for error in exc.errors():
        got = error.get("input")
        shown = "" if isinstance(got, dict) else f" (got {got!r})"
        parts.append(f"{_flag(tuple(error.get('loc', ())), flags)} {_wording(error)}{shown}")
    return OptionError("; ".join(parts))


def build(factory: Callable[..., T], flags: Mapping[str, str] | None = None, /, **fields: Any) -> T:
    """``factory(**fields)``, with a ``ValidationError`` turned into ``option_error``."""
    try:
        return factory(**fields)
    except ValidationError as exc:
        raise option_error(exc, flags) from None
