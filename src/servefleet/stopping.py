"""Racing work against a stop request (Ctrl-C, SIGTERM): the one place that cancels it cleanly."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import Any, TypeVar

__all__ = ["cancel_and_wait", "until_stopped"]

T = TypeVar("T")


async def until_stopped(work: Awaitable[T], stop: asyncio.Event | None) -> tuple[bool, T | None]:
    """Run ``work`` until it finishes or ``stop`` is set. ``(False, result)`` when it finished;
    ``(True, None)`` when the stop came first (``work`` is then cancelled and awaited)."""
    task = asyncio.ensure_future(work)
    if stop is None:
        return False, await task
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
    if task.done():
        return False, task.result()
    await cancel_and_wait(task)
    return True, None


async def cancel_and_wait(task: asyncio.Future[Any]) -> None:
    """Cancel ``task`` and wait until it has ended (its cancellation is not an error here)."""
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
