"""`status` of an SSH fleet in one remote command per host (fleet/prefetch.py over
hosts/ssh_batch.py), against a real sshd: the batch answers exactly what the one-question-at-a-time
Host methods answer, and the fleet's status is the same, only cheaper."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import socket
import sys
from pathlib import Path

import pytest

from servefleet.fleet import Fleet, Liveness
from servefleet.fleet.prefetch import PrefetchedHost, prefetch_questions
from servefleet.fleet.status import read_tail, server_status
from servefleet.hosts.questions import Alive, Exists, Owns, Port, Read, ReadIfDead, Size, Tail
from servefleet.hosts.ssh import SSHHost
from servefleet.hosts.ssh_batch import chunk_ops, parse_batch
from servefleet.http import probe_client
from test_ssh_fleet import write_fleet

pytestmark = pytest.mark.timeout(120)


async def test_batch_answers_what_single_questions_answer(sshd_server, tmp_path: Path) -> None:
    host = SSHHost(sshd_server.spec(workdir=str(tmp_path)))
    try:
        weird = tmp_path / "a dir 'q' $(touch pwned)" / 'log "x".txt'
        weird.parent.mkdir()
        # content with NULs, no final newline, and lines that look like batch framing
        content = b"\x00bin\xffary\n0123 0 end\nxx 1 data\nlast line without newline"
        weird.write_bytes(content)
        missing = str(tmp_path / "nope")
        sleeper = await host.spawn_detached(
            ["sleep", "60"], log_path=str(tmp_path / "s.log"), status_path=str(tmp_path / "s.st")
        )
        ops = [
            Read(str(weird)),
            Read(str(weird), 5, 7),
            Read(missing),
            Size(str(weird)),
            Size(missing),
            Alive(sleeper),
            Alive(2**22 - 3),
            Owns(sleeper, str(tmp_path / "s.log")),
            Owns(sleeper, str(tmp_path / "other.log")),
            Port(1),
            ReadIfDead(sleeper, Read(str(weird))),  # alive: not read
            Exists(str(weird)),
            Exists(missing),
            Exists("/dev/null"),  # a device: answered without opening it
            Tail(str(weird), 0, 16),  # the last 16 bytes
            Tail(str(weird), len(content) - 5, 16),  # an offset past size - limit wins
            Tail(str(weird), len(content), 16),  # nothing past the offset
            Tail(str(weird), 0, 10_000),  # a limit past the start: the whole file
            Tail(missing, 0, 16),
        ]
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        ops.append(Port(port))
        before = host.commands
        answers = await host.batch(ops)
        assert host.commands == before + 1
        listener_holder = await host.port_holder(port)
        listener.close()
        assert answers[Read(str(weird))] == content == await host.read_bytes(str(weird))
        assert answers[Read(str(weird), 5, 7)] == content[5:12] == await host.read_bytes(str(weird), 5, 7)
        assert answers[Read(missing)] is None
        assert answers[Size(str(weird))] == len(content) == await host.file_size(str(weird))
        assert answers[Size(missing)] is None
        assert (
            answers[Exists(str(weird))] is True
            and answers[Exists(missing)] is False
            and answers[Exists("/dev/null")] is True
        )
        assert answers[Alive(sleeper)] is True and answers[Alive(2**22 - 3)] is False
        assert (
            answers[Owns(sleeper, str(tmp_path / "s.log"))] is True
            and answers[Owns(sleeper, str(tmp_path / "other.log"))] is False
        )
        assert (
            await host.owns(sleeper, str(tmp_path / "s.log")) is True
            and await host.owns(sleeper, str(tmp_path / "other.log")) is False
        )
        for offset, limit in (
            (0, 16),
            (len(content) - 5, 16),
            (0, 10_000),
        ):  # what status.read_tail says, in one batch
            single = await read_tail(host, str(weird), offset, limit)
            start = max(offset, len(content) - limit)
            assert answers[Tail(str(weird), offset, limit)] == (start, content[start:]) == single
        assert answers[Tail(missing, 0, 16)] is None and await read_tail(host, missing, 0, 16) is None
        assert (
            answers[Tail(str(weird), len(content), 16)] is None
            and await read_tail(host, str(weird), len(content), 16) is None
        )
        assert answers[Port(1)] is None
        assert answers[Port(port)] == listener_holder
        assert (
            listener_holder is not None
            and listener_holder.pid == os.getpid()
            and listener_holder.pgid == os.getpgid(0)
        )
        assert len(answers) == len(ops) - 1  # read_if_dead on a live group asks nothing
        assert not (tmp_path / "pwned").exists()

        await host.signal_group(sleeper, 9)
        gone = await host.batch([ReadIfDead(sleeper, Read(str(weird)))])
        assert gone in ({Read(str(weird)): content}, {})  # {} only if not yet reaped
    finally:
        await host.close()


def test_garbled_or_truncated_answers_are_refused() -> None:
    ops = [Alive(5), Read("/x")]
    tok = "t" * 32
    good = f"{tok} 0 alive 1\n{tok} 1 data\nabc\n{tok} 1 end\n".encode()
    assert parse_batch(ops, good, tok) == {Alive(5): True, Read("/x"): b"abc"}
    with pytest.raises(Exception, match="unterminated"):
        parse_batch(ops, good[: good.rindex(b"\n" + tok.encode())], tok)
    with pytest.raises(Exception, match="missing or garbled"):
        parse_batch(ops, f"{tok} 0 alive 1\n".encode(), tok)
    # a big fleet is split below the kernel's 128 KiB limit on one argument
    many = [Read("/p/" + "x" * 200 + str(i)) for i in range(2000)]
    chunks = chunk_ops(many)
    assert len(chunks) > 1 and sum(map(len, chunks)) == len(many)


def _comparable(st, *, url: bool = True) -> dict:
    data = st.to_json()
    data.pop("uptime_s")
    if not url:
        data.pop("base_url")  # each new invocation forwards from its own local port
    return data


async def test_fleet_status_is_one_command_per_host_and_says_the_same(sshd_server, tmp_path: Path, fleets) -> None:
    path, _ = write_fleet(
        tmp_path, sshd_server, {"ok1": [], "ok2": [], "oom": ["--fail-at-startup", "gpu_oom"], "never": []}
    )
    fleet = fleets(Fleet.load(path))
    verdicts = await fleet.up(["ok1", "ok2", "oom"], smoke=False)
    assert verdicts["oom"].category is not None and verdicts["ok1"].state.value == "ready"
    await fleet.close()

    # A new invocation: one probe (connect) plus ONE batch for the whole fleet.
    again = fleets(Fleet.load(path))
    statuses = {s.name: s for s in await again.status()}
    host = again.binding("rig").host
    assert isinstance(host, SSHHost)
    assert host.commands == 2, host.commands
    assert {n: s.state for n, s in statuses.items()} == {
        "ok1": Liveness.READY,
        "ok2": Liveness.READY,
        "oom": Liveness.DEAD,
        "never": Liveness.NOT_LAUNCHED,
    }
    assert statuses["oom"].category == "gpu_oom" and statuses["oom"].exit_code not in (None, 0)

    # The same answers, one question at a time, from the unbatched per-server code.
    async with probe_client() as client:
        for name in ("ok1", "ok2", "oom"):
            record = again.store.load(name)
            single = await server_status(record, again.binding("rig"), client)
            assert _comparable(single) == _comparable(statuses[name]), name
            # Both sides build the same question values: status asks nothing its batch did not hold
            # (a question built differently on one side would be a miss here, and a round trip more).
            view = PrefetchedHost(host)
            await view.prefetch(prefetch_questions(record))
            batched = await server_status(record, dataclasses.replace(again.binding("rig"), host=view), client)
            assert view.misses == [] and _comparable(batched) == _comparable(single), (name, view.misses)
        off_by_one = PrefetchedHost(host)
        await off_by_one.prefetch([Read(record.status_path, 1)])
        await server_status(record, dataclasses.replace(again.binding("rig"), host=off_by_one), client)
        assert Read(record.status_path) in off_by_one.misses  # what a drifted question looks like

    # A machine with only the fleet file: records come back from the remote state files in
    # one more batch (two in all), and say the same.
    await again.close()
    shutil.rmtree(tmp_path / ".servefleet")
    fresh = fleets(Fleet.load(path))
    rediscovered = {s.name: s for s in await fresh.status()}
    assert fresh.binding("rig").host.commands == 3
    assert {n: _comparable(s, url=False) for n, s in rediscovered.items()} == {
        n: _comparable(s, url=False) for n, s in statuses.items()
    }
    assert fresh.store.load("ok1") is not None  # saved locally again

    # `up` again from a new invocation: the adopt checks of the whole fleet are one batch
    await fresh.close()
    adopter = fleets(Fleet.load(path))
    outcomes = await adopter.start(["ok1", "ok2"])
    assert {n: o.action.value for n, o in outcomes.items()} == {"ok1": "adopted", "ok2": "adopted"}
    assert adopter.binding("rig").host.commands == 2
    assert {n: o.record.pgid for n, o in outcomes.items()} == {n: statuses[n].pid for n in ("ok1", "ok2")}

    # ... and from a machine with only the fleet file: one more batch, the records come back
    await adopter.close()
    shutil.rmtree(tmp_path / ".servefleet")
    stranger = fleets(Fleet.load(path))
    outcomes = await stranger.start(["ok1", "ok2"])
    assert {n: o.action.value for n, o in outcomes.items()} == {"ok1": "adopted", "ok2": "adopted"}
    assert stranger.binding("rig").host.commands == 3
    assert {n: o.record.pgid for n, o in outcomes.items()} == {n: statuses[n].pid for n in ("ok1", "ok2")}


async def test_a_hung_vllm_server_is_seen_through_the_one_batch(sshd_server, tmp_path: Path, fleets) -> None:
    """Servers under vLLM's profile (the sim printing vLLM's log): `status` also reads the end of each
    serving server's log for the engine's statistics (status.serving_stall), inside the same batch."""
    path, _ = write_fleet(tmp_path, sshd_server, {"v1": ["--style", "vllm"], "v2": ["--style", "vllm"]})
    text = path.read_text().replace(
        'engine = "sim"', f'engine = "vllm"\ncommand = {json.dumps([sys.executable, "-m", "servefleet.sim"])}'
    )
    path.write_text(text)
    fleet = fleets(Fleet.load(path))
    verdicts = await fleet.up(smoke=False)
    assert {n: v.state.value for n, v in verdicts.items()} == {"v1": "ready", "v2": "ready"}
    log = Path(fleet.store.load("v1").log_path)
    with log.open("a") as fh:  # the line vLLM logged on the H200 with its EngineCore SIGSTOPped
        fh.write(
            (
                Path(__file__).parent / "fixtures" / "logs" / "serving" / "vllm026_h200_enginecore_sigstop.log"
            ).read_text()
        )
    await fleet.close()

    again = fleets(Fleet.load(path))
    statuses = {s.name: s for s in await again.status()}
    assert again.binding("rig").host.commands == 2  # the connect probe and ONE batch, tails included
    assert statuses["v1"].state == Liveness.HUNG and "256 requests running" in (statuses["v1"].detail or "")
    assert statuses["v2"].state == Liveness.READY


def test_status_table_shows_the_unit_only_when_some_server_has_one() -> None:
    from rich.console import Console

    from servefleet.cli.fleet_view import status_table
    from servefleet.fleet.status import ServerStatus

    plain = ServerStatus(name="a", host="rig", port=1, pid=11, state=Liveness.READY)
    unit = ServerStatus(
        name="b", host="rig", port=2, pid=22, state=Liveness.READY, unit="servefleet-sd-b-1a2b.service"
    )

    def columns(statuses: list[ServerStatus]) -> list[str]:
        return [str(c.header) for c in status_table("f", statuses).columns]

    def text(statuses: list[ServerStatus]) -> str:
        console = Console(width=300, record=True)
        console.print(status_table("f", statuses))
        return console.export_text()

    assert "unit" not in columns([plain])
    assert columns([plain, unit])[5] == "unit"
    shown = text([plain, unit])
    assert "servefleet-sd-b-1a2b.service" in shown
    assert plain.to_json()["unit"] is None and unit.to_json()["unit"] == "servefleet-sd-b-1a2b.service"
