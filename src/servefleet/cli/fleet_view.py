"""Rendering for the fleet commands: the live table of ``up``, its final table, ``status`` and
``down`` tables, and their ``--json`` shapes. No logic about servers lives here."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from servefleet.catalog import State
from servefleet.fleet import Action, Liveness, ServerStatus, StartOutcome, StopResult
from servefleet.verify.startup_phases import phase_totals
from servefleet.verify.verdict import Verdict

__all__ = ["UpProgress", "up_table", "failure_notes", "up_json", "status_table", "status_notes", "down_table"]

_STYLE = {
    "ready": "bold green",
    "failed": "bold red",
    "stalled": "bold yellow",
    "loading": "cyan",
    "launching": "blue",
    "dead": "bold red",
    "unresponsive": "bold yellow",
    "hung": "bold yellow",
    "stale": "yellow",
    "not launched": "dim",
}


def fmt_secs(value: float | None) -> str:
    if value is None:
        return "-"
    if value < 60:
        return f"{value:.1f}s"
    if value < 3600:
        return f"{int(value // 60)}m{int(value % 60):02d}s"
    return f"{int(value // 3600)}h{int(value % 3600 // 60):02d}m"


def fmt_int(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


def _state(text: str) -> Text:
    return Text(text, style=_STYLE.get(text.split(" ")[0], ""))


def _verdict_note(verdict: Verdict) -> str:
    parts = [p for p in (verdict.progress, verdict.message) if p]
    if not parts and verdict.last_line:
        line = verdict.last_line.strip()
        parts.append(line if len(line) <= 160 else line[:157] + "...")
    return " — ".join(parts)


class UpProgress:
    """Collects live verdicts of ``up``; renders a table on a terminal, plain lines elsewhere."""

    def __init__(
        self, console: Console, outcomes: dict[str, StartOutcome], engines: dict[str, str], plain: bool
    ) -> None:
        self.console = console
        self.outcomes = outcomes
        self.engines = engines
        self.plain = plain
        self.started = time.monotonic()
        self.latest: dict[str, Verdict] = {}
        self._said: dict[str, tuple[Any, ...]] = {}

    def on_update(self, name: str, verdict: Verdict) -> None:
        self.latest[name] = verdict
        if not self.plain:
            return
        key = (verdict.state, verdict.progress, verdict.message, verdict.category)
        if self._said.get(name) == key:
            return
        self._said[name] = key
        elapsed = time.monotonic() - self.started
        note = _verdict_note(verdict)
        cat = f" ({verdict.category.value})" if verdict.category else ""
        self.console.print(
            f"[{elapsed:7.1f}s] {name}: {verdict.state.value}{cat}{': ' + note if note else ''}",
            markup=False,
            highlight=False,
        )

    def __rich__(self) -> Table:
        table = Table(title="servefleet up", title_justify="left", expand=False)
        for col in ("server", "engine", "action", "state", "elapsed", "progress"):
            table.add_column(col, no_wrap=col != "progress")
        elapsed = fmt_secs(time.monotonic() - self.started)
        for name, outcome in self.outcomes.items():
            verdict = self.latest.get(name)
            state = verdict.state.value if verdict else "launching"
            note = _verdict_note(verdict) if verdict else (outcome.message or "")
            shown = (
                elapsed
                if state not in ("ready", "failed", "stalled")
                else fmt_secs(verdict.elapsed_s if verdict else None)
            )
            table.add_row(name, self.engines.get(name, "?"), outcome.action.value, _state(state), shown, note[:100])
        return table


def up_table(outcomes: dict[str, StartOutcome], verdicts: dict[str, Verdict], engines: dict[str, str]) -> Table:
    table = Table(title="fleet", title_justify="left")
    for col in (
        "server",
        "engine",
        "state",
        "time to ready",
        "start-up phases",
        "KV tokens",
        "max running",
        "context",
        "log",
    ):
        table.add_column(col, no_wrap=col not in ("log", "start-up phases"), overflow="fold")
    for name, verdict in verdicts.items():
        outcome = outcomes[name]
        cap = verdict.capacity
        state = verdict.state.value + (f" ({verdict.category.value})" if verdict.category else "")
        if outcome.after_failure:
            state += f"; {outcome.after_failure}"
        if verdict.state == State.READY:
            ttr = "adopted" if outcome.action == Action.ADOPTED else fmt_secs(verdict.elapsed_s)
        else:
            ttr = "-"
        log = outcome.record.log_path if outcome.record else "-"
        table.add_row(
            name,
            engines.get(name, "?"),
            _state(state),
            ttr,
            startup_phases_text(verdict),
            fmt_int(cap.kv_cache_tokens),
            fmt_int(cap.max_running_requests),
            fmt_int(cap.context_length),
            log,
        )
    return table


def startup_phases_text(verdict: Verdict) -> str:
    """ "loading weights 2.5s, compiling (torch.compile) 15.6s, ...": seconds per progress label
    (startup_phases.phase_totals; under 0.05 s left out)."""
    shown = [f"{label} {fmt_secs(took)}" for label, took in phase_totals(verdict.startup_phases) if took >= 0.05]
    return ", ".join(shown) if shown else "-"


def failure_notes(outcomes: dict[str, StartOutcome], verdicts: dict[str, Verdict]) -> Group:
    """Below the table: why each server is not ready (category, evidence line, hint), and
    notes such as a fleet file that changed under an adopted server."""
    lines: list[Text] = []
    for name, verdict in verdicts.items():
        outcome = outcomes[name]
        if verdict.state != State.READY:
            head = Text(f"{name}: ", style="bold")
            category = (
                f"{verdict.category.value} {verdict.phase}"
                if verdict.category and verdict.phase
                else (verdict.category.value if verdict.category else "")
            )
            head.append(
                verdict.state.value + (f" ({category})" if category else ""), style=_STYLE.get(verdict.state.value, "")
            )
            if verdict.exit_code is not None:
                head.append(f", exit code {verdict.exit_code}")
            lines.append(head)
            if verdict.evidence is not None:
                lines.append(Text(f"  line {verdict.evidence.line_no}: {verdict.evidence.text.strip()[:240]}"))
            if verdict.message:
                lines.append(Text(f"  {verdict.message}"))
            if verdict.hint:
                lines.append(Text(f"  hint: {verdict.hint}", style="italic"))
            if outcome.after_failure:
                lines.append(Text(f"  {_after_failure_note(outcome.after_failure, name)}"))
            if outcome.record is not None:
                lines.append(Text(f"  log: {outcome.record.log_path} (`servefleet logs {name}`)", style="dim"))
        elif outcome.spec_changed and outcome.message:
            lines.append(Text(f"{name}: {outcome.message}", style="yellow"))
    return Group(*lines)


def _after_failure_note(after: str, name: str) -> str:
    if after == "stopped":
        return "stopped (its whole process group); `servefleet up --keep-failed` leaves a failed server running"
    if after.startswith("kept running"):
        return f"kept running (--keep-failed): `servefleet down {name}` stops it"
    return after


def _started_after(outcome: StartOutcome) -> list[dict[str, Any]]:
    return [s.to_json() for s in outcome.started_after]


def up_json(
    fleet: str, outcomes: dict[str, StartOutcome], verdicts: dict[str, Verdict], engines: dict[str, str]
) -> dict[str, Any]:
    servers = []
    for name, verdict in verdicts.items():
        outcome = outcomes[name]
        rec = outcome.record
        servers.append(
            {
                "name": name,
                "engine": engines.get(name),
                "action": outcome.action.value,
                "message": outcome.message,
                "spec_changed": outcome.spec_changed,
                "pgid": rec.pgid if rec else None,
                "port": rec.port if rec else None,
                "log_path": rec.log_path if rec else None,
                "time_to_ready_s": verdict.elapsed_s
                if verdict.state == State.READY and outcome.action == Action.LAUNCHED
                else None,
                "after_failure": outcome.after_failure,  # failed: "stopped" | "kept running (--keep-failed)" | "exited" | ...
                "started_after": _started_after(outcome),  # the siblings on its GPU it waited for
                "gpu_holders": list(outcome.gpu_holders),  # before launch: processes outside the fleet on its GPUs
                "verdict": verdict.to_json(),
            }
        )
    return {"fleet": fleet, "servers": servers}


def status_table(fleet: str, statuses: list[ServerStatus]) -> Table:
    """The ``status`` table; a ``unit`` column (systemd --user unit, ``launcher =
    "systemd-run"``) only when some server has one."""
    units = any(st.unit for st in statuses)
    table = Table(title=f"fleet {fleet}", title_justify="left")
    # pgid: the detach wrapper's pid, leader of the group the engine runs in (not the engine's own pid)
    cols = [
        "server",
        "engine",
        "host",
        "port",
        "pgid",
        *(["unit"] if units else []),
        "state",
        "uptime",
        "KV tokens",
        "max running",
        "context",
        "log",
    ]
    for col in cols:
        table.add_column(col, no_wrap=col != "log", overflow="fold")
    for st in statuses:
        state = st.state.value
        if st.state == Liveness.DEAD:
            state += f" ({st.exit_code if st.exit_code is not None else 'killed'})"
        elif st.category:
            state += f" ({st.category})"
        name = st.name + ("" if st.in_fleet else " (not in file)")
        cap = st.capacity
        unit = [st.unit or "-"] if units else []
        table.add_row(
            name,
            st.engine or "-",
            st.host,
            str(st.port or "-"),
            str(st.pid or "-"),
            *unit,
            _state(state),
            fmt_secs(st.uptime_s),
            fmt_int(cap.kv_cache_tokens),
            fmt_int(cap.max_running_requests),
            fmt_int(cap.context_length),
            st.log_path or "-",
        )
    return table


def status_notes(statuses: list[ServerStatus]) -> Group:
    lines = []
    for st in statuses:
        if st.detail and st.state != Liveness.READY:
            lines.append(Text(f"{st.name}: {st.detail}"))
        if st.spec_changed:
            lines.append(
                Text(
                    f"{st.name}: the fleet file changed since launch; `servefleet restart {st.name}` applies it",
                    style="yellow",
                )
            )
    return Group(*lines)


def down_table(results: dict[str, StopResult]) -> Table:
    table = Table(title="servefleet down", title_justify="left")
    for col in ("server", "result", "signal", "port free"):
        table.add_column(col)
    for name, res in results.items():
        style = "green" if res.ok else "bold red"
        table.add_row(
            name,
            Text(res.message, style=style if res.was_running or not res.ok else "dim"),
            res.signal or "-",
            "yes" if res.port_free else "NO",
        )
    return table
