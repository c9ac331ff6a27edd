"""Jobs using a fleet: one small record per running ``generate --fleet``, in the state folder.

``<state_dir>/jobs/<pid>.json`` says which job (pid, host, output) sends to which servers, and which
of them it has *parked* (stopped sending to and has nothing in flight on, after ``down`` or
``drain``). ``down`` names the jobs it interrupts; ``drain`` waits until each job has parked the
server. A record whose process is gone (same host, pid dead or reused) is stale and ignored.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import psutil
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from servefleet.fleet.state import _atomic_write, utcnow

__all__ = ["JobUse", "JobUses"]


class JobUse(BaseModel):
    model_config = ConfigDict(extra="ignore")

    pid: int
    host: str
    started: float  # the process's start time (psutil): a reused pid is not this job
    output: str
    since: datetime
    servers: list[str] = Field(default_factory=list)  # the servers it dispatches to
    parked: list[str] = Field(default_factory=list)  # stopped or drained by the user: nothing in flight, nothing sent

    def describe(self) -> str:
        where = "" if self.host == socket.gethostname() else f" on {self.host}"
        return f"generate pid {self.pid}{where} (output {self.output})"

    def uses(self, name: str) -> bool:
        """Whether it may still send to (or await answers from) server ``name``."""
        return name in self.servers and name not in self.parked


class JobUses:
    def __init__(self, state_dir: Path) -> None:
        self.dir = Path(state_dir) / "jobs"

    def _path(self, pid: int) -> Path:
        return self.dir / f"{pid}.json"

    @contextlib.contextmanager
    def recording(self, output: str, servers: list[str]) -> Iterator[JobUse]:
        """This process's record while the block runs."""
        me = psutil.Process()
        use = JobUse(
            pid=me.pid,
            host=socket.gethostname(),
            started=me.create_time(),
            output=output,
            since=utcnow(),
            servers=servers,
        )
        self.save(use)
        try:
            yield use
        finally:
            with contextlib.suppress(FileNotFoundError):
                self._path(use.pid).unlink()

    def save(self, use: JobUse) -> None:
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        _atomic_write(self._path(use.pid), (use.model_dump_json(indent=2) + "\n").encode())

    def live(self) -> list[JobUse]:
        """The jobs running now (stale records of this host are removed)."""
        if not self.dir.is_dir():
            return []
        out = []
        for path in sorted(self.dir.glob("*.json")):
            try:
                use = JobUse.model_validate(json.loads(path.read_text()))
            except (OSError, ValueError, ValidationError):
                continue
            if use.host == socket.gethostname() and not _alive(use):
                with contextlib.suppress(OSError):
                    path.unlink()
                continue
            out.append(use)
        return out


def _alive(use: JobUse) -> bool:
    if use.pid == os.getpid():
        return True
    try:
        return abs(psutil.Process(use.pid).create_time() - use.started) < 1.0
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False
