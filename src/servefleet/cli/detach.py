"""`generate --detach`: the job in a session of its own, so that it outlives the terminal or SSH
session that started it (as servers launched by `up` do); `servefleet progress DEST` follows it.

The parent starts the same command without ``--detach`` (stdin from /dev/null, stdout and stderr to
a log file, a new session: no terminal to lose) and waits until the child says it is sending (a line
on a pipe whose descriptor is in ``SERVEFLEET_READY_FD``) or exits. An early exit -- a bad input, a
destination held by another run, nothing left to do -- is the parent's exit too, with the log's
end, so a detached start never reports success it did not have.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass

__all__ = ["READY_FD_ENV", "Detached", "detach", "say_ready"]

READY_FD_ENV = "SERVEFLEET_READY_FD"
READY = b"sending\n"


@dataclass
class Detached:
    pid: int
    log: str
    running: bool  # False: it ended before sending; ``exit_code`` and the log say why
    exit_code: int | None = None

    def log_tail(self, limit: int = 3000) -> str:
        try:
            with open(self.log, "rb") as f:
                f.seek(max(0, os.path.getsize(self.log) - limit))
                return f.read().decode(errors="replace")
        except OSError:
            return ""


def detach(args: list[str], log: str) -> Detached:
    """Start ``servefleet ARGS`` (``--detach`` already left out) detached; return once it is
    sending, or has ended."""
    read_fd, write_fd = os.pipe()
    try:
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "servefleet.cli.main", *args],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                pass_fds=(write_fd,),
                env={**os.environ, READY_FD_ENV: str(write_fd)},
            )
    finally:
        os.close(write_fd)
    with os.fdopen(read_fd, "rb") as ready:
        said = ready.readline()  # EOF when the child ends (or closes it) without saying it is sending
    if said == READY:
        return Detached(proc.pid, log, running=True)
    return Detached(proc.pid, log, running=False, exit_code=proc.wait())


def say_ready() -> None:
    """In the detached child: tell the parent the job is sending (once; a no-op when not detached)."""
    fd = os.environ.pop(READY_FD_ENV, None)
    if fd is None:
        return
    try:
        os.write(int(fd), READY)
        os.close(int(fd))
    except (OSError, ValueError):  # the parent is gone: nobody to tell
        pass
