"""hosts/ssh_stream.StreamMachine, the decisions of an SSH follow or watch, without SSH: events in
(header, stdout chunks, stderr lines, quiet spells, a stream's end), actions out."""

from __future__ import annotations

import pytest

from servefleet.errors import HostError, HostUnreachable
from servefleet.hosts.base import Truncated
from servefleet.hosts.ssh_stream import (
    EXIT_CATCHUP_S,
    Emit,
    Fail,
    Finish,
    Leave,
    Restart,
    Retry,
    StreamMachine,
    StreamSettings,
)
from servefleet.hosts.watch import Exited, LogAbsent

TOKEN = "t0k"


def follow(offset: int = 0) -> StreamMachine:
    m = StreamMachine(StreamSettings(host="gpu", what="/l.log", log=True, silence_s=None), offset, now=0.0)
    m.begin(TOKEN)
    return m


def watch(offset: int = 0, *, log: bool = True, silence_s: float = 15.0) -> StreamMachine:
    m = StreamMachine(
        StreamSettings(host="gpu", what="/l.log", log=log, silence_s=silence_s, status_file=True), offset, now=0.0
    )
    m.begin(TOKEN)
    return m


def exit_line(code: str, size: str) -> bytes:
    return f"{TOKEN} exit {code} {size}\n".encode()


def test_the_offset_counts_the_bytes_yielded_and_a_follow_ends_with_its_stream() -> None:
    m = follow(5)
    assert m.header(b"42 5\n", link_alive=True, now=1.0) == []
    assert m.stdout(b"abc") == [Emit(b"abc")] and m.offset == 8
    assert m.stdout(b"") == [Leave()]
    assert m.ended(0, "", now=2.0) == Retry(0.05)  # tail ended on its own: start again from byte 8
    assert m.ended(1, "tail: boom", now=2.0) == Retry(0.1)
    failed = m.ended(1, "tail: boom", now=2.0)
    assert isinstance(failed, Fail) and isinstance(failed.error, HostError) and "failed (exit 1)" in str(failed.error)


def test_a_truncation_notice_restarts_from_byte_zero() -> None:
    m = follow()
    m.header(b"42 0\n", True, 0.0)
    m.stdout(b"0123456789")
    assert m.stderr(b"tail: /l.log: file truncated\n", 1.0) == [Emit(Truncated(0)), Restart()]
    assert m.offset == 0 and m.inode is None


def test_a_log_replaced_while_away_is_caught_by_the_next_header() -> None:
    m = follow()
    m.header(b"42 0\n", True, 0.0)
    m.stdout(b"old")
    m.begin(TOKEN)
    assert m.header(b"43 10\n", True, 1.0) == [Emit(Truncated(0)), Restart()]  # another inode
    m.begin(TOKEN)
    assert m.header(b"43 10\n", True, 1.0) == [] and m.offset == 0
    m.stdout(b"0123456789")
    m.begin(TOKEN)
    assert m.header(b"43 4\n", True, 2.0) == [Emit(Truncated(0)), Restart()]  # shorter than what we read: truncated


def test_a_dropped_link_is_retried_until_reconnect_s_then_unreachable() -> None:
    m = StreamMachine(StreamSettings(host="gpu", what="/l.log", log=True, silence_s=None, reconnect_s=10), 0, now=0.0)
    assert m.ended(255, "", now=1.0) == Retry(0.05)
    assert m.ended(255, "", now=5.0) == Retry(0.1)
    gone = m.ended(255, "ssh: connect to host x port 22: Connection refused", now=12.0)
    assert isinstance(gone, Fail) and isinstance(gone.error, HostUnreachable) and "within 10" in str(gone.error)


def test_exit_before_any_log_byte_waits_for_tail_then_reads_the_rest() -> None:
    """The watcher says the server exited with 50 log bytes; tail delivered none of them yet."""
    m = watch()
    m.header(b"42 0\n", True, 0.0)
    assert m.stderr(exit_line("137", "50"), now=1.0) == []
    assert m.timeout(1.5) == pytest.approx(EXIT_CATCHUP_S - 0.5)
    assert m.stdout(b"first 20 bytes......") == [Emit(b"first 20 bytes......")]
    assert m.quiet(link_alive=True, now=1.0 + EXIT_CATCHUP_S) == [
        Finish(Exited(137), rest_to=50)
    ]  # tail lagged: read bytes 20..50


def test_exit_is_given_once_tail_delivered_the_log_up_to_its_size() -> None:
    m = watch()
    m.header(b"42 0\n", True, 0.0)
    m.stderr(exit_line("1", "6"), now=1.0)
    assert m.stdout(b"abc") == [Emit(b"abc")]
    assert m.stdout(b"def") == [Emit(b"def"), Finish(Exited(1))]  # nothing left to read


def test_a_stream_that_ends_after_the_exit_line_reads_the_rest() -> None:
    m = watch()
    m.header(b"42 0\n", True, 0.0)
    m.stderr(exit_line("0", "9"), now=1.0)
    assert m.stdout(b"") == [Finish(Exited(0), rest_to=9)]


def test_an_exit_without_a_code_is_killed_and_without_a_log_needs_no_rest() -> None:
    m = watch(log=False)
    m.header(b"ok\n", True, 0.0)
    assert m.stderr(exit_line("-", "-"), now=1.0) == [Finish(Exited(None, killed=True))]


def test_a_missing_log_is_absent_until_it_appears() -> None:
    m = watch()
    assert m.header(b"missing\n", True, 0.0) == [Emit(LogAbsent())]
    assert m.stderr(b"tail: '/l.log' has appeared;  following new file\n", 1.0) == [Emit(LogAbsent(present=True))]
    assert m.stdout(b"x") == [Emit(b"x")]


def test_heartbeats_keep_a_watch_alive_and_a_silent_link_fails() -> None:
    m = watch(silence_s=15.0)
    m.header(b"42 0\n", True, 0.0)
    assert m.stderr(f"{TOKEN} alive\n".encode(), now=10.0) == [] and m.timeout(10.0) == pytest.approx(15.0)
    assert m.quiet(link_alive=False, now=25.0) == [Leave(wait=False)]
    silent = m.ended(None, "", now=25.0)
    assert (
        isinstance(silent, Fail)
        and isinstance(silent.error, HostUnreachable)
        and silent.error.reason == "link went silent"
    )


def test_a_mute_watcher_on_a_live_link_gets_a_grace_then_a_new_stream_then_gives_up() -> None:
    m = watch(silence_s=15.0)
    for attempt in range(3):
        m.begin(TOKEN)
        m.header(b"42 0\n", True, 0.0)
        assert m.quiet(link_alive=True, now=15.0) == []  # the connection's keep-alives decide for a while
        assert m.quiet(link_alive=True, now=31.0) == [Leave(wait=False)]
        after = m.ended(None, "", now=31.0)
        if attempt < 2:
            assert after == Restart()
    assert isinstance(after, Fail) and "stopped speaking 3 times" in str(after.error)


def test_no_header_in_time_on_a_dead_connection_is_a_silent_link() -> None:
    m = watch()
    assert m.header(None, link_alive=False, now=15.0) == [Leave(wait=False)]
    after = m.ended(None, "", now=15.0)
    assert isinstance(after, Fail) and isinstance(after.error, HostUnreachable)
