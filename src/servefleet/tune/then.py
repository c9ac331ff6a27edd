"""``tune --then-generate``: the winner relaunched on every server of the base fleet, the job run over
them through generate's library entry point (``run_generate``, started at the tune's best point via
``--bench``), then the plan checked against what the job measured (``plan --check``'s functions)."""

from __future__ import annotations

import asyncio
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servefleet.catalog import State
from servefleet.errors import ConfigError, ServefleetError
from servefleet.fleet import Fleet
from servefleet.generate import GenerateConfig, JobParams, JobReport, run_generate
from servefleet.generate.endpoints import FleetRestarter, targets_from_fleet
from servefleet.plan.check import CheckResult, check_plan, measure_job
from servefleet.plan.runs import curve_from_run

__all__ = ["ThenResult", "then_generate"]


@dataclass
class ThenResult:
    fleet: str
    servers: list[str]
    report: JobReport
    check: CheckResult | None
    check_error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "fleet": self.fleet,
            "servers": self.servers,
            "job": self.report.to_json(),
            "check": self.check.to_json() if self.check is not None else None,
            "check_error": self.check_error,
        }


async def then_generate(
    winner_fleet: Path,
    run: Path,
    gpus_per_replica: int,
    *,
    input: Path,
    output: str,
    max_tokens: int | None,
    on_event=None,
) -> ThenResult:
    say = on_event or (lambda _m: None)
    async with Fleet.load(winner_fleet) as fleet:
        try:
            say(f"relaunching the winner on {len(fleet.spec.names)} server(s) of {winner_fleet.name}")
            verdicts = await fleet.up()
            bad = {n: v for n, v in verdicts.items() if v.state != State.READY}
            if len(bad) == len(verdicts):
                first = next(iter(bad.values()))
                raise ServefleetError(
                    f"no server of the winner's fleet got ready: {first.message or first.state.value}"
                )
            targets = await targets_from_fleet(fleet)
            if not targets:
                raise ConfigError(f"no server of {winner_fleet} is ready")
            config = GenerateConfig(
                input=str(input), output=output, bench=[str(run)], params=JobParams(max_tokens=max_tokens)
            )
            restarter = FleetRestarter(fleet)
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)
            try:
                with restarter.recording(config.output, [t.name for t in targets]):
                    say(f"generate: {len(targets)} server(s), starting at the tune's best point ({run.name})")
                    report = await run_generate(config, targets=targets, restarter=restarter, stop=stop)
            finally:
                for sig in (signal.SIGINT, signal.SIGTERM):
                    loop.remove_signal_handler(sig)
        finally:
            await fleet.down(grace_s=15.0)
    result = ThenResult(fleet=str(winner_fleet), servers=[t.name for t in targets], report=report, check=None)
    try:
        measured = measure_job(output)
        result.check = check_plan(curve_from_run(run, gpus_per_replica), measured)
    except ServefleetError as exc:
        result.check_error = str(exc)
    return result
