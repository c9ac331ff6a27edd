"""The ``systemd-run`` launcher of SSH hosts: a server started as a transient user unit.

Why: servers started with ``setsid`` survive the SSH link, but not logind's
``KillUserProcesses=yes``, which kills every process of a login session when its last SSH session
ends. A transient service of the user's own service manager (``systemd --user``) belongs to no
login session; with lingering enabled that manager runs without any login at all, so the server
outlives every SSH session.

Only *where* the process starts changes. The unit runs the same detach wrapper as the setsid path
(hosts/base.py DETACH_SCRIPT): output appended to the same log, the exit code in the same status
file, and — since systemd calls ``setsid()`` for every service it starts — the wrapper is the
leader of its own session and process group, so its pid is the pgid that wait, status, logs, down
and adopt already use. ``KillMode=control-group`` makes ``systemctl --user stop`` also reach
processes that left that group (engine workers that call ``setsid`` themselves).

The programs here run as ``sh -c PROGRAM sh ARG...`` like those of ssh_scripts.py: every value is
an argument, never parsed by a shell.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Sequence

from servefleet.errors import LaunchError

__all__ = [
    "LAUNCHERS",
    "unit_name",
    "check_argv",
    "parse_check",
    "check_problems",
    "check_error",
    "unit_escape",
    "launch_argv",
    "stop_argv",
    "kill_argv",
]

LAUNCHERS = ("setsid", "systemd-run")

# `systemctl --user` finds the manager through $XDG_RUNTIME_DIR. pam_systemd sets it for SSH
# logins; where sshd runs without PAM it is unset, although the manager of a lingering user runs
# at its usual place — so default it, as `loginctl enable-linger` users are told to.
_RUNTIME = r""": "${XDG_RUNTIME_DIR:=/run/user/$(id -u)}"; export XDG_RUNTIME_DIR
"""

# What the launcher needs, as key=value lines: the missing tools, whether `systemctl --user`
# reaches a manager (its error line otherwise) and what loginctl says about lingering.
CHECK = (
    _RUNTIME
    + r"""
user=${USER:-$(id -un)}
echo "user=$user"
missing=
for tool in systemd-run systemctl loginctl; do
  command -v "$tool" >/dev/null 2>&1 || missing="$missing $tool"
done
echo "missing=${missing# }"
if command -v systemctl >/dev/null 2>&1; then
  if out=$(systemctl --user show-environment 2>&1 >/dev/null); then echo manager=ok
  else echo "manager=$(printf '%s' "$out" | tr '\n' ' ' | cut -c 1-300)"; fi
fi
if command -v loginctl >/dev/null 2>&1; then
  out=$(loginctl show-user "$user" -p Linger 2>&1)
  echo "linger=$(printf '%s' "$out" | tr '\n' ' ' | cut -c 1-300)"
fi
"""
)

# Runs inside the unit, then becomes the detach wrapper (exec keeps the pid): takes the
# environment from the private file the launcher wrote (then removes it), reports its pid, and
# execs "$@". The unit gets the manager's environment, not the SSH session's: PATH (with the
# host's venv) and the server's variables travel in that file, never on a command line.
UNIT_PRELUDE = r"""
envfile=$1; pidfile=$2; shift 2
[ -f "$envfile" ] || { echo "servefleet: environment file $envfile is missing" >&2; exit 125; }
while IFS= read -r kv; do export "$kv" || exit 125; done < "$envfile"
rm -f -- "$envfile"
echo "$$" > "$pidfile.tmp" && mv -f -- "$pidfile.tmp" "$pidfile" || exit 125
exec "$@"
"""

# The launcher, run in the server's working folder with the host's venv on PATH (ssh_scripts
# PRELUDE). Arguments: UNIT LOG STATUS ENVFILE PIDFILE, then the unit's command (already escaped
# for the manager, see launch_argv); the server's environment arrives on stdin, one KEY=VALUE per
# line (as for the setsid launcher). Prints the pid of the unit's main process (= its process
# group), then alive / exited N / gone.
LAUNCH = (
    _RUNTIME
    + r"""
unit=$1; log=$2; status=$3; envfile=$4; pidfile=$5; shift 5
umask 077
mkdir -p -- "$(dirname -- "$log")" "$(dirname -- "$status")" || exit 125
rm -f -- "$status" "$pidfile" "$pidfile.tmp"
{
  printf 'PATH=%s\n' "$PATH"
  if [ -n "${VIRTUAL_ENV-}" ]; then printf 'VIRTUAL_ENV=%s\n' "$VIRTUAL_ENV"; fi
  while IFS= read -r kv; do printf '%s\n' "$kv"; done
} > "$envfile" || { rm -f -- "$envfile"; exit 125; }
if ! out=$(systemd-run --user --quiet --collect --unit="$unit" --working-directory="$(pwd -P)" \
    --property=KillMode=control-group -- "$@" </dev/null 2>&1); then
  rm -f -- "$envfile"
  echo "systemd-run --user failed: $out" >&2; exit 125
fi
i=0
while [ ! -e "$pidfile" ]; do
  i=$((i + 1))
  if [ "$i" -gt 200 ] || { [ "$i" -gt 4 ] && ! systemctl --user is-active --quiet -- "$unit" && [ ! -e "$pidfile" ]; }; then
    rm -f -- "$envfile"; systemctl --user stop --no-block -- "$unit" >/dev/null 2>&1
    echo "unit $unit did not start its command (see: journalctl --user -u $unit)" >&2; exit 125
  fi
  sleep 0.05
done
pid=$(cat -- "$pidfile"); rm -f -- "$pidfile"
case $pid in ''|*[!0-9]*)
  systemctl --user stop --no-block -- "$unit" >/dev/null 2>&1  # never leave a unit nobody knows of
  echo "unit $unit reported no pid" >&2; exit 125;;
esac
echo "$pid"
if kill -0 "-$pid" 2>/dev/null; then echo alive
elif [ -e "$status" ]; then echo "exited $(cat -- "$status")"
else echo gone; fi
"""
)

# Stop (SIGTERM to the unit's whole cgroup, without waiting: the fleet layer waits and escalates
# on its own clock) or SIGKILL it. A unit that is already gone (collected) is not an error.
STOP = (
    _RUNTIME
    + r"""
if out=$(systemctl --user "$@" 2>&1); then exit 0; fi
case $out in *"not loaded"*|*"not found"*|*"No such"*|*"does not exist"*) exit 0;; esac
echo "$out" >&2; exit 1
"""
)

_UNIT_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


def unit_name(fleet: str, server: str, now: float | None = None) -> str:
    """``servefleet-<fleet>-<server>-<launch time><random>.service``: unique per launch, so a
    restart never collides with a unit of the previous attempt that is still being stopped."""
    stamp = format(int((time.time() if now is None else now) * 1000), "x")
    tail = f"{stamp}{os.urandom(3).hex()}"
    return f"servefleet-{_UNIT_SAFE.sub('_', fleet)}-{_UNIT_SAFE.sub('_', server)}-{tail}.service"


def _sh(script: str, *args: str) -> list[str]:
    return ["sh", "-c", script, "sh", *args]


def check_argv() -> list[str]:
    return _sh(CHECK)


def parse_check(stdout: str) -> dict[str, str]:
    facts: dict[str, str] = {}
    for line in stdout.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip():
            facts[key.strip()] = value.strip()
    return facts


def _no_systemd(facts: dict[str, str]) -> bool:
    """Whether systemd is not running on the host at all (enabling lingering cannot help)."""
    said = " ".join((facts.get("manager", ""), facts.get("linger", "")))
    return (
        bool(set(facts.get("missing", "").split()) & {"systemd-run", "loginctl"})
        or "not been booted with systemd" in said
    )


def check_problems(facts: dict[str, str]) -> list[str]:
    """What stops the systemd-run launcher on this host (empty: it can be used)."""
    problems = []
    user = facts.get("user") or "$USER"
    missing = facts.get("missing", "").split()
    if missing:
        problems.append(f"{', '.join(missing)} not found on the host's PATH (is systemd the init system there?)")
    manager = facts.get("manager")
    if manager is not None and manager != "ok":
        problems.append(f"`systemctl --user` cannot reach a user service manager ({manager or 'no reason given'})")
    linger = facts.get("linger")
    if linger is not None and linger != "Linger=yes":
        if linger.startswith("Linger="):
            problems.append(
                f"lingering is not enabled for user {user} (`loginctl show-user {user} -p Linger` says {linger})"
            )
        else:
            problems.append(
                f"cannot tell whether lingering is enabled for user {user} (`loginctl show-user {user} -p Linger` says: {linger or 'nothing'})"
            )
    return problems


def check_error(host: str, host_table: str, facts: dict[str, str]) -> LaunchError | None:
    """The launch error for ``facts`` (from CHECK), saying what is missing and what to do."""
    problems = check_problems(facts)
    if not problems:
        return None
    user = facts.get("user") or "$USER"
    fixes = []
    if not _no_systemd(facts):
        fixes.append(
            f"enable lingering on the host (`sudo loginctl enable-linger {user}`: the user's service manager then runs without a login)"
        )
    fixes.append(
        f'use the default launcher (remove launcher = "systemd-run" from {host_table}, or set launcher = "setsid")'
    )
    return LaunchError(
        f'ssh host {host!r}: launcher = "systemd-run" cannot be used: {"; ".join(problems)}. Fix: '
        + ", or ".join(fixes)
        + "; nothing was launched"
    )


def unit_escape(arg: str) -> str:
    """An argument as the service manager must receive it to pass it on unchanged: systemd
    expands ``${NAME}`` (and a whole-word ``$NAME``) in a service's command line at start, also
    for transient units (systemd-run's --expand-environment=no, which would turn that off, needs
    systemd 254 and fails on older ones); ``$$`` stands for one ``$`` in every version."""
    return arg.replace("$", "$$")


def launch_argv(unit: str, wrapper: Sequence[str], log_path: str, status_path: str) -> list[str]:
    """The remote argv that starts ``wrapper`` (the detach wrapper's argv) as transient user unit
    ``unit``; run it under ssh_scripts.with_prelude (working folder, venv). The unit runs
    ``sh -c UNIT_PRELUDE sh ENVFILE PIDFILE WRAPPER...``, every argument escaped for systemd."""
    envfile, pidfile = f"{status_path}.env", f"{status_path}.pid"
    command = ["sh", "-c", UNIT_PRELUDE, "sh", envfile, pidfile, *wrapper]
    return _sh(LAUNCH, unit, log_path, status_path, envfile, pidfile, *(unit_escape(arg) for arg in command))


def stop_argv(unit: str) -> list[str]:
    return _sh(STOP, "stop", "--no-block", "--", unit)


def kill_argv(unit: str) -> list[str]:
    return _sh(STOP, "kill", "--signal=SIGKILL", "--", unit)
