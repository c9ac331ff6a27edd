"""The verification loop: is a server ready, and if not, exactly why.

Pure parts (no I/O): ``logtext`` (normalising lines), ``classify`` (signatures, root cause),
``diagnose`` (a whole log -> Verdict), ``events`` + ``machine`` (the readiness state machine).
I/O edges: ``probe`` (HTTP: readiness, identity, smoke, capacity) and ``waiter`` (the three
watchers around the machine). ``wait_for_server`` and ``WaitTarget`` are imported on first use,
so importing ``Verdict`` does not load aiohttp.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from servefleet.verify.diagnose import diagnose_text
from servefleet.verify.verdict import Evidence, Verdict

if TYPE_CHECKING:
    from servefleet.verify.waiter import WaitTarget, wait_for_server

__all__ = ["Evidence", "Verdict", "WaitTarget", "diagnose_text", "wait_for_server"]


def __getattr__(name: str) -> Any:
    if name in ("WaitTarget", "wait_for_server"):
        from servefleet.verify import waiter

        return getattr(waiter, name)
    raise AttributeError(f"module 'servefleet.verify' has no attribute {name!r}")
