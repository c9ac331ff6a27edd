"""Prometheus metrics of a running job (``generate --metrics-port N``), with ``prometheus_client``.

A collector reads :class:`~servefleet.generate.stats.JobStats` when scraped -- the dispatcher's hot
path stays as it is (no metric objects to update per request); from the server's thread it only reads
(plain numbers, and rates by ``RateMeter.peek_rate``, which changes nothing). The HTTP server is the client
library's own (a daemon thread), bound to 127.0.0.1 unless ``--metrics-host`` says otherwise; it is
started before the pre-pass, so a port in use is refused before anything is read or sent, and it
serves only the job's own registry (no process or platform collectors).

Names (``servefleet_generate_`` prefix; counters count this run, since the process started):
prompts (gauge, ``state`` = total | done | remaining | failed), prompts_answered_total,
prompts_committed_total, prompts_failed_total, retries_total, requeued_total, output_tokens_total,
prompt_tokens_total, output_tokens_per_second (last 10 s), and per ``server``: server_up,
server_in_flight, server_concurrency_limit, server_output_tokens_per_second, server_requests_total,
server_errors_total, server_output_tokens_total, server_restarts_total, server_outages_total. An
elastic job (``--fleet``, generate/membership.py) adds servers_in_service (gauge) and
membership_total (``event`` = joins | leaves | replacements | releases | handovers).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CollectorRegistry, CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import start_http_server

from servefleet.errors import ConfigError
from servefleet.generate.stats import JobStats

__all__ = ["JobMetrics", "PREFIX"]

PREFIX = "servefleet_generate_"


class _Collector:
    def __init__(self) -> None:
        self.stats: JobStats | None = None

    def collect(self) -> Iterator[Metric]:
        st = self.stats
        if st is None:  # pre-pass, probing: nothing counted yet
            return
        done = st.done_before + st.done
        prompts = GaugeMetricFamily(
            PREFIX + "prompts", "Prompts of the job (valid input ids) by state", labels=["state"]
        )
        for state, value in (
            ("total", st.total),
            ("done", done),
            ("remaining", max(0, st.total - done - st.failed)),
            ("failed", st.failed),
        ):
            prompts.add_metric([state], value)
        yield prompts
        for name, doc, value in (
            ("prompts_answered", "Prompts answered in this run", st.done),
            ("prompts_committed", "Prompts of this run in committed shards", st.committed),
            ("prompts_failed", "Prompts that failed every attempt in this run", st.failed),
            ("retries", "Requests retried", st.retries),
            ("requeued", "In-flight requests re-queued from a server taken out", st.requeued),
            ("output_tokens", "Output (completion) tokens received", st.completion_tokens),
            ("prompt_tokens", "Prompt tokens sent, as the servers counted them", st.prompt_tokens),
        ):
            yield CounterMetricFamily(PREFIX + name, doc, value=value)
        yield GaugeMetricFamily(
            PREFIX + "output_tokens_per_second",
            "Output tokens per second over the last 10 s",
            value=st.meter.peek_rate(),
        )
        if st.width is not None:
            yield GaugeMetricFamily(PREFIX + "servers_in_service", "Servers taking requests now", value=st.width)
        if st.membership:
            changes = CounterMetricFamily(
                PREFIX + "membership",
                "Servers that joined, left for good, were replaced or released",
                labels=["event"],
            )
            for event, n in list(st.membership.items()):
                changes.add_metric([event], n)
            yield changes
        servers = list(st.servers.values())
        families: list[tuple[Any, str, str, Any]] = [
            (
                GaugeMetricFamily,
                "server_up",
                "1 while the server is in service, 0 while taken out or given up",
                lambda s: float(s.state == "up"),
            ),
            (GaugeMetricFamily, "server_in_flight", "Requests in flight", lambda s: s.in_flight),
            (GaugeMetricFamily, "server_concurrency_limit", "The server's concurrency limit now", lambda s: s.limit),
            (
                GaugeMetricFamily,
                "server_output_tokens_per_second",
                "Output tokens per second over the last 10 s",
                lambda s: s.meter.peek_rate(),
            ),
            (CounterMetricFamily, "server_requests", "Answered requests", lambda s: s.requests),
            (CounterMetricFamily, "server_errors", "Failed requests (each attempt)", lambda s: s.errors),
            (CounterMetricFamily, "server_output_tokens", "Output tokens received", lambda s: s.completion_tokens),
            (CounterMetricFamily, "server_restarts", "Restarts through the fleet", lambda s: s.restarts),
            (CounterMetricFamily, "server_outages", "Times the server was taken out", lambda s: s.outages),
        ]
        for cls, name, doc, read in families:
            fam = cls(PREFIX + name, doc, labels=["server"])
            for s in servers:
                fam.add_metric([s.name], read(s))
            yield fam


class JobMetrics:
    """``with JobMetrics(host, port) as m: ... m.attach(stats)``: serves the job's metrics meanwhile."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.host = host
        self.port = port
        self.registry = CollectorRegistry(auto_describe=False)
        self._collector = _Collector()
        self.registry.register(self._collector)
        self._server: Any = None
        self._thread: threading.Thread | None = None

    def attach(self, stats: JobStats) -> None:
        self._collector.stats = stats

    def __enter__(self) -> JobMetrics:
        try:
            self._server, self._thread = start_http_server(self.port, addr=self.host, registry=self.registry)
        except OSError as exc:
            raise ConfigError(
                f"--metrics-port {self.port}: cannot listen on {self.host}:{self.port} ({exc.strerror or exc}); "
                "pick another port"
            ) from None
        self.port = self._server.server_port
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
