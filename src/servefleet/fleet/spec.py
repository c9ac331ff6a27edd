"""The fleet file: a TOML description of the servers to run, validated into pydantic models.

A fleet file looks like this (every table but ``[[servers]]`` is optional)::

    [fleet]
    name = "mtp-vs-plain"          # default: the file name without .toml
    state_dir = ".servefleet/x"    # default: .servefleet/<fleet name> next to the fleet file
    timeout = 1800                 # seconds: overall cap of `up`'s wait
    stall = 300                    # seconds without log or probe progress => stalled
    smoke = true                   # one-token request before a server is called ready
    start_shared_gpu = "ordered"   # servers sharing a GPU start one after another ("together": at once)
    max_restarts = 3               # `generate` restarts a dead server at most this many times ...
    restart_window = 600           # ... in this many seconds; past that it is out for good (a crash loop)

    [defaults]                     # merged into every server (a server's own value wins;
    engine = "sglang"              #   env tables are merged, args lists are concatenated:
    model = "/models/Qwen3-8B"     #   defaults first, so a server's later flag overrides)
    args = ["--mem-fraction-static", "0.85"]
    env = { HF_HOME = "/data/hf" }

    [[servers]]
    name = "mtp"                   # [A-Za-z0-9._-], unique: names the state and log files
    port = 30000                   # unique per host
    gpus = [0]                     # -> CUDA_VISIBLE_DEVICES=0 (a list, one int, or "0,1")
    args = ["--speculative-algorithm", "EAGLE"]   # engine-native, passed through untouched

    [[servers]]
    name = "plain"
    port = 30001
    gpus = [1]

A ``[[servers]]`` entry with ``count = N`` is a template: it stands for ``N`` servers named
``NAME-0`` .. ``NAME-(N-1)`` (ports ``port``, ``port + 1``, ...; a Slurm job picks its own port on
the node anyway). ``up`` starts them all; a running ``generate --fleet`` uses whichever are ready
and keeps the count submitted (a dead, preempted or timed-out one is started again).

Server fields: ``name``, ``engine``, ``model``, ``port``, ``host`` (default ``"local"``),
``bind`` (default ``127.0.0.1``), ``gpus``, ``env``, ``args``, ``served_model_name``,
``command`` (the ``openai`` engine's own command, or an override), ``ready_path`` and ``python``
(the interpreter for engines started as ``python -m ...``; on the local host it defaults to the
one running servefleet). ``[hosts.NAME]`` tables describe SSH and Slurm hosts (see ``HostSpec``).
``port``, ``bind`` and ``served_model_name`` may be given the engine's way in ``args`` instead
(``--port``, ``--host``, ``--served-model-name``...); a value in both places must agree
(``servefleet.fleet.native``).

The loader (``servefleet.fleet.loader``) reports every error with the file, the server (by index and name) and the field, e.g.
``fleet.toml: servers[1] "plain": port: must be between 1 and 65535``; unknown fields are
rejected (a typo must not silently fall back to a default).
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any, Literal, get_type_hints

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, create_model, field_validator, model_validator

from servefleet.engines.registry import ENGINES
from servefleet.errors import ConfigError
from servefleet.fleet.slurm_spec import SlurmHostFields
from servefleet.hosts.ssh_options import SSHSettingsError, SSHSpec, ssh_problems

__all__ = ["LOCAL", "FleetSettings", "HostSpec", "ServerDefaults", "ServerSpec", "FleetSpec", "check_name"]

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
LOCAL = "local"
RESERVED_SERVER_NAME = "fleet"


def check_name(value: str) -> str:
    if not _NAME_RE.match(value):
        raise ValueError(
            "must be 1-64 characters of letters, digits, '.', '_' or '-', starting with a letter or digit"
        )
    return value


def _str_list(value: Any, example: str) -> list[str]:
    """A list of strings; numbers are accepted and turned into strings ("--tp", 2)."""
    if isinstance(value, str):
        raise ValueError(f"must be a list of strings, e.g. {example} (a single string is not split)")
    if not isinstance(value, list):
        raise ValueError(f"must be a list of strings, e.g. {example}")
    out = []
    for i, item in enumerate(value):
        if isinstance(item, bool) or not isinstance(item, (str, int, float)):
            raise ValueError(f"item {i} must be a string, got {type(item).__name__}")
        out.append(str(item))
    return out


def _env_table(value: Any) -> dict[str, str]:
    if not isinstance(value, dict):
        raise ValueError('must be a table of NAME = "value", e.g. { HF_HOME = "/data/hf" }')
    out = {}
    for key, item in value.items():
        if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", key):
            raise ValueError(f"{key!r} is not a valid environment variable name")
        if isinstance(item, bool) or not isinstance(item, (str, int, float)):
            raise ValueError(f"{key}: must be a string (quote it)")
        out[key] = str(item)
    return out


def _gpu_tuple(value: Any) -> tuple[int, ...] | None:
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError("must be a list of GPU indices, e.g. [0, 1]")
    if isinstance(value, int):
        items: list[Any] = [value]
    elif isinstance(value, str):
        items = [part.strip() for part in value.split(",") if part.strip()]
    elif isinstance(value, (list, tuple)):
        items = list(value)
    else:
        raise ValueError("must be a list of GPU indices, e.g. [0, 1]")
    gpus = []
    for item in items:
        try:
            gpu = int(item)
        except (TypeError, ValueError):
            raise ValueError(f"{item!r} is not a GPU index; use e.g. [0, 1]") from None
        if isinstance(item, bool) or gpu < 0:
            raise ValueError(f"{item!r} is not a GPU index; use e.g. [0, 1]")
        gpus.append(gpu)
    if len(set(gpus)) != len(gpus):
        raise ValueError("lists a GPU twice")
    return tuple(gpus)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FleetSettings(_Strict):
    """The ``[fleet]`` table."""

    name: str | None = None
    state_dir: str | None = None
    timeout: float = 1800.0
    stall: float = 300.0
    smoke: bool = True
    # "ordered": servers of one host that share a GPU start one after another (see start_order.py)
    start_shared_gpu: Literal["ordered", "together"] = "ordered"
    # A running `generate` restarts a dead server at most max_restarts times in restart_window
    # seconds (a sliding window); past that the server is taken out for good: a crash loop.
    max_restarts: int = Field(3, ge=0)
    restart_window: float = Field(600.0, gt=0)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str | None) -> str | None:
        return None if v is None else check_name(v)

    @field_validator("timeout", "stall")
    @classmethod
    def _positive(cls, v: float) -> float:
        if v <= 0:
            raise ValueError("must be a positive number of seconds")
        return v


def _ssh_settings_model() -> type[BaseModel]:
    """The SSH keys of a host table, one per ``SSHSpec`` field (its type and default): declared
    there once, so every SSH setting can be set from a fleet file. ``destination`` is the table's
    ``ssh`` and ``name`` its NAME (HostSpec declares both)."""
    hints = get_type_hints(SSHSpec)
    table: dict[str, Any] = {}
    for f in dataclasses.fields(SSHSpec):
        if f.name in ("destination", "name"):
            continue
        default = (
            Field(default_factory=f.default_factory) if f.default_factory is not dataclasses.MISSING else f.default
        )
        table[f.name] = (hints[f.name], default)
    return create_model("SSHSettings", __base__=_Strict, **table)


SSH_KEYS = tuple(f.name for f in dataclasses.fields(SSHSpec) if f.name not in ("destination", "name"))
_SSHSettings = _ssh_settings_model()


class HostSpec(SlurmHostFields, _SSHSettings):  # type: ignore[misc,valid-type]  # SSHSpec's fields, built from it (above)
    """A ``[hosts.NAME]`` table: an SSH host, or (``kind = "slurm"``) a Slurm cluster whose jobs
    run the servers, submitted here or on the login node ``ssh`` names (fleet/slurm_spec.py).
    Every ``servefleet.hosts.ssh_options.SSHSpec`` field is a key of the same name (``ssh`` is its
    ``destination``), checked once by ``ssh_problems``; ``ssh_spec`` is the SSHSpec they make."""

    name: str
    ssh: str | None = None  # destination: an alias from ~/.ssh/config, or [user@]host (required unless kind = "slurm")
    python: str | None = None  # interpreter for `python -m` engines (default: python3 on the host)
    # Seconds of unanswered keep-alives after which a silent link (packets dropped) is dead and
    # the host reported unreachable (sets alive_interval and alive_count_max; 15 ~ their
    # defaults); quiet sessions on a live link are not affected.
    alive_timeout: int | None = None
    _ssh: SSHSpec | None = PrivateAttr(default=None)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        check_name(v)
        if v == LOCAL:
            raise ValueError(f'"{LOCAL}" is the built-in local host; choose another name')
        return v

    @field_validator("env", mode="before")
    @classmethod
    def _env(cls, v: Any) -> dict[str, str]:
        return _env_table(v)

    @model_validator(mode="after")
    def _ssh_settings(self) -> HostSpec:
        if self.kind == "ssh" and self.ssh is None:
            raise ValueError('ssh: required field is missing (the destination, e.g. "me@gpu-box"; or kind = "slurm")')
        values = {key: getattr(self, key) for key in SSH_KEYS}
        if self.alive_timeout is not None:
            given = sorted({"alive_interval", "alive_count_max"} & self.model_fields_set)
            if given:
                raise ValueError(f"alive_timeout: set it or {' and '.join(given)}, not both")
            if self.alive_timeout < 1:
                raise ValueError("alive_timeout: must be at least 1 second")
            values.update(SSHSpec.alive_settings(self.alive_timeout))
        try:
            if self.ssh is not None:
                self._ssh = SSHSpec(destination=self.ssh, name=self.name, **values)
            elif problems := ssh_problems(values):  # no SSH: the settings a Slurm host uses still make sense
                raise SSHSettingsError(self.name, problems)
        except SSHSettingsError as exc:
            raise ValueError(
                "; ".join(f"{'ssh' if key == 'destination' else key}: {what}" for key, what in exc.problems)
            ) from None
        return self

    @property
    def ssh_spec(self) -> SSHSpec:
        """How to reach the host (kind = "ssh", or a Slurm host's login node)."""
        if self._ssh is None:
            raise ConfigError(f'[hosts.{self.name}]: an SSH host needs ssh = "user@host"')
        return self._ssh


class ServerDefaults(_Strict):
    """The ``[defaults]`` table: any server field except ``name`` and ``port``."""

    engine: str | None = None
    model: str | None = None
    host: str | None = None
    bind: str | None = None
    gpus: Any = None
    env: dict[str, str] = Field(default_factory=dict)
    args: list[str] = Field(default_factory=list)
    served_model_name: str | None = None
    command: list[str] | None = None
    ready_path: str | None = None
    python: str | None = None

    @field_validator("env", mode="before")
    @classmethod
    def _env(cls, v: Any) -> dict[str, str]:
        return _env_table(v)

    @field_validator("args", mode="before")
    @classmethod
    def _args(cls, v: Any) -> list[str]:
        return _str_list(v, '["--tp", "2"]')

    @field_validator("command", mode="before")
    @classmethod
    def _command(cls, v: Any) -> list[str] | None:
        return None if v is None else _str_list(v, '["python", "-m", "my_server"]')

    @field_validator("gpus", mode="before")
    @classmethod
    def _gpus(cls, v: Any) -> tuple[int, ...] | None:
        return _gpu_tuple(v)


class ServerSpec(_Strict):
    """One ``[[servers]]`` entry after ``[defaults]`` were merged into it."""

    name: str
    engine: str
    model: str | None = None
    port: int
    host: str = LOCAL
    bind: str = "127.0.0.1"
    gpus: tuple[int, ...] | None = None
    env: dict[str, str] = Field(default_factory=dict)
    args: tuple[str, ...] = ()
    served_model_name: str | None = None
    command: tuple[str, ...] | None = None
    ready_path: str | None = None
    python: str | None = None
    template: str | None = (
        None  # the counted [[servers]] entry this one is a copy of (``count``): not a fleet-file field
    )

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        check_name(v)
        if v == RESERVED_SERVER_NAME:
            # the state folder keeps <server>.json records beside its own fleet.json index
            raise ValueError(
                f'"{v}" is reserved (the state folder\'s {v}.json records the fleet file); choose another name'
            )
        return v

    @field_validator("engine")
    @classmethod
    def _engine(cls, v: str) -> str:
        key = v.lower()
        if key not in ENGINES:
            raise ValueError(f"unknown engine {v!r}; known engines: {', '.join(sorted(ENGINES))}")
        return key

    @field_validator("port", mode="before")
    @classmethod
    def _port(cls, v: Any) -> int:
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError("must be an integer port number")
        if not 1 <= v <= 65535:
            raise ValueError("must be between 1 and 65535")
        return v

    @field_validator("env", mode="before")
    @classmethod
    def _env(cls, v: Any) -> dict[str, str]:
        return _env_table(v)

    @field_validator("args", mode="before")
    @classmethod
    def _args(cls, v: Any) -> list[str]:
        return _str_list(v, '["--tp", "2"]')

    @field_validator("command", mode="before")
    @classmethod
    def _command(cls, v: Any) -> list[str] | None:
        return None if v is None else _str_list(v, '["python", "-m", "my_server"]')

    @field_validator("gpus", mode="before")
    @classmethod
    def _gpus(cls, v: Any) -> tuple[int, ...] | None:
        return _gpu_tuple(v)

    @field_validator("ready_path")
    @classmethod
    def _ready_path(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith("/"):
            raise ValueError('must start with "/", e.g. "/health"')
        return v

    @model_validator(mode="after")
    def _engine_needs(self) -> ServerSpec:
        if self.model is None and self.engine != "openai":
            raise ValueError("model: required field is missing (set it here or in [defaults])")
        if self.engine == "openai" and not self.command:
            raise ValueError('command: the openai engine runs your own command; set command = ["...", "..."]')
        return self


class FleetSpec(_Strict):
    """A whole fleet file, validated. ``path`` is absolute; ``state_dir`` is resolved."""

    path: Path
    name: str
    state_dir: Path
    timeout: float
    stall: float
    smoke: bool
    start_shared_gpu: Literal["ordered", "together"] = "ordered"
    max_restarts: int = 3
    restart_window: float = 600.0
    hosts: dict[str, HostSpec] = Field(default_factory=dict)
    servers: tuple[ServerSpec, ...] = ()

    def server(self, name: str) -> ServerSpec:
        for server in self.servers:
            if server.name == name:
                return server
        known = ", ".join(s.name for s in self.servers) or "none"
        raise ConfigError(f"{self.path.name}: no server named {name!r} (servers: {known})")

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.servers]

    @property
    def counted(self) -> list[str]:
        """Servers of a counted template (``count``): the ones a job keeps submitted."""
        return [s.name for s in self.servers if s.template is not None]
