"""Real llama.cpp (llama-cpp-python's OpenAI server) launched and verified by servefleet from its own output.

The same plan as tests/test_real_vllm.py, on a GGUF written by `servefleet model tiny --gguf` (llama.cpp's
own converter rejects a locally trained tokenizer): one `servefleet up` runs a fleet with one ready
server -- capacity read from llama.cpp's log (llama-cpp-python has no /props) -- and real failures:
a missing .gguf, an invalid argument, a context whose KV cache cannot be allocated, the whole group
SIGKILLed while Python imports the server, and a port held by another server (refused by `up`). A
server started by hand on the held port is attached with `servefleet wait`: uvicorn prints
"Application startup complete." *before* its bind fails, and the other server answers 200 on
/v1/models -- neither may pass for ready. llama-cpp-python has no /health, so the probe is /v1/models.

Starting llama-cpp-python takes about a second, so this module is quick; the recorded logs
(tests/fixtures/logs/real/llamacpp_*.log) are checked by tests/test_real_logs_recorded.py, with no engine.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from real_engines import (
    LLAMACPP,
    LLAMACPP_ARGS,
    LLAMACPP_CTX,
    LLAMACPP_ENV,
    Ctx,
    assert_down_stops_everything,
    cli_json,
    launch_by_hand,
    real_fleet,
    real_test,
    recorded,
    stop_group,
)
from servefleet.engines.base import LaunchSpec
from servefleet.engines.llamacpp import LlamaCppEngine

real = real_test(900)


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory):
    with real_fleet(
        tmp_path_factory.mktemp("real-llamacpp"),
        "llamacpp",
        LLAMACPP,
        LLAMACPP_ENV,
        LLAMACPP_ARGS,
        gguf=True,
        grace_s=10,
        up_timeout_s=600,
    ) as ctx:
        yield ctx


# ---- one `up`: ready, and every real failure ------------------------------------------------------
@real
def test_up_reports_one_ready_server_and_the_failures(llama: Ctx) -> None:
    assert llama.run.returncode == 1, llama.run.stderr[-4000:]
    assert set(llama.run.report) == {sc.server for sc in LLAMACPP if sc.how != "by_hand"}
    ready = llama.run.report["ready"]
    assert ready["action"] == "launched" and ready["time_to_ready_s"] > 0
    llama.check(ready["verdict"], "ready")


@real
def test_capacity_is_read_from_llama_cpps_log(llama: Ctx) -> None:
    """llama-cpp-python has no /props: "llama_context: n_ctx = 1024", "n_ctx_seq = 1024", "n_seq_max = 1"
    and "llama_kv_cache: size = 0.50 MiB (1024 cells, ...)" from llama.cpp's own log; the name from /v1/models."""
    cap = llama.verdict("ready")["capacity"]
    assert cap["kv_cache_tokens"] == LLAMACPP_CTX
    assert cap["context_length"] == LLAMACPP_CTX
    assert cap["max_running_requests"] == 1  # one sequence at a time
    assert cap["kv_cache_gib"] == pytest.approx(
        LLAMACPP_CTX * 512 / 2**30, abs=1e-4
    )  # f16 K+V of 2 layers x 2 heads x 32
    assert cap["served_model"] == str(llama.model / "model.gguf")


@real
@pytest.mark.parametrize("server", ["missing_model", "bad_argument", "kv_too_small"])
def test_real_failure_is_diagnosed_from_llama_cpps_own_output(llama: Ctx, server: str) -> None:
    entry = llama.run.report[server]
    assert entry["action"] == "launched"
    llama.check(entry["verdict"], server)
    log = Path(entry["log_path"]).read_text(errors="replace")
    assert entry["verdict"]["evidence"]["text"] in log


@real
def test_sigkill_while_importing_is_killed(llama: Ctx) -> None:
    """The whole group SIGKILLed before the server printed anything: no line to go by, and no
    exit code (the detach wrapper died too) -- the verdict still says killed, not "still loading"."""
    assert llama.run.kills["killed_loading"]["killed"], llama.run.kills
    verdict = llama.verdict("killed_loading")
    llama.check(verdict, "killed_loading")
    assert verdict["exit_code"] is None


@real
def test_port_held_by_another_server_is_refused_before_launch(llama: Ctx) -> None:
    entry = llama.run.report["port_taken"]
    assert entry["action"] == "blocked" and entry["pgid"] is None and entry["log_path"] is None
    llama.check(entry["verdict"], "port_taken")


@real
def test_wait_classifies_uvicorns_bind_error_on_a_taken_port(llama: Ctx) -> None:
    argv = LlamaCppEngine().build_argv(
        LaunchSpec(
            model=str(llama.model / "model.gguf"),
            port=llama.holder.port,
            command=(str(llama.python), "-m", "llama_cpp.server"),
            extra_args=LLAMACPP_ARGS,
        )
    )
    log = llama.work / "by-hand.log"
    proc = launch_by_hand(argv, log, LLAMACPP_ENV)
    try:
        code, verdict, err = cli_json(
            "wait",
            "--url",
            f"http://127.0.0.1:{llama.holder.port}",
            "--log",
            str(log),
            "--pid",
            str(proc.pid),
            "--engine",
            "llamacpp",
            "--timeout",
            "300",
            timeout=400,
        )
    finally:
        stop_group(proc)
    assert code == 1, err
    llama.check(verdict, "port_in_use")
    lines = log.read_text(errors="replace").splitlines()
    complete = next(i for i, line in enumerate(lines, 1) if "Application startup complete." in line)
    assert complete < verdict["evidence"]["line_no"]  # the trap: "startup complete" came first


@real
def test_a_completion_from_the_ready_server(llama: Ctx) -> None:
    import urllib.request

    body = json.dumps({"prompt": "The server is", "max_tokens": 5, "temperature": 0}).encode()
    req = urllib.request.Request(
        f"http://127.0.0.1:{llama.run.report['ready']['port']}/v1/completions",
        data=body,
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        answer = json.loads(resp.read())
    assert answer["usage"]["completion_tokens"] >= 1
    assert answer["usage"]["total_tokens"] == answer["usage"]["prompt_tokens"] + answer["usage"]["completion_tokens"]


@real
def test_down_stops_every_process_and_frees_the_ports(llama: Ctx) -> None:
    assert_down_stops_everything(llama.run, grace_s=10)


def test_every_llamacpp_scenario_with_a_log_is_recorded() -> None:
    from real_breadth import breadth  # the failure classes of issue 16, recorded by the same script

    assert {sc.log_name for sc in (*LLAMACPP, *breadth("llamacpp")) if sc.how != "blocked"} == set(
        recorded("llamacpp")
    )
