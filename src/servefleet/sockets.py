"""TCP sockets that never connect to themselves.

Linux gives a ``connect()`` its source port from the ephemeral range (32768-60999), where a port picked
with ``bind(0)`` lies too. A connection to a local port that nobody listens on yet may be given that
very port: the socket connects to itself (a TCP simultaneous open). Closed, it stays in TIME_WAIT for
60 s and holds the port: a server that binds it then fails with EADDRINUSE, SO_REUSEADDR or not (the
socket that left the TIME_WAIT had none). A readiness probe polls a loading server 20 times a second
and walks through the range; the demo's second server failed this way ("[Errno 98] error while
attempting to bind on address ('127.0.0.1', 38402)", with a TIME-WAIT 127.0.0.1:38402 <->
127.0.0.1:38402 left behind). A wait for a port to listen even succeeds on such a connection.

Here a socket to a loopback address is given its source port when it is bound, never the one it connects to,
and with SO_REUSEADDR: once closed, its TIME_WAIT does not keep a server that binds with SO_REUSEADDR (uvicorn
under vLLM, SGLang and ``transformers serve``; the sim) off that port either, as a port handed out by ``bind(0)``
may be one a client used.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from typing import Any

__all__ = ["socket_for", "open_connection"]

AddrInfo = tuple[Any, ...]  # getaddrinfo's (family, type, proto, canonname, sockaddr)


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


def _bound(family: int, type_: int, proto: int, sockaddr: tuple[Any, ...]) -> socket.socket:
    sock = socket.socket(family, type_, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # bind(0) still never shares a port
        sock.bind((sockaddr[0], 0, *sockaddr[2:]))  # IPv6 keeps its flow info and scope id
    except OSError:
        sock.close()
        raise
    return sock


def socket_for(addr_info: AddrInfo) -> socket.socket:
    """An unconnected socket for ``addr_info``; to a loopback address, bound to a port other than the
    destination's. aiohttp's ``TCPConnector(socket_factory=...)`` takes it as it is."""
    family, type_, proto, _canonname, sockaddr = addr_info
    if family not in (socket.AF_INET, socket.AF_INET6) or not _loopback(sockaddr[0]):
        return socket.socket(family, type_, proto)  # no self-connection to another machine
    sock = _bound(family, type_, proto, sockaddr)
    if sock.getsockname()[1] == sockaddr[1]:
        with sock:  # held while the next one binds: it cannot be given the same port
            sock = _bound(family, type_, proto, sockaddr)
    return sock


async def open_connection(host: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """``asyncio.open_connection`` through :func:`socket_for` (the first address that connects)."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    error: OSError = OSError(f"no address for {host}:{port}")
    for info in infos:
        sock = socket_for(info)
        try:
            sock.setblocking(False)
            await loop.sock_connect(sock, info[4])
        except OSError as exc:
            sock.close()
            error = exc
            continue
        except BaseException:
            sock.close()
            raise
        return await asyncio.open_connection(sock=sock)
    raise error
