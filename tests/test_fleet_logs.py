"""Reading logs through a host: the last N lines (backwards, in chunks) and following."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from servefleet.fleet import logs
from servefleet.fleet.logs import follow_lines, tail_lines
from servefleet.hosts.local import LocalHost


async def test_tail_reads_only_the_end_across_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(logs, "_CHUNK", 64)  # many chunk boundaries
    path = tmp_path / "x.log"
    path.write_text("".join(f"line {i}\r\n" for i in range(500)) + "partial")
    lines, size = await tail_lines(LocalHost(), str(path), 3)
    assert lines == ["line 498", "line 499", "partial"]
    assert size == path.stat().st_size
    assert (await tail_lines(LocalHost(), str(path), 0))[0] == []
    short = tmp_path / "short.log"
    short.write_text("a\nb\n")
    assert (await tail_lines(LocalHost(), str(short), 50))[0] == ["a", "b"]
    with pytest.raises(FileNotFoundError):
        await tail_lines(LocalHost(), str(tmp_path / "missing.log"), 5)


async def test_follow_yields_complete_lines_from_offset(tmp_path: Path) -> None:
    path = tmp_path / "x.log"
    path.write_bytes(b"old\n")
    got: list[str] = []

    async def reader() -> None:
        async for line in follow_lines(LocalHost(follow_interval_s=0.01), str(path), offset=4):
            got.append(line)
            if len(got) == 3:
                return

    task = asyncio.create_task(reader())
    with path.open("ab") as fh:
        fh.write(b"one\r\ntw")
        fh.flush()
        await asyncio.sleep(0.05)
        fh.write(b"o\nthree\n")
    await asyncio.wait_for(task, 5)
    assert got == ["one", "two", "three"]
