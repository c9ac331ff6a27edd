"""Latency of a non-streaming point from a small streamed sample, for servers without latency histograms.

The point's own requests are answered whole, so the client cannot see a first token. Beside them,
one extra client sends a few streamed requests one after another while the load runs (one more
request in flight than the point's concurrency); their TTFT, TPOT and ITL are the latency of a
request on a server under that load. Used only when the engine publishes no latency histograms
(llama.cpp, ``transformers serve``, unknown servers); its records never enter the point's throughput.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence

from servefleet.bench.client import EndpointConfig, OpenAIBackend, PreparedRequest, RequestRecord

__all__ = ["StreamedSample", "SAMPLE_REQUESTS"]

SAMPLE_REQUESTS = 8


class StreamedSample:
    """Sends ``requests`` one at a time from :meth:`start` until :meth:`stop` (or all are sent)."""

    def __init__(self, endpoint: EndpointConfig, requests: Sequence[PreparedRequest]) -> None:
        self.endpoint = EndpointConfig(**{**endpoint.__dict__, "stream": True, "keep_text": False})
        self.requests = list(requests)
        self.records: list[RequestRecord] = []
        self._task: asyncio.Task[None] | None = None
        self._backend: OpenAIBackend | None = None

    async def _run(self) -> None:
        backend = OpenAIBackend(self.endpoint)
        self._backend = backend
        await backend.open(1)
        for req in self.requests:
            self.records.append(await backend.send(req))

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="bench-latency-sample")

    async def stop(self) -> list[RequestRecord]:
        """End the sample (a request still in flight is dropped); the finished ones' records."""
        if self._task is not None:
            if not self._task.done():
                self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        if self._backend is not None:
            with contextlib.suppress(Exception):
                await self._backend.close()
        return [r for r in self.records if r.ok]
