"""`generate --bench RUN.json`: each server starts at the best point of its own bench run, and the
report says where each limit came from."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from servefleet.bench.result import BenchConfig, Environment, Run, save_run
from servefleet.bench.result import Target as BenchTarget
from servefleet.cli.main import app
from servefleet.errors import ConfigError
from servefleet.generate.endpoints import Target, with_bench
from test_bench_compare import _point
from test_generate_dispatch import FakeServer, config, write_input


def bench_run(tmp_path, name: str, url: str, curve: dict[int, float], *, stream: bool = False):
    run = Run(
        created_at="2026-12-01T00:00:00+00:00",
        target=BenchTarget(label=name, base_url=url),
        config=BenchConfig(concurrency=sorted(curve), requests=10, stream=stream),
        environment=Environment(servefleet_version="0", python="3", platform="x", hostname="h"),
        points=[_point(c, tps) for c, tps in curve.items()],
    )
    return str(save_run(run, tmp_path / f"{name}.json"))


def test_each_server_gets_the_best_point_of_its_own_run(tmp_path) -> None:
    a = bench_run(tmp_path, "a", "http://127.0.0.1:1/v1", {64: 900.0, 128: 1000.0, 256: 950.0})
    b = bench_run(tmp_path, "srv-b", "http://elsewhere:2", {32: 400.0, 64: 500.0}, stream=True)
    targets = [
        Target("x", "http://127.0.0.1:1"),
        Target("srv-b", "http://127.0.0.1:2"),
        Target("c", "http://127.0.0.1:3"),
    ]
    got = {t.name: (t.bench_concurrency, t.bench_tps, t.bench_note) for t in with_bench(targets, [a, b])}
    assert got == {
        "x": (128, 1000.0, None),  # by URL (/v1 or not)
        "srv-b": (64, 500.0, "streaming run"),  # by label; a streaming run says so
        "c": (None, None, None),
    }  # no run of its own among several: nothing assumed


def test_a_single_run_that_matches_no_server_is_taken_for_every_server(tmp_path) -> None:
    only = bench_run(tmp_path, "cfg", "http://gpu-box:8000", {256: 1.0, 512: 2.0})
    assert [
        t.bench_concurrency
        for t in with_bench([Target("a", "http://127.0.0.1:1"), Target("b", "http://127.0.0.1:2")], [only])
    ] == [512, 512]


def test_a_file_that_is_not_a_run_is_refused_with_its_name(tmp_path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"points": 3}')
    with pytest.raises(ConfigError, match="bad.json: not a readable bench run"):
        with_bench([Target("a", "http://127.0.0.1:1")], [str(bad)])


async def test_the_job_starts_at_the_bench_point_and_reports_why(tmp_path) -> None:
    from servefleet.generate.runner import run_generate

    server = await FakeServer(delay_s=0.02, name="s0").start()
    try:
        run = bench_run(tmp_path, "s0", server.url, {4: 100.0, 12: 300.0, 32: 250.0})
        src = write_input(tmp_path / "in.jsonl", 60)
        report = await run_generate(
            config(src, tmp_path / "out", bench=[run]), targets=[server.target(max_running=64)]
        )
    finally:
        await server.stop()
    assert report.status == "complete"
    (s,) = report.servers
    assert s.limit_source == "bench" and "C=12" in s.limit_reason
    assert server.max_in_flight <= 12 < 64 + 7  # started at the bench point, not at max running + headroom
    saved = json.loads((tmp_path / "out" / "report.json").read_text())
    assert saved["servers"][0]["limit_source"] == "bench"


def test_cli_refuses_a_missing_bench_file(tmp_path) -> None:
    src = write_input(tmp_path / "in.jsonl", 1)
    result = CliRunner().invoke(
        app,
        [
            "generate",
            "-i",
            str(src),
            "-o",
            str(tmp_path / "o"),
            "--url",
            "http://127.0.0.1:9",
            "--bench",
            str(tmp_path / "nope.json"),
            "--json",
        ],
    )
    assert result.exit_code != 0


def test_the_progress_view_says_each_servers_limit_and_why() -> None:
    from rich.console import Console

    from servefleet.cli.generate_view import ProgressView
    from servefleet.generate.stats import JobStats, ServerStats

    stats = JobStats(total=10)
    stats.servers["a"] = ServerStats(
        "a",
        "http://127.0.0.1:1",
        limit=80,
        in_flight=80,
        limit_source="capacity",
        limit_reason="106 gives 3,818 tok/s (+13.1% vs 141)",
    )
    view = ProgressView(Console(record=True, width=200))
    view._stats = stats
    assert "a up 80/80 (capacity)" in view.plain_line()
    view.console.print(view.render())
    text = view.console.export_text()
    assert "capacity: 106 gives 3,818 tok/s (+13.1% vs 141)" in text


def test_the_final_report_shows_the_status_the_counts_and_each_servers_limit() -> None:
    from rich.console import Console

    from servefleet.cli.generate_view import render_report
    from servefleet.generate.report import JobReport, ServerReport

    report = JobReport(
        status="incomplete",
        destination="/out",
        input="in.jsonl",
        total=10,
        done_before=4,
        committed=5,
        failed=1,
        retries=3,
        remaining=1,
        shards=2,
        completion_tokens=1234,
        wall_s=2.0,
        output_tokens_per_s=617.0,
        servers=[
            ServerReport(
                name="a",
                base_url="http://127.0.0.1:1",
                state="up",
                requests=6,
                errors=1,
                completion_tokens=1234,
                prompt_tokens=60,
                output_tokens_per_s=617.0,
                mean_latency_s=0.5,
                final_concurrency=80,
                limit_source="capacity",
                limit_reason="106 gives 3,818 tok/s",
                outages=0,
                restarts=1,
            )
        ],
    )
    console = Console(record=True, width=200)
    render_report(report, console)
    text = console.export_text()
    assert "incomplete  9/10 input records committed (5 in this run, 4 before)" in text
    assert "1 / 3" in text and "capacity: 106 gives 3,818 tok/s" in text
