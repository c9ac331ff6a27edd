"""A pipeline tool from the field through `servefleet serve`: distilabel (pinned in the `test` extra) runs a
tiny pipeline, five instructions -> TextGeneration with its own OpenAILLM, against the real `serve` CLI in
front of two sims. Offline: only loopback; distilabel's and Hugging Face's caches under tmp_path, the hub
switched off."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from conftest import SimProcess
from test_generate_sim import FAST_SIM

MODEL = "sim-model"
PROMPTS = [f"Write one line about the number {i}." for i in range(5)]


def counter(url: str, name: str) -> float:
    """The sum of one Prometheus counter over its labels."""
    with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in resp.read().decode().splitlines()
            if line.startswith(name + "{") or line.startswith(name + " ")
        )


@pytest.mark.filterwarnings(
    "ignore::DeprecationWarning", "ignore:The 'default' attribute"
)  # distilabel 1.5's use of pydantic, thousands a run
def test_a_distilabel_pipeline_gets_every_answer_through_the_gateway(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for var, value in {
        "HF_HOME": tmp_path / "hf",
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "DO_NOT_TRACK": "1",
        "DISTILABEL_CACHE_DIR": tmp_path / "distilabel",
        "OPENAI_API_KEY": "none",
    }.items():
        monkeypatch.setenv(var, str(value))
    from distilabel.models import OpenAILLM
    from distilabel.pipeline import Pipeline
    from distilabel.steps import LoadDataFromDicts
    from distilabel.steps.tasks import TextGeneration

    sims = [SimProcess(*FAST_SIM, "--max-running", "8", log_path=tmp_path / f"sim{i}.log").start() for i in range(2)]
    proc = None
    try:
        for s in sims:
            s.wait_ready()
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "servefleet.cli.main",
                "serve",
                *(a for s in sims for a in ("--url", s.url)),
                "--port",
                "0",
                "--json",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None and proc.stderr is not None
        line = proc.stdout.readline()
        assert line, proc.stderr.read()[-3000:]
        url = json.loads(line)["url"]

        with Pipeline(name="servefleet-serve", cache_dir=tmp_path / "distilabel") as pipeline:
            load = LoadDataFromDicts(data=[{"instruction": p} for p in PROMPTS])
            generate = TextGeneration(
                llm=OpenAILLM(
                    model=MODEL,
                    base_url=url,
                    api_key="none",
                    max_retries=0,
                    timeout=60,
                    generation_kwargs={"max_new_tokens": 8},
                )
            )
            load >> generate
        distiset = pipeline.run(use_cache=False)

        rows = list(distiset["default"]["train"])
        assert sorted(r["instruction"] for r in rows) == sorted(PROMPTS)
        assert all(r["generation"] and r["model_name"] == MODEL for r in rows), (
            rows
        )  # distilabel writes None for a request that failed
        gateway = url.removesuffix("/v1")
        assert counter(gateway, "servefleet_serve_server_requests_total") == len(
            PROMPTS
        )  # every answer came through the gateway
        assert sum(counter(s.url, "vllm:request_success_total") for s in sims) == len(
            PROMPTS
        )  # and from the sims behind it
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        for s in sims:
            s.stop()
