"""The decisions of one SSH log follow or watch (ssh_follow.py), as a pure machine: events in
(the stream's header, a chunk of the log, a line of stderr, a quiet spell, the stream's end),
actions out (an item to yield, read the rest and finish, restart, leave, wait, fail). No I/O and
no clock of its own (``now`` comes with each event), like verify/machine.py beside the waiter:
ssh_follow.py runs the processes and does what it is told.

What it keeps across streams is what makes a resumed stream exact: the offset is the count of
bytes *yielded*, so the next stream starts at the first byte the caller has not seen; the log's
inode catches a replacement while we were away; and the counts of failed and mute streams, the
time the link was lost and the last word heard from the remote (log bytes do not count: tail may
outlive a killed watcher loop) decide when to give up.
"""

from __future__ import annotations

from dataclasses import dataclass

from servefleet.errors import HostError, HostUnreachable
from servefleet.hosts import ssh_scripts as scripts
from servefleet.hosts.base import Truncated
from servefleet.hosts.ssh_options import classify_ssh_failure
from servefleet.hosts.watch import Exited, LogAbsent, WatchItem

__all__ = [
    "StreamMachine",
    "StreamSettings",
    "Emit",
    "Finish",
    "Restart",
    "Leave",
    "Retry",
    "Fail",
    "Action",
    "classify_tail_notice",
    "HEARTBEAT_S",
    "MAX_TAIL_FAILURES",
    "LINK_POLL_S",
    "EXIT_CATCHUP_S",
]

MAX_TAIL_FAILURES = 3
HEARTBEAT_S = 1  # the remote watcher's heartbeat (whole seconds: the remote `sleep` may not do fractions)
LINK_POLL_S = 0.2  # while the watcher is quiet, how often to look whether its connection still lives
EXIT_CATCHUP_S = (
    2.0  # after the exit line, how long tail (polling every second without inotify) may take to deliver the log's end
)


def classify_tail_notice(line: str) -> str:
    """What a line of GNU tail's stderr means for us: truncated | appeared | ignore | error."""
    if "file truncated" in line or "has been replaced" in line:
        return "truncated"
    if "has appeared" in line:
        return "appeared"
    if any(
        s in line
        for s in (
            "has become inaccessible",
            "cannot open",
            "No such file",
            "inotify",
            "giving up on",
            "directory containing watched file was removed",
            "has been replaced with an untailable",
        )
    ):
        return "ignore"
    return "error"


@dataclass(frozen=True)
class Emit:
    """Yield this item to the caller."""

    item: WatchItem


@dataclass(frozen=True)
class Finish:
    """The server exited: yield the log from the offset up to ``rest_to`` (read it; None: nothing
    to read), then ``exited``; the watch ends."""

    exited: Exited
    rest_to: int | None = None


@dataclass(frozen=True)
class Restart:
    """Leave this stream and start the next one at once, from the offset."""


@dataclass(frozen=True)
class Leave:
    """Stop reading this stream; ``wait``: wait for its process and report its end (``ended``)."""

    wait: bool = True


@dataclass(frozen=True)
class Retry:
    """Start the next stream after ``after_s`` seconds."""

    after_s: float


@dataclass(frozen=True)
class Fail:
    error: Exception


Action = Emit | Finish | Restart | Leave | Retry | Fail
TERMINAL = (Finish, Restart, Leave)  # end the current stream's reading


@dataclass(frozen=True)
class StreamSettings:
    host: str  # the host's name, for messages
    what: str  # what is followed, for messages (the log, or the process group)
    log: bool  # a log is followed (False: a watch of the exit alone)
    silence_s: (
        float | None
    )  # a watch: nothing heard for this long on a live stream, the link went silent (None: a follow)
    status_file: bool = False  # a watch with a status file: an exit without a code means killed
    alive_timeout: int = 15
    alive_interval: int = 4
    reconnect_s: float = 60.0


class StreamMachine:
    """One follow or watch, across the streams it takes (see the module docstring)."""

    def __init__(self, settings: StreamSettings, offset: int, now: float) -> None:
        self.s = settings
        self.offset = offset
        self.inode: int | None = None
        self.lost_since: float | None = None  # when the link was first found down (None: it is up)
        self.tail_failures = 0
        self.mute_streams = 0  # streams in a row whose watcher went quiet on a live connection (watch only)
        self.absent = False  # LogAbsent() yielded, its appearance not yet
        self.heard_at = now  # the remote's last word (a header, a heartbeat, an exit) on any stream so far
        self.backoff = 0.05
        self.begin("")

    @property
    def watching(self) -> bool:
        return self.s.silence_s is not None

    # ---- one stream ------------------------------------------------------------------------------
    def begin(self, token: str) -> None:
        """A new stream starts; ``token`` prefixes the watcher's own lines on its stderr."""
        self.token = token
        self.started = self.silent = self.master_lost = False
        self.stderr_text = ""
        self.exit_info: tuple[int | None, int | None] | None = None  # (code, log size) once the watcher said so
        self.exit_due = 0.0
        self.grace_until: float | None = None  # the watcher went quiet: the connection's keep-alives decide until then

    def header_timeout(self) -> float | None:
        return self.s.silence_s

    def header(self, line: bytes | None, link_alive: bool, now: float) -> list[Action]:
        """The stream's first line (None: none within ``header_timeout``; b"": the stream ended)."""
        if line is None:
            self.silent, self.master_lost = True, not link_alive
            return [Leave(wait=False)]
        if not line:
            return [Leave()]
        self.heard_at, self.started = now, True
        self.lost_since, self.backoff = None, 0.05
        ino, size = scripts.parse_follow_header(line) if self.s.log else (None, None)
        out: list[Action] = []
        if self.watching and self.s.log and ino is None and not self.absent:
            self.absent = True
            out.append(Emit(LogAbsent()))
        if (
            ino is not None
            and size is not None
            and ((self.inode is not None and ino != self.inode) or size < self.offset)
        ):
            self.offset, self.inode = 0, ino  # replaced or truncated while we were not looking
            return [*out, Emit(Truncated(0)), Restart()]
        if ino is not None:
            self.inode = ino
            out += self._appeared()
        return out

    def timeout(self, now: float) -> float | None:
        """How long to wait for the next chunk or line before ``quiet``."""
        timeout = max(0.0, self.heard_at + self.s.silence_s - now) if self.s.silence_s is not None else None
        if self.grace_until is not None:
            timeout = LINK_POLL_S
        if self.exit_info is not None:
            timeout = max(0.0, self.exit_due - now)
        return timeout

    def quiet(self, link_alive: bool, now: float) -> list[Action]:
        """Nothing arrived within ``timeout``."""
        if self.exit_info is not None:  # tail has not delivered the log's last bytes in time: read them
            return [self._finish(self.exit_info[1])]
        # A silent link or a mute watcher? The master's keep-alives (whose timer runs about as
        # ours) end it on a silent link.
        if not link_alive:
            self.silent = self.master_lost = True
            return [Leave(wait=False)]
        if self.grace_until is None:
            self.grace_until = now + (self.s.silence_s or 0.0)
        elif now >= self.grace_until:
            self.silent = True  # the link lives, the watcher does not speak
            return [Leave(wait=False)]
        return []

    def stderr(self, line: bytes, now: float) -> list[Action]:
        """A line of the stream's stderr (b"": it ended). Read before stdout: a truncation notice
        outranks data that follows it."""
        text = line.decode(errors="replace")
        if self.watching and self.token and text.startswith(self.token + " "):
            self.heard_at, self.grace_until, self.mute_streams = now, None, 0
            fields = text.split()[1:]
            if fields and fields[0] == "exit":
                self.exit_info = scripts.parse_watch_exit(fields[1:])
                self.exit_due = now + EXIT_CATCHUP_S
                size = self.exit_info[1]
                if not self.s.log or size is None or self.offset >= size:
                    return [self._finish(None)]
            return []  # a heartbeat
        notice = classify_tail_notice(text)
        if notice == "truncated":
            self.offset, self.inode = 0, None
            return [Emit(Truncated(0)), Restart()]
        if notice == "appeared" and (self.offset > 0 or self.inode is not None):
            return [Restart()]  # the header of a new stream decides
        if notice == "appeared":
            return self._appeared()
        if notice == "error":
            self.stderr_text += text
        return []

    def stdout(self, data: bytes) -> list[Action]:
        """A chunk of the log (b"": the stream's stdout ended)."""
        if not data:
            if self.exit_info is not None:  # the stream ended before the log's end arrived
                return [self._finish(self.exit_info[1])]
            return [] if self.watching else [Leave()]  # a watcher may still speak on stderr
        self.offset += len(data)
        self.tail_failures = 0
        out = [*self._appeared(), Emit(data)]
        if self.exit_info is not None and (self.exit_info[1] is None or self.offset >= self.exit_info[1]):
            out.append(self._finish(None))
        return out

    # ---- between streams --------------------------------------------------------------------------
    def ended(self, code: int | None, stderr_text: str, now: float, *, unreachable: bool = False) -> Action:
        """The stream is over without a Finish or a Restart (``code``: its exit status, None when it
        was left silent; ``unreachable``: no connection could be had for it). What next."""
        quiet_s = now - self.heard_at
        if self.silent:
            # Nothing on a stream that should speak every HEARTBEAT_S. Its connection gone as
            # well: the link went silent. Still up: the watcher died; a new one starts.
            if self.master_lost:
                return Fail(self._silent_link(quiet_s))
            self.mute_streams += 1
            if self.mute_streams >= MAX_TAIL_FAILURES:
                return Fail(
                    HostError(
                        f"the remote watcher of {self.s.what} on ssh host {self.s.host!r} stopped speaking {self.mute_streams} times in a row on a live connection"
                    )
                )
            return Restart()
        # The stream ended without our asking: a dropped link, or tail itself failed.
        if unreachable or (code == 255 and (classify_ssh_failure(code, stderr_text) or not stderr_text.strip())):
            if self.watching and self.started and quiet_s >= max(self.s.alive_interval, 2 * HEARTBEAT_S):
                # The master died after a quiet spell longer than the heartbeat allows: its
                # keep-alives went unanswered, a silent link, not a dropped connection.
                # Reconnecting would only wait out ConnectTimeout.
                return Fail(self._silent_link(quiet_s))
            self.lost_since = self.lost_since or now
            if now - self.lost_since > self.s.reconnect_s:
                return Fail(
                    HostUnreachable(
                        f"ssh host {self.s.host!r}: lost the link while following {self.s.what} and could not reconnect within "
                        f"{self.s.reconnect_s}s: {stderr_text.strip()[-300:]}"
                    )
                )
        else:
            self.tail_failures += 1
            if self.tail_failures >= MAX_TAIL_FAILURES:
                return Fail(
                    HostError(
                        f"following {self.s.what} on ssh host {self.s.host!r} failed (exit {code}): {stderr_text.strip()[-300:]}"
                    )
                )
        after, self.backoff = self.backoff, min(self.backoff * 2, 2.0)
        return Retry(after)

    # ---- helpers ------------------------------------------------------------------------------------
    def _appeared(self) -> list[Action]:
        if not self.absent:
            return []
        self.absent = False
        return [Emit(LogAbsent(present=True))]

    def _finish(self, rest_to: int | None) -> Finish:
        code = self.exit_info[0] if self.exit_info is not None else None
        return Finish(Exited(code, killed=code is None and self.s.status_file), rest_to)

    def _silent_link(self, quiet_s: float) -> HostUnreachable:
        err = HostUnreachable(
            f"ssh host {self.s.host!r} is unreachable: link went silent: no answer to keep-alives and no heartbeat from the watcher of {self.s.what} "
            f"for {quiet_s:.0f}s (alive_timeout {self.s.alive_timeout}s)"
        )
        err.reason = "link went silent"
        return err
