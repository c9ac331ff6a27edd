"""`make demo` in CI: scripts/demo.py run whole, on its own folder and free ports, against the real
`transformers serve` (two servers, two configurations): bench, compare, plan, a job with a server
SIGKILLed and restarted by the fleet and the run interrupted and resumed, plan --check, down.

The script is the test's subject, not a copy of it: the assertions read what it recorded
(DEST/demo-summary.json) and look at the output and the processes themselves."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from conftest import free_port

REPO = Path(__file__).resolve().parent.parent
PROMPTS = 400  # fewer than the demo's 1,500 (CI time); cpu-a alone still keeps the job going through a ~50 s restart


def _ours(out: Path) -> list[psutil.Process]:
    """Live processes started for this demo: their command line names its folder (the model, the logs)."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            if proc.info["status"] != psutil.STATUS_ZOMBIE and any(
                str(out) in part for part in proc.info["cmdline"] or []
            ):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


@pytest.mark.engine
@pytest.mark.timeout(1500)
def test_the_demo_runs_the_main_job_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    ports = [free_port(), free_port()]
    servefleet = Path(sys.executable).parent / "servefleet"
    argv = [
        sys.executable,
        str(REPO / "scripts" / "demo.py"),
        "--out",
        str(out),
        "--ports",
        ",".join(map(str, ports)),
        "--prompts",
        str(PROMPTS),
    ]
    try:
        done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=1400)
        summary = json.loads((out / "demo-summary.json").read_text())
        assert done.returncode == 0 and summary["ok"], (
            f"{summary.get('error')}\n{done.stdout[-6000:]}\n{done.stderr[-3000:]}"
        )
    finally:
        # whatever happened: the fleet down, and nothing of ours left running
        if (out / "demo.toml").exists():
            subprocess.run(
                [str(servefleet), "down", "--fleet", str(out / "demo.toml")], capture_output=True, timeout=300
            )
        left = _ours(out)
        for proc in left:
            try:
                os.kill(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert not left, [p.info["cmdline"] for p in left]

    # capacity of the embedded default: the default mode runs one request at a time, continuous
    # batching holds --cb-num-blocks 64 x 256 tokens; the context comes from the model's config.json
    cap = summary["capacity"]
    assert cap["cpu-a"]["max_running_requests"] == 1 and cap["cpu-a"]["context_length"] == 2048
    assert cap["cpu-b"]["kv_cache_tokens"] == 64 * 256 and cap["cpu-b"]["max_running_requests"] == 64
    # bench + compare wrote their files; plan chose a configuration
    assert all(Path(p).exists() for p in summary["files"]["bench"]) and summary["compare"]["plots"]
    assert summary["plan"]["recommendation"]
    # the first run was interrupted after cpu-b's restart through the fleet, the second completed it
    first, resume = summary["first_run"], summary["resume"]
    assert (first["status"], first["exit"]) == ("interrupted", 130) and first["restarts"] >= 1
    assert resume["status"] == "complete" and resume["done_before"] >= first["committed"] > 0
    assert resume["done_before"] + resume["done"] == PROMPTS
    # exactly once, and the test reads the Parquet itself
    assert (summary["output"]["rows"], summary["output"]["duplicates"], summary["output"]["missing"]) == (
        PROMPTS,
        0,
        0,
    )
    import pyarrow as pa
    import pyarrow.parquet as pq

    # from Arrow buffers, in this thread (Arrow's pools can abort a process at exit: the suite's process here)
    ids = [
        i
        for p in (out / "job" / "shards").glob("*.parquet")
        for i in pq.ParquetFile(pa.BufferReader(p.read_bytes()))
        .read(columns=["id"], use_threads=False)
        .column("id")
        .to_pylist()
    ]
    assert sorted(ids) == [f"p{i:05d}" for i in range(PROMPTS)]
    # the job's HTML report was written
    assert Path(summary["files"]["report"]).stat().st_size > 0
    # plan --check compared the prediction with the run
    check = summary["plan_check"]
    assert isinstance(check["within_tolerance"], bool) and check["verdict"]
    # the ports are free again
    for port in ports:
        assert not [
            c
            for c in psutil.net_connections("tcp")
            if c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN
        ]


def _demo_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("servefleet_demo_script", REPO / "scripts" / "demo.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_demo_points_a_copy_of_the_example_fleet_at_its_folder_and_ports(tmp_path: Path) -> None:
    """What the CI run relies on (fast): the copy of examples/demo.toml loads, with the model, the
    state folder and both ports replaced, and everything else as in the example."""
    from servefleet.fleet import Fleet

    demo = _demo_module()
    path = demo.fleet_file(tmp_path, [40001, 40002])
    items = {i.name: i for i in Fleet.load(path).resolve()}
    example = {i.name: i for i in Fleet.load(REPO / "examples" / "demo.toml").resolve()}
    assert set(items) == set(example) == set(demo.SERVERS) and demo.VICTIM in items
    for name, port in zip(demo.SERVERS, (40001, 40002), strict=True):
        assert items[name].server.port == port and items[name].argv[4] == str(tmp_path / "tiny-llama")
        assert items[name].argv[9:] == example[name].argv[9:]  # the same engine args
    assert demo.fleet_file(demo.DEFAULT_OUT, None) == REPO / "examples" / "demo.toml"


def test_the_demo_counts_committed_rows_from_the_ledger(tmp_path: Path) -> None:
    demo = _demo_module()
    assert demo.committed_rows(tmp_path) == 0
    (tmp_path / "ledger").mkdir()
    (tmp_path / "ledger" / "part-1.json").write_text(json.dumps({"ids": ["a", "b"]}))
    (tmp_path / "ledger" / "part-2.json").write_text('{"ids": ["c"')  # being written: not counted yet
    assert demo.committed_rows(tmp_path) == 2
    ids = demo.write_prompts(tmp_path / "p.jsonl", 10)
    records = [json.loads(line) for line in (tmp_path / "p.jsonl").read_text().splitlines()]
    assert [r["id"] for r in records] == ids and len(set(ids)) == 10
    assert sum("messages" in r for r in records) == 2 and all(r["max_tokens"] == demo.OUTPUT_TOKENS for r in records)


def test_a_second_demo_starts_a_new_job(tmp_path: Path) -> None:
    """An earlier demo's destination would be resumed with nothing to send (seen: the kill waited for a
    job that was already complete): the demo clears its own job, bench and plot folders first."""
    demo = _demo_module()
    run = demo.Demo(tmp_path, tmp_path / "demo.toml", 10)
    for folder in ("job/shards", "bench", "plots"):
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "old").write_text("x")
    (tmp_path / "tiny-llama").mkdir()
    run.fresh()
    assert not (tmp_path / "job").exists() and not (tmp_path / "bench").exists() and not (tmp_path / "plots").exists()
    assert (tmp_path / "tiny-llama").exists()  # the model is rebuilt by its own step, not removed here
