"""The literal pre-filter must never hide a match (servefleet.verify.prefilter)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from servefleet.verify.classify import available_engines
from servefleet.verify.logtext import match_text
from servefleet.verify.prefilter import may_match, required_literals

LOGS = Path(__file__).resolve().parent / "fixtures" / "logs"


@pytest.mark.parametrize(
    ("regex", "flags", "expected"),
    [
        (r"\b\w+ hit an exception", 0, {" hit an exception"}),
        (r"ready to roll", 0, {"ready to roll"}),
        (r"CUDA out of memory|HIP out of memory", 0, {"cuda out of memory", "hip out of memory"}),
        (r"Not Enough", re.I, {"not enough"}),
        (r"(?:abcdef)?wxyz+", 0, {"wxy"}),  # an optional group gives nothing, even when longer
        (r"(?:hello)+ wo", 0, {"hello"}),  # a repeat of at least one counts (and is the longest here)
        (r"a|bc", 0, None),  # a branch too short to filter on
        (r"\d+", 0, None),
        (r"(?i)model type `?[\w.-]+`? (?:is )?not supported", 0, {"not supported"}),
    ],
)
def test_required_literals(regex: str, flags: int, expected: set[str] | None) -> None:
    found = required_literals(re.compile(regex, flags))
    assert (set(found) if found is not None else None) == expected


def test_case_insensitive_pattern_is_matched_case_insensitively() -> None:
    pat = re.compile(r"Not enough memory", re.I)
    line = "RuntimeError: NOT ENOUGH MEMORY"
    assert pat.search(line) and may_match(pat, line.lower())


def _corpus() -> list[str]:
    """Every fixture log's lines as the classifier matches them: the hand-assembled ones and the
    recorded output of real engine runs under real/."""
    paths = sorted(LOGS.rglob("*.log"))
    assert any(p.parent.name == "real" for p in paths), "the real engine logs are part of the corpus"
    lines: list[str] = []
    for path in paths:
        lines += [match_text(line) for line in path.read_text(errors="replace").splitlines()]
    return lines


def test_never_hides_a_match_on_real_logs() -> None:
    """Every signature and detect pattern of every engine, on every fixture line: wherever the regex
    matches, the pre-filter lets it through."""
    lines = _corpus()
    assert lines, "no fixture logs"
    patterns = {s.pattern for e in available_engines() for s in e.signatures} | {
        p for e in available_engines() for p in e.detect
    }
    checked = 0
    for pat in patterns:
        for line in lines:
            if pat.search(line):
                checked += 1
                assert may_match(pat, line.lower()), (pat.pattern, line)
    assert checked > 50
