"""servefleet's logging: levels from --verbose / SERVEFLEET_LOG, a file in the state folder, and
no credential in any record."""

from __future__ import annotations

import json
import logging
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from servefleet import logsetup


@pytest.fixture(autouse=True)
def _fresh_logger():
    logger = logging.getLogger("servefleet")
    saved = (list(logger.handlers), logger.level, logger.propagate)
    logger.handlers.clear()
    yield logger
    for h in logger.handlers:
        h.close()
    logger.handlers[:], logger.level, logger.propagate = saved


@pytest.mark.parametrize(
    "text",
    [
        "Authorization: Bearer sk-abc123",
        'headers {"Authorization": "Bearer sk-abc123"}',
        "argv vllm serve m --api-key sk-abc123 --port 1",
        "url https://user:sk-abc123@example.invalid/v1",
        "api_key=sk-abc123&x=1",
    ],
)
def test_redact_blanks_credentials(text: str) -> None:
    out = logsetup.redact(text)
    assert "sk-abc123" not in out and "***" in out


def test_redact_leaves_ordinary_text() -> None:
    text = "GET http://127.0.0.1:8000/v1/models -> 503 after 0.2 s"
    assert logsetup.redact(text) == text


def test_level_comes_from_verbose_then_env(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv(logsetup.ENV_VAR, raising=False)
    logsetup.configure()
    log = logging.getLogger("servefleet.some.module")
    log.info("quiet by default")
    log.warning("shown by default")
    monkeypatch.setenv(logsetup.ENV_VAR, "debug")
    logsetup.configure()
    log.debug("shown with SERVEFLEET_LOG=debug")
    monkeypatch.setenv(logsetup.ENV_VAR, "error")
    logsetup.configure(verbose=True)
    log.debug("shown with --verbose, whatever the variable says")
    err = capsys.readouterr().err
    assert "quiet by default" not in err
    for shown in ("shown by default", "shown with SERVEFLEET_LOG=debug", "shown with --verbose"):
        assert shown in err
    ours = [h for h in logging.getLogger("servefleet").handlers if type(h).__module__ == logsetup.__name__]
    assert len(ours) == 1  # configure is idempotent (pytest may add capture handlers of its own)


def test_bad_level_is_refused_with_the_choices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(logsetup.ENV_VAR, "loud")
    with pytest.raises(ValueError, match="debug, info, warning or error"):
        logsetup.configure()


def test_state_file_gets_debug_records_private_and_redacted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv(logsetup.ENV_VAR, raising=False)
    logsetup.configure()
    path = logsetup.add_state_file(tmp_path / "state")
    assert path == tmp_path / "state" / logsetup.LOG_FILE
    assert logsetup.add_state_file(tmp_path / "state") == path  # no second handler
    log = logging.getLogger("servefleet.fleet.x")
    log.debug("probe of %s failed with --api-key %s", "http://127.0.0.1:1", "sk-secret")
    for h in logging.getLogger("servefleet").handlers:
        h.flush()
    text = path.read_text()
    assert "probe of http://127.0.0.1:1 failed" in text and "sk-secret" not in text
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert "probe of" not in capsys.readouterr().err  # stderr stays at WARNING


def test_unwritable_state_folder_is_not_an_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert logsetup.add_state_file(blocker / "state") is None


def test_a_second_fleet_replaces_the_first_state_file(tmp_path: Path) -> None:
    first = logsetup.add_state_file(tmp_path / "a")
    second = logsetup.add_state_file(tmp_path / "b")
    files = [h for h in logging.getLogger("servefleet").handlers if getattr(h, "servefleet_state_file", False)]
    assert first != second and len(files) == 1 and Path(files[0].baseFilename) == second


def _cli(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "servefleet.cli.main", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        cwd=cwd,
        timeout=120,
    )


def test_cli_verbose_and_env_and_the_state_folder_log(tmp_path: Path) -> None:
    fleet = tmp_path / "f.toml"
    fleet.write_text('[fleet]\nstate_dir = "state"\n[[servers]]\nname = "a"\nport = 1\nengine = "sim"\nmodel = "m"\n')
    res = _cli(["status", "--fleet", str(fleet), "--json"], {"SERVEFLEET_LOG": ""}, tmp_path)
    assert res.returncode == 1, res.stderr  # not launched: down
    log = tmp_path / "state" / logsetup.LOG_FILE
    assert log.is_file() and stat.S_IMODE(log.stat().st_mode) == 0o600
    bad = _cli(["status", "--fleet", str(fleet), "--json"], {"SERVEFLEET_LOG": "loud"}, tmp_path)
    assert bad.returncode == 3 and "SERVEFLEET_LOG" in json.loads(bad.stdout)["error"]["message"]
    assert _cli(["--verbose", "--help"], {}, tmp_path).returncode == 0
    assert "--verbose" in _cli(["--help"], {}, tmp_path).stdout
