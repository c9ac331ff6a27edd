"""``/metrics`` of the gateway, in Prometheus' text format (``prometheus_client``), read from the
router when scraped: nothing is updated per request beyond the plain counters the gateway keeps.

Names (``servefleet_serve_`` prefix), per ``server``: server_up, server_in_flight,
server_concurrency_limit, server_output_tokens_per_second (last 10 s; a streamed answer counts one
token per event), server_requests_total, server_errors_total, server_outages_total,
server_restarts_total; per ``model``: model_queued, model_rejected_total (429s given); and
retries_total (attempts sent again to another server).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import CollectorRegistry, CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from servefleet.serve.router import Router

__all__ = ["GatewayMetrics", "PREFIX", "CONTENT_TYPE_LATEST"]

PREFIX = "servefleet_serve_"


class _Collector:
    def __init__(self, router: Router, retried: Callable[[], int]) -> None:
        self.router = router
        self.retried = retried

    def collect(self) -> Iterator[Metric]:
        backends = list(self.router.backends.values())
        labels = ["server", "model"]
        gauges = {
            name: GaugeMetricFamily(PREFIX + name, doc, labels=labels)
            for name, doc in (
                ("server_up", "1 while the server takes requests"),
                ("server_in_flight", "Requests on the server now"),
                ("server_concurrency_limit", "Requests the gateway keeps in flight at most on the server"),
                ("server_output_tokens_per_second", "Output tokens per second over the last 10 s"),
            )
        }
        counters = {
            name: CounterMetricFamily(PREFIX + name, doc, labels=labels)
            for name, doc in (
                ("server_requests", "Requests the server answered (any status)"),
                ("server_errors", "Attempts that failed on the server (no answer, or an error status)"),
                ("server_outages", "Times the server was taken out"),
                ("server_restarts", "Times the server was restarted through the fleet"),
            )
        }
        for b in backends:
            key = [b.name, ",".join(b.models)]
            gauges["server_up"].add_metric(key, 1.0 if b.usable else 0.0)
            gauges["server_in_flight"].add_metric(key, b.in_flight)
            gauges["server_concurrency_limit"].add_metric(key, b.limit)
            gauges["server_output_tokens_per_second"].add_metric(key, b.tokens.peek_rate())
            counters["server_requests"].add_metric(key, b.requests)
            counters["server_errors"].add_metric(key, b.errors)
            counters["server_outages"].add_metric(key, b.health.outages)
            counters["server_restarts"].add_metric(key, b.health.restarts)
        yield from gauges.values()
        yield from counters.values()
        queued = GaugeMetricFamily(
            PREFIX + "model_queued", "Requests waiting for a server of the model", labels=["model"]
        )
        rejected = CounterMetricFamily(
            PREFIX + "model_rejected", "Requests refused with 429 (the model's queue was full)", labels=["model"]
        )
        for m in self.router.models():
            queued.add_metric([m], self.router.queued(m))
            rejected.add_metric([m], self.router.rejected.get(m, 0))
        yield queued
        yield rejected
        yield CounterMetricFamily(
            PREFIX + "retries",
            "Requests sent again to another server (the first sent the client nothing)",
            value=self.retried(),
        )


class GatewayMetrics:
    def __init__(self, router: Router, retried: Callable[[], int]) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(router, retried))

    def render(self) -> bytes:
        return generate_latest(self.registry)
