"""`servefleet generate` end to end against a real engine: `transformers serve` on a tiny model
built here (chat and completions records, a bad line, then a resume that sends nothing)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from parquet_read import read_parquet


@pytest.mark.engine
@pytest.mark.timeout(900)
def test_generate_against_transformers_serve(transformers_serve, tmp_path: Path) -> None:
    url, model = transformers_serve
    src = tmp_path / "in.jsonl"
    src.write_text(
        "\n".join(
            [
                json.dumps({"id": "c1", "prompt": "The capital of France is"}),
                json.dumps({"id": "c2", "messages": [{"role": "user", "content": "Say hello."}]}),
                json.dumps(
                    {
                        "custom_id": "c3",
                        "url": "/v1/chat/completions",
                        "body": {"messages": [{"role": "user", "content": "Count to three."}]},
                    }
                ),
                "{not json",
            ]
        )
        + "\n"
    )
    argv = [
        sys.executable,
        "-m",
        "servefleet.cli.main",
        "generate",
        "-i",
        str(src),
        "-o",
        str(tmp_path / "out"),
        "--url",
        url,
        "--model",
        str(model),
        "--max-tokens",
        "6",
        "--temperature",
        "0",
        "--concurrency",
        "2",
        "--json",
    ]
    first = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    again = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    report = json.loads(first.stdout or "{}")
    # the bad line is an input record without an answer: incomplete, exit 1
    assert first.returncode == 1 and report["status"] == "incomplete", first.stdout + first.stderr[-3000:]
    assert report["committed"] == 3 and report["rejected"] == 1 and report["completion_tokens"] > 0
    rows = {r["id"]: r for r in read_parquet(tmp_path / "out" / "shards").to_pylist()}
    assert set(rows) == {"c1", "c2", "c3"}
    for r in rows.values():
        assert r["finish_reason"] in ("length", "stop") and 0 < (r["completion_tokens"] or 0) <= 6
        assert isinstance(r["text"], str)
    resumed = json.loads(again.stdout)
    assert again.returncode == 1 and resumed["done_before"] == 3 and resumed["to_send"] == 0
