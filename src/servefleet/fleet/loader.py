"""Loading a fleet file: TOML parsing, ``[defaults]`` merging and error messages that name the
file, the server and the field (``fleet.toml: servers[1] "plain": port: must be between 1 and
65535``). Every problem of a file is reported at once, one per line. The format itself is
described in ``servefleet.fleet.spec``.
"""

from __future__ import annotations

import difflib
import os
import re
import tomllib
from collections.abc import Set as AbstractSet
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from servefleet.errors import ConfigError
from servefleet.fleet.native import reconcile_native_args
from servefleet.fleet.spec import LOCAL, FleetSettings, FleetSpec, HostSpec, ServerDefaults, ServerSpec

__all__ = ["load_fleet_file", "parse_fleet"]

_TOP_LEVEL = ("fleet", "defaults", "servers", "hosts")


def _suggest(word: str, choices: list[str] | tuple[str, ...]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else f" (known: {', '.join(choices)})"


def _field_path(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


def _messages(
    exc: ValidationError, model: type[BaseModel], from_defaults: AbstractSet[str] = frozenset()
) -> list[str]:
    """One ``field: message`` string per pydantic error, in words a user acts on."""
    fields = [f for f in model.model_fields if f not in ("path",)]
    out = []
    for err in exc.errors():
        loc = tuple(err.get("loc", ()))
        msg = str(err.get("msg", "invalid"))
        kind = err.get("type", "")
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
        if kind == "extra_forbidden":
            msg = "unknown field" + _suggest(str(loc[0]), fields)
        elif kind == "missing":
            msg = "required field is missing"
        if not loc:  # model-level check (model_validator): message already starts "field: ..."
            out.append(msg)
            continue
        origin = " (value from [defaults])" if loc and loc[0] in from_defaults else ""
        out.append(f"{_field_path(loc)}: {msg}{origin}")
    return out


def _merge(defaults: ServerDefaults, raw: dict[str, Any]) -> tuple[dict[str, Any], set[str]]:
    """Defaults under a server's own values: env merged, args concatenated, the rest replaced."""
    base = defaults.model_dump(exclude_none=True, exclude_defaults=True)
    merged = dict(raw)
    used = set()
    for key, value in base.items():
        if key == "env":
            if isinstance(raw.get("env", {}), dict):
                merged["env"] = {**value, **raw.get("env", {})}
                used.add("env")
        elif key == "args":
            if isinstance(raw.get("args", []), list):
                merged["args"] = [*value, *raw.get("args", [])]
                used.add("args")
        elif key not in raw:
            merged[key] = value
            used.add(key)
    return merged, used


def parse_fleet(data: dict[str, Any], path: Path) -> FleetSpec:
    """Validate parsed TOML ``data`` from ``path``; raise ConfigError listing every problem."""
    # absolute, as FleetSpec promises: a relative state_dir is placed beside the file, and a server's log
    # and exit-status paths are used from its own working directory
    path = path.expanduser().resolve()
    label = path.name
    problems: list[str] = []

    for key in data:
        if key not in _TOP_LEVEL:
            problems.append(f"{key}: unknown table or key" + _suggest(key, _TOP_LEVEL))

    settings = FleetSettings()
    raw_fleet = data.get("fleet", {})
    if not isinstance(raw_fleet, dict):
        problems.append("fleet: must be a table ([fleet])")
    else:
        try:
            settings = FleetSettings(**raw_fleet)
        except ValidationError as exc:
            problems += [f"[fleet]: {m}" for m in _messages(exc, FleetSettings)]

    defaults = ServerDefaults()
    raw_defaults = data.get("defaults", {})
    if not isinstance(raw_defaults, dict):
        problems.append("defaults: must be a table ([defaults])")
    else:
        try:
            defaults = ServerDefaults(**raw_defaults)
        except ValidationError as exc:
            problems += [f"[defaults]: {m}" for m in _messages(exc, ServerDefaults)]

    hosts: dict[str, HostSpec] = {}
    raw_hosts = data.get("hosts", {})
    if not isinstance(raw_hosts, dict):
        problems.append("hosts: must be tables [hosts.NAME]")
    else:
        for host_name, raw_host in raw_hosts.items():
            if not isinstance(raw_host, dict):
                problems.append(f"[hosts.{host_name}]: must be a table")
                continue
            try:
                hosts[host_name] = HostSpec(name=host_name, **raw_host)
            except ValidationError as exc:
                problems += [f"[hosts.{host_name}]: {m}" for m in _messages(exc, HostSpec)]

    servers: list[ServerSpec] = []
    raw_servers = data.get("servers")
    if raw_servers is None:
        problems.append("no servers: add at least one [[servers]] table")
        raw_servers = []
    elif isinstance(raw_servers, dict):
        problems.append("servers: write [[servers]] (double brackets: a list of tables), not [servers]")
        raw_servers = []
    elif not isinstance(raw_servers, list):
        problems.append("servers: must be a list of [[servers]] tables")
        raw_servers = []

    for index, raw in enumerate(raw_servers):
        who = f"servers[{index}]"
        if not isinstance(raw, dict):
            problems.append(f"{who}: must be a table")
            continue
        if isinstance(raw.get("name"), str):
            who += f' "{raw["name"]}"'
        copies, problem = _counted(raw)
        if problem is not None:
            problems.append(f"{who}: {problem}")
            continue
        for copy in copies:
            merged, from_defaults = _merge(defaults, copy)
            merged, conflicts = reconcile_native_args(merged, from_defaults)  # --port etc. in args
            if conflicts:
                problems += [f"{who}: {m}" for m in conflicts]
                break
            try:
                servers.append(ServerSpec(**merged))
            except ValidationError as exc:
                problems += [f"{who}: {m}" for m in _messages(exc, ServerSpec, from_defaults)]
                break

    seen_names: dict[str, int] = {}
    seen_ports: dict[tuple[str, int], str] = {}
    for index, server in enumerate(servers):
        who = f'server "{server.name}"'
        if server.name in seen_names:
            problems.append(f"{who}: name: duplicate (every server needs its own name)")
        seen_names[server.name] = index
        if server.host != LOCAL and server.host not in hosts:
            known = ", ".join([LOCAL, *hosts])
            problems.append(
                f"{who}: host: unknown host {server.host!r}; define [hosts.{server.host}] (known: {known})"
            )
        addr = (server.host, server.port)
        if addr in seen_ports:
            problems.append(
                f'{who}: port: {server.port} on host "{server.host}" is already used by server "{seen_ports[addr]}"'
            )
        else:
            seen_ports[addr] = server.name

    if problems:
        raise ConfigError("\n".join(f"{label}: {p}" for p in problems))

    name = settings.name or _default_name(path.stem)
    state_dir = Path(settings.state_dir).expanduser() if settings.state_dir else Path(".servefleet") / name
    if not state_dir.is_absolute():
        # normpath: "examples/../demo-out" is shown (and stored) as ".../demo-out"
        state_dir = Path(os.path.normpath(path.parent / state_dir))
    return FleetSpec(
        path=path,
        name=name,
        state_dir=state_dir,
        timeout=settings.timeout,
        stall=settings.stall,
        smoke=settings.smoke,
        start_shared_gpu=settings.start_shared_gpu,
        max_restarts=settings.max_restarts,
        restart_window=settings.restart_window,
        hosts=hosts,
        servers=tuple(servers),
    )


def _counted(raw: dict[str, Any]) -> tuple[list[dict[str, Any]], str | None]:
    """A ``[[servers]]`` entry as the servers it stands for: itself, or with ``count = N`` the
    copies ``NAME-0`` .. ``NAME-(N-1)`` on ports ``port + i``; or why the count is wrong."""
    if "template" in raw:
        return [], "template: unknown field (set by count = N, not written in the file)"
    if "count" not in raw:
        return [raw], None
    count = raw["count"]
    if isinstance(count, bool) or not isinstance(count, int):
        return [], f"count: must be a whole number of servers, got {count!r}"
    if count < 1:
        return [], f"count: must be at least 1, got {count}"
    name = raw.get("name")
    if not isinstance(name, str):
        return [], "name: required field is missing (count = N names its servers NAME-0 .. NAME-(N-1))"
    base = {k: v for k, v in raw.items() if k != "count"}
    port = base.get("port")
    copies = []
    for i in range(count):
        copy = {**base, "name": f"{name}-{i}", "template": name}
        if isinstance(port, int) and not isinstance(port, bool):
            copy["port"] = port + i
        copies.append(copy)
    return copies, None


def _default_name(stem: str) -> str:
    """A fleet name derived from the file name, made safe for a folder name."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "-", stem).strip("-.") or "fleet"
    return cleaned[:64]


def load_fleet_file(path: str | Path) -> FleetSpec:
    """Read and validate a fleet file. Raises ConfigError (file, server, field in the message)."""
    shown = Path(path)
    resolved = shown.expanduser().resolve()
    try:
        text = resolved.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{shown}: fleet file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{shown}: cannot read the fleet file: {exc}") from exc
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{shown.name}: TOML syntax error: {exc}") from exc
    return parse_fleet(data, resolved)
