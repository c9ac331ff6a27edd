"""Server-side truth around each point: Prometheus ``/metrics`` and the engine's info document
(SGLang's ``/server_info``: where it is, each engine profile's ``info_paths`` says).

A point's numbers from the client say how fast answers came; the server's own gauges say
whether it was full. Gauges (running, queued, KV-cache use) are sampled during the point;
counters (generated tokens, speculative drafts and acceptances, preemptions, prefix-cache lookups
and hits) are differenced between a scrape just before and one just after it. Metric names are
the engines' own, kept in each engine profile (``EngineProfile.serving_metrics``); a server of
unknown engine is read by the names of every engine (``engines.registry.serving_metrics``).
SGLang's speculative acceptance is also read from its info document's
``internal_states[].avg_spec_accept_length``.

A server without ``/metrics`` simply yields no server section.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from time import perf_counter
from typing import Any

from servefleet.bench.result import ServerStats
from servefleet.engines.registry import serving_metrics
from servefleet.http import HttpClient, Timeout, TransportError

__all__ = [
    "parse_prometheus",
    "first_present",
    "Snapshot",
    "ServerWatcher",
    "summarize_server",
    "fetch_server_info",
    "prefix_hit_rate",
]

_SCRAPE_TIMEOUT = Timeout(5.0)


def parse_prometheus(text: str) -> dict[str, float]:
    """Prometheus text -> {metric name: value summed over label sets}.

    Summing over labels is right for what is read here (per-engine or per-rank series of
    counters and of running/queued gauges); ratio gauges are read with :func:`_max_of` from
    the per-series values kept under ``name{labels}`` keys as well.
    """
    out: dict[str, float] = defaultdict(float)
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        brace = line.find("{")
        if brace >= 0:
            close = line.rfind("}")
            name = line[:brace]
            rest = line[close + 1 :].split()
            key = line[: close + 1]
        else:
            parts = line.split()
            name, rest, key = parts[0], parts[1:], None
        if not rest:
            continue
        try:
            value = float(rest[0])
        except ValueError:
            continue
        if math.isnan(value):
            continue
        out[name] += value
        if key is not None:
            out[key] = value
    return dict(out)


def first_present(metrics: dict[str, float], names: tuple[str, ...]) -> float | None:
    """The value of the first of ``names`` the scrape holds (an engine's preferred spelling first)."""
    for name in names:
        if name in metrics:
            return metrics[name]
    return None


def _max_of(metrics: dict[str, float], names: tuple[str, ...]) -> float | None:
    """Largest single series of the first of ``names`` present (ratios must not be summed)."""
    for name in names:
        series = [v for k, v in metrics.items() if k.startswith(name + "{")]
        if series:
            return max(series)
        if name in metrics:
            return metrics[name]
    return None


@dataclass
class Snapshot:
    metrics: dict[str, float] = field(default_factory=dict)
    server_info: dict[str, Any] | None = None


class ServerWatcher:
    """Scrapes one server before, during and after a point. Never raises on a scrape failure."""

    def __init__(
        self, base_url: str, client: HttpClient, interval_s: float = 0.25, info_paths: Sequence[str] = ()
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.client = client
        self.interval_s = interval_s
        self.info_paths = tuple(info_paths)  # engines.registry.info_paths of the server's engine
        self.has_metrics: bool | None = None  # unknown until the first scrape
        self.has_server_info: bool | None = None
        self._samples: list[dict[str, float]] = []
        self.sample_times: list[float] = []  # perf_counter of each sample (the clock of the requests' records)
        self._task: asyncio.Task | None = None

    async def scrape(self) -> Snapshot:
        snap = Snapshot()
        if self.has_metrics is not False:
            text = await self._get_text("/metrics")
            self.has_metrics = text is not None
            if text is not None:
                snap.metrics = parse_prometheus(text)
        if self.has_server_info is not False:
            info = await fetch_server_info(self.client, self.base_url, self.info_paths)
            self.has_server_info = info is not None
            snap.server_info = info
        return snap

    async def _get_text(self, path: str) -> str | None:
        return await self.client.get_text(self.base_url + path, timeout=_SCRAPE_TIMEOUT)

    async def _sample_loop(self) -> None:
        while True:
            text = await self._get_text("/metrics")
            if text is not None:
                self._samples.append(parse_prometheus(text))
                self.sample_times.append(perf_counter())
            await asyncio.sleep(self.interval_s)

    async def scrape_metrics(self) -> dict[str, float]:
        """One /metrics scrape, parsed (empty when the server has none)."""
        if self.has_metrics is False:
            return {}
        text = await self._get_text("/metrics")
        return parse_prometheus(text) if text is not None else {}

    def start_sampling(self) -> None:
        self._samples = []
        self.sample_times = []
        if self.has_metrics:
            self._task = asyncio.get_running_loop().create_task(self._sample_loop())

    async def stop_sampling(self) -> list[dict[str, float]]:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        return self._samples


async def fetch_server_info(client: HttpClient, base_url: str, paths: Sequence[str]) -> dict[str, Any] | None:
    """The first JSON object one of ``paths`` answers with (``engines.registry.info_paths``: SGLang's
    ``/server_info``, then the older ``/get_server_info``), or None (none given, or none answers)."""
    for path in paths:
        try:
            resp = await client.get(base_url.rstrip("/") + path, timeout=_SCRAPE_TIMEOUT)
        except TransportError:
            return None
        if resp.status != 200:
            continue
        try:
            info = resp.json()
        except ValueError:
            continue
        if isinstance(info, dict):
            return info
    return None


def _accept_length_from_info(info: dict[str, Any] | None) -> float | None:
    if not info:
        return None
    values: list[float] = [
        float(s["avg_spec_accept_length"])
        for s in info.get("internal_states") or ()
        if isinstance(s, dict) and isinstance(s.get("avg_spec_accept_length"), int | float)
    ]
    return sum(values) / len(values) if values else None


def prefix_hit_rate(looked_up: float | None, hits: float | None) -> float | None:
    """Share of the prompt tokens looked up that the engine's prefix cache held (None: nothing looked
    up, or no such counter). A hits counter absent beside a looked-up one is none yet: SGLang shows its
    labelled counter only from the first cached token."""
    if not looked_up or looked_up <= 0:
        return None
    return min(1.0, max(0.0, (hits or 0.0) / looked_up))


def summarize_server(
    before: Snapshot, after: Snapshot, samples: list[dict[str, float]], max_running: int | None = None
) -> ServerStats | None:
    """Fold the scrapes of one point into :class:`ServerStats` (None when nothing was scraped)."""
    if not before.metrics and not after.metrics and not samples and after.server_info is None:
        return None
    stats = ServerStats(samples=len(samples))
    if before.metrics or after.metrics:
        stats.source.append("/metrics")
    if after.server_info is not None:
        stats.source.append("/server_info")
    names = serving_metrics()  # the server's engine is not known here: every engine's names
    series = samples or [m for m in (after.metrics,) if m]
    running = [v for v in (first_present(s, names.running) for s in series) if v is not None]
    queued = [v for v in (first_present(s, names.queued) for s in series) if v is not None]
    kv = [v for v in (_max_of(s, names.kv_usage) for s in series) if v is not None]
    if running:
        stats.running_mean = sum(running) / len(running)
        stats.running_max = max(running)
    if queued:
        stats.queued_mean = sum(queued) / len(queued)
        stats.queued_max = max(queued)
    if kv:
        stats.kv_cache_usage_max = max(kv)

    def delta(candidates: tuple[str, ...]) -> float | None:
        a, b = first_present(after.metrics, candidates), first_present(before.metrics, candidates)
        return None if a is None else a - (b or 0.0)

    stats.generation_tokens = delta(names.generation_tokens)
    stats.preemptions = delta(names.preemptions)
    stats.prefix_cache_hit_rate = prefix_hit_rate(delta(names.prefix_looked_up), delta(names.prefix_hits))
    drafts, draft_tokens, accepted = (
        delta(names.spec_drafts),
        delta(names.spec_draft_tokens),
        delta(names.spec_accepted_tokens),
    )
    if draft_tokens and accepted is not None:
        stats.spec_acceptance_rate = accepted / draft_tokens
    if drafts and accepted is not None:
        stats.spec_accept_length = 1.0 + accepted / drafts
    if stats.spec_accept_length is None:
        lengths = [v for v in (_max_of(s, names.spec_accept_length) for s in series) if v]
        if lengths:
            stats.spec_accept_length = sum(lengths) / len(lengths)
        else:
            stats.spec_accept_length = _accept_length_from_info(after.server_info)
    if stats.spec_acceptance_rate is None:
        rates = [v for v in (_max_of(s, names.spec_accept_rate) for s in series) if v]
        if rates:
            stats.spec_acceptance_rate = sum(rates) / len(rates)
    # Saturated: requests waited for a slot. With the server's max running requests known: some
    # scrape saw every slot busy AND a queue at the same moment. (A burst arriving between two
    # steps is counted as queued for an instant even on an idle server, so a queue alone is not
    # saturation.) Without it: on average at least one request queued.
    saturated = None
    pairs = [
        (r, q)
        for r, q in ((first_present(s, names.running), first_present(s, names.queued)) for s in series)
        if r is not None and q is not None
    ]
    if pairs and max_running:
        saturated = any(r >= max_running and q > 0 for r, q in pairs)
    elif queued:
        saturated = sum(queued) / len(queued) >= 1.0
    stats.saturated = saturated
    return stats
