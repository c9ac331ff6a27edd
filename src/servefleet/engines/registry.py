"""Engine registry: a lowercase name -> dotted path table, each module imported on first use."""

from __future__ import annotations

import importlib
from functools import cache
from types import MappingProxyType

from servefleet.engines.base import EngineProfile
from servefleet.errors import EngineError

__all__ = ["ENGINES", "get_engine", "engine_names", "all_engines"]

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


def engine_names() -> list[str]:
    return sorted(_REGISTRY)


def all_engines() -> list[EngineProfile]:
    return [get_engine(n) for n in engine_names()]
