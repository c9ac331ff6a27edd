"""`servefleet bench` end to end against a real engine: `transformers serve` on a tiny model built
here. Real HTTP, real streaming, a server that refuses `ignore_eos` (HTTP 422: the bench drops it
and says so) and whose /v1/models fails; output tokens from its final usage, prompt lengths from
the model's own tokenizer."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from servefleet.bench.result import load_run


@pytest.mark.engine
@pytest.mark.timeout(900)
def test_bench_transformers_serve_end_to_end(transformers_serve, tmp_path: Path) -> None:
    url, model = transformers_serve
    out, probe = tmp_path / "RUN.json", tmp_path / "PROBE.json"
    common = [
        "--url",
        url,
        "--model",
        str(model),
        "--tokenizer",
        str(model),
        "--input-len",
        "24",
        "--output-len",
        "8",
        "--stream",
    ]  # streamed: the client's own TTFT/ITL (transformers serve has no latency histograms)
    for args in (
        ["--engine", "transformers", "-c", "1,2", "-n", "4", "--out", str(out)],
        ["-c", "1", "-n", "2", "--out", str(probe)],
    ):  # engine unknown: ignore_eos is tried
        result = subprocess.run(
            [sys.executable, "-m", "servefleet.cli.main", "bench", *common, *args],
            capture_output=True,
            text=True,
            timeout=600,
            env={**os.environ, "COLUMNS": "200"},
        )
        assert result.returncode == 0, result.stdout + result.stderr
    run = load_run(out)
    assert run.target.engine == "transformers"
    assert run.workload["input_tokens_counted_by"] == f"tokenizer:{model}"
    assert run.workload["input_tokens_mean"] == pytest.approx(24, abs=1)
    assert "ignore_eos" not in run.workload["request_options"]  # the profile says it is not supported
    tried = load_run(probe)  # without --engine it was tried, refused with HTTP 422, dropped and noted
    assert tried.points[0].successful == 2 and "ignore_eos" not in tried.workload["request_options"]
    assert any("ignore_eos" in n and "422" in n for n in tried.notes)
    for p in run.points:
        assert p.successful == 4 and p.errors == 0
        assert p.token_sources.get("usage") == 4  # the final chunk's usage
        assert 4 <= p.output_tokens <= 4 * 8
        assert p.ttft_ms.n == 4 and p.e2e_ms.p50 > 0 and p.output_tokens_per_s > 0
        assert p.itl_ms.n > 0
    assert json.loads(out.read_text())["points"][0]["client_bound"] in (True, False)
