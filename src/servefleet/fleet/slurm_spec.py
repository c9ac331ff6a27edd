"""The Slurm fields of a ``[hosts.NAME]`` table (``kind = "slurm"``).

    [hosts.cluster]
    kind = "slurm"
    ssh = "me@login.cluster"       # optional: submit from this login node (the ssh fields apply)
    workdir = "/shared/me/sf"      # on the filesystem the login and compute nodes share
    partition = "gpu"
    account = "proj123"
    qos = "normal"
    time = "04:00:00"              # sbatch --time
    gpus = 1                       # sbatch --gpus (or gres = "gpu:h100:1")
    cpus = 8                       # --cpus-per-task
    mem = "64G"
    constraint = "h100"
    sbatch_args = ["--exclusive"]  # anything else, last (overrides the above)
    poll_interval = 5              # seconds between scheduler questions while waiting
    port_range = [20000, 40000]    # where a job picks its server's port on the node

Every option is sbatch's own (``slurm_script.sbatch_options`` maps them); none is invented.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, field_validator

__all__ = ["SlurmHostFields", "SLURM_OPTION_KEYS"]

SLURM_OPTION_KEYS = ("partition", "account", "qos", "time", "gres", "gpus", "cpus", "mem", "constraint", "sbatch_args")


class SlurmHostFields(BaseModel):
    kind: Literal["ssh", "slurm"] = "ssh"
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time: str | None = None
    gres: str | None = None
    gpus: int | str | None = None
    cpus: int | None = None
    mem: str | None = None
    constraint: str | None = None
    sbatch_args: list[str] = []
    poll_interval: float = 5.0
    port_range: tuple[int, int] = (20000, 40000)

    @field_validator("time", mode="before")
    @classmethod
    def _time(cls, v: Any) -> Any:
        return (
            str(v) if isinstance(v, int) and not isinstance(v, bool) else v
        )  # `time = 60`: minutes, as sbatch reads it

    @field_validator("poll_interval")
    @classmethod
    def _poll(cls, v: float) -> float:
        if v <= 0:
            raise ValueError("must be a positive number of seconds")
        return v

    @field_validator("port_range")
    @classmethod
    def _ports(cls, v: tuple[int, int]) -> tuple[int, int]:
        lo, hi = v
        if not 1024 <= lo < hi <= 65536:
            raise ValueError("must be [LOW, HIGH] with 1024 <= LOW < HIGH <= 65536")
        return v

    def slurm_options(self) -> dict[str, Any]:
        return {key: getattr(self, key) for key in SLURM_OPTION_KEYS}
