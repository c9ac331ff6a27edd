"""Engine log signatures: real-format lines map to the right kind and category.

Each line is written as the classifier sees it (ANSI codes and per-process prefixes such as
``[2026-04-14 16:08:49 TP0]`` or ``(EngineCore_DP0 pid=12)`` stripped; level headers such as vLLM's
``ERROR 08-18 20:42:56 [core.py:1330]`` kept). The comment on each row names where the string comes
from: the upstream source file that prints it, or a real log quoted in an upstream issue/doc.
Each line goes through the classifier's own matching (``verify.logtext.match_text`` then
``verify.classify.match_signature``: a BENIGN shield wins, else the first match in the profile's
order, else the generic process-death lines), never a copy of it.
"""

from __future__ import annotations

import pytest

from servefleet.catalog import Category
from servefleet.engines.base import EngineProfile, SignalKind, Signature
from servefleet.engines.registry import get_engine
from servefleet.verify.classify import match_signature
from servefleet.verify.logtext import match_text

K = SignalKind
C = Category
MINE = ("sglang", "vllm", "llamacpp", "tgi", "sim", "openai")


def signature_of(engine: EngineProfile, line: str) -> Signature | None:
    """The signature the classifier gives this line (production code, not a re-implementation)."""
    return match_signature(match_text(line), engine.signatures)


def kind_and_category(engine: str, line: str) -> tuple[SignalKind | None, Category | None]:
    sig = signature_of(get_engine(engine), line)
    return (sig.kind, sig.category) if sig else (None, None)


# (engine, line, kind, category)
FATAL_ROWS = [
    # ---------------------------------------------------------------- SGLang
    # srt/model_executor/model_runner.py (v0.3-v0.5): KV pool <= 0 tokens
    (
        "sglang",
        "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. "
        "Current value: self.server_args.mem_fraction_static=0.88",
        C.GPU_OOM,
    ),
    # mem_cache/kv_cache_configurator.py (v0.5.17): the weights exceed the static budget
    (
        "sglang",
        "ValueError: Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static=0.001. "
        "Raise --mem-fraction-static above 0.007 (minimum viable = 1 - available/pre = 0.0064). If using "
        "speculative decoding, draft weights are now counted.",
        C.GPU_OOM,
    ),
    # model_runner.py init_cuda_graphs: "Capture cuda graph failed: {e}" wrapping a torch OOM
    (
        "sglang",
        "Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate 34.00 MiB. GPU 0 has a "
        "total capacity of 79.19 GiB of which 9.06 MiB is free.",
        C.GPU_OOM,
    ),
    # torch/cuda/memory: torch.OutOfMemoryError text
    (
        "sglang",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity "
        "of 79.11 GiB of which 1.23 GiB is free.",
        C.GPU_OOM,
    ),
    # transformers/utils/hub.py cached_files (RepositoryNotFoundError -> OSError)
    (
        "sglang",
        "OSError: /models/Qwen3-8B is not a local folder and is not a valid model identifier listed on "
        "'https://huggingface.co/models'",
        C.MODEL_NOT_FOUND,
    ),
    # huggingface_hub/utils/_validators.py validate_repo_id: a missing absolute local path
    (
        "sglang",
        "huggingface_hub.errors.HFValidationError: Repo id must be in the form 'repo_name' or "
        "'namespace/repo_name': '/data/models/missing/Qwen3-8B'. Use `repo_type` argument if needed.",
        C.MODEL_NOT_FOUND,
    ),
    # srt/models/registry.py _raise_for_unsupported (same words as vLLM's registry)
    (
        "sglang",
        "ValueError: Model architectures ['FooForCausalLM'] are not supported for now. Supported "
        "architectures: dict_keys(['LlamaForCausalLM', 'Qwen2ForCausalLM'])",
        C.UNSUPPORTED_MODEL,
    ),
    # detokenizer_manager.py init_ipc_channels in a real 0.5 log (zmq)
    ("sglang", "zmq.error.ZMQError: Address already in use (addr='tcp://127.0.0.1:29236')", C.PORT_IN_USE),
    # uvicorn via asyncio create_server ("ERROR:" header kept by the classifier)
    (
        "sglang",
        "ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', 30000): address already in use",
        C.PORT_IN_USE,
    ),
    # srt/distributed/device_communicators/pynccl_wrapper.py NCCL_CHECK (real 0.5 log)
    ("sglang", "RuntimeError: NCCL error: remote process exited or there was a network error", C.NCCL_OR_DISTRIBUTED),
    # torch/cuda/__init__.py _lazy_init
    (
        "sglang",
        "RuntimeError: Found no NVIDIA driver on your system. Please check that you have an NVIDIA GPU and "
        "installed a driver from http://www.nvidia.com/Download/index.aspx",
        C.CUDA_DRIVER,
    ),
    ("sglang", "ModuleNotFoundError: No module named 'sgl_kernel'", C.IMPORT_ERROR),
    # CPython runpy when the package is missing from the interpreter
    ("sglang", "/usr/bin/python3: No module named sglang", C.IMPORT_ERROR),
    # argparse in srt/server_args.py
    ("sglang", "launch_server.py: error: unrecognized arguments: --max-model-len 4096", C.CONFIG_ERROR),
    ("sglang", "launch_server.py: error: argument --mem-fraction-static: invalid float value: 'high'", C.CONFIG_ERROR),
    # srt/configs/model_config.py
    (
        "sglang",
        "ValueError: User-specified context_length (262144) is greater than the derived context_length "
        "(32768). This may lead to incorrect model outputs or CUDA errors.",
        C.CONFIG_ERROR,
    ),
    # bash after sglang's kill_process_tree (real log, issue #2468)
    ("sglang", "Killed", C.KILLED),
    # engine.py sigchld/scheduler watchdog, 0.5.9 format with the exit code on the same line
    ("sglang", "Rank 0 scheduler is dead. Exit code: -9", C.KILLED),
    # flashinfer JIT assertion in a real start-up log: nothing specific, caught by the last resort
    ("sglang", "AssertionError: fp8 tensor core is not supported in fa2 backend", C.OTHER),
    # ---------------------------------------------------------------- vLLM
    # vllm/worker/worker.py raise_if_cache_size_invalid (V0)
    (
        "vllm",
        "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when "
        "initializing the engine.",
        C.GPU_OOM,
    ),
    (
        "vllm",
        "ValueError: The model's max seq len (32768) is larger than the maximum number of tokens that can be "
        "stored in KV cache (22032). Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when "
        "initializing the engine.",
        C.GPU_OOM,
    ),
    # vllm/v1/core/kv_cache_utils.py _check_enough_kv_cache_memory (V1), engine-core header kept
    (
        "vllm",
        "ERROR 09-18 21:38:02 [core.py:1374] ValueError: To serve at least one request with the models's max seq "
        "len (262144), (24.0 GiB KV cache is needed, which is larger than the available KV cache memory "
        "(9.05 GiB). Based on the available memory, the estimated maximum model length is 98304.",
        C.GPU_OOM,
    ),
    # vllm/v1/worker/utils.py request_memory
    (
        "vllm",
        "ERROR 08-18 20:42:54 [multiproc_executor.py:901] ValueError: Free memory on device cuda:0 "
        "(52.81/95.01 GiB) on startup is less than desired GPU memory utilization (0.9, 85.51 GiB). Decrease "
        "GPU memory utilization or reduce GPU memory used by other processes.",
        C.GPU_OOM,
    ),
    ("vllm", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 28.00 MiB.", C.GPU_OOM),
    # vllm/config (ModelConfig) __post_init__
    ("vllm", "ValueError: Invalid repository ID or local directory specified: '/mnt/models'.", C.MODEL_NOT_FOUND),
    # the same inside pydantic's message line (APIServer process)
    (
        "vllm",
        "  Value error, Invalid repository ID or local directory specified: '/models/x'. Please verify the "
        "following requirements: [type=value_error, input_value=ArgsKwargs((), {...}), input_type=ArgsKwargs]",
        C.MODEL_NOT_FOUND,
    ),
    # huggingface_hub file_download.py, offline
    (
        "vllm",
        "huggingface_hub.errors.LocalEntryNotFoundError: Cannot find the requested files in the disk cache and "
        "outgoing traffic has been disabled. To enable hf.co look-ups and downloads online, set "
        "'local_files_only' to False.",
        C.MODEL_NOT_FOUND,
    ),
    # vllm/model_executor/models/registry.py (v0.10+, inside pydantic's message)
    (
        "vllm",
        "Value error, Model architectures ['DeepseekOCRForCausalLM'] are not supported for now. Supported "
        "architectures: dict_keys(['ApertusForCausalLM', 'AquilaModel'])",
        C.UNSUPPORTED_MODEL,
    ),
    (
        "vllm",
        "ValueError: Model architectures ['Qwen3NextForCausalLM'] failed to be inspected. Please check the logs "
        "for more details.",
        C.UNSUPPORTED_MODEL,
    ),
    # transformers/models/auto/configuration_auto.py
    (
        "vllm",
        "ValueError: The checkpoint you are trying to load has model type `qwen9` but Transformers does not "
        "recognize this architecture.",
        C.UNSUPPORTED_MODEL,
    ),
    # Python socket bind in api_server.py create_server_socket (vLLM binds before the engine starts)
    ("vllm", "OSError: [Errno 98] Address already in use", C.PORT_IN_USE),
    # torch/distributed ProcessGroupNCCL
    (
        "vllm",
        "torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/"
        "ProcessGroupNCCL.cpp:3356, unhandled cuda error (run with NCCL_DEBUG=INFO for details)",
        C.NCCL_OR_DISTRIBUTED,
    ),
    ("vllm", "ncclUnhandledCudaError: Call to CUDA function failed.", C.NCCL_OR_DISTRIBUTED),
    # vllm/platforms (no accelerator found)
    ("vllm", "RuntimeError: Failed to infer device type", C.CUDA_DRIVER),
    ("vllm", "RuntimeError: CUDA error: no CUDA-capable device is detected", C.CUDA_DRIVER),
    (
        "vllm",
        "RuntimeError: The NVIDIA driver on your system is too old (found version 11040). Please update your "
        "GPU driver by downloading and installing a new version",
        C.CUDA_DRIVER,
    ),
    (
        "vllm",
        "ImportError: /usr/local/lib/python3.12/dist-packages/vllm/_C.abi3.so: undefined symbol: "
        "_ZN3c104cuda9SetDeviceEi",
        C.IMPORT_ERROR,
    ),
    ("vllm", "ModuleNotFoundError: No module named 'vllm._C'", C.IMPORT_ERROR),
    # argparse (FlexibleArgumentParser), prog "api_server.py" for the module form
    ("vllm", "api_server.py: error: unrecognized arguments: --num-scheduler-steps=8", C.CONFIG_ERROR),
    (
        "vllm",
        "api_server.py: error: argument --dtype: invalid choice: 'fp64' (choose from auto, half, float16, "
        "bfloat16, float, float32)",
        C.CONFIG_ERROR,
    ),
    (
        "vllm",
        "  Value error, max_num_batched_tokens (512) must be greater than or equal to max_num_seqs (1024). "
        "[type=value_error, input_value=ArgsKwargs((), {...}), input_type=ArgsKwargs]",
        C.CONFIG_ERROR,
    ),
    (
        "vllm",
        "ValueError: Total number of attention heads (30) must be divisible by tensor parallel size (4).",
        C.CONFIG_ERROR,
    ),
    ("vllm", "sh: line 1:  4242 Killed                  python3 -m vllm.entrypoints.openai.api_server", C.KILLED),
    # a worker traceback's last line in a real log (vllm-ascend, qwen3_moe.py): nothing specific
    (
        "vllm",
        "ERROR 07-15 08:54:44 [multiproc_executor.py:522] RuntimeError: shape '[2048, 2048]' is invalid for "
        "input of size 16777216",
        C.OTHER,
    ),
    # ---------------------------------------------------------------- llama.cpp
    # ggml-cuda.cu ggml_backend_cuda_buffer_type_alloc_buffer
    (
        "llamacpp",
        "ggml_backend_cuda_buffer_type_alloc_buffer: allocating 11736.39 MiB on device 0: cudaMalloc "
        "failed: out of memory",
        C.GPU_OOM,
    ),
    ("llamacpp", "llama_model_load: error loading model: unable to allocate CUDA0 buffer", C.GPU_OOM),
    ("llamacpp", "alloc_tensor_range: failed to allocate CUDA0 buffer of size 12306496768", C.GPU_OOM),
    # ggml/src/gguf.cpp gguf_init_from_file (newer builds: level letter "E" in front)
    (
        "llamacpp",
        "E gguf_init_from_file: failed to open GGUF file '/models/does-not-exist.gguf' (No such file or directory)",
        C.MODEL_NOT_FOUND,
    ),
    (
        "llamacpp",
        "E llama_model_load: error loading model: tensor 'blk.1.ffn_down.weight' data is not within the "
        "file bounds, model is corrupted or incomplete",
        C.MODEL_NOT_FOUND,
    ),
    # llama-cpp-python llama_cpp/llama.py and _internals.py
    ("llamacpp", "ValueError: Model path does not exist: /models/tiny.gguf", C.MODEL_NOT_FOUND),
    ("llamacpp", "ValueError: Failed to load model from file: /models/tiny.gguf", C.MODEL_NOT_FOUND),
    # src/llama-model.cpp llm_arch_from_string
    (
        "llamacpp",
        "E llama_model_load: error loading model: unknown model architecture: 'notarealarch'",
        C.UNSUPPORTED_MODEL,
    ),
    # tools/server/server.cpp (b6xxx+ "srv start:", older "main:")
    (
        "llamacpp",
        "E srv         start: couldn't bind HTTP server socket, hostname: 127.0.0.1, port: 40077",
        C.PORT_IN_USE,
    ),
    ("llamacpp", "main: couldn't bind HTTP server socket, hostname: 127.0.0.1, port: 8080", C.PORT_IN_USE),
    # llama-cpp-python runs uvicorn
    (
        "llamacpp",
        "ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', 8000): address already in use",
        C.PORT_IN_USE,
    ),
    # ggml-cuda.cu ggml_cuda_error (fatal CUDA call)
    ("llamacpp", "CUDA error: CUDA driver version is insufficient for CUDA runtime version", C.CUDA_DRIVER),
    ("llamacpp", "NCCL error: unhandled system error", C.NCCL_OR_DISTRIBUTED),
    # the detach wrapper's sh (dash / bash) when the binary is not on PATH
    ("llamacpp", "sh: 5: llama-server: not found", C.IMPORT_ERROR),
    ("llamacpp", "sh: line 5: llama-server: command not found", C.IMPORT_ERROR),
    (
        "llamacpp",
        "llama-server: error while loading shared libraries: libggml.so: cannot open shared object file: "
        "No such file or directory",
        C.IMPORT_ERROR,
    ),
    ("llamacpp", "ModuleNotFoundError: No module named 'llama_cpp'", C.IMPORT_ERROR),
    # common/arg.cpp
    ("llamacpp", "error: invalid argument: --no-such-flag", C.CONFIG_ERROR),
    (
        "llamacpp",
        'error while handling argument "--draft-max": the argument has been removed. use '
        "--spec-draft-n-max or --spec-ngram-mod-n-max",
        C.CONFIG_ERROR,
    ),
    ("llamacpp", "llama_init_from_model: quantized V cache requires flash_attn to be enabled", C.CONFIG_ERROR),
    ("llamacpp", "Killed", C.KILLED),
    ("llamacpp", "llama_model_load: error loading model: missing tensor 'blk.0.attn_q.weight'", C.OTHER),
    # ---------------------------------------------------------------- TGI
    # server/text_generation_server/models/flash_causal_lm.py warmup
    (
        "tgi",
        "RuntimeError: Not enough memory to handle 4096 prefill tokens. You need to decrease "
        "`--max-batch-prefill-tokens`",
        C.GPU_OOM,
    ),
    # backends/v3/src/lib.rs V3Error::NotEnoughMemory
    ("tgi", 'Error: Backend(Warmup(Generation("Not enough memory to handle `max_total_tokens=4096`")))', C.GPU_OOM),
    # huggingface_hub utils/_http.py hf_raise_for_status
    (
        "tgi",
        "Repository Not Found for url: https://huggingface.co/api/models/foo/bar/revision/main.",
        C.MODEL_NOT_FOUND,
    ),
    # server/text_generation_server/models/__init__.py get_model
    ("tgi", "ValueError: Unsupported model type foo", C.UNSUPPORTED_MODEL),
    # router/src/server.rs (TcpListener::bind)
    (
        "tgi",
        "2025-01-01T00:00:00.000000Z ERROR text_generation_router::server: router/src/server.rs:2325: Failed to "
        "bind to 0.0.0.0:8080: Address already in use (os error 98)",
        C.PORT_IN_USE,
    ),
    (
        "tgi",
        "torch.distributed.DistNetworkError: The server socket has failed to listen on any local network "
        "address. port: 29500, useIPv6: 0, code: -98, name: EADDRINUSE, message: address already in use",
        C.PORT_IN_USE,
    ),
    ("tgi", "RuntimeError: NCCL error: unhandled cuda error", C.NCCL_OR_DISTRIBUTED),
    ("tgi", "RuntimeError: No CUDA GPUs are available", C.CUDA_DRIVER),
    # launcher/src/main.rs shard_manager / download
    (
        "tgi",
        "2025-01-01T00:00:00.000000Z ERROR text_generation_launcher: text-generation-server not found in PATH",
        C.IMPORT_ERROR,
    ),
    # launcher/src/main.rs: main returns Result<(), LauncherError> -> Debug print
    ("tgi", 'Error: ArgumentValidation("`max_input_tokens` must be < `max_total_tokens`")', C.CONFIG_ERROR),
    ("tgi", 'Error: NotEnoughCUDADevices("`num_shard=2` but only 1 GPU is visible")', C.CONFIG_ERROR),
    (
        "tgi",
        "2025-01-01T00:00:00.000000Z ERROR shard-manager: text_generation_launcher: Shard process was "
        "signaled to shutdown with signal 9 rank=0",
        C.KILLED,
    ),
    ("tgi", "KeyError: 'model.layers.0.self_attn.q_proj.weight'", C.OTHER),
    # ---------------------------------------------------------------- sim (prints SGLang's / vLLM's words)
    ("sim", "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.", C.GPU_OOM),
    (
        "sim",
        "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when "
        "initializing the engine.",
        C.GPU_OOM,
    ),
    (
        "sim",
        "OSError: /models/none is not a local folder and is not a valid model identifier listed on "
        "'https://huggingface.co/models'",
        C.MODEL_NOT_FOUND,
    ),
    (
        "sim",
        "ValueError: Model architectures ['FooForCausalLM'] are not supported for now. Supported "
        "architectures: dict_keys([])",
        C.UNSUPPORTED_MODEL,
    ),
    ("sim", "OSError: [Errno 98] Address already in use", C.PORT_IN_USE),
    ("sim", "RuntimeError: NCCL error: unhandled system error", C.NCCL_OR_DISTRIBUTED),
    ("sim", "RuntimeError: CUDA driver version is insufficient for CUDA runtime version", C.CUDA_DRIVER),
    ("sim", "ModuleNotFoundError: No module named 'flashinfer'", C.IMPORT_ERROR),
    ("sim", "launch_server.py: error: unrecognized arguments: --bogus", C.CONFIG_ERROR),
    ("sim", "Killed", C.KILLED),
    ("sim", "RuntimeError: something unexpected", C.OTHER),
    # ---------------------------------------------------------------- openai (generic signatures only)
    ("openai", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB.", C.GPU_OOM),
    (
        "openai",
        "OSError: Can't load tokenizer for '/models/tiny'. If you were trying to load it from "
        "'https://huggingface.co/models', make sure you don't have a local directory with the same name.",
        C.MODEL_NOT_FOUND,
    ),
    # transformers/utils/import_utils.py SENTENCEPIECE_IMPORT_ERROR: a missing tokenizer.json in disguise
    (
        "openai",
        "LlamaTokenizer requires the SentencePiece library but it was not found in your environment. "
        "Checkout the instructions on the installation page of its repo",
        C.MODEL_NOT_FOUND,
    ),
    (
        "openai",
        "ValueError: The checkpoint you are trying to load has model type `foo` but Transformers does not "
        "recognize this architecture. This could be because of an issue with the checkpoint, or because "
        "your version of Transformers is out of date.",
        C.UNSUPPORTED_MODEL,
    ),
    (
        "openai",
        "ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', 8000): address already in use",
        C.PORT_IN_USE,
    ),
    (
        "openai",
        "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error",
        C.NCCL_OR_DISTRIBUTED,
    ),
    ("openai", "RuntimeError: Found no NVIDIA driver on your system.", C.CUDA_DRIVER),
    (
        "openai",
        "ImportError: cannot import name 'is_torch_greater_or_equal' from 'transformers.utils'",
        C.IMPORT_ERROR,
    ),
    ("openai", "serve.py: error: the following arguments are required: --model", C.CONFIG_ERROR),
    # pydantic v2 ValidationError message lines ("1 validation error for X" is a wrapper above them)
    (
        "openai",
        "  Input should be a valid integer, unable to parse string as an integer [type=int_parsing, "
        "input_value='x', input_type=str]",
        C.CONFIG_ERROR,
    ),
    ("openai", "Killed", C.KILLED),
    ("openai", "Fatal Python error: Segmentation fault", C.OTHER),
]


@pytest.mark.parametrize(
    ("engine", "line", "category"), FATAL_ROWS, ids=[f"{r[0]}-{r[2].value}-{i}" for i, r in enumerate(FATAL_ROWS)]
)
def test_fatal_line_maps_to_category(engine: str, line: str, category: Category) -> None:
    assert kind_and_category(engine, line) == (K.FATAL, category)


def test_every_engine_covers_every_category() -> None:
    covered = {(engine, category) for engine, _, category in FATAL_ROWS}
    missing = [(e, c.value) for e in MINE for c in Category if (e, c) not in covered]
    assert missing == []


# (engine, line, kind)
WRAPPER_ROWS = [
    # srt/entrypoints/engine.py sigquit_handler
    ("sglang", "Received sigquit from a child process. It usually means the child failed."),
    ("sglang", "Rank 0 scheduler is dead. Please check if there are relevant logs."),
    # srt/managers/scheduler.py run_scheduler_process (the traceback follows)
    ("sglang", "Scheduler hit an exception: Traceback (most recent call last):"),
    ("sglang", "DataParallelController hit an exception: Traceback (most recent call last):"),
    # srt/entrypoints/http_server.py _wait_and_warmup
    ("sglang", "Initialization failed. warmup error: Traceback (most recent call last):"),
    # vllm/v1/engine/utils.py wait_for_engine_startup
    ("vllm", "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}"),
    # vllm/v1/engine/core.py run_engine_core
    ("vllm", "ERROR 08-18 20:42:56 [core.py:1330] EngineCore failed to start."),
    # V1 before 0.8 (core_client.py)
    ("vllm", "RuntimeError: Engine process failed to start. See stack trace for the root cause."),
    (
        "vllm",
        "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) "
        "for the root cause.",
    ),
    # vllm/v1/executor/multiproc_executor.py
    (
        "vllm",
        "Exception: WorkerProc initialization failed due to an exception in a background process. See stack "
        "trace for root cause.",
    ),
    (
        "vllm",
        "ERROR 04-25 03:33:10 [core_client.py:562] Engine core proc EngineCore_DP0 died unexpectedly, "
        "shutting down client.",
    ),
    # pydantic: the message is on the next line
    ("vllm", "pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig"),
    ("llamacpp", "E srv  llama_server: exiting due to HTTP server error"),
    ("llamacpp", "main: exiting due to model loading error"),
    ("llamacpp", "srv    load_model: failed to load model, '/models/tiny.gguf'"),
    (
        "tgi",
        "2025-01-01T00:00:00.000000Z ERROR shard-manager: text_generation_launcher: Shard complete standard "
        "error output:",
    ),
    ("tgi", "Error: ShardCannotStart"),
    ("tgi", "2025-01-01T00:00:00.000000Z ERROR text_generation_launcher: Shard 0 failed to start"),
    ("tgi", "2025-01-01T00:00:00.000000Z ERROR text_generation_launcher: Webserver Crashed"),
    ("sim", "Received sigquit from a child process. It usually means the child failed."),
    ("sim", "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}"),
]


@pytest.mark.parametrize(("engine", "line"), WRAPPER_ROWS)
def test_wrapper_lines_point_elsewhere(engine: str, line: str) -> None:
    assert kind_and_category(engine, line) == (K.WRAPPER, None)


# Lines that look alarming in healthy start-ups: BENIGN (a shield) or nothing at all, never FATAL.
BENIGN_ROWS = [
    # srt/models/registry.py import_model_classes (real 0.5 logs)
    (
        "sglang",
        "Ignore import error when loading sglang.srt.models.gemma4_audio: cannot import name "
        "'Gemma4AudioConfig' from 'transformers' (/usr/lib/python3.10/site-packages/transformers/__init__.py)",
    ),
    (
        "sglang",
        "Ignore import error when loading sglang.srt.multimodal.processors.mimo_v2: No module named 'torchcodec'",
    ),
    # srt/distributed/device_communicators/custom_all_reduce.py on PCIe boxes
    (
        "sglang",
        "Setup Custom allreduce failed with CUDART error: peer access is not supported between these two "
        "devices. To silence this warning, specify --disable-custom-all-reduce explicitly.",
    ),
    # sglang/launch_server.py (0.5.9+), printed by the warnings module
    (
        "sglang",
        "/usr/lib/python3/site-packages/sglang/launch_server.py:51: UserWarning: 'python -m "
        "sglang.launch_server' is still supported, but 'sglang serve' is the recommended entrypoint.",
    ),
    ("sglang", "  warnings.warn("),
    ("sglang", "`torch_dtype` is deprecated! Use `dtype` instead!"),
    ("sglang", "Unexpected error during package walk: cutlass.cute.experimental"),
    (
        "sglang",
        "WARNING model_config.py:1098: Transformers version 5.3.0 is used for model type qwen2. If you "
        "experience issues related to RoPE parameters, they may be due to incompatibilities",
    ),
    ("sglang", "Disable piecewise CUDA graph because --disable-piecewise-cuda-graph is set"),
    ("sglang", "Failed to get GPU memory capacity from nvidia-smi. Falling back to torch.cuda.mem_get_info()."),
    (
        "sglang",
        "/usr/lib/python3/site-packages/fastapi/routing.py:324: FastAPIDeprecationWarning: ORJSONResponse "
        "is deprecated",
    ),
    # the advice block printed under a capture failure must not win over it
    ("sglang", "1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)"),
    # vllm/config/compilation.py: a CUDA-graph mode fallback (with and without its level header)
    (
        "vllm",
        "WARNING 05-14 08:25:39 [compilation.py:1390] CUDAGraphMode.FULL_AND_PIECEWISE is not supported with "
        "spec-decode for attention backend FlashInferBackend (support: AttentionCGSupport."
        "UNIFORM_SINGLE_TOKEN_DECODE); setting cudagraph_mode=PIECEWISE",
    ),
    (
        "vllm",
        "CUDAGraphMode.FULL_AND_PIECEWISE is not supported with TritonMLABackend; setting cudagraph_mode=PIECEWISE",
    ),
    ("vllm", "Skipping CUDA graph capture."),
    (
        "vllm",
        "WARNING 03-11 06:17:30 [registry.py:362] Model architecture Qwen2VLForConditionalGeneration is already "
        "registered, and will be overwritten by the new model class",
    ),
    (
        "vllm",
        'WARNING 05-14 [__init__.py:22] Failed to import from vllm._C with ModuleNotFoundError("No module '
        "named 'vllm._C'\")",
    ),
    ("vllm", "sys:1: DeprecationWarning: builtin type swigvarlink has no __module__ attribute"),
    # torch c10d: IPv6 bind warning before a successful IPv4 bind
    (
        "vllm",
        "[W socket.cpp:464] [c10d] The server socket has failed to bind to [::]:29500 (errno: 98 - Address "
        "already in use).",
    ),
    # torch ProcessGroupNCCL destructor warning at exit (torch >= 2.4)
    (
        "vllm",
        "[rank0]:[W1024 10:00:00.123456 4242 ProcessGroupNCCL.cpp:1496] Warning: WARNING: process group has NOT "
        "been destroyed before we destruct ProcessGroupNCCL. (function operator())",
    ),
    ("llamacpp", "warning: no usable GPU found, --gpu-layers option will be ignored"),
    ("llamacpp", "0.06.031.446 W srv    load_model: speculative decoding will use checkpoints"),
    ("llamacpp", "DEPRECATED: --mlock is deprecated. use --load-mode mlock instead"),
    # ggml-cuda.cu: llama.cpp falls back to the CPU backend
    ("llamacpp", "ggml_cuda_init: failed to initialize CUDA: no CUDA-capable device is detected"),
    (
        "tgi",
        "2025-01-01T00:00:00.000000Z  WARN text_generation_launcher: Bitsandbytes is deprecated, use `eetq` "
        "instead, which provides better latencies overall and is drop-in in most cases.",
    ),
    ("tgi", "2025-01-01T00:00:00.000000Z  INFO text_generation_launcher: Using prefix caching = True"),
    ("openai", 'INFO:     127.0.0.1:40418 - "GET /health HTTP/1.1" 200 OK'),
]


@pytest.mark.parametrize(("engine", "line"), BENIGN_ROWS)
def test_benign_lines_never_fail(engine: str, line: str) -> None:
    kind, _ = kind_and_category(engine, line)
    assert kind in (K.BENIGN, K.PROGRESS, None), kind


# (engine, line, kind, label or None)
LIFECYCLE_ROWS = [
    # srt/entrypoints/http_server.py
    ("sglang", "The server is fired up and ready to roll!", K.READY, "ready"),
    # uvicorn prints before SGLang's warm-up, which can still fail: progress, not ready
    (
        "sglang",
        "INFO:     Uvicorn running on http://127.0.0.1:30000 (Press CTRL+C to quit)",
        K.PROGRESS,
        "HTTP server up, warming up",
    ),
    ("sglang", "Load weight begin. avail mem=22.93 GB", K.PROGRESS, "loading weights"),
    (
        "sglang",
        "Multi-thread loading shards:  25% Completed | 1/4 [00:01<00:03,  1.07s/it]",
        K.PROGRESS,
        "loading weight shards",
    ),
    (
        "sglang",
        "Loading safetensors checkpoint shards:   0% Completed | 0/1 [00:00<?, ?it/s]",
        K.PROGRESS,
        "loading weight shards",
    ),
    (
        "sglang",
        "KV Cache is allocated. #tokens: 327310, K size: 2.50 GB, V size: 2.50 GB",
        K.PROGRESS,
        "allocating KV cache",
    ),
    (
        "sglang",
        "Capture cuda graph begin. This can take up to several minutes. avail mem=4.04 GB",
        K.PROGRESS,
        "capturing CUDA graphs",
    ),
    (
        "sglang",
        "Capturing batches (bs=24 avail_mem=4.00 GB):  14%|█▍        | 1/7 [00:02<00:17,  2.96s/it]",
        K.PROGRESS,
        "capturing CUDA graphs",
    ),
    (
        "sglang",
        "Compiling num tokens (num_tokens=8192):   0%|          | 0/58 [00:00<?, ?it/s]",
        K.PROGRESS,
        "compiling",
    ),
    ("vllm", "INFO:     Application startup complete.", K.READY, "ready"),
    (
        "vllm",
        "INFO 04-25 03:31:53 [weight_utils.py:581] Time spent downloading weights for x: 131.038222 seconds",
        K.PROGRESS,
        "downloading model",
    ),
    (
        "vllm",
        "Loading safetensors checkpoint shards:   0% Completed | 0/10 [00:00<?, ?it/s]",
        K.PROGRESS,
        "loading weight shards",
    ),
    (
        "vllm",
        "INFO 04-25 03:33:08 [default_loader.py:384] Loading weights took 74.58 seconds",
        K.PROGRESS,
        "weights loaded",
    ),
    (
        "vllm",
        "INFO 05-14 08:24:02 [backends.py:548] Dynamo bytecode transform time: 6.07 s",
        K.PROGRESS,
        "compiling (torch.compile)",
    ),
    (
        "vllm",
        "INFO 05-14 08:25:39 [gpu_worker.py:440] Available KV cache memory: 66.58 GiB",
        K.PROGRESS,
        "profiling memory",
    ),
    (
        "vllm",
        "INFO 05-14 08:25:41 [kv_cache_utils.py:1087] GPU KV cache size: 1,390,112 tokens",
        K.PROGRESS,
        "allocating KV cache",
    ),
    (
        "vllm",
        "Capturing CUDA graphs (mixed prefill-decode): 100%|██████████| 51/51",
        K.PROGRESS,
        "capturing CUDA graphs",
    ),
    (
        "vllm",
        "INFO 05-14 08:25:50 [gpu_model_runner.py:2567] Graph capturing finished in 4 secs, took 0.49 GiB",
        K.PROGRESS,
        "CUDA graphs captured",
    ),
    (
        "vllm",
        "INFO 12-18 06:01:05 [api_server.py:1945] Starting vLLM API server 0 on http://0.0.0.0:8080",
        K.PROGRESS,
        "starting HTTP server",
    ),
    ("llamacpp", "main: server is listening on http://127.0.0.1:8080 - starting the main loop", K.READY, "ready"),
    ("llamacpp", "srv  update_slots: all slots are idle", K.READY, "ready"),
    ("llamacpp", "0.00.034.787 I srv  llama_server: listening on http://127.0.0.1:33401", K.READY, "ready"),
    # printed right after the bind, *before* the model loads: not ready
    (
        "llamacpp",
        "main: HTTP server is listening, hostname: 127.0.0.1, port: 8080, http threads: 15",
        K.PROGRESS,
        "HTTP server up, loading model",
    ),
    (
        "llamacpp",
        "load_tensors: loading model tensors, this can take a while... (mmap = true)",
        K.PROGRESS,
        "loading weights",
    ),
    (
        "llamacpp",
        "common_init_from_params: warming up the model with an empty run - please wait ... (--no-warmup to disable)",
        K.PROGRESS,
        "warming up",
    ),
    # llama-cpp-python: uvicorn's startup complete comes before the bind
    ("llamacpp", "INFO:     Application startup complete.", K.PROGRESS, "HTTP server starting"),
    (
        "tgi",
        "2025-01-01T00:00:00.000000Z  INFO text_generation_router::server: router/src/server.rs:2302: Connected",
        K.READY,
        "ready",
    ),
    (
        "tgi",
        "2025-01-01T00:00:00.000000Z  INFO text_generation_launcher: Starting check and download process for "
        "meta-llama/Llama-3.1-8B-Instruct",
        K.PROGRESS,
        "downloading model",
    ),
    (
        "tgi",
        "2025-01-01T00:00:00.000000Z  INFO shard-manager: text_generation_launcher: Waiting for shard to be "
        "ready... rank=0",
        K.PROGRESS,
        "loading weights",
    ),
    (
        "tgi",
        "2025-01-01T00:00:00.000000Z  INFO text_generation_router_v3: backends/v3/src/lib.rs:125: Warming up model",
        K.PROGRESS,
        "warming up",
    ),
    ("sim", "The server is fired up and ready to roll!", K.READY, "ready"),
    ("sim", "Load weight begin. avail mem=78.00 GB", K.PROGRESS, "loading weights"),
    ("openai", "INFO:     Uvicorn running on http://127.0.0.1:8000 (Press CTRL+C to quit)", K.READY, "ready"),
    ("openai", "INFO:     Application startup complete.", K.PROGRESS, "HTTP server starting"),
]


@pytest.mark.parametrize(("engine", "line", "kind", "label"), LIFECYCLE_ROWS)
def test_ready_and_progress_lines(engine: str, line: str, kind: SignalKind, label: str) -> None:
    sig = signature_of(get_engine(engine), line)
    assert sig is not None
    assert (sig.kind, sig.label) == (kind, label)


@pytest.mark.parametrize("engine", MINE)
def test_benign_signatures_come_first(engine: str) -> None:
    """BENIGN shields: no FATAL/WRAPPER signature may precede a BENIGN one."""
    kinds = [s.kind for s in get_engine(engine).signatures]
    last_benign = max(i for i, k in enumerate(kinds) if k is K.BENIGN)
    assert all(k is K.BENIGN for k in kinds[: last_benign + 1])


@pytest.mark.parametrize("engine", MINE)
def test_every_fatal_signature_has_a_category_and_a_hint(engine: str) -> None:
    for sig in get_engine(engine).signatures:
        if sig.kind is K.FATAL:
            assert sig.category is not None and sig.hint, sig.pattern.pattern
        if sig.kind is K.PROGRESS:
            assert sig.label, sig.pattern.pattern


def test_hints_are_engine_native() -> None:
    """The same generic cause gets each engine's own flag names in its hint."""
    line = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
    hints = {e: signature_of(get_engine(e), line).hint for e in ("sglang", "vllm", "llamacpp", "tgi")}
    assert "--mem-fraction-static" in hints["sglang"]
    assert "--gpu-memory-utilization" in hints["vllm"] and "--max-model-len" in hints["vllm"]
    assert "--n-gpu-layers" in hints["llamacpp"]
    assert "--max-batch-prefill-tokens" in hints["tgi"]
    # SGLang's own "Not enough memory" goes the other way: the fraction must be raised
    own = signature_of(
        get_engine("sglang"), "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static."
    )
    assert own.hint.startswith("raise --mem-fraction-static")
    newer = signature_of(
        get_engine("sglang"),
        "ValueError: Loaded weights leave no GPU memory for the KV cache under "
        "--mem-fraction-static=0.001. Raise --mem-fraction-static above 0.007",
    )
    assert newer.hint.startswith("raise --mem-fraction-static")


# (engine, line) that must attribute a log of unknown origin to the engine
DETECT_ROWS = [
    ("sglang", "[2026-04-14 16:08:44 TP0] Load weight begin. avail mem=22.93 GB"),
    (
        "sglang",
        "[2026-04-14 16:09:08 TP0] max_total_num_tokens=327310, chunked_prefill_size=2048, max_prefill_tokens=16384",
    ),
    ("vllm", "(EngineCore_DP0 pid=144388) ERROR 08-18 20:42:56 [core.py:1330] EngineCore failed to start."),
    ("vllm", "INFO 03-11 06:17:30 [api_server.py:912] vLLM API server version 0.7.4.dev360+gc91b64f7"),
    ("llamacpp", "llama_model_loader: loaded meta data with 30 key-value pairs and 339 tensors from /m/x.gguf"),
    ("llamacpp", "main: HTTP server is listening, hostname: 127.0.0.1, port: 8080, http threads: 15"),
    ("tgi", "2025-01-01T00:00:00.000000Z  INFO text_generation_launcher: Starting shard rank=0"),
]


@pytest.mark.parametrize(("engine", "line"), DETECT_ROWS)
def test_detect_attributes_lines_to_their_engine(engine: str, line: str) -> None:
    hits = {e for e in ("sglang", "vllm", "llamacpp", "tgi") if any(p.search(line) for p in get_engine(e).detect)}
    assert hits == {engine}


def test_merged_signatures_keep_every_engines_shields_first() -> None:
    """For a log of unknown origin: SGLang's shield must still beat llama.cpp's generic import rule."""
    from servefleet.engines.generic import merge_signatures

    merged = merge_signatures(get_engine(e).signatures for e in ("llamacpp", "sglang", "vllm"))
    shielded = "Ignore import error when loading sglang.srt.models.x: No module named 'torchcodec'"
    assert next(s for s in merged if s.pattern.search(shielded)).kind is K.BENIGN
    # engine specifics come before the generic rules, and the last resort comes last
    oom = "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static."
    assert next(s for s in merged if s.pattern.search(oom)).hint.startswith("raise --mem-fraction-static")
    assert merged[-1].category is C.OTHER and len({s.pattern.pattern for s in merged}) == len(merged)
