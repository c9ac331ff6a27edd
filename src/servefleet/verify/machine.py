"""The readiness state machine: launching -> loading -> ready | failed | stalled. Pure.

Three signals feed it (see ``events``): the log (lines classified against the engine profile), the
HTTP probe, and process liveness; a clock reading comes with every event. Rules:

* a FATAL line is the diagnosis at once, whatever comes later (first fatal wins); process exit or
  probe refusal merely confirm it, and an exit code 0 after a fatal line is still a failure;
* a WRAPPER line ("scheduler is dead") confirms a failure; its cause may still be flushed by a
  child, so the machine waits until the log has been quiet for ``WRAPPER_GRACE_S`` (at most
  ``WRAPPER_MAX_S``), or the exit, for a fatal line before settling for the nearest error line;
* READY lines are evidence, never proof: only a 2xx probe whose identity holds (the port belongs
  to our process group, or /v1/models lists our model) — and the smoke request, when asked for —
  make the server ready;
* exit without a signature is a failure with the code: SIGKILL (137, -9, no status recorded) is
  ``killed``, anything else ``other``; a process gone with no readable code (not our child) and
  no error line in its log is ``killed`` too (a Python server that fails says why; one that
  vanishes mid-line was killed); a 2xx from another process's port plus our exit is
  ``port_in_use``;
* stall is progress-aware: stalled when neither the log grew nor the probe's answer changed for
  ``stall_s``; the overall ``timeout_s`` ends in ``stalled`` too, saying "timed out after Ns".
"""

from __future__ import annotations

import re
import signal as _signal
from typing import Any

from servefleet.catalog import DEFAULT_HINTS, Category, State
from servefleet.engines.base import EngineProfile, Probe
from servefleet.verify.classify import AnyEngine, Finding, LogClassifier, available_engines, detect_texts
from servefleet.verify.diagnose import finding_fields
from servefleet.verify.events import (
    Event,
    LogGrew,
    LogLines,
    LogMissing,
    LogTruncated,
    ProbeOutcome,
    ProbeResult,
    ProcessExit,
    Queued,
    SmokeResult,
    Tick,
)
from servefleet.verify.startup_phases import Mark, phase_times
from servefleet.verify.verdict import Verdict

__all__ = ["ReadinessMachine", "WRAPPER_GRACE_S", "WRAPPER_MAX_S", "SMOKE_GRACE_S", "DEFAULT_PROBE", "describe_exit"]

WRAPPER_GRACE_S = 0.2  # after a wrapper line, how long a quiet log may still bring the cause
WRAPPER_MAX_S = 2.0  # ... and the longest a log that keeps streaming (a traceback) is waited for
SMOKE_GRACE_S = 0.5  # after a failed smoke request, how long a fatal line or the exit may take
QUIET_NOTE_S = 10.0  # a log silent this long is mentioned in the live message
DETECT_MAX_LINES = 5000  # stop looking for the engine's banner after this many lines
HISTORY_MAX_LINES = 20000  # lines kept to re-classify once the engine is detected
DEFAULT_PROBE = Probe(("/health", "/v1/models"))
_TERMINAL = (State.READY, State.FAILED, State.STALLED)


def describe_exit(code: int | None, killed: bool = False) -> str:
    """Plain words for how a process ended."""
    if code is None:
        return (
            "the process group was killed (SIGKILL: no exit status recorded)"
            if killed
            else "the process is gone (exit code unknown)"
        )
    if code < 0 or code > 128:
        num = -code if code < 0 else code - 128
        try:
            name = _signal.Signals(num).name
        except ValueError:
            name = f"signal {num}"
        return f"the process was terminated by {name} (exit code {code})"
    return f"the process exited with code {code}"


def _is_sigkill(code: int | None) -> bool:
    return code in (137, -9)


class ReadinessMachine:
    """Consumes events, holds the state, and renders the current verdict."""

    def __init__(
        self,
        engine: EngineProfile | None,
        *,
        now: float,
        timeout_s: float = 1800.0,
        stall_s: float = 300.0,
        smoke: bool = True,
        log_path: str | None = None,
        pgid: int | None = None,
        port: int | None = None,
        first_line_no: int = 1,
        probe: Probe | None = None,
        engines: list[EngineProfile] | None = None,
    ) -> None:
        self.engine = engine
        self.start = now
        self.timeout_s = timeout_s
        self.stall_s = stall_s
        self.smoke = smoke
        self.log_path = log_path
        self.pgid = pgid
        self.port = port
        self._probe_override = probe
        self._engines = engines
        self.state = State.LAUNCHING
        self.clf = LogClassifier(engine if engine is not None else AnyEngine(engines))
        self.next_line_no = first_line_no
        self._history: list[tuple[int, str]] | None = [] if engine is None else None
        self.activity_at = now
        self.log_bytes_seen = False
        self.log_missing = False
        self.last_log_at: float | None = None
        self.last_line: str | None = None
        self.last_probe: ProbeResult | None = None
        self.smoke_state: str | None = None  # None | wanted | sent | ok | failed
        self.smoke_detail = ""
        self.exit: ProcessExit | None = None
        self.queued: Queued | None = None  # waiting in a scheduler's queue: no stall is counted
        self._queued_at = now
        self._wrapper_at: float | None = None  # a wrapper line arrived, no cause yet
        self._provisional_at: float | None = None  # only a last-resort cause so far
        self._smoke_failed_at: float | None = None
        self._final: dict[str, Any] = {}
        self._final_finding: Finding | None = None
        self._finished_at: float | None = None
        self.skipped: str | None = None  # what a bounded catch-up on a big log left out

    # ---- queries ------------------------------------------------------------------------------
    @property
    def done(self) -> bool:
        return self.state in _TERMINAL

    @property
    def wants_smoke(self) -> bool:
        return self.smoke_state == "wanted" and not self.done

    @property
    def probe_spec(self) -> Probe:
        if self._probe_override is not None:
            return self._probe_override
        return self.engine.probe if self.engine is not None else DEFAULT_PROBE

    @property
    def engine_name(self) -> str | None:
        return self.engine.name if self.engine is not None else None

    def smoke_started(self) -> None:
        self.smoke_state = "sent"

    def verdict(self, now: float) -> Verdict:
        end = self._finished_at if self._finished_at is not None else now
        fields: dict[str, Any] = {
            "state": self.state,
            "engine": self.engine_name,
            "elapsed_s": round(end - self.start, 3),
            "exit_code": self.exit.code if self.exit is not None else None,
            "progress": self.clf.progress,
            "capacity": self.clf.capacity,
            "last_line": self.last_line,
            "message": self._live_message(now) if not self.done else None,
            "skipped": self.skipped,
        }
        fields["startup_phases"], fields["startup_clock"] = phase_times(self.clf.marks, self._ready_mark())
        fields.update(self._final)
        if self._final_finding is not None:  # lines read after the cause complete its excerpt
            fields["excerpt"] = self._final_finding.excerpt
        return Verdict(**fields)

    def _ready_mark(self) -> Mark | None:
        """The end of the last start-up phase: when the machine found the server ready (on the
        engine's clock: its ready line's, else its last timestamp before it)."""
        if self.state is not State.READY or self._finished_at is None:
            return None
        log_s = self.clf.ready_mark.log_s if self.clf.ready_mark is not None else self.clf.last_log_s
        return Mark("ready", self.clf.last_line_no, log_s, self._finished_at - self.start)

    # ---- events -------------------------------------------------------------------------------
    def feed(self, event: Event, now: float) -> None:
        if isinstance(event, LogLines):
            if event.first_line_no is not None and event.first_line_no != self.next_line_no:
                self.next_line_no = event.first_line_no  # lines were skipped (a bounded catch-up)
                self.clf.gap()
            self._on_lines(event.lines, now)
        elif isinstance(event, LogGrew):
            self._log_activity(now)
            if event.partial:
                self.last_line = event.partial
        elif isinstance(event, LogTruncated):
            self.next_line_no = 1
            self._log_activity(now)
        elif isinstance(event, LogMissing):
            if event.present and self.log_missing:
                self.activity_at = now  # the log appeared: that is progress
            self.log_missing = not event.present
        elif isinstance(event, ProbeResult):
            self._on_probe(event, now)
        elif isinstance(event, SmokeResult):
            self._on_smoke(event, now)
        elif isinstance(event, ProcessExit):
            self._on_exit(event, now)
        elif isinstance(event, Queued):
            self.queued, self._queued_at = event, now
            self.activity_at = now
        elif isinstance(event, Tick):
            pass
        else:  # pragma: no cover - a programming error
            raise TypeError(f"unknown event {event!r}")
        self._on_time(now)

    # ---- log ----------------------------------------------------------------------------------
    def _log_activity(self, now: float) -> None:
        self.queued = None  # the job started: its output is the server's
        self.log_bytes_seen = True
        self.log_missing = False
        self.last_log_at = now
        self.activity_at = now
        if self.state is State.LAUNCHING:
            self.state = State.LOADING

    def _on_lines(self, lines: tuple[str, ...], now: float) -> None:
        if not lines:
            return
        self._log_activity(now)
        self.clf.now = now - self.start
        for raw in lines:
            no = self.next_line_no
            self.next_line_no += 1
            if self._history is not None:
                if len(self._history) < HISTORY_MAX_LINES:
                    self._history.append((no, raw))
                if self.engine is None and self.clf.lines_seen < DETECT_MAX_LINES and self._detect(raw):
                    continue  # the line was fed during the replay
            self.clf.feed(no, raw)
        if self.clf.last_text:
            self.last_line = self.clf.last_text
        self._evaluate(now)

    def _detect(self, raw: str) -> bool:
        texts = detect_texts(raw)
        if not texts[0]:
            return False
        engines = self._engines if self._engines is not None else available_engines()
        for engine in sorted(engines, key=lambda e: e.name == "openai"):
            if any(p.search(t) for p in engine.detect for t in texts):
                self.engine = engine
                old = self.clf
                self.clf = LogClassifier(engine)
                self.clf.now = old.now  # the history is replayed at the clock of the line that named the engine
                for no, line in self._history or []:
                    self.clf.feed(no, line)
                if self.clf.lines_seen < old.lines_seen:  # history was capped: keep what we knew
                    self.clf = old
                    self.clf.profile = engine
                self._history = None
                return True
        return False

    def _evaluate(self, now: float) -> None:
        if self.done:
            return
        if self.clf.first_fatal is not None:
            if self.clf.cause_is_provisional and self.exit is None and not self._provisional_over(now):
                return  # an unrecognised exception: a named cause of the same traceback may follow (classify)
            self._finish(State.FAILED, now, finding=self.clf.first_fatal, **finding_fields(self.clf.first_fatal))
        elif self.clf.first_wrapper is not None and self._wrapper_at is None:
            self._wrapper_at = now

    def _provisional_over(self, now: float) -> bool:
        """A last-resort cause is final once the log has been quiet for WRAPPER_GRACE_S after it (at most
        WRAPPER_MAX_S), or the process has exited."""
        if self._provisional_at is None:
            self._provisional_at = now
        quiet_since = max(self._provisional_at, self.last_log_at or self._provisional_at)
        return now >= min(quiet_since + WRAPPER_GRACE_S, self._provisional_at + WRAPPER_MAX_S)

    def _fail_unrecognised(self, now: float, reason: str) -> None:
        """Failed without a recognised cause: the nearest error line is the best evidence."""
        guess = self.clf.best_unrecognised()
        if self.clf.first_wrapper is not None:
            wrapper = self.clf.first_wrapper.signal
            reason = f"line {wrapper.line_no} says start-up failed, but no recognised cause is above it; {reason}"
        if guess is not None:
            self._finish(State.FAILED, now, finding=guess, message=reason, **finding_fields(guess))
        else:
            self._finish(
                State.FAILED, now, category=Category.OTHER, hint=DEFAULT_HINTS[Category.OTHER], message=reason
            )

    # ---- probe and smoke ----------------------------------------------------------------------
    def _on_probe(self, result: ProbeResult, now: float) -> None:
        if self.last_probe is None or self.last_probe.key != result.key:
            self.activity_at = now
        self.last_probe = result
        if self.done:
            return
        if result.outcome is not ProbeOutcome.REFUSED and self.state is State.LAUNCHING:
            self.state = State.LOADING
        if result.outcome is ProbeOutcome.OK and self._smoke_failed_at is None and self.clf.first_wrapper is None:
            if not self.smoke:
                self._finish(State.READY, now, message=f"GET {result.path} answered {result.status}")
            elif self.smoke_state is None:
                self.smoke_state = "wanted"
        elif result.outcome is ProbeOutcome.WRONG_IDENTITY and self.exit is not None:
            self._finish_port_in_use(now)

    def _finish_port_in_use(self, now: float) -> None:
        detail = self.last_probe.detail if self.last_probe else ""
        port = f"port {self.port}" if self.port else "the port"
        self._finish(
            State.FAILED,
            now,
            category=Category.PORT_IN_USE,
            hint=DEFAULT_HINTS[Category.PORT_IN_USE],
            message=f"{port} answers, but not from our server ({detail}); "
            f"{describe_exit(self.exit.code if self.exit else None, self.exit.killed if self.exit else False)}",
        )

    def _on_smoke(self, result: SmokeResult, now: float) -> None:
        self.activity_at = now
        if self.done:
            return
        if result.ok and self.clf.first_wrapper is not None:
            return  # a wrapper line already said start-up failed: its grace period decides
        if result.ok:
            self.smoke_state = "ok"
            probe = self.last_probe
            said = f"GET {probe.path} answered {probe.status}; " if probe is not None else ""
            self._finish(State.READY, now, message=f"{said}smoke request answered ({result.detail})".replace("()", ""))
        else:
            self.smoke_state = "failed"
            self.smoke_detail = result.detail
            self._smoke_failed_at = now

    # ---- process ------------------------------------------------------------------------------
    def _on_exit(self, event: ProcessExit, now: float) -> None:
        if self.exit is None:
            self.exit = event
        if self.done:
            return
        self._evaluate(now)  # lines drained just before the exit may carry the cause
        if self.done:
            return
        how = describe_exit(event.code, event.killed) + (f"; {event.note}" if event.note else "")
        if self.clf.first_wrapper is not None:
            self._fail_unrecognised(now, how)
        elif self.last_probe is not None and self.last_probe.outcome is ProbeOutcome.WRONG_IDENTITY:
            self._finish_port_in_use(now)
        elif event.killed or _is_sigkill(event.code):
            self._finish(
                State.FAILED,
                now,
                category=Category.KILLED,
                hint=event.hint or DEFAULT_HINTS[Category.KILLED],
                message=how,
            )
        elif self.smoke_state == "failed":
            self._fail_unrecognised(now, f"the smoke request failed ({self.smoke_detail}); {how}")
        elif event.code is None and self.clf.best_unrecognised() is None:
            self._finish(
                State.FAILED,
                now,
                category=Category.KILLED,
                hint=DEFAULT_HINTS[Category.KILLED],
                message=f"{how}; no error in its log before it: most likely killed by a signal (SIGKILL, the OOM killer)",
            )
        else:
            self._fail_unrecognised(now, f"{how} before the server was ready")

    # ---- time ---------------------------------------------------------------------------------
    def _on_time(self, now: float) -> None:
        if self.done:
            return
        if self._smoke_failed_at is not None and now >= self._smoke_failed_at + SMOKE_GRACE_S:
            self._fail_unrecognised(now, f"the smoke request failed: {self.smoke_detail}")
            return
        if self.clf.first_fatal is not None and self.clf.cause_is_provisional:
            self._evaluate(now)
            if self.done:
                return
        if self._wrapper_at is not None:
            quiet_since = max(self._wrapper_at, self.last_log_at or self._wrapper_at)
            if now >= min(quiet_since + WRAPPER_GRACE_S, self._wrapper_at + WRAPPER_MAX_S):
                self._fail_unrecognised(now, "the process is still running")
                return
        if now - self.start >= self.timeout_s:
            live = self._live_message(now)
            self._finish(
                State.STALLED, now, message=f"timed out after {self.timeout_s:g}s" + (f"; {live}" if live else "")
            )
            return
        if self.queued is not None:
            self.activity_at = now  # pending in a scheduler's queue: the stall clock starts when it runs
        elif self.smoke_state != "sent" and now - self.activity_at >= self.stall_s:
            live = self._live_message(now)
            what = "no log output and no change of the HTTP probe" if self.log_path else "no change of the HTTP probe"
            self._finish(
                State.STALLED, now, message=f"stalled: {what} for {self.stall_s:g}s" + (f"; {live}" if live else "")
            )

    def _finish(self, state: State, now: float, finding: Finding | None = None, **fields: Any) -> None:
        self.state = state
        self._finished_at = now
        self._final = {"state": state, **fields}
        self._final_finding = finding

    # ---- words --------------------------------------------------------------------------------
    def _live_message(self, now: float) -> str | None:
        if self.queued is not None:
            waited = (self.queued.waited_s or 0.0) + now - self._queued_at
            job = f"job {self.queued.job_id} " if self.queued.job_id else ""
            return f"{job}pending in the scheduler's queue ({self.queued.reason}) for {waited:.0f}s; the stall timeout starts when it runs"
        if self.log_path is not None and self.log_missing:
            return f"log file {self.log_path} does not exist (is the path right?)"
        probe = self.last_probe
        if probe is not None and probe.outcome is ProbeOutcome.WRONG_IDENTITY:
            port = f"port {self.port}" if self.port else "the port"
            return f"{port} answers, but not from our server ({probe.detail})"
        if self.smoke_state in ("wanted", "sent"):
            return "the probe answered; sending a one-token smoke request"
        if self.log_path is not None:
            lives = " while the process lives" if self.pgid is not None and self.exit is None else ""
            if not self.log_bytes_seen and now - self.start >= QUIET_NOTE_S:
                return f"log {self.log_path} has not grown in {now - self.start:.0f}s{lives}"
            if self.last_log_at is not None and now - self.last_log_at >= QUIET_NOTE_S:
                return f"no new log output for {now - self.last_log_at:.0f}s{lives} (stalled after {self.stall_s:g}s)"
        return None


_DIGITS = re.compile(r"\d+(?:\.\d+)?")


def message_shape(message: str | None) -> str | None:
    """A message with its numbers blanked, to tell a new message from a ticking one."""
    return _DIGITS.sub("#", message) if message else None
