"""`servefleet model tiny PATH`: build a random-weight model folder locally (nothing downloaded).

Thin: options become a :class:`~servefleet.modelgen.TinyModelSpec` (a preset with overrides), the
builder writes the folder, and the result is shown as a table or JSON.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from servefleet.cli.failure import CliFailure, ErrorKind
from servefleet.errors import ConfigError

__all__ = ["register"]


class Preset(StrEnum):
    tiny = "tiny"
    small = "small"
    realistic = "realistic"


class ArchChoice(StrEnum):
    llama = "llama"
    qwen2 = "qwen2"


class DTypeChoice(StrEnum):
    float32 = "float32"
    bfloat16 = "bfloat16"
    float16 = "float16"


model_app = typer.Typer(
    name="model",
    help="Build models locally for tests, demos and benchmarks (random weights, a tokenizer trained here).",
    no_args_is_help=True,
)


def _fail(message: str, as_json: bool) -> None:
    """Raise the failure; the root group prints it (and, with --json, the JSON error document)."""
    raise CliFailure(ErrorKind.USAGE, message)


@model_app.command("tiny")
def tiny(
    path: Annotated[
        Path,
        typer.Argument(
            help="Folder to write (created; must be empty or a folder built by this command with --force)."
        ),
    ],
    preset: Annotated[
        Preset,
        typer.Option(
            help="Size preset: tiny (~1M parameters, loads in a second on a CPU), small, "
            "realistic (~0.4B, bf16, head dim 128: for GPUs)."
        ),
    ] = Preset.tiny,
    arch: Annotated[ArchChoice, typer.Option(help="Architecture: Llama or Qwen2 (q/k/v biases).")] = ArchChoice.llama,
    head_dim: Annotated[
        int | None,
        typer.Option("--head-dim", help="Attention head size (vLLM's CPU backend: 32, 64, 80, 96, 112, 128, 256)."),
    ] = None,
    layers: Annotated[int | None, typer.Option(help="Number of decoder layers.")] = None,
    hidden: Annotated[int | None, typer.Option(help="Hidden size.")] = None,
    heads: Annotated[int | None, typer.Option(help="Attention heads (default: hidden / head dim).")] = None,
    kv_heads: Annotated[
        int | None, typer.Option("--kv-heads", help="Key/value heads (default: half the heads).")
    ] = None,
    intermediate: Annotated[int | None, typer.Option(help="MLP intermediate size (default: 3 x hidden).")] = None,
    vocab: Annotated[
        int | None, typer.Option(help="Vocabulary size (the tokenizer is trained to exactly this size).")
    ] = None,
    context: Annotated[int | None, typer.Option(help="max_position_embeddings (context length).")] = None,
    dtype: Annotated[DTypeChoice | None, typer.Option(help="Weight dtype (default: the preset's).")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the random weights (the same seed gives the same files).")] = 0,
    gguf: Annotated[bool, typer.Option("--gguf", help="Also write model.gguf for llama.cpp.")] = False,
    force: Annotated[
        bool, typer.Option("--force", help="Replace PATH if it holds a model built by this command.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")] = False,
) -> None:
    """Build a random-weight Llama/Qwen2 model with a locally trained BPE tokenizer and chat template."""
    from pydantic import ValidationError

    from servefleet.modelgen import build_tiny_model, spec_from_preset

    try:
        spec = spec_from_preset(
            preset.value,
            arch=arch.value,
            head_dim=head_dim,
            num_layers=layers,
            hidden_size=hidden,
            num_heads=heads,
            num_kv_heads=kv_heads,
            intermediate_size=intermediate,
            vocab_size=vocab,
            max_position_embeddings=context,
            dtype=dtype.value if dtype else None,
            seed=seed,
        )
    except ValidationError as exc:
        _fail("; ".join(str(e["msg"]).removeprefix("Value error, ") for e in exc.errors()), as_json)
    except ValueError as exc:
        _fail(str(exc), as_json)
    try:
        result = build_tiny_model(path, spec, gguf=gguf, force=force)
    except ConfigError as exc:
        _fail(str(exc), as_json)
    if as_json:
        typer.echo(result.model_dump_json(indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"built {result.path}", show_header=False)
    table.add_column(style="bold")
    table.add_column()
    table.add_row(
        "architecture",
        f"{spec.architecture} ({spec.num_layers} layers, hidden {spec.hidden_size}, "
        f"{spec.heads} heads / {spec.kv_heads} KV heads of {spec.head_dim})",
    )
    table.add_row("parameters", f"{result.parameters:,} ({result.dtype})")
    table.add_row("vocabulary", f"{result.vocab_size:,} (byte-level BPE trained here, ChatML template)")
    table.add_row("context", f"{spec.max_position_embeddings:,} tokens")
    table.add_row("seed", str(result.seed))
    table.add_row("files", ", ".join(result.files))
    table.add_row("built in", f"{result.seconds:.2f} s")
    Console().print(table)


def register(app: typer.Typer) -> None:
    app.add_typer(model_app, name="model")
