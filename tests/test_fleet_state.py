"""State records: 0600 files, atomic writes, secrets never written, corrupt files reported."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from servefleet.errors import StateError
from servefleet.fleet.state import MASK, ServerState, StateStore, mask_argv, mask_env, spec_hash, utcnow


def record(**over) -> ServerState:
    base = dict(
        fleet="f",
        name="a",
        engine="sim",
        host="local",
        port=30000,
        pgid=1234,
        argv=["python", "-m", "x"],
        log_path="/tmp/a.log",
        status_path="/tmp/a.status",
        launched_at=utcnow(),
        spec_hash="abc",
    )
    base.update(over)
    return ServerState(**base)


def test_mask_env_hides_secret_looking_names() -> None:
    env = {
        "HF_TOKEN": "hf_abc",
        "OPENAI_API_KEY": "sk-1",
        "DB_PASSWORD": "pw",
        "AWS_SECRET_ACCESS_KEY": "s",
        "HF_HOME": "/data",
    }
    assert mask_env(env) == {
        "HF_TOKEN": MASK,
        "OPENAI_API_KEY": MASK,
        "DB_PASSWORD": MASK,
        "AWS_SECRET_ACCESS_KEY": MASK,
        "HF_HOME": "/data",
    }


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--api-key", "sk-123", "--port", "1"], ["--api-key", MASK, "--port", "1"]),
        (["--api-key=sk-123"], ["--api-key=" + MASK]),
        (["--hf_token", "hf_x"], ["--hf_token", MASK]),
        (["--max-total-tokens", "4096"], ["--max-total-tokens", "4096"]),  # not a secret
        (["--header", "Authorization: Bearer hf_secretvalue"], ["--header", f"Authorization: Bearer {MASK}"]),
    ],
)
def test_mask_argv(argv: list[str], expected: list[str]) -> None:
    assert mask_argv(argv, ["hf_secretvalue"]) == expected


def test_spec_hash_is_stable_and_sensitive() -> None:
    a = spec_hash({"argv": ["x", "1"], "env": {"A": "1"}})
    assert a == spec_hash({"env": {"A": "1"}, "argv": ["x", "1"]})
    assert a != spec_hash({"argv": ["x", "2"], "env": {"A": "1"}})


def test_store_writes_0600_and_round_trips(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "st")
    path = store.save(record())
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert store.load("a") == record(launched_at=store.load("a").launched_at)
    assert store.names() == ["a"]
    assert store.load("b") is None
    store.write_index("f", tmp_path / "fleet.toml")
    assert store.names() == ["a"]  # the index is not a server
    assert StateStore.read_index(tmp_path / "st")["fleet_file"] == str(tmp_path / "fleet.toml")
    store.remove("a")
    store.remove("a")  # twice is fine
    assert store.names() == []
    assert not list((tmp_path / "st").glob(".*tmp*"))  # no temporary files left behind


def test_corrupt_or_foreign_record_is_a_state_error(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    store.path_for("a").write_text("{not json")
    with pytest.raises(StateError, match="corrupt state record"):
        store.load("a")
    store.path_for("b").write_bytes(record(name="c").to_bytes())
    with pytest.raises(StateError, match="belongs to server 'c'"):
        store.load("b")
