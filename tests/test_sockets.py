"""No connection to itself (servefleet/sockets.py). A network namespace of the test's own, whose
ephemeral range is two ports, 40000-40001: a plain connect() to 127.0.0.1:40000 with nobody listening
there is given port 40000 and connects to itself on every try (seen here: 20 of 20), as a readiness
probe does now and then in the full range -- the demo's second server then failed to bind its port."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from servefleet.sockets import socket_for

PORT = 40000

# Runs inside the namespace. It first checks that the rig does what it is for (a plain socket connects
# to itself there), then does what `wait` does to a loading server: 20 probes, then the server binds.
PROBES = """
import asyncio, json, socket, struct

from servefleet.http import probe_client
from servefleet.http import Timeout
from servefleet.sockets import open_connection

PORT = 40000
out = {}
plain = socket.socket()
try:
    plain.connect(("127.0.0.1", PORT))
    out["plain"] = list(plain.getsockname())
    plain.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # closed by RST: no TIME_WAIT
except OSError as exc:
    out["plain"] = type(exc).__name__
plain.close()


async def main():
    async with probe_client() as client:
        kinds = []
        for _ in range(20):
            try:
                resp = await client.get(f"http://127.0.0.1:{PORT}/health", timeout=Timeout(2.0))
                kinds.append(f"answered {resp.status}")
            except Exception as exc:
                kinds.append(getattr(getattr(exc, "failure", None), "kind", type(exc).__name__).__str__())
        out["probes"] = kinds
    opened = []
    for _ in range(20):
        try:
            _r, w = await open_connection("127.0.0.1", PORT)
            opened.append(list(w.get_extra_info("sockname")))
            w.close()
        except ConnectionRefusedError:
            opened.append("refused")
    out["open_connection"] = opened

asyncio.run(main())
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does
try:
    server.bind(("127.0.0.1", PORT))
    server.listen()
    out["bind"] = "ok"
except OSError as exc:
    out["bind"] = str(exc)


async def connect_to_listener():
    _r, w = await open_connection("127.0.0.1", PORT)
    peer = w.get_extra_info("peername")[1]
    w.close()
    return peer

out["listener"] = asyncio.run(connect_to_listener()) if out["bind"] == "ok" else None
print(json.dumps(out))
"""


@pytest.fixture
def two_port_netns():
    """A network namespace with its loopback up and 40000-40001 as its whole ephemeral range."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.fail("needs root and iproute2 (`ip netns`), as CI runs: run the tests with sudo", pytrace=False)
    name = f"sf-sock-{os.getpid()}-{os.urandom(3).hex()}"
    subprocess.run(["ip", "netns", "add", name], check=True, capture_output=True)
    try:
        for argv in (
            ["ip", "link", "set", "lo", "up"],
            ["sysctl", "-q", "-w", f"net.ipv4.ip_local_port_range={PORT} {PORT + 1}"],
        ):
            subprocess.run(["ip", "netns", "exec", name, *argv], check=True, capture_output=True)
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


def test_probes_of_a_port_nobody_listens_on_never_take_it(two_port_netns: str, tmp_path: Path) -> None:
    script = tmp_path / "probes.py"
    script.write_text(PROBES)
    done = subprocess.run(
        ["ip", "netns", "exec", two_port_netns, sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout)
    assert out["plain"] == ["127.0.0.1", PORT], out  # the rig: a plain socket meets itself
    assert out["probes"] == ["connect"] * 20, out  # refused, as a loading server's port is
    assert out["open_connection"] == ["refused"] * 20, out  # ssh's forward wait, the Slurm relay
    assert out["bind"] == "ok", out  # the server gets its port
    assert out["listener"] == PORT, out  # and is reached


def test_only_sockets_to_a_loopback_address_are_bound_first() -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    taken = listener.getsockname()[1]
    with listener:
        info = socket.getaddrinfo("127.0.0.1", taken, type=socket.SOCK_STREAM)[0]
        with socket_for(info) as sock:
            host, port = sock.getsockname()
            assert host == "127.0.0.1" and port not in (0, taken)
    with socket_for(socket.getaddrinfo("192.0.2.1", 80, type=socket.SOCK_STREAM)[0]) as sock:
        assert sock.getsockname()[1] == 0  # another machine: the kernel picks at connect(), as ever


def test_a_closed_connection_leaves_its_port_to_a_server() -> None:
    """The client closes first, so its side waits in TIME_WAIT for 60 s; a server that binds with
    SO_REUSEADDR (as uvicorn does) may still take that port (a plain client socket would keep it off)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    with listener:
        info = socket.getaddrinfo(*listener.getsockname(), type=socket.SOCK_STREAM)[0]
        client = socket_for(info)
        client.connect(info[4])
        accepted, _ = listener.accept()
        used = client.getsockname()[1]
        client.close()  # first: TIME_WAIT is on the client's side
        accepted.close()
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    with server:
        server.bind(("127.0.0.1", used))
        server.listen()
