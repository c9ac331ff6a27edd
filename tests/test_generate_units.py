"""generate: the pure parts -- input records, pre-pass, retry policy, concurrency control, shards,
ledger and sinks on a local folder, the job manifest."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from servefleet.generate import prepass as prepass_mod
from servefleet.generate.inputs import PromptRecord, Reject, RequestDefaults, parse_raw
from servefleet.generate.job import InputInfo, JobManifest, JobParams, RunRecord
from servefleet.generate.ledger import LEDGER_DIR, SHARDS_DIR, Ledger
from servefleet.generate.prepass import CHECK, SEND, SKIP, run_prepass
from servefleet.generate.retry import RetryPolicy
from servefleet.generate.shards import OutputRow, ShardBuffer, ShardLimits, read_shard_ids, shard_schema
from servefleet.generate.sinks import DestinationBusy, LocalSink
from servefleet.http import FailureKind, RequestFailure

D = RequestDefaults()


def parse(obj: object, defaults: RequestDefaults = D, line: int = 1) -> PromptRecord | Reject | None:
    raw = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
    return parse_raw(line, raw, defaults)


# ---- input records ------------------------------------------------------------------------------


def test_batch_format_url_picks_endpoint_and_defaults_fill_gaps():
    rec = parse(
        {
            "custom_id": "a",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True},
        },
        RequestDefaults(max_tokens=64, temperature=0.5, token_ids=True),
    )
    assert isinstance(rec, PromptRecord)
    assert (rec.id, rec.endpoint) == ("a", "chat")
    assert rec.body["max_tokens"] == 64 and rec.body["temperature"] == 0.5 and rec.body["return_token_ids"] is True
    assert "stream" not in rec.body  # bulk: streaming off


def test_record_values_win_over_defaults_and_prompt_goes_to_completions():
    rec = parse(
        {"id": 7, "prompt": "hello", "max_tokens": 3, "temperature": 0},
        RequestDefaults(max_tokens=64, temperature=1.0),
    )
    assert isinstance(rec, PromptRecord)
    assert (rec.id, rec.endpoint, rec.body) == (
        "7",
        "completions",
        {"prompt": "hello", "max_tokens": 3, "temperature": 0},
    )


def test_chat_mode_wraps_prompts_and_completions_mode_refuses_messages():
    rec = parse({"id": "x", "prompt": "hello"}, RequestDefaults(mode="chat"))
    assert isinstance(rec, PromptRecord) and rec.endpoint == "chat"
    assert rec.body["messages"] == [{"role": "user", "content": "hello"}] and "prompt" not in rec.body
    bad = parse({"id": "x", "messages": [{"role": "user", "content": "hi"}]}, RequestDefaults(mode="completions"))
    assert isinstance(bad, Reject) and "chat endpoint" in bad.reason


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"{not json", "invalid JSON"),
        (b"\xff\xfe{}", "not UTF-8"),
        (b"[1, 2]", "must be a JSON object"),
        ({"prompt": "no id"}, "missing or invalid 'id'"),
        ({"id": "", "prompt": "x"}, "empty 'id'"),
        ({"id": True, "prompt": "x"}, "must be a string or an integer"),
        ({"id": "a"}, "no 'prompt' or 'messages'"),
        ({"id": "a", "prompt": "x", "messages": [{"role": "user"}]}, "both"),
        ({"id": "a", "messages": []}, "non-empty list"),
        ({"id": "a", "messages": [{"content": "no role"}]}, "string 'role'"),
        ({"id": "a", "prompt": ["two", "prompts"]}, "one prompt per record"),
        ({"id": "a", "prompt": "x", "n": 2}, "n=2"),
        ({"custom_id": "a", "body": "[]"}, "object 'body'"),
        ({"custom_id": "a", "url": "/v1/embeddings", "body": {"prompt": "x"}}, "unsupported url"),
        ({"custom_id": "a", "method": "GET", "body": {"prompt": "x"}}, "method must be POST"),
    ],
)
def test_invalid_records_are_rejected_with_a_reason(raw, reason):
    rej = parse(raw, line=42)
    assert isinstance(rej, Reject)
    assert rej.line == 42 and reason in rej.reason
    assert rej.text  # the excerpt a person can search for


def test_blank_lines_are_skipped_silently():
    assert parse_raw(3, b"   \r", D) is None


# ---- pre-pass -----------------------------------------------------------------------------------


def write_jsonl(path: Path, lines: list[object]) -> None:
    with open(path, "wb") as f:
        for x in lines:
            f.write((x if isinstance(x, bytes) else json.dumps(x).encode()) + b"\n")


def test_prepass_rejects_bad_lines_and_later_duplicates_with_line_numbers(tmp_path):
    src = tmp_path / "in.jsonl"
    write_jsonl(
        src,
        [
            {"id": "a", "prompt": "1"},
            b"oops",
            {"id": "b", "prompt": "2"},
            b"",
            {"id": "a", "prompt": "again"},
            {"id": "c"},
            {"id": "b", "prompt": "3"},
        ],
    )
    rejects: list[Reject] = []
    pp = run_prepass(str(src), D, rejects.append)
    assert (pp.lines, pp.valid, pp.rejected, pp.duplicates) == (7, 2, 4, 2)
    assert sorted((r.line, r.reason.split(" (")[0]) for r in rejects) == [
        (2, "invalid JSON: Expecting value: line 1 column 1"),
        (5, "duplicate id"),
        (6, "no 'prompt' or 'messages'"),
        (7, "duplicate id"),
    ]
    assert "first seen on line 1" in next(r.reason for r in rejects if r.line == 5)
    assert list(pp.plan()) == [SEND, SKIP, SEND, SKIP, SKIP, SKIP, SKIP]
    assert len(pp.sha256) == 64


def test_prepass_tells_hash_collisions_from_duplicates(tmp_path, monkeypatch):
    """Force every id onto one hash: distinct ids must survive, only the true duplicate goes."""
    monkeypatch.setattr(prepass_mod, "id_hash", lambda rid: 12345)
    src = tmp_path / "in.jsonl"
    write_jsonl(
        src,
        [
            {"id": "a", "prompt": "1"},
            {"id": "b", "prompt": "2"},
            {"id": "a", "prompt": "3"},
            {"id": "c", "prompt": "4"},
        ],
    )
    rejects: list[Reject] = []
    pp = run_prepass(str(src), D, rejects.append)
    assert (pp.valid, pp.duplicates) == (3, 1)
    assert [r.line for r in rejects] == [3]
    assert pp.collisions == frozenset({12345})


def test_prepass_reads_parquet_rows(tmp_path):
    src = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": ["a", "b", None, "a"], "prompt": ["x", "y", "z", "w"]}), src)
    rejects: list[Reject] = []
    pp = run_prepass(str(src), D, rejects.append)
    assert (pp.lines, pp.valid, pp.duplicates) == (4, 2, 1)
    assert sorted(r.line for r in rejects) == [3, 4]


# ---- retry policy -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("failure", "retryable", "server_fault", "overload"),
    [
        (RequestFailure(FailureKind.CONNECT, "refused"), True, True, False),
        (RequestFailure(FailureKind.DISCONNECT, "reset"), True, True, False),
        (RequestFailure(FailureKind.TIMEOUT, "slow"), True, True, False),
        (RequestFailure(FailureKind.PROTOCOL, "no choices"), True, False, False),
        (RequestFailure(FailureKind.HTTP, "busy", 429), True, False, True),
        (RequestFailure(FailureKind.HTTP, "busy", 503), True, False, True),
        (RequestFailure(FailureKind.HTTP, "boom", 500), True, False, False),
        (RequestFailure(FailureKind.HTTP, "too long", 400), False, False, False),
        (RequestFailure(FailureKind.HTTP, "no model", 404), False, False, False),
    ],
)
def test_failure_classification(failure, retryable, server_fault, overload):
    assert (failure.retryable, failure.server_fault, failure.overload) == (retryable, server_fault, overload)


def test_backoff_is_jittered_exponential_capped_and_honours_retry_after():
    policy = RetryPolicy(max_attempts=4, base_s=1.0, cap_s=8.0, rng=random.Random(1))
    for attempts in range(1, 8):
        assert 0 <= policy.backoff(attempts) <= min(8.0, 2 ** (attempts - 1))
    assert policy.backoff(1, retry_after_s=5) >= 5
    assert policy.backoff(1, retry_after_s=500) <= 8.0
    busy = RequestFailure(FailureKind.HTTP, "", 429)
    assert policy.decide(busy, 3).retry and not policy.decide(busy, 4).retry
    assert not policy.decide(RequestFailure(FailureKind.HTTP, "", 400), 1).retry


# ---- shards, ledger, local sink -------------------------------------------------------------------


def rows(ids: list[str], start_line: int = 1) -> list[OutputRow]:
    return [OutputRow(i, start_line + k, f"text {i}", "length", 3, 5, "m", "s0", 1, 0.1) for k, i in enumerate(ids)]


def buffer_of(ids: list[str], start_line: int = 1, fmt_rows: int = 1000) -> ShardBuffer:
    buf = ShardBuffer(shard_schema(False, False), ShardLimits(rows=fmt_rows))
    for r in rows(ids, start_line):
        buf.add(r)
    return buf


def test_shard_buffer_rotates_by_rows_bytes_and_age():
    b = ShardBuffer(shard_schema(False, False), ShardLimits(rows=3, bytes=10**9, seconds=100))
    for r in rows(["a", "b"]):
        b.add(r)
    assert not b.full()
    b.add(rows(["c"])[0])
    assert b.full()
    taken = b.take()
    assert len(taken) == 3 and len(b) == 0
    b2 = ShardBuffer(shard_schema(False, False), ShardLimits(rows=100, bytes=10**9, seconds=5))
    b2.add(rows(["a"])[0])
    assert not b2.full(now=b2.started + 1) and b2.full(now=b2.started + 6)


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_committed_shard_is_whole_and_carries_its_ids(tmp_path, fmt):
    sink = LocalSink(str(tmp_path / "out"))
    ledger = Ledger(sink, fmt, "20260101T000000-abcd", "sha")
    entry = ledger.commit(buffer_of(["a", "b", "c"], start_line=10))
    shard = tmp_path / "out" / SHARDS_DIR / entry.shard
    assert shard.is_file() and not os.listdir(tmp_path / "out" / ".staging")
    ids, lines = read_shard_ids(shard.read_bytes(), fmt)
    assert (ids, lines) == (["a", "b", "c"], [10, 11, 12])
    done = Ledger(sink, fmt, "20260101T000001-abcd", "sha").scan(None)
    assert (done.rows, done.shards, done.by_line) == (3, 1, True)


def test_scan_rebuilds_a_missing_entry_and_drops_an_entry_without_shard(tmp_path):
    sink = LocalSink(str(tmp_path / "out"))
    ledger = Ledger(sink, "parquet", "20260101T000000-abcd", "sha")
    e1 = ledger.commit(buffer_of(["a", "b"], 1))
    e2 = ledger.commit(buffer_of(["c"], 3))
    # killed between the shard's rename and its entry's
    os.remove(tmp_path / "out" / LEDGER_DIR / (e1.shard.rsplit(".", 1)[0] + ".json"))
    # a shard someone deleted: its ids are not done any more
    os.remove(tmp_path / "out" / SHARDS_DIR / e2.shard)
    manifest = JobManifest(
        input=InputInfo(
            path="x", kind="jsonl", size=1, mtime_ns=1, sha256="sha", lines=3, valid=3, rejected=0, duplicates=0
        ),
        params=JobParams(),
    )
    manifest.runs.append(RunRecord(run_id="20260101T000000-abcd", input_sha256="sha"))
    done = Ledger(sink, "parquet", "20260101T000001-abcd", "sha").scan(manifest)
    assert (done.rows, done.rebuilt, done.dropped, done.by_line) == (2, 1, 1, True)
    assert sorted(done.lines.tolist()) == [1, 2]
    assert (tmp_path / "out" / LEDGER_DIR / (e1.shard.rsplit(".", 1)[0] + ".json")).is_file()


def test_done_set_by_line_and_by_id(tmp_path, monkeypatch):
    src = tmp_path / "in.jsonl"
    write_jsonl(src, [{"id": f"p{i}", "prompt": "x"} for i in range(6)])
    pp = run_prepass(str(src), D, lambda r: None)
    sink = LocalSink(str(tmp_path / "out"))
    Ledger(sink, "parquet", "20260101T000000-abcd", pp.sha256).commit(buffer_of(["p1", "p4"], 2))
    # same input: by line (the ledger's lines say 2 and 3 -- deliberately not p1/p4's lines)
    done = Ledger(sink, "parquet", "20260101T000001-abcd", pp.sha256).scan(None)
    plan = pp.plan()
    assert done.by_line and done.apply(plan, pp) == 2 and list(plan) == [SEND, SKIP, SKIP, SEND, SEND, SEND]
    # another input version: by id
    done = Ledger(sink, "parquet", "20260101T000001-abcd", "other-sha").scan(None)
    plan = pp.plan()
    assert not done.by_line and done.apply(plan, pp) == 2 and list(plan) == [SEND, SKIP, SEND, SEND, SKIP, SEND]


def test_done_by_id_compares_exactly_where_hashes_collide(tmp_path, monkeypatch):
    monkeypatch.setattr(prepass_mod, "id_hash", lambda rid: 7 if rid in ("p1", "p2") else hash(rid))
    src = tmp_path / "in.jsonl"
    write_jsonl(src, [{"id": f"p{i}", "prompt": "x"} for i in range(4)])
    pp = run_prepass(str(src), D, lambda r: None)
    sink = LocalSink(str(tmp_path / "out"))
    Ledger(sink, "parquet", "20260101T000000-abcd", "old").commit(buffer_of(["p1", "p3"], 1))
    done = Ledger(sink, "parquet", "20260101T000001-abcd", pp.sha256).scan(None, pp.collisions)
    plan = pp.plan()
    done.apply(plan, pp)
    assert list(plan) == [SEND, CHECK, CHECK, SKIP]
    assert done.is_done_exact("p1") and not done.is_done_exact("p2")


def test_local_sink_lock_is_exclusive_and_staging_leftovers_are_discarded(tmp_path):
    a, b = LocalSink(str(tmp_path)), LocalSink(str(tmp_path))
    with a.lock():
        with pytest.raises(DestinationBusy, match=str(os.getpid())):
            with b.lock():
                pass
    with b.lock():
        pass
    leftover = a.new_staging_file(".parquet")
    assert os.path.exists(leftover) and a.discard_partial() == 1 and not os.path.exists(leftover)


def test_manifest_mismatch_names_what_changed():
    info = InputInfo(
        path="a", kind="jsonl", size=1, mtime_ns=1, sha256="a" * 64, lines=1, valid=1, rejected=0, duplicates=0
    )
    m = JobManifest(input=info, params=JobParams(max_tokens=10))
    assert m.mismatch(info.model_copy(update={"path": "elsewhere"}), JobParams(max_tokens=10)) == []
    problems = m.mismatch(info.model_copy(update={"sha256": "b" * 64}), JobParams(max_tokens=20, format="jsonl"))
    assert any("input content changed" in p for p in problems)
    assert "max_tokens: 10 -> 20" in problems and "format: 'parquet' -> 'jsonl'" in problems
    assert JobManifest.from_bytes(m.to_bytes()) == m


def test_a_failed_restart_is_described_with_its_diagnosis():
    from servefleet.catalog import Category, State
    from servefleet.generate.endpoints import describe_verdict
    from servefleet.verify.verdict import Evidence, Verdict

    v = Verdict(
        state=State.FAILED,
        category=Category.GPU_OOM,
        evidence=Evidence(line_no=812, text="torch.OutOfMemoryError: CUDA out of memory"),
        hint="lower --mem-fraction-static",
    )
    assert (
        describe_verdict(v)
        == "failed [gpu_oom] log line 812: torch.OutOfMemoryError: CUDA out of memory -- lower --mem-fraction-static"
    )
    assert (
        describe_verdict(Verdict(state=State.READY, message="GET /health answered 200"))
        == "ready (GET /health answered 200)"
    )


def test_rate_meter_counts_the_recent_window_only():
    from servefleet.generate.stats import RateMeter

    m = RateMeter(window_s=10.0, bucket_s=0.25)
    for i in range(200):  # 20 s at 10 events/s of 5 units: 50 units/s
        m.add(5, now=100.0 + i * 0.1)
    assert m.rate(now=120.0) == pytest.approx(50, rel=0.05)
    assert m.rate(now=140.0) == 0.0  # nothing in the last 10 s
    assert len(m._buckets) == 0


def test_a_servers_lifetime_follows_its_recent_answers_not_the_jobs_mean():
    """Windows are sized in request lifetimes: after the limit went up (1 s answers, then 10 s ones) the
    recent latency says 10 s while the job's mean still says about 6."""
    from servefleet.generate.stats import ServerStats

    st = ServerStats("s", "http://127.0.0.1:1")
    assert st.lifetime_s() == 0.0
    for latency in [1.0] * 100 + [10.0] * 100:
        st.requests += 1
        st.add_latency(latency)
    assert st.mean_latency_s() == pytest.approx(5.5)
    assert st.lifetime_s() == pytest.approx(10.0, rel=0.01)


def test_answers_that_end_together_read_as_waves_and_a_datasets_lengths_do_not():
    """Uniform work (every answer the same length) ends in waves: latencies alike. A dataset's lengths (64-768
    tokens) spread them well past SPREAD. Too few answers say nothing."""
    import random

    from servefleet.generate.concurrency import SPREAD
    from servefleet.generate.stats import ServerStats

    rng = random.Random(0)
    uniform, variable = ServerStats("u", "http://127.0.0.1:1"), ServerStats("v", "http://127.0.0.1:2")
    for _ in range(7):
        uniform.add_latency(4.0)
    assert uniform.latency_spread() is None
    for _ in range(200):
        uniform.add_latency(4.0 + rng.uniform(-0.3, 0.3))  # queueing jitter
        variable.add_latency(rng.randint(64, 768) / 100)
    assert uniform.latency_spread() < 0.1 < SPREAD < variable.latency_spread()


@pytest.mark.parametrize("chunk", [7, 64, 1 << 20])
def test_iter_pending_yields_exactly_the_lines_not_skipped(tmp_path, chunk):
    from servefleet.generate.inputs import iter_pending, iter_raw

    src = tmp_path / "in.jsonl"
    src.write_bytes(b"".join(b'{"id": "%d"}\n' % i for i in range(500)) + b'{"id": "last, no newline"}')
    rng = random.Random(chunk)
    skip = bytearray(rng.choice([0, 1, 1, 1, 2]) for _ in range(480))  # the last 21 lines are past the plan
    skip[100:400] = b"\x01" * 300  # long runs of skipped lines: whole chunks are passed over
    want = [(line, raw) for line, raw in iter_raw(str(src)) if line > len(skip) or skip[line - 1] != 1]
    got = list(iter_pending(str(src), skip, 1, chunk_bytes=chunk))
    assert got == want and got[-1] == (501, b'{"id": "last, no newline"}')
