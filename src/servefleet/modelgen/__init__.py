"""Build small random-weight models locally (Llama or Qwen2 architecture, a BPE tokenizer trained
here, optionally a GGUF copy) so the real engines can be run and tested without downloading."""

from servefleet.modelgen.builder import GGUF_NAME, MARKER_FILE, BuildResult, build_tiny_model
from servefleet.modelgen.spec import PRESETS, TinyModelSpec, spec_from_preset

__all__ = [
    "BuildResult",
    "build_tiny_model",
    "TinyModelSpec",
    "PRESETS",
    "spec_from_preset",
    "GGUF_NAME",
    "MARKER_FILE",
]
