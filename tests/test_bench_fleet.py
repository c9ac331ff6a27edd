"""`servefleet bench --fleet F --servers a,b`: fleet servers benchmarked by name, each run labelled
with its server and carrying the capacity the verification loop read, side by side with plots;
unknown and not-ready servers refused with a clear message before any load is sent."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servefleet.bench.result import load_run
from servefleet.fleet import Fleet
from test_fleet_lifecycle import cli, write_fleet

pytestmark = pytest.mark.timeout(240)

FAST = ["--style", "vllm", "--decode-ms", "2", "--decode-ms-per-running", "0", "--max-running", "4"]
WIDE = ["--style", "sglang", "--decode-ms", "2", "--decode-ms-per-running", "0", "--max-running", "16"]


@pytest.fixture
async def fleet_file(tmp_path: Path):
    path, _ = write_fleet(tmp_path, {"fast": FAST, "wide": WIDE, "spare": []})
    fleet = Fleet.load(path)
    try:
        verdicts = await fleet.up(["fast", "wide"])
        assert {name: v.state.value for name, v in verdicts.items()} == {"fast": "ready", "wide": "ready"}
        yield path
    finally:
        await fleet.down(grace_s=2)
        await fleet.close()


async def test_bench_fleet_servers_by_name(fleet_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "runs" / "RUN.json"
    r = cli(
        "bench",
        "--fleet",
        str(fleet_file),
        "--servers",
        "fast,wide",
        "-c",
        "1,4",
        "-n",
        "8",
        "--input-len",
        "16",
        "--output-len",
        "8",
        "--out",
        str(out),
        timeout=180,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    runs = {name: load_run(out.with_name(f"RUN-{name}.json")) for name in ("fast", "wide")}
    for name, run in runs.items():
        assert run.target.label == name and [p.concurrency for p in run.points] == [1, 4]
        assert all(p.successful == 8 and p.output_tokens == 8 * 8 for p in run.points)
        assert run.target.model == "sim-m"
    # capacity as the verification loop read it from each server's own log style
    assert runs["fast"].capacity.max_running_requests == 4 and runs["wide"].capacity.max_running_requests == 16
    assert sorted(p.name for p in out.parent.glob("RUN-compare*.png")), list(out.parent.iterdir())


async def test_bench_fleet_refuses_unknown_and_not_ready_servers(fleet_file: Path) -> None:
    r = cli("bench", "--fleet", str(fleet_file), "--servers", "fast,nosuch", "-c", "1", "-n", "1")
    assert r.returncode == 3 and "no server named nosuch" in r.stderr and "fast, wide, spare" in r.stderr, r.stderr
    r = cli("bench", "--fleet", str(fleet_file), "--servers", "spare", "-c", "1", "-n", "1", "--json")
    assert r.returncode == 3 and "not ready in the fleet: spare" in r.stderr, r.stderr
    assert not r.stdout.strip() or "points" not in json.loads(r.stdout)
