"""Where start-up time goes (issue 25.7): each server's time per progress phase, from the lines
the engine profiles already know, on the engine's own timestamps (a log read afterwards, or a
start long enough for whole-second stamps) or on servefleet's clock (a short live start). Checked
against the recorded real vLLM 0.26 / SGLang 0.5.17 H200 logs' own timestamps, and live on the sim."""

from __future__ import annotations

import re
from pathlib import Path

from conftest import free_port
from servefleet.catalog import State
from servefleet.cli.fleet_view import startup_phases_text, up_table
from servefleet.fleet import Fleet
from servefleet.verify.diagnose import diagnose_text
from servefleet.verify.startup_phases import Mark, phase_times, phase_totals

REAL = Path(__file__).parent / "fixtures" / "logs" / "real"


def lines_of(name: str) -> list[str]:
    return (REAL / name).read_bytes().decode("utf-8", errors="replace").split("\n")


def stamp(line: str) -> int:
    """Seconds of the day of a line's HH:MM:SS (the test's own reading of the log)."""
    m = re.search(r"\b(\d\d):(\d\d):(\d\d)\b", line)
    assert m is not None, line
    hh, mm, ss = (int(g) for g in m.groups())
    return hh * 3600 + mm * 60 + ss


def at(lines: list[str], text: str, nth: int = 0) -> int:
    return stamp([line for line in lines if text in line][nth])


def test_vllm_h200_start_up_phases_match_the_logs_own_timestamps() -> None:
    lines = lines_of("vllm026_h200_ready_plain.log")
    verdict = diagnose_text("\n".join(lines))
    assert verdict.state is State.READY and verdict.startup_clock == "log"
    took = dict(phase_totals(verdict.startup_phases))
    assert (
        took["compiling (torch.compile)"]
        == at(lines, "Initial profiling/warmup run took") - at(lines, "Dynamo bytecode transform time")
        == 9
    )
    assert took["loading weights"] + took["loading weight shards"] == at(lines, "Loading weights took") - at(
        lines, "Loading model from scratch"
    )
    # the capture's progress bar has no timestamp: it starts at the last stamped line before it
    assert (
        took["capturing CUDA graphs"]
        == at(lines, "Graph capturing finished") - at(lines, "Maximum concurrency for")
        == 2
    )
    assert (
        took["CUDA graphs captured"]
        == at(lines, "init engine (profile, create kv cache") - at(lines, "Graph capturing finished")
        == 14
    )
    stamped = [
        line
        for line in lines[: next(i for i, x in enumerate(lines) if "Application startup complete" in x)]
        if re.search(r"INFO \d\d-\d\d ", line)
    ]
    assert sum(took.values()) == stamp(stamped[-1]) - at(lines, "non-default args") == 85
    for phase in verdict.startup_phases:  # each phase starts at its own mark line
        assert phase.line_no >= 1 and lines[phase.line_no - 1].strip()
    assert (
        "Dynamo bytecode transform time"
        in lines[next(p.line_no for p in verdict.startup_phases if p.phase.startswith("compiling")) - 1]
    )


def test_sglang_h200_start_up_phases_match_the_logs_own_timestamps() -> None:
    lines = lines_of("sglang0517_h200_ready_plain.log")
    verdict = diagnose_text("\n".join(lines))
    assert verdict.state is State.READY and verdict.startup_clock == "log"
    took = dict(phase_totals(verdict.startup_phases))
    prefill = at(lines, "Capture target prefill CUDA graph end") - at(lines, "Capture target prefill CUDA graph begin")
    decode = at(lines, "Capture target decode CUDA graph end") - at(lines, "Capture target decode CUDA graph begin")
    assert took["capturing CUDA graphs"] == prefill + decode == 33  # the label comes back for the decode graphs
    assert took["HTTP server up, warming up"] == at(lines, '"POST /generate HTTP/1.1" 200') - at(
        lines, "Uvicorn running on"
    )
    assert sum(took.values()) == at(lines, '"POST /generate HTTP/1.1" 200') - at(lines, "Init torch distributed begin")


def test_the_clock_is_the_engines_for_a_long_or_caught_up_start_and_servefleets_for_a_short_live_one() -> None:
    short_live = [Mark("a", 1, 100.0, 0.2), Mark("b", 2, 101.0, 1.3)]
    phases, clock = phase_times(short_live, Mark("ready", 3, 102.0, 2.1))
    assert clock == "seen" and [p.took_s for p in phases] == [1.1, 0.8]
    caught_up = [Mark("a", 1, 100.0, 5.0), Mark("b", 2, 110.0, 5.0)]  # an old log read in one go
    phases, clock = phase_times(caught_up, Mark("ready", 3, 112.0, 5.01))
    assert clock == "log" and [p.took_s for p in phases] == [10.0, 2.0]
    long_live = [Mark("a", 1, 100.0, 0.5), Mark("b", 2, 160.0, 61.2)]
    phases, clock = phase_times(long_live, None)
    assert (
        clock == "log" and phases[0].took_s == 60.0 and phases[-1].took_s is None
    )  # not ready: the last phase is open
    assert phase_times([], None) == ([], None)


async def test_up_gives_each_servers_time_per_phase_in_its_verdict_and_table(tmp_path: Path, fleets) -> None:
    load = 2.0
    path = tmp_path / "fleet.toml"
    path.write_text(
        '[fleet]\nname = "sp"\ntimeout = 60\nstall = 30\n[defaults]\nengine = "sim"\nmodel = "sim-m"\n'
        f'[[servers]]\nname = "v"\nport = {free_port()}\nargs = ["--style", "vllm", "--load-time", "{load}"]\n'
    )
    fleet = fleets(Fleet.load(path))
    outcomes = await fleet.start()
    verdict = (await fleet.wait(outcomes, smoke=False))["v"]
    assert verdict.state is State.READY and verdict.startup_clock == "seen"
    took = dict(phase_totals(verdict.startup_phases))
    assert {"loading weights", "capturing CUDA graphs", "warming up"} <= set(took), took
    assert 0.5 * load <= sum(took.values()) <= (verdict.elapsed_s or 0), (took, verdict.elapsed_s)
    assert verdict.to_json()["startup_phases"][0]["phase"] == verdict.startup_phases[0].phase
    table = up_table(outcomes, {"v": verdict}, {"v": "sim"})
    (column,) = [c for c in table.columns if c.header == "start-up phases"]
    (cell,) = list(column.cells)
    assert cell == startup_phases_text(verdict) and "capturing CUDA graphs" in str(cell), cell
