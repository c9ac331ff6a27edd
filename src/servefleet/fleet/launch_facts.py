"""Capacity facts a launch fixes by itself (its flags, the model's ``config.json``), for engines
that neither print nor serve them (``transformers serve``). Read once a server is verified and
kept in its record with the verdict, so `status` and `generate` see them; the log's and the info
endpoint's facts win."""

from __future__ import annotations

import json
import posixpath

from servefleet.capacity import Capacity
from servefleet.engines.registry import get_engine
from servefleet.errors import ServefleetError
from servefleet.fleet.hosts import HostBinding
from servefleet.fleet.state import ServerState

__all__ = ["launch_capacity"]

CONFIG_LIMIT = 1 << 20  # a config.json is kilobytes; never read a stray big file whole


async def launch_capacity(record: ServerState, binding: HostBinding) -> Capacity:
    """The engine profile's launch facts for ``record``; the model's config.json is read on the
    server's host (relative to the server's folder), and is simply absent when unreadable."""
    profile = get_engine(record.engine)
    folder = profile.model_config_path(record.argv)
    config = None
    if folder:
        path = posixpath.join(record.cwd or ".", folder, "config.json")
        try:
            loaded = json.loads(await binding.host.read_bytes(path, limit=CONFIG_LIMIT))
            config = loaded if isinstance(loaded, dict) else None
        except (OSError, ValueError, ServefleetError):  # a missing folder, a Hub id, an unreachable host
            config = None
    return profile.capacity_from_launch(record.argv, config)
