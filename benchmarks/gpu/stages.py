"""The stage runner every GPU driver shares (issue 26): named stages run in the order given, within a
time budget, with a checkpoint after each and a JSON record of what ran.

    timings, failed = run_stages([Stage("up", up, estimate_s=200), Stage("down", down, always=True)],
                                 say=print, budget_s=540, checkpoint=pack_results)

- A stage is skipped when it would end past the budget (by its estimate); ``always`` stages (down,
  collect) run anyway, so a device command ends inside its limit with its servers stopped.
- A stage's result may say ``{"skipped": why}`` (or name its own ``{"status": ...}``); a stage that
  raises ``Blocked`` stops every later stage but the ``always`` ones (a setup that found nothing to
  run with); any other exception is recorded and the run goes on, so down and collect still happen.
- ``checkpoint(timings)`` runs after every stage that is not ``always``, so a command cut short still
  brings back what it did; ``summary_path`` gets the timings as JSON after every stage.

Standard library only: a driver starts before anything is installed.

As a command, it runs a shell driver's stages, each as ``bash SCRIPT --stage NAME --budget LEFT``::

    python3 stages.py --script sglang_h200.sh --budget 560 --summary R/stages.json \\
        --checkpoint "bash sglang_h200.sh --stage checkpoint" --always down --blocking smoke setup smoke up
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Stage", "Blocked", "run_stages", "seconds_left", "short_of", "main"]


def seconds_left(budget_s: float | None, t0: float) -> float | None:
    """What is left of a budget of ``budget_s`` seconds counted from ``t0`` (``time.monotonic()``);
    None without one (0 counts as none, as ``--budget`` has always read it)."""
    return budget_s - (time.monotonic() - t0) if budget_s else None


def short_of(budget_s: float | None, t0: float, need_s: float) -> float | None:
    """The seconds left when fewer than ``need_s`` are (a step that would end past the budget), else None."""
    left = seconds_left(budget_s, t0)
    return left if left is not None and left < need_s else None


class Blocked(Exception):  # a stage's outcome, not an error of the runner
    """Raised by a stage after which nothing but the ``always`` stages can work; ``status`` is its own."""

    def __init__(self, status: str, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


@dataclass(frozen=True)
class Stage:
    name: str
    run: Callable[
        [list[dict]], object
    ]  # given the timings so far (its own entry last); a dict may say "skipped" or "status"
    estimate_s: float = 10.0
    always: bool = False  # runs past the budget and after a Blocked stage


def run_stages(
    stages: Sequence[Stage],
    *,
    say: Callable[[str], object],
    budget_s: float | None = None,
    t0: float | None = None,
    checkpoint: Callable[[list[dict]], object] | None = None,
    summary_path: Path | None = None,
) -> tuple[list[dict], bool]:
    """Run ``stages`` in order; returns the timings (stage, status, seconds) and whether one failed.
    While a stage runs its own entry reads "ok", so a checkpoint it takes itself (collect) records it."""
    start = time.monotonic() if t0 is None else t0
    timings: list[dict] = []
    failed = False
    blocked: str | None = None
    for i, stage in enumerate(stages):
        elapsed = time.monotonic() - start
        if blocked and not stage.always:
            say(f"== {stage.name}: SKIPPED ({blocked})")
            timings.append({"stage": stage.name, "status": f"skipped ({blocked})", "seconds": 0.0})
            _write(summary_path, timings, failed)
            continue
        if not stage.always and short_of(budget_s, start, stage.estimate_s) is not None:
            say(
                f"== {stage.name}: SKIPPED (budget: {elapsed:.0f} s used, ~{stage.estimate_s:.0f} s needed, "
                f"{budget_s:.0f} s allowed)"
            )
            timings.append({"stage": stage.name, "status": "skipped (budget)", "seconds": 0.0})
            _write(summary_path, timings, failed)
            continue
        say(f"== {stage.name}")
        entry = {"stage": stage.name, "status": "ok", "seconds": 0.0}
        timings.append(entry)
        began = time.monotonic()
        status = "ok"
        try:
            result = stage.run(timings)
            if isinstance(result, dict) and result.get("skipped"):
                status = f"skipped ({result['skipped']})"
            elif isinstance(result, dict) and result.get("status"):
                status = str(result["status"])
        except Blocked as exc:
            status = exc.status
            if any(not s.always for s in stages[i + 1 :]):  # nothing after it can work
                blocked = exc.reason
                failed = True
        except Exception as exc:  # keep going: later stages (down, collect) must still run
            failed = True
            status = f"error: {type(exc).__name__}: {exc}"
            say(traceback.format_exc())
        entry.update(status=status, seconds=round(time.monotonic() - began, 1))
        say(f"== {stage.name}: {status} in {entry['seconds']:.1f} s")
        _write(summary_path, timings, failed)
        if checkpoint is not None and not stage.always:
            try:  # after every stage: a run cut short still brings its results back
                checkpoint(timings)
            except Exception as exc:
                say(f"checkpoint failed: {exc}")
    say("stage timings: " + ", ".join(f"{t['stage']} {t['seconds']}s ({t['status']})" for t in timings))
    return timings, failed


def _write(path: Path | None, timings: list[dict], failed: bool) -> None:
    if path is not None:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps({"stages": timings, "failed": failed}, indent=1) + "\n")
        tmp.replace(path)


# ---- a shell driver's stages ----------------------------------------------------------------------
def _shell_stage(script: str, name: str, budget_s: float | None, start: float) -> Stage:
    def run(_timings: list[dict]) -> dict | None:
        argv = ["bash", script, "--stage", name]
        left = seconds_left(budget_s, start)
        if left is not None:
            argv += ["--budget", str(max(1, int(left)))]
        rc = subprocess.run(argv).returncode
        return (
            {"status": f"rc={rc}"} if rc else None
        )  # a shell stage's rc is recorded; only a blocking one's stops the run

    return Stage(name, run)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="stages.py", description="Run a shell driver's stages with the shared stage runner."
    )
    p.add_argument("stages", nargs="+")
    p.add_argument(
        "--script", required=True, help="the shell driver: `bash SCRIPT --stage NAME [--budget LEFT]` runs one stage"
    )
    p.add_argument("--budget", type=float, default=None, help="seconds for all the stages")
    # 30 s: sglang_h200.sh's own rule before it used this runner ("fewer than 30 s left: skip the stage")
    p.add_argument(
        "--estimate", type=float, default=30.0, help="seconds a stage needs at least (skipped past the budget)"
    )
    p.add_argument(
        "--always", action="append", default=[], help="a stage that runs past the budget and after a blocking one"
    )
    p.add_argument("--blocking", action="append", default=[], help="a stage whose failure stops the later ones")
    p.add_argument("--checkpoint", default=None, help="a shell command run after every stage and at the end")
    p.add_argument("--summary", type=Path, default=None, help="JSON file of the stages' timings, written after each")
    p.add_argument("--log", type=Path, default=None, help="a file the runner's own lines are appended to as well")
    a = p.parse_args(argv)
    start = time.monotonic()

    def say(text: str) -> None:
        print(text, flush=True)
        if a.log is not None:
            with open(a.log, "a") as fh:
                fh.write(text + "\n")

    stages: list[Stage] = []
    for name in a.stages:
        base = _shell_stage(a.script, name, a.budget, start)
        if name in a.blocking:

            def run(timings: list[dict], base: Stage = base) -> object:
                result = base.run(timings)
                if isinstance(result, dict) and result.get("status"):
                    raise Blocked(f"failed ({result['status']})", f"{base.name} failed")
                return result

            base = Stage(name, run)
        stages.append(Stage(name, base.run, estimate_s=a.estimate, always=name in a.always))

    def checkpoint(_timings: list[dict]) -> None:
        subprocess.run(["bash", "-c", a.checkpoint], check=True)

    _, failed = run_stages(
        stages,
        say=say,
        budget_s=a.budget,
        t0=start,
        summary_path=a.summary,
        checkpoint=checkpoint if a.checkpoint else None,
    )
    if a.checkpoint:
        subprocess.run(["bash", "-c", a.checkpoint])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
