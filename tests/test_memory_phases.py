"""Memory failures name the start-up phase they happened in (issue 25.6): at load, while profiling
memory or allocating the KV cache, while warming up (CUDA-graph capture, sampler warm-up, dummy
runs), at SGLang's own warm-up request, at the first request. Read from the engine's traceback
frames (engines/vllm.py, sglang.py: MEMORY_PHASES), else from the last progress label. The
hand-assembled fixtures carry theirs in EXPECTED.json (test_verify_fixtures); here the recorded
GPU logs (H200, H100), the sim's transcripts and a live `up`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import free_port
from servefleet.catalog import Category, State
from servefleet.engines.base import AT_LOAD, CUDA_GRAPHS, DUMMY_RUN, FIRST_REQUEST, KV_CACHE, WARMUP_REQUEST
from servefleet.engines.registry import get_engine
from servefleet.sim.config import SimConfig
from servefleet.sim.script import transcript
from servefleet.verify.diagnose import diagnose_text

REAL = Path(__file__).parent / "fixtures" / "logs" / "real"


@pytest.mark.parametrize(
    ("log", "phase"),
    [
        ("vllm026_h200_gpu_util_too_low.log", KV_CACHE),  # check_enough_kv_cache_memory, after profiling
        ("sglang0517_h200_mem_fraction_too_low.log", KV_CACHE),
        ("sglang0517_h200_mem_fraction_shared_gpu.log", KV_CACHE),
        # vLLM 0.26's V2 model runner on an H100, a foreign process taking the card's free memory at a log line
        # (benchmarks/gpu/issue25/oom_phases.sh); each phase as its traceback shows it
        ("vllm026_h100_oom_load.log", AT_LOAD),  # init_device's memory snapshot, before the weights
        ("vllm026_h100_oom_profile.log", AT_LOAD),  # load_model goes on after "Model loading took"
        ("vllm026_h100_oom_kv.log", KV_CACHE),  # _check_enough_kv_cache_memory: "No available memory for the cache"
        ("vllm026_h100_oom_graphs.log", CUDA_GRAPHS),  # capture_model -> torch.cuda.graph's capture_end
        ("vllm026_h100_oom_warmup.log", DUMMY_RUN),  # warmup_kernels: prefill and decode on dummy requests
    ],
)
def test_the_recorded_gpu_memory_failures_name_their_phase(log: str, phase: str) -> None:
    verdict = diagnose_text((REAL / log).read_text(errors="replace"))
    assert verdict.category is Category.GPU_OOM and verdict.phase == phase, (verdict.phase, verdict.progress)


@pytest.mark.parametrize(
    ("style", "variant", "phase"),
    [
        ("sglang", 0, KV_CACHE),
        ("sglang", 1, AT_LOAD),
        ("vllm", 0, KV_CACHE),
        ("vllm", 1, AT_LOAD),
        ("vllm", 2, KV_CACHE),
    ],
)
def test_the_sims_start_up_memory_failures_name_their_phase(style: str, variant: int, phase: str) -> None:
    text = transcript(
        SimConfig(style=style, tp=2, load_time=0.5, fail_at_startup=Category.GPU_OOM, fail_variant=variant)
    )
    for engine in (style, "sim"):
        verdict = diagnose_text(text, get_engine(engine))
        assert verdict.category is Category.GPU_OOM and verdict.phase == phase, (engine, verdict.phase)


@pytest.mark.parametrize(("style", "phase"), [("sglang", WARMUP_REQUEST), ("vllm", FIRST_REQUEST)])
def test_a_memory_failure_after_start_up_is_at_the_warm_up_or_first_request(style: str, phase: str) -> None:
    """SGLang sends itself a warm-up request after uvicorn is up (before its ready line); vLLM's
    first request is the smoke request after "Application startup complete."."""
    text = transcript(SimConfig(style=style, tp=2, load_time=0.5, fail_after_ready=Category.GPU_OOM))
    verdict = diagnose_text(text, get_engine(style))
    assert verdict.category is Category.GPU_OOM and verdict.phase == phase, verdict


def test_vllms_advice_about_graph_capture_memory_is_no_failure() -> None:
    lines = [
        "INFO 03-27 10:29:03 [model_runner.py:1442] Capturing cudagraphs for decoding. This may lead to unexpected consequences if the "
        "model is not static. To run the model in eager mode, set 'enforce_eager=True' or use '--enforce-eager' in the CLI. If "
        "out-of-memory error occurs during cudagraph capture, consider decreasing `gpu_memory_utilization` or switching to eager mode. "
        "You can also reduce the `max_num_seqs` as needed to decrease memory usage.",
        "INFO 08-19 07:51:12 model_runner.py:1028] CUDA graphs can take additional 1~3 GiB memory per GPU. If you are running out of "
        "memory, consider decreasing `gpu_memory_utilization` or enforcing eager mode. You can also reduce the `max_num_seqs` as needed "
        "to decrease memory usage.",
    ]
    verdict = diagnose_text("\n".join(lines), get_engine("vllm"))
    assert verdict.state is State.LOADING and verdict.progress == "capturing CUDA graphs", verdict


def test_up_says_an_sglang_warm_up_oom_happened_at_the_warm_up_request(tmp_path: Path) -> None:
    """SGLang kills itself once its own warm-up request failed: the verdict is the warm-up's
    memory failure, with its phase, not `killed`."""
    path = tmp_path / "fleet.toml"
    path.write_text(
        '[fleet]\nname = "ph"\ntimeout = 60\nstall = 30\n[defaults]\nengine = "sim"\nmodel = "sim-m"\n'
        f'[[servers]]\nname = "sg"\nport = {free_port()}\n'
        'args = ["--style", "sglang", "--load-time", "0.3", "--fail-after-ready", "gpu_oom"]\n'
    )
    cli = [sys.executable, "-m", "servefleet.cli.main"]
    try:
        run = subprocess.run(
            [*cli, "up", str(path), "--json"], capture_output=True, text=True, cwd=tmp_path, timeout=90
        )
    finally:
        subprocess.run([*cli, "down", str(path)], capture_output=True, cwd=tmp_path, timeout=60)
    (server,) = json.loads(run.stdout)["servers"]
    verdict = server["verdict"]
    assert (verdict["state"], verdict["category"], verdict["phase"]) == ("failed", "gpu_oom", WARMUP_REQUEST), verdict
