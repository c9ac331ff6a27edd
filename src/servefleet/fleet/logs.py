"""Reading a server's log through its host: the last N lines, and following new output."""

from __future__ import annotations

from collections.abc import AsyncIterator

from servefleet.hosts.base import Host, Truncated

__all__ = ["tail_lines", "follow_lines"]

_CHUNK = 64 * 1024


async def tail_lines(host: Host, path: str, n: int) -> tuple[list[str], int]:
    """The last ``n`` lines of a file and its size (where a follow should start).
    Reads backwards in chunks, so a multi-gigabyte log costs only what is shown."""
    size = await host.file_size(path)
    if size is None:
        raise FileNotFoundError(path)
    if n <= 0:
        return [], size
    data = b""
    start = size
    while start > 0 and data.count(b"\n") <= n:
        step = min(_CHUNK, start)
        start -= step
        data = await host.read_bytes(path, start, step) + data
    lines = data.decode("utf-8", errors="replace").splitlines()
    return lines[-n:], size


async def follow_lines(host: Host, path: str, offset: int) -> AsyncIterator[str]:
    """Complete lines appended to the file from ``offset`` on; a truncation notice as a line."""
    pending = b""
    async for chunk in host.follow(path, offset):
        if isinstance(chunk, Truncated):
            pending = b""
            yield f"==== servefleet: {path} was truncated or replaced; reading from its start ===="
            continue
        pending += chunk
        *complete, pending = pending.split(b"\n")
        for raw in complete:
            yield raw.rstrip(b"\r").decode("utf-8", errors="replace")
