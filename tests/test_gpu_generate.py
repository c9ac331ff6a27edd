"""The GPU generate stages' shared helpers (benchmarks/gpu/h200_generate.py): the prompt writer and the
id count both the vLLM stage and SGLang's sglang_generate.py use, and the run folder sglang_prepare.sh
fills, from which sglang_generate.py must still import them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GPU = ROOT / "benchmarks" / "gpu"
sys.path.insert(0, str(GPU))

from h200_generate import PROGRESS_FILE, count_answers, wait_until_sending, write_prompts  # noqa: E402 - after the sys.path.insert above


def write_rows(path: Path, ids: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"id": i, "text": "x"}) + "\n" for i in ids))


def test_count_answers_counts_answer_shards_only(tmp_path: Path) -> None:
    """Failures, rejected input records and manifests carry ids too; only answer shards are counted."""
    write_rows(tmp_path / "part-00000.jsonl", ["p0", "p1"])
    write_rows(tmp_path / "run-2" / "part-00001.jsonl", ["p1", "p2"])
    write_rows(tmp_path / "failures.jsonl", ["p3"])
    write_rows(tmp_path / "rejects.jsonl", ["p4"])
    write_rows(tmp_path / "shard-manifest.jsonl", ["p5"])
    (tmp_path / "part-00002.jsonl").write_text('{"no_id": 1}\n\n')
    assert count_answers(tmp_path) == {"p0": 1, "p1": 2, "p2": 1}


def test_write_prompts_ids_max_tokens_and_seed(tmp_path: Path) -> None:
    a, b, c = tmp_path / "sub" / "a.jsonl", tmp_path / "b.jsonl", tmp_path / "c.jsonl"
    write_prompts(a, 3, 64)
    write_prompts(b, 3, 64)
    write_prompts(c, 3, 64, seed=1)
    rows = [json.loads(line) for line in a.read_text().splitlines()]
    assert [r["id"] for r in rows] == ["p000000", "p000001", "p000002"]
    assert {r["max_tokens"] for r in rows} == {64}
    assert all(len(r["prompt"].split()) == 40 for r in rows)
    assert a.read_text() == b.read_text() != c.read_text()


def test_sglang_generate_imports_the_shared_helpers_in_its_run_folder(tmp_path: Path) -> None:
    """sglang_prepare.sh's refresh (an existing package: no download) copies what sglang_generate.py
    imports next to it; there, with no other path, it uses h200_generate's functions."""
    out, cache = tmp_path / "gpu-sglang", tmp_path / "cache"
    (out / "pkg").mkdir(parents=True)
    (out / "pkg" / "sgl.tar.xz.part-00").write_bytes(b"")
    env = {**os.environ, "SGL_OUT": str(out), "SGL_CACHE": str(cache)}
    env.pop("SGL_REPACK", None)
    subprocess.run(
        ["bash", str(GPU / "sglang_prepare.sh")], cwd=ROOT, env=env, check=True, capture_output=True, timeout=120
    )
    run = out / "run"
    code = (
        "import sglang_generate, h200_generate; "
        "assert sglang_generate.count_answers is h200_generate.count_answers; "
        "assert sglang_generate.write_prompts is h200_generate.write_prompts; "
        "assert sglang_generate.generate_argv is h200_generate.generate_argv; "
        "import h200_exec; assert sglang_generate.answers_health is h200_exec.answers_health; print('ok')"
    )
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    res = subprocess.run([sys.executable, "-c", code], cwd=run, env=clean, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "ok"
    helped = subprocess.run(
        [sys.executable, str(run / "sglang_generate.py"), "--help"],
        env=clean,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert helped.returncode == 0, helped.stderr
    assert "--kill-after" in helped.stdout


def test_a_fault_waits_until_the_job_sends(tmp_path: Path) -> None:
    """The fault timer's end is not enough: the job must have written its first progress record (it has
    taken its servers), else a SIGKILL only removes a server before the job starts (seen on a loaded CPU)."""
    import threading
    from types import SimpleNamespace

    proc = subprocess.Popen(["sleep", "60"])
    try:
        job = SimpleNamespace(proc=proc)
        waiter = threading.Thread(target=wait_until_sending, args=(job, tmp_path, 0.0, 30.0))
        waiter.start()
        waiter.join(timeout=0.6)
        assert waiter.is_alive()  # no progress record yet: still waiting
        (tmp_path / PROGRESS_FILE).write_text("{}")
        waiter.join(timeout=10)
        assert not waiter.is_alive()
    finally:
        proc.kill()
        proc.wait()
    ended = SimpleNamespace(proc=proc)  # a job that has ended is not waited for
    (tmp_path / PROGRESS_FILE).unlink()
    done = threading.Thread(target=wait_until_sending, args=(ended, tmp_path, 5.0, 30.0))
    done.start()
    done.join(timeout=5)
    assert not done.is_alive()
