"""The bench plots (servefleet.cli.plots): what is drawn where, read back from the figure."""

from __future__ import annotations

from servefleet.bench.result import BenchConfig, Environment, Point, Run, Stat, Target
from servefleet.cli.plots import latency_figure, plot_latency


def _point(c: int, tps: float, itl_ms: float | None) -> Point:
    lat = Stat(mean=itl_ms, p50=itl_ms, n=10) if itl_ms is not None else Stat()  # Stat(): no request succeeded
    return Point(
        concurrency=c,
        requests=10,
        successful=10 if itl_ms is not None else 0,
        errors=0 if itl_ms is not None else 10,
        duration_s=1.0,
        requests_per_s=10.0,
        input_tokens=1000,
        output_tokens=int(tps),
        output_tokens_per_s=tps,
        total_tokens_per_s=tps + 1000,
        ttft_ms=lat,
        tpot_ms=lat,
        itl_ms=lat,
        e2e_ms=lat,
        achieved_concurrency=float(c),
        client_bound=False,
    )


def _run(points: list[Point]) -> Run:
    return Run(
        created_at="2026-12-01T00:00:00+00:00",
        target=Target(label="a", base_url="http://127.0.0.1:1", engine="sim"),
        config=BenchConfig(concurrency=[p.concurrency for p in points], requests=10, input_len=10, output_len=10),
        environment=Environment(servefleet_version="0", python="3", platform="x", hostname="h"),
        points=points,
    )


def test_latency_labels_stay_on_their_points_when_a_point_has_no_latency(tmp_path) -> None:
    """The c=1 point failed entirely (no latency): c=4 and c=16 are labelled at their own positions."""
    run = _run([_point(1, 0.0, None), _point(4, 400.0, 20.0), _point(16, 1200.0, 35.0)])
    fig = latency_figure([run])
    itl_ax, ttft_ax = fig.axes
    assert [(t.get_text(), tuple(t.xy)) for t in itl_ax.texts] == [("4", (400.0, 20.0)), ("16", (1200.0, 35.0))]
    assert [line.get_xydata().tolist() for line in ttft_ax.get_lines()] == [[[400.0, 20.0], [1200.0, 35.0]]]
    assert plot_latency([run], tmp_path / "latency.png").stat().st_size > 0
