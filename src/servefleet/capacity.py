"""What a running server can hold, as read from its info endpoint or its log."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["Capacity"]


class Capacity(BaseModel):
    """Capacity facts. Every field is optional: engines report different subsets.

    ``source`` records where each fact came from ("endpoint:/server_info", "log:123", ...).
    """

    model_config = ConfigDict(extra="forbid")

    kv_cache_tokens: int | None = None
    max_running_requests: int | None = None
    context_length: int | None = None
    # vLLM: "Maximum concurrency for 4,096 tokens per request: 339.38x" -> {4096: 339.38}
    max_concurrency: dict[int, float] = Field(default_factory=dict)
    mamba_cache: dict[str, Any] = Field(default_factory=dict)
    speculative: dict[str, Any] = Field(default_factory=dict)
    kv_cache_gib: float | None = None
    # The largest batch the engine runs as a captured CUDA graph (vLLM: max_cudagraph_capture_size): above it every
    # step launches its kernels one by one; on the H200 564 running gave 14-16k tok/s where 512 gave 22-26k.
    graph_batch_max: int | None = None
    engine_version: str | None = None
    served_model: str | None = None
    extra: dict[str, Any] = Field(default_factory=dict)
    source: dict[str, str] = Field(default_factory=dict)

    def merge(self, other: Capacity) -> Capacity:
        """Facts of ``self`` win; ``other`` fills the gaps (endpoint first, logs second)."""
        mine = self.model_dump(exclude_defaults=True)
        theirs = other.model_dump(exclude_defaults=True)
        for key, value in theirs.items():
            if key in ("max_concurrency", "mamba_cache", "speculative", "extra", "source"):
                mine[key] = {**value, **mine.get(key, {})}
            elif key not in mine:
                mine[key] = value
        return Capacity(**mine)

    def is_empty(self) -> bool:
        return not self.model_dump(exclude_defaults=True)
