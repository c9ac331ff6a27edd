"""Bounded diagnosis of big logs (verify/bounded.py): the verdict of a bounded read must be the
verdict of reading the whole file -- state, category, evidence line and excerpt -- on vLLM logs
synthesized from real fixture lines, with small bounds so that a few MB take the bounded path."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from biglog import WHERE, fatal_block, startup, steady_unit, write_log
from servefleet.catalog import Category, State
from servefleet.verify.bounded import Bounds, diagnose_file, human_bytes
from servefleet.verify.diagnose import diagnose_text

SMALL = Bounds(cap=64 * 1024, head=16 * 1024, tail=16 * 1024, chunk=32 * 1024)


def bounded(path: Path, bounds: Bounds = SMALL, **kw):
    return asyncio.run(diagnose_file(path, bounds=bounds, **kw))


def whole(path: Path):
    return diagnose_text(path.read_bytes().decode("utf-8", errors="replace"))


def same(a, b) -> None:
    assert (a.state, a.category, a.engine) == (b.state, b.category, b.engine), (a, b)
    assert a.evidence == b.evidence
    assert (a.excerpt_start, a.excerpt) == (b.excerpt_start, b.excerpt)
    assert a.message == b.message


@pytest.mark.parametrize("chunk", [4 * 1024, 32 * 1024])  # small chunks: lines and hits cut at chunk borders
@pytest.mark.parametrize("where", WHERE)
def test_bounded_verdict_is_the_whole_files(tmp_path: Path, where: str, chunk: int) -> None:
    log = write_log(tmp_path / "big.log", 3 * 1024 * 1024, where)
    got = bounded(log.path, Bounds(cap=SMALL.cap, head=SMALL.head, tail=SMALL.tail, chunk=chunk))
    want = whole(log.path)
    same(got, want)
    assert (
        got.skipped is not None and got.skipped.startswith("read ") and f" of {human_bytes(log.size)}: " in got.skipped
    )
    if where in ("middle", "end"):
        assert got.state is State.FAILED and got.category is Category.GPU_OOM
        assert log.fatal_line is not None and got.evidence.line_no > log.fatal_line
        assert "KV cache is needed" in got.evidence.text
    else:  # start: an earlier launch failed, the last one is healthy
        assert got.state is State.READY
    if where == "middle":
        assert "first fatal block" in got.skipped


def test_small_log_is_read_whole_and_says_nothing_skipped(tmp_path: Path) -> None:
    log = write_log(tmp_path / "small.log", 200 * 1024, "end")
    got = bounded(log.path, Bounds())  # default cap: 4 MB
    same(got, whole(log.path))
    assert got.skipped is None and got.to_json()["skipped"] is None


def test_skipped_report_names_the_windows_and_what_was_read(tmp_path: Path) -> None:
    log = write_log(tmp_path / "big.log", 2 * 1024 * 1024, "middle")
    got = bounded(log.path)
    text = got.to_json()["skipped"]
    assert text.startswith("read ") and f"of {human_bytes(log.size)}:" in text
    for window in ("start-up", "first fatal block", "end (16.0 KB, from line "):
        assert window in text, text
    assert "the rest was scanned for error, ready and launch lines" in text
    read_kb = float(text.split()[1])
    assert read_kb < 200 and text.split()[2] == "KB"  # the bounded part, not the file


def test_repeated_error_lines_do_not_spend_the_budget(tmp_path: Path) -> None:
    # A request error repeated thousands of times (only its numbers change) is one kind of line:
    # a crash in the middle after them is still found (a 1 GB log once lost it this way).
    log = write_log(tmp_path / "big.log", 8 * 1024 * 1024, "middle")  # ~40 request errors before the crash
    tight = Bounds(
        cap=SMALL.cap, head=SMALL.head, tail=SMALL.tail, chunk=SMALL.chunk, max_hits=40
    )  # > the kinds of marker lines
    got = bounded(log.path, tight)
    same(got, whole(log.path))
    assert got.category is Category.GPU_OOM and "first fatal block" in got.skipped


def test_hit_budget_is_said_and_a_fatal_block_at_the_end_still_counts(tmp_path: Path) -> None:
    # Many *kinds* of error lines (never fatal) before a crash at the end: past the budget only
    # ready and launch lines are looked for in the middle, and the verdict says so; the tail is read whole.
    path = tmp_path / "noisy.log"
    unit = steady_unit(n=1000)
    words = [
        "alpha",
        "bravo",
        "charlie",
        "delta",
        "echo",
        "foxtrot",
        "golf",
        "hotel",
        "india",
        "juliet",
        "kilo",
        "lima",
    ]
    with path.open("wb") as fh:
        fh.write(b"".join(startup()))
        for i in range(60):
            fh.write(unit)
            fh.write(
                f"(APIServer pid=1) ERROR 11-30 02:41:01 [serving.py:1] Error in request handler {words[i % len(words)]}\n".encode()
            )
        fh.write(b"".join(fatal_block()))
    tight = Bounds(cap=SMALL.cap, head=SMALL.head, tail=SMALL.tail, chunk=SMALL.chunk, max_hits=10)
    got = bounded(path, tight)
    same(got, whole(path))
    assert got.category is Category.GPU_OOM
    assert "10 kinds of them classified, no fatal line among them" in got.skipped


def test_start_offset_reads_the_current_launch_only_with_the_files_line_numbers(tmp_path: Path) -> None:
    # An earlier launch's failure above the offset must not count; line numbers stay the file's.
    earlier = b"".join(fatal_block())
    log = write_log(tmp_path / "current.log", 2 * 1024 * 1024, "none")
    path = tmp_path / "appended.log"
    path.write_bytes(earlier + log.path.read_bytes())
    offset, shift = len(earlier), earlier.count(b"\n")
    for bounds in (SMALL, Bounds()):  # the bounded path and the whole-read path
        got = bounded(path, bounds, start=offset)
        alone = bounded(log.path, bounds)
        assert got.state is State.READY and got.evidence.line_no == alone.evidence.line_no + shift
        assert whole(path).state is State.READY  # (the launch marker also separates them)


def test_fatal_block_in_the_middle_without_a_launch_marker_before_it(tmp_path: Path) -> None:
    # Hand-run servers append without markers: the classifier's own rules (first fatal after the
    # last ready line) decide, on the windows as on the whole file.
    path = tmp_path / "plain.log"
    head = [line for line in startup() if not line.startswith(b"==== servefleet launch")]
    unit = steady_unit()
    with path.open("wb") as fh:
        fh.write(b"".join(head))
        for _ in range(8):
            fh.write(unit)
        fh.write(b"".join(fatal_block()))
        fh.write(b"".join(head))  # restarted by hand: ready again
        for _ in range(8):
            fh.write(unit)
    got = bounded(path)
    same(got, whole(path))
    assert got.state is State.READY


def test_cli_diagnose_json_on_a_big_log(tmp_path: Path) -> None:
    log = write_log(tmp_path / "big.log", 6 * 1024 * 1024, "middle")  # above the default 4 MB cap
    res = subprocess.run(
        [sys.executable, "-m", "servefleet.cli.main", "diagnose", str(log.path), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 1, res.stderr
    out = json.loads(res.stdout)
    assert out["state"] == "failed" and out["category"] == "gpu_oom"
    assert out["evidence"]["line_no"] == whole(log.path).evidence.line_no
    said = out["skipped"]
    assert (
        said.startswith("read 1.") and said.split()[2] == "MB" and f"of {human_bytes(log.size)}:" in said
    )  # 1 MB head + 512 KB tail + the block
    assert "start-up (" in said and "first fatal block (" in said and "end (512 KB, from line " in said


async def test_wait_catches_up_on_a_big_log_then_follows_it(tmp_path: Path) -> None:
    """`wait` attached to a long-running server reads its big log with the same bounded read (not
    line by line), then follows it: a crash appended afterwards is seen with the file's line numbers."""
    from conftest import free_port
    from servefleet.verify.waiter import WaitTarget, wait_for_server

    log = write_log(tmp_path / "live.log", 3 * 1024 * 1024, "none")
    updates = []
    target = WaitTarget(
        base_url=f"http://127.0.0.1:{free_port()}", engine=None, log_path=str(log.path), log_bounds=SMALL
    )
    task = asyncio.create_task(
        wait_for_server(target, timeout_s=60, stall_s=60, smoke=False, on_update=updates.append)
    )

    async def caught_up() -> bool:
        return any(u.skipped for u in updates)

    from conftest import async_wait_until

    await async_wait_until(caught_up, timeout=30, what="the catch-up")
    assert updates[-1].state is State.LOADING and updates[-1].engine == "vllm"
    with log.path.open("ab") as fh:  # the server crashes now
        fh.write(b"".join(fatal_block()))
    verdict = await task
    want = whole(log.path)
    assert verdict.state is State.FAILED and verdict.category is Category.GPU_OOM
    assert verdict.evidence == want.evidence and verdict.excerpt == want.excerpt
    assert verdict.skipped is not None and verdict.skipped.startswith("read ")


def test_a_launch_marker_as_the_last_line_is_an_attempt_without_output(tmp_path: Path) -> None:
    log = write_log(tmp_path / "big.log", 2 * 1024 * 1024, "end")
    with log.path.open("ab") as fh:
        fh.write(b"==== servefleet launch 2026-12-01T09:00:00+00:00 ====\n")
    got = bounded(log.path)
    same(got, whole(log.path))
    assert got.state is State.LOADING and "has no output yet" in got.message


def test_a_local_file_is_diagnosed_without_an_event_loop(tmp_path) -> None:
    import asyncio

    from servefleet.verify.bounded import diagnose_file, diagnose_local_file, run_without_loop

    log = tmp_path / "x.log"
    log.write_text("INFO starting\nValueError: To serve at least one request with the model's max seq len\n")
    assert diagnose_local_file(log) == asyncio.run(diagnose_file(log))

    class Pending:  # what a future does while it waits: it yields itself to the loop
        def __await__(self):
            yield self

    async def waits_on_io() -> None:
        await Pending()

    import pytest

    with pytest.raises(RuntimeError):  # no loop to run it in: refused, not hung
        run_without_loop(waits_on_io())
