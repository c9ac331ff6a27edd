"""A small TOML writer for fleet files (tables, arrays of tables, inline tables, strings, numbers,
booleans, lists): what ``tune`` writes is read back by ``tomllib``."""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = ["dumps"]

_BARE = re.compile(r"^[A-Za-z0-9_-]+$")


def _key(key: str) -> str:
    return key if _BARE.match(key) else json.dumps(key)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # JSON's escapes are TOML basic-string escapes
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_key(k)} = {_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"cannot write {type(value).__name__} as TOML")


def _is_tables(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, dict) for v in value)


def dumps(data: dict[str, Any]) -> str:
    out: list[str] = []
    top = {k: v for k, v in data.items() if not isinstance(v, dict) and not _is_tables(v)}
    for k, v in top.items():
        out.append(f"{_key(k)} = {_value(v)}")
    for k, v in data.items():
        if k in top:
            continue
        if _is_tables(v):
            for item in v:
                out.append("")
                out.append(f"[[{_key(k)}]]")
                _inline_rest(item, out)
        else:
            out.append("")
            out.append(f"[{_key(k)}]")
            _inline_rest(v, out, [k])
    return "\n".join(out).lstrip("\n") + "\n"


def _inline_rest(table: dict[str, Any], out: list[str], path: list[str] | None = None) -> None:
    """A table's keys; nested tables of ``hosts`` stay tables ([hosts.NAME]), others are inline (env)."""
    subtables = {k: v for k, v in table.items() if isinstance(v, dict) and path == ["hosts"]}
    for k, v in table.items():
        if k not in subtables:
            out.append(f"{_key(k)} = {_value(v)}")
    for k, v in subtables.items():
        out.append("")
        out.append(f"[{'.'.join(_key(p) for p in [*(path or []), k])}]")
        _inline_rest(v, out, [*(path or []), k])
