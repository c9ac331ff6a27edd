"""The small questions a batch answers (hosts/ssh_batch.py), as values.

``status`` and ``up``'s adopt checks ask a host a handful of questions per server. Where a round
trip costs (SSH) they are asked in advance, all in one command, and answered later from that
batch (fleet/prefetch.PrefetchedHost). Both sides hold the same values: the code that asks builds
the question with the same function as the code that prefetches it, and asks it through ``ask``,
which takes the batch's answer when there is one and else asks the host (``Question.ask``). A
question the batch did not hold is counted (``Answering.misses``): a mismatch shows as a round
trip more, and as a miss a test can see, never as a silently different answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from servefleet.hosts.base import Host, PortHolder

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = [
    "Alive",
    "Owns",
    "Read",
    "Size",
    "Port",
    "Exists",
    "GpuApps",
    "Tail",
    "ReadIfDead",
    "Question",
    "Answering",
    "ask",
    "answered",
    "inner_host",
    "read_tail",
]


@dataclass(frozen=True)
class Alive:
    """-> bool: ``Host.group_alive``."""

    group: int

    async def ask(self, host: Host) -> bool:
        return await host.group_alive(self.group)


@dataclass(frozen=True)
class Owns:
    """-> bool | None: ``Host.owns`` (a /proc host's batch reads the leader's command line)."""

    group: int
    marker: str

    async def ask(self, host: Host) -> bool | None:
        return await host.owns(self.group, self.marker)


@dataclass(frozen=True)
class Read:
    """-> bytes | None (missing): ``Host.read_bytes``."""

    path: str
    offset: int = 0
    limit: int | None = None

    async def ask(self, host: Host) -> bytes | None:
        try:
            return await host.read_bytes(self.path, self.offset, self.limit)
        except FileNotFoundError:
            return None


@dataclass(frozen=True)
class Size:
    """-> int | None (missing): ``Host.file_size``."""

    path: str

    async def ask(self, host: Host) -> int | None:
        return await host.file_size(self.path)


@dataclass(frozen=True)
class Port:
    """-> PortHolder | None: ``Host.port_holder``."""

    port: int

    async def ask(self, host: Host) -> PortHolder | None:
        return await host.port_holder(self.port)


@dataclass(frozen=True)
class Tail:
    """-> (start, bytes) | None: the file from ``max(offset, size - limit)`` to its end (``read_tail``)."""

    path: str
    offset: int
    limit: int

    async def ask(self, host: Host) -> tuple[int, bytes] | None:
        return await read_tail(host, self.path, self.offset, self.limit)


@dataclass(frozen=True)
class Exists:
    """-> bool, without opening the file (a device). Batch only: no single Host method asks it."""

    path: str


@dataclass(frozen=True)
class GpuApps:
    """-> bytes: the GPU-process report of hosts/gpu_apps.py. Batch only."""


@dataclass(frozen=True)
class ReadIfDead:
    """``read``, asked only when ``group`` is gone (a dead server's log is needed, a live one's may
    be gigabytes). Batch only: its answer is stored as the answer to ``read``."""

    group: int
    read: Read


Question = Alive | Owns | Read | Size | Port | Tail | Exists | GpuApps | ReadIfDead
Asked = Alive | Owns | Read | Size | Port | Tail  # what ``ask`` can also ask a host directly


@runtime_checkable
class Answering(Protocol):
    """A host view answering questions from a batch asked earlier (fleet/prefetch.PrefetchedHost)."""

    misses: list[Question]  # questions asked of the view that its batch did not hold

    def answer(self, question: Question) -> tuple[bool, Any]:
        """(True, the batch's answer) or (False, None) when the batch did not hold it."""
        ...

    @property
    def inner(self) -> Host:
        """The host itself, asked what the batch did not answer."""
        ...


async def ask(host: Host, question: Asked) -> Any:
    """The answer to ``question``: from the batch when ``host`` is a view holding it, else from the host."""
    if isinstance(host, Answering):
        found, value = host.answer(question)
        if found:
            return value
        return await question.ask(host.inner)
    return await question.ask(host)


def inner_host(host: Host) -> Host:
    """The host itself behind a view (for readers that page through a file on their own)."""
    return host.inner if isinstance(host, Answering) else host


def answered(host: object, questions: Sequence[Exists | GpuApps]) -> list[Any] | None:
    """The batch's answers to batch-only ``questions`` when it held every one, else None (the
    caller asks its own way)."""
    if not isinstance(host, Answering):
        return None
    found = [host.answer(q) for q in questions]
    if not all(known for known, _ in found):
        return None
    return [value for _, value in found]


async def read_tail(host: Host, path: str, offset: int, limit: int) -> tuple[int, bytes] | None:
    """(start, bytes) of ``path`` from ``max(offset, size - limit)`` to its end; None when it is missing
    or holds nothing past ``offset``. Two questions to the host (size, then the read)."""
    size = await host.file_size(path)
    if not size or size <= offset:
        return None
    start = max(offset, size - limit)
    try:
        return start, await host.read_bytes(path, start, size - start)
    except FileNotFoundError:
        return None
