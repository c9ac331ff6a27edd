"""docs/fleet-file.md names every key the fleet file accepts, in the table of its section: a key added
to the spec models without a line in the reference fails here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import BaseModel

from servefleet.fleet.spec import FleetSettings, HostSpec, ServerDefaults, ServerSpec

DOC = Path(__file__).resolve().parent.parent / "docs" / "fleet-file.md"


def documented_keys(doc: str) -> dict[str, set[str]]:
    """``## [section]`` heading -> the keys of its table's first column."""
    sections: dict[str, set[str]] = {}
    current = None
    for line in doc.splitlines():
        if line.startswith("## "):
            current = line[3:].strip()
            sections[current] = set()
        elif current is not None and (m := re.match(r"\| `([a-z_]+)` \|", line)):
            sections[current].add(m.group(1))
    return sections


@pytest.mark.parametrize(
    ("section", "model", "not_keys"),
    [
        ("[fleet]", FleetSettings, set()),
        ("[[servers]]", ServerSpec, {"template"}),  # set by `count`, refused in the file
        ("[[servers]]", ServerDefaults, set()),  # [defaults] takes the server keys
        ("[hosts.NAME]", HostSpec, {"name"}),  # the table's own NAME
    ],
)
def test_every_accepted_key_is_documented(section: str, model: type[BaseModel], not_keys: set[str]) -> None:
    keys = documented_keys(DOC.read_text())
    accepted = set(model.model_fields) - not_keys
    assert accepted - keys[section] == set(), f"{DOC.name} {section} lacks these keys"
    # `count` is read by the loader (a template's copies), not a field of one server
    assert keys[section] - accepted - {"count"} - ({"name", "port"} if model is ServerDefaults else set()) == set(), (
        "documented keys the spec refuses"
    )


def test_the_parser_reads_the_tables_it_is_given() -> None:
    keys = documented_keys(
        "## [fleet]\n| key | d |\n| --- | --- |\n| `name` | x |\n| `timeout` | 1 |\n## [x]\n| `other` | y |\n"
    )
    assert keys == {"[fleet]": {"name", "timeout"}, "[x]": {"other"}}
