"""A local TCP relay to a server that runs as a Slurm job.

Where a job's server listens (node and port) is known only once the job runs, and changes with
every new job (a restart, a resubmission after a time limit). The verify and generate layers want
one base URL per server for the whole wait or job, so the Slurm host hands out
``http://127.0.0.1:LOCAL`` and relays each connection to wherever the server's current job says it
is (its ``.where`` file, read through ``resolve``). While the job is pending, or between jobs, a
connection is closed at once, which a probe sees as "not up yet".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from servefleet.sockets import open_connection

__all__ = ["Relay"]

log = logging.getLogger(__name__)

Resolve = Callable[[], Awaitable[tuple[str, int] | None]]


class Relay:
    """Listens on 127.0.0.1 (a free port, or the one asked for); each connection goes to ``await resolve()``."""

    def __init__(self, resolve: Resolve) -> None:
        self.resolve = resolve
        self.server: asyncio.AbstractServer | None = None
        self.port = 0
        self._pipes: set[asyncio.Task[None]] = set()

    async def start(self, port: int = 0) -> int:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", port)
        self.port = self.server.sockets[0].getsockname()[1]
        return self.port

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._pipes.add(task)
            task.add_done_callback(self._pipes.discard)
        try:
            target = await self.resolve()
            if target is None:  # pending, or between jobs: nothing to reach yet
                writer.close()
                return
            up_reader, up_writer = await open_connection(*target)  # never to itself (servefleet/sockets.py)
        except Exception as exc:  # the job's server is not reachable (yet): the probe sees a closed connection
            log.debug("relay on port %d: no way to the server (%s: %s)", self.port, type(exc).__name__, exc)
            writer.close()
            return
        try:
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        except asyncio.CancelledError:
            # close() ends it. Finish normally: asyncio's stream callback (3.11) calls
            # task.exception() on the handler, which raises for a cancelled task.
            pass
        finally:
            for w in (writer, up_writer):
                w.close()

    async def close(self) -> None:
        """Stop listening and end the open connections (a client's keep-alive ones included)."""
        if self.server is not None:
            self.server.close()
        for task in list(self._pipes):
            task.cancel()
        for task in list(self._pipes):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self.server is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(1.0):
                    await self.server.wait_closed()
            self.server = None


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            if writer.can_write_eof():
                writer.write_eof()
