"""RUN.json contract and `servefleet compare` on two known runs."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from servefleet.bench.compare import compare_runs
from servefleet.bench.result import BenchConfig, Environment, Point, Run, Stat, Target, load_run, save_run
from servefleet.capacity import Capacity
from servefleet.cli.main import app

CONTRACT_POINT_FIELDS = {
    "concurrency",
    "requests",
    "errors",
    "duration_s",
    "requests_per_s",
    "output_tokens_per_s",
    "total_tokens_per_s",
    "ttft_ms",
    "tpot_ms",
    "itl_ms",
    "e2e_ms",
    "client_bound",
}


def _point(c: int, tps: float, bound: bool = False) -> Point:
    lat = Stat(mean=10.0 * c, p50=9.0 * c, p90=12.0 * c, p99=15.0 * c, n=10)
    return Point(
        concurrency=c,
        requests=10,
        successful=10,
        errors=0,
        duration_s=1.0,
        requests_per_s=10.0,
        input_tokens=1000,
        output_tokens=int(tps),
        output_tokens_per_s=tps,
        total_tokens_per_s=tps + 1000,
        output_tokens_per_s_per_request=Stat(mean=tps / c, n=10),
        ttft_ms=lat,
        tpot_ms=lat,
        itl_ms=lat,
        e2e_ms=lat,
        achieved_concurrency=float(c),
        client_bound=bound,
    )


def _run(label: str, points: list[Point], max_running: int | None = None) -> Run:
    return Run(
        created_at="2026-11-30T00:00:00+00:00",
        target=Target(label=label, base_url="http://127.0.0.1:1", engine="sim"),
        config=BenchConfig(concurrency=[p.concurrency for p in points], requests=10, input_len=100, output_len=100),
        capacity=Capacity(max_running_requests=max_running) if max_running else None,
        environment=Environment(servefleet_version="0", python="3", platform="x", hostname="h"),
        points=points,
    )


@pytest.fixture
def two_runs(tmp_path):
    mtp = _run("mtp", [_point(1, 70.0), _point(4, 234.0), _point(16, 240.0, bound=True)], max_running=4)
    plain = _run("plain", [_point(1, 26.7), _point(4, 100.0), _point(16, 380.0), _point(64, 1200.0)])
    return save_run(mtp, tmp_path / "mtp.json"), save_run(plain, tmp_path / "plain.json")


def test_run_json_has_the_contract_names(two_runs) -> None:
    data = json.loads(two_runs[0].read_text())
    assert isinstance(data["points"], list)
    for point in data["points"]:
        assert CONTRACT_POINT_FIELDS <= set(point)
        for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
            assert {"mean", "p50", "p90", "p99"} <= set(point[key])
    assert load_run(two_runs[0]).points[1].output_tokens_per_s == 234.0


def test_schema_rejects_a_broken_run(tmp_path) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"created_at": "x", "points": [{"concurrency": 1}]}))
    with pytest.raises(ValidationError):
        load_run(path)


def test_compare_known_runs_ratios_and_best(two_runs) -> None:
    comp = compare_runs([load_run(p) for p in two_runs])
    assert comp.levels == ["1", "4", "16", "64"]
    mtp, plain = comp.runs
    assert mtp.best_level == "16" and mtp.best_output_tokens_per_s == 240.0 and mtp.max_running_requests == 4
    assert plain.best_level == "64" and plain.ratio_best == pytest.approx(1200 / 240)
    assert plain.ratio["4"] == pytest.approx(100 / 234) and plain.ratio["64"] is None
    assert mtp.client_bound_levels == ["16"]


def test_compare_cli_prints_table_and_writes_plots(two_runs, tmp_path) -> None:
    out = tmp_path / "plots"
    result = CliRunner().invoke(
        app, ["compare", str(two_runs[0]), str(two_runs[1]), "--out-dir", str(out)], env={"COLUMNS": "200"}
    )
    assert result.exit_code == 0, result.output
    text = result.output
    assert "mtp" in text and "plain" in text and "1,200" in text and "5.00x" in text
    assert "client, not the server" in text
    for name in ("compare-throughput.png", "compare-latency.png"):
        png = out / name
        assert png.exists() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    js = CliRunner().invoke(app, ["compare", str(two_runs[0]), str(two_runs[1]), "--no-plots", "--json"])
    assert js.exit_code == 0
    assert json.loads(js.output)["runs"][1]["best_output_tokens_per_s"] == 1200.0


def test_compare_cli_rejects_a_non_run(tmp_path) -> None:
    bad = tmp_path / "x.json"
    bad.write_text("{}")
    result = CliRunner().invoke(app, ["compare", str(bad)])
    assert result.exit_code == 3 and "not a servefleet bench RUN.json" in result.output
