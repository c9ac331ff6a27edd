"""What the tail of a finished run cost, from its timeline (generate/tail.py), and the report's view of it."""

from __future__ import annotations

from servefleet.generate.tail import tail_of_timeline


def _server(busy_until: int, n: int = 10) -> dict:
    flight = [2 if i < busy_until else 0 for i in range(n)]
    zeros = [0] * n
    return {
        "in_flight_max": flight,
        "in_flight_mean": flight,
        "output_tokens": zeros,
        "requests": zeros,
        "errors": zeros,
        "limit": [4] * n,
        "down_s": zeros,
    }


def _timeline(servers: dict, events: list[dict], messages: list[dict], status: str = "complete") -> dict:
    return {
        "started": 100.0,
        "updated_unix": 110.0,
        "bucket_s": 1.0,
        "buckets": 10,
        "status": status,
        "run_id": "r1",
        "servers": servers,
        "events": {"items": events},
        "messages": {"items": messages},
    }


def test_idle_at_the_tail_runs_from_each_servers_last_request_to_its_release_or_the_end() -> None:
    tl = _timeline(
        {"a": _server(4), "b": _server(10), "c": _server(7), "d": _server(2), "e": _server(8)},
        events=[
            {"t": 2.0, "server": "d", "kind": "outage"},  # out for good: not idle, not held up
            {"t": 1.0, "server": "e", "kind": "outage"},
            {"t": 2.0, "server": "e", "kind": "back"},
            {"t": 5.0, "server": "a", "kind": "outage"},
        ],
        messages=[
            {"t": 5.0, "text": "a: released at the tail (--release-tail): the prompts left cannot keep it busy"},
            {"t": 6.0, "text": "c: something else"},
        ],
    )
    out = tail_of_timeline(tl)
    assert {n: p["idle_s"] for n, p in out["per_server"].items()} == {"a": 1.0, "b": 0.0, "c": 3.0, "d": 0.0, "e": 2.0}
    assert {n: p["released_s"] for n, p in out["per_server"].items()} == {
        "a": 5.0,
        "b": 0.0,
        "c": 0.0,
        "d": 0.0,
        "e": 0.0,
    }
    assert (out["idle_server_s"], out["released_server_s"], out["released"], out["job_s"]) == (6.0, 5.0, 1, 10.0)


def test_a_server_that_joined_and_never_served_is_idle_from_its_join() -> None:
    out = tail_of_timeline(
        _timeline({"a": _server(10), "late": _server(0)}, [{"t": 6.5, "server": "late", "kind": "join"}], [])
    )
    assert out["per_server"]["late"]["idle_s"] == 3.5 and out["idle_server_s"] == 3.5


def test_the_report_shows_the_tail_only_of_a_completed_run(tmp_path) -> None:
    from servefleet.cli.report_cmd import _tail
    from servefleet.cli.report_html import job_html
    from servefleet.generate.job_record import JobRecord, job_series

    done = _timeline(
        {"a": _server(4), "b": _server(10)},
        [],
        [{"t": 5.0, "text": "a: released at the tail (--release-tail): the prompts left cannot keep it busy"}],
    )
    assert _tail([done]) == {"run_id": "r1", **tail_of_timeline(done)}
    assert _tail([{**done, "status": "interrupted"}]) is None and _tail([]) is None
    tail = _tail([done])
    page = job_html(
        job_series(JobRecord(destination="x", manifest={}, timelines=[done])),
        {"state": "complete"},
        plan=None,
        plan_note=None,
        failures={},
        manifest={},
        tail=tail,
    )
    assert '<h2>The tail</h2><p id="tail">1.0 server-seconds idle at the tail' in page
    assert "--release-tail gave back 5.0 server-seconds (1 server(s) released" in page
    assert "<tr><td>a</td><td>1.0 s</td><td>5.0 s</td></tr>" in page
    assert "The tail" not in job_html(
        job_series(JobRecord(destination="x", manifest={}, timelines=[done])),
        {"state": "complete"},
        plan=None,
        plan_note=None,
        failures={},
        manifest={},
    )
