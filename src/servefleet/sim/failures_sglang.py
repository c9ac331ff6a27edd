"""SGLang's real failure texts, per category (``python -m sglang.launch_server``, 0.4.x-0.5.x).

A failure in a scheduler (TP rank) process is logged by each rank as ``Scheduler hit an exception:
Traceback ...``; the launcher then logs ``Received sigquit from a child process. It usually means the
child failed.`` and SIGKILLs its process tree, itself included. Failures in the launcher itself
(arguments, model config, imports) are plain Python tracebacks on stderr with exit status 1 (2 for
argparse).
"""

from __future__ import annotations

from collections.abc import Callable

from servefleet.catalog import Category
from servefleet.sim.config import SimConfig
from servefleet.sim.failures import ARCH, CUDA_TAIL, SIGKILL_SELF, Failure, Frame, torch_oom, traceback_text
from servefleet.sim.logline import SG_RANK, Line, uv

__all__ = ["STARTUP", "after_ready", "first_request"]

PY = "/usr/local/lib/python3.12/dist-packages"
SG = f"{PY}/sglang/srt"
TORCH = f"{PY}/torch"
SIGQUIT = "Received sigquit from a child process. It usually means the child failed."
SUPPORTED = (
    "'BaichuanForCausalLM', 'ChatGLMModel', 'CohereForCausalLM', 'DbrxForCausalLM', 'DeepseekV2ForCausalLM', "
    "'DeepseekV3ForCausalLM', 'ExaoneForCausalLM', 'GemmaForCausalLM', 'Gemma2ForCausalLM', 'Gemma3ForCausalLM', "
    "'GPT2LMHeadModel', 'GPTBigCodeForCausalLM', 'Grok1ForCausalLM', 'InternLM2ForCausalLM', 'LlamaForCausalLM', "
    "'MistralForCausalLM', 'MixtralForCausalLM', 'Qwen2ForCausalLM', 'Qwen2MoeForCausalLM', 'Qwen3ForCausalLM', "
    "'Qwen3MoeForCausalLM'"
)


# The scheduler process building its model runner.
_SCHED: list[Frame] = [
    (
        f"{SG}/managers/scheduler.py",
        2890,
        "run_scheduler_process",
        "scheduler = Scheduler(server_args, port_args, gpu_id, tp_rank, moe_ep_rank, pp_rank, dp_rank)",
    ),
    (f"{SG}/managers/scheduler.py", 312, "__init__", "self.tp_worker = TpWorkerClass("),
    (f"{SG}/managers/tp_worker_overlap_thread.py", 67, "__init__", "self.worker = TpModelWorker("),
    (f"{SG}/managers/tp_worker.py", 84, "__init__", "self.model_runner = ModelRunner("),
    (f"{SG}/model_executor/model_runner.py", 242, "__init__", "self.initialize(min_per_gpu_memory)"),
]
_LOAD: list[Frame] = [
    (f"{SG}/model_executor/model_runner.py", 291, "initialize", "self.load_model()"),
    (f"{SG}/model_executor/model_runner.py", 734, "load_model", "self.model = get_model("),
    (f"{SG}/model_loader/__init__.py", 28, "get_model", "return loader.load_model("),
]
_DIST: list[Frame] = [
    (f"{SG}/model_executor/model_runner.py", 275, "initialize", "min_per_gpu_memory = self.init_torch_distributed()"),
]
# The launcher (main process) preparing its arguments.
_MAIN: list[Frame] = [
    ("<frozen runpy>", 198, "_run_module_as_main", None),
    ("<frozen runpy>", 88, "_run_code", None),
    (f"{PY}/sglang/launch_server.py", 11, "<module>", "server_args = prepare_server_args(sys.argv[1:])"),
    (f"{SG}/server_args.py", 2301, "prepare_server_args", "return ServerArgs.from_cli_args(raw_args)"),
    (f"{SG}/server_args.py", 2210, "from_cli_args", "return cls(**{attr: getattr(args, attr) for attr in attrs})"),
    ("<string>", 229, "__init__", None),
    (f"{SG}/server_args.py", 335, "__post_init__", "self._handle_model_specific_adjustments()"),
    (f"{SG}/server_args.py", 1933, "_handle_model_specific_adjustments", "hf_config = self.get_hf_config()"),
    (f"{SG}/server_args.py", 2098, "get_hf_config", "hf_config = get_config("),
    (f"{SG}/utils/hf_transformers_utils.py", 119, "get_config", "config = AutoConfig.from_pretrained("),
]


def _child(frames: list[Frame], final: str, at: float, who: str = "Scheduler", rank: str | None = SG_RANK) -> Failure:
    body = traceback_text(frames, final, head=f"{who} hit an exception: Traceback (most recent call last):")
    return Failure((Line(body + "\n", rank, err=True), Line(SIGQUIT, err=True)), at, SIGKILL_SELF)


def _main(frames: list[Frame], final: str, at: float, *, before_log: bool = False, code: int = 1) -> Failure:
    return Failure((Line(traceback_text(frames, final), raw=True, err=True),), at, code, before_log=before_log)


def _local_path(cfg: SimConfig) -> str:
    return cfg.model if "/" in cfg.model else f"/models/{cfg.model}"


# ---- gpu_oom -------------------------------------------------------------------------------------
def oom_kv_pool(cfg: SimConfig, port: int) -> Failure:
    final = (
        "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. "
        f"Current value: mem_fraction_static={cfg.mem_fraction_static}"
    )
    frames = _SCHED + [
        (f"{SG}/model_executor/model_runner.py", 320, "initialize", "self.init_memory_pool("),
        (f"{SG}/model_executor/model_runner.py", 1235, "init_memory_pool", "raise RuntimeError("),
    ]
    return _child(frames, final, 0.58)


def oom_load(cfg: SimConfig, port: int) -> Failure:
    frames = (
        _SCHED
        + _LOAD
        + [
            (f"{SG}/model_loader/loader.py", 594, "load_model", "self.load_weights_and_postprocess("),
            (f"{SG}/model_loader/loader.py", 602, "load_weights_and_postprocess", "model.load_weights(weights)"),
            (f"{SG}/models/llama.py", 655, "load_weights", "weight_loader(param, loaded_weight, shard_id)"),
            (f"{SG}/layers/linear.py", 812, "weight_loader", "param_data.copy_(loaded_weight)"),
        ]
    )
    return _child(frames, torch_oom(), 0.30)


# ---- model_not_found -----------------------------------------------------------------------------
def missing_local_folder(cfg: SimConfig, port: int) -> Failure:
    path = _local_path(cfg)
    first = traceback_text(
        [
            (f"{PY}/transformers/utils/hub.py", 479, "cached_files", "hf_hub_download("),
            (f"{PY}/huggingface_hub/utils/_validators.py", 106, "_inner_fn", "validate_repo_id(arg_value)"),
            (f"{PY}/huggingface_hub/utils/_validators.py", 154, "validate_repo_id", "raise HFValidationError("),
        ],
        f"huggingface_hub.errors.HFValidationError: Repo id must be in the form 'repo_name' or 'namespace/repo_name': '{path}'. "
        "Use `repo_type` argument if needed.",
    )
    second = traceback_text(
        _MAIN
        + [
            (
                f"{PY}/transformers/models/auto/configuration_auto.py",
                1250,
                "from_pretrained",
                "config_dict, unused_kwargs = PretrainedConfig.get_config_dict(pretrained_model_name_or_path, **kwargs)",
            ),
            (f"{PY}/transformers/utils/hub.py", 532, "cached_files", "raise OSError("),
        ],
        f"OSError: Incorrect path_or_model_id: '{path}'. Please provide either the path to a local folder or the repo_id of a model on the Hub.",
    )
    text = f"{first}\n\nDuring handling of the above exception, another exception occurred:\n\n{second}"
    return Failure((Line(text, raw=True, err=True),), 0.02, 1)


def repo_not_found(cfg: SimConfig, port: int) -> Failure:
    repo = cfg.model.strip("/") or "sim-model"
    text = traceback_text(
        _MAIN
        + [
            (f"{PY}/transformers/utils/hub.py", 522, "cached_files", "raise OSError("),
        ],
        f"OSError: {repo} is not a local folder and is not a valid model identifier listed on 'https://huggingface.co/models'\n"
        "If this is a private repository, make sure to pass a token having permission to this repo either by logging in with "
        "`hf auth login` or by passing `token=<your_token>`",
    )
    cause = (
        "huggingface_hub.errors.RepositoryNotFoundError: 401 Client Error. (Request ID: Root=1-68c0f2a1-1b2c3d4e5f60718293a4b5c6)\n\n"
        f"Repository Not Found for url: https://huggingface.co/{repo}/resolve/main/config.json.\n"
        "Please make sure you specified the correct `repo_id` and `repo_type`.\n"
        "If you are trying to access a private or gated repo, make sure you are authenticated. For more details, see "
        "https://huggingface.co/docs/huggingface_hub/authentication\nInvalid username or password."
    )
    first = traceback_text(
        [(f"{PY}/huggingface_hub/utils/_http.py", 409, "hf_raise_for_status", "response.raise_for_status()")], cause
    )
    full = f"{first}\n\nThe above exception was the direct cause of the following exception:\n\n{text}"
    return Failure((Line(full, raw=True, err=True),), 0.02, 1)


# ---- unsupported_model ---------------------------------------------------------------------------
def arch_not_supported(cfg: SimConfig, port: int) -> Failure:
    frames = (
        _SCHED
        + _LOAD
        + [
            (f"{SG}/model_loader/loader.py", 585, "load_model", "model = _initialize_model("),
            (
                f"{SG}/model_loader/loader.py",
                182,
                "_initialize_model",
                "model_class, _ = get_model_architecture(model_config)",
            ),
            (
                f"{SG}/model_loader/utils.py",
                103,
                "get_model_architecture",
                "return ModelRegistry.resolve_model_cls(architectures)",
            ),
            (f"{SG}/models/registry.py", 72, "resolve_model_cls", "return self._raise_for_unsupported(architectures)"),
            (f"{SG}/models/registry.py", 37, "_raise_for_unsupported", "raise ValueError("),
        ]
    )
    final = f"ValueError: Model architectures ['{ARCH}'] are not supported for now. Supported architectures: dict_keys([{SUPPORTED}])"
    return _child(frames, final, 0.12)


def model_type_unknown(cfg: SimConfig, port: int) -> Failure:
    final = (
        "ValueError: The checkpoint you are trying to load has model type `sim_mamba` but Transformers does not recognize this "
        "architecture. This could be because of an issue with the checkpoint, or because your version of Transformers is out of date.\n\n"
        "You can update Transformers with the command `pip install --upgrade transformers`. If this does not work, and the checkpoint "
        "is very new, then there may not be a release version that supports this model yet. In this case, you can get the most "
        "up-to-date code by installing Transformers from source with the command `pip install git+https://github.com/huggingface/transformers.git`"
    )
    frames = _MAIN + [
        (f"{PY}/transformers/models/auto/configuration_auto.py", 1270, "from_pretrained", "raise ValueError(")
    ]
    return _main(frames, final, 0.02)


# ---- port_in_use ---------------------------------------------------------------------------------
def uvicorn_bind(cfg: SimConfig, port: int) -> Failure:
    """uvicorn binds after the model is loaded: "Application startup complete." comes BEFORE the error."""
    lines = (
        uv(f"INFO:     Started server process [{_pid()}]"),
        uv("INFO:     Waiting for application startup."),
        uv("INFO:     Application startup complete."),
        uv(
            f"ERROR:    [Errno 98] error while attempting to bind on address ('{cfg.host}', {port}): address already in use",
            err=True,
        ),
        uv("INFO:     Waiting for application shutdown."),
        uv("INFO:     Application shutdown complete."),
    )
    return Failure(lines, 1.0, 1)


def zmq_port(cfg: SimConfig, port: int) -> Failure:
    frames = [
        (
            f"{SG}/managers/detokenizer_manager.py",
            289,
            "run_detokenizer_process",
            "manager = DetokenizerManager(server_args, port_args)",
        ),
        (f"{SG}/managers/detokenizer_manager.py", 96, "__init__", "self.init_ipc_channels(port_args)"),
        (
            f"{SG}/managers/detokenizer_manager.py",
            124,
            "init_ipc_channels",
            "self.recv_from_scheduler = get_zmq_socket(",
        ),
        (f"{SG}/utils/common.py", 1321, "get_zmq_socket", "socket.bind(endpoint)"),
        (f"{PY}/zmq/sugar/socket.py", 311, "bind", "super().bind(addr)"),
        ("_zmq.py", 917, "zmq.backend.cython._zmq.Socket.bind", None),
        ("_zmq.py", 179, "zmq.backend.cython._zmq._check_rc", None),
    ]
    final = f"zmq.error.ZMQError: Address already in use (addr='tcp://127.0.0.1:{port + 1}')"
    return _child(frames, final, 0.04, who="DetokenizerManager", rank=None)


def _pid() -> int:
    import os

    return os.getpid()


# ---- nccl_or_distributed -------------------------------------------------------------------------
_NCCL_FRAMES: list[Frame] = (
    _SCHED
    + _DIST
    + [
        (f"{SG}/model_executor/model_runner.py", 645, "init_torch_distributed", "initialize_model_parallel("),
        (f"{SG}/distributed/parallel_state.py", 1391, "initialize_model_parallel", "_TP = init_model_parallel_group("),
        (f"{SG}/distributed/parallel_state.py", 1185, "init_model_parallel_group", "return GroupCoordinator("),
        (f"{SG}/distributed/parallel_state.py", 263, "__init__", "self.pynccl_comm = PyNcclCommunicator("),
        (
            f"{SG}/distributed/device_communicators/pynccl.py",
            110,
            "__init__",
            "self.comm: ncclComm_t = self.nccl.ncclCommInitRank(",
        ),
        (f"{SG}/distributed/device_communicators/pynccl_wrapper.py", 407, "ncclCommInitRank", "self.NCCL_CHECK("),
        (
            f"{SG}/distributed/device_communicators/pynccl_wrapper.py",
            374,
            "NCCL_CHECK",
            'raise RuntimeError(f"NCCL error: {error_str}")',
        ),
    ]
)


def pynccl(cfg: SimConfig, port: int) -> Failure:
    return _child(
        _NCCL_FRAMES, "RuntimeError: NCCL error: unhandled system error (run with NCCL_DEBUG=INFO for details)", 0.07
    )


def dist_backend(cfg: SimConfig, port: int) -> Failure:
    frames = (
        _SCHED
        + _DIST
        + [
            (f"{SG}/model_executor/model_runner.py", 625, "init_torch_distributed", "init_distributed_environment("),
            (
                f"{SG}/distributed/parallel_state.py",
                1316,
                "init_distributed_environment",
                "torch.distributed.barrier()",
            ),
            (f"{TORCH}/distributed/c10d_logger.py", 81, "wrapper", "return func(*args, **kwargs)"),
            (f"{TORCH}/distributed/distributed_c10d.py", 4635, "barrier", "work = group.barrier(opts=opts)"),
        ]
    )
    final = (
        "torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.hpp:268, "
        "unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5\n"
        "ncclUnhandledCudaError: Call to CUDA function failed.\nLast error:\nCuda failure 'peer access is not supported between these two devices'"
    )
    return _child(frames, final, 0.07)


# ---- cuda_driver ---------------------------------------------------------------------------------
_CUDA_FRAMES: list[Frame] = (
    _SCHED
    + _DIST
    + [
        (
            f"{SG}/model_executor/model_runner.py",
            598,
            "init_torch_distributed",
            "torch.get_device_module(self.device).set_device(self.gpu_id)",
        ),
        (f"{TORCH}/cuda/__init__.py", 529, "set_device", "torch._C._cuda_setDevice(device)"),
        (f"{TORCH}/cuda/__init__.py", 372, "_lazy_init", "torch._C._cuda_init()"),
    ]
)


def driver_too_old(cfg: SimConfig, port: int) -> Failure:
    final = (
        "RuntimeError: The NVIDIA driver on your system is too old (found version 11040). Please update your GPU driver by downloading "
        "and installing a new version from the URL: http://www.nvidia.com/Download/index.aspx Alternatively, go to: https://pytorch.org "
        "to install a PyTorch version that has been compiled with your version of the CUDA driver."
    )
    return _child(_CUDA_FRAMES, final, 0.06)


def driver_insufficient(cfg: SimConfig, port: int) -> Failure:
    return _child(
        _CUDA_FRAMES,
        "RuntimeError: CUDA error: CUDA driver version is insufficient for CUDA runtime version\n" + CUDA_TAIL,
        0.06,
    )


# ---- import_error --------------------------------------------------------------------------------
_IMPORT_FRAMES: list[Frame] = [
    ("<frozen runpy>", 198, "_run_module_as_main", None),
    ("<frozen runpy>", 88, "_run_code", None),
    (f"{PY}/sglang/launch_server.py", 7, "<module>", "from sglang.srt.entrypoints.http_server import launch_server"),
    (
        f"{SG}/entrypoints/http_server.py",
        48,
        "<module>",
        "from sglang.srt.entrypoints.engine import _launch_subprocesses",
    ),
    (f"{SG}/entrypoints/engine.py", 41, "<module>", "from sglang.srt.managers.data_parallel_controller import ("),
    (
        f"{SG}/managers/data_parallel_controller.py",
        33,
        "<module>",
        "from sglang.srt.managers.scheduler import run_scheduler_process",
    ),
    (
        f"{SG}/managers/scheduler.py",
        63,
        "<module>",
        "from sglang.srt.layers.logits_processor import LogitsProcessorOutput",
    ),
    (f"{SG}/layers/logits_processor.py", 31, "<module>", "from sglang.srt.layers.dp_attention import ("),
]


def no_sgl_kernel(cfg: SimConfig, port: int) -> Failure:
    frames = _IMPORT_FRAMES + [
        (
            f"{SG}/layers/activation.py",
            45,
            "<module>",
            "from sgl_kernel import gelu_and_mul, gelu_tanh_and_mul, silu_and_mul",
        )
    ]
    return _main(frames, "ModuleNotFoundError: No module named 'sgl_kernel'", 0.0, before_log=True)


def no_libcudart(cfg: SimConfig, port: int) -> Failure:
    frames = _IMPORT_FRAMES + [(f"{PY}/sgl_kernel/__init__.py", 5, "<module>", "from sgl_kernel import common_ops")]
    return _main(
        frames,
        "ImportError: libcudart.so.12: cannot open shared object file: No such file or directory",
        0.0,
        before_log=True,
    )


# ---- config_error --------------------------------------------------------------------------------
_FLAGS = (
    "--tokenizer-path TOKENIZER_PATH",
    "--tokenizer-worker-num TOKENIZER_WORKER_NUM",
    "--tokenizer-mode {auto,slow}",
    "--skip-tokenizer-init",
    "--load-format {auto,pt,safetensors,npcache,dummy,sharded_state,gguf,bitsandbytes,layered,remote}",
    "--model-loader-extra-config MODEL_LOADER_EXTRA_CONFIG",
    "--trust-remote-code",
    "--context-length CONTEXT_LENGTH",
    "--is-embedding",
    "--enable-multimodal",
    "--revision REVISION",
    "--model-impl MODEL_IMPL",
    "--host HOST",
    "--port PORT",
    "--skip-server-warmup",
    "--warmups WARMUPS",
    "--nccl-port NCCL_PORT",
    "--dtype {auto,half,float16,bfloat16,float,float32}",
    "--quantization {awq,fp8,gptq,marlin,gptq_marlin,awq_marlin,bitsandbytes,gguf,modelopt,modelopt_fp4,petit_nvfp4,w8a8_int8,w8a8_fp8,moe_wna16,qoq,w4afp8,mxfp4}",
    "--quantization-param-path QUANTIZATION_PARAM_PATH",
    "--kv-cache-dtype {auto,fp8_e5m2,fp8_e4m3}",
    "--mem-fraction-static MEM_FRACTION_STATIC",
    "--max-running-requests MAX_RUNNING_REQUESTS",
    "--max-queued-requests MAX_QUEUED_REQUESTS",
    "--max-total-tokens MAX_TOTAL_TOKENS",
    "--chunked-prefill-size CHUNKED_PREFILL_SIZE",
    "--max-prefill-tokens MAX_PREFILL_TOKENS",
    "--schedule-policy {lpm,random,fcfs,dfs-weight,lof,priority}",
    "--schedule-conservativeness SCHEDULE_CONSERVATIVENESS",
    "--page-size PAGE_SIZE",
    "--hybrid-kvcache-ratio [HYBRID_KVCACHE_RATIO]",
    "--swa-full-tokens-ratio SWA_FULL_TOKENS_RATIO",
    "--disable-hybrid-swa-memory",
    "--device DEVICE",
    "--tensor-parallel-size TENSOR_PARALLEL_SIZE",
    "--pipeline-parallel-size PIPELINE_PARALLEL_SIZE",
    "--max-micro-batch-size MAX_MICRO_BATCH_SIZE",
    "--stream-interval STREAM_INTERVAL",
    "--stream-output",
    "--random-seed RANDOM_SEED",
    "--constrained-json-whitespace-pattern CONSTRAINED_JSON_WHITESPACE_PATTERN",
    "--watchdog-timeout WATCHDOG_TIMEOUT",
    "--dist-timeout DIST_TIMEOUT",
    "--download-dir DOWNLOAD_DIR",
    "--base-gpu-id BASE_GPU_ID",
    "--gpu-id-step GPU_ID_STEP",
    "--sleep-on-idle",
    "--log-level LOG_LEVEL",
    "--log-level-http LOG_LEVEL_HTTP",
    "--log-requests",
    "--log-requests-level {0,1,2,3}",
    "--crash-dump-folder CRASH_DUMP_FOLDER",
    "--show-time-cost",
    "--enable-metrics",
    "--enable-metrics-for-all-schedulers",
    "--bucket-time-to-first-token BUCKET_TIME_TO_FIRST_TOKEN [BUCKET_TIME_TO_FIRST_TOKEN ...]",
    "--bucket-inter-token-latency BUCKET_INTER_TOKEN_LATENCY [BUCKET_INTER_TOKEN_LATENCY ...]",
    "--collect-tokens-histogram",
    "--decode-log-interval DECODE_LOG_INTERVAL",
    "--enable-request-time-stats-logging",
    "--kv-events-config KV_EVENTS_CONFIG",
    "--api-key API_KEY",
    "--served-model-name SERVED_MODEL_NAME",
    "--weight-version WEIGHT_VERSION",
    "--chat-template CHAT_TEMPLATE",
    "--completion-template COMPLETION_TEMPLATE",
    "--file-storage-path FILE_STORAGE_PATH",
    "--enable-cache-report",
    "--reasoning-parser {deepseek-r1,deepseek-v3,glm45,gpt-oss,kimi,qwen3,qwen3-thinking,step3}",
    "--tool-call-parser TOOL_CALL_PARSER",
    "--data-parallel-size DATA_PARALLEL_SIZE",
    "--load-balance-method {round_robin,shortest_queue,minimum_tokens}",
    "--dist-init-addr DIST_INIT_ADDR",
    "--nnodes NNODES",
    "--node-rank NODE_RANK",
    "--json-model-override-args JSON_MODEL_OVERRIDE_ARGS",
    "--preferred-sampling-params PREFERRED_SAMPLING_PARAMS",
    "--enable-lora",
    "--max-lora-rank MAX_LORA_RANK",
    "--lora-paths [LORA_PATHS ...]",
    "--max-loras-per-batch MAX_LORAS_PER_BATCH",
    "--lora-backend LORA_BACKEND",
    "--attention-backend {aiter,cutlass_mla,fa3,fa4,flashinfer,flashmla,intel_amx,torch_native,ascend,triton,trtllm_mla,trtllm_mha,dual_chunk_flash_attn,hybrid_linear_attn}",
    "--prefill-attention-backend PREFILL_ATTENTION_BACKEND",
    "--decode-attention-backend DECODE_ATTENTION_BACKEND",
    "--sampling-backend {flashinfer,pytorch}",
    "--grammar-backend {xgrammar,outlines,llguidance,none}",
    "--mm-attention-backend {sdpa,fa3,triton_attn}",
    "--speculative-algorithm {EAGLE,EAGLE3,NEXTN,STANDALONE}",
    "--speculative-draft-model-path SPECULATIVE_DRAFT_MODEL_PATH",
    "--speculative-num-steps SPECULATIVE_NUM_STEPS",
    "--speculative-eagle-topk SPECULATIVE_EAGLE_TOPK",
    "--speculative-num-draft-tokens SPECULATIVE_NUM_DRAFT_TOKENS",
    "--speculative-accept-threshold-single SPECULATIVE_ACCEPT_THRESHOLD_SINGLE",
    "--speculative-accept-threshold-acc SPECULATIVE_ACCEPT_THRESHOLD_ACC",
    "--speculative-token-map SPECULATIVE_TOKEN_MAP",
    "--ep-size EP_SIZE",
    "--moe-a2a-backend {none,deepep}",
    "--moe-runner-backend {auto,triton,triton_kernel,flashinfer_trtllm,flashinfer_cutlass,flashinfer_mxfp4}",
    "--enable-flashinfer-allreduce-fusion",
    "--deepep-mode {normal,low_latency,auto}",
    "--ep-num-redundant-experts EP_NUM_REDUNDANT_EXPERTS",
    "--enable-eplb",
    "--eplb-algorithm EPLB_ALGORITHM",
    "--enable-hierarchical-cache",
    "--hicache-ratio HICACHE_RATIO",
    "--hicache-size HICACHE_SIZE",
    "--hicache-write-policy {write_back,write_through,write_through_selective}",
    "--hicache-storage-backend {file,mooncake,hf3fs,nixl}",
    "--enable-double-sparsity",
    "--cpu-offload-gb CPU_OFFLOAD_GB",
    "--disable-radix-cache",
    "--cuda-graph-max-bs CUDA_GRAPH_MAX_BS",
    "--cuda-graph-bs CUDA_GRAPH_BS [CUDA_GRAPH_BS ...]",
    "--disable-cuda-graph",
    "--disable-cuda-graph-padding",
    "--enable-profile-cuda-graph",
    "--enable-cudagraph-gc",
    "--enable-nccl-nvls",
    "--enable-symm-mem",
    "--disable-flashinfer-cutlass-moe-fp4-allgather",
    "--enable-tokenizer-batch-encode",
    "--disable-outlines-disk-cache",
    "--disable-custom-all-reduce",
    "--enable-mscclpp",
    "--disable-overlap-schedule",
    "--enable-mixed-chunk",
    "--enable-dp-attention",
    "--enable-dp-lm-head",
    "--enable-two-batch-overlap",
    "--tbo-token-distribution-threshold TBO_TOKEN_DISTRIBUTION_THRESHOLD",
    "--enable-torch-compile",
    "--torch-compile-max-bs TORCH_COMPILE_MAX_BS",
    "--torchao-config TORCHAO_CONFIG",
    "--enable-nan-detection",
    "--enable-p2p-check",
    "--triton-attention-reduce-in-fp32",
    "--triton-attention-num-kv-splits TRITON_ATTENTION_NUM_KV_SPLITS",
    "--num-continuous-decode-steps NUM_CONTINUOUS_DECODE_STEPS",
    "--delete-ckpt-after-loading",
    "--enable-memory-saver",
    "--allow-auto-truncate",
    "--enable-custom-logit-processor",
    "--flashinfer-mla-disable-ragged",
    "--disable-shared-experts-fusion",
    "--disable-chunked-prefix-cache",
    "--disable-fast-image-processor",
    "--enable-return-hidden-states",
    "--scheduler-recv-interval SCHEDULER_RECV_INTERVAL",
    "--debug-tensor-dump-output-folder DEBUG_TENSOR_DUMP_OUTPUT_FOLDER",
    "--debug-tensor-dump-input-file DEBUG_TENSOR_DUMP_INPUT_FILE",
    "--disaggregation-mode {null,prefill,decode}",
    "--disaggregation-transfer-backend {mooncake,nixl,ascend,fake}",
    "--disaggregation-bootstrap-port DISAGGREGATION_BOOTSTRAP_PORT",
    "--disaggregation-ib-device DISAGGREGATION_IB_DEVICE",
    "--num-reserved-decode-tokens NUM_RESERVED_DECODE_TOKENS",
    "--pdlb-url PDLB_URL",
    "--custom-weight-loader [CUSTOM_WEIGHT_LOADER ...]",
    "--weight-loader-disable-mmap",
    "--enable-pdmux",
    "--sm-group-num SM_GROUP_NUM",
)


def _usage(prog: str, required: str) -> str:
    """argparse's usage block: wrapped at 80 columns under the program name, as argparse does."""
    indent = " " * (len("usage: ") + len(prog) + 1)
    lines, current = [], f"usage: {prog} [-h] {required}"
    for flag in _FLAGS:
        item = f"[{flag}]"
        if len(current) + 1 + len(item) > 80:
            lines.append(current)
            current = indent + item
        else:
            current += " " + item
    lines.append(current)
    return "\n".join(lines)


def bad_value(cfg: SimConfig, port: int) -> Failure:
    text = (
        _usage("launch_server.py", "--model-path MODEL_PATH")
        + "\nlaunch_server.py: error: argument --mem-fraction-static: invalid float value: 'high'"
    )
    return Failure((Line(text, raw=True, err=True),), 0.0, 2, before_log=True)


def unknown_flag(cfg: SimConfig, port: int) -> Failure:
    text = (
        _usage("launch_server.py", "--model-path MODEL_PATH")
        + "\nlaunch_server.py: error: unrecognized arguments: --gpu-memory-utilization 0.9"
    )
    return Failure((Line(text, raw=True, err=True),), 0.0, 2, before_log=True)


# ---- other / killed ------------------------------------------------------------------------------
def fa2_assert(cfg: SimConfig, port: int) -> Failure:
    frames = _SCHED + [
        (f"{SG}/model_executor/model_runner.py", 340, "initialize", "self.init_device_graphs()"),
        (
            f"{SG}/model_executor/model_runner.py",
            1802,
            "init_device_graphs",
            "self.graph_runner = CudaGraphRunner(self)",
        ),
        (f"{SG}/model_executor/cuda_graph_runner.py", 380, "__init__", "self.capture()"),
        (
            f"{SG}/layers/attention/flashinfer_backend.py",
            402,
            "init_forward_metadata_capture_cuda_graph",
            "self.indices_updater_decode.update(",
        ),
        (
            f"{PY}/flashinfer/jit/attention/modules.py",
            978,
            "gen_batch_prefill_module",
            'assert not fp8_enabled, "fp8 tensor core is not supported in fa2 backend"',
        ),
    ]
    return _child(frames, "AssertionError: fp8 tensor core is not supported in fa2 backend", 0.70)


def oom_killer(cfg: SimConfig, port: int) -> Failure:
    return Failure((), 0.40, SIGKILL_SELF, kill_children=False)


STARTUP: dict[Category, tuple[Callable[[SimConfig, int], Failure], ...]] = {
    Category.GPU_OOM: (oom_kv_pool, oom_load),
    Category.MODEL_NOT_FOUND: (missing_local_folder, repo_not_found),
    Category.UNSUPPORTED_MODEL: (arch_not_supported, model_type_unknown),
    Category.PORT_IN_USE: (uvicorn_bind, zmq_port),
    Category.NCCL_OR_DISTRIBUTED: (pynccl, dist_backend),
    Category.CUDA_DRIVER: (driver_too_old, driver_insufficient),
    Category.IMPORT_ERROR: (no_sgl_kernel, no_libcudart),
    Category.CONFIG_ERROR: (bad_value, unknown_flag),
    Category.KILLED: (oom_killer,),
    Category.OTHER: (fa2_assert,),
}


def after_ready(cfg: SimConfig, category: Category, port: int) -> Failure:
    """Warm-up after "Uvicorn running": the scheduler dies on the warm-up request (or the category's own text)."""
    if category is Category.GPU_OOM:
        frames = _SCHED[:1] + [
            (f"{SG}/managers/scheduler.py", 2905, "run_scheduler_process", "scheduler.event_loop_overlap()"),
            (f"{SG}/managers/scheduler.py", 812, "event_loop_overlap", "result = self.run_batch(batch)"),
            (
                f"{SG}/managers/scheduler.py",
                1880,
                "run_batch",
                "logits_output, next_token_ids, can_run_cuda_graph = self.tp_worker.forward_batch_generation(",
            ),
            (f"{SG}/model_executor/model_runner.py", 1650, "forward_extend", "return self.model.forward("),
        ]
        return _child(frames, torch_oom(), 1.0)
    failure = STARTUP[category][cfg.fail_variant % len(STARTUP[category])](cfg, port)
    lines = failure.lines
    if lines and "Started server process" in lines[0].text:  # uvicorn's own start lines were printed already
        lines = tuple(line for line in lines if "Errno 98" in line.text or "shutdown" in line.text)
    return Failure(lines, 1.0, failure.exit_code, kill_children=failure.kill_children)


def first_request(cfg: SimConfig, port: int) -> Failure:
    frames = _SCHED[:1] + [
        (f"{SG}/managers/scheduler.py", 2905, "run_scheduler_process", "scheduler.event_loop_overlap()"),
        (f"{SG}/managers/scheduler.py", 812, "event_loop_overlap", "result = self.run_batch(batch)"),
        (
            f"{SG}/managers/tp_worker_overlap_thread.py",
            240,
            "resolve_last_batch_result",
            "self.scheduler_stream.synchronize()",
        ),
        (f"{TORCH}/cuda/streams.py", 224, "synchronize", "super().synchronize()"),
    ]
    return _child(frames, "RuntimeError: CUDA error: an illegal memory access was encountered\n" + CUDA_TAIL, 1.0)
