"""`servefleet report`: the HTML of a real job (a crash, a restart, failures, an interrupted and resumed
run) and of bench runs, opened in a real headless browser (Debian's chromium, driven by playwright):
no console errors, no request leaves the page, and the numbers drawn are the job's own."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import PYTHON, REPO
from parquet_read import read_parquet
from report_job import PROMPTS, build_job

SERVEFLEET = [PYTHON, "-m", "servefleet.cli.main"]
BENCH_RUNS = [
    REPO / "benchmarks/results/sim_mtp_vs_plain/RUN-mtp.json",
    REPO / "benchmarks/results/sim_mtp_vs_plain/RUN-plain.json",
]
SETUP = "sh scripts/ci-browser-setup.sh"


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    return build_job(tmp_path_factory.mktemp("report-job"))


@pytest.fixture(scope="module")
def browser():
    if os.environ.get("SERVEFLEET_SKIP_BROWSER") == "1":  # the explicit opt-out (scripts/test-prereqs.sh)
        pytest.skip("SERVEFLEET_SKIP_BROWSER=1")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.fail(f"no chromium on this machine: install it with `{SETUP}` (Debian's chromium package)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail(
            "playwright is missing: pip install -e '.[test]' (it drives the system chromium; no browser download)"
        )
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        yield b
        b.close()


def cli(*args: str) -> tuple[int, dict, str]:
    proc = subprocess.run([*SERVEFLEET, *args], capture_output=True, text=True, timeout=120)
    try:
        return proc.returncode, json.loads(proc.stdout), proc.stderr
    except ValueError:
        raise AssertionError(f"rc {proc.returncode}: {proc.stdout[-2000:]}\n{proc.stderr[-2000:]}") from None


def open_page(browser, path: Path):
    """The page, and what went wrong while it loaded: console errors and warnings, script errors,
    requests for anything but the file itself."""
    page = browser.new_page(viewport={"width": 1000, "height": 900})
    problems: list[str] = []
    page.on(
        "console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type in ("error", "warning") else None
    )
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("request", lambda r: problems.append(f"request: {r.url}") if r.url != path.as_uri() else None)
    page.goto(path.as_uri())
    page.wait_for_load_state("load")
    return page, problems


READ_CHARTS = """() => Array.from(document.querySelectorAll('svg.chart')).map(svg => ({
  id: svg.dataset.chart, ymax: +svg.dataset.ymax, xmax: +svg.dataset.xmax, xmin: +(svg.dataset.xmin || 0),
  plot: (svg.dataset.plot || '0,0,1,1').split(',').map(Number),
  series: Array.from(svg.querySelectorAll('g.series')).map(g => ({
    name: g.dataset.series, values: JSON.parse(g.dataset.values), x: JSON.parse(g.dataset.x),
    points: Array.from(g.querySelectorAll('polyline')).map(p => p.getAttribute('points').trim().split(/\\s+/).map(xy => xy.split(',').map(Number))),
    visible: getComputedStyle(g).display !== 'none'})),
  outages: Array.from(svg.querySelectorAll('rect.outage')).map(r => ({server: r.dataset.server, start: +r.dataset.start, end: +r.dataset.end})),
  restarts: Array.from(svg.querySelectorAll('g.restart')).map(g => ({server: g.dataset.server, t: +g.dataset.t})),
  runs: Array.from(svg.querySelectorAll('g.run')).map(g => g.dataset.run),
  bars: Array.from(svg.querySelectorAll('rect.bar')).map(r => ({label: r.dataset.label, value: +r.dataset.value})),
}))"""


def drawn_values(chart: dict, series: dict) -> list[float]:
    """The values a series' polylines are drawn at, read back from the y coordinates."""
    left, top, pw, ph = chart["plot"]
    pts = [pt for line in series["points"] for pt in line]
    # a lone value is drawn as a two-point polyline a hair apart: count it once
    out, last_x = [], None
    for x, y in pts:
        if last_x is not None and abs(x - last_x) < 0.05:
            continue
        last_x = x
        out.append((top + ph - y) / ph * chart["ymax"])
    return out


def shard_tokens_by_server(dest: Path) -> dict[str, int]:
    tokens: dict[str, int] = {}
    for shard in (dest / "shards").glob("*.parquet"):
        t = read_parquet(shard, columns=["server", "completion_tokens"])
        for server, n in zip(t.column("server").to_pylist(), t.column("completion_tokens").to_pylist(), strict=True):
            tokens[server] = tokens.get(server, 0) + (n or 0)
    return tokens


def test_the_job_report_in_a_real_browser_holds_the_jobs_numbers(job, browser, tmp_path):
    out = tmp_path / "report.html"
    rc, written, err = cli("report", str(job.dest), "--bench", str(BENCH_RUNS[1]), "--out", str(out), "--json")
    assert rc == 0 and written["out"] == str(out) and written["plan"] and written["runs"] == 2, err
    rc, check, err = cli("plan", "--check", str(job.dest), "--bench", str(BENCH_RUNS[1]), "--json")
    assert rc == (0 if check["within_tolerance"] else 1), err  # a sim job against a committed run may miss

    page, problems = open_page(browser, out)
    charts = {c["id"]: c for c in page.evaluate(READ_CHARTS)}
    assert problems == []
    timelines = [json.loads(p.read_text()) for p in sorted((job.dest / "timeline").glob("*.json"))]
    assert [t["run_id"] for t in timelines] == [r["run_id"] for r in job.runs]

    # output tokens/s: every whole bucket is the run's tokens over the bucket's seconds, drawn where it says
    tps = charts["tps"]
    assert {s["name"] for s in tps["series"]} == {"steady", "crashy"}
    for s in tps["series"]:
        values = [v for v in s["values"] if v is not None]
        assert len(values) == sum(t["buckets"] for t in timelines)
        assert s["values"].count(None) == len(timelines) - 1  # one gap between the runs
        expected = []
        for t in timelines:
            col = t["servers"][s["name"]]["output_tokens"]
            expected += [n / t["bucket_s"] for n in col[:-1]] + [None]  # the last bucket of a run is partial
        whole = [(v, e) for v, e in zip(values, expected, strict=True) if e is not None]
        assert whole and all(v == pytest.approx(e, abs=1e-3) for v, e in whole)
        assert drawn_values(tps, s) == pytest.approx(values, abs=tps["ymax"] / tps["plot"][3])  # within a pixel
    # the time series agrees with the ledger: every committed row's tokens, per server
    assert shard_tokens_by_server(job.dest) == {
        name: sum(sum(t["servers"][name]["output_tokens"]) for t in timelines) for name in ("steady", "crashy")
    }

    # concurrency: the limit drawn is the limit recorded; in flight never above it
    conc = {s["name"]: s for s in charts["concurrency"]["series"]}
    for name in ("steady", "crashy"):
        assert [v for v in conc[f"{name} limit"]["values"] if v is not None] == [
            v for t in timelines for v in t["servers"][name]["limit"]
        ]
        inflight = [v for v in conc[name]["values"] if v is not None]
        assert max(inflight) <= max(v for t in timelines for v in t["servers"][name]["in_flight_max"])

    # restarts and outages on the same time axis, as many as the runs reported
    restarts = sum(s["restarts"] for r in job.runs for s in r["servers"] if s["name"] == "crashy")
    outages = sum(s["outages"] for r in job.runs for s in r["servers"] if s["name"] == "crashy")
    assert restarts >= 1
    for chart in (tps, charts["concurrency"], charts["failures"]):
        assert [o["server"] for o in chart["outages"]] == ["crashy"] * outages
        assert [m["server"] for m in chart["restarts"]] == ["crashy"] * restarts
        for m in chart["restarts"]:
            assert any(
                o["start"] <= m["t"] <= o["end"] + 1e-6 for o in chart["outages"]
            )  # back after the restart ends the outage
        assert chart["runs"] == [job.runs[1]["run_id"]]
    # failures: each run's failed prompts, per bucket
    failed = {s["name"]: s for s in charts["failures"]["series"]}["failed"]
    assert sum(v for v in failed["values"] if v is not None) == sum(r["failed"] for r in job.runs)

    # the plan against the run: the numbers plan --check gives
    bars = {b["label"]: b["value"] for b in charts["plan"]["bars"]}
    makespan = check["metrics"]["makespan_s"]
    assert bars == {
        "predicted makespan": pytest.approx(makespan["predicted"], rel=1e-3),
        "measured makespan": pytest.approx(makespan["measured"], rel=1e-3),
    }
    committed = read_parquet(job.dest / "shards", columns=["id"]).num_rows
    assert f"{committed:,} / {PROMPTS:,}" in page.inner_text(".cards")

    # hiding a server from its legend key hides it in every chart
    page.click(".legend .key[data-series=crashy]")
    hidden = [s["name"] for c in page.evaluate(READ_CHARTS) for s in c["series"] if not s["visible"]]
    assert sorted(set(hidden)) == ["crashy", "crashy errors", "crashy limit"]
    page.click(".legend .key[data-series=crashy]")

    shot = tmp_path / "report.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 20_000  # something was drawn
    if os.environ.get("SERVEFLEET_REPORT_SCREENSHOT"):  # the README's picture: the top of the page
        page.screenshot(
            path=os.environ["SERVEFLEET_REPORT_SCREENSHOT"], clip={"x": 0, "y": 0, "width": 1000, "height": 1020}
        )
    page.close()


def test_the_bench_report_in_a_real_browser_draws_each_runs_points(browser, tmp_path):
    out = tmp_path / "bench.html"
    rc, written, err = cli("report", *map(str, BENCH_RUNS), "--out", str(out), "--json")
    assert rc == 0 and written["kind"] == "bench" and written["runs"] == ["mtp", "plain"], err
    page, problems = open_page(browser, out)
    charts = {c["id"]: c for c in page.evaluate(READ_CHARTS)}
    assert problems == []
    for path in BENCH_RUNS:
        run = json.loads(path.read_text())
        points = sorted(run["points"], key=lambda p: p["concurrency"])
        label = run["target"]["label"]
        tps = {s["name"]: s for s in charts["bench-tps"]["series"]}[label]
        assert tps["x"] == [p["concurrency"] for p in points]
        assert tps["values"] == pytest.approx([p["output_tokens_per_s"] for p in points], abs=1e-3)
        e2e = {s["name"]: s for s in charts["bench-e2e"]["series"]}[label]
        assert e2e["values"] == pytest.approx([p["e2e_ms"]["p50"] for p in points], abs=1e-3)
        assert drawn_values(charts["bench-tps"], tps) == pytest.approx(
            tps["values"], abs=charts["bench-tps"]["ymax"] / charts["bench-tps"]["plot"][3]
        )
    page.close()


def test_report_refuses_what_is_neither_a_job_nor_a_bench_run(tmp_path):
    rc, out, _ = cli("report", str(tmp_path), "--json")
    assert rc == 3 and "no job.json" in out["error"]["message"]
    bogus = tmp_path / "RUN.json"
    bogus.write_text('{"points": "no"}')
    rc, out, _ = cli("report", str(bogus), "--json")
    assert rc == 3 and "not a servefleet bench RUN.json" in out["error"]["message"]
    rc, out, _ = cli("report", str(tmp_path), str(tmp_path), "--json")
    assert rc == 3 and "one generate destination" in out["error"]["message"]


def test_the_report_needs_nothing_outside_the_file(job, tmp_path):
    rc, written, err = cli("report", str(job.dest), "--out", str(tmp_path / "r.html"), "--json")
    assert rc == 0, err
    text = (tmp_path / "r.html").read_text()
    for needle in ("src=", "href=", "<link", "@import", "url("):
        assert needle not in text, needle
    assert "no plan known" in text  # no --bench given, and generate ran without one


def job_from_bench(tmp_path: Path, model: str) -> Path:
    """A small job of a sim serving ``model``, started with ``generate --bench`` (the plain run, of sim-7b)."""
    from conftest import SimProcess

    sim = (
        SimProcess(
            "--load-time",
            "0",
            "--decode-ms",
            "1",
            "--decode-ms-per-running",
            "0",
            "--prefill-ms-per-1k-tokens",
            "0",
            "--max-running",
            "16",
            "--model",
            model,
            log_path=tmp_path / f"{model}.log",
        )
        .start()
        .wait_ready()
    )
    dest = tmp_path / model
    try:
        src = tmp_path / "in.jsonl"
        src.write_text("".join(json.dumps({"id": f"p{i}", "prompt": f"prompt {i}"}) + "\n" for i in range(60)))
        rc, report, err = cli(
            "generate",
            "-i",
            str(src),
            "-o",
            str(dest),
            "--url",
            sim.url,
            "--max-tokens",
            "4",
            "--bench",
            str(BENCH_RUNS[1]),
            "--json",
        )
        assert rc == 0 and report["status"] == "complete", err
    finally:
        sim.stop()
    return dest


def test_the_bench_run_generate_started_from_gives_the_report_its_plan(tmp_path):
    dest = job_from_bench(tmp_path, "sim-7b")
    rc, written, err = cli("report", str(dest), "--json")  # no --bench: the one generate was given
    assert rc == 0 and written["plan"] and written["out"] == str(dest / "report.html"), err
    rc, check, err = cli("plan", "--check", str(dest), "--bench", str(BENCH_RUNS[1]), "--json")
    assert rc == (0 if check["within_tolerance"] else 1), err
    assert check["verdict"] in (dest / "report.html").read_text()


def test_a_bench_run_of_another_model_is_no_plan_for_the_job_and_the_report_says_why(tmp_path):
    dest = job_from_bench(tmp_path, "other-model")
    rc, written, err = cli("report", str(dest), "--json")
    assert rc == 0 and not written["plan"], err
    assert any("configuration mismatch" in n and "other-model" in n for n in written["notes"])
    assert "configuration mismatch" in (dest / "report.html").read_text()
