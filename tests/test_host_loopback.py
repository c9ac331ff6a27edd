"""hosts/base.py loopback_for: the one rule local and SSH hosts share for reaching a server by its
bind address (a wildcard at the loopback of its family), and the URL forms LocalHost makes of it."""

from __future__ import annotations

import pytest

from servefleet.hosts.base import loopback_for
from servefleet.hosts.local import LocalHost


@pytest.mark.parametrize(
    ("bind", "reached"),
    [
        ("0.0.0.0", "127.0.0.1"),
        ("", "127.0.0.1"),
        ("localhost", "127.0.0.1"),
        ("::", "::1"),
        ("::1", "::1"),
        ("127.0.0.2", "127.0.0.2"),
        ("fd00::5", "fd00::5"),
    ],
)
def test_a_wildcard_bind_is_reached_at_the_loopback_of_its_family(bind: str, reached: str) -> None:
    assert loopback_for(bind) == reached


@pytest.mark.parametrize(
    ("bind", "url"),
    [
        ("0.0.0.0", "http://127.0.0.1:8000"),
        ("127.0.0.1", "http://127.0.0.1:8000"),
        ("::", "http://[::1]:8000"),
        ("::1", "http://[::1]:8000"),
    ],
)
async def test_local_urls_bracket_an_ipv6_address(bind: str, url: str) -> None:
    assert await LocalHost().url_for(8000, bind) == url
