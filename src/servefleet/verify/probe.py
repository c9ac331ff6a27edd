"""The HTTP side of verification: readiness probe, identity check, smoke request, capacity.

The one readiness probe: ``wait``/``up`` drive it in a loop (``waiter.py``), ``status`` asks it once
(:meth:`Prober.probe_once`); both check identity by the same rule (:meth:`Prober.identity`).
Requests go through one :class:`~servefleet.http.HttpClient` per wait, from
:func:`~servefleet.http.probe_client` (no kept connections).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from urllib.parse import urlsplit

import orjson

from servefleet.capacity import Capacity
from servefleet.engines.base import EngineProfile, Probe
from servefleet.hosts.base import Host
from servefleet.hosts.questions import Port, ask
from servefleet.http import FailureKind, HttpClient, Timeout, TransportError
from servefleet.verify.events import ProbeOutcome, ProbeResult, SmokeResult

__all__ = ["Prober", "port_of", "NEGATIVE_TTL_S"]

log = logging.getLogger(__name__)

NEGATIVE_TTL_S = 0.5
_MODELS_TIMEOUT = Timeout(5.0)
_JSON = {"Content-Type": "application/json"}


def port_of(base_url: str) -> int | None:
    try:
        parts = urlsplit(base_url)
        return parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return None


class Prober:
    """Probes one server. ``pgid`` and ``port`` (the server's port on its host, which differs from
    the URL's when the URL is an SSH forward) enable the identity check by socket owner;
    ``served_model`` enables the check by /v1/models when the owner cannot be known."""

    def __init__(
        self,
        client: HttpClient,
        base_url: str,
        host: Host,
        *,
        pgid: int | None = None,
        port: int | None = None,
        served_model: str | None = None,
    ) -> None:
        self.client = client
        self.base_url = base_url.rstrip("/")
        self.host = host
        self.pgid = pgid
        self.port = port if port is not None else port_of(base_url)
        self.served_model = served_model
        self._good_path: str | None = None
        self._identity_ok = False  # cached while the server keeps answering
        self._id_task: asyncio.Task[tuple[bool | None, str]] | None = None
        self._negative: tuple[float, str] | None = None
        self._ahead: Callable[[], tuple[EngineProfile, bool]] | None = None
        self._smoke_task: asyncio.Task[SmokeResult] | None = None
        self._capacity_task: asyncio.Task[Capacity] | None = None

    def work_ahead(self, what: Callable[[], tuple[EngineProfile, bool]]) -> None:
        """At the first 2xx, start the smoke request (when ``what()`` says so) and the capacity read
        together with the identity check, instead of one after the other: readiness is then known
        one round trip after the probe, not three. Their results are used only if the identity
        holds (a foreign server may get one tiny completion request: harmless)."""
        self._ahead = what

    def _start_ahead(self) -> None:
        if self._ahead is None or self._smoke_task is not None:
            return
        profile, smoke = self._ahead()
        if smoke:
            self._smoke_task = asyncio.create_task(self._smoke(profile))
        self._capacity_task = asyncio.create_task(self._capacity(profile))

    def _drop_ahead(self) -> None:
        for task in (self._smoke_task, self._capacity_task):
            if task is not None and not task.done():
                task.cancel()
        self._smoke_task = self._capacity_task = None

    async def close(self) -> None:
        """Cancel work started ahead that nobody collected."""
        tasks = [t for t in (self._smoke_task, self._capacity_task, self._id_task) if t is not None]
        self._drop_ahead()
        for task in tasks:
            task.cancel()
        self._id_task = None
        await asyncio.gather(*tasks, return_exceptions=True)

    async def probe(self, spec: Probe) -> ProbeResult:
        """GET the probe paths in order (404 moves on); a 2xx is OK only if the identity holds.

        While the server answers without being ready (503 while loading), its identity is checked
        in the background, so the ready answer needs no socket-table scan of its own; a foreign
        process found there is reported at once (WRONG_IDENTITY, whatever its status)."""
        paths = list(spec.paths)
        if self._good_path in paths:  # the path that answered before goes first
            paths.remove(self._good_path)
            paths.insert(0, self._good_path)
        last: ProbeResult | None = None
        timeout = Timeout(spec.timeout_s)
        for path in paths:
            try:
                status = (await self.client.get(self.base_url + path, timeout=timeout)).status
            except TransportError as exc:
                if exc.kind is FailureKind.TIMEOUT:
                    self._drop_ahead()
                    return ProbeResult(
                        ProbeOutcome.HTTP, None, path, f"no answer to GET {path} within {spec.timeout_s:g}s"
                    )
                if exc.kind is FailureKind.PROTOCOL:  # something answers, not in HTTP
                    self._drop_ahead()
                    return ProbeResult(ProbeOutcome.HTTP, None, path, f"GET {path}: {exc.failure.message}")
                return self._gone(ProbeResult(ProbeOutcome.REFUSED, None, path, exc.failure.message))
            if status == 404:
                last = ProbeResult(ProbeOutcome.HTTP, 404, path, f"GET {path} -> 404")
                continue
            if 200 <= status < 300:
                self._start_ahead()
                ok, detail = await self._identity_now()
                if ok is None:
                    return self._gone(ProbeResult(ProbeOutcome.REFUSED, None, path, detail))
                if not ok:
                    self._drop_ahead()
                    return ProbeResult(ProbeOutcome.WRONG_IDENTITY, status, path, detail)
                self._good_path = path
                return ProbeResult(ProbeOutcome.OK, status, path, f"GET {path} -> {status}")
            last = ProbeResult(ProbeOutcome.HTTP, status, path, f"GET {path} -> {status}")
            break
        self._drop_ahead()
        result = last or ProbeResult(ProbeOutcome.HTTP, None, None, "no probe paths")
        known, detail = self._identity_peek()
        if known is False:
            return ProbeResult(ProbeOutcome.WRONG_IDENTITY, result.status, result.path, detail)
        return result

    async def probe_once(self, spec: Probe) -> ProbeResult:
        """One probe that also settles whose answer a non-ready status is (``status``: no second
        probe follows to collect the identity checked in the background)."""
        result = await self.probe(spec)
        if result.outcome is ProbeOutcome.HTTP and result.status is not None and not self._identity_ok:
            ok, detail = await self._identity_now()
            if ok is False:
                return ProbeResult(ProbeOutcome.WRONG_IDENTITY, result.status, result.path, detail)
        return result

    def _gone(self, result: ProbeResult) -> ProbeResult:
        """Nothing answers (any more): forget the identity and the work started ahead."""
        self._identity_ok = False
        if self._id_task is not None:
            self._id_task.cancel()
            self._id_task = None
        self._drop_ahead()
        return result

    def _identity_peek(self) -> tuple[bool | None, str]:
        """The identity if known by now; else start finding it out in the background."""
        if self._identity_ok:
            return True, ""
        task = self._id_task
        if task is None:
            self._id_task = asyncio.create_task(self.identity())
            return None, ""
        if not task.done():
            return None, ""
        self._id_task = None
        if task.cancelled():
            return None, ""
        ok, detail = task.result()
        self._identity_ok = ok is True
        return ok, detail

    async def _identity_now(self) -> tuple[bool | None, str]:
        """The identity, waiting for a check in flight (or starting one)."""
        if self._identity_ok:
            return True, ""
        task = self._id_task or asyncio.create_task(self.identity())
        self._id_task = None
        try:
            await asyncio.wait([task])
        except asyncio.CancelledError:
            task.cancel()
            raise
        if task.cancelled():
            return None, "the identity check was interrupted"
        ok, detail = task.result()
        self._identity_ok = ok is True
        return ok, detail

    async def identity(self) -> tuple[bool | None, str]:
        """Whether the answering process is our server (True), another (False), or nobody any
        more (None: the server stopped answering between the probe and this check).

        A "not ours" is reused for ``NEGATIVE_TTL_S``: a socket-table scan per probe would cost a
        core while a foreign process holds the port."""
        if self._negative is not None and time.monotonic() - self._negative[0] < NEGATIVE_TTL_S:
            return False, self._negative[1]
        ok, detail = await self._identity()
        self._negative = (time.monotonic(), detail) if ok is False else None
        return ok, detail

    async def _identity(self) -> tuple[bool | None, str]:
        if self.pgid is not None and self.port is not None:
            holder = await ask(self.host, Port(self.port))  # from the status batch where it was asked
            if holder is not None and holder.pgid is not None:
                if holder.pgid == self.pgid:
                    return True, ""
                seen = f", seen by {holder.evidence}" if holder.evidence else ""
                return (
                    False,
                    f"port {self.port} is held by pid {holder.pid} (process group {holder.pgid}{seen}), not by process group {self.pgid}",
                )
            # Nobody visible listens (a socket in another namespace, or ours just closed): the
            # served model, when known, decides.
        if self.served_model:
            names, down = await self._models()
            if down:
                return None, "the server stopped answering"
            if names is None:
                return False, "/v1/models does not answer with a model list"
            if self.served_model not in names:
                return False, f"/v1/models lists {', '.join(names) or 'no model'}, not {self.served_model!r}"
        return True, ""

    async def served_names(self) -> list[str] | None:
        """Model ids listed by /v1/models, or None when it does not answer a list."""
        return (await self._models())[0]

    async def _models(self) -> tuple[list[str] | None, bool]:
        """(model ids or None, whether the server was unreachable)."""
        try:
            resp = await self.client.get(self.base_url + "/v1/models", timeout=_MODELS_TIMEOUT)
        except TransportError:
            return None, True
        if resp.status != 200:
            return None, False
        try:
            body = resp.json()
        except ValueError:
            return None, False
        data = body.get("data") if isinstance(body, dict) else None
        if not isinstance(data, list):
            return None, False
        return [str(m.get("id")) for m in data if isinstance(m, dict) and m.get("id") is not None], False

    async def smoke(self, profile: EngineProfile, timeout_s: float = 60.0) -> SmokeResult:
        """One tiny completion; any non-2xx or broken connection is a start-up failure."""
        if self._smoke_task is not None:  # started ahead, with the identity check
            task, self._smoke_task = self._smoke_task, None
            await asyncio.wait([task])
            if not task.cancelled():  # cancelled: the probe failed meanwhile; ask again
                return task.result()
        return await self._smoke(profile, timeout_s)

    async def _smoke(self, profile: EngineProfile, timeout_s: float = 60.0) -> SmokeResult:
        name = self.served_model
        if not name:
            names = await self.served_names()
            name = names[0] if names else "default"
        path, body = profile.smoke_request(name)
        t0 = time.monotonic()
        try:
            resp = await self.client.post(
                self.base_url + path, orjson.dumps(body), headers=_JSON, timeout=Timeout(timeout_s)
            )
        except TransportError as exc:
            if exc.kind is FailureKind.TIMEOUT:
                return SmokeResult(False, f"POST {path}: no answer within {timeout_s:g}s")
            return SmokeResult(False, f"POST {path}: {exc.failure.message}")
        status, text = resp.status, resp.text()
        if 200 <= status < 300:
            return SmokeResult(True, f"POST {path} -> {status} in {time.monotonic() - t0:.2f}s")
        return SmokeResult(False, f"POST {path} -> HTTP {status}: {' '.join(text.split())[:200]}")

    async def capacity(self, profile: EngineProfile, timeout_s: float = 5.0) -> Capacity:
        """Capacity from the server's info endpoints; empty when they fail (logs remain)."""
        if self._capacity_task is not None:  # started ahead, with the identity check
            task, self._capacity_task = self._capacity_task, None
            await asyncio.wait([task])
            if not task.cancelled():
                return task.result()
        return await self._capacity(profile, timeout_s)

    async def _capacity(self, profile: EngineProfile, timeout_s: float = 5.0) -> Capacity:
        try:
            async with asyncio.timeout(timeout_s):
                return await profile.capacity_from_server(self.client, self.base_url)
        except Exception as exc:  # an info endpoint is a bonus, never a reason to fail a ready server
            log.debug("%s: no capacity from its info endpoints (%s: %s)", self.base_url, type(exc).__name__, exc)
            return Capacity()
