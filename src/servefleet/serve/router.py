"""Which server takes a request: least loaded among those serving its model, or a bounded wait.

Each model has one FIFO queue of waiting requests, bounded (``max_queue``): a request that finds
every slot of its model's servers taken waits there; when the queue is full it is refused at once
(:class:`QueueFull`, which the gateway answers 429 with ``Retry-After``), so a client's own back-off
engages instead of requests piling up unseen in an engine's queue. A freed slot goes to the oldest
waiter of a model that server serves. Pure asyncio bookkeeping, no I/O.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from collections.abc import Iterable

from servefleet.serve.backend import Backend

__all__ = ["Router", "QueueFull", "QueueTimeout"]


class QueueFull(Exception):
    def __init__(self, model: str, queued: int, retry_after_s: float) -> None:
        super().__init__(
            f"every server of model {model!r} is busy and {queued} requests are waiting: retry after {math.ceil(retry_after_s)}s"
        )
        self.retry_after_s = retry_after_s


class QueueTimeout(Exception):
    def __init__(self, model: str, waited_s: float, up: int, retry_after_s: float) -> None:
        why = "no server of it is up" if up == 0 else "every server of it stayed busy"
        super().__init__(f"model {model!r}: waited {waited_s:g}s for a server ({why})")
        self.retry_after_s = retry_after_s
        self.up = up


class _Waiter:
    __slots__ = ("future", "avoid")

    def __init__(self, future: asyncio.Future[Backend], avoid: frozenset[str]) -> None:
        self.future = future
        self.avoid = avoid


class Router:
    def __init__(self, *, max_queue: int | None = None, queue_timeout_s: float = 60.0) -> None:
        self.max_queue = max_queue  # None: one batch of the model's servers (the sum of their limits), at least 8
        self.queue_timeout_s = queue_timeout_s
        self.backends: dict[str, Backend] = {}
        self.by_model: dict[str, list[Backend]] = {}
        self.waiting: dict[str, deque[_Waiter]] = {}
        self.rejected: dict[str, int] = {}  # 429s given, per model

    # ---- membership -----------------------------------------------------------------------------
    def add(self, backend: Backend) -> None:
        self.remove(backend.name)
        self.backends[backend.name] = backend
        for m in backend.models:
            self.by_model.setdefault(m, []).append(backend)
            self.waiting.setdefault(m, deque())
            self.rejected.setdefault(m, 0)
        self.wake(backend)

    def remove(self, name: str) -> Backend | None:
        old = self.backends.pop(name, None)
        if old is not None:
            for m in old.models:
                self.by_model[m] = [b for b in self.by_model[m] if b is not old]
        return old

    def models(self) -> list[str]:
        return [m for m, bs in self.by_model.items() if bs]

    def up_count(self, model: str) -> int:
        return sum(1 for b in self.by_model.get(model, ()) if b.usable)

    def queue_cap(self, model: str) -> int:
        if self.max_queue is not None:
            return self.max_queue
        return max(8, sum(b.limit for b in self.by_model.get(model, ()) if b.usable))

    def retry_after_s(self, model: str) -> float:
        """How soon a slot is likely: the mean latency of the model's servers (at least a second)."""
        lat = [b.mean_latency_s() for b in self.by_model.get(model, ()) if b.requests]
        return max(1.0, sum(lat) / len(lat)) if lat else 1.0

    # ---- slots ----------------------------------------------------------------------------------
    def pick(self, model: str, avoid: frozenset[str] = frozenset()) -> Backend | None:
        """The least loaded (in flight / limit) usable server of ``model`` with a free slot; one in
        ``avoid`` (where this request failed already) only when no other has room."""
        best, best_load, fallback, fallback_load = None, 2.0, None, 2.0
        for b in self.by_model.get(model, ()):
            if not b.usable:
                continue
            n, limit = b.in_flight, b.controller.limit
            if n >= limit:
                continue
            load = n / limit
            if b.target.name in avoid:
                if load < fallback_load:
                    fallback, fallback_load = b, load
            elif load < best_load:
                best, best_load = b, load
        return best or fallback

    async def acquire(self, model: str, avoid: frozenset[str] = frozenset()) -> Backend:
        """A slot on a server of ``model`` (release it with :meth:`release`). Raises QueueFull when
        the model's queue is full, QueueTimeout when no slot came within ``queue_timeout_s``."""
        queue = self.waiting[model]
        if not queue:
            b = self.pick(model, avoid)
            if b is not None:
                b.in_flight += 1
                return b
        if len(queue) >= self.queue_cap(model):
            self.rejected[model] += 1
            raise QueueFull(model, len(queue), self.retry_after_s(model))
        waiter = _Waiter(asyncio.get_running_loop().create_future(), avoid)
        queue.append(waiter)
        try:
            return await asyncio.wait_for(asyncio.shield(waiter.future), self.queue_timeout_s)
        except TimeoutError:
            if waiter.future.done():  # a slot came just as the wait ended: take it
                return waiter.future.result()
            waiter.future.cancel()
            _discard(queue, waiter)
            raise QueueTimeout(model, self.queue_timeout_s, self.up_count(model), self.retry_after_s(model)) from None
        except asyncio.CancelledError:  # the client went away while waiting
            if waiter.future.done() and not waiter.future.cancelled():
                self.release(waiter.future.result())
            else:
                waiter.future.cancel()
                _discard(queue, waiter)
            raise

    def release(self, backend: Backend) -> None:
        backend.in_flight -= 1
        self.wake(backend)

    def wake(self, backend: Backend | None = None, models: Iterable[str] | None = None) -> None:
        """Hand free slots to waiters: of ``backend``'s models, of ``models``, or of every model."""
        names = backend.models if backend is not None else (self.waiting if models is None else models)
        for m in names:
            queue = self.waiting.get(m)
            while queue:
                waiter = queue[0]
                if waiter.future.done():
                    queue.popleft()
                    continue
                b = self.pick(m, waiter.avoid)
                if b is None:
                    break
                queue.popleft()
                b.in_flight += 1
                waiter.future.set_result(b)

    def queued(self, model: str) -> int:
        return sum(1 for w in self.waiting.get(model, ()) if not w.future.done())


def _discard(queue: deque[_Waiter], waiter: _Waiter) -> None:
    try:
        queue.remove(waiter)
    except ValueError:
        pass
