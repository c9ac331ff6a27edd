"""Exposing a fleet server's port on this machine (`servefleet tunnel NAME`).

A remote server binds 127.0.0.1 on its host; other tools (a notebook, a benchmark, curl) reach it
through a local forward over the host's SSH master connection. A local server needs no tunnel:
its own URL is returned. The forward lives as long as the Fleet (the process) that opened it;
``keep_open`` re-checks it periodically so a dropped link is repaired on the same local port.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from servefleet.errors import ConfigError, StateError
from servefleet.fleet.core import Fleet
from servefleet.fleet.spec import LOCAL

__all__ = ["Tunnel", "open_tunnel", "keep_open"]


@dataclass(frozen=True)
class Tunnel:
    name: str
    host: str  # the fleet's host name ("local" or a [hosts.NAME])
    remote: str  # bind address and port on that host
    url: str  # what tools on this machine use

    def to_json(self) -> dict[str, str]:
        return {"name": self.name, "host": self.host, "remote": self.remote, "url": self.url}


async def open_tunnel(fleet: Fleet, name: str, local_port: int | None = None) -> Tunnel:
    """Forward a local port to server ``name`` (found from its state record, local or remote)."""
    record = await fleet.record(name)
    if record is None:
        raise StateError(
            f"server {name!r} has no state record: it was never launched (`servefleet up`) or was brought down"
        )
    binding = fleet.binding(record.host)
    if record.host == LOCAL:
        if local_port is not None:
            raise ConfigError(f"server {name!r} runs on this machine; --local-port applies to remote servers only")
        url = await binding.host.url_for(record.port, record.bind)
    else:
        url = await binding.host.url_for(record.port, record.bind, local_port=local_port)  # type: ignore[call-arg]  # only SSHHost.url_for takes local_port; this branch is the remote one
    return Tunnel(name=name, host=record.host, remote=f"{record.bind}:{record.port}", url=url)


async def keep_open(fleet: Fleet, tunnel: Tunnel, interval_s: float = 5.0) -> None:
    """Never returns: re-asserts the forward every ``interval_s`` (a dead master is restarted and
    the forward re-added on the same local port)."""
    record = await fleet.record(tunnel.name)
    if record is None or record.host == LOCAL:
        await asyncio.Event().wait()
        return
    host = fleet.binding(record.host).host
    while True:
        await asyncio.sleep(interval_s)
        await host.url_for(record.port, record.bind)
