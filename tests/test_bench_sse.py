"""The streaming parser: payload splitting across reads and the cheap field scanner."""

from __future__ import annotations

import json

import pytest

from servefleet.bench.sse import SSESplitter, error_message, extract_text, int_after, scan_payload


def test_splitter_joins_lines_split_across_reads_and_skips_non_data() -> None:
    sp = SSESplitter()
    assert sp.feed(b'data: {"a":1}\n\nda') == [b'{"a":1}']
    assert sp.feed(b'ta: {"b":2}\r\n\r\n: keep-alive comment\nevent: x\n') == [b'{"b":2}']
    assert sp.feed(b"data: [DONE]") == []
    assert sp.flush() == [b"[DONE]"]


@pytest.mark.parametrize(
    "obj, text_len, completion, prompt",
    [
        ({"choices": [{"delta": {"content": " hello"}}], "usage": None}, 6, None, None),
        ({"choices": [{"delta": {"role": "assistant", "content": ""}}]}, 0, None, None),
        ({"choices": [{"delta": {"content": None, "reasoning_content": "think"}}]}, 5, None, None),
        (
            {"choices": [{"text": "ab"}], "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}},
            2,
            3,
            7,
        ),
        ({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 12}}, 0, 12, 7),
        # escaped quotes and backslashes inside the text must not end the string early
        ({"choices": [{"delta": {"content": 'say "hi" \\ ok'}}]}, len(json.dumps('say "hi" \\ ok')) - 2, None, None),
    ],
)
@pytest.mark.parametrize("separators", [(",", ":"), (", ", ": ")])
def test_scan_payload_matches_a_real_parse(obj, text_len, completion, prompt, separators) -> None:
    payload = json.dumps(obj, separators=separators).encode()
    scan = scan_payload(payload)
    assert scan.text_bytes == text_len
    assert scan.completion_tokens == completion
    assert scan.prompt_tokens == prompt
    assert not scan.done and not scan.error


def test_scan_flags_done_and_error_events() -> None:
    assert scan_payload(b"[DONE]").done
    err = b'{"error": {"message": "out of KV cache", "code": 500}}'
    assert scan_payload(err).error
    assert error_message(err) == "out of KV cache"
    # the word "error" inside generated text is escaped JSON, not an error object
    assert not scan_payload(json.dumps({"choices": [{"delta": {"content": 'an "error" here'}}]}).encode()).error


def test_extract_text_and_int_after() -> None:
    body = json.dumps({"choices": [{"message": {"content": "four five"}}]}).encode()
    assert extract_text(body) == "four five"
    assert int_after(b'"n": 42,', 4) == 42
    assert int_after(b'"n":null', 4) is None


def test_scan_arrival_agrees_with_event_by_event_scanning() -> None:
    from servefleet.bench.sse import scan_arrival

    chunks = [
        {
            "choices": [{"delta": {"role": "assistant", "content": ""}}],
            "usage": {"prompt_tokens": 9, "completion_tokens": 0},
        },
        {
            "choices": [{"delta": {"content": 'a "quoted" \\ word'}}],
            "usage": {"prompt_tokens": 9, "completion_tokens": 3},
        },
        {
            "choices": [{"delta": {"content": None, "reasoning_content": "hmm"}}],
            "usage": {"prompt_tokens": 9, "completion_tokens": 4},
        },
        {"choices": [{"text": " plain"}], "usage": {"prompt_tokens": 9, "completion_tokens": 5}},
    ]
    payloads = [
        json.dumps(c, separators=sep).encode() for c, sep in zip(chunks, [(",", ":"), (", ", ": ")] * 2, strict=True)
    ]
    buf = b"".join(b"data: " + p + b"\n\n" for p in payloads) + b"data: [DONE]\n\n"
    arrival = scan_arrival(buf)
    scans = [scan_payload(p) for p in payloads]
    assert arrival.text_bytes == sum(s.text_bytes for s in scans)
    assert (arrival.text_events, arrival.usage_events, arrival.events) == (3, 4, 5)
    assert (arrival.completion_tokens, arrival.prompt_tokens, arrival.error) == (5, 9, False)
    assert scan_arrival(b'data: {"error":{"message":"x"}}\n\n').error
