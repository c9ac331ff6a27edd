"""Reading the engine-native arguments servefleet itself depends on.

A user writes engine flags the engine's way (``args = ["--served-model-name", "tiny", "--port",
"8001"]``); servefleet must then request ``tiny``, probe port 8001, and so on. Each engine profile
declares an :class:`ArgTable` -- which of its flags set which of the facts in :data:`FIELDS` -- and
:meth:`ArgTable.read` turns an argument list into :class:`NativeArgs` once. The mechanics here know
no engine: flag names, aliases and value types are the profile's.

Parsing follows argparse where engines use it: ``--flag value`` and ``--flag=value``, the last
occurrence wins, a flag with ``many=True`` (``nargs="+"``) takes every value up to the next flag
and keeps the first (vLLM serves under every name given; the first is the one it reports). Other
arguments are skipped untouched.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

__all__ = ["FIELDS", "Flag", "ArgTable", "NativeArgs", "to_int", "to_float", "to_json_object", "to_str"]

# The facts servefleet needs and an engine flag may set.
FIELDS = (
    "model",  # the model path or repo id the engine loads
    "served_model_name",  # the name requests must use and /v1/models lists
    "port",
    "host",  # the address the server binds
    "tensor_parallel_size",  # GPUs one server spans
    "max_running_requests",
    "memory_fraction",  # share of GPU memory the engine takes
    "context_length",
    "speculative",  # a dict: method / algorithm, number of tokens, draft model
)

_NEGATIVE_NUMBER = re.compile(r"^-\d+(?:\.\d*)?$")


# ---- value converters: raise ValueError with words a user acts on -------------------------------
def to_str(text: str) -> str:
    return text


def to_int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError("not a whole number") from None


def to_float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ValueError("not a number") from None


def to_json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON ({exc.msg} at character {exc.pos})") from None
    if not isinstance(value, dict):
        raise ValueError('must be a JSON object, e.g. \'{"method": "ngram"}\'')
    return value


@dataclass(frozen=True)
class Flag:
    """One engine flag (with its aliases) and the fact it sets.

    ``key``: for ``field="speculative"``, the key the value is stored under in the speculative
    dict (without a key the converted value must itself be a dict, merged in). ``convert`` may
    return None: the flag was given with an "engine decides" value (``--max-model-len auto``)."""

    names: tuple[str, ...]
    field: str
    convert: Callable[[str], Any] = to_str
    key: str | None = None
    many: bool = False

    def __post_init__(self) -> None:
        if self.field not in FIELDS:
            raise ValueError(f"unknown native field {self.field!r}; known: {', '.join(FIELDS)}")


@dataclass(frozen=True)
class NativeArgs:
    """What an argument list says about the facts of :data:`FIELDS`.

    ``values``: field -> value (fields not given are absent); ``spelled``: field -> the argument(s)
    as written (``"--port 8001"``), for error messages; ``problems``: field -> a value the engine
    would reject (``"--port 'abc': not a whole number"``); such a field is absent from ``values``."""

    values: Mapping[str, Any] = field(default_factory=dict)
    spelled: Mapping[str, str] = field(default_factory=dict)
    problems: Mapping[str, str] = field(default_factory=dict)

    def __contains__(self, name: str) -> bool:
        return name in self.values

    def get(self, name: str, default: Any = None) -> Any:
        value = self.values.get(name)
        return default if value is None else value

    @property
    def served_model_name(self) -> str | None:
        return self.values.get("served_model_name")

    @property
    def port(self) -> int | None:
        return self.values.get("port")

    @property
    def host(self) -> str | None:
        return self.values.get("host")

    @property
    def tensor_parallel_size(self) -> int | None:
        return self.values.get("tensor_parallel_size")


class ArgTable:
    """An engine's flags that set facts of :data:`FIELDS`.

    ``underscores``: the engine also accepts ``--max_num_seqs`` for ``--max-num-seqs`` (vLLM's
    FlexibleArgumentParser)."""

    def __init__(self, *flags: Flag, underscores: bool = False) -> None:
        self.flags = flags
        self.underscores = underscores
        self._by_name: dict[str, Flag] = {}
        for flag in flags:
            for name in flag.names:
                if name in self._by_name:
                    raise ValueError(f"flag {name} is listed twice")
                self._by_name[name] = flag

    def names_for(self, name: str) -> tuple[str, ...]:
        """Every flag spelling that sets field ``name`` (empty when the engine has none)."""
        return tuple(n for f in self.flags if f.field == name for n in f.names)

    def _lookup(self, token: str) -> tuple[Flag | None, str, str | None]:
        """(flag, name as written, inline value of ``--x=v``) for one argument."""
        if not token.startswith("-") or _NEGATIVE_NUMBER.match(token):
            return None, token, None
        name, eq, inline = token.partition("=")
        key = name
        if self.underscores and name.startswith("--"):
            key = "--" + name[2:].replace("_", "-")
        return self._by_name.get(key), name, inline if eq else None

    def read(self, args: Sequence[str]) -> NativeArgs:
        values: dict[str, Any] = {}
        spelled: dict[str, str] = {}
        problems: dict[str, str] = {}
        spec_parts: dict[str, str] = {}
        args = [str(a) for a in args]
        i = 0
        while i < len(args):
            flag, name, inline = self._lookup(args[i])
            i += 1
            if flag is None:
                continue
            if inline is not None:
                given = [inline]
                written = f"{name}={inline}"
            else:
                given = []
                while i < len(args) and not _is_flag(args[i]) and (flag.many or not given):
                    given.append(args[i])
                    i += 1
                written = " ".join([name, *given])
                if not given:
                    problems[flag.field] = f"{name}: needs a value"
                    continue
            try:
                value = flag.convert(given[0])
            except ValueError as exc:
                problems[flag.field] = f"{name} {given[0]!r}: {exc}"
                continue
            if flag.field == "speculative":
                current = dict(values.get("speculative") or {})  # a copy: merged from several flags
                if flag.key is not None:
                    current[flag.key] = value
                elif isinstance(value, dict):
                    current.update(value)
                values["speculative"] = current
                spec_parts[name] = written
                spelled["speculative"] = " ".join(spec_parts.values())
            else:
                values[flag.field] = value
                spelled[flag.field] = written
        if "speculative" in values:  # read-only like the rest: one parse is shared by every caller
            values["speculative"] = MappingProxyType(values["speculative"])
        return NativeArgs(MappingProxyType(values), MappingProxyType(spelled), MappingProxyType(problems))


def _is_flag(token: str) -> bool:
    return token.startswith("-") and len(token) > 1 and not _NEGATIVE_NUMBER.match(token)
