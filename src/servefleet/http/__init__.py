"""servefleet's one HTTP layer: sessions, timeouts, one failure taxonomy, an injectable transport.

It knows HTTP, not engines: which endpoint to ask and how to read it is the engine profiles'
(``servefleet.engines``). Importing this package does not load aiohttp; the real transport
(``servefleet.http.aiohttp_transport``) loads with the first client that needs it.

Modules: ``failure`` (the taxonomy), ``transport`` (the interface, Response, Timeout, Pool),
``client`` (HttpClient), ``aiohttp_transport`` (the real one), ``mock`` (the fake for tests).
"""

from servefleet.http.client import INFO_TIMEOUT, HttpClient, probe_client
from servefleet.http.failure import RETRY_STATUS, FailureKind, RequestFailure, TransportError, status_class
from servefleet.http.transport import Pool, Response, StreamResponse, Timeout, Transport, decode_json

__all__ = [
    "HttpClient",
    "probe_client",
    "INFO_TIMEOUT",
    "FailureKind",
    "RequestFailure",
    "TransportError",
    "status_class",
    "RETRY_STATUS",
    "Pool",
    "Response",
    "StreamResponse",
    "Timeout",
    "Transport",
    "decode_json",
]
