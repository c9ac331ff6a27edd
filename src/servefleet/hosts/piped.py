"""A command of this machine with its output piped back: how LocalHost runs a command and how
SSHHost runs each ssh client (hosts/local.py, hosts/ssh.py)."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Sequence

from servefleet.errors import HostError

__all__ = ["start_piped", "reap"]


async def start_piped(argv: Sequence[str], *, has_input: bool, cannot: str) -> asyncio.subprocess.Process:
    """Start ``argv`` with stdout and stderr piped, stdin piped only when the caller has input
    for it (else /dev/null: a command that reads stdin must not wait on ours). A program that
    cannot be started raises HostError ``"{cannot}: {the OS error}"``."""
    try:
        return await asyncio.create_subprocess_exec(
            *argv,
            stdin=subprocess.PIPE if has_input else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
    except OSError as exc:
        raise HostError(f"{cannot}: {exc}") from exc


async def reap(proc: asyncio.subprocess.Process) -> None:
    """Kill a process that is still running (timed out, or its caller was cancelled) and wait
    for it, so no zombie or open pipe is left behind."""
    if proc.returncode is None:
        proc.kill()
        await proc.wait()
