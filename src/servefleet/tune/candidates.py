"""A candidate as a fleet: the base fleet file with one server, the base server changed as the
candidate says, written beside the tune's results and validated by the fleet loader itself -- so a
candidate whose args contradict the base (a second port, a TP larger than its GPUs) is refused in the
loader's own words, before anything is launched. Also the winner's fleet file: every server of the
base fleet with the winner's changes."""

from __future__ import annotations

import copy
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servefleet.engines.registry import ENGINES, get_engine
from servefleet.errors import ConfigError
from servefleet.fleet.loader import load_fleet_file, parse_fleet
from servefleet.fleet.spec import FleetSpec
from servefleet.tune.space import Candidate
from servefleet.tune.toml_out import dumps

__all__ = ["BaseFleet", "CandidateFleet", "load_base", "candidate_fleets", "winner_fleet"]


@dataclass(frozen=True)
class BaseFleet:
    path: Path
    raw: dict[str, Any]  # the file as parsed TOML
    spec: FleetSpec
    server: str  # the base server's name
    index: int  # its place in raw["servers"]


@dataclass(frozen=True)
class CandidateFleet:
    candidate: Candidate
    path: Path  # the fleet file written for it
    spec: FleetSpec
    gpus_per_replica: int


def load_base(path: Path, server: str | None) -> BaseFleet:
    spec = load_fleet_file(path)  # every problem of the base itself, in the loader's words
    raw = tomllib.loads(path.expanduser().resolve().read_text(encoding="utf-8"))
    names = spec.names
    chosen = server or names[0]
    if chosen not in names:
        raise ConfigError(f"--server {chosen}: no such server in {path.name} (servers: {', '.join(names)})")
    return BaseFleet(path=path.expanduser().resolve(), raw=raw, spec=spec, server=chosen, index=names.index(chosen))


def _changed(base: dict[str, Any], raw_server: dict[str, Any], cand: Candidate) -> dict[str, Any]:
    """One server table with the candidate's changes (args after the server's own)."""
    server = dict(raw_server)
    if cand.inherit_args:
        server["args"] = [*server.get("args", []), *cand.args]
    else:
        server["args"] = list(cand.args)
    for key, value in cand.overrides.items():
        if key == "env" and isinstance(value, dict) and isinstance(server.get("env", {}), dict):
            server["env"] = {**server.get("env", {}), **value}
        else:
            server[key] = value
    return server


def _data(base: BaseFleet, servers: list[dict[str, Any]], name: str, state_dir: Path, inherit: bool) -> dict[str, Any]:
    data = copy.deepcopy(base.raw)
    fleet = dict(data.get("fleet", {}))
    fleet["name"] = name
    fleet["state_dir"] = str(state_dir)
    data["fleet"] = fleet
    if not inherit and isinstance(data.get("defaults"), dict):
        data["defaults"] = {k: v for k, v in data["defaults"].items() if k != "args"}
    data["servers"] = servers
    return data


def _gpus_per_replica(spec: FleetSpec) -> int:
    server = spec.servers[0]
    if server.gpus:
        return len(server.gpus)
    if server.engine in ENGINES:
        tp = (
            get_engine(server.engine)
            .native_args(list(server.args), list(server.command or ()))
            .values.get("tensor_parallel_size")
        )
        if isinstance(tp, int) and tp > 0:
            return tp
    return 1


def candidate_fleets(base: BaseFleet, candidates: tuple[Candidate, ...], out: Path) -> list[CandidateFleet]:
    """A validated one-server fleet per candidate (written under ``out/fleets``); a ConfigError lists
    every candidate's problems, each line naming the candidate and the key."""
    folder = out / "fleets"
    folder.mkdir(parents=True, exist_ok=True)
    raw_server = base.raw["servers"][base.index]
    problems: list[str] = []
    fleets = []
    for cand in candidates:
        server = _changed(base.raw, raw_server, cand)
        server["name"] = cand.name
        path = folder / f"{cand.name}.toml"
        data = _data(base, [server], f"{base.spec.name}-tune"[:64], out / "state", cand.inherit_args)
        try:
            spec = parse_fleet(data, path)
        except ConfigError as exc:
            for line in str(exc).splitlines():
                line = line.removeprefix(f"{path.name}: ").removeprefix(f'servers[0] "{cand.name}": ')
                problems.append(f'candidate "{cand.name}": {line}')
            continue
        path.write_text(dumps(data))
        fleets.append(CandidateFleet(cand, path, spec, _gpus_per_replica(spec)))
    if problems:
        raise ConfigError("\n".join(problems))
    return fleets


def winner_fleet(base: BaseFleet, cand: Candidate, path: Path, state_dir: Path) -> Path:
    """The base fleet with every server changed as ``cand`` says (the fleet of the real job)."""
    servers = [_changed(base.raw, s, cand) for s in base.raw.get("servers", [])]
    data = _data(base, servers, f"{base.spec.name}-tuned"[:64], state_dir, cand.inherit_args)
    parse_fleet(data, path)  # validated as any fleet file (a candidate valid on one server is on each)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"# servefleet tune: the winner {cand.name!r} on every server of {base.path.name}\n" + dumps(data))
    return path
