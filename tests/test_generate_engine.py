"""`servefleet generate` end to end against a real engine: `transformers serve` on a tiny model
built here (chat and completions records, a bad line, then a resume that sends nothing)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from servefleet.engines.base import LaunchSpec
from servefleet.engines.transformers import TransformersEngine

from conftest import free_port, wait_until


def _health(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None


@pytest.mark.engine
@pytest.mark.timeout(900)
def test_generate_against_transformers_serve(tmp_path: Path) -> None:
    from servefleet.modelgen import build_tiny_model, spec_from_preset

    model = tmp_path / "tiny"
    build_tiny_model(model, spec_from_preset("tiny", seed=5))
    port = free_port()
    engine = TransformersEngine()
    spec = LaunchSpec(model=str(model), port=port, extra_args=("--device", "cpu"), python=sys.executable)
    env = {**os.environ, **engine.build_env(spec), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    log = tmp_path / "serve.log"
    with log.open("wb") as fh:
        server = subprocess.Popen(engine.build_argv(spec), stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join([
        json.dumps({"id": "c1", "prompt": "The capital of France is"}),
        json.dumps({"id": "c2", "messages": [{"role": "user", "content": "Say hello."}]}),
        json.dumps({"custom_id": "c3", "url": "/v1/chat/completions", "body": {"messages": [{"role": "user", "content": "Count to three."}]}}),
        "{not json",
    ]) + "\n")
    argv = [sys.executable, "-m", "servefleet.cli.main", "generate", "-i", str(src), "-o", str(tmp_path / "out"), "--url", url,
            "--model", str(model), "--max-tokens", "6", "--temperature", "0", "--concurrency", "2", "--json"]
    try:
        def ready() -> bool:
            if server.poll() is not None:
                raise AssertionError(f"transformers serve exited with {server.returncode}:\n{log.read_text()[-3000:]}")
            return _health(url) == 200

        wait_until(ready, timeout=600, interval=0.5, what="transformers serve /health")
        first = subprocess.run(argv, capture_output=True, text=True, timeout=600)
        again = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
    report = json.loads(first.stdout or "{}")
    assert first.returncode == 0 and report["status"] == "complete", first.stdout + first.stderr[-3000:]
    assert report["committed"] == 3 and report["rejected"] == 1 and report["completion_tokens"] > 0
    rows = {r["id"]: r for r in pq.read_table(tmp_path / "out" / "shards").to_pylist()}
    assert set(rows) == {"c1", "c2", "c3"}
    for r in rows.values():
        assert r["finish_reason"] in ("length", "stop") and 0 < (r["completion_tokens"] or 0) <= 6
        assert isinstance(r["text"], str)
    resumed = json.loads(again.stdout)
    assert again.returncode == 0 and resumed["done_before"] == 3 and resumed["to_send"] == 0
