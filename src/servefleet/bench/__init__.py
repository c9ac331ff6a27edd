"""`servefleet bench` and `servefleet compare`: load generation, measurement, results, comparison.

Modules, one job each (import what you need; this package imports nothing heavy so that the
load-generating worker processes start fast):

* ``workload``       prompts of controlled token length, or a JSONL/Parquet sample; encoded bodies
* ``client``         the request backend (one pooled ``servefleet.http`` client) and per-request records
* ``sse``            the streaming parser (raw bytes, no per-event JSON parsing)
* ``loadgen``        closed-loop (concurrency) and open-loop (Poisson rate) scheduling
* ``pool``           in-process or multi-process execution of a point
* ``selfcheck``      event-loop lag and CPU of the client: is the client the limit?
* ``server_metrics`` Prometheus /metrics and SGLang /server_info around each point
* ``metrics``        records -> per-point numbers (per-token ITL, token sources)
* ``discovery``      what the server is: model, engine (recognised by the profiles), version, capacity
* ``negotiate``      the request options asked for, and the probe request that drops refused ones
* ``sweep``          one run of one server: discovery, negotiation, points -> ``Run``
* ``errors``         BenchError, ServerUnreachable
* ``result``         the RUN.json schema (contract names)
* ``compare``        runs side by side (data; the tables and plots are in ``servefleet.cli``)
"""
