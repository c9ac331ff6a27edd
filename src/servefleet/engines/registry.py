"""Engine registry: a lowercase name -> dotted path table, each module imported on first use."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from functools import cache
from types import MappingProxyType
from typing import Any

from servefleet.engines.base import EngineProfile, ServingMetrics, TokenizeEndpoint
from servefleet.errors import EngineError

__all__ = [
    "ENGINES",
    "get_engine",
    "engine_names",
    "all_engines",
    "recognise",
    "info_paths",
    "tokenize_endpoints",
    "serving_metrics",
]

_REGISTRY: dict[str, str] = {
    "sglang": "servefleet.engines.sglang:SGLangEngine",
    "vllm": "servefleet.engines.vllm:VLLMEngine",
    "llamacpp": "servefleet.engines.llamacpp:LlamaCppEngine",
    "transformers": "servefleet.engines.transformers:TransformersEngine",
    "tgi": "servefleet.engines.tgi:TGIEngine",
    "sim": "servefleet.engines.sim:SimEngine",
    "openai": "servefleet.engines.openai:OpenAIEngine",
}

ENGINES = MappingProxyType(_REGISTRY)


@cache
def get_engine(name: str) -> EngineProfile:
    key = name.lower()
    try:
        target = _REGISTRY[key]
    except KeyError:
        raise EngineError(f"unknown engine {name!r}; known engines: {', '.join(sorted(_REGISTRY))}") from None
    module_name, _, cls_name = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:  # pragma: no cover - only on a broken install
        raise EngineError(f"engine {key!r} could not be loaded ({exc}); reinstall servefleet") from exc
    return getattr(module, cls_name)()


# Engines a running server can be recognised as, in the order their evidence is trusted
# (the sim answers like vLLM on purpose and is never "recognised").
_RECOGNISABLE = ("vllm", "sglang", "llamacpp", "tgi")


def recognise(models_owner: str | None, info: Mapping[str, Any] | None, metrics_text: str) -> str | None:
    """The engine a server of unknown engine is, from what it answered (each profile's
    ``models_owner``, ``info_keys``, ``metrics_prefix``): its /v1/models ``owned_by`` first, then
    its info document's keys, then its metric names; None when nothing says."""
    profiles = [get_engine(n) for n in _RECOGNISABLE]
    owner = (models_owner or "").lower()
    for p in profiles:
        if owner and owner == p.models_owner:
            return p.name
    for p in profiles:
        if info and any(k in info for k in p.info_keys):
            return p.name
    for p in profiles:
        if p.metrics_prefix and p.metrics_prefix in metrics_text:
            return p.name
    return None


# Engines whose name says nothing about the server's own endpoints: a server run by one may be any engine.
_UNKNOWN_SERVER = ("openai",)


def _candidates(engine: str | None) -> list[EngineProfile]:
    """The profiles whose endpoints a server of ``engine`` may have: that engine's own; for an
    unknown engine (None, ``openai``, a name not registered), every recognisable engine's."""
    if engine is None or engine.lower() in _UNKNOWN_SERVER or engine.lower() not in _REGISTRY:
        return [get_engine(n) for n in _RECOGNISABLE]
    return [get_engine(engine)]


def info_paths(engine: str | None) -> tuple[str, ...]:
    """Where a server of ``engine`` may serve its info document (``EngineProfile.info_paths``), in
    the order to try; empty when its engine serves none."""
    return tuple(dict.fromkeys(p for profile in _candidates(engine) for p in profile.info_paths))


def tokenize_endpoints(engine: str | None) -> list[TokenizeEndpoint]:
    """The token-counting requests a server of ``engine`` may answer (``EngineProfile.tokenize``),
    each shape once, in the order to try; empty when its engine has none."""
    return list(dict.fromkeys(p.tokenize for p in _candidates(engine) if p.tokenize is not None))


@cache
def serving_metrics(engine: str | None = None) -> ServingMetrics:
    """The ``/metrics`` load series a server of ``engine`` may publish (``EngineProfile.serving_metrics``),
    each list in the order to try; for an unknown engine, every recognisable engine's, in the order
    of ``recognise`` (across engines the order matters only for a server that publishes two
    families, as the sim does). Built once per engine name: ``generate`` asks on every scrape."""
    return ServingMetrics.union(*(p.serving_metrics for p in _candidates(engine)))


def engine_names() -> list[str]:
    return sorted(_REGISTRY)


def all_engines() -> list[EngineProfile]:
    return [get_engine(n) for n in engine_names()]
