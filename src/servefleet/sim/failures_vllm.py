"""vLLM's real failure texts, per category (``vllm serve``, V1 engine, 0.10-0.11).

An engine-core failure is logged by the EngineCore process (``ERROR ... [core.py:708] EngineCore
failed to start.`` with the traceback, each line under the logger header), printed again by
multiprocessing (``Process EngineCore_DP0:`` ...), and the API server then raises the wrapper
``RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}``.
Argument and model-config errors are raised in the API server before any engine starts.
"""

from __future__ import annotations

from collections.abc import Callable

from servefleet.catalog import Category
from servefleet.sim.config import SimConfig
from servefleet.sim.failures import ARCH, CUDA_TAIL, SIGKILL_SELF, Failure, Frame, torch_oom, traceback_text
from servefleet.sim.logline import Line, uv
from servefleet.sim.styles import API, ENGINE

__all__ = ["STARTUP", "after_ready", "first_request"]

PY = "/usr/local/lib/python3.12/dist-packages"
VL = f"{PY}/vllm"
TORCH = f"{PY}/torch"

_CLI: list[Frame] = [
    ("/usr/local/bin/vllm", 10, "<module>", "sys.exit(main())"),
    (f"{VL}/entrypoints/cli/main.py", 54, "main", "args.dispatch_function(args)"),
    (f"{VL}/entrypoints/cli/serve.py", 57, "cmd", "uvloop.run(run_server(args))"),
    (f"{PY}/uvloop/__init__.py", 109, "run", "return __asyncio.run("),
    ("/usr/lib/python3.12/asyncio/runners.py", 195, "run", "return runner.run(main)"),
    ("/usr/lib/python3.12/asyncio/runners.py", 118, "run", "return self._loop.run_until_complete(task)"),
    ("uvloop/loop.pyx", 1518, "uvloop.loop.Loop.run_until_complete", None),
    (f"{PY}/uvloop/__init__.py", 61, "wrapper", "return await main"),
]
_WORKER: list[Frame] = _CLI + [
    (
        f"{VL}/entrypoints/openai/api_server.py",
        1884,
        "run_server",
        "await run_server_worker(listen_address, sock, args, **uvicorn_kwargs)",
    ),
    (f"{VL}/entrypoints/openai/api_server.py", 1902, "run_server_worker", "async with build_async_engine_client("),
    ("/usr/lib/python3.12/contextlib.py", 210, "__aenter__", "return await anext(self.gen)"),
    (
        f"{VL}/entrypoints/openai/api_server.py",
        180,
        "build_async_engine_client",
        "async with build_async_engine_client_from_engine_args(",
    ),
    ("/usr/lib/python3.12/contextlib.py", 210, "__aenter__", "return await anext(self.gen)"),
]
_CONFIG: list[Frame] = _WORKER + [
    (
        f"{VL}/entrypoints/openai/api_server.py",
        206,
        "build_async_engine_client_from_engine_args",
        "vllm_config = engine_args.create_engine_config(usage_context=usage_context)",
    ),
    (f"{VL}/engine/arg_utils.py", 1142, "create_engine_config", "model_config = self.create_model_config()"),
    (f"{VL}/engine/arg_utils.py", 994, "create_model_config", "return ModelConfig("),
    (
        f"{PY}/pydantic/_internal/_dataclasses.py",
        123,
        "__init__",
        "s.__pydantic_validator__.validate_python(ArgsKwargs(args, kwargs), self_instance=s)",
    ),
]
_STARTUP_WAIT: list[Frame] = _WORKER + [
    (
        f"{VL}/entrypoints/openai/api_server.py",
        225,
        "build_async_engine_client_from_engine_args",
        "async_llm = AsyncLLM.from_vllm_config(",
    ),
    (f"{VL}/v1/engine/async_llm.py", 1572, "from_vllm_config", "return cls("),
    (f"{VL}/v1/engine/async_llm.py", 207, "__init__", "self.engine_core = EngineCoreClient.make_async_mp_client("),
    (f"{VL}/v1/engine/core_client.py", 102, "make_async_mp_client", "return AsyncMPClient(*client_args)"),
    (f"{VL}/v1/engine/core_client.py", 767, "__init__", "super().__init__("),
    (f"{VL}/v1/engine/core_client.py", 446, "__init__", "with launch_core_engines(vllm_config, executor_class,"),
    ("/usr/lib/python3.12/contextlib.py", 144, "__exit__", "next(self.gen)"),
    (f"{VL}/v1/engine/utils.py", 729, "launch_core_engines", "wait_for_engine_startup("),
    (f"{VL}/v1/engine/utils.py", 782, "wait_for_engine_startup", "raise RuntimeError("),
]
_CORE: list[Frame] = [
    (f"{VL}/v1/engine/core.py", 699, "run_engine_core", "engine_core = EngineCoreProc(*args, **kwargs)"),
    (f"{VL}/v1/engine/core.py", 498, "__init__", "super().__init__(vllm_config, executor_class, log_stats,"),
]
_EXECUTOR: list[Frame] = [
    (f"{VL}/v1/engine/core.py", 83, "__init__", "self.model_executor = executor_class(vllm_config)"),
    (f"{VL}/executor/executor_base.py", 54, "__init__", "self._init_executor()"),
]


def _rpc(method: str) -> list[Frame]:
    return [
        (
            f"{VL}/executor/uniproc_executor.py",
            54 if method == "init_device" else 55,
            "_init_executor",
            f'self.collective_rpc("{method}")',
        ),
        (
            f"{VL}/executor/uniproc_executor.py",
            83,
            "collective_rpc",
            "return [run_method(self.driver_worker, method, args, kwargs)]",
        ),
        (f"{VL}/utils/__init__.py", 3122, "run_method", "return func(*args, **kwargs)"),
    ]


def _engine(frames: list[Frame], final: str, at: float, pre: tuple[Line, ...] = ()) -> Failure:
    """EngineCore failed to start: logged, re-printed by multiprocessing, then the API server's wrapper."""
    core = _CORE + frames
    logged = Line(
        traceback_text(core, final, head="EngineCore failed to start.\nTraceback (most recent call last):"),
        ENGINE,
        level="ERROR",
        src="core.py:708",
        err=True,
    )
    mp = [
        ("/usr/lib/python3.12/multiprocessing/process.py", 314, "_bootstrap", "self.run()"),
        ("/usr/lib/python3.12/multiprocessing/process.py", 108, "run", "self._target(*self._args, **self._kwargs)"),
        (f"{VL}/v1/engine/core.py", 712, "run_engine_core", "raise e"),
    ]
    reprinted = Line(
        traceback_text(mp + core, final, head="Process EngineCore_DP0:\nTraceback (most recent call last):"),
        ENGINE,
        level=None,
        err=True,
    )
    wrapper = Line(
        traceback_text(
            _STARTUP_WAIT,
            "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}",
        ),
        API,
        level=None,
        err=True,
    )
    return Failure(pre + (logged, reprinted, wrapper), at, 1)


def _api(frames: list[Frame], final: str, at: float) -> Failure:
    return Failure((Line(traceback_text(frames, final), API, level=None, err=True),), at, 1)


def _pydantic(model: str, message: str, cfg: SimConfig) -> str:
    return (
        f"pydantic_core._pydantic_core.ValidationError: 1 validation error for {model}\n  Value error, {message} "
        f"[type=value_error, input_value=ArgsKwargs((), {{'model': '{cfg.model}', ...rocessor_plugin': None}}), input_type=ArgsKwargs]\n"
        "    For further information visit https://errors.pydantic.dev/2.11/v/value_error"
    )


# ---- gpu_oom -------------------------------------------------------------------------------------
_KV_FRAMES: list[Frame] = [
    (
        f"{VL}/v1/engine/core.py",
        92,
        "__init__",
        "num_gpu_blocks, num_cpu_blocks, kv_cache_config = self._initialize_kv_caches(",
    ),
    (
        f"{VL}/v1/engine/core.py",
        199,
        "_initialize_kv_caches",
        "kv_cache_configs = get_kv_cache_configs(vllm_config, kv_cache_specs,",
    ),
    (
        f"{VL}/v1/core/kv_cache_utils.py",
        1243,
        "get_kv_cache_configs",
        "check_enough_kv_cache_memory(vllm_config, kv_cache_spec_one_worker,",
    ),
    (f"{VL}/v1/core/kv_cache_utils.py", 687, "check_enough_kv_cache_memory", "raise ValueError("),
]


def no_cache_blocks(cfg: SimConfig, port: int) -> Failure:
    pre = (Line("Available KV cache memory: -1.52 GiB", ENGINE, src="gpu_worker.py:298"),)
    return _engine(
        _KV_FRAMES,
        "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` "
        "when initializing the engine.",
        0.715,
        pre,
    )


def oom_load(cfg: SimConfig, port: int) -> Failure:
    frames = (
        _EXECUTOR
        + _rpc("load_model")
        + [
            (
                f"{VL}/v1/worker/gpu_worker.py",
                227,
                "load_model",
                "self.model_runner.load_model(eep_scale_up=eep_scale_up)",
            ),
            (f"{VL}/v1/worker/gpu_model_runner.py", 2643, "load_model", "self.model = model_loader.load_model("),
            (
                f"{VL}/model_executor/model_loader/base_loader.py",
                45,
                "load_model",
                "model = initialize_model(vllm_config=vllm_config,",
            ),
            (
                f"{VL}/model_executor/models/llama.py",
                584,
                "__init__",
                "self.model = self._init_model(vllm_config=vllm_config,",
            ),
            (f"{VL}/model_executor/layers/linear.py", 421, "__init__", "self.quant_method.create_weights("),
            (f"{TORCH}/utils/_device.py", 104, "__torch_function__", "return func(*args, **kwargs)"),
        ]
    )
    return _engine(frames, torch_oom(), 0.30)


def kv_too_small(cfg: SimConfig, port: int) -> Failure:
    est = max(cfg.context_length * 9 // 16, 16)
    final = (
        f"ValueError: To serve at least one request with the models's max seq len ({cfg.context_length}), (4.00 GiB KV cache is "
        f"needed, which is larger than the available KV cache memory (2.25 GiB). Based on the available memory, the estimated maximum "
        f"model length is {est}. Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine."
    )
    pre = (Line("Available KV cache memory: 2.25 GiB", ENGINE, src="gpu_worker.py:298"),)
    return _engine(_KV_FRAMES, final, 0.715, pre)


# ---- model_not_found -----------------------------------------------------------------------------
def invalid_repo(cfg: SimConfig, port: int) -> Failure:
    path = cfg.model if "/" in cfg.model else f"/models/{cfg.model}"
    message = (
        f"Invalid repository ID or local directory specified: '{path}'.\nPlease verify the following requirements:\n"
        "1. Provide a valid Hugging Face repository ID.\n"
        "2. Specify a local directory that contains a recognized configuration file.\n"
        "   - For Hugging Face models: ensure the presence of a 'config.json'.\n"
        "   - For Mistral models: ensure the presence of a 'params.json'.\n"
    )
    return _api(_CONFIG, _pydantic("ModelConfig", message, cfg), 0.04)


def no_tokenizer(cfg: SimConfig, port: int) -> Failure:
    path = cfg.model if "/" in cfg.model else f"/models/{cfg.model}"
    frames = _WORKER + [
        (
            f"{VL}/entrypoints/openai/api_server.py",
            1920,
            "run_server_worker",
            "await init_app_state(engine_client, vllm_config, app.state, args)",
        ),
        (f"{VL}/transformers_utils/tokenizer.py", 260, "get_tokenizer", "tokenizer = AutoTokenizer.from_pretrained("),
        (
            f"{PY}/transformers/models/auto/tokenization_auto.py",
            1159,
            "from_pretrained",
            "return tokenizer_class_fast.from_pretrained(",
        ),
        (f"{PY}/transformers/tokenization_utils_base.py", 2046, "from_pretrained", "raise OSError("),
    ]
    final = (
        f"OSError: Can't load tokenizer for '{path}'. If you were trying to load it from 'https://huggingface.co/models', make sure "
        f"you don't have a local directory with the same name. Otherwise, make sure '{path}' is the correct path to a directory "
        "containing all relevant files for a LlamaTokenizerFast tokenizer."
    )
    return _api(frames, final, 0.96)


# ---- unsupported_model ---------------------------------------------------------------------------
def arch_not_supported(cfg: SimConfig, port: int) -> Failure:
    message = (
        f"Model architectures ['{ARCH}'] are not supported for now. Supported architectures: dict_keys(['AquilaModel', "
        "'AquilaForCausalLM', 'ArceeForCausalLM', 'ArcticForCausalLM', 'BaiChuanForCausalLM', 'BaichuanForCausalLM', "
        "'BailingMoeForCausalLM', 'BambaForCausalLM', 'BloomForCausalLM', 'ChatGLMModel', 'CohereForCausalLM', 'DeepseekV3ForCausalLM', "
        "'GemmaForCausalLM', 'Gemma2ForCausalLM', 'Gemma3ForCausalLM', 'GPT2LMHeadModel', 'LlamaForCausalLM', 'MistralForCausalLM', "
        "'MixtralForCausalLM', 'Qwen2ForCausalLM', 'Qwen3ForCausalLM', 'Qwen3MoeForCausalLM'])"
    )
    return _api(_CONFIG, _pydantic("ModelConfig", message, cfg), 0.05)


# ---- port_in_use ---------------------------------------------------------------------------------
def bind_failed(cfg: SimConfig, port: int) -> Failure:
    frames = _CLI + [
        (f"{VL}/entrypoints/openai/api_server.py", 1870, "run_server", "listen_address, sock = setup_server(args)"),
        (f"{VL}/entrypoints/openai/api_server.py", 1851, "setup_server", "sock = create_server_socket(sock_addr)"),
        (f"{VL}/entrypoints/openai/api_server.py", 1805, "create_server_socket", "sock.bind(addr)"),
    ]
    return _api(frames, "OSError: [Errno 98] Address already in use", 0.03)


# ---- nccl_or_distributed / cuda_driver -----------------------------------------------------------
_INIT_DEVICE: list[Frame] = (
    _EXECUTOR
    + _rpc("init_device")
    + [
        (f"{VL}/worker/worker_base.py", 259, "init_device", "self.worker.init_device()  # type: ignore"),
    ]
)


def dist_backend(cfg: SimConfig, port: int) -> Failure:
    frames = _INIT_DEVICE + [
        (
            f"{VL}/v1/worker/gpu_worker.py",
            201,
            "init_device",
            "init_worker_distributed_environment(self.vllm_config, self.rank,",
        ),
        (
            f"{VL}/v1/worker/gpu_worker.py",
            714,
            "init_worker_distributed_environment",
            "ensure_model_parallel_initialized(",
        ),
        (
            f"{VL}/distributed/parallel_state.py",
            1211,
            "ensure_model_parallel_initialized",
            "initialize_model_parallel(tensor_model_parallel_size,",
        ),
        (
            f"{VL}/distributed/parallel_state.py",
            1108,
            "initialize_model_parallel",
            "_TP = init_model_parallel_group(group_ranks,",
        ),
        (
            f"{VL}/distributed/device_communicators/pynccl.py",
            99,
            "__init__",
            "self.comm: ncclComm_t = self.nccl.ncclCommInitRank(",
        ),
        (
            f"{VL}/distributed/device_communicators/pynccl_wrapper.py",
            374,
            "NCCL_CHECK",
            'raise RuntimeError(f"NCCL error: {error_str}")',
        ),
    ]
    return _engine(
        frames, "RuntimeError: NCCL error: unhandled system error (run with NCCL_DEBUG=INFO for details)", 0.12
    )


def dist_store(cfg: SimConfig, port: int) -> Failure:
    frames = _INIT_DEVICE + [
        (
            f"{VL}/v1/worker/gpu_worker.py",
            201,
            "init_device",
            "init_worker_distributed_environment(self.vllm_config, self.rank,",
        ),
        (f"{TORCH}/distributed/distributed_c10d.py", 4635, "barrier", "work = group.barrier(opts=opts)"),
    ]
    final = (
        "torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.hpp:268, unhandled cuda "
        "error (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5\nncclUnhandledCudaError: Call to CUDA function failed.\n"
        "Last error:\nCuda failure 'peer access is not supported between these two devices'"
    )
    return _engine(frames, final, 0.12)


_CUDA_INIT: list[Frame] = _INIT_DEVICE + [
    (f"{VL}/v1/worker/gpu_worker.py", 166, "init_device", "torch.cuda.set_device(self.device)"),
    (f"{TORCH}/cuda/__init__.py", 529, "set_device", "torch._C._cuda_setDevice(device)"),
    (f"{TORCH}/cuda/__init__.py", 372, "_lazy_init", "torch._C._cuda_init()"),
]


def unsupported_driver(cfg: SimConfig, port: int) -> Failure:
    final = (
        "RuntimeError: Unexpected error from cudaGetDeviceCount(). Did you run some cuda functions before calling NumCudaDevices() "
        "that might have already set an error? Error 803: system has unsupported display driver / cuda driver combination"
    )
    return _engine(_CUDA_INIT, final, 0.11)


def driver_insufficient(cfg: SimConfig, port: int) -> Failure:
    return _engine(
        _CUDA_INIT,
        "RuntimeError: CUDA error: CUDA driver version is insufficient for CUDA runtime version\n" + CUDA_TAIL,
        0.11,
    )


# ---- import_error / config_error -----------------------------------------------------------------
def undefined_symbol(cfg: SimConfig, port: int) -> Failure:
    frames = [
        ("/usr/local/bin/vllm", 5, "<module>", "from vllm.entrypoints.cli.main import main"),
        (
            f"{VL}/entrypoints/cli/__init__.py",
            3,
            "<module>",
            "from vllm.entrypoints.cli.benchmark.latency import BenchmarkLatencySubcommand",
        ),
        (f"{VL}/platforms/cuda.py", 18, "<module>", "import vllm._C  # noqa"),
    ]
    text = traceback_text(frames, f"ImportError: {VL}/_C.abi3.so: undefined symbol: _ZN3c104cuda9SetDeviceEab")
    return Failure((Line(text, raw=True, err=True),), 0.0, 1, before_log=True)


def no_vllm(cfg: SimConfig, port: int) -> Failure:
    text = "/usr/bin/python3: Error while finding module specification for 'vllm.entrypoints.openai.api_server' (ModuleNotFoundError: No module named 'vllm')"
    return Failure((Line(text, raw=True, err=True),), 0.0, 1, before_log=True)


def bad_value(cfg: SimConfig, port: int) -> Failure:
    text = "usage: vllm serve [model_tag] [options]\nvllm serve: error: argument --gpu-memory-utilization: invalid float value: 'high'"
    return Failure((Line(text, raw=True, err=True),), 0.0, 2, before_log=True)


def unknown_flag(cfg: SimConfig, port: int) -> Failure:
    text = (
        "usage: vllm serve [model_tag] [options]\nvllm serve: error: unrecognized arguments: --mem-fraction-static 0.8"
    )
    return Failure((Line(text, raw=True, err=True),), 0.0, 2, before_log=True)


def batched_tokens(cfg: SimConfig, port: int) -> Failure:
    message = (
        f"max_num_batched_tokens (2048) is smaller than max_model_len ({cfg.context_length}). This effectively limits the maximum "
        "sequence length to max_num_batched_tokens and makes vLLM reject longer sequences. Please increase max_num_batched_tokens "
        "or decrease max_model_len."
    )
    frames = _WORKER + [
        (f"{VL}/engine/arg_utils.py", 1420, "create_engine_config", "scheduler_config = SchedulerConfig("),
        (
            f"{PY}/pydantic/_internal/_dataclasses.py",
            123,
            "__init__",
            "s.__pydantic_validator__.validate_python(ArgsKwargs(args, kwargs), self_instance=s)",
        ),
    ]
    return _api(frames, _pydantic("SchedulerConfig", message, cfg), 0.06)


# ---- other / killed ------------------------------------------------------------------------------
def missing_weight(cfg: SimConfig, port: int) -> Failure:
    frames = (
        _EXECUTOR
        + _rpc("load_model")
        + [
            (f"{VL}/v1/worker/gpu_model_runner.py", 2643, "load_model", "self.model = model_loader.load_model("),
            (
                f"{VL}/model_executor/model_loader/base_loader.py",
                49,
                "load_model",
                "self.load_weights(model, model_config)",
            ),
            (
                f"{VL}/model_executor/model_loader/default_loader.py",
                259,
                "load_weights",
                "loaded_weights = model.load_weights(",
            ),
            (f"{VL}/model_executor/models/llama.py", 596, "load_weights", "return loader.load_weights("),
            (
                f"{VL}/model_executor/models/utils.py",
                291,
                "load_weights",
                'autoloaded_weights = set(self._load_module("", self.module, weights))',
            ),
        ]
    )
    return _engine(frames, "KeyError: 'layers.0.mlp.experts.w2_weight'", 0.40)


def oom_killer(cfg: SimConfig, port: int) -> Failure:
    return Failure((), 0.40, SIGKILL_SELF, kill_children=False)


STARTUP: dict[Category, tuple[Callable[[SimConfig, int], Failure], ...]] = {
    Category.GPU_OOM: (no_cache_blocks, oom_load, kv_too_small),
    Category.MODEL_NOT_FOUND: (invalid_repo, no_tokenizer),
    Category.UNSUPPORTED_MODEL: (arch_not_supported,),
    Category.PORT_IN_USE: (bind_failed,),
    Category.NCCL_OR_DISTRIBUTED: (dist_backend, dist_store),
    Category.CUDA_DRIVER: (unsupported_driver, driver_insufficient),
    Category.IMPORT_ERROR: (undefined_symbol, no_vllm),
    Category.CONFIG_ERROR: (bad_value, unknown_flag, batched_tokens),
    Category.KILLED: (oom_killer,),
    Category.OTHER: (missing_weight,),
}


def _engine_dead(final: str) -> Failure:
    """The engine core dies under a running server: fatal error, EngineDeadError, a clean uvicorn shutdown, exit 0."""
    frames = [
        (f"{VL}/v1/engine/core.py", 701, "run_engine_core", "engine_core.run_busy_loop()"),
        (f"{VL}/v1/engine/core.py", 728, "run_busy_loop", "self._process_engine_step()"),
        (f"{VL}/v1/engine/core.py", 754, "_process_engine_step", "outputs, model_executed = self.step_fn()"),
        (f"{VL}/v1/engine/core.py", 284, "step", "model_output = self.execute_model_with_error_logging("),
        (
            f"{VL}/v1/worker/gpu_model_runner.py",
            2298,
            "execute_model",
            "valid_sampled_token_ids = sampled_token_ids.tolist()",
        ),
    ]
    fatal = Line(
        traceback_text(
            frames, final, head="EngineCore encountered a fatal error.\nTraceback (most recent call last):"
        ),
        ENGINE,
        level="ERROR",
        src="core.py:710",
        err=True,
    )
    handler = [
        (f"{VL}/v1/engine/async_llm.py", 439, "output_handler", "outputs = await engine_core.get_output_async()"),
        (f"{VL}/v1/engine/core_client.py", 846, "get_output_async", "raise self._format_exception(outputs) from None"),
    ]
    dead = Line(
        traceback_text(
            handler,
            "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. "
            "See stack trace (above) for the root cause.",
            head="AsyncLLM output_handler failed.\nTraceback (most recent call last):",
        ),
        API,
        level="ERROR",
        src="async_llm.py:480",
        err=True,
    )
    shutdown = (
        uv("INFO:     Shutting down", API),
        uv("INFO:     Waiting for application shutdown.", API),
        uv("INFO:     Application shutdown complete.", API),
    )
    return Failure((fatal, dead) + shutdown, 1.0, 0)


def after_ready(cfg: SimConfig, category: Category, port: int) -> Failure:
    """uvicorn says "Application startup complete." and then the engine dies under it (the probe never passes)."""
    started = (uv("INFO:     Application startup complete.", API),)
    if category in (Category.GPU_OOM, Category.OTHER, Category.NCCL_OR_DISTRIBUTED, Category.CUDA_DRIVER):
        finals = {
            Category.GPU_OOM: torch_oom(),
            Category.OTHER: "KeyError: 'layers.0.mlp.experts.w2_weight'",
            Category.NCCL_OR_DISTRIBUTED: "RuntimeError: NCCL error: unhandled system error (run with NCCL_DEBUG=INFO for details)",
            Category.CUDA_DRIVER: "RuntimeError: CUDA error: CUDA driver version is insufficient for CUDA runtime version\n"
            + CUDA_TAIL,
        }
        dead = _engine_dead(finals[category])
        return Failure(dead.lines, 1.0, dead.exit_code, prelude=started)
    failure = STARTUP[category][cfg.fail_variant % len(STARTUP[category])](cfg, port)
    return Failure(failure.lines, 1.0, failure.exit_code, kill_children=failure.kill_children, prelude=started)


def first_request(cfg: SimConfig, port: int) -> Failure:
    return _engine_dead(
        "torch.AcceleratorError: CUDA error: an illegal memory access was encountered\n"
        "Search for `cudaErrorIllegalAddress' in https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__TYPES.html "
        "for more information.\n" + CUDA_TAIL
    )
