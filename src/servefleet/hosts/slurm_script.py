"""The programs of the Slurm host: the batch job that runs one server, the submit program that
hands it to ``sbatch``, and the ``sbatch`` options built from the host's table.

Like ssh_scripts.py, every program runs as ``sh -c PROGRAM sh ARG...``: each value is an
argument, never parsed by a shell. The server's argv reaches the job as the batch script's own
arguments (``sbatch [options] SCRIPT ARG...``), so nothing is quoted into the script text.

The job, on the compute node:

1. picks the server's port there: a port that binds on every address, tried in an order drawn
   from the job id (two servers' jobs on one node try different ports, and the bind test settles
   the rest), unless the fleet file's ``args`` fixed the port; every argument that carries the
   launch's port slot (engines/base.py PORT_SLOT: the engine writes it where its port goes) gets
   that port in its place;
2. writes where it runs (job id, node, port) to the server's ``.where`` file, atomically;
3. runs the server under the same detach wrapper as every host (hosts/base.py DETACH_SCRIPT):
   output appended to the same log, the exit code in the same status file. Slurm's own output
   (``--output`` = the log, appended) lands in that log too, e.g. slurmstepd's "CANCELLED ... DUE
   TO TIME LIMIT" line;
4. forwards SIGTERM (scancel, a time limit, preemption) to the wrapper and waits for it, so the
   exit code is recorded before the job ends; the advance notice of a time limit
   (``--signal=B:USR1@N``) is written to ``.notice`` (the job id) for servefleet to see:
   generate drains the server and submits its next job before the limit.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from servefleet.hosts.base import DETACH_SCRIPT

__all__ = ["JOB", "SUBMIT", "PICK_PORT", "job_args", "submit_argv", "sbatch_options", "parse_submitted", "job_name"]

# python3 -c PICK_PORT LO SPAN JOBID: a free port of [LO, LO+SPAN), tried in an order drawn from the
# job id: two jobs starting on one node at once try different ports first, even where a block of
# ports is taken. SO_REUSEADDR as servers bind (a port whose old connections linger in TIME_WAIT
# is free for them; a listening one is not).
PICK_PORT = r"""
import random, socket, sys
lo, span, job = (int(a) for a in sys.argv[1:4])
rng = random.Random(job)
for port in [lo + rng.randrange(span) for _ in range(min(span, 512))] + list(range(lo, lo + span)):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(("", port))
    except OSError:
        continue
    finally:
        s.close()
    print(port)
    break
else:
    sys.exit("no free port in %d-%d" % (lo, lo + span - 1))
"""

JOB = r"""#!/bin/sh
log=$1; status=$2; where=$3; old=$4; slot=$5; lo=$6; span=$7; py=$8; detach=$9; shift 9
rm -f -- "$where" "$status" "$status.notice"
port=$old
if [ -n "$slot" ]; then
  for a do
    case "$a" in *"$slot"*) port=$("$py" -c "$PICK" "$lo" "$span" "${SLURM_JOB_ID:-0}" 2>/dev/null) || port=$((lo + ${SLURM_JOB_ID:-0} % span)); break;; esac
  done
  i=0
  for a do
    i=$((i + 1))
    while case "$a" in *"$slot"*) true;; *) false;; esac; do a="${a%%"$slot"*}$port${a#*"$slot"}"; done
    set -- "$@" "$a"
  done
  shift "$i"
fi
umask 077
printf 'job=%s\nnode=%s\nport=%s\n' "${SLURM_JOB_ID:-}" "$(hostname)" "$port" > "$where.tmp" && mv -f -- "$where.tmp" "$where"
echo "servefleet: Slurm job ${SLURM_JOB_ID:-?} on $(hostname), port $port" >> "$log"
sh -c "$detach" sh "$log" "$status" "$@" &
child=$!
trap 'kill -TERM "$child" 2>/dev/null' TERM INT HUP
trap 'echo "${SLURM_JOB_ID:-}" > "$status.notice"' USR1
wait "$child"; rc=$?
while kill -0 "$child" 2>/dev/null; do wait "$child"; rc=$?; done
exit "$rc"
"""

# Runs on the submitting machine (this one, or the login node over SSH), after ssh_scripts.MARK:
# writes the job script, takes the server's environment from stdin (KEY=VALUE lines; sbatch
# passes the submitting environment to the job), submits, prints the job id and "alive".
SUBMIT = r"""
jobfile=$1; job=$2; where=$3; status=$4; cwd=$5; shift 5
umask 077
rm -f -- "$where" "$status" || exit 125
mkdir -p -- "$(dirname -- "$jobfile")" && printf '%s' "$job" > "$jobfile" && chmod 700 "$jobfile" || exit 125
while IFS= read -r kv; do export "$kv" || exit 125; done
[ -z "$cwd" ] || cd -- "$cwd" || exit 125
if ! out=$("$@" </dev/null 2>&1); then echo "sbatch failed: $out" >&2; exit 125; fi
id=$(printf '%s\n' "$out" | tail -n 1); id=${id%%;*}
case $id in ''|*[!0-9_]*) echo "sbatch printed no job id: $out" >&2; exit 125;; esac
echo "$id"
echo alive
"""

_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


def job_name(fleet: str, server: str) -> str:
    return f"servefleet-{_SAFE.sub('_', fleet)}-{_SAFE.sub('_', server)}"


def sbatch_options(opts: Mapping[str, object]) -> list[str]:
    """sbatch flags from a Slurm host's table: only what is set, in sbatch's own names; the
    host's ``sbatch_args`` come last so they can override anything."""
    flags = {
        "partition": "--partition",
        "account": "--account",
        "qos": "--qos",
        "time": "--time",
        "gres": "--gres",
        "gpus": "--gpus",
        "cpus": "--cpus-per-task",
        "mem": "--mem",
        "constraint": "--constraint",
    }
    out = [f"{flag}={opts[key]}" for key, flag in flags.items() if opts.get(key) not in (None, "")]
    extra = opts.get("sbatch_args") or ()
    out += [str(a) for a in extra] if isinstance(extra, list | tuple) else []
    return out


def job_args(
    wrapper_argv: Sequence[str],
    *,
    log_path: str,
    status_path: str,
    where_path: str,
    fleet_port: int,
    port_slot: str,
    port_range: tuple[int, int],
    python: str,
) -> list[str]:
    """The batch script's arguments (JOB's "$@"): paths, the fleet file's port (kept when no
    argument carries the port slot: ``args`` fixed it), the slot, then the argv."""
    lo, hi = port_range
    return [
        log_path,
        status_path,
        where_path,
        str(fleet_port),
        port_slot,
        str(lo),
        str(hi - lo),
        python,
        DETACH_SCRIPT,
        *wrapper_argv,
    ]


def submit_argv(
    *, jobfile: str, where_path: str, status_path: str, cwd: str | None, sbatch: Sequence[str], args: Sequence[str]
) -> list[str]:
    """SUBMIT's argv: it writes JOB to ``jobfile`` and runs ``sbatch SBATCH... JOBFILE ARGS...``.
    PICK reaches the job through the environment sbatch exports."""
    command = ["env", f"PICK={PICK_PORT}", *sbatch, jobfile, *args]
    return ["sh", "-c", SUBMIT, "sh", jobfile, JOB, where_path, status_path, cwd or "", *command]


def parse_submitted(stdout: str) -> str:
    lines = [line.strip() for line in stdout.splitlines() if line.strip()]
    for i, line in enumerate(lines):
        if re.fullmatch(r"[0-9_]+", line) and i + 1 < len(lines) and lines[i + 1] == "alive":
            return line
    raise ValueError(f"no job id in {stdout!r}")
