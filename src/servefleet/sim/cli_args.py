"""Command-line options of the sim, generated from :class:`~servefleet.sim.config.SimConfig`.

One parser serves ``python -m servefleet.sim`` and ``servefleet sim`` (which forwards its arguments
here), so both take exactly the same options with the same help. The parser's program name is the
chosen style's (``launch_server.py`` / ``vllm serve``), so a bad argument fails the way that engine's
does: an argparse usage block, ``<prog>: error: ...`` and exit status 2.
"""

from __future__ import annotations

import argparse
import enum
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import ValidationError

from servefleet.sim.config import SimConfig, option_aliases

__all__ = ["build_parser", "parse_config", "parse_args", "RunFlags", "PROGS"]

PROGS = {"sglang": "launch_server.py", "vllm": "vllm serve"}
_DESCRIPTION = (
    "Simulated OpenAI-compatible inference engine (servefleet): prints a real SGLang or vLLM start-up log, "
    "models continuous batching, and injects faults. Timing: see servefleet.sim.theory."
)


@dataclass(frozen=True)
class RunFlags:
    """Options about this invocation, not the simulated server."""

    dry_run: bool = False  # print the configuration and its throughput curve, then exit
    json: bool = False  # with --dry-run: JSON instead of a table


def _unwrap(annotation: Any) -> tuple[Any, bool]:
    """(the type inside Optional, whether None is allowed)."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return (args[0] if len(args) == 1 else annotation), True
    return annotation, False


def build_parser(prog: str = "servefleet sim") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=_DESCRIPTION, allow_abbrev=False)
    for name, field in SimConfig.model_fields.items():
        flags = ["--" + name.replace("_", "-"), *option_aliases(name)]
        kind, _ = _unwrap(field.annotation)
        default = field.default
        help_text = (
            f"{field.description} (default: {default})"
            if default is not None and default is not False
            else field.description
        )
        kw: dict[str, Any] = {"dest": name, "default": argparse.SUPPRESS, "help": help_text}
        if kind is bool:
            parser.add_argument(*flags, action=argparse.BooleanOptionalAction, **kw)
        elif typing.get_origin(kind) is Literal:
            parser.add_argument(*flags, choices=list(typing.get_args(kind)), **kw)
        elif isinstance(kind, type) and issubclass(kind, enum.Enum):
            parser.add_argument(
                *flags, choices=[m.value for m in kind], metavar="{" + ",".join(m.value for m in kind) + "}", **kw
            )
        elif kind in (int, float, str):
            parser.add_argument(*flags, type=kind, metavar=name.upper(), **kw)
        else:  # pragma: no cover - a new field type must be taught here
            raise TypeError(f"SimConfig.{name}: no command-line form for {field.annotation!r}")
    run = parser.add_argument_group("this invocation")
    run.add_argument(
        "--dry-run",
        action="store_true",
        default=False,
        help="print the configuration and its theoretical throughput curve (prompt 128 tokens, "
        "output --default-max-tokens), then exit",
    )
    run.add_argument("--json", action="store_true", default=False, help="with --dry-run: print JSON")
    return parser


def _style_in(argv: Sequence[str]) -> str:
    for i, arg in enumerate(argv):
        if arg == "--style" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--style="):
            return arg.split("=", 1)[1]
    return "sglang"


def parse_args(argv: Sequence[str], help_prog: str = "python -m servefleet.sim") -> tuple[SimConfig, RunFlags]:
    """Parse ``argv``; bad input exits 2 with argparse's message (like a real engine).

    Errors name the style's program (``launch_server.py: error: ...``); ``--help`` names ``help_prog``."""
    argv = list(argv)
    wants_help = any(a in ("-h", "--help") for a in argv)
    parser = build_parser(help_prog if wants_help else PROGS.get(_style_in(argv), help_prog))
    values = vars(parser.parse_args(argv))
    flags = RunFlags(dry_run=values.pop("dry_run"), json=values.pop("json"))
    try:
        return SimConfig(**values), flags
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'options'}: {e['msg']}" for e in exc.errors())
        parser.error(problems)
        raise  # unreachable: parser.error exits


def parse_config(argv: Sequence[str], help_prog: str = "python -m servefleet.sim") -> SimConfig:
    """The SimConfig of ``argv`` (run flags ignored)."""
    return parse_args(argv, help_prog)[0]
