"""One server's fleet-file fields against the same settings in its engine-native ``args``.

A vLLM user writes ``args = ["--served-model-name", "tiny", "--port", "8001"]``; servefleet must then
request ``tiny`` and probe 8001. Before a server spec is validated, each field the engine's args set
(through the engine profile's flag table) is filled in when the fleet file leaves it out, and a
field given in both places with different values is a configuration error naming both -- found
here, before anything is launched, instead of as a 404 from a healthy server.

Fields and the native facts behind them: ``model`` <- model, ``port`` <- port, ``bind`` <- host,
``served_model_name`` <- served name, and ``gpus`` against the tensor-parallel size (a server cannot span more GPUs than
it is given).
"""

from __future__ import annotations

from collections.abc import Set
from typing import Any

from servefleet.engines.registry import ENGINES, get_engine

__all__ = ["reconcile_native_args"]

# fleet-file field -> native fact (servefleet.engines.native_args.FIELDS)
_SAME = (("model", "model"), ("port", "port"), ("bind", "host"), ("served_model_name", "served_model_name"))
_USED = {fact for _, fact in _SAME} | {"tensor_parallel_size"}


def reconcile_native_args(
    raw: dict[str, Any], from_defaults: Set[str] = frozenset()
) -> tuple[dict[str, Any], list[str]]:
    """(``raw`` with the fields the args set filled in, problems as ``field: message`` lines).

    ``raw`` is one server's table after ``[defaults]`` were merged in; anything malformed (an
    unknown engine, args that are not a list) is left for the spec's own validation to report."""
    engine, args, command = raw.get("engine"), raw.get("args"), raw.get("command")
    if not isinstance(engine, str) or engine.lower() not in ENGINES or not isinstance(args, list):
        return raw, []
    command = command if isinstance(command, list) else []
    profile = get_engine(engine)
    native = profile.native_args([str(a) for a in args], [str(c) for c in command])
    out = dict(raw)
    # A malformed value of a fact servefleet uses is an error here (it cannot know the port of
    # `--port abc`); other malformed flags are the engine's to reject, in its own words.
    problems = [f"args: {msg}" for fact, msg in native.problems.items() if fact in _USED]

    def where(name: str) -> str:
        return f"{name} = {raw[name]!r}" + (" (from [defaults])" if name in from_defaults else "")

    for name, fact in _SAME:
        if fact not in native.values or native.values[fact] is None:
            continue
        theirs = native.values[fact]
        if name not in raw or raw[name] is None:
            out[name] = theirs
        elif str(raw[name]) != str(theirs):
            problems.append(
                f"{name}: {where(name)} conflicts with {native.spelled[fact]!r} in args; "
                f"set it in one place (the {name} field or the engine flag)"
            )
    tp = native.values.get("tensor_parallel_size")
    gpus = raw.get("gpus")
    count = _gpu_count(gpus)
    if isinstance(tp, int) and count is not None and tp > count:
        problems.append(
            f"gpus: {where('gpus')} gives {count} GPU{'s' if count != 1 else ''} but "
            f"{native.spelled['tensor_parallel_size']!r} in args needs {tp}; list {tp} GPUs or lower the flag"
        )
    return out, problems


def _gpu_count(gpus: Any) -> int | None:
    """How many GPUs a raw ``gpus`` value lists (None when absent or malformed)."""
    if isinstance(gpus, bool) or gpus is None:
        return None
    if isinstance(gpus, int):
        return 1
    if isinstance(gpus, str):
        return len([p for p in gpus.split(",") if p.strip()]) or None
    if isinstance(gpus, (list, tuple)):
        return len(gpus) or None
    return None
