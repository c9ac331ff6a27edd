"""Write a complete model folder: config, generation config, tokenizer, safetensors weights, and
optionally a GGUF file — everything an engine needs to load it, with nothing downloaded.

The folder is assembled next to its destination and renamed into place, so an interrupted build
never leaves a half-written model that an engine would then fail on in a confusing way.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from pydantic import BaseModel

from servefleet.errors import ConfigError
from servefleet.modelgen.spec import TinyModelSpec
from servefleet.modelgen.tokenizer import tokenizer_config, train_tokenizer
from servefleet.modelgen.weights import random_weights

__all__ = ["BuildResult", "build_tiny_model", "MARKER_FILE", "GGUF_NAME"]

MARKER_FILE = "servefleet-model.json"  # the spec the folder was built from (lets --force replace it safely)
GGUF_NAME = "model.gguf"


class BuildResult(BaseModel):
    path: str
    arch: str
    parameters: int
    vocab_size: int
    head_dim: int
    dtype: str
    seed: int
    files: list[str]
    gguf_path: str | None = None
    seconds: float


def _write_json(path: Path, data: object) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n", encoding="utf-8")


def _check_destination(dest: Path, force: bool) -> None:
    if not dest.exists():
        return
    if not dest.is_dir():
        raise ConfigError(f"{dest} exists and is not a folder")
    if any(dest.iterdir()):
        if not force:
            raise ConfigError(f"{dest} exists and is not empty; pass --force to replace it")
        if not (dest / MARKER_FILE).exists():
            raise ConfigError(
                f"{dest} was not built by `servefleet model tiny` (no {MARKER_FILE}); refusing to replace it"
            )


def build_tiny_model(
    path: str | os.PathLike[str], spec: TinyModelSpec, *, gguf: bool = False, force: bool = False
) -> BuildResult:
    """Build the model described by ``spec`` into the folder ``path``.

    Raises ConfigError when ``path`` holds something else (a non-empty folder needs ``force``,
    and even then only a folder this function built is replaced)."""
    from safetensors.torch import save_file

    started = time.monotonic()
    dest = Path(path).expanduser().absolute()
    _check_destination(dest, force)
    dest.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{dest.name}.building-", dir=dest.parent))
    try:
        trained = train_tokenizer(spec)
        trained.tokenizer.save(str(work / "tokenizer.json"))
        _write_json(work / "tokenizer_config.json", tokenizer_config(spec, trained))
        _write_json(work / "config.json", spec.hf_config())
        _write_json(work / "generation_config.json", spec.generation_config())
        weights = random_weights(spec)
        save_file(weights, str(work / "model.safetensors"), metadata={"format": "pt"})
        gguf_path = None
        if gguf:
            from servefleet.modelgen.gguf_file import write_gguf

            write_gguf(work / GGUF_NAME, spec, weights, trained)
            gguf_path = str(dest / GGUF_NAME)
        _write_json(work / MARKER_FILE, {"builder": "servefleet model tiny", "spec": spec.model_dump()})
        files = sorted(p.name for p in work.iterdir())
        # mkdtemp makes the folder 0700 and safetensors writes 0600: engines may run as another user.
        os.chmod(work, 0o755)
        for name in files:
            os.chmod(work / name, 0o644)
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(work, dest)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return BuildResult(
        path=str(dest),
        arch=spec.arch,
        parameters=spec.parameter_count(),
        vocab_size=spec.vocab_size,
        head_dim=spec.head_dim,
        dtype=spec.dtype,
        seed=spec.seed,
        files=files,
        gguf_path=gguf_path,
        seconds=round(time.monotonic() - started, 3),
    )
