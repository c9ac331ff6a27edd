"""The coordinator process itself: its open-file limit, its garbage-collector settings, and the
per-completion path of the client (JSON encoding and decoding, request URLs)."""

from __future__ import annotations

import gc
import json
import resource
import subprocess

import pytest

from conftest import SimProcess
from servefleet.generate import client, runner
from servefleet.http import FailureKind, RequestFailure
from test_generate_sim import INSTANT_SIM, committed_ids, generate_argv, write_prompts


@pytest.fixture(scope="module")
def wide_sim(tmp_path_factory: pytest.TempPathFactory):
    log = tmp_path_factory.mktemp("sim") / "sim.log"
    proc = SimProcess(*INSTANT_SIM, "--max-running", "2048", log_path=log).start().wait_ready()
    yield proc
    proc.stop()


def _low_nofile(limit: int):
    def apply() -> None:
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))

    return apply


def test_more_requests_in_flight_than_the_soft_open_file_limit_still_completes(wide_sim, tmp_path):
    """Every request in flight holds a socket: with a soft limit of 256 and 600 in flight, connects
    failed with EMFILE ("Too many open files") until generate raised the soft limit to the hard one."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2048:
        pytest.skip(f"hard open-file limit {hard} leaves no room to raise")
    n = 1500
    src = write_prompts(tmp_path / "in.jsonl", n)
    out = tmp_path / "out"
    argv = generate_argv(src, out, "--url", wide_sim.url, extra=("--concurrency", "600", "--max-attempts", "1"))
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=180, preexec_fn=_low_nofile(256))
    report = json.loads(proc.stdout)
    assert report["status"] == "complete", (report["status"], report.get("events"), proc.stderr[-2000:])
    assert report["failed"] == 0 and report["retries"] == 0
    assert sorted(committed_ids(out)) == sorted(f"p{i}" for i in range(n))
    assert any("open-file limit raised from 256" in e for e in report["events"]), report["events"]


def test_raise_open_files_limit_keeps_a_higher_soft_limit_and_reports_what_it_changed():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(128, soft), hard))
        changed = runner.raise_open_files_limit(cap=512)
        assert changed == (min(128, soft), min(512, hard) if hard != resource.RLIM_INFINITY else 512)
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == changed[1]
        assert runner.raise_open_files_limit(cap=256) is None  # never lowered
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_fewer_collections_restores_the_settings_when_the_last_overlapping_run_ends():
    before = gc.get_threshold()
    a, b = runner.fewer_collections(), runner.fewer_collections()
    a.__enter__()
    assert gc.get_threshold() == runner.GC_THRESHOLDS and gc.get_freeze_count() > 0
    b.__enter__()
    a.__exit__(None, None, None)  # overlapping, not nested: the first to start ends first
    assert gc.get_threshold() == runner.GC_THRESHOLDS and gc.get_freeze_count() > 0
    b.__exit__(None, None, None)
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0


# ---- the per-completion path: orjson, with the stdlib for what orjson refuses -------------------


def test_request_bodies_that_orjson_refuses_are_still_encoded():
    big = {"prompt": "x", "seed": 2**70, "logit_bias": {"50256": -100}}
    assert json.loads(client.encode_body(big)) == big  # beyond 64 bits: the stdlib path
    plain = {"prompt": "héllo ☃", "max_tokens": 4}
    assert json.loads(client.encode_body(plain)) == plain


def test_answers_with_nan_literals_parse_and_broken_ones_are_protocol_failures():
    nan_answer = (
        b'{"choices":[{"text":"ok","finish_reason":"stop","logprobs":{"x":NaN}}],"usage":{"completion_tokens":1}}'
    )
    parsed = client._parse(nan_answer, "completions")
    assert isinstance(parsed, client.Completion) and parsed.text == "ok" and parsed.completion_tokens == 1
    broken = client._parse(b'{"choices":[{"text":"cut', "completions")
    assert isinstance(broken, RequestFailure) and broken.kind is FailureKind.PROTOCOL
    chat = client._parse(b'{"choices":[{"message":{"content":"hi","reasoning_content":"r"}}],"model":"m"}', "chat")
    assert isinstance(chat, client.Completion) and (chat.text, chat.reasoning, chat.model) == ("hi", "r", "m")


def test_the_request_url_is_parsed_once_per_server_and_endpoint():
    c = client.Client()
    a = c._url("http://127.0.0.1:8000/", "completions")
    assert str(a) == "http://127.0.0.1:8000/v1/completions"
    assert c._url("http://127.0.0.1:8000/", "completions") is a
    assert str(c._url("http://127.0.0.1:8000/", "chat")) == "http://127.0.0.1:8000/v1/chat/completions"


@pytest.mark.parametrize(
    ("planned", "soft", "warns"),
    [
        (1000, 1024, True),
        (700, 1024, False),
        (768, 1024, False),
        (769, 1024, True),
        (10**6, resource.RLIM_INFINITY, False),
    ],
)
def test_planned_in_flight_beyond_the_open_file_limit_is_announced(planned, soft, warns):
    text = runner.open_files_warning(planned, soft)
    assert (text is not None) == warns
    if warns:
        assert f"{planned:,} requests planned in flight" in text and "--concurrency" in text
