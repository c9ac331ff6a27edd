"""What the GPU drivers' stages build and decide, pinned on the CPU with a runner that records instead of
running: the generate command lines (the vLLM stages and SGLang's sglang_generate.py), the down stages,
the in-stage budget checks, and sglang_generate.py end to end over a stand-in for servefleet generate."""

from __future__ import annotations

import http.server
import json
import os
import re
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[1]
GPU = ROOT / "benchmarks" / "gpu"
sys.path.insert(0, str(GPU))

import h200_multi  # noqa: E402 - after the sys.path.insert above
import h200_run2  # noqa: E402 - after the sys.path.insert above
from h200_exec import T0, Result, answers_health  # noqa: E402 - after the sys.path.insert above
from h200_generate import stage_generate  # noqa: E402 - after the sys.path.insert above
from h200_layout import PORT_NAMES, Layout, Settings  # noqa: E402 - after the sys.path.insert above
from h200_stages import Ctx, stage_vllm_bench  # noqa: E402 - after the sys.path.insert above

PY = "/opt/py/bin/python3"
SF = [PY, "-m", "servefleet.cli.main"]


class Recorder:
    """A Runner that runs nothing: every command is recorded; ``status`` says ``ready`` are ready."""

    def __init__(self, ready: tuple[str, ...] = ()) -> None:
        self.ready = ready
        self.calls: list[tuple[str, list[str], float]] = []
        self.said: list[str] = []

    def say(self, message: str) -> None:
        self.said.append(message)

    def run(self, name: str, argv: list[str], timeout: float = 600.0, quiet: bool = False) -> Result:
        self.calls.append((name, argv, timeout))
        if "status" in argv:
            doc: dict = {"servers": [{"name": n, "state": "ready"} for n in self.ready]}
        else:
            doc = {"ran": name}
        return Result(argv, 0, 0.1, json.dumps(doc), "")

    def start(self, name: str, argv: list[str], quiet: bool = False) -> SimpleNamespace:
        self.calls.append((name, argv, -1.0))
        report = {"status": "complete", "output_tokens_per_s": 10.0, "servers": [], "events": []}

        def finish(timeout: float, quiet: bool = False) -> Result:
            return Result(argv, 0, 1.0, json.dumps(report), "")

        return SimpleNamespace(proc=SimpleNamespace(poll=lambda: 0), finish=finish)


def make_ctx(tmp_path: Path, ready: tuple[str, ...] = (), rehearse: bool = False, **settings: object) -> Ctx:
    lay = Layout(
        repo=str(ROOT),
        work=str(tmp_path),
        out=str(tmp_path / "out"),
        python=PY,
        rehearse=rehearse,
        ports={n: 18000 + i for i, n in enumerate(PORT_NAMES)},
    )
    lay.results.mkdir(parents=True, exist_ok=True)
    return Ctx(lay, Settings(rehearse=rehearse, **settings), Recorder(ready))  # type: ignore[arg-type]


def _generate_tail(prompts: Path, dest: str, target: list[str]) -> list[str]:
    """What every driver's generate job runs: completions, greedy, JSONL shards of 1,000 rows."""
    head = ["generate", "--input", str(prompts), "--output", dest, *target]
    return head + "--completions --temperature 0 --format jsonl --shard-rows 1000".split()


# ---- generate command lines -------------------------------------------------------------------------
def test_the_generate_stage_runs_generate_over_the_main_fleet(tmp_path: Path) -> None:
    ctx = make_ctx(tmp_path, ready=("plain", "ngram"), generate_prompts=5)
    out = stage_generate(ctx)
    ((name, argv, _),) = [c for c in ctx.runner.calls if c[0] == "generate"]  # type: ignore[attr-defined]
    gen = tmp_path / "generate"
    dest = argv[7]
    assert re.fullmatch(re.escape(str(gen / "out-")) + r"\d+", dest)
    assert argv == [
        *SF,
        *_generate_tail(gen / "prompts.jsonl", dest, ["--fleet", str(tmp_path / "fleet-main.toml")]),
        "--json",
    ]
    assert out["status"] == "complete" and out["killed"] is None


def test_a_run2_job_targets_a_fleet_or_a_url_with_its_extra_options_and_bench(tmp_path: Path) -> None:
    ctx = make_ctx(tmp_path, output_len=8)
    bench = tmp_path / "bench.json"
    bench.write_text("{}")
    fleet = tmp_path / "fleet-main.toml"
    one = h200_run2._job(ctx, "job-a", fleet, 4, 3, ["--hang-after", "3"])
    two = h200_run2._job(ctx, "job-b", "http://127.0.0.1:9", 4, 3, [], bench=bench)
    src_a, src_b = tmp_path / "jobs" / "job-a" / "prompts.jsonl", tmp_path / "jobs" / "job-b" / "prompts.jsonl"
    assert one["argv"] == [
        *SF,
        *_generate_tail(src_a, one["dest"], ["--fleet", str(fleet)]),
        "--hang-after",
        "3",
        "--json",
    ]
    assert two["argv"] == [
        *SF,
        *_generate_tail(src_b, two["dest"], ["--url", "http://127.0.0.1:9"]),
        "--bench",
        str(bench),
        "--json",
    ]
    assert [c[1] for c in ctx.runner.calls if c[2] == -1.0] == [one["argv"], two["argv"]]  # type: ignore[attr-defined]


# ---- down stages ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("stage", "fleet", "name", "result"),
    [
        (h200_multi.stage_multi_down, "fleet-multi.toml", "multi-down", "results/multi/down.json"),
        (h200_multi.stage_tp_down, "fleet-tp.toml", "tp-down", "results/multi/tp_down.json"),
        (h200_run2.stage_down_whole, "fleet-whole.toml", "down-whole", "results/down_whole.json"),
    ],
)
def test_a_down_stage_downs_its_fleet_if_it_was_written(
    tmp_path: Path, stage, fleet: str, name: str, result: str
) -> None:  # type: ignore[no-untyped-def]
    ctx = make_ctx(tmp_path)
    (tmp_path / "results" / "multi").mkdir(parents=True)
    assert stage(ctx) == {} and json.loads((tmp_path / result).read_text()) == {}
    assert ctx.runner.calls == []  # type: ignore[attr-defined]
    (tmp_path / fleet).write_text("")
    assert stage(ctx) == {"ran": name}
    assert ctx.runner.calls == [  # type: ignore[attr-defined]
        (name, [*SF, "down", "--fleet", str(tmp_path / fleet), "--grace", "10", "--json"], 180)
    ]
    assert json.loads((tmp_path / result).read_text()) == {"ran": name}


# ---- the budget inside a stage ----------------------------------------------------------------------
def _budget_leaving(seconds: float) -> float:
    return time.monotonic() - T0 + seconds


def _left_in(text: str, pattern: str) -> int:
    m = re.fullmatch(pattern, text)
    assert m, text
    return int(m.group(1))


def test_an_ab_level_past_the_budget_is_skipped_saying_what_is_left(tmp_path: Path) -> None:
    ctx = make_ctx(tmp_path, ready=("plain",), budget_s=_budget_leaving(50.0), vllm_bench_concurrency="256,64")
    out = stage_vllm_bench(ctx)
    assert [p["concurrency"] for p in out["points"]] == [256, 64]
    for point in out["points"]:
        assert 40 <= _left_in(point["skipped"], r"budget: (\d+) s left, ~60 s needed") <= 50


def test_a_run2_ab_level_past_the_budget_is_skipped(tmp_path: Path) -> None:
    ctx = make_ctx(tmp_path, ready=("whole",), budget_s=_budget_leaving(110.0), ab_stream_concurrency="8")
    (tmp_path / "fleet-whole.toml").write_text("")
    out = h200_run2.stage_ab_stream(ctx)
    (point,) = out["points"]
    assert point["concurrency"] == 8 and 100 <= _left_in(point["skipped"], r"budget: (\d+) s left") <= 110


def test_a_scale_size_past_the_budget_is_skipped(tmp_path: Path) -> None:
    ctx = make_ctx(tmp_path, ready=("gpu0",), rehearse=True, gpus=1, budget_s=_budget_leaving(80.0))
    (tmp_path / "fleet-multi.toml").write_text("")
    (tmp_path / "results" / "multi").mkdir(parents=True)
    (tmp_path / "results" / "multi" / "bench-gpu0.json").write_text("{}")
    out = h200_multi.stage_multi_scale(ctx)
    # rehearsal: ~1 s a job + 30, and 60 kept for summary and collect: 80 left is short of 91
    assert 70 <= _left_in(out["jobs"]["1"]["skipped"], r"budget: (\d+) s left, ~31 s needed") <= 80


def test_a_capped_timeout_keeps_the_reserve_of_the_budget(tmp_path: Path) -> None:
    assert make_ctx(tmp_path).cap(500.0) == 500.0
    ctx = make_ctx(tmp_path, budget_s=_budget_leaving(200.0))
    assert 139.0 <= ctx.cap(500.0) <= 140.0 and ctx.cap(100.0) == 100.0
    assert 79.0 <= ctx.cap(500.0, reserve=120.0) <= 80.0
    assert make_ctx(tmp_path, budget_s=_budget_leaving(10.0)).cap(500.0) == 30.0


# ---- sglang_generate.py end to end ------------------------------------------------------------------
FAKE_GENERATE = textwrap.dedent("""\
    # stands in for `servefleet generate`: answers every prompt once, after the victim's group is gone
    # (or, with HOLD, when interrupted); its report is what the real one prints with --json
    import json, os, signal, sys, time
    a = sys.argv[1:]
    src, dest = a[a.index("--input") + 1], a[a.index("--output") + 1]
    open(os.environ["FAKE_ARGV"], "w").write(json.dumps(a))
    def end(status, rc):
        os.makedirs(dest, exist_ok=True)
        with open(src) as fh, open(os.path.join(dest, "part-00000.jsonl"), "w") as out:
            for line in fh:
                out.write(json.dumps({"id": json.loads(line)["id"], "text": "x"}) + "\\n")
        print(json.dumps({"status": status, "wall_s": 1.5, "output_tokens_per_s": 99.0, "done": 3,
                          "events": ["ngram: back in service at http://x"],
                          "servers": [{"name": "ngram", "restarts": 1, "state": "ready", "extra": 1}]}))
        sys.exit(rc)
    signal.signal(signal.SIGINT, lambda *_: end("interrupted", 130))
    gone = os.environ["FAKE_GONE"]
    for _ in range(2000):
        if os.path.exists(gone) and not os.environ.get("FAKE_HOLD"):
            end("complete", 0)
        time.sleep(0.01)
    sys.exit(5)
    """)


class _Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *_args: object) -> None:
        pass


def test_answers_health_is_a_200_and_nothing_else(tmp_path: Path) -> None:
    server = http.server.HTTPServer(("127.0.0.1", 0), _Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        assert answers_health(url) is True
        assert answers_health(url + "/missing") is False  # 404 on .../missing/health
    finally:
        server.shutdown()
        server.server_close()
    assert answers_health(url) is False  # refused
    # a server starting up that answers with no HTTP status line: a no, not an exception
    with socket.socket() as lsock:
        lsock.bind(("127.0.0.1", 0))
        lsock.listen(1)

        def garble() -> None:
            conn, _ = lsock.accept()
            with conn:
                conn.recv(4096)
                conn.sendall(b"HELLO\r\n\r\n")

        t = threading.Thread(target=garble)
        t.start()
        assert answers_health(f"http://127.0.0.1:{lsock.getsockname()[1]}") is False
        t.join(timeout=10)


@pytest.mark.parametrize("hold", [False, True])
def test_sglang_generate_kills_the_server_counts_the_ids_and_interrupts_at_the_deadline(
    tmp_path: Path, hold: bool
) -> None:
    fake = tmp_path / "fake_generate.py"
    fake.write_text(FAKE_GENERATE)
    gone = tmp_path / "victim-gone"
    victim = subprocess.Popen(["sleep", "120"], start_new_session=True)
    reaper = threading.Thread(target=lambda: (victim.wait(), gone.write_text("")))
    reaper.start()
    server = http.server.HTTPServer(("127.0.0.1", 0), _Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    state = tmp_path / "state"
    state.mkdir()
    (state / "ngram.json").write_text(json.dumps({"pgid": victim.pid, "port": server.server_address[1]}))
    env = {**os.environ, "FAKE_ARGV": str(tmp_path / "argv.json"), "FAKE_GONE": str(gone)}
    if hold:
        env["FAKE_HOLD"] = "1"
    sf = f"{sys.executable} {fake}"
    try:
        proc = subprocess.run(
            [
                sys.executable,
                str(GPU / "sglang_generate.py"),
                "--fleet",
                str(tmp_path / "fleet.toml"),
                "--state-dir",
                str(state),
                "--work",
                str(tmp_path / "gen"),
                "--out",
                str(tmp_path / "generate.json"),
                "--prompts",
                "3",
                "--max-tokens",
                "8",
                "--kill-after",
                "0",
                "--deadline",
                "2" if hold else "60",
                "--sf",
                sf,
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        if victim.poll() is None:
            victim.kill()
        reaper.join(timeout=10)
        server.shutdown()
    assert proc.returncode == 0, proc.stderr
    out = json.loads((tmp_path / "generate.json").read_text())
    gen = tmp_path / "gen"
    argv = [
        *sf.split(),
        *_generate_tail(gen / "prompts.jsonl", str(gen / "out"), ["--fleet", str(tmp_path / "fleet.toml")]),
        "--json",
    ]
    assert out["command"] == " ".join(argv)
    assert json.loads((tmp_path / "argv.json").read_text()) == argv[2:]
    assert out["killed"]["server"] == "ngram" and out["killed"]["pgid"] == victim.pid
    assert out["health"][0]["healthy"] is True
    assert {k: out[k] for k in ("prompts", "max_tokens", "kill", "kill_after_s", "deadline_s")} == {
        "prompts": 3,
        "max_tokens": 8,
        "kill": "ngram",
        "kill_after_s": 0.0,
        "deadline_s": 2.0 if hold else 60.0,
    }
    assert ("interrupted_at_s" in out) is hold
    assert out["status"] == ("interrupted" if hold else "complete") and out["rc"] == (130 if hold else 0)
    assert {k: out[k] for k in ("unique_ids", "duplicates", "missing", "unexpected", "exactly_once")} == {
        "unique_ids": 3,
        "duplicates": 0,
        "missing": 0,
        "unexpected": 0,
        "exactly_once": True,
    }
    assert out["restarts"] == 1 and out["back_in_service"] is True and out["done"] == 3
    assert out["servers"][0]["name"] == "ngram" and "extra" not in out["servers"][0]
    assert (
        f"generate: {out['status']} rc={out['rc']} in 1.5 s, 3 ids, 0 duplicates, 0 missing, exactly_once=True, "
        in proc.stdout
    )
    assert "  event: ngram: back in service at http://x" in proc.stdout


# ---- the hang fault ---------------------------------------------------------------------------------
def _state(pid: int) -> str:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rfind(")") + 2]


def _group(depth: int) -> tuple[subprocess.Popen, int]:
    """A process group shaped like a server's: a leader, its child (the API server) and, at depth 3,
    that one's child (vLLM's engine core; the sim has none). Returns the leader and the deepest
    process, once it runs ``sleep``."""
    inner = 'bash -c "sleep 60; true" & wait' if depth == 3 else "sleep 60 & wait"
    leader = subprocess.Popen(["bash", "-c", inner], start_new_session=True)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        table = h200_run2._proc_table()
        api = [p for p, row in table.items() if row[0] == leader.pid]
        deepest = [p for p, row in table.items() if row[0] == api[0]] if api and depth == 3 else api
        if deepest and table.get(deepest[0], (0, 0, ""))[2] == "sleep":
            return leader, deepest[0]
        time.sleep(0.05)
    raise AssertionError("the group did not start")


def _wait_state(pid: int, stopped: bool) -> bool:
    deadline = time.monotonic() + 10
    while (_state(pid) == "T") != stopped and time.monotonic() < deadline:
        time.sleep(0.05)
    return (_state(pid) == "T") == stopped


@pytest.mark.parametrize(
    ("depth", "rehearse", "found_by"),
    [
        (3, False, "child of the API server"),
        (2, True, "rehearsal: the sim's own process (it has no engine core)"),
        (2, False, "no child process"),
    ],
)
def test_the_hang_fault_stops_the_engine_core_and_resume_lets_it_go(
    tmp_path: Path, depth: int, rehearse: bool, found_by: str
) -> None:
    leader, target = _group(depth)
    try:
        ctx = make_ctx(tmp_path, rehearse=rehearse)
        stopped: list[int] = []
        pids, how = h200_run2._stop_engine_core(ctx, leader.pid, stopped)
        expected = [] if found_by == "no child process" else [target]
        assert (pids, how, stopped) == (expected, found_by, expected)
        assert _wait_state(target, stopped=bool(expected))
        h200_run2._resume(stopped)
        assert _wait_state(target, stopped=False)
    finally:
        os.killpg(leader.pid, 9)
        leader.wait()
    h200_run2._resume([target])  # gone by now: nothing to resume, no error
