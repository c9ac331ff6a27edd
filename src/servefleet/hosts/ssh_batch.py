"""Many small questions about one SSH host answered by ONE remote command.

``servefleet status`` needs, per server, whether its process group lives, its leader's command
line, the wrapper's exit-code file, who holds its port, and (for a dead one) its log. Asked one
by one that is three or more round trips per server; here a fleet's questions travel as the
arguments of a single POSIX ``sh`` program (built with ``shlex.join`` like every other command,
so paths are never parsed by a shell) and the answers come back as framed records.

Questions are the values of hosts/questions.py, each answered like the Host method of the same job:
``Alive`` (group_alive), ``Owns`` (owns: the leader's /proc command line read, judged here),
``Read`` (read_bytes, None when missing), ``Size`` (file_size), ``Port`` (port_holder), ``Exists``
(``[ -e ]``: never opens the file, e.g. a device), ``GpuApps`` (hosts/gpu_apps.py), ``Tail`` (the file
from ``max(offset, size - limit)`` to its end, and that start: ``status.serving_stall``) and
``ReadIfDead`` (its ``read``, asked only when the group is gone: a dead server's log is needed for its
diagnosis, a live one's may be gigabytes; the answer is keyed as that ``read`` and absent when the
group lives).

Framing: every record starts with a line ``TOKEN INDEX KIND [VALUE]``; file contents follow a
``data`` line raw and end with ``\\nTOKEN INDEX end``. TOKEN is 128 random bits chosen per call,
so no file content can forge a record boundary.
"""

from __future__ import annotations

import re
import secrets
import shlex
from collections.abc import Sequence
from typing import Any

from servefleet.errors import HostError
from servefleet.hosts.base import PortHolder, cmdline_owns, proc_cmdline_path
from servefleet.hosts.gpu_apps import GPU_APPS_FN
from servefleet.hosts.questions import Alive, Exists, GpuApps, Owns, Port, Question, Read, ReadIfDead, Size, Tail
from servefleet.hosts.ssh_scripts import PROC_GROUP_ALIVE_FN, parse_port_holder

__all__ = ["Op", "batch_argv", "parse_batch", "answer_key", "chunk_ops", "MAX_ARGS_BYTES"]

Op = Question

# The whole remote command is one string handed to the login shell's ``-c``; Linux caps a single
# argument at 128 KiB (MAX_ARG_STRLEN). Larger fleets are split into several batches.
MAX_ARGS_BYTES = 96 * 1024

# Same semantics as GROUP_ALIVE / PORT_HOLDER / READ / SIZE in ssh_scripts.py, as functions;
# `ps` and `ss` are asked once for the whole batch (one process table, one socket table) and
# looked up per server, so a batch costs a few processes per server rather than ten.
BATCH = (
    PROC_GROUP_ALIVE_FN
    + GPU_APPS_FN
    + r"""
tok=$1; shift
live=; psdone=0; sstab=; ssdone=0
alive() {
  kill -0 "-$1" 2>/dev/null || return 1
  if command -v ps >/dev/null 2>&1; then
    if [ "$psdone" = 0 ]; then
      live=" $(ps -A -o pgid= -o stat= | awk '$2 !~ /^Z/ { printf "%s ", $1 }') "; psdone=1
    fi
    case $live in *" $1 "*) return 0;; esac
    return 1
  fi
  proc_group_alive "$1"
}
holder() {  # sets h to "holder PID PGID", "holder - -", "" (nobody listens) or "error"
  h=
  if command -v ss >/dev/null 2>&1; then
    if [ "$ssdone" = 0 ]; then
      # one line per listening port: " PORT PID", the first pid ss names for it ("-": none named)
      sstab=$(ss -ltnpH) || { h=error; return; }
      sstab="
$(printf '%s\n' "$sstab" | awk '{ n = split($4, a, ":"); p = a[n]; if (!(p in pid)) pid[p] = "-"
        if (pid[p] == "-" && match($0, /pid=[0-9]+/)) pid[p] = substr($0, RSTART + 4, RLENGTH - 4) }
        END { for (p in pid) print " " p " " pid[p] }')
"
      ssdone=1
    fi
    case $sstab in *"
 $1 "*) ;; *) return 0;; esac
    pid=${sstab#*"
 $1 "}; pid=${pid%%"
"*}
    if [ "$pid" != - ] && { read -r line < "/proc/$pid/stat"; } 2>/dev/null; then
      set -- ${line##*) }; h="holder $pid $3"
    else h="holder - -"; fi
  else
    hex=$(printf '%04X' "$1")
    if grep -qiE "^ *[0-9]+: [0-9A-F]+:$hex [0-9A-F]+:[0-9A-F]+ 0A " /proc/net/tcp /proc/net/tcp6 2>/dev/null; then h="holder - -"; fi
  fi
}
readf() {
  if [ -e "$2" ]; then
    printf '%s %s data\n' "$tok" "$1"
    if [ -n "$4" ]; then tail -c "+$3" -- "$2" | head -c "$4"
    elif [ "$3" = 1 ]; then cat -- "$2"
    else tail -c "+$3" -- "$2"; fi
    printf '\n%s %s end\n' "$tok" "$1"
  else printf '%s %s missing\n' "$tok" "$1"; fi
}
tailf() {  # the file from max(offset, size - limit) to its end, with that start (0-based)
  if [ -e "$2" ]; then
    size=$(wc -c < "$2" | tr -d ' '); start=$((size - $4)); [ "$start" -lt "$3" ] && start=$3
    if [ "$start" -ge "$size" ]; then printf '%s %s missing\n' "$tok" "$1"; return; fi  # nothing past offset
    printf '%s %s tail %s\n' "$tok" "$1" "$start"
    tail -c "+$((start + 1))" -- "$2" | head -c "$((size - start))"
    printf '\n%s %s end\n' "$tok" "$1"
  else printf '%s %s missing\n' "$tok" "$1"; fi
}
i=0
while [ "$#" -gt 0 ]; do
  case $1 in
  alive) if alive "$2"; then r=1; else r=0; fi; printf '%s %s alive %s\n' "$tok" "$i" "$r"; shift 2;;
  size) if [ -e "$2" ]; then printf '%s %s size %s\n' "$tok" "$i" "$(wc -c < "$2" | tr -d ' ')"; else printf '%s %s missing\n' "$tok" "$i"; fi; shift 2;;
  read) readf "$i" "$2" "$3" "$4"; shift 4;;
  tail) tailf "$i" "$2" "$3" "$4"; shift 4;;
  read_if_dead) if alive "$2"; then printf '%s %s skipped\n' "$tok" "$i"; else readf "$i" "$3" "$4" "$5"; fi; shift 5;;
  exists) if [ -e "$2" ]; then r=1; else r=0; fi; printf '%s %s exists %s\n' "$tok" "$i" "$r"; shift 2;;
  port) holder "$2"; printf '%s %s port %s\n' "$tok" "$i" "${h:-none}"; shift 2;;
  gpu_apps) printf '%s %s data\n' "$tok" "$i"; (gpu_apps); printf '\n%s %s end\n' "$tok" "$i"; shift 1;;
  *) echo "unknown question: $1" >&2; exit 2;;
  esac
  i=$((i + 1))
done
"""
)


def _args(op: Op) -> list[str]:
    if isinstance(op, Alive):
        return ["alive", str(int(op.group))]
    if isinstance(op, Owns):
        return ["read", proc_cmdline_path(op.group), "1", ""]
    if isinstance(op, Size):
        return ["size", op.path]
    if isinstance(op, Exists):
        return ["exists", op.path]
    if isinstance(op, Port):
        return ["port", str(int(op.port))]
    if isinstance(op, GpuApps):
        return ["gpu_apps"]
    if isinstance(op, Read):
        return ["read", op.path, str(int(op.offset) + 1), "" if op.limit is None else str(int(op.limit))]
    if isinstance(op, Tail):
        return ["tail", op.path, str(int(op.offset)), str(int(op.limit))]
    if isinstance(op, ReadIfDead):
        return ["read_if_dead", str(int(op.group)), *_args(op.read)[1:]]
    raise ValueError(f"unknown batch question {op!r}")


def answer_key(op: Op) -> Op:
    """The key an answer is stored under: a ``ReadIfDead`` answers its ``read``."""
    return op.read if isinstance(op, ReadIfDead) else op


def batch_argv(ops: Sequence[Op], token: str | None = None) -> tuple[list[str], str]:
    """(``sh -c BATCH sh TOKEN ARGS...``, TOKEN) for ``ops``."""
    token = token or secrets.token_hex(16)
    argv = ["sh", "-c", BATCH, "sh", token]
    for op in ops:
        argv.extend(_args(op))
    return argv, token


def chunk_ops(ops: Sequence[Op], limit: int = MAX_ARGS_BYTES) -> list[list[Op]]:
    """Split ``ops`` so that each batch's quoted command stays under ``limit`` bytes."""
    chunks: list[list[Op]] = []
    current: list[Op] = []
    size = len(shlex.join(batch_argv([], "0" * 32)[0]))
    base = size
    for op in ops:
        cost = len(shlex.join(_args(op))) + 1
        if current and size + cost > limit:
            chunks.append(current)
            current, size = [], base
        current.append(op)
        size += cost
    if current:
        chunks.append(current)
    return chunks


def parse_batch(ops: Sequence[Op], out: bytes, token: str) -> dict[Op, Any]:
    """The answers to ``ops`` from the batch's stdout, keyed by ``answer_key``. A record that is
    missing or malformed raises HostError (the caller falls back to one question at a time)."""
    answers: dict[Op, Any] = {}
    tok = token.encode()
    head = re.compile(rb"(?m)^" + re.escape(tok) + rb" (\d+) (\w+)(?: ([^\n]*))?\n")
    pos = 0
    for index, op in enumerate(ops):
        m = head.match(out, pos)
        if m is None or int(m.group(1)) != index:
            raise HostError(f"batch answer {index} ({type(op).__name__}) is missing or garbled near byte {pos}")
        kind, value = m.group(2).decode(), (m.group(3) or b"").decode(errors="replace")
        pos = m.end()
        key = answer_key(op)
        if kind in ("data", "tail"):
            end = b"\n" + tok + b" %d end\n" % index
            stop = out.find(end, pos)
            if stop < 0:
                raise HostError(f"batch answer {index}: unterminated file content")
            answers[key] = out[pos:stop] if kind == "data" else (int(value), out[pos:stop])
            pos = stop + len(end)
        elif kind == "missing":
            answers[key] = None
        elif kind in ("alive", "exists"):
            answers[key] = value == "1"
        elif kind == "size":
            answers[key] = int(value)
        elif kind == "port":
            if value == "error":
                raise HostError(f"batch answer {index}: ss failed for {op!r}")
            answers[key] = None if value == "none" else _holder(value)
        elif kind == "skipped":
            pass  # read_if_dead on a live group: not asked
        else:
            raise HostError(f"batch answer {index}: unknown record kind {kind!r}")
        if isinstance(key, Owns) and key in answers:
            answers[key] = cmdline_owns(answers[key], key.marker)
    return answers


def _holder(text: str) -> PortHolder | None:
    return parse_port_holder(text)
