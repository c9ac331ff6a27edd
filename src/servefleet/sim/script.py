"""The start-up script: which lines print when, and how start-up ends -- pure, no I/O.

:func:`plan_startup` decides it from the configuration; :mod:`.startup` plays the plan in real time,
and :func:`transcript` renders it at once -- the exact text the process would print, for tests and
benchmarks of log classifiers that need every failure of every style without starting processes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal

from servefleet.sim.config import SimConfig
from servefleet.sim.failures import Failure, after_ready_failure, startup_failure
from servefleet.sim.logline import Line, Renderer
from servefleet.sim.styles import API, ready_lines, server_up_lines, startup_events

__all__ = ["StartupPlan", "plan_startup", "transcript", "HANG_POINT"]

HANG_POINT = 0.4  # fraction of the timeline printed before --hang-loading goes silent


@dataclass(frozen=True)
class StartupPlan:
    steps: tuple[tuple[float, tuple[Line, ...]], ...]  # (seconds after start, lines), in order
    outcome: Literal["ready", "fail", "hang"]
    failure: Failure | None = None
    fail_at_s: float | None = None  # when the failure prints (outcome "fail")


def plan_startup(cfg: SimConfig, port: int, failure: Failure | None = None) -> StartupPlan:
    """The loading timeline cut where ``failure`` (or ``--hang-loading``) interrupts it.

    Without ``--fail-delay`` the cut is the failure's natural point (a fraction of the timeline, so it
    holds at ``--load-time 0`` too); with it, the cut is that many seconds in."""
    delay = cfg.fail_delay

    def kept(at: float) -> bool:
        if failure is None and not cfg.hang_loading:
            return True
        if delay is not None:
            return at * cfg.load_time <= delay
        return at <= (failure.at if failure is not None else HANG_POINT)

    steps = []
    for event in startup_events(cfg, port):
        if not kept(event.at):
            break
        steps.append((event.at * cfg.load_time, event.lines))
    if failure is not None:
        fail_at = delay if delay is not None else failure.at * cfg.load_time
        return StartupPlan(tuple(steps), "fail", failure, fail_at)
    if cfg.hang_loading:
        return StartupPlan(tuple(steps), "hang")
    return StartupPlan(tuple(steps), "ready")


def transcript(cfg: SimConfig, port: int | None = None, *, clock: float = 1_764_000_000.0) -> str:
    """The full text a sim process with ``cfg`` prints through start-up (and an after-ready failure),
    rendered at once with a fixed clock. A real port conflict is not simulated here."""
    port = cfg.bind_port if port is None else port
    pid = os.getpid()
    renderer = Renderer(cfg.style, tp=cfg.tp, color=cfg.color, pids={API: pid}, clock=lambda: clock)
    failure = startup_failure(cfg, cfg.fail_at_startup, port) if cfg.fail_at_startup is not None else None
    lines: list[Line] = []
    if failure is not None and failure.before_log and cfg.fail_delay is None:
        lines += failure.lines
    else:
        plan = plan_startup(cfg, port, failure)
        for _, step in plan.steps:
            lines += step
        if plan.outcome == "fail" and plan.failure is not None:
            lines += plan.failure.lines
        elif plan.outcome == "ready":
            lines += server_up_lines(cfg, port, pid)
            if cfg.fail_after_ready is not None:
                late = after_ready_failure(cfg, cfg.fail_after_ready, port)
                lines += late.prelude + late.lines
            else:
                warm, ready = ready_lines(cfg, port)
                lines += warm + ready
    return "".join(renderer.render(line) for line in lines)
