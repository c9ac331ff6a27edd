"""A port held by another process: `up` refuses before launching anything (README), and `down` does
not call that port free (issue 24 item 15)."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

from servefleet.catalog import Category, State
from servefleet.fleet import Fleet
from servefleet.fleet.lifecycle import Action
from test_fleet_lifecycle import cleanup, write_fleet  # noqa: F401 - the fixture is used by name


async def test_one_held_port_launches_nothing_and_down_does_not_call_it_free(tmp_path: Path, cleanup) -> None:  # noqa: F811
    path, ports = write_fleet(tmp_path, {"a": [], "b": []})
    holder = socket.socket()
    holder.bind(("127.0.0.1", ports["b"]))
    holder.listen()
    try:
        fleet = Fleet.load(path)
        cleanup(fleet)
        outcomes = await fleet.start()
        assert {n: o.action for n, o in outcomes.items()} == {"a": Action.BLOCKED, "b": Action.BLOCKED}
        assert outcomes["b"].verdict is not None and outcomes["b"].verdict.category == Category.PORT_IN_USE
        a = outcomes["a"].verdict
        assert a is not None and a.state == State.FAILED and "not launched: the port of b is held" in (a.message or "")
        assert fleet.store.load("a") is None and fleet.store.load("b") is None  # nothing launched, nothing recorded
        results = await Fleet.load(path).down(["b"], grace_s=1)
    finally:
        holder.close()
    b = results["b"]
    assert not b.was_running and not b.port_free and b.port_holder_pid == os.getpid()
    assert b.ok  # nothing of ours was there to stop: down succeeds, and still does not call the port free
    assert f"port {ports['b']} is held by another process" in b.message


def test_up_json_with_a_refused_server_is_in_the_failure_shape(tmp_path: Path) -> None:
    from test_fleet_lifecycle import cli

    path, ports = write_fleet(tmp_path, {"a": []})
    holder = socket.socket()
    holder.bind(("127.0.0.1", ports["a"]))
    holder.listen()
    try:
        res = cli("up", str(path), "--json", cwd=tmp_path)
    finally:
        holder.close()
    assert res.returncode == 1, res.stderr
    doc = json.loads(res.stdout)
    assert doc["ok"] is False and doc["error"]["exit_code"] == 1 and doc["error"]["command"] == "up"
    assert "a (failed: port_in_use)" in doc["error"]["message"]
