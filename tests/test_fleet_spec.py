"""The fleet file: defaults merging, and precise errors (file, server, field) for bad files."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from servefleet.errors import ConfigError
from servefleet.fleet.core import find_fleet_file
from servefleet.fleet.loader import load_fleet_file
from servefleet.fleet.spec import HostSpec
from servefleet.fleet.state import StateStore

GOOD = """
[fleet]
name = "mtp-vs-plain"
timeout = 600
smoke = false

[defaults]
engine = "sglang"
model = "/models/qwen"
args = ["--mem-fraction-static", "0.85"]
env = { HF_HOME = "/data/hf", NCCL_DEBUG = "WARN" }

[[servers]]
name = "mtp"
port = 30000
gpus = [0, 1]
args = ["--speculative-algorithm", "EAGLE", "--tp", 2]
env = { NCCL_DEBUG = "INFO" }

[[servers]]
name = "plain"
port = 30001
gpus = "2"
engine = "vllm"
model = "other"
bind = "0.0.0.0"
"""


def write(tmp_path: Path, text: str, name: str = "fleet.toml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def test_good_fleet_merges_defaults(tmp_path: Path) -> None:
    spec = load_fleet_file(write(tmp_path, GOOD))
    assert spec.name == "mtp-vs-plain"
    assert spec.state_dir == tmp_path / ".servefleet" / "mtp-vs-plain"
    assert spec.timeout == 600 and spec.stall == 300 and spec.smoke is False
    mtp, plain = spec.servers
    # args: defaults first, then the server's own (numbers become strings), untouched otherwise
    assert mtp.args == ("--mem-fraction-static", "0.85", "--speculative-algorithm", "EAGLE", "--tp", "2")
    assert mtp.env == {"HF_HOME": "/data/hf", "NCCL_DEBUG": "INFO"}  # env merged, server wins
    assert mtp.gpus == (0, 1) and mtp.host == "local" and mtp.bind == "127.0.0.1"
    assert plain.engine == "vllm" and plain.model == "other" and plain.gpus == (2,) and plain.bind == "0.0.0.0"


def test_defaults_for_name_and_state_dir(tmp_path: Path) -> None:
    spec = load_fleet_file(
        write(tmp_path, '[[servers]]\nname="a"\nport=1\nengine="sim"\nmodel="m"\n', "my fleet.toml")
    )
    assert spec.name == "my-fleet"
    assert spec.state_dir == tmp_path / ".servefleet" / "my-fleet"
    spec = load_fleet_file(
        write(tmp_path, '[fleet]\nstate_dir="st"\n[[servers]]\nname="a"\nport=1\nengine="sim"\nmodel="m"\n')
    )
    assert spec.state_dir == tmp_path / "st"


def test_hosts_table_shape_is_validated(tmp_path: Path) -> None:
    text = '[hosts.gpu1]\nssh = "root@box"\nport = 2222\n[[servers]]\nname="a"\nport=1\nengine="sim"\nmodel="m"\nhost="gpu1"\n'
    spec = load_fleet_file(write(tmp_path, text))
    assert spec.hosts["gpu1"].ssh == "root@box" and spec.hosts["gpu1"].port == 2222
    assert spec.servers[0].host == "gpu1"


SERVER = '[[servers]]\nname = "a"\nport = 30000\nengine = "sim"\nmodel = "m"\n'

BAD_FILES = [
    pytest.param("[fleet\nname = 'x'\n", ["fleet.toml: TOML syntax error", "line 1"], id="toml-syntax"),
    pytest.param(
        "[fleet]\nname = 'x'\n\n[[servers]]\nname = 'a'\nport = = 3\n",
        ["TOML syntax error", "line 6"],
        id="toml-syntax-line",
    ),
    pytest.param(
        SERVER + '[[servers]]\nname = "plain"\nport = 70000\nengine = "sim"\nmodel = "m"\n',
        ['fleet.toml: servers[1] "plain": port: must be between 1 and 65535'],
        id="port-range",
    ),
    pytest.param(
        '[[servers]]\nname = "a"\nprot = 30000\nengine = "sim"\nmodel = "m"\n',
        [
            "servers[0] \"a\": prot: unknown field; did you mean 'port'?",
            'servers[0] "a": port: required field is missing',
        ],
        id="typo",
    ),
    pytest.param(SERVER + SERVER.replace("30000", "30001"), ['server "a": name: duplicate'], id="duplicate-name"),
    pytest.param(
        SERVER + SERVER.replace('"a"', '"b"'),
        ['server "b": port: 30000 on host "local" is already used by server "a"'],
        id="duplicate-port",
    ),
    pytest.param(
        SERVER.replace('"sim"', '"sglangg"'),
        ["servers[0] \"a\": engine: unknown engine 'sglangg'", "known engines:", "sglang", "vllm"],
        id="unknown-engine",
    ),
    pytest.param(
        '[defaults]\nengine = "vlm"\n' + SERVER.replace('engine = "sim"\n', ""),
        ["engine: unknown engine 'vlm'", "(value from [defaults])"],
        id="bad-default-engine",
    ),
    pytest.param(
        '[[servers]]\nname = "a"\nport = 1\nengine = "sim"\n',
        ['servers[0] "a": model: required field is missing'],
        id="no-model",
    ),
    pytest.param(
        SERVER.replace('model = "m"', 'model = "m"\nargs = "--tp 2"'),
        ['servers[0] "a": args: must be a list of strings', "not split"],
        id="args-string",
    ),
    pytest.param(
        SERVER.replace('model = "m"', 'model = "m"\ngpus = ["x"]'),
        ['servers[0] "a": gpus:', "not a GPU index"],
        id="bad-gpus",
    ),
    pytest.param(
        SERVER.replace('model = "m"', 'model = "m"\nenv = { TOKEN = true }'),
        ['servers[0] "a": env: TOKEN: must be a string'],
        id="env-bool",
    ),
    pytest.param(
        SERVER.replace('name = "a"', 'name = "a/b"'),
        ['servers[0] "a/b": name: must be 1-64 characters'],
        id="bad-name",
    ),
    pytest.param(
        SERVER.replace('model = "m"', 'model = "m"\nhost = "gpu9"'),
        ["server \"a\": host: unknown host 'gpu9'", "[hosts.gpu9]"],
        id="unknown-host",
    ),
    pytest.param('[servers]\nname = "a"\n', ["write [[servers]] (double brackets"], id="servers-not-array"),
    pytest.param('[fleet]\nname = "x"\n', ["no servers: add at least one [[servers]]"], id="no-servers"),
    pytest.param(
        "[fleet]\ntimeout = -1\n" + SERVER,
        ["fleet.toml: [fleet]: timeout: must be a positive number of seconds"],
        id="fleet-timeout",
    ),
    pytest.param(
        '[fleet]\nnmae = "x"\n' + SERVER, ["[fleet]: nmae: unknown field; did you mean 'name'?"], id="fleet-typo"
    ),
    pytest.param(
        '[defualts]\nengine = "sim"\n' + SERVER,
        ["defualts: unknown table or key; did you mean 'defaults'?"],
        id="top-level-typo",
    ),
    pytest.param(
        '[hosts.local]\nssh = "x"\n' + SERVER, ["[hosts.local]: name:", "built-in local host"], id="host-named-local"
    ),
    pytest.param(
        '[hosts.gpu1]\nssh = "x"\nport = 0\n' + SERVER,
        ["[hosts.gpu1]: port: must be between 1 and 65535"],
        id="host-port",
    ),
    pytest.param(
        SERVER.replace('engine = "sim"\nmodel = "m"', 'engine = "openai"'),
        ['servers[0] "a": command: the openai engine runs your own command'],
        id="openai-needs-command",
    ),
    pytest.param(
        SERVER.replace('model = "m"', 'model = "m"\nready_path = "health"'),
        ['servers[0] "a": ready_path: must start with "/"'],
        id="ready-path",
    ),
]


@pytest.mark.parametrize(("text", "fragments"), BAD_FILES)
def test_bad_fleet_files_name_file_server_and_field(tmp_path: Path, text: str, fragments: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        load_fleet_file(write(tmp_path, text))
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in:\n{message}"
    assert all(line.startswith("fleet.toml: ") for line in message.splitlines())


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    text = SERVER.replace("30000", "0") + SERVER.replace('"a"', '"b"').replace('model = "m"', 'model = "m"\nportt = 2')
    with pytest.raises(ConfigError) as info:
        load_fleet_file(write(tmp_path, text))
    lines = str(info.value).splitlines()
    assert any('servers[0] "a": port: must be between' in line for line in lines)
    assert any('servers[1] "b": portt: unknown field' in line for line in lines)


def test_missing_fleet_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="fleet file not found"):
        load_fleet_file(tmp_path / "nope.toml")


def test_find_fleet_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no fleet file: pass --fleet FILE"):
        find_fleet_file(None, tmp_path)
    # the only fleet recorded under ./.servefleet
    elsewhere = write(tmp_path, SERVER, "elsewhere.toml")
    StateStore(tmp_path / ".servefleet" / "one").write_index("one", elsewhere)
    assert find_fleet_file(None, tmp_path) == elsewhere
    StateStore(tmp_path / ".servefleet" / "two").write_index("two", elsewhere)
    with pytest.raises(ConfigError, match="several fleets"):
        find_fleet_file(None, tmp_path)
    # ./servefleet.toml wins; an explicit path wins over everything
    default = write(tmp_path, SERVER, "servefleet.toml")
    assert find_fleet_file(None, tmp_path) == default
    assert find_fleet_file("x.toml", tmp_path) == Path("x.toml")


def test_ssh_host_fields_are_validated(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"\[hosts.gpu1\]: ssh: must not be empty, start with '-'"):
        load_fleet_file(write(tmp_path, '[hosts.gpu1]\nssh = "-oProxyCommand=x"\n' + SERVER))
    with pytest.raises(ConfigError, match=r"\[hosts.gpu1\]: strict_host_key: Input should be 'yes' or 'accept-new'"):
        load_fleet_file(write(tmp_path, '[hosts.gpu1]\nssh = "box"\nstrict_host_key = "no"\n' + SERVER))


@pytest.mark.parametrize(
    "example", sorted((Path(__file__).resolve().parent.parent / "examples").glob("*.toml")), ids=lambda p: p.name
)
def test_example_fleet_files_are_valid(example: Path) -> None:
    from servefleet.fleet import Fleet

    fleet = Fleet.load(example)
    assert fleet.spec.servers
    for item in fleet.resolve():  # every engine builds its argv from the example
        assert item.argv and str(item.server.port) in item.argv


def test_every_ssh_setting_is_a_host_key_and_reaches_the_ssh_spec(tmp_path: Path) -> None:
    """The host table's SSH keys are SSHSpec's fields (one declaration): settings a fleet file could
    not set before (options, multiplex, max_sessions, reconnect_s, ...) arrive in the SSHSpec."""
    import dataclasses

    from servefleet.hosts.ssh_options import SSHSpec

    text = (
        '[hosts.gpu1]\nssh = "box"\noptions = { Compression = "yes" }\nmultiplex = false\nmax_sessions = 4\nmax_masters = 2\n'
        "reconnect_s = 5\ncontrol_persist = 30\nalive_interval = 2\nalive_count_max = 5\n" + SERVER
    )
    ssh = load_fleet_file(write(tmp_path, text)).hosts["gpu1"].ssh_spec
    assert (ssh.destination, dict(ssh.options), ssh.multiplex, ssh.max_sessions, ssh.max_masters) == (
        "box",
        {"Compression": "yes"},
        False,
        4,
        2,
    )
    assert (ssh.reconnect_s, ssh.control_persist, ssh.alive_interval, ssh.alive_count_max) == (5, 30, 2, 5)
    keys = set(HostSpec.model_fields)
    assert {f.name for f in dataclasses.fields(SSHSpec)} - {"destination", "name"} <= keys
    assert load_fleet_file(write(tmp_path, '[hosts.gpu1]\nssh = "box"\nalive_timeout = 15\n' + SERVER)).hosts[
        "gpu1"
    ].ssh_spec == SSHSpec(destination="box", name="gpu1")


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ("max_sessions = 100", r"\[hosts.gpu1\]: max_sessions: must be between 1 and 64"),
        ("reconnect_s = 0", r"\[hosts.gpu1\]: reconnect_s: must be a positive number of seconds"),
        ('options = { "Bad Key" = "x" }', r"\[hosts.gpu1\]: options: invalid ssh option Bad Key"),
        ('user = "-oProxyCommand=x"', r"\[hosts.gpu1\]: user: must not be empty, start with '-'"),
        (
            "alive_timeout = 5\nalive_interval = 2",
            r"\[hosts.gpu1\]: alive_timeout: set it or alive_interval, not both",
        ),
        ("multiplx = false", r"\[hosts.gpu1\]: multiplx: unknown field.*multiplex"),
    ],
    ids=["range", "seconds", "option-name", "option-injection", "both-alive", "unknown-key"],
)
def test_a_bad_ssh_setting_is_refused_naming_its_key(tmp_path: Path, table: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_fleet_file(write(tmp_path, f'[hosts.gpu1]\nssh = "box"\n{table}\n' + SERVER))


def test_a_bad_host_setting_exits_3(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from servefleet.cli.main import app

    path = write(tmp_path, '[hosts.gpu1]\nssh = "box"\nmax_sessions = 0\n' + SERVER)
    result = CliRunner().invoke(app, ["status", "--fleet", str(path)])
    assert result.exit_code == 3, result.output
    assert "max_sessions" in result.output
