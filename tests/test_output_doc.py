"""docs/output.md and `generate --help` describe what generate writes: every column of a shard (with
--token-ids and --store-request) and every file and folder of a destination, by the names the code uses."""

from __future__ import annotations

import re
from pathlib import Path

from typer.testing import CliRunner

from servefleet.cli.main import app
from servefleet.generate.job import JOB_FILE
from servefleet.generate.ledger import LEDGER_DIR, SHARDS_DIR
from servefleet.generate.recorder import PROGRESS_FILE, TIMELINE_DIR
from servefleet.generate.runner import FAILURES_FILE, REJECTS_FILE, REPORT_FILE
from servefleet.generate.shards import shard_schema

DOC = (Path(__file__).resolve().parent.parent / "docs" / "output.md").read_text()


def _first_column(section: str) -> list[str]:
    body = DOC.split(f"## {section}", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| `([^`]+)` \|", body, flags=re.M)


def test_every_shard_column_is_documented_in_order() -> None:
    assert (
        _first_column("One row per answered prompt")
        == shard_schema(token_ids=True, store_request=True, samples=True, logprobs_k=5, prompt_logprobs_k=5).names
    )


def test_every_file_of_a_destination_is_documented() -> None:
    paths = _first_column("The destination")
    tops = {p.split("/")[0] for p in paths}
    for name in (
        JOB_FILE,
        SHARDS_DIR,
        LEDGER_DIR,
        REJECTS_FILE,
        FAILURES_FILE,
        REPORT_FILE,
        PROGRESS_FILE,
        TIMELINE_DIR,
    ):
        assert name in tops, name


def test_generate_help_names_the_shards_and_ledger_folders() -> None:
    res = CliRunner().invoke(app, ["generate", "--help"], env={"COLUMNS": "400"})
    text = " ".join(res.stdout.split())
    assert res.exit_code == 0
    assert f"{SHARDS_DIR}/part-" in text and f"{LEDGER_DIR}/part-" in text and "docs/output.md" in text, text
    assert "sidecar" not in text
