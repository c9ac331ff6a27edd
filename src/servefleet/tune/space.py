"""The space file of ``servefleet tune``: the candidates, as variations of the base fleet's server.

    [tune]                       # optional: how the search runs
    startup = 90                 # seconds one candidate takes to get ready (refuses a --budget below it)
    start_concurrency = 8        # the first measured concurrency (then doubled while throughput grows)
    point_requests = 32          # measured requests per point: at least this many,
    per_concurrency = 4          # and this many times the point's concurrency
    max_concurrency = 4096       # never measured above this (nor above the server's max running)
    margin = 0.05                # stopped early when even its optimistic makespan is 5 % behind the best

    [[candidate]]                # any number; each a name and what it changes
    name = "plain"
    args = []                    # engine-native arguments, after the base server's own
    # gpus = [1], port = 8001    # GPUs of its own: measured beside the candidates of the other GPUs

    [grid]                       # and/or a product: every combination is a candidate
    "--max-num-seqs" = [256, 1024]                  # a flag: each value (false: left out, true: bare flag)
    spec = { plain = [], ngram = ["--speculative-config", '{"method": "ngram"}'] }   # named argument lists

Candidates run in the file's order ([grid] before the [[candidate]] tables when it is written before them).
Only what is checkable without the base fleet is checked here (keys, types, names, an empty space);
:mod:`servefleet.tune.candidates` checks each candidate against the base server.
"""

from __future__ import annotations

import itertools
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servefleet.errors import ConfigError

__all__ = ["Candidate", "TuneSettings", "Space", "load_space", "parse_space", "CANDIDATE_KEYS"]

# what a candidate may change of the base server; args are appended to the base's (inherit_args = false: instead)
CANDIDATE_KEYS = (
    "name",
    "args",
    "env",
    "gpus",
    "port",
    "engine",
    "model",
    "python",
    "served_model_name",
    "command",
    "inherit_args",
)
SETTINGS_KEYS = ("startup", "start_concurrency", "point_requests", "per_concurrency", "max_concurrency", "margin")
_TOP = ("tune", "candidate", "grid")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


@dataclass(frozen=True)
class Candidate:
    name: str
    args: tuple[str, ...] = ()
    overrides: dict[str, Any] = field(default_factory=dict)  # engine, model, env, gpus, ... as given
    inherit_args: bool = True


@dataclass(frozen=True)
class TuneSettings:
    startup_s: float | None = None  # expected seconds to ready of one candidate (None: unknown)
    start_concurrency: int = 8
    point_requests: int = 32  # at least this many measured requests per point
    per_concurrency: int = 4  # and this many times its concurrency
    max_concurrency: int = 4096
    margin: float = 0.05  # a candidate is behind when even its optimistic makespan is this much above the best's


@dataclass(frozen=True)
class Space:
    path: Path
    settings: TuneSettings
    candidates: tuple[Candidate, ...]


def load_space(path: str | Path) -> Space:
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"--space {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--space {path}: cannot be read ({exc})") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path.name}: not valid TOML ({exc})") from exc
    return parse_space(data, path)


def parse_space(data: dict[str, Any], path: Path) -> Space:
    """Validate parsed TOML; a ConfigError lists every problem, each naming the candidate and the key."""
    problems: list[str] = [f"{k}: unknown table or key (known: {', '.join(_TOP)})" for k in data if k not in _TOP]
    settings = _settings(data.get("tune", {}), problems)
    listed: list[Candidate] = []
    raw = data.get("candidate", [])
    if not isinstance(raw, list):
        problems.append("candidate: write [[candidate]] (double brackets: a list of tables)")
        raw = []
    for index, table in enumerate(raw):
        cand = _candidate(table, f"candidate[{index}]", problems)
        if cand is not None:
            listed.append(cand)
    gridded = _grid(data.get("grid"), problems)
    # the order the file gives (tomllib keeps it): candidates run in turn on one GPU, so the first ones are
    # the ones a tight --budget still measures
    keys = list(data)
    grid_first = "grid" in data and "candidate" in data and keys.index("grid") < keys.index("candidate")
    candidates = gridded + listed if grid_first else listed + gridded
    seen: set[str] = set()
    for cand in candidates:
        if cand.name in seen:
            problems.append(f'candidate "{cand.name}": name: duplicate (every candidate needs its own name)')
        seen.add(cand.name)
    if not candidates and not problems:
        problems.append("empty space: no [[candidate]] and no [grid]; list at least one candidate")
    if problems:
        raise ConfigError("\n".join(f"{path.name}: {p}" for p in problems))
    return Space(path=path, settings=settings, candidates=tuple(candidates))


def _settings(raw: Any, problems: list[str]) -> TuneSettings:
    if not isinstance(raw, dict):
        problems.append("tune: must be a table ([tune])")
        return TuneSettings()
    for key in raw:
        if key not in SETTINGS_KEYS:
            problems.append(f"[tune]: {key}: unknown key (known: {', '.join(SETTINGS_KEYS)})")
    out: dict[str, Any] = {}
    for key, name, kind, low in (
        ("startup", "startup_s", float, 0.0),
        ("start_concurrency", "start_concurrency", int, 1),
        ("point_requests", "point_requests", int, 1),
        ("per_concurrency", "per_concurrency", int, 1),
        ("max_concurrency", "max_concurrency", int, 1),
        ("margin", "margin", float, 0.0),
    ):
        if key not in raw:
            continue
        value = raw[key]
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or (kind is int and not isinstance(value, int))
            or value < low
        ):
            problems.append(
                f"[tune]: {key}: must be a {'whole ' if kind is int else ''}number of at least {low:g}, got {value!r}"
            )
            continue
        out[name] = kind(value)
    return TuneSettings(**out)


def _strings(value: Any) -> tuple[str, ...] | None:
    if isinstance(value, list) and all(isinstance(v, str | int | float) and not isinstance(v, bool) for v in value):
        return tuple(str(v) for v in value)
    return None


def _candidate(table: Any, who: str, problems: list[str]) -> Candidate | None:
    if not isinstance(table, dict):
        problems.append(f"{who}: must be a table")
        return None
    name = table.get("name")
    if isinstance(name, str):
        who = f'candidate "{name}"'
    bad = False
    for key in table:
        if key not in CANDIDATE_KEYS:
            problems.append(f"{who}: {key}: unknown key (known: {', '.join(CANDIDATE_KEYS)})")
            bad = True
    if not isinstance(name, str) or not _NAME_RE.match(name):
        problems.append(
            f"{who}: name: required, 1-64 letters, digits, '.', '_' or '-' (it names the temporary server)"
        )
        bad = True
    args = _strings(table.get("args", []))
    if args is None:
        problems.append(f'{who}: args: must be a list of strings, e.g. ["--max-num-seqs", "256"]')
        bad = True
    inherit = table.get("inherit_args", True)
    if not isinstance(inherit, bool):
        problems.append(f"{who}: inherit_args: must be true or false")
        bad = True
    if bad:
        return None
    overrides = {k: v for k, v in table.items() if k not in ("name", "args", "inherit_args")}
    return Candidate(name=str(name), args=args or (), overrides=overrides, inherit_args=bool(inherit))


def _axis(key: str, value: Any, problems: list[str]) -> list[tuple[str, tuple[str, ...]]]:
    """One grid axis as (label, args) choices."""
    if isinstance(value, dict):  # named argument lists
        out = []
        for label, args in value.items():
            got = _strings(args)
            if got is None:
                problems.append(f"[grid]: {key}.{label}: must be a list of strings (the arguments of that choice)")
                continue
            out.append((str(label), got))
        return out
    if not key.startswith("-"):
        problems.append(f'[grid]: {key}: a flag ("--max-num-seqs" = [256, 1024]) or a table of named argument lists')
        return []
    if not isinstance(value, list) or not value:
        problems.append(f"[grid]: {key}: must be a non-empty list of values")
        return []
    flag = key.lstrip("-")
    out = []
    for v in value:
        if v is False:
            out.append((f"no-{flag}", ()))
        elif v is True:
            out.append((flag, (key,)))
        elif isinstance(v, str | int | float):
            out.append((f"{flag}-{v}" if len(str(v)) <= 16 else f"{flag}-{len(out) + 1}", (key, str(v))))
        else:
            problems.append(f"[grid]: {key}: values must be strings, numbers or booleans, got {v!r}")
    return out


def _grid(raw: Any, problems: list[str]) -> list[Candidate]:
    if raw is None:
        return []
    if not isinstance(raw, dict):
        problems.append("grid: must be a table ([grid])")
        return []
    axes = [_axis(k, v, problems) for k, v in raw.items()]
    if not axes or any(not a for a in axes):
        if not axes:
            problems.append("[grid]: empty; give at least one axis")
        return []
    out = []
    for combo in itertools.product(*axes):
        name = re.sub(r"[^A-Za-z0-9._-]+", "-", "_".join(label for label, _ in combo)).strip("-.")[:64] or "grid"
        out.append(Candidate(name=name, args=tuple(a for _, args in combo for a in args)))
    return out
