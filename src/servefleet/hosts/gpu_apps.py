"""Who holds memory on a host's GPUs: the compute processes ``nvidia-smi`` lists.

One POSIX ``sh`` function (``GPU_APPS_FN``) asks ``nvidia-smi`` for the GPUs (index, uuid) and the
compute processes on them (gpu uuid, pid, name, used MiB), and adds each process's group from
``/proc/PID/stat`` (so that a fleet's own servers, each the leader of its group, are recognised).
It runs alone on a local host (``gpu_apps_argv``) and as one question of the SSH batch
(``ssh_batch``: ``("gpu_apps",)``), so an SSH host is asked in the round trip it costs anyway.
A host without ``nvidia-smi``, or whose driver does not answer, lists nothing: that is no error.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["GpuApp", "GPU_APPS_FN", "gpu_apps_argv", "parse_gpu_apps"]

# Prints "gpu, INDEX, UUID" per GPU, "app, UUID, PID, NAME, MIB" per compute process and
# "pgid, PID, PGID" for each of those pids whose /proc entry this user may read.
GPU_APPS_FN = r"""
gpu_apps() {
  command -v nvidia-smi >/dev/null 2>&1 || return 0
  ga_gpus=$(nvidia-smi --query-gpu=index,uuid --format=csv,noheader,nounits 2>/dev/null) || return 0
  ga_apps=$(nvidia-smi --query-compute-apps=gpu_uuid,pid,process_name,used_memory --format=csv,noheader,nounits 2>/dev/null) || return 0
  printf '%s\n' "$ga_gpus" | sed -n 's/^./gpu, &/p'
  printf '%s\n' "$ga_apps" | sed -n 's/^./app, &/p'
  for ga_pid in $(printf '%s\n' "$ga_apps" | awk -F', *' 'NF >= 2 && $2 ~ /^[0-9]+$/ { print $2 }'); do
    if { read -r ga_line < "/proc/$ga_pid/stat"; } 2>/dev/null; then
      set -- ${ga_line##*) }; printf 'pgid, %s, %s\n' "$ga_pid" "$3"
    fi
  done
}
"""


@dataclass(frozen=True)
class GpuApp:
    """One compute process on one GPU."""

    gpu_index: int | None  # None: nvidia-smi named a GPU uuid it did not list
    gpu_uuid: str
    pid: int
    name: str
    used_mib: int | None  # None: nvidia-smi said "[N/A]" (no permission, MIG)
    pgid: int | None = None  # None: /proc/PID unreadable (another user's, another pid namespace)


def gpu_apps_argv() -> list[str]:
    """The command that prints ``GPU_APPS_FN``'s report on the host it runs on."""
    return ["sh", "-c", GPU_APPS_FN + "gpu_apps\n"]


def _int(text: str) -> int | None:
    try:
        return int(text.strip())
    except ValueError:
        return None


def parse_gpu_apps(text: str) -> list[GpuApp]:
    """The processes in ``GPU_APPS_FN``'s report (lines it does not understand are skipped)."""
    index: dict[str, int] = {}
    pgids: dict[int, int] = {}
    rows: list[tuple[str, int, str, int | None]] = []
    for line in text.splitlines():
        kind, _, rest = line.partition(", ")
        if kind == "gpu":
            number, _, uuid = rest.partition(", ")
            if _int(number) is not None and uuid.strip():
                index[uuid.strip()] = int(number)
        elif kind == "app":
            uuid, _, rest = rest.partition(", ")
            pid_text, _, rest = rest.partition(", ")
            name, _, mib = rest.rpartition(", ")  # a process name may hold ", "; the MiB never does
            pid = _int(pid_text)
            if pid is not None and uuid.strip():
                rows.append((uuid.strip(), pid, name.strip(), _int(mib)))
        elif kind == "pgid":
            pid_text, _, pgid_text = rest.partition(", ")
            pid, pgid = _int(pid_text), _int(pgid_text)
            if pid is not None and pgid is not None:
                pgids[pid] = pgid
    return [GpuApp(index.get(uuid), uuid, pid, name, mib, pgids.get(pid)) for uuid, pid, name, mib in rows]
