"""`until_stopped`: work finishes first, or a stop request cancels it (and the work sees it)."""

from __future__ import annotations

import asyncio

from servefleet.stopping import until_stopped


async def test_work_that_finishes_first_gives_its_result() -> None:
    stop = asyncio.Event()
    assert await until_stopped(asyncio.sleep(0, result="done"), stop) == (False, "done")
    assert await until_stopped(asyncio.sleep(0, result=7), None) == (False, 7)


async def test_a_stop_cancels_the_work_and_waits_for_its_cleanup() -> None:
    stop = asyncio.Event()
    started, cleaned = asyncio.Event(), []

    async def forever() -> str:
        started.set()
        try:
            await asyncio.Event().wait()
        finally:
            cleaned.append(True)
        return "never"

    async def request_stop() -> None:
        await started.wait()
        stop.set()

    stopper = asyncio.ensure_future(request_stop())
    assert await until_stopped(forever(), stop) == (True, None)
    await stopper
    assert cleaned == [True]


async def test_an_error_of_the_work_is_raised() -> None:
    async def broken() -> None:
        raise ValueError("bad input")

    try:
        await until_stopped(broken(), asyncio.Event())
    except ValueError as exc:
        assert str(exc) == "bad input"
    else:
        raise AssertionError("the work's error was swallowed")
