"""The contract every command keeps (README, "Exit codes and errors"), through the real CLI:

- a usage error exits 3 (click's own code is 2, which servefleet gives to "timeout or stalled");
- with --json, every failure prints ONE document on stdout, ``{"ok": false, "error": {"kind", "message",
  "hint", "exit_code"}}``, whose ``exit_code`` is the process's and whose ``kind`` is a stable name;
- `status` and `plan --check` say in their exit code when servers are not ready / the plan missed;
- `servefleet --help` lists every command of the table, and importing the CLI or running `diagnose`
  loads neither the simulator nor aiohttp nor psutil (a fresh interpreter, so nothing is preloaded).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import click
import pytest
import typer
from typer.testing import CliRunner

from conftest import free_port
from servefleet.cli.failure import EXIT_CODES, ErrorKind
from servefleet.cli.main import COMMANDS, app

LOG = Path(__file__).parent / "fixtures" / "logs" / "vllm_success.log"
BROKEN_FLEET = '[[servers]]\nname = "x"\nport = 99999\nengine = "sim"\nmodel = "m"\n'  # port out of range


def invoke(args: list[str]) -> tuple[int, str, str]:
    res = CliRunner().invoke(app, args)
    return res.exit_code, res.stdout, res.stderr


def assert_error_document(code: int, stdout: str, kind: ErrorKind) -> dict:
    """stdout is exactly one error document, and it agrees with the exit code."""
    doc = json.loads(stdout)  # one document: anything else on stdout fails here
    assert doc["ok"] is False and set(doc) == {"ok", "error"}, doc
    error = doc["error"]
    assert {"kind", "message", "hint", "exit_code"} <= set(error), error
    assert error["kind"] == kind.value, error
    assert error["exit_code"] == code == int(EXIT_CODES[kind]), (code, error)
    assert error["message"].strip(), error
    return error


@pytest.mark.parametrize("command", list(COMMANDS))
def test_an_unknown_option_is_a_usage_error_of_every_command(command: str) -> None:
    code, out, err = invoke([command, "--no-such-option", "--json"])
    error = assert_error_document(code, out, ErrorKind.USAGE)
    assert code == 3
    assert "--no-such-option" in error["message"] or command == "sim", error  # sim: argparse says it on stderr
    assert "--no-such-option" in err


@pytest.mark.parametrize(
    "args",
    [
        ["diagnose"],
        ["logs"],
        ["restart"],
        ["tunnel"],
        ["plan"],
        ["generate", "--output", "x"],
        ["compare"],
        ["model", "tiny"],
        ["bench", "--url", "http://127.0.0.1:1", "-c", "x", "-n", "1"],  # not numbers
        ["bench", "--url", "http://127.0.0.1:1", "-n", "1"],  # neither --concurrency nor --request-rate
        ["wait", "--url", "localhost:1234"],  # not an http(s) URL
        ["wait", "--url", "http://127.0.0.1:1", "--pid", "999999999"],
        ["diagnose", str(LOG), "--engine", "nosuch"],
        ["generate", "--input", "in.jsonl", "--output", "x", "--url", "http://127.0.0.1:1", "--concurrency", "0"],
        ["capacity"],  # neither --model nor --url
        ["model", "tiny", "m", "--head-dim", "48"],
    ],
    ids=lambda a: " ".join(a),
)
def test_missing_or_bad_arguments_exit_3(args: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, _ = invoke([*args, "--json"])
    assert_error_document(code, out, ErrorKind.USAGE)


@pytest.mark.parametrize(
    "args",
    [
        ["up", "{fleet}"],
        ["status", "--fleet", "{fleet}"],
        ["down", "--fleet", "{fleet}"],
        ["logs", "x", "--fleet", "{fleet}"],
        ["restart", "x", "--fleet", "{fleet}"],
        ["tunnel", "x", "--fleet", "{fleet}"],
        ["bench", "--fleet", "{fleet}", "-c", "1", "-n", "1"],
        ["generate", "--input", "{input}", "--output", "out", "--fleet", "{fleet}"],
    ],
    ids=lambda a: a[0],
)
def test_a_bad_fleet_file_is_a_config_error(args: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    fleet = tmp_path / "broken.toml"
    fleet.write_text(BROKEN_FLEET)
    (tmp_path / "in.jsonl").write_text('{"id": "a", "prompt": "hi"}\n')
    code, out, err = invoke([a.format(fleet=fleet, input=tmp_path / "in.jsonl") for a in args] + ["--json"])
    error = assert_error_document(code, out, ErrorKind.CONFIG)
    assert "port: must be between 1 and 65535" in error["message"]
    assert "error: " in err and "must be between" in err  # the words on stderr too


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["diagnose", "{tmp}/missing.log"], "does not exist"),
        (["compare", "{tmp}/missing.json"], "no such file"),
        (
            ["plan", "--bench", "{tmp}/missing.json", "--prompts", "5", "--output-tokens-mean", "10"],
            "no such bench run",
        ),
        (["plan", "--check", "{tmp}", "--bench", "{tmp}/missing.json"], "no"),
        (
            ["plan", "--bench", "{tmp}/missing.json", "--prompts", "5", "--sample", "{tmp}/missing.jsonl"],
            "sample file not found",
        ),
        (["up", "{tmp}/missing.toml"], "not found"),
        (["status"], "no fleet file"),  # run where there is none
        (
            ["generate", "--input", "{tmp}/missing.jsonl", "--output", "{tmp}/out", "--url", "http://127.0.0.1:1"],
            "no such file",
        ),
        (["capacity", "--model", "{tmp}/missing"], "no config.json"),
        (
            ["bench", "--url", "http://127.0.0.1:1", "-c", "1", "-n", "1", "--dataset", "{tmp}/missing.jsonl"],
            "no such file",
        ),
        (["report", "{tmp}/missing"], "no such folder"),
        (["progress", "{tmp}/missing"], "no such folder"),
    ],
    ids=lambda a: a[0] if isinstance(a, list) else "",
)
def test_a_missing_file_is_reported_in_the_one_shape(
    args: list[str], said: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One kind for a missing file, whichever command was given it: config (exit 3)."""
    monkeypatch.chdir(tmp_path)
    code, out, _ = invoke([a.format(tmp=tmp_path) for a in args] + ["--json"])
    assert said in assert_error_document(code, out, ErrorKind.CONFIG)["message"]


@pytest.mark.parametrize("command", ["bench", "capacity", "generate"])
def test_an_unreachable_url_exits_4(command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "in.jsonl").write_text('{"id": "a", "prompt": "hi"}\n')
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    args = {
        "bench": ["bench", "--url", url, "-c", "1", "-n", "1"],
        "capacity": ["capacity", "--url", url],
        "generate": ["generate", "--input", "in.jsonl", "--output", "out", "--url", url],
    }[command]
    code, out, _ = invoke([*args, "--json"])
    assert url.split("//")[1] in assert_error_document(code, out, ErrorKind.UNREACHABLE)["message"]


def test_without_json_stdout_stays_empty_and_stderr_says_what_to_do(tmp_path: Path) -> None:
    code, out, err = invoke(["diagnose", str(tmp_path / "missing.log")])
    assert (code, out) == (3, "")
    assert "error: log file" in err and "is the path right?" in err


def test_status_exit_code_says_whether_all_are_ready(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Not launched is down: exit 1, the usual payload in the failure shape every failure has (README)."""
    monkeypatch.chdir(tmp_path)
    fleet = tmp_path / "f.toml"
    fleet.write_text(f'[[servers]]\nname = "a"\nport = {free_port()}\nengine = "sim"\nmodel = "m"\n')
    code, out, _ = invoke(["status", "--fleet", str(fleet), "--json"])
    assert code == 1
    doc = json.loads(out)
    assert doc["ok"] is False and doc["error"]["kind"] == "failed" and doc["error"]["exit_code"] == 1
    assert "a (not launched)" in doc["error"]["message"] and doc["error"]["command"] == "status"
    assert [s["state"] for s in doc["servers"]] == ["not launched"]
    assert invoke(["status", "--fleet", str(fleet)])[0] == 1


def test_status_exit_codes_by_state() -> None:
    from servefleet.cli.fleet_cmds import _status_exit_code
    from servefleet.fleet import Liveness, ServerStatus

    def code(*states: Liveness) -> int:
        return int(_status_exit_code([ServerStatus(name=f"s{i}", state=s) for i, s in enumerate(states)]))

    assert code(Liveness.READY, Liveness.READY) == 0
    assert code(Liveness.READY, Liveness.LOADING) == 2 and code(Liveness.UNRESPONSIVE) == 2
    for down in (Liveness.DEAD, Liveness.FAILED, Liveness.STALE, Liveness.NOT_LAUNCHED):
        assert code(Liveness.LOADING, down) == 1  # down wins over still loading


def test_help_lists_every_command_of_the_table_with_its_line() -> None:
    res = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "250"})
    assert res.exit_code == 0
    for name, row in COMMANDS.items():
        assert name in res.stdout and row.short_help[:40] in res.stdout, name


@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_row_names_a_module_that_registers_that_command(name: str) -> None:
    """The lazy table and the modules agree: each command loads, its --help works and shows its exit codes."""
    res = CliRunner().invoke(app, [name, "--help"], env={"COLUMNS": "250"})
    assert res.exit_code == 0, res.output
    assert "Exit codes:" in res.stdout or name == "sim"  # sim's --help is its own argparse text
    # square brackets in an option's help survive Rich's markup ("[grid]" unescaped is a style tag, and vanishes)
    shown = " ".join(res.stdout.replace("│", " ").split())
    group = typer.main.get_command(app)
    command = group.get_command(click.Context(group), name)  # type: ignore[attr-defined]
    for param in getattr(command, "params", []):
        for token in re.findall(r"\[[^\[\]]*\]", (getattr(param, "help", None) or "").replace("\\[", "[")):
            assert " ".join(token.split()) in shown, (name, param.name, token)


def _fresh_interpreter(code: str) -> set[str]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent / "src")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env, check=True)
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


HEAVY = (
    "servefleet.sim",
    "aiohttp",
    "psutil",
    "servefleet.fleet",
    "rich",
    "asyncio",
    "servefleet.hosts",
)  # asyncio: a local log needs no event loop


def test_importing_the_cli_and_diagnose_load_nothing_heavy() -> None:
    loaded = _fresh_interpreter(
        "import json, sys\n"
        "from servefleet.cli.main import app\n"
        f"sys.argv = ['servefleet', 'diagnose', {str(LOG)!r}, '--json']\n"
        "try:\n    app()\nexcept SystemExit as exc:\n    assert exc.code == 0, exc.code\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    assert "servefleet.verify.bounded" in loaded  # the command did run
    heavy = sorted(m for m in loaded if m.split(".")[0] in HEAVY or m.startswith(HEAVY))
    assert heavy == [], heavy


def test_help_imports_no_command_module() -> None:
    loaded = _fresh_interpreter(
        "import json, sys, io, contextlib\n"
        "from servefleet.cli.main import app\n"
        "sys.argv = ['servefleet', '--help']\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    try:\n        app()\n    except SystemExit:\n        pass\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    modules = {row.module for row in COMMANDS.values()}
    assert not modules & loaded, modules & loaded
    assert not {m for m in loaded if m.startswith(HEAVY[:4])}


def test_a_bug_still_gives_the_error_document_and_its_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    import servefleet.verify.bounded

    async def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(servefleet.verify.bounded, "diagnose_file", broken)
    res = CliRunner().invoke(app, ["diagnose", str(LOG), "--json"])
    assert isinstance(res.exception, RuntimeError)  # re-raised: the traceback is the bug report
    error = json.loads(res.stdout)["error"]
    assert (error["kind"], error["message"], error["command"]) == ("internal", "RuntimeError: boom", "diagnose")


def test_only_the_sim_command_imports_the_simulator() -> None:
    """Statically: no module outside servefleet/sim/ imports servefleet.sim, except cli/sim_cmd.py inside its
    command function (so `servefleet sim` works and nothing else loads the test double)."""
    import ast

    src = Path(__file__).parent.parent / "src" / "servefleet"
    offenders = []
    for path in sorted(src.rglob("*.py")):
        rel = path.relative_to(src).as_posix()
        if rel.startswith("sim/"):
            continue
        tree = ast.parse(path.read_text(), filename=rel)
        top_level = {id(node) for node in tree.body}
        for node in ast.walk(tree):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            if not any(n == "servefleet.sim" or n.startswith("servefleet.sim.") for n in names):
                continue
            if rel != "cli/sim_cmd.py" or id(node) in top_level:
                offenders.append(f"{rel}:{node.lineno}")
    assert offenders == []
