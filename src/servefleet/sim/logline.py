"""Log lines as the real engines print them: per-process prefixes, timestamps, optional colour.

Texts are written once (in :mod:`.styles` and :mod:`.failures`) as :class:`Line` values; the
:class:`Renderer` adds what the engine's logging adds, at the moment the line is printed:

* SGLang: ``[2026-01-02 10:11:12] msg`` from the main process, ``[2026-01-02 10:11:12 TP0] msg`` from
  each tensor-parallel rank (a rank line is printed once per rank, as with ``--tp-size N``). The first
  physical line carries the prefix; a multi-line message (a traceback) continues bare.
* vLLM: ``(APIServer pid=12) INFO 01-02 10:11:12 [api_server.py:1839] msg`` -- every physical line
  gets the process prefix and, for logger messages, the level header (vLLM's formatter repeats it).

Lines go straight to the file descriptors with ``os.write`` (no buffering: a log follower sees each
line when it happens, and stdout/stderr interleave in the order written).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

__all__ = ["Line", "Renderer", "LogWriter", "SG_RANK", "uv"]

SG_RANK = "TP*"  # SGLang: a line printed by every tensor-parallel rank (proc "TP0" = rank 0 only)

_CYAN, _GREEN, _YELLOW, _RED, _RESET, _VRESET = (
    "\x1b[1;36m",
    "\x1b[32m",
    "\x1b[33m",
    "\x1b[31m",
    "\x1b[0m",
    "\x1b[0;0m",
)
_LEVEL_COLOUR = {"INFO": _GREEN, "WARNING": _YELLOW, "ERROR": _RED, "CRITICAL": _RED, "DEBUG": ""}


@dataclass(frozen=True)
class Line:
    """One logged message (it may span several physical lines)."""

    text: str
    proc: str | None = None  # SGLang: None (main) or SG_RANK; vLLM: "APIServer", "EngineCore_DP0", ... or None
    level: str | None = "INFO"  # vLLM logger level; None: no logger header (uvicorn, tracebacks, tqdm)
    src: str = ""  # vLLM's "[file.py:123]" origin
    err: bool = False  # written to stderr
    raw: bool = False  # printed exactly as is, no prefix at all (tqdm bars, the main process's tracebacks)
    redraws: tuple[str, ...] = field(default=())  # tqdm states drawn before ``text``, separated by '\r'


def uv(text: str, proc: str | None = None, err: bool = False) -> Line:
    """A uvicorn line (``INFO:     Started server process [12]``): no logger header of its own."""
    return Line(text, proc=proc, level=None, err=err)


def _colour_uvicorn(text: str) -> str:
    for word, colour in (("INFO:", _GREEN), ("ERROR:", _RED), ("WARNING:", _YELLOW)):
        if text.startswith(word):
            return f"{colour}{word[:-1]}{_RESET}:{text[len(word) :]}"
    return text


class Renderer:
    """Formats :class:`Line` values for one engine style."""

    def __init__(
        self, style: str, *, tp: int = 1, color: bool = False, pids: dict[str, int] | None = None, clock=time.time
    ) -> None:
        self.style = style
        self.tp = tp
        self.color = color
        self.pids = dict(pids or {})
        self.clock = clock

    def pid(self, proc: str) -> int:
        if proc not in self.pids:
            self.pids[proc] = os.getpid() + 1 + len(self.pids)
        return self.pids[proc]

    def render(self, line: Line) -> str:
        """The physical text of ``line`` (several lines end with newlines; a bar's redraws with '\\r')."""
        body = self._sglang(line) if self.style == "sglang" else self._vllm(line)
        if line.redraws:
            return "\r".join(line.redraws) + "\r" + body
        return body

    def _sglang(self, line: Line) -> str:
        if line.raw:
            return line.text + "\n"
        text = _colour_uvicorn(line.text) if self.color and line.level is None else line.text
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.clock()))
        if line.proc == SG_RANK:
            return "".join(f"[{stamp} TP{rank}] {text}\n" for rank in range(self.tp))
        if line.proc:
            return f"[{stamp} {line.proc}] {text}\n"
        return f"[{stamp}] {text}\n"

    def _vllm(self, line: Line) -> str:
        if line.raw:
            return line.text + "\n"
        prefix = ""
        if line.proc:
            prefix = f"({line.proc} pid={self.pid(line.proc)})"
            prefix = f"{_CYAN}{prefix}{_VRESET} " if self.color else prefix + " "
        header = ""
        if line.level:
            stamp = time.strftime("%m-%d %H:%M:%S", time.localtime(self.clock()))
            level = f"{_LEVEL_COLOUR.get(line.level, '')}{line.level}{_RESET}" if self.color else line.level
            header = f"{level} {stamp} [{line.src}] " if line.src else f"{level} {stamp} "
        out = []
        for physical in line.text.split("\n"):
            if line.level is None and self.color:
                physical = _colour_uvicorn(physical)
            out.append(f"{prefix}{header}{physical}\n")
        return "".join(out)


class LogWriter:
    """Writes rendered lines to stdout/stderr without buffering; a closed pipe is ignored."""

    def __init__(self, renderer: Renderer, out_fd: int = 1, err_fd: int = 2) -> None:
        self.renderer = renderer
        self.out_fd = out_fd
        self.err_fd = err_fd

    def emit(self, lines: Iterable[Line]) -> None:
        for line in lines:
            self.write(self.renderer.render(line), err=line.err)

    def write(self, text: str, err: bool = False) -> None:
        data = text.encode("utf-8", "replace")
        fd = self.err_fd if err else self.out_fd
        try:
            while data:
                n = os.write(fd, data)
                data = data[n:]
        except OSError:  # a reader that went away must not kill the server
            pass
