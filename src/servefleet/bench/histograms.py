"""Prometheus histograms from ``/metrics``, differenced over one point, summarised as a :class:`Stat`.

An engine's latency histograms (names from its profile: ``EngineProfile.latency_metrics``) count
every request it served. Scraped just before a point's measured requests (after the warm-up) and
just after them, the difference holds exactly that point's requests (plus anything else the server
served meanwhile). The mean is exact (sum / count); percentiles are interpolated linearly inside
buckets, as Prometheus' ``histogram_quantile`` does, so they are only as fine as the buckets: each
percentile carries its bucket (``Stat.resolution_ms``), and one in the first or the open last bucket
is not given at all (vLLM's inter-token buckets start at 10 ms: a faster server's ITL p50 is "under
10 ms", not the 5.00 ms interpolation would make of it; bench then times a streamed sample).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from servefleet.bench.result import Stat

__all__ = ["Histogram", "histogram", "first_histogram"]

_LE = re.compile(r'(?:^|,)le="([^"]*)"')


@dataclass(frozen=True)
class Histogram:
    """Cumulative bucket counts by upper bound (``inf`` last), with sum and count, summed over label sets."""

    name: str
    buckets: tuple[tuple[float, float], ...]
    sum: float
    count: float

    def minus(self, earlier: Histogram | None) -> Histogram:
        """What was observed between ``earlier`` and this scrape (a counter reset reads as all of this one)."""
        if earlier is None or earlier.count > self.count:
            return self
        before = dict(earlier.buckets)
        return Histogram(
            self.name,
            tuple((le, n - before.get(le, 0.0)) for le, n in self.buckets),
            self.sum - earlier.sum,
            self.count - earlier.count,
        )

    def quantile(self, q: float) -> float | None:
        found = self.quantile_in_bucket(q)
        return None if found is None else found[0]

    def quantile_in_bucket(self, q: float) -> tuple[float, float, float] | None:
        """(interpolated value, lower bound, upper bound) of the bucket the ``q`` quantile falls in."""
        if self.count <= 0 or not self.buckets:
            return None
        rank = q * self.count
        lower_bound, lower_count = 0.0, 0.0
        for le, cum in self.buckets:
            if cum >= rank:
                if math.isinf(le):
                    return lower_bound, lower_bound, le  # beyond the last finite bucket: its bound is all we know
                if cum == lower_count:
                    return le, lower_bound, le
                return lower_bound + (le - lower_bound) * (rank - lower_count) / (cum - lower_count), lower_bound, le
            lower_bound, lower_count = le, cum
        return lower_bound, lower_bound, math.inf

    def stat(self, scale: float = 1000.0) -> Stat:
        """mean (exact) and p50/p90/p99 in milliseconds; ``n`` observations; ``resolution_ms`` the bucket
        each percentile fell in. A percentile in the first bucket (from 0) or past the last finite bound
        is left out (None): interpolating there is an artefact (every fast server's ITL p50 read 5.00 ms,
        the middle of vLLM's 0-10 ms bucket), and its bucket says all that is known ("under 10 ms")."""
        if self.count <= 0:
            return Stat()
        values: dict[str, float | None] = {}
        resolution: dict[str, tuple[float, float | None]] = {}
        for name, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99)):
            found = self.quantile_in_bucket(q)
            if found is None:
                values[name] = None
                continue
            value, lower, upper = found
            resolution[name] = (lower * scale, None if math.isinf(upper) else upper * scale)
            values[name] = None if lower <= 0 or math.isinf(upper) else value * scale
        return Stat(mean=self.sum / self.count * scale, n=int(round(self.count)), resolution_ms=resolution, **values)


def histogram(metrics: dict[str, float], name: str) -> Histogram | None:
    """The histogram ``name`` from :func:`~servefleet.bench.server_metrics.parse_prometheus` output
    (which keeps every series under its ``name{labels}`` key), or None when the server has none."""
    prefix = name + "_bucket{"
    by_le: dict[float, float] = {}
    for key, value in metrics.items():
        if not key.startswith(prefix):
            continue
        m = _LE.search(key[len(prefix) : -1])
        if m is None:
            continue
        try:
            le = float(m.group(1))  # "+Inf" parses as inf
        except ValueError:
            continue
        by_le[le] = by_le.get(le, 0.0) + value
    if not by_le or name + "_count" not in metrics:
        return None
    return Histogram(name, tuple(sorted(by_le.items())), metrics.get(name + "_sum", 0.0), metrics[name + "_count"])


def first_histogram(metrics: dict[str, float], names: tuple[str, ...]) -> Histogram | None:
    """The first of ``names`` the server publishes."""
    for name in names:
        found = histogram(metrics, name)
        if found is not None:
            return found
    return None
