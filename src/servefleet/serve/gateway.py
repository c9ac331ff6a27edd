"""The gateway as one object: configuration, start (bind, admit the servers, start watching), and a
graceful stop (stop listening, let requests in flight finish within the grace period)."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from servefleet.errors import ConfigError, OptionError
from servefleet.generate.client import Client
from servefleet.generate.endpoints import Restarter, Target
from servefleet.generate.health import HealthPolicy
from servefleet.serve.app import build_app
from servefleet.serve.forward import Forwarder
from servefleet.serve.router import Router
from servefleet.serve.supervisor import Supervisor

__all__ = ["ServeConfig", "Gateway", "is_loopback", "check_bind", "read_key_file"]

log = logging.getLogger("servefleet.serve")


class ServeConfig(BaseModel):
    model_config = ConfigDict(frozen=True)

    host: str = "127.0.0.1"
    port: int = Field(8300, ge=0, le=65535)
    api_keys: tuple[str, ...] = ()
    concurrency: int | None = Field(None, ge=1)  # fixed per-server limit; None: from capacity, then measured
    max_queue: int | None = Field(
        None, ge=0
    )  # per model; None: one batch (the sum of its servers' limits), at least 8
    queue_timeout_s: float = Field(60.0, gt=0)
    max_body_bytes: int = Field(16 * 2**20, ge=1)
    max_attempts: int = Field(3, ge=1)
    grace_s: float = Field(30.0, ge=0)
    poll_interval_s: float = Field(2.0, gt=0)
    request_timeout_s: float = Field(3600.0, gt=0)
    health: HealthPolicy = Field(default_factory=HealthPolicy)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name: it may resolve anywhere


def check_bind(host: str, api_keys: tuple[str, ...]) -> None:
    """Anyone who can reach a non-loopback address could use the fleet: a key is required there."""
    if not is_loopback(host) and not api_keys:
        raise OptionError(
            f"--host {host} is not a loopback address: give --api-key KEY or --api-key-file FILE "
            "(anyone who reaches it could use the fleet), or bind 127.0.0.1"
        )


def read_key_file(path: Path) -> tuple[str, ...]:
    """One key a line; blank lines and ``#`` comments skipped."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise OptionError(f"--api-key-file {path}: cannot read it ({exc.strerror or exc})") from None
    keys = tuple(line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#"))
    if not keys:
        raise OptionError(f"--api-key-file {path}: holds no key (one a line)")
    return keys


class Gateway:
    """``ready``: the fleet's ready servers now (polled every ``poll_interval_s``: servers that
    become ready are admitted); None for a fixed set (``--url``)."""

    def __init__(
        self,
        config: ServeConfig,
        *,
        restarter: Restarter | None = None,
        ready: Callable[[], Awaitable[list[Target]]] | None = None,
        on_event: Callable[[str], None] | None = None,
    ) -> None:
        self.config = config
        self.client = Client(request_timeout_s=config.request_timeout_s)
        self.router = Router(max_queue=config.max_queue, queue_timeout_s=config.queue_timeout_s)
        self.supervisor = Supervisor(
            self.router,
            self.client,
            policy=config.health,
            concurrency=config.concurrency,
            restarter=restarter,
            on_event=on_event,
        )
        self.forwarder = Forwarder(
            self.router,
            self.client,
            self.supervisor,
            max_attempts=config.max_attempts,
            request_timeout_s=config.request_timeout_s,
        )
        self.ready = ready
        self.stopping = False
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def start(self, targets: list[Target]) -> str:
        """Admit ``targets``, bind, start watching; the base URL (``http://host:port/v1``)."""
        for t in targets:
            await self.supervisor.admit(t)
        if not self.router.backends:
            names = ", ".join(t.name for t in targets) or "none"
            raise ConfigError(
                f"no server answers /v1/models (servers: {names}); start them (`servefleet up`) and try again"
            )
        self._runner = web.AppRunner(
            build_app(self), shutdown_timeout=self.config.grace_s, handle_signals=False, access_log=None
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.config.host, self.config.port, reuse_address=True)
        try:
            await site.start()
        except OSError as exc:
            await self._runner.cleanup()
            raise ConfigError(
                f"--host {self.config.host} --port {self.config.port}: cannot listen there ({exc.strerror or exc})"
            ) from None
        host, port = self._runner.addresses[0][:2]
        shown = f"[{host}]" if ":" in str(host) else host
        self.url = f"http://{shown}:{port}/v1"
        self.supervisor.spawn(self.supervisor.monitor())
        if self.ready is not None:
            self.supervisor.spawn(self.supervisor.follow_fleet(self.ready, self.config.poll_interval_s))
        return self.url

    async def stop(self) -> None:
        """Stop listening; requests in flight (and those queued) finish within ``grace_s``, the rest
        are cancelled; then the watchers and the client close."""
        if self.stopping:
            return
        self.stopping = True
        if self._runner is not None:
            await self._runner.cleanup()
        await self.supervisor.close()
        await self.client.close()

    async def serve(
        self, targets: list[Target], stop: asyncio.Event, on_url: Callable[[str], None] | None = None
    ) -> None:
        url = await self.start(targets)
        if on_url is not None:
            on_url(url)
        try:
            await stop.wait()
        finally:
            await self.stop()
