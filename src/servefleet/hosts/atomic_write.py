"""Replacing a file of this machine all at once: LocalHost.write_bytes and the fleet's state
records (fleet/state.py) write this way, so a reader, or a crash, never meets half a file."""

from __future__ import annotations

import os

__all__ = ["write_atomically"]


def write_atomically(path: str, data: bytes, mode: int, tmp: str) -> None:
    """Write ``data`` to ``tmp`` (created with ``mode``), flush it to disk, then rename it over
    ``path``; ``tmp`` is removed when anything fails. The folder must exist."""
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
