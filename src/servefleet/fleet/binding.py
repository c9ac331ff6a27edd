"""One fleet host as the lifecycle sees it: the ``Host`` and where this fleet keeps its files there."""

from __future__ import annotations

import posixpath
from collections.abc import Callable
from dataclasses import dataclass, field

from servefleet.hosts.base import Host

__all__ = ["HostBinding"]


@dataclass
class HostBinding:
    """One fleet host: the transport and where this fleet keeps its files on it.

    ``work_dir`` holds ``logs/<server>.log`` and ``run/<server>.status`` on the host itself. For a
    remote host ``remote_state`` is true: the state record is also written there, so a new local
    machine with only the fleet file can rediscover running servers.
    """

    name: str
    host: Host
    work_dir: str  # as written: a remote one may start with "~" (see ``folder``)
    cwd: str | None = None  # working folder of launched servers (relative model paths)
    env: dict[str, str] = field(default_factory=dict)  # added to every server's env on this host
    python: str = "python3"  # interpreter when a server does not name one
    remote_state: bool = False
    # The host's own path for a path as written: an SSH host's "~" is its remote home once
    # connected, so records name the paths the remote processes were given (the lifecycle
    # recognises its servers by their log path). Before that, the path as written.
    expand: Callable[[str], str] | None = None
    # The host picks the port when the server starts (a Slurm job, on its node): the argv it is
    # given carries engines.base.PORT_SLOT where the port goes (LaunchSpec.port_slot).
    port_slot: bool = False

    @property
    def folder(self) -> str:
        """``work_dir`` as the host names it."""
        return self.expand(self.work_dir) if self.expand is not None else self.work_dir

    def log_path(self, server: str) -> str:
        return posixpath.join(self.folder, "logs", f"{server}.log")

    def status_path(self, server: str) -> str:
        return posixpath.join(self.folder, "run", f"{server}.status")

    def state_path(self, server: str) -> str:
        return posixpath.join(self.folder, "state", f"{server}.json")
