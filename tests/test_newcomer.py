"""What a new user meets first (issue 24, "For a newcomer"): `servefleet --version`, `up --fleet F`
like every other command, a warning when nothing bounds the answers' length, and `make test`'s first
step (scripts/test-prereqs.sh), which installs what the SSH/Slurm/browser tests need or stops at once
with the command to run; those suites fail rather than skip unless opted out."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from servefleet.cli.main import app
from servefleet.generate.inputs import RequestDefaults
from servefleet.generate.prepass import max_tokens_warning, run_prepass

ROOT = Path(__file__).resolve().parent.parent


def test_version_prints_the_packages_version() -> None:
    res = CliRunner().invoke(app, ["--version"])
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert res.exit_code == 0, res.output
    assert res.stdout.strip() == f"servefleet {version}"


def test_up_reads_the_fleet_file_given_with_the_fleet_option(tmp_path: Path) -> None:
    bad = tmp_path / "f.toml"
    bad.write_text('[[servers]]\nname = "x"\nport = 99999\nengine = "sim"\nmodel = "m"\n')
    res = CliRunner().invoke(app, ["up", "--fleet", str(bad), "--json"])
    assert res.exit_code == 3, res.output
    error = json.loads(res.stdout)["error"]
    assert error["kind"] == "config" and "port" in error["message"] and "f.toml" in error["message"], error


def test_up_refuses_two_different_fleet_files(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["up", str(tmp_path / "a.toml"), "--fleet", str(tmp_path / "b.toml"), "--json"])
    assert res.exit_code == 3, res.output
    message = json.loads(res.stdout)["error"]["message"]
    assert "a.toml" in message and "b.toml" in message, message


def test_prepass_counts_records_without_max_tokens(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    path.write_text(
        "".join(
            json.dumps(r) + "\n"
            for r in [
                {"id": "a", "prompt": "x"},
                {"id": "b", "prompt": "y", "max_tokens": 8},
                {"id": "c", "messages": [{"role": "user", "content": "z"}], "max_completion_tokens": 4},
                {"id": "d", "prompt": "w"},
            ]
        )
    )
    assert run_prepass(str(path), RequestDefaults(), lambda r: None).unbounded == 2
    assert (
        run_prepass(str(path), RequestDefaults(max_tokens=16), lambda r: None).unbounded == 0
    )  # --max-tokens fills them


def test_max_tokens_warning_names_the_count_and_the_option() -> None:
    assert max_tokens_warning(0, 1_000_000) is None
    text = max_tokens_warning(1_000_000, 1_000_000)
    assert text is not None and "1,000,000 of 1,000,000" in text and "--max-tokens" in text


def _fake_non_root(tmp_path: Path) -> dict[str, str]:
    """An environment where `id -u` says 1000 and there is no sudo (a PATH of the basic tools only)."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    (bindir / "id").write_text("#!/bin/sh\necho 1000\n")
    (bindir / "id").chmod(0o755)
    if not (bindir / "dirname").exists():
        (bindir / "dirname").symlink_to(shutil.which("dirname") or "/usr/bin/dirname")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SERVEFLEET_SKIP_")}
    env["PATH"] = f"{bindir}:/nonexistent"
    return env


def _prereqs(env: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    done = subprocess.run(
        ["/bin/sh", str(ROOT / "scripts" / "test-prereqs.sh")], env=env, capture_output=True, text=True, timeout=30
    )
    return done, time.monotonic() - started


def test_make_test_stops_at_once_with_the_command_when_it_cannot_set_up(tmp_path: Path) -> None:
    done, took = _prereqs(_fake_non_root(tmp_path))
    assert done.returncode == 1, done
    assert "sudo make test" in done.stderr and "SERVEFLEET_SKIP_SLURM=1" in done.stderr, done.stderr
    assert took < 1.0, took

    env = _fake_non_root(tmp_path) | {"SERVEFLEET_SKIP_SLURM": "1", "SERVEFLEET_SKIP_SSH": "1"}
    done, took = _prereqs(env)  # no sudo to install chromium with
    assert done.returncode == 1 and "scripts/ci-browser-setup.sh" in done.stderr, done
    assert took < 1.0, took

    done, _ = _prereqs(env | {"SERVEFLEET_SKIP_BROWSER": "1"})  # everything opted out: nothing to do
    assert done.returncode == 0, done


def test_a_missing_sshd_fails_the_ssh_tests_unless_opted_out(monkeypatch: pytest.MonkeyPatch) -> None:
    from sshd import SKIP_ENV, require

    require(None)  # the rig can run: nothing happens
    monkeypatch.delenv(SKIP_ENV, raising=False)
    with pytest.raises(pytest.fail.Exception, match="not installed.*SERVEFLEET_SKIP_SSH=1"):
        require("/usr/sbin/sshd is not installed")
    monkeypatch.setenv(SKIP_ENV, "1")
    with pytest.raises(pytest.skip.Exception):
        require("/usr/sbin/sshd is not installed")
