"""Stable names shared by every layer: server states and failure categories.

These strings are a public contract (``diagnose --json``, tests, users' scripts): never rename them.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["State", "Category", "DEFAULT_HINTS"]


class State(StrEnum):
    LAUNCHING = "launching"
    LOADING = "loading"
    READY = "ready"
    FAILED = "failed"
    STALLED = "stalled"
    UNKNOWN = "unknown"  # `diagnose` only: the file is not a recognised server log


class Category(StrEnum):
    GPU_OOM = "gpu_oom"
    MODEL_NOT_FOUND = "model_not_found"
    UNSUPPORTED_MODEL = "unsupported_model"
    PORT_IN_USE = "port_in_use"
    NCCL_OR_DISTRIBUTED = "nccl_or_distributed"
    CUDA_DRIVER = "cuda_driver"
    IMPORT_ERROR = "import_error"
    CONFIG_ERROR = "config_error"
    KILLED = "killed"
    OTHER = "other"


# Generic one-line hints; engine profiles override them with engine-native flag names.
DEFAULT_HINTS: dict[Category, str] = {
    Category.GPU_OOM: "lower the memory fraction or context length, or use more GPUs (tensor parallel)",
    Category.MODEL_NOT_FOUND: "check the model path or repo id (a local folder must contain config.json)",
    Category.UNSUPPORTED_MODEL: "this engine version does not support the model; try another engine or version",
    Category.PORT_IN_USE: "choose another port, or stop the process that holds it",
    Category.NCCL_OR_DISTRIBUTED: "check GPU visibility, NCCL env (NCCL_DEBUG=INFO) and the tensor-parallel size",
    Category.CUDA_DRIVER: "the CUDA driver/runtime does not match the engine build; check nvidia-smi and the wheel",
    Category.IMPORT_ERROR: "a Python dependency is missing or broken in the server's environment",
    Category.CONFIG_ERROR: "an engine argument is invalid; read the evidence line and the engine's --help",
    Category.KILLED: "the process was killed (SIGKILL / OOM killer); check host RAM (dmesg) or who stopped it",
    Category.OTHER: "read the evidence line and the excerpt around it",
}
