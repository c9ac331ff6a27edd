"""A real OpenSSH server on 127.0.0.1 for tests and benchmarks: the "remote host" of the SSH suite.

The rig generates a host key and a user key in a temporary folder, writes an ``sshd_config`` that
listens on loopback only (a free port), points ``AuthorizedKeysFile`` and ``PidFile`` into that
folder, starts ``/usr/sbin/sshd -D`` as a child process, waits until the port answers with an SSH
banner, and writes a ``known_hosts`` the client can trust — host-key checking stays on in tests too.

Server limits stay at OpenSSH's defaults on purpose (``MaxSessions 10``, ``MaxStartups 10:30:100``):
SSHHost must work against a stock server, not one tuned for it.

Install sshd with ``scripts/ci-sshd-setup.sh`` (Debian's openssh-server).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

SSHD = "/usr/sbin/sshd"
PRIVSEP_DIR = "/run/sshd"  # Debian's sshd refuses to start without its privilege-separation folder


SKIP_ENV = "SERVEFLEET_SKIP_SSH"


def require(reason: str | None) -> None:
    """Fail the test when the rig cannot run (a green run must not hide a skipped SSH suite); skip
    only on the explicit opt-out, SERVEFLEET_SKIP_SSH=1."""
    import pytest

    if reason is None:
        return
    if os.environ.get(SKIP_ENV) == "1":
        pytest.skip(f"{SKIP_ENV}=1: {reason}")
    pytest.fail(f"{reason}; or set {SKIP_ENV}=1 to skip the SSH tests", pytrace=False)


def sshd_unavailable_reason() -> str | None:
    """Why the rig cannot run here, or None when it can."""
    if not os.path.exists(SSHD):
        return f"{SSHD} is not installed (run scripts/ci-sshd-setup.sh: apt-get install openssh-server)"
    for tool in ("ssh", "ssh-keygen"):
        if shutil.which(tool) is None:
            return f"the OpenSSH client tool {tool!r} is not installed"
    if not os.path.isdir(PRIVSEP_DIR):
        if os.geteuid() != 0:
            return f"{PRIVSEP_DIR} is missing and only root can create it"
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _banner_seen(port: int, address: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((address, port), timeout=0.5) as s:
            s.settimeout(0.5)
            return s.recv(64).startswith(b"SSH-")
    except OSError:
        return False


@dataclass
class SSHServer:
    """A running sshd; ``destination``, ``port``, ``identity_file`` and ``known_hosts`` are what a
    client needs. ``netns`` runs it inside a network namespace (``ip netns exec``)."""

    root: Path
    port: int = 0
    address: str = "127.0.0.1"
    netns: str | None = None
    user: str = field(default_factory=lambda: os.environ.get("USER") or _login_name())
    proc: subprocess.Popen | None = None
    extra_config: tuple[str, ...] = ()  # more sshd_config lines (e.g. "SetEnv PATH=...": the sessions' PATH)

    @property
    def destination(self) -> str:
        return f"{self.user}@{self.address}"

    @property
    def identity_file(self) -> str:
        return str(self.root / "id_ed25519")

    @property
    def known_hosts(self) -> str:
        return str(self.root / "known_hosts")

    @property
    def log_file(self) -> Path:
        return self.root / "sshd.log"

    def client_options(self) -> dict[str, str]:
        """Extra ``ssh -o`` settings for clients of the rig. bash sources ~/.bashrc for commands
        started by sshd only when SHLVL < 1; sending SHLVL=1 keeps test timings independent of
        whatever the machine's root ~/.bashrc does (pyenv, conda...)."""
        return {"SetEnv": "SHLVL=1"}

    def client_config(self) -> str:
        """An ssh_config file for clients of the rig (fleet files name it as ``config_file``):
        the same settings as client_options, and none of the user's ~/.ssh/config."""
        path = self.root / "ssh_config"
        path.write_text("".join(f"{key} {value}\n" for key, value in self.client_options().items()))
        return str(path)

    def spec(self, **overrides: object):  # -> servefleet.hosts.ssh_options.SSHSpec
        """An SSHSpec that reaches this server with its own key and known_hosts, ignoring the
        user's ~/.ssh/config."""
        from servefleet.hosts.ssh_options import SSHSpec

        fields: dict[str, object] = {
            "name": "rig",
            "destination": self.destination,
            "port": self.port,
            "identity_file": self.identity_file,
            "known_hosts": self.known_hosts,
            "config_file": "none",
            "options": self.client_options(),
            "connect_timeout": 5,
        }
        fields.update(overrides)
        return SSHSpec(**fields)  # type: ignore[arg-type]  # fields typed loosely; SSHSpec validates them

    def start(self, timeout: float = 15.0) -> SSHServer:
        reason = sshd_unavailable_reason()
        if reason:
            raise RuntimeError(reason)
        if not os.path.isdir(PRIVSEP_DIR):
            os.makedirs(PRIVSEP_DIR, mode=0o755, exist_ok=True)
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)
        host_key = self.root / "ssh_host_ed25519_key"
        user_key = self.root / "id_ed25519"
        for key, comment in ((host_key, "servefleet-test-host"), (user_key, "servefleet-test-user")):
            if not key.exists():
                subprocess.run(
                    ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(key)],
                    check=True,
                    stdin=subprocess.DEVNULL,
                )
        shutil.copyfile(f"{user_key}.pub", self.root / "authorized_keys")
        if not self.port:
            self.port = _free_port()
        host_pub = (self.root / "ssh_host_ed25519_key.pub").read_text().split()
        (self.root / "known_hosts").write_text(f"[{self.address}]:{self.port} {host_pub[0]} {host_pub[1]}\n")
        config = self.root / "sshd_config"
        config.write_text(
            "\n".join(
                [
                    f"ListenAddress {self.address}",
                    f"Port {self.port}",
                    f"HostKey {host_key}",
                    f"PidFile {self.root / 'sshd.pid'}",
                    f"AuthorizedKeysFile {self.root / 'authorized_keys'}",
                    "StrictModes no",  # the key files live in a temporary folder
                    "UsePAM no",
                    "PermitRootLogin prohibit-password",  # CI runs as root: keys only
                    "PubkeyAuthentication yes",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "AllowTcpForwarding yes",  # url_for's local forwards
                    "X11Forwarding no",
                    "PrintMotd no",
                    # Lets the client send SHLVL=1 (see client_options): bash then skips the
                    # login user's ~/.bashrc, which on a developer machine can cost 0.5 s a command.
                    "AcceptEnv SHLVL",
                    "LogLevel VERBOSE",
                    *self.extra_config,
                    "",
                ]
            )
        )
        argv = [SSHD, "-D", "-e", "-f", str(config)]
        if self.netns:
            argv = ["ip", "netns", "exec", self.netns, *argv]
        log = open(self.log_file, "ab")
        try:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        finally:
            log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sshd exited with {self.proc.returncode}: {self.log_file.read_text()[-2000:]}")
            if self._accepts():
                return self
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"sshd did not accept connections on {self.address}:{self.port} within {timeout}s")

    def _accepts(self) -> bool:
        if self.netns:
            probe = subprocess.run(
                ["ip", "netns", "exec", self.netns, "ssh-keyscan", "-T", "1", "-p", str(self.port), self.address],
                capture_output=True,
            )
            return probe.returncode == 0 and b"ssh-" in probe.stdout
        return _banner_seen(self.port, self.address)

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            # sshd -D leads its own session; its per-connection children exit with it.
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.proc = None

    def __enter__(self) -> SSHServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM it when the process that started it dies, so a test run
    that is killed (timeout, Ctrl-C twice) leaves no sshd behind. Linux only; a no-op elsewhere."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


def _login_name() -> str:
    import pwd

    return pwd.getpwuid(os.geteuid()).pw_name


# --- a second "host" in its own network namespace -----------------------------------------------

# stdin/stdout <-> TCP, run *inside* the namespace as ssh's ProxyCommand (no nc/socat needed).
RELAY = r"""
import os, selectors, socket, sys
sock = socket.create_connection((sys.argv[1], int(sys.argv[2])))
sel = selectors.DefaultSelector()
sel.register(0, selectors.EVENT_READ)
sel.register(sock, selectors.EVENT_READ)
while True:
    for key, _ in sel.select():
        if key.fileobj == 0:
            data = os.read(0, 65536)
            if not data:
                sock.shutdown(socket.SHUT_WR)
                sel.unregister(0)
                continue
            sock.sendall(data)
        else:
            data = sock.recv(65536)
            if not data:
                sys.exit(0)
            while data:
                data = data[os.write(1, data):]
"""


def netns_unavailable_reason() -> str | None:
    """Why a network namespace cannot be made here (needs root and iproute2), or None."""
    reason = sshd_unavailable_reason()
    if reason:
        return reason
    if shutil.which("ip") is None:
        return "iproute2 (`ip`) is not installed"
    probe = f"sf-probe-{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip() or made.returncode}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


class NetnsSSHServer(SSHServer):
    """An sshd on the loopback of its own network namespace: a second host whose 127.0.0.1 is
    not ours (the same port number can serve on both). Clients reach it through a ProxyCommand
    relay run inside the namespace; nothing but loopback addresses is ever used."""

    def __init__(self, root: Path, name: str | None = None) -> None:
        super().__init__(root=root, netns=name or f"sf-{os.getpid()}-{os.urandom(3).hex()}")

    def start(self, timeout: float = 15.0) -> SSHServer:
        assert self.netns
        subprocess.run(["ip", "netns", "add", self.netns], check=True, capture_output=True)
        subprocess.run(["ip", "netns", "exec", self.netns, "ip", "link", "set", "lo", "up"], check=True)
        try:
            return super().start(timeout)
        except BaseException:
            self.stop()
            raise

    def client_options(self) -> dict[str, str]:
        import sys

        relay = self.root / "relay.py"
        relay.write_text(RELAY)
        return {
            **super().client_options(),
            "ProxyCommand": f"ip netns exec {self.netns} {sys.executable} {relay} 127.0.0.1 {self.port}",
        }

    def stop(self) -> None:
        super().stop()
        if self.netns:
            subprocess.run(["ip", "netns", "del", self.netns], capture_output=True)
