"""plan carries the caveats of the bench runs it rests on (issue 24 item 12): unsteady points,
points that never reached their concurrency (refused), and one run for a job of several servers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from servefleet.bench.result import SteadyWindow, load_run, save_run
from servefleet.cli.main import app
from servefleet.errors import ConfigError
from servefleet.plan.check import check_plan, measure_job, pick_config
from servefleet.plan.runs import curve_from_run
from test_plan_check import bench_run, make_job_dir

runner = CliRunner()


def _unsteady(path: Path, index: int) -> Path:
    run = load_run(path)
    run.points[index] = run.points[index].model_copy(
        update={
            "steady": SteadyWindow(
                start_s=5.0,
                end_s=5.0,
                output_tokens=0.0,
                output_tokens_per_s=0.0,
                steady=False,
                reason="point too short",
            )
        }
    )
    save_run(run, path)
    return path


def _short(path: Path, index: int, requests: int) -> Path:
    run = load_run(path)
    p = run.points[index]
    run.points[index] = p.model_copy(update={"requests": requests, "successful": requests})
    save_run(run, path)
    return path


def test_unsteady_points_are_a_caveat_in_text_and_json(tmp_path: Path) -> None:
    path = _unsteady(bench_run(tmp_path / "r.json", [(8, 100.0), (64, 600.0)]), 1)
    assert any("unsteady, at concurrency 64 (steady window 0.0 s)" in c for c in curve_from_run(path).caveats)
    res = runner.invoke(
        app, ["plan", "--bench", str(path), "--prompts", "1000", "--output-tokens-mean", "100", "--json"]
    )
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert any("unsteady" in c for c in out["caveats"]["r"])
    assert any("unsteady" in c for c in out["plans"]["1"][0]["caveats"])
    assert "caveat" in out["recommendation"]
    text = runner.invoke(app, ["plan", "--bench", str(path), "--prompts", "1000", "--output-tokens-mean", "100"])
    assert text.exit_code == 0 and "caveat:" in text.output and "unsteady" in text.output


def test_a_point_that_never_reached_its_concurrency_is_refused(tmp_path: Path) -> None:
    path = _short(bench_run(tmp_path / "r.json", [(8, 100.0), (512, 9000.0)]), 1, 4)  # -c 512 -n 4
    curve = curve_from_run(path)
    assert curve.curve.concurrency == (8,)  # the 512 point is not planned from
    assert any("never reached their concurrency (concurrency 512 with 4 request(s))" in c for c in curve.caveats)
    only = _short(bench_run(tmp_path / "only.json", [(512, 9000.0)]), 0, 4)
    with pytest.raises(ConfigError, match="no point reached its concurrency"):
        curve_from_run(only)
    res = runner.invoke(app, ["plan", "--bench", str(only), "--prompts", "10", "--output-tokens-mean", "5"])
    assert res.exit_code == 3 and "no point reached its concurrency" in res.output


def test_one_run_for_a_job_of_two_servers_says_what_it_assumed(tmp_path: Path) -> None:
    job = make_job_dir(
        tmp_path / "out", valid=14, runs=[(0.0, 10.0, "complete")], rows={"a": [100] * 7, "b": [100] * 7}
    )
    path = bench_run(tmp_path / "cfg.json", [(1, 50.0), (8, 300.0)])
    meas = measure_job(job)
    res = check_plan(pick_config([(curve_from_run(path), "m")], meas), meas)
    assert any("one bench run (cfg) for a job 2 servers answered (a, b)" in c for c in res.caveats)
    assert res.to_json()["caveats"] == res.caveats
