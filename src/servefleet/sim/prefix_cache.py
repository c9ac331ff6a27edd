"""The simulated engine's prefix cache: as vLLM's and SGLang's, a prompt whose tokens are still in the KV
cache from an earlier request needs no prefill for them. Modelled at whole-prompt granularity (an exact
repeat hits, anything else misses) and bounded by the KV cache's size, least recently used out first:
enough for what servefleet must notice, a bench whose prompts repeat where the job's do not."""

from __future__ import annotations

from collections import OrderedDict

__all__ = ["PrefixCache"]


class PrefixCache:
    def __init__(self, capacity_tokens: int) -> None:
        self.capacity = capacity_tokens
        self._held: OrderedDict[int, int] = OrderedDict()  # prompt key -> its tokens, oldest first
        self._tokens = 0
        self.looked_up = 0  # prompt tokens looked up (every admitted prompt's)
        self.hits = 0  # of them, found in the cache

    def admit(self, key: int | None, tokens: int) -> int:
        """A prompt enters the engine: how many of its tokens were cached (no prefill for those)."""
        self.looked_up += tokens
        if key is None:
            return 0
        hit = 0
        if key in self._held:
            self._held.move_to_end(key)
            hit = self._held[key]
        else:
            self._held[key] = tokens
            self._tokens += tokens
            while self._tokens > self.capacity and self._held:
                _, old = self._held.popitem(last=False)
                self._tokens -= old
        self.hits += hit
        return hit
