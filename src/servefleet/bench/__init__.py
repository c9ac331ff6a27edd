"""`servefleet bench` and `servefleet compare`: load generation, measurement, results, comparison.

Modules, one job each (import what you need; this package imports nothing heavy so that the
load-generating worker processes start fast):

* ``workload``       prompts of controlled token length, or a JSONL/Parquet sample; encoded bodies
* ``client``         the HTTP backend (aiohttp, one pooled session) and per-request records
* ``sse``            the streaming parser (raw bytes, no per-event JSON parsing)
* ``loadgen``        closed-loop (concurrency) and open-loop (Poisson rate) scheduling
* ``pool``           in-process or multi-process execution of a point
* ``selfcheck``      event-loop lag and CPU of the client: is the client the limit?
* ``server_metrics`` Prometheus /metrics and SGLang /server_info around each point
* ``metrics``        records -> per-point numbers (per-token ITL, token sources)
* ``sweep``          one run of one server: discovery, probe, points -> ``Run``
* ``result``         the RUN.json schema (contract names)
* ``compare``        runs side by side (data; the tables and plots are in ``servefleet.cli``)
"""
