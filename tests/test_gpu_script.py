"""The H200 run's driver (benchmarks/gpu/h200.py): its fleet files and command lines, checked with
servefleet's own loader and engine profile, its summaries, its budget, and (slow, marked ``engine``)
the whole CPU rehearsal: the same stages with servefleet's simulator printing vLLM's log."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from servefleet.fleet.core import Fleet
from servefleet.sim.cli_args import parse_config

ROOT = Path(__file__).resolve().parents[1]
GPU = ROOT / "benchmarks" / "gpu"
sys.path.insert(0, str(GPU))

import h200  # noqa: E402 - after the sys.path.insert above
from h200_failures import evidence_substring  # noqa: E402 - after the sys.path.insert above
from h200_layout import (  # noqa: E402 - after the sys.path.insert above
    NGRAM_CONFIG,
    PORT_NAMES,
    Layout,
    Settings,
    failure_cases,
    failures_toml,
    fleet_toml,
    manual_argv,
    vllm_bench_argv,
    whole_toml,
)
from h200_report import markdown, plateau  # noqa: E402 - after the sys.path.insert above
from h200_run2 import GROUPS, check_summary, engine_core_pids, start_order  # noqa: E402 - after the sys.path.insert above
from h200_stages import ab_ratio  # noqa: E402 - after the sys.path.insert above

# `vllm bench serve` options of vLLM 0.26.0 (vllm/benchmarks/serve.py and datasets/datasets.py of the wheel).
VLLM_026_BENCH_FLAGS = {
    "--backend",
    "--base-url",
    "--endpoint",
    "--model",
    "--tokenizer",
    "--dataset-name",
    "--random-input-len",
    "--random-output-len",
    "--num-prompts",
    "--max-concurrency",
    "--ignore-eos",
    "--temperature",
    "--percentile-metrics",
    "--metric-percentiles",
    "--disable-tqdm",
    "--save-result",
    "--result-dir",
    "--result-filename",
}


def layout(tmp_path: Path, rehearse: bool) -> Layout:
    return Layout(
        repo=str(ROOT),
        work=str(tmp_path),
        out=str(tmp_path / "out"),
        python="/opt/py/bin/python3",
        rehearse=rehearse,
        ports={n: 18000 + i for i, n in enumerate(PORT_NAMES)},
    )


def resolved(path: Path) -> dict:
    return {item.name: item for item in Fleet.load(path).resolve()}


def test_real_fleet_is_two_vllm_servers_sharing_gpu0(tmp_path: Path) -> None:
    lay = layout(tmp_path, rehearse=False)
    lay.main_fleet.write_text(fleet_toml(lay, Settings()))
    items = resolved(lay.main_fleet)
    assert set(items) == {"plain", "ngram"}
    for name, item in items.items():
        argv = item.argv
        assert argv[:3] == ["/opt/py/bin/python3", "-m", "vllm.entrypoints.openai.api_server"]
        assert argv[argv.index("--model") + 1] == str(lay.model)
        assert argv[argv.index("--port") + 1] == str(lay.ports[name])
        assert argv[argv.index("--gpu-memory-utilization") + 1] == "0.45"
        assert argv[argv.index("--max-model-len") + 1] == "4096"
        assert item.env["VLLM_USE_FLASHINFER_SAMPLER"] == "0"
        assert item.env["CUDA_VISIBLE_DEVICES"] == "0"
    assert "--speculative-config" not in items["plain"].argv
    spec = items["ngram"].argv[items["ngram"].argv.index("--speculative-config") + 1]
    assert spec == NGRAM_CONFIG
    assert json.loads(spec) == {
        "method": "ngram",
        "num_speculative_tokens": 4,
        "prompt_lookup_max": 4,
        "prompt_lookup_min": 2,
    }


def test_real_failure_fleet_provokes_each_failure(tmp_path: Path) -> None:
    lay = layout(tmp_path, rehearse=False)
    cases = failure_cases(lay)
    assert {c.expected for c in cases} == {"gpu_oom", "model_not_found", "port_in_use", "config_error", "killed"}
    lay.failures_fleet.write_text(failures_toml(lay, Settings(), cases))
    items = resolved(lay.failures_fleet)
    assert set(items) == {"oom", "missing", "badarg", "sigkill"}  # the port cases are not fleet launches
    util = {n: i.argv[len(i.argv) - 1 - i.argv[::-1].index("--gpu-memory-utilization") + 1] for n, i in items.items()}
    assert util == {"oom": "0.01", "missing": "0.05", "badarg": "abc", "sigkill": "0.05"}
    assert items["missing"].argv[items["missing"].argv.index("--model") + 1] == str(lay.path("no-such-model"))
    assert "--enforce-eager" in items["oom"].argv and "--fail-at-startup" not in items["oom"].argv
    by_name = {c.name: c for c in cases}
    hand = manual_argv(lay, by_name["portheld"])
    assert hand[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert hand[hand.index("--port") + 1] == str(lay.ports["portheld"])
    assert len(set(lay.ports.values())) == len(lay.ports)


def test_rehearsal_fleets_are_valid_sim_command_lines(tmp_path: Path) -> None:
    """The rehearsal keeps the vLLM engine profile but runs the sim: every argv must parse as sim options."""
    lay = layout(tmp_path, rehearse=True)
    lay.main_fleet.write_text(fleet_toml(lay, Settings(rehearse=True)))
    lay.failures_fleet.write_text(failures_toml(lay, Settings(rehearse=True), failure_cases(lay)))
    main = resolved(lay.main_fleet)
    assert main["ngram"].argv[:5] == ["/opt/py/bin/python3", "-m", "servefleet.sim", "--style", "vllm"]
    assert parse_config(main["ngram"].argv[3:]).tokens_per_step == 3
    assert parse_config(main["plain"].argv[3:]).max_running == 256
    fails = resolved(lay.failures_fleet)
    assert parse_config(fails["oom"].argv[3:]).fail_at_startup.value == "gpu_oom"
    assert parse_config(fails["missing"].argv[3:]).fail_at_startup.value == "model_not_found"
    with pytest.raises(SystemExit):  # the bad value is rejected by argparse, as vLLM's parser does
        parse_config(fails["badarg"].argv[3:])


def test_vllm_bench_serve_command_uses_026_flags(tmp_path: Path) -> None:
    lay = layout(tmp_path, rehearse=False)
    argv = vllm_bench_argv(lay, Settings(), 256, 512, tmp_path / "vb", "vllm-c256.json")
    assert argv[1:5] == ["-m", "vllm.entrypoints.cli.main", "bench", "serve"]
    flags = {a for a in argv if a.startswith("--")}
    assert flags <= VLLM_026_BENCH_FLAGS
    value = {a: argv[i + 1] for i, a in enumerate(argv[:-1]) if a.startswith("--")}
    assert value["--backend"] == "openai" and value["--base-url"] == "http://127.0.0.1:18000"
    assert (value["--max-concurrency"], value["--num-prompts"]) == ("256", "512")
    assert (value["--random-input-len"], value["--random-output-len"]) == ("256", "256")
    assert value["--tokenizer"] == str(lay.model) and value["--dataset-name"] == "random"


def _point(
    c: int, tps: float, *, client_bound: bool = False, running: float | None = None, saturated: bool | None = None
) -> dict:
    return {
        "concurrency": c,
        "output_tokens_per_s": tps,
        "client_bound": client_bound,
        "client": {"reasons": ["busy"] if client_bound else []},
        "tpot_ms": {"p50": 4.0},
        "server": {"running_mean": running, "saturated": saturated, "queued_mean": 0.0},
    }


def test_plateau_names_the_side_that_limits() -> None:
    client = plateau([_point(64, 12_000), _point(256, 12_300, client_bound=True, running=120)])
    assert client["verdict"] == "client" and client["gain_256_over_64"] == pytest.approx(1.025)
    assert plateau([_point(64, 12_000), _point(256, 12_300, running=250)])["verdict"] == "server"
    assert plateau([_point(64, 12_000), _point(256, 12_300, saturated=True, running=90)])["verdict"] == "server"
    assert plateau([_point(64, 12_000), _point(256, 12_300, running=100)])["verdict"] == "undetermined"
    assert plateau([_point(64, 12_000)]) is None


def test_ab_ratio_and_evidence_cleanup() -> None:
    assert ab_ratio({"servefleet": {"output_tokens_per_s": 900.0}, "vllm": {"output_throughput": 1000.0}}) == 0.9
    assert ab_ratio({"servefleet": {"output_tokens_per_s": 900.0}, "vllm": "skipped (rehearsal)"}) is None
    assert ab_ratio({"vllm": {"output_throughput": 0}}) is None
    line = "(EngineCore_DP0 pid=77) ERROR 11-30 04:06:38 [core.py:708] ValueError: No available memory for the cache blocks."
    assert evidence_substring(line) == "ValueError: No available memory for the cache blocks."
    assert (
        evidence_substring("(APIServer pid=5) OSError: [Errno 98] Address already in use")
        == "OSError: [Errno 98] Address already in use"
    )
    assert evidence_substring(None) is None


def test_markdown_summary_has_each_table() -> None:
    text = markdown(
        {
            "rehearsal": False,
            "timings": [{"stage": "up", "status": "ok", "seconds": 180.0}],
            "up": {
                "plain": {
                    "state": "ready",
                    "time_to_ready_s": 98.1,
                    "kv_cache_tokens": 1_390_112,
                    "log_first_to_ready_s": 80,
                }
            },
            "sweep": {"plain": {"1": {"output_tok_s": 392.0, "tpot_p50_ms": 2.5}}},
            "vllm_bench": [
                {
                    "concurrency": 256,
                    "requests": 512,
                    "servefleet_tok_s": 12000.0,
                    "vllm_tok_s": 12500.0,
                    "ratio": 0.96,
                }
            ],
            "failures": {
                "oom": {
                    "expected": "gpu_oom",
                    "got": "gpu_oom",
                    "match": True,
                    "diagnose": "gpu_oom",
                    "evidence": "a|b",
                }
            },
            "plan": {"8": [{"name": "plain", "best_concurrency": 256, "makespan_s": 7200.0, "gpu_hours": 16.0}]},
        }
    )
    for needle in (
        "| up | ok | 180.0 |",
        "| plain | ready | 98.1 | 1390112 | 80 |",
        "| 1 | 392.0 | 2.50 |",
        "| 256 | 512 | 12000.0 | 12500.0 | 0.96 |",
        "gpu_oom ✓",
        "a\\|b",
        "Plan on 8 GPU(s): plain at concurrency 256, makespan 2.0 h",
    ):
        assert needle in text


def test_budget_skips_stages_but_still_collects(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Past the budget only down and collect run; what comes back says which stages were skipped."""
    out = tmp_path / "out"
    rc = h200.main(["--rehearse", "all", "--work", str(tmp_path / "w"), "--out", str(out), "--budget", "0.001"])
    assert rc == 0
    assert {"h200-results.tar.gz", "summary.json", "summary.md", "timings.json", "driver.log"} <= {
        p.name for p in out.iterdir()
    }
    timings = {t["stage"]: t["status"] for t in json.loads((out / "timings.json").read_text())}
    assert timings["setup"] == timings["bench"] == timings["failures"] == "skipped (budget)"
    assert timings["down"] == "ok" and timings["collect"] == "ok"
    assert "SKIPPED (budget" in capsys.readouterr().out
    layout_file = json.loads((tmp_path / "w" / "layout.json").read_text())
    assert layout_file["rehearse"] is True and len(set(layout_file["ports"].values())) == len(PORT_NAMES)


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


@pytest.mark.engine
@pytest.mark.timeout(420)
def test_cpu_rehearsal_runs_every_stage(tmp_path: Path) -> None:
    """The whole run on the CPU (the sim in vLLM style): up, bench, plan, the five failures
    diagnosed through up/wait/diagnose, the servefleet half of the A/B, a generate job with one
    server SIGKILLed midway, down, and what comes back."""
    work, out = tmp_path / "w", tmp_path / "out"
    env = {**os.environ, "PYTHON": sys.executable}
    env.pop("OUT", None)
    proc = subprocess.run(
        [
            "bash",
            str(GPU / "run_h200.sh"),
            "--rehearse",
            *h200.ORDER[:-2],
            "generate",
            "down",
            "collect",
            "--work",
            str(work),
            "--out",
            str(out),
            "--concurrency",
            "1,2",
            "--point-seconds",
            "0.3",
            "--input-len",
            "16",
            "--output-len",
            "8",
            "--vllm-bench-concurrency",
            "2",
            "--generate-prompts",
            "6000",
            "--generate-max-tokens",
            "32",
            "--generate-kill-after",
            "3",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=400,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert {n: s["state"] for n, s in summary["up"].items()} == {"plain": "ready", "ngram": "ready"}
    assert summary["up"]["plain"]["kv_cache_tokens"] == summary["up"]["ngram"]["kv_cache_tokens"] == 262144
    assert {n: f["got"] for n, f in summary["failures"].items()} == {
        "oom": "gpu_oom",
        "missing": "model_not_found",
        "badarg": "config_error",
        "sigkill": "killed",
        "portheld": "port_in_use",
        "portup": "port_in_use",
    }
    assert all(f["match"] for f in summary["failures"].values())
    assert {n: sorted(levels) for n, levels in summary["sweep"].items()} == {"plain": ["1", "2"], "ngram": ["1", "2"]}
    assert summary["sweep"]["ngram"]["2"]["output_tok_s"] > summary["sweep"]["plain"]["2"]["output_tok_s"]
    assert set(summary["plan"]) == {"1", "8", "64"}
    ab = summary["vllm_bench"][0]
    assert ab["servefleet_tok_s"] > 0 and ab["ratio"] is None and "rehearsal" in ab["vllm_tok_s"]
    gen = summary["generate"]
    assert gen["status"] == "complete" and gen["exactly_once"] and gen["duplicates"] == 0
    assert gen["killed"]["server"] == "ngram" and gen["restarts"] >= 1
    with tarfile.open(out / "h200-results.tar.gz") as tar:
        names = set(tar.getnames())
    assert "results/fixtures/sim_rehearsal_gpu_util_too_low.log" in names
    assert "results/bench/run-ngram.json" in names and "results/commands.jsonl" in names
    expected = json.loads((work / "results" / "fixtures" / "EXPECTED.json").read_text())
    assert expected["sim_rehearsal_port_in_use.log"]["category"] == "port_in_use"
    assert expected["sim_rehearsal_ready_plain.log"]["capacity"]["max_running_requests"] == 256
    ports = json.loads((work / "layout.json").read_text())["ports"]
    assert all(_port_free(p) for p in ports.values()), "a server outlived `down`"


# ---- run 2 (issue 17 step 2: h200_run2.py) ---------------------------------------------------------
def test_whole_fleet_gives_one_server_the_gpu(tmp_path: Path) -> None:
    lay = layout(tmp_path, rehearse=False)
    lay.whole_fleet.write_text(whole_toml(lay, Settings()))
    items = resolved(lay.whole_fleet)
    assert set(items) == {"whole"}
    argv = items["whole"].argv
    value = {a: argv[i + 1] for i, a in enumerate(argv[:-1]) if a.startswith("--")}
    assert (value["--gpu-memory-utilization"], value["--max-num-seqs"]) == ("0.9", "1024")
    assert value["--port"] == str(lay.ports["whole"]) and "--speculative-config" not in value


def test_shared_fleet_names_gpu0_in_the_rehearsal_too(tmp_path: Path) -> None:
    """servefleet orders servers that share a GPU only when the fleet file says so: the rehearsal's
    fleet must say it as well, or the rehearsal would not exercise the ordering."""
    lay = layout(tmp_path, rehearse=True)
    lay.main_fleet.write_text(fleet_toml(lay, Settings(rehearse=True)))
    assert "gpus = [0]" in lay.main_fleet.read_text()


def test_engine_core_pids_prefers_vllm_title_then_the_api_servers_child() -> None:
    pg = 100  # servefleet's sh wrapper leads the group; the API server is its child
    base = {
        100: (1, pg, "sh", "sh -c ..."),
        101: (100, pg, "python3", "python3 -m vllm.entrypoints.openai.api_server"),
        102: (101, pg, "python3", "python3 -c from multiprocessing.resource_tracker import main;main(9)"),
        999: (1, 7, "python3", "VLLM::EngineCore_DP0"),
    }  # another server's engine
    titled = {**base, 103: (101, pg, "VLLM::EngineCor", "VLLM::EngineCore_DP0")}
    assert engine_core_pids(pg, titled) == ([103], "process title EngineCore")
    untitled = {**base, 104: (101, pg, "python3", "python3 -c from multiprocessing.spawn import spawn_main")}
    assert engine_core_pids(pg, untitled) == ([104], "child of the API server")
    assert engine_core_pids(pg, base)[0] == []  # only the resource tracker: no engine core to stop


def _vllm_log(path: Path, lines: list[tuple[str, str]]) -> Path:
    path.write_text("".join(f"(APIServer pid=1) INFO 12-01 {t} [x.py:1] {m}\n" for t, m in lines))
    return path


def test_start_order_compares_the_second_start_with_the_first_settling(tmp_path: Path) -> None:
    first = _vllm_log(
        tmp_path / "plain.log",
        [
            ("12:15:09", "vLLM API server version 0.26.0"),
            ("12:16:20", "GPU KV cache size: 672,352 tokens"),
            ("12:16:25", "Graph capturing finished in 4 secs, took 0.46 GiB"),
        ],
    )
    late = _vllm_log(tmp_path / "ngram.log", [("12:16:59", "vLLM API server version 0.26.0")])
    early = _vllm_log(tmp_path / "ngram2.log", [("12:15:10", "vLLM API server version 0.26.0")])
    assert start_order(first, late) == {
        "first_log_start": "12-01 12:15:09",
        "first_settled": "12-01 12:16:25",
        "second_log_start": "12-01 12:16:59",
        "ordered": True,
    }
    assert start_order(first, early)["ordered"] is False
    assert start_order(first, tmp_path / "missing.log")["ordered"] is None


def test_check_summary_reads_plan_check_json() -> None:
    doc = {
        "configuration": "whole",
        "concurrency": 1024,
        "within_tolerance": True,
        "verdict": "within 10%: ...",
        "metrics": {
            "makespan_s": {"predicted": 196.4, "measured": 204.6, "error_pct": -4.0},
            "output_tps_per_server": {"predicted": 26070.7, "measured": 25027.5, "error_pct": 4.2},
        },
    }
    got = check_summary(doc)
    assert got["makespan_error_pct"] == -4.0 and got["within_tolerance"] is True and got["tps_measured"] == 25027.5
    assert check_summary(None) == {} and check_summary({"error": "x"}) == {}


def test_rank_summary_compares_the_plans_order_with_the_jobs() -> None:
    from h200_rank import plan_order, rank_summary

    plan = {"plans": {"1": [{"name": "ngram", "makespan_s": 70.0}, {"name": "plain", "makespan_s": 60.0}]}}
    assert plan_order(plan) == ["plain", "ngram"] and plan_order(plan, "8") == [] and plan_order(None) == []
    agree = rank_summary(plan, {"plain": {"makespan_measured_s": 61.0}, "ngram": {"makespan_measured_s": 75.0}})
    assert agree["measured_order"] == ["plain", "ngram"] and agree["first_agrees"] is True
    disagree = rank_summary(plan, {"plain": {"makespan_measured_s": 80.0}, "ngram": {"makespan_measured_s": 75.0}})
    assert disagree["measured_order"] == ["ngram", "plain"] and disagree["first_agrees"] is False
    one = rank_summary(plan, {"plain": {"makespan_measured_s": 61.0}, "ngram": {}})  # a job that did not finish
    assert one["measured_order"] == ["plain"] and one["first_agrees"] is None


def test_ab_ratios_compare_like_for_like_spans() -> None:
    from h200_stages import ab_point_ratios

    point = {
        "servefleet": {"output_tokens_per_s": 20_000.0, "output_tokens_per_s_span": 19_000.0},
        "vllm": {"output_throughput": 19_400.0},
    }
    assert ab_point_ratios(point) == {
        "ratio_span": round(19_000 / 19_400, 4),
        "ratio_steady": round(20_000 / 19_400, 4),
    }
    assert ab_point_ratios({"servefleet": point["servefleet"], "vllm": "skipped (rehearsal)"}) == {
        "ratio_span": None,
        "ratio_steady": None,
    }


def test_run2_groups_are_stages_of_the_driver(tmp_path: Path) -> None:
    assert h200.expand(["run2a"])[:2] == ["setup", "up-whole"] and h200.expand(["run2b"])[-1] == "collect"
    assert "down" not in h200.expand(["run2c"]) and h200.expand(["run2d"])[-2:] == [
        "down",
        "collect",
    ]  # servers kept up between
    for group in GROUPS.values():
        assert set(group) <= set(h200.STAGES) | {"collect"}
    rc = h200.main(
        ["--rehearse", "run2b", "--work", str(tmp_path / "w"), "--out", str(tmp_path / "out"), "--budget", "0.001"]
    )
    timings = {t["stage"]: t["status"] for t in json.loads((tmp_path / "out" / "timings.json").read_text())}
    assert rc == 0 and timings["faults"] == "skipped (budget)" and timings["down"] == "ok"


@pytest.mark.engine
@pytest.mark.timeout(420)
def test_cpu_rehearsal_of_run2(tmp_path: Path) -> None:
    """Run 2 on the CPU: the whole-GPU server's non-streaming bench, plan, generate and plan --check;
    then one `up` of both shared servers (ordered by servefleet), and one job in which ngram is
    SIGKILLed and, once it is back, plain stopped (the sim has no engine core: its whole process)."""
    work, out = tmp_path / "w", tmp_path / "out"
    env = {**os.environ, "PYTHON": sys.executable}
    env.pop("OUT", None)
    common = ["--work", str(work), "--out", str(out), "--input-len", "16", "--output-len", "16"]
    a = subprocess.run(
        [
            "bash",
            str(GPU / "run_h200.sh"),
            "--rehearse",
            "run2a",
            *common,
            "--nostream-concurrency",
            "8,32",
            "--nostream-point-seconds",
            "1",
            "--whole-prompts",
            "800",
            "--ab-stream-concurrency",
            "8",
            "--ab-stream-waves",
            "2",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=200,
    )
    assert a.returncode == 0, a.stdout[-3000:] + a.stderr[-3000:]
    res = work / "results"
    gen = json.loads((res / "generate_whole.json").read_text())
    assert gen["status"] == "complete" and gen["exactly_once"] and gen["fraction_of_bench_best"] > 0
    assert json.loads((res / "plan_check.json").read_text())["summary"]["makespan_error_pct"] is not None
    b = subprocess.run(
        [
            "bash",
            str(GPU / "run_h200.sh"),
            "--rehearse",
            "up-shared",
            "faults",
            "down",
            "collect",
            *common,
            "--kill-prompts",
            "6000",
            "--kill-after",
            "3",
            "--hang-after",
            "3",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=200,
    )
    assert b.returncode == 0, b.stdout[-3000:] + b.stderr[-3000:]
    assert json.loads((res / "up_shared.json").read_text())["start_order"]["ordered"] is True
    faults = json.loads((res / "faults.json").read_text())
    assert faults["status"] == "complete" and faults["exactly_once"] and faults["duplicates"] == 0
    assert faults["ngram"]["back_in_service"] and faults["fault"]["stop"]["signal"] == "SIGSTOP"
    ports = json.loads((work / "layout.json").read_text())["ports"]
    assert all(_port_free(p) for p in ports.values()), "a server outlived `down`"


# ---- several GPUs (issue 18: h200_multi.py) --------------------------------------------------------
def test_fleet_sizes_double_up_to_the_gpu_count() -> None:
    from h200_multi import fleet_sizes

    assert fleet_sizes(8) == [1, 2, 4, 8] and fleet_sizes(4) == [1, 2, 4]
    assert fleet_sizes(3) == [1, 2, 3] and fleet_sizes(1) == [1] and fleet_sizes(0) == []


def test_visible_gpus_prefers_cuda_visible_devices() -> None:
    from h200_multi import visible_gpus

    smi = [f"GPU {i}: NVIDIA H200 (UUID: GPU-{i})" for i in range(8)]
    assert visible_gpus({}, smi) == 8
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "0,1,2,3"}, smi) == 4
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": ""}, smi[:2]) == 2
    assert visible_gpus({}, ["No devices were found"]) == 0


def test_throughput_dip_reads_the_jobs_timeline() -> None:
    from h200_multi import throughput_dip

    tokens = [1000] * 10 + [500, 600, 800, 950, 1000, 1000, 300]  # fault at 10 s; the last bucket is the tail
    dip = throughput_dip({"bucket_s": 1.0, "job": {"output_tokens": tokens}}, fault_at_s=10.0, window_s=8.0)
    assert dip["rate_before"] == 1000.0 and dip["min_after"] == 500.0 and dip["dip_fraction"] == 0.5
    assert dip["recovered_at_s"] == 13.0 and dip["recovery_s"] == 3.0  # 950 >= 0.9 x 1000
    never = throughput_dip({"bucket_s": 2.0, "job": {"output_tokens": [2000] * 5 + [400] * 4}}, fault_at_s=10.0)
    assert never["rate_before"] == 1000.0 and never["recovered_at_s"] is None and never["min_after"] == 200.0
    assert throughput_dip({"bucket_s": 1.0, "job": {"output_tokens": [5, 5]}}, fault_at_s=0.0)["dip_fraction"] is None


def test_plan_rank_orders_by_makespan_and_cpu_share() -> None:
    from h200_multi import cpu_share, plan_rank

    doc = {"plans": {"2": [{"name": "tp2", "makespan_s": 90.0}, {"name": "gpu0", "makespan_s": 60.0}]}}
    assert plan_rank(doc, "2") == ["gpu0", "tp2"] and plan_rank(doc, "8") == [] and plan_rank(None, "2") == []
    assert cpu_share(1.5, 0.5, 4.0) == 0.5 and cpu_share(1.0, 0.0, 0.0) is None


def test_multi_fleets_put_one_server_on_each_gpu(tmp_path: Path) -> None:
    from h200_multi import multi_toml, server_names, tp_toml
    from h200_stages import Ctx

    lay = layout(tmp_path, rehearse=False)
    ctx = Ctx(lay, Settings(), None)  # type: ignore[arg-type]  # fleet files need no runner
    path = tmp_path / "multi.toml"
    path.write_text(multi_toml(ctx, server_names(4)))
    items = resolved(path)
    assert [items[n].env["CUDA_VISIBLE_DEVICES"] for n in server_names(4)] == ["0", "1", "2", "3"]
    assert len({items[n].argv[items[n].argv.index("--port") + 1] for n in items}) == 4
    path.write_text(tp_toml(ctx))
    tp = resolved(path)["tp2"]
    assert tp.env["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert tp.argv[tp.argv.index("--tensor-parallel-size") + 1] == "2"


def test_multi_group_checkpoints_past_the_budget(tmp_path: Path) -> None:
    rc = h200.main(
        ["--rehearse", "multi", "--work", str(tmp_path / "w"), "--out", str(tmp_path / "out"), "--budget", "0.001"]
    )
    timings = {t["stage"]: t["status"] for t in json.loads((tmp_path / "out" / "timings.json").read_text())}
    assert rc == 0 and timings["multi-scale"] == "skipped (budget)" and timings["multi-down"] == "ok"
    assert timings["multi-summary"] == "ok" and (tmp_path / "out" / "multi_summary.json").exists()


@pytest.mark.engine
@pytest.mark.timeout(240)
def test_cpu_rehearsal_of_multi(tmp_path: Path) -> None:
    """Issue 18 on the CPU: 3 sims labelled gpus [0], [1], [2] up in parallel, bench and plan of one,
    the same workload over 1, 2 and 3 of them with plan --check, one job with gpu2 SIGKILLed (restarted
    with its CUDA_VISIBLE_DEVICES, every prompt once), then a TP=2 server against two replicas."""
    work, out = tmp_path / "w", tmp_path / "out"
    env = {**os.environ, "PYTHON": sys.executable}
    env.pop("OUT", None)
    proc = subprocess.run(
        [
            "bash",
            str(GPU / "run_h200.sh"),
            "--rehearse",
            "multi",
            "multi-tp",
            "--work",
            str(work),
            "--out",
            str(out),
            "--gpus",
            "3",
            "--input-len",
            "16",
            "--output-len",
            "16",
            "--multi-concurrency",
            "8,32",
            "--multi-point-seconds",
            "1",
            "--multi-prompts-per-gpu",
            "400",
            "--multi-kill-after",
            "3",
            "--multi-fault-prompts",
            "8000",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=220,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((out / "multi_summary.json").read_text())
    assert summary["gpus"] == 3 and set(summary["time_to_ready_s"]) == {"gpu0", "gpu1", "gpu2"}
    assert summary["fleet_ready_s"] == max(summary["time_to_ready_s"].values())
    assert sorted(summary["scale"]) == ["1", "2", "3"]
    for job in summary["scale"].values():
        assert job["exactly_once"] and job["makespan_error_pct"] is not None and job["coordinator_cores"] > 0
    assert summary["speedup"]["3"] > summary["speedup"]["2"] > 1.0
    fault = summary["fault"]
    assert fault["status"] == "complete" and fault["exactly_once"] and fault["duplicates"] == 0
    assert fault["restarts"] >= 1 and fault["back_in_service"]
    assert fault["restarted_on"]["cuda_visible_devices"] == "2"
    assert fault["rate_before"] and fault["dip_fraction"] is not None
    tp = summary["tp"]
    assert set(tp["makespan_s"]) == {"gpu0", "tp2"} and tp["plan_ranks_as_jobs"] is not None
    ports = json.loads((work / "layout.json").read_text())["ports"]
    assert all(_port_free(p) for p in ports.values()), "a server outlived `down`"


def test_multi_scale_keeps_sizes_an_earlier_command_measured(tmp_path: Path) -> None:
    """multi-b resumes multi-a: complete sizes are kept as they are, a size that failed is tried again
    (here: no server is up, so it is skipped, saying so)."""
    from h200_exec import Runner
    from h200_multi import stage_multi_scale
    from h200_stages import Ctx

    lay = layout(tmp_path, rehearse=True)
    (lay.results / "multi").mkdir(parents=True)
    (lay.results / "multi" / "bench-gpu0.json").write_text("{}")
    done = {"status": "complete", "exactly_once": True, "output_tokens_per_s": 1000.0}
    (lay.results / "multi" / "scale.json").write_text(
        json.dumps(
            {
                "jobs": {
                    "1": done,
                    "2": {**done, "output_tokens_per_s": 1900.0},
                    "4": {"status": "incomplete", "exactly_once": False},
                }
            }
        )
    )
    ctx = Ctx(lay, Settings(rehearse=True, gpus=4), Runner(lay.results, dict(os.environ), tmp_path))
    out = stage_multi_scale(ctx)
    assert out["jobs"]["1"] == done and out["speedup"] == {"1": 1.0, "2": 1.9}
    assert "not all of" in out["jobs"]["4"]["skipped"]
