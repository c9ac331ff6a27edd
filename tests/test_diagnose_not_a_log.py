"""`diagnose` on files that are not server logs, and hints when no engine is recognised (issue 24 item 14)."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

from servefleet.catalog import DEFAULT_HINTS, Category, State
from servefleet.engines.registry import get_engine
from servefleet.verify.bounded import Bounds, diagnose_local_file
from servefleet.verify.diagnose import diagnose_text

README = Path(__file__).resolve().parents[1] / "README.md"
OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"


def _diagnose_cli(path: Path) -> tuple[int, dict]:
    proc = subprocess.run(
        [sys.executable, "-m", "servefleet.cli.main", "diagnose", str(path), "--json"],
        capture_output=True,
        text=True,
        env={**os.environ},
        timeout=60,
    )
    return proc.returncode, json.loads(proc.stdout)


def test_the_readme_is_not_a_log_exit_3() -> None:
    code, out = _diagnose_cli(README)
    assert out["state"] == "unknown", out
    assert "not a recognised server log" in out["message"] and "Markdown" in out["message"]
    assert code == 3


def test_random_bytes_are_not_a_log(tmp_path: Path) -> None:
    path = tmp_path / "noise.bin"
    path.write_bytes(random.Random(7).randbytes(20_000))
    code, out = _diagnose_cli(path)
    assert (out["state"], code) == ("unknown", 3)
    assert "binary" in out["message"]


def test_text_no_engine_prints_is_unknown_not_loading() -> None:
    verdict = diagnose_text("dear diary\ntoday the weather was fine\n")
    assert verdict.state is State.UNKNOWN


def test_a_big_document_is_unknown_through_the_bounded_read(tmp_path: Path) -> None:
    path = tmp_path / "big.md"
    path.write_text(("# Title\n\n```\ncode\n```\n" + "Killed\n" + "prose line\n" * 200) * 50)
    verdict = diagnose_local_file(path, bounds=Bounds(cap=4096, head=1024, tail=1024))
    assert verdict.state is State.UNKNOWN and verdict.skipped


def test_an_engine_given_is_always_classified() -> None:
    verdict = diagnose_text("# heading\n# another\n" + OOM, get_engine("vllm"))
    assert verdict.state is State.FAILED and verdict.category is Category.GPU_OOM


def test_oom_with_no_engine_detected_gets_the_neutral_hint() -> None:
    verdict = diagnose_text(OOM)
    assert verdict.state is State.FAILED and verdict.engine is None
    assert verdict.hint == DEFAULT_HINTS[Category.GPU_OOM]
    assert "llama" not in (verdict.hint or "").lower() and "--n-gpu-layers" not in (verdict.hint or "")


def test_a_log_of_a_known_engine_keeps_its_own_hint() -> None:
    verdict = diagnose_text(OOM, get_engine("llamacpp"))
    assert verdict.state is State.FAILED and "--n-gpu-layers" in (verdict.hint or "")
