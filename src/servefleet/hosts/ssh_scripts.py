"""The small POSIX ``sh`` programs SSHHost runs on the remote host, and the parsers of their output.

Each program is passed as ``sh -c PROGRAM sh ARG...`` inside an argument list that is quoted as a
whole with ``shlex.join``: the arguments (paths, model names, anything the user typed) reach the
program as ``$1``, ``$2``... and are never parsed by a shell. The only assumption about the remote
is a POSIX login shell (bash, dash, zsh, ksh) and Linux userland (``/proc``, coreutils, ``ss``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from servefleet.errors import HostError
from servefleet.hosts.base import Launched, PortHolder

__all__ = [
    "MISSING_RC",
    "with_prelude",
    "launch_argv",
    "mark_argv",
    "parse_launch",
    "env_lines",
    "read_argv",
    "size_argv",
    "write_argv",
    "remove_argv",
    "group_alive_argv",
    "pid_stat_argv",
    "signal_argv",
    "port_holder_argv",
    "parse_port_holder",
    "follow_argv",
    "parse_follow_header",
    "watch_argv",
    "parse_watch_exit",
    "probe_argv",
    "parse_probe",
]

# Exit code our programs use for "the file does not exist" (distinct from tail/cat failures).
MISSING_RC = 44

# Runs "$@" in a folder (created if needed) with a virtualenv's bin first on PATH.
PRELUDE = r"""
cwd=$1; venv=$2; shift 2
if [ -n "$cwd" ]; then mkdir -p -- "$cwd" && cd -- "$cwd" || exit 126; fi
if [ -n "$venv" ]; then VIRTUAL_ENV=$venv; PATH=$venv/bin:$PATH; export VIRTUAL_ENV PATH; fi
exec "$@"
"""

# Starts "$@" (the detach wrapper) as the leader of a new session and prints its pid.
# - The environment arrives on stdin, one KEY=VALUE per line, so that secrets never appear in a
#   command line (remote `ps` shows argv to every user; /proc/PID/environ only to the owner).
# - `setsid` forks first when its caller leads a process group, so $! could be the wrong pid:
#   instead the new session leader prints its own $$ before exec'ing the wrapper (exec keeps the
#   pid). The command substitution ends when that process closes our pipe in its exec.
# - Then the group is confirmed alive (or the wrapper's status file says how it ended).
LAUNCH = r"""
log=$1; status=$2; shift 2
while IFS= read -r kv; do export "$kv" || exit 125; done
mkdir -p -- "$(dirname -- "$log")" "$(dirname -- "$status")" || exit 125
rm -f -- "$status"
pid=$(setsid sh -c 'echo "$$"; exec "$@" </dev/null >/dev/null 2>&1' sh "$@" </dev/null 2>/dev/null &)
case $pid in ''|*[!0-9]*) echo "setsid did not start the wrapper (is util-linux installed?)" >&2; exit 125;; esac
echo "$pid"
if kill -0 "-$pid" 2>/dev/null; then echo alive
elif [ -e "$status" ]; then echo "exited $(cat -- "$status")"
else echo gone; fi
"""

# Runs before a launcher program (LAUNCH, or ssh_systemd.LAUNCH), in the same remote command: appends
# the launch marker as a line of its own (a previous attempt that died mid-line gets its line ended
# first), creating the log 0600 and its folders 0700 (umask in a subshell only: the server keeps
# the login's umask), then prints "log SIZE LINES" — where this launch's output starts and the
# newlines before it — and execs the launcher (stdin, the environment, passes through).
MARK = r"""
log=$1; status=$2; marker=$3; shift 3
( umask 077
  mkdir -p -- "$(dirname -- "$log")" "$(dirname -- "$status")" || exit 1
  if [ -s "$log" ] && [ -n "$(tail -c 1 -- "$log")" ]; then echo >> "$log" || exit 1; fi
  printf '%s\n' "$marker" >> "$log" ) || { echo "cannot write the launch marker to $log" >&2; exit 125; }
size=$(wc -c < "$log") && lines=$(wc -l < "$log") || exit 125
echo "log $size $lines"
exec "$@"
"""

READ = r"""
[ -e "$1" ] || exit 44
if [ -n "$3" ]; then tail -c "+$2" -- "$1" | head -c "$3"; else exec tail -c "+$2" -- "$1"; fi
"""

SIZE = r"""
[ -e "$1" ] || exit 44
exec wc -c < "$1"
"""

# Atomic write: a private temporary file next to the target (umask 077, so the content is never
# readable by others even for an instant), flushed, chmod'ed, then renamed over the target.
WRITE = r"""
umask 077
path=$1; mode=$2; tmp="$1.tmp.$$"
mkdir -p -- "$(dirname -- "$path")" || exit 1
if cat > "$tmp" && { sync -- "$tmp" 2>/dev/null || :; } && chmod "$mode" "$tmp" && mv -f -- "$tmp" "$path"; then exit 0; fi
rm -f -- "$tmp"; exit 1
"""

REMOVE = r"""exec rm -f -- "$1" """

# A shell function: any live (non-zombie) process in process group $1, from /proc alone (for hosts
# without ps). The fields of /proc/PID/stat after the last ") " are: state ppid pgrp ... (the command
# name before it may contain spaces). Shared by GROUP_ALIVE and ssh_batch's BATCH.
PROC_GROUP_ALIVE_FN = r"""
proc_group_alive() {
  _group=$1
  for s in /proc/[0-9]*/stat; do
    { read -r line < "$s"; } 2>/dev/null || continue
    set -- ${line##*) }
    [ "$3" = "$_group" ] && [ "$1" != Z ] && return 0
  done
  return 1
}
"""

# Any live (non-zombie) process whose process group is $1? `kill -0` answers "no such group" at
# once; otherwise zombies must be told apart: ps when present, else /proc.
GROUP_ALIVE = (
    PROC_GROUP_ALIVE_FN
    + r"""
want=$1
kill -0 "-$want" 2>/dev/null || exit 1
if command -v ps >/dev/null 2>&1; then
  ps -A -o pgid= -o stat= | awk -v g="$want" '$1 == g && $2 !~ /^Z/ { found = 1 } END { exit !found }'
  exit $?
fi
proc_group_alive "$want"
"""
)

# One process's /proc/PID/stat line (parsed by hosts.pidstat); exit 44 when the pid is gone.
PID_STAT = r"""
cat -- "/proc/$1/stat" 2>/dev/null || exit 44
"""

# `kill -N -PGID` is the one spelling dash, bash and busybox all accept; a gone group is fine.
SIGNAL = r"""
out=$(kill -"$1" -"$2" 2>&1) && exit 0
case $out in *"No such process"*|*"no such process"*) exit 0;; esac
echo "$out" >&2; exit 1
"""

# Who listens on TCP port $1: `ss` names the pid (all of them when we are root or the owner);
# without ss, /proc/net/tcp at least says whether anyone listens (state 0A).
PORT_HOLDER = r"""
port=$1
if command -v ss >/dev/null 2>&1; then
  out=$(ss -ltnpH "sport = :$port") || exit 1
  [ -n "$out" ] || exit 0
  pid=$(printf '%s\n' "$out" | sed -n 's/.*pid=\([0-9][0-9]*\).*/\1/p' | head -n 1)
  if [ -n "$pid" ] && { read -r line < "/proc/$pid/stat"; } 2>/dev/null; then
    set -- ${line##*) }; echo "holder $pid $3"
  else echo "holder - -"; fi
else
  hex=$(printf '%04X' "$port")
  if grep -qiE "^ *[0-9]+: [0-9A-F]+:$hex [0-9A-F]+:[0-9A-F]+ 0A " /proc/net/tcp /proc/net/tcp6 2>/dev/null; then echo "holder - -"; fi
fi
"""

# One streaming follow: a header line "INODE SIZE" (or "- -" when the file is missing), then
# GNU tail's byte stream from byte $2 (1-based) by name (-F: survives rotation, waits for a
# missing file, reports truncation on stderr). --pid makes tail exit within a second when the
# SSH session that started it is gone, instead of lingering until the next write.
FOLLOW = r"""
path=$1; start=$2
if st=$(stat -L -c '%i %s' -- "$path" 2>/dev/null); then echo "$st"; else echo "- -"; fi
if [ "$3" = 1 ]; then exec tail -c "+$start" -F -s 1 --pid="$PPID" -- "$path"; fi
exec tail -c "+$start" -F -s 1 -- "$path"
"""

# FOLLOW plus the server's fate on the same channel: a remote watcher of one server (what a wait
# needs: ssh_follow.watch). stdout is FOLLOW's header and log stream; a background loop writes
# framed lines to stderr (TOKEN: 128 random bits per stream, so neither tail's notices nor
# anything else there can forge one):
#   "TOKEN exit CODE|- SIZE|-"  the group is gone (or the status file appeared): the wrapper's
#                               code ("-": none) and the log's size then, so the local side
#                               delivers every byte before the exit
#   "TOKEN hb"                  every $7 seconds: a silent link is noticed without a command
# It costs no process per tick while the group's leader lives: `kill -0`, `[ -e ]` and the
# leader's /proc stat line are shell builtins; `sleep` is the one fork. Only when the leader is
# gone or a zombie is the whole process table scanned (ps, else /proc), and at most every 0.5 s.
# The loop ends with the stream ($$ is the shell that becomes tail; printf fails once the
# session's pipe is closed). Arguments: PATH START TAILPID TOKEN PGID STATUS HEARTBEAT_S; an
# empty PATH watches the process only.
WATCH = (
    PROC_GROUP_ALIVE_FN
    + r"""
path=$1; start=$2; tailpid=$3; tok=$4; pgid=$5; status=$6; hb=$7
if sleep 0.01 2>/dev/null; then tick=0.1; per_s=10; else tick=1; per_s=1; fi
hbt=$((hb * per_s)); [ "$hbt" -ge 1 ] || hbt=1
group_live() {
  kill -0 "-$1" 2>/dev/null || return 1
  if { read -r _line < "/proc/$1/stat"; } 2>/dev/null; then
    _rest=${_line##*) }
    [ "${_rest%% *}" != Z ] && return 0
  fi
  scan=$((scan + 1)); [ "$scan" -ge 5 ] || return 0
  scan=0
  if command -v ps >/dev/null 2>&1; then
    ps -A -o pgid= -o stat= | awk -v g="$1" '$1 == g && $2 !~ /^Z/ { found = 1 } END { exit !found }'
    return
  fi
  proc_group_alive "$1"
}
report_exit() {
  code=
  if [ -n "$status" ] && [ -e "$status" ]; then { read -r code < "$status"; } 2>/dev/null; fi
  size=
  if [ -n "$path" ]; then size=$(stat -L -c %s -- "$path" 2>/dev/null); fi
  printf '%s exit %s %s\n' "$tok" "${code:--}" "${size:--}" >&2
}
watch_loop() {
  scan=4; stale=0; n=0; me=$1
  if [ -n "$status" ] && [ -e "$status" ] && [ -n "$pgid" ] && group_live "$pgid"; then stale=1; fi
  while kill -0 "$me" 2>/dev/null; do
    if [ -n "$status" ]; then
      if [ -e "$status" ]; then
        if [ "$stale" = 0 ]; then report_exit; return; fi
      else stale=0; fi
    fi
    if [ -n "$pgid" ] && ! group_live "$pgid"; then report_exit; return; fi
    n=$((n + 1))
    if [ "$n" -ge "$hbt" ]; then printf '%s hb\n' "$tok" >&2 || return; n=0; fi
    sleep "$tick"
  done
}
if [ -z "$path" ]; then echo "- -"; watch_loop "$$"; exit 0; fi
if st=$(stat -L -c '%i %s' -- "$path" 2>/dev/null); then echo "$st"; else echo "- -"; fi
watch_loop "$$" </dev/null >/dev/null &
if [ "$3" = 1 ]; then exec tail -c "+$start" -F -s 1 --pid="$PPID" -- "$path"; fi
exec tail -c "+$start" -F -s 1 -- "$path"
"""
)

PROBE = r"""
printf 'home=%s\n' "$HOME"
if tail --pid="$$" --version >/dev/null 2>&1; then echo tailpid=1; else echo tailpid=0; fi
if command -v setsid >/dev/null 2>&1; then echo setsid=1; else echo setsid=0; fi
"""


def _sh(script: str, *args: str) -> list[str]:
    return ["sh", "-c", script, "sh", *args]


def with_prelude(
    argv: Sequence[str], *, cwd: str | None = None, venv: str | None = None, env: Mapping[str, str] | None = None
) -> list[str]:
    """``argv`` run in ``cwd`` with ``venv`` on PATH and ``env`` set (``env K=V ... argv``)."""
    inner = list(argv)
    if env:
        inner = ["env", *(f"{k}={v}" for k, v in env.items()), *inner]
    if not cwd and not venv:
        return inner
    return _sh(PRELUDE, cwd or "", venv or "", *inner)


def env_lines(env: Mapping[str, str]) -> bytes:
    """The environment for LAUNCH's stdin; a value with a newline cannot be carried (nor is one
    ever meaningful in a server's environment)."""
    for key, value in env.items():
        if "\n" in key or "\n" in value or "\0" in value:
            raise HostError(f"environment variable {key!r} contains a newline or NUL; refusing to pass it")
    return "".join(f"{k}={v}\n" for k, v in env.items()).encode()


def launch_argv(detached: Sequence[str], log_path: str, status_path: str) -> list[str]:
    return _sh(LAUNCH, log_path, status_path, *detached)


def mark_argv(launcher: Sequence[str], log_path: str, status_path: str, marker: str) -> list[str]:
    """``launcher`` (a launch program's argv) preceded by MARK in the same command."""
    return _sh(MARK, log_path, status_path, marker, *launcher)


def parse_launch(stdout: str) -> Launched:
    """The Launched (group, log size after the marker, the marker's line number, state, exit code)
    from MARK and a launcher's output: "log SIZE LINES" (LINES: the newlines before the marker),
    the pid, then alive / exited N / gone. Raises ValueError when the answer is not that."""
    lines = [line.strip() for line in stdout.splitlines() if line.strip()]
    for i, line in enumerate(lines):
        m = re.fullmatch(r"log +(\d+) +(\d+)", line)
        if m is None or i + 1 >= len(lines) or not lines[i + 1].isdigit():
            continue
        state, _, code = (lines[i + 2] if i + 2 < len(lines) else "gone").partition(" ")
        if state not in ("alive", "exited", "gone"):
            raise ValueError(f"unexpected launcher state {state!r}")
        exit_code = int(code) if code.lstrip("-").isdigit() else None
        return Launched(int(lines[i + 1]), int(m[1]), int(m[2]) + 1, state, exit_code)
    raise ValueError("no launch report")


def read_argv(path: str, offset: int, limit: int | None) -> list[str]:
    return _sh(READ, path, str(offset + 1), "" if limit is None else str(limit))


def size_argv(path: str) -> list[str]:
    return _sh(SIZE, path)


def write_argv(path: str, mode: int) -> list[str]:
    return _sh(WRITE, path, format(mode, "o"))


def remove_argv(path: str) -> list[str]:
    return _sh(REMOVE, path)


def group_alive_argv(pgid: int) -> list[str]:
    return _sh(GROUP_ALIVE, str(int(pgid)))


def pid_stat_argv(pid: int) -> list[str]:
    return _sh(PID_STAT, str(int(pid)))


def signal_argv(pgid: int, signum: int) -> list[str]:
    return _sh(SIGNAL, str(int(signum)), str(int(pgid)))


def port_holder_argv(port: int) -> list[str]:
    return _sh(PORT_HOLDER, str(int(port)))


def parse_port_holder(stdout: str) -> PortHolder | None:
    for line in stdout.splitlines():
        m = re.fullmatch(r"holder (\S+) (\S+)", line.strip())
        if m:
            pid, pgid = (None if v == "-" else int(v) for v in m.groups())
            return PortHolder(pid, pgid)
    return None


def follow_argv(path: str, offset: int, tail_has_pid: bool) -> list[str]:
    return _sh(FOLLOW, path, str(offset + 1), "1" if tail_has_pid else "0")


def parse_follow_header(line: bytes) -> tuple[int | None, int | None]:
    """(inode, size) from FOLLOW's first line; (None, None) when the file is missing."""
    parts = line.decode(errors="replace").split()
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        return None, None
    return int(parts[0]), int(parts[1])


def watch_argv(
    path: str | None,
    offset: int,
    tail_has_pid: bool,
    token: str,
    pgid: int | None,
    status_path: str | None,
    heartbeat_s: int,
) -> list[str]:
    return _sh(
        WATCH,
        path or "",
        str(offset + 1),
        "1" if tail_has_pid else "0",
        token,
        "" if pgid is None else str(int(pgid)),
        status_path or "",
        str(int(heartbeat_s)),
    )


def parse_watch_exit(fields: Sequence[str]) -> tuple[int | None, int | None]:
    """(exit code, log size) from the fields after "TOKEN exit"; None where WATCH said "-"."""
    values = [int(f) if f.lstrip("-").isdigit() and f != "-" else None for f in (list(fields) + ["-", "-"])[:2]]
    return values[0], values[1]


def probe_argv() -> list[str]:
    return _sh(PROBE)


def parse_probe(stdout: str) -> dict[str, str]:
    facts: dict[str, str] = {}
    for line in stdout.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            facts[key.strip()] = value
    return facts
