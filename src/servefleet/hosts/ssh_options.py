"""How servefleet talks to OpenSSH: the host spec, every ``ssh`` option (each with the reason it is
there), and the translation of an ``ssh`` failure into our error tree.

We drive the system ``ssh`` client rather than a Python SSH library so that the user's
``~/.ssh/config`` aliases, agents, hardware keys, ``ProxyJump`` chains and known_hosts all keep
working exactly as they do in their terminal.
"""

from __future__ import annotations

import os
import re
import stat
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Literal

from servefleet.errors import CommandError, ConfigError, HostError, HostUnreachable

__all__ = [
    "SSHSpec",
    "SSHSettingsError",
    "ssh_problems",
    "Role",
    "ssh_options",
    "ssh_argv",
    "control_dir",
    "control_path",
    "UNREACHABLE_PATTERNS",
    "classify_ssh_failure",
    "ssh_error",
]

Role = Literal["master", "client", "direct"]


_NO_OPTION = ("destination", "user", "jump", "identity_file", "known_hosts", "config_file")


class SSHSettingsError(ConfigError):
    """Invalid SSH settings: ``problems`` is (setting, what is wrong) for each (the fleet layer
    names them by their fleet-file keys)."""

    def __init__(self, where: str, problems: Sequence[tuple[str, str]]) -> None:
        self.problems = list(problems)
        super().__init__(f"{where}: " + "; ".join(f"{name} {what}" for name, what in self.problems))


def ssh_problems(values: Mapping[str, object]) -> list[tuple[str, str]]:
    """Every check of SSH settings (SSHSpec's fields by name; absent ones are not checked):
    (setting, what is wrong) for each problem. The one place they are checked: SSHSpec runs it,
    and a fleet file's host table through it (fleet/spec.py)."""
    out: list[tuple[str, str]] = []

    def at_least(name: str, low: float, what: str) -> None:
        value = values.get(name)
        if isinstance(value, int | float) and value < low:
            out.append((name, what))

    for name in _NO_OPTION:
        value = values.get(name)
        # A value starting with '-' would be read by ssh as an option (-oProxyCommand=...).
        if isinstance(value, str) and (not value or value.startswith("-") or "\n" in value):
            out.append((name, "must not be empty, start with '-' or contain a newline"))
    port = values.get("port")
    if isinstance(port, int) and not 0 < port < 65536:
        out.append(("port", "must be between 1 and 65535"))
    if "strict_host_key" in values and values["strict_host_key"] not in ("yes", "accept-new"):
        out.append(
            (
                "strict_host_key",
                f"must be 'yes' or 'accept-new' (host keys are always checked), not {values['strict_host_key']!r}",
            )
        )
    if "launcher" in values and values["launcher"] not in ("setsid", "systemd-run"):
        out.append(("launcher", f"must be 'setsid' or 'systemd-run', not {values['launcher']!r}"))
    at_least("alive_interval", 1, "must be at least 1 second")
    at_least("alive_count_max", 1, "must be at least 1")
    at_least("connect_timeout", 1, "must be at least 1 second")
    at_least("control_persist", 0, "must be 0 or more seconds")
    for name in ("max_sessions", "max_masters"):
        value = values.get(name)
        if isinstance(value, int) and not 1 <= value <= 64:
            out.append((name, "must be between 1 and 64"))
    reconnect = values.get("reconnect_s")
    if isinstance(reconnect, int | float) and reconnect <= 0:
        out.append(("reconnect_s", "must be a positive number of seconds"))
    for key in values.get("env") or {}:  # type: ignore[attr-defined]  # a mapping (SSHSpec's type)
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", str(key)):
            out.append(("env", f"invalid environment variable name {key!r}"))
    for key, value in (values.get("options") or {}).items():  # type: ignore[attr-defined]  # a mapping (SSHSpec's type)
        if not re.fullmatch(r"[A-Za-z][A-Za-z0-9]*", str(key)) or "\n" in str(value):
            out.append(("options", f"invalid ssh option {key}={value!r}"))
    return out


@dataclass(frozen=True)
class SSHSpec:
    """Where and how to reach one SSH host (one ``[hosts.NAME]`` table of a fleet file).

    ``destination`` is an alias from ``~/.ssh/config`` or ``[user@]host``; the other fields
    override what that config says. ``workdir`` is the remote work folder (``~`` allowed: it is
    expanded on the remote). ``env`` and ``venv`` apply to every command run on the host.
    ``options`` are extra ``ssh -o KEY=VALUE`` settings; they cannot override ours (ssh keeps the
    first value it sees for an option, and ours come first).
    """

    destination: str
    name: str | None = None
    port: int | None = None
    user: str | None = None
    identity_file: str | None = None
    jump: str | None = None
    known_hosts: str | None = None
    strict_host_key: Literal["yes", "accept-new"] = "yes"
    config_file: str | None = None
    workdir: str = "~/.servefleet"
    env: Mapping[str, str] = field(default_factory=dict)
    venv: str | None = None
    options: Mapping[str, str] = field(default_factory=dict)
    connect_timeout: int = 10
    # A link that goes silent (packets dropped, no RST) is declared dead after about
    # alive_interval x (alive_count_max + 1) seconds: ssh sends the first keep-alive after one
    # interval of silence and gives up when alive_count_max of them went unanswered. 16 s by
    # default (``alive_timeout = 15`` in a fleet file). A quiet command or log follow on a live
    # link is never affected (the server answers the keep-alives).
    alive_interval: int = 4
    alive_count_max: int = 3
    control_persist: int = 300
    multiplex: bool = True
    max_sessions: int = 8
    max_masters: int = 8
    reconnect_s: float = 60.0
    launcher: Literal["setsid", "systemd-run"] = "setsid"  # how servers are started (ssh_systemd.py)

    def __post_init__(self) -> None:
        problems = ssh_problems({f.name: getattr(self, f.name) for f in fields(self)})
        if problems:
            raise SSHSettingsError(f"ssh host {self.label!r}", problems)

    @property
    def label(self) -> str:
        return self.name or self.destination

    @property
    def alive_timeout(self) -> int:
        """About how many seconds of silence make the link count as dead (measured: the first
        keep-alive goes out after one silent interval, the master exits ``alive_count_max``
        intervals later)."""
        return int(self.alive_interval) * (int(self.alive_count_max) + 1)

    @staticmethod
    def alive_settings(alive_timeout: int) -> dict[str, int]:
        """``alive_interval``/``alive_count_max`` for a wanted ``alive_timeout`` (a fleet file's
        ``[hosts.X] alive_timeout``): three unanswered keep-alives where the time allows, so
        one lost packet is not a dead link. 15 -> every 4 s, 3 of them (~16 s)."""
        timeout = max(1, int(alive_timeout))
        count = 3 if timeout >= 8 else max(1, timeout - 1)
        return {"alive_interval": max(1, round(timeout / (count + 1))), "alive_count_max": count}


def ssh_options(spec: SSHSpec, role: Role, control: str | None = None) -> list[str]:
    """Every ``-o``/flag servefleet passes to ``ssh``, for one of three roles:

    - ``master``: the long-lived multiplexed connection (``-N -f`` with ControlMaster=auto);
    - ``client``: a command or forward request carried over that master;
    - ``direct``: a fresh connection per command (no multiplexing), the naive baseline.
    """
    opts: list[str] = []

    def o(key: str, value: object) -> None:
        opts.extend(["-o", f"{key}={value}"])

    if spec.config_file:
        opts.extend(["-F", spec.config_file])
    # Never prompt: a password, passphrase or host-key question would hang a CLI whose stdin is
    # not a terminal. Keys from files and agents keep working.
    o("BatchMode", "yes")
    # Host keys are always checked. 'accept-new' (trust on first use) is an explicit opt-in; a
    # changed key is refused in both modes. Never 'no'.
    o("StrictHostKeyChecking", spec.strict_host_key)
    if spec.known_hosts:
        # Tests and sandboxes bring their own known_hosts; users keep ~/.ssh/known_hosts.
        o("UserKnownHostsFile", spec.known_hosts)
    # Bound the TCP connect and the banner exchange, so an unreachable host is reported as such
    # within this many seconds instead of hanging on the kernel's SYN retries.
    o("ConnectTimeout", int(spec.connect_timeout))
    # Keep-alives inside the encrypted channel: a dead link (even one that silently drops
    # packets, where TCP alone would wait many minutes) is noticed after interval x count
    # seconds, the master exits, commands report the host unreachable and followers reconnect
    # instead of waiting forever. A live link answers them, however quiet its sessions are.
    o("ServerAliveInterval", spec.alive_interval)
    o("ServerAliveCountMax", spec.alive_count_max)
    # Errors only: informational lines ("Warning: Permanently added ...") would mix into the
    # stderr we classify and show to the user.
    o("LogLevel", "ERROR")
    # No terminal: commands run with pipes, output is byte-exact (no \r\n translation).
    o("RequestTTY", "no")
    if spec.port:
        opts.extend(["-p", str(spec.port)])
    if spec.user:
        opts.extend(["-l", spec.user])
    if spec.identity_file:
        opts.extend(["-i", spec.identity_file])
        # Offer only that key: an agent holding many keys trips the server's MaxAuthTries first.
        o("IdentitiesOnly", "yes")
    if spec.jump:
        # ProxyJump works with ControlMaster: the master carries the jump, clients reuse it.
        opts.extend(["-J", spec.jump])

    if role == "direct":
        # The naive baseline: one full handshake per command, ignoring any ControlMaster the
        # user's config might set up.
        o("ControlMaster", "no")
        o("ControlPath", "none")
        return _with_user_options(opts, spec)
    if control is None:
        raise ValueError("a master or client role needs a control path")
    # A short hashed socket path in a private 0700 folder (see control_path): unix sockets are
    # limited to ~104 bytes, and a socket others can reach would let them ride our connection.
    o("ControlPath", control)
    if role == "master":
        # 'auto' rather than -M/'yes': a socket left by a killed master is unlinked and replaced
        # ('yes' would fall back to an unmultiplexed connection), and should a live master
        # already listen on the path, it is reused instead of failing.
        o("ControlMaster", "auto")
        # If this process dies without `ssh -O exit`, the orphaned master leaves by itself after
        # this many idle seconds (no sessions, no forwarded connections).
        o("ControlPersist", f"{int(spec.control_persist)}s")
        # Forwards are added later with `-O forward`; a failing one must report, not be skipped.
        o("ExitOnForwardFailure", "yes")
    else:
        # Clients never become a master themselves: an implicit master would fork into the
        # background holding our pipes, and the pool would not know about it. With the master
        # gone, a client falls back to a direct connection and the pool restarts the master.
        o("ControlMaster", "no")
    return _with_user_options(opts, spec)


def _with_user_options(opts: list[str], spec: SSHSpec) -> list[str]:
    # The user's extra settings go last: ssh keeps the first value of each option, so they can
    # add (Compression, Ciphers, SetEnv...) but never switch host-key checking or our control
    # socket off.
    for key, value in spec.options.items():
        opts.extend(["-o", f"{key}={value}"])
    return opts


def ssh_argv(
    spec: SSHSpec, role: Role, control: str | None, *, flags: Sequence[str] = (), remote: str | None = None
) -> list[str]:
    """``ssh [flags] [options] -- destination [remote]``; ``remote`` is one shell-quoted string."""
    argv = ["ssh", *flags, *ssh_options(spec, role, control), "--", spec.destination]
    if remote is not None:
        argv.append(remote)
    return argv


def control_dir(base: str | None = None) -> str:
    """The private folder for control sockets: ``$SERVEFLEET_SSH_DIR`` or ``/tmp/sf-ssh-UID``.

    It must be a real folder owned by us with mode 0700: anyone who can connect to a control
    socket can run commands as us on the remote host.
    """
    path = base or os.environ.get("SERVEFLEET_SSH_DIR") or os.path.join(tempfile.gettempdir(), f"sf-ssh-{os.getuid()}")
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise HostError(f"control socket folder {path} is not a folder owned by us; refusing to use it")
    if stat.S_IMODE(st.st_mode) != 0o700:
        os.chmod(path, 0o700)
    return path


def control_path(folder: str, token: str, index: int) -> str:
    """``FOLDER/TOKEN.INDEX.%C``: ssh replaces %C by a 40-character hash of (local host, remote
    host, port, user), keeping the path short whatever the destination. The token is per SSHHost
    instance, so two servefleet processes never share (or close) each other's masters."""
    path = os.path.join(folder, f"{token}.{index}.%C")
    # %C expands to 40 characters, and ssh binds "PATH.<16 random>" before renaming it; a unix
    # socket path holds 104 bytes on macOS (108 on Linux).
    if len(path) - 2 + 40 + 17 >= 104:
        raise HostError(
            f"control socket folder {folder!r} is too long for a unix socket path; set SERVEFLEET_SSH_DIR to a short folder"
        )
    return path


# ssh exits with 255 both when the connection fails and when the remote command itself exits
# with 255; these stderr lines (written by ssh, not by the remote command) tell them apart.
UNREACHABLE_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (reason, re.compile(pattern, re.IGNORECASE | re.MULTILINE))
    for reason, pattern in (
        ("link went silent", r"no answer to keep-alives"),
        (
            "host key verification failed",
            r"Host key verification failed|REMOTE HOST IDENTIFICATION HAS CHANGED|No \S+ host key is known",
        ),
        ("authentication failed", r"Permission denied \(|Too many authentication failures|no matching host key type"),
        (
            "name resolution failed",
            r"Could not resolve hostname|Name or service not known|nodename nor servname|Temporary failure in name resolution",
        ),
        ("connection refused", r"Connection refused"),
        ("connection timed out", r"Connection timed out|Operation timed out|timed out during banner exchange"),
        ("network unreachable", r"Network is unreachable|No route to host|Host is down"),
        (
            "connection closed",
            r"Connection closed by|Connection reset by|kex_exchange_identification|Broken pipe|closed by remote host|ssh_exchange_identification",
        ),
        ("jump host failed", r"^channel \d+: open failed|stdio forwarding failed"),
        (
            "master connection lost",
            r"Control socket connect|mux_client_|master is dead|Session open refused by peer|muxclient:",
        ),
        (
            "ssh client failed",
            r"^ssh: |Bad configuration option|Bad local forwarding|Could not open configuration|no such identity",
        ),
    )
)


def classify_ssh_failure(returncode: int, stderr: str) -> str | None:
    """The reason the SSH *connection* failed, or None when the remote command itself failed."""
    if returncode != 255:
        return None
    for reason, pattern in UNREACHABLE_PATTERNS:
        if pattern.search(stderr):
            return reason
    return None


def ssh_error(
    spec: SSHSpec, argv: Sequence[str], returncode: int, stderr: str, *, shown: Sequence[str] | None = None
) -> HostError:
    """The exception for a failed ``ssh`` invocation: HostUnreachable for connection failures
    (naming the host, the reason and ssh's own words), CommandError for the remote command."""
    reason = classify_ssh_failure(returncode, stderr)
    if reason is None:
        return CommandError(list(shown if shown is not None else argv), returncode, stderr)
    detail = " | ".join(line.strip() for line in stderr.strip().splitlines()[-3:])
    hint = ""
    if reason == "host key verification failed":
        hint = ' (add the host key to known_hosts, e.g. `ssh-keyscan`, or opt in with strict_host_key = "accept-new")'
    elif reason == "authentication failed":
        hint = " (BatchMode is on: the key must be in an agent or given as identity_file, without a passphrase prompt)"
    err = HostUnreachable(f"ssh host {spec.label!r} is unreachable: {reason}{hint}: {detail}")
    err.reason = reason
    return err
