"""The ``launcher = "systemd-run"`` option of SSH hosts (hosts/ssh_systemd.py).

This machine and CI have no systemd user manager, so three kinds of test:

- the exact remote argv and the escaping systemd needs, as unit tests;
- against the real sshd with the real machine's tools: asking for systemd-run where no user
  manager runs fails with the clear error *before* anything is launched, and leaves no process;
- end to end through the real sshd with STAND-INS for ``systemd-run``, ``systemctl`` and
  ``loginctl`` first on the remote PATH (see ``standin_tools``). They are small Python scripts
  that implement only the subset servefleet uses, the way systemd documents it; they are not
  systemd, and these tests do not prove that a real user manager accepts the command — they prove
  what servefleet sends, and that the launch, wait, status, logs and down paths work on top of it.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
from pathlib import Path

import aiohttp
import psutil
import pytest

from conftest import async_wait_until, free_port
from servefleet.catalog import Category, State
from servefleet.errors import ConfigError, LaunchError
from servefleet.fleet import Fleet
from servefleet.fleet.lifecycle import Action
from servefleet.fleet.loader import load_fleet_file as load_fleet
from servefleet.hosts import ssh_scripts as scripts
from servefleet.hosts import ssh_systemd as units
from servefleet.hosts.base import detach_argv
from servefleet.hosts.ssh_options import SSHSpec

SECRET = "hf_UnitSecret42"
WEIRD = "models/my model 'v2' \"q\" $(touch pwned) $$ ${HOME} `id`"
UNIT_RE = re.compile(r"^servefleet-sd-(\w+)-[0-9a-f]+\.service$")


# -- the argv, exactly (no sshd) ----------------------------------------------------------------


def unescape(arg: str) -> str:
    """What systemd makes of an escaped argument: ``$$`` -> ``$`` (nothing else is left)."""
    return arg.replace("$$", "$")


def test_launch_argv_is_exact_and_survives_shell_quoting() -> None:
    log = '/srv/my fleet/it\'s "here"/logs/a $(x).log'
    status = '/srv/my fleet/it\'s "here"/run/a $(x).status'
    server = ["python3", "-m", "srv", "--model", WEIRD, "--flag=${HOME}"]
    wrapper = detach_argv(server, log, status)
    unit = "servefleet-f-a-18c0ffee.service"

    launch = units.launch_argv(unit, wrapper, log, status)
    assert launch[:2] == ["sh", "-c"] and launch[2] == units.LAUNCH
    assert launch[3:9] == ["sh", unit, log, status, f"{status}.env", f"{status}.pid"]
    command = launch[9:]
    # the unit's command: every "$" doubled, so the manager's ${VAR}/$VAR expansion gives it back
    assert all(
        unescape(a) == b
        for a, b in zip(
            command, ["sh", "-c", units.UNIT_PRELUDE, "sh", f"{status}.env", f"{status}.pid", *wrapper], strict=True
        )
    )
    assert command[2] == units.UNIT_PRELUDE.replace("$", "$$")
    assert "$$(touch pwned) $$$$ $${HOME}" in command[-2] and command[-1] == "--flag=$${HOME}"

    # through the remote login shell: one shlex-quoted string that splits back into the same list
    remote = scripts.with_prelude(launch, cwd="/srv/my fleet/it's", venv="/opt/v env")
    line = shlex.join(remote)
    assert shlex.split(line) == remote
    assert (
        remote[:6] == ["sh", "-c", scripts.PRELUDE, "sh", "/srv/my fleet/it's", "/opt/v env"] and remote[6:] == launch
    )


def test_stop_and_kill_argv() -> None:
    unit = "servefleet-f-a-1.service"
    assert units.stop_argv(unit) == ["sh", "-c", units.STOP, "sh", "stop", "--no-block", "--", unit]
    assert units.kill_argv(unit) == ["sh", "-c", units.STOP, "sh", "kill", "--signal=SIGKILL", "--", unit]


def test_unit_names_are_unique_and_valid() -> None:
    names = {units.unit_name("my.fleet", "srv-1", now=1_700_000_000.0) for _ in range(50)}
    assert len(names) == 50
    for name in names:
        assert re.fullmatch(r"servefleet-my\.fleet-srv-1-[0-9a-f]+\.service", name) and len(name) < 256


@pytest.mark.parametrize(
    ("facts", "says", "advises_linger"),
    [
        (
            {"user": "ann", "missing": "", "manager": "ok", "linger": "Linger=no"},
            "lingering is not enabled for user ann",
            True,
        ),
        (
            {
                "user": "ann",
                "missing": "",
                "manager": "Failed to connect to bus: No such file or directory",
                "linger": "Linger=no",
            },
            "cannot reach a user service manager",
            True,
        ),
        (
            {"user": "ann", "missing": "systemd-run systemctl loginctl"},
            "systemd-run, systemctl, loginctl not found",
            False,
        ),
        (
            {"user": "ann", "missing": "", "manager": "System has not been booted with systemd", "linger": "x"},
            "cannot reach a user service manager",
            False,
        ),
    ],
)
def test_check_error_says_what_is_missing_and_what_to_do(
    facts: dict[str, str], says: str, advises_linger: bool
) -> None:
    error = units.check_error("gpu1", "[hosts.gpu1]", facts)
    assert isinstance(error, LaunchError)
    text = str(error)
    assert text.startswith("ssh host 'gpu1': launcher = \"systemd-run\" cannot be used: ") and says in text
    assert ('launcher = "setsid"' in text) and ("[hosts.gpu1]" in text) and text.endswith("nothing was launched")
    assert ("sudo loginctl enable-linger ann" in text) is advises_linger


def test_check_passes_with_a_lingering_user_manager() -> None:
    assert (
        units.check_error("h", "[hosts.h]", {"user": "ann", "missing": "", "manager": "ok", "linger": "Linger=yes"})
        is None
    )


def test_launcher_option_is_validated(tmp_path: Path) -> None:
    path = tmp_path / "fleet.toml"
    base = '[hosts.gpu]\nssh = "gpu"\n{extra}\n[[servers]]\nname = "a"\nengine = "sim"\nmodel = "m"\nport = 3000\nhost = "gpu"\n'
    path.write_text(base.format(extra=""))
    assert load_fleet(path).hosts["gpu"].launcher == "setsid"
    path.write_text(base.format(extra='launcher = "systemd-run"'))
    assert load_fleet(path).hosts["gpu"].launcher == "systemd-run"
    path.write_text(base.format(extra='launcher = "systemd"'))
    with pytest.raises(ConfigError, match="launcher"):
        load_fleet(path)
    with pytest.raises(ConfigError, match="launcher must be"):
        SSHSpec(destination="gpu", launcher="nohup")  # type: ignore[arg-type]  # deliberately invalid input: the test checks it is refused


# -- stand-ins for the systemd tools -----------------------------------------------------------

_COMMON = r"""
import json, os, re, signal, subprocess, sys
STATE = {state!r}
# The environment a user manager gives its services: its own, not the SSH session's.
MANAGER_ENV = {{"HOME": os.environ.get("HOME", "/"), "USER": os.environ.get("USER", "nobody"),
               "LOGNAME": os.environ.get("USER", "nobody"), "PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}}

def record_call(argv):
    with open(os.path.join(STATE, "calls.jsonl"), "a") as fh:
        fh.write(json.dumps(argv) + "\n")

def unit_path(unit):
    return os.path.join(STATE, "units", unit + ".json")

def load_unit(unit):
    try:
        with open(unit_path(unit)) as fh:
            return json.load(fh)
    except FileNotFoundError:
        return None

def group_alive(pid):
    try:
        os.killpg(pid, 0)
        return True
    except ProcessLookupError:
        return False

def fail(msg, code=1):
    print(msg, file=sys.stderr)
    sys.exit(code)
"""

SYSTEMD_RUN = r'''
"""STAND-IN for systemd-run (tests only; NOT systemd): the subset servefleet uses. Starts the
command as a new session leader (as systemd does for every service) with the manager's
environment, stdio to /dev/null (the journal), in --working-directory; expands ${NAME}, a
whole-word $NAME and $$ in the command line as systemd does for ExecStart=; records the unit."""
argv = sys.argv[1:]
record_call(["systemd-run", *argv])
opts, props, i = {}, [], 0
while i < len(argv):
    a = argv[i]
    if a == "--":
        i += 1
        break
    if a in ("--user", "--quiet", "--collect"):
        opts[a] = True
    elif a.startswith(("--unit=", "--working-directory=")):
        key, _, value = a.partition("=")
        opts[key] = value
    elif a.startswith("--property="):
        props.append(a.partition("=")[2])
    elif a.startswith("-"):
        fail(f"systemd-run (stand-in): option {a} is not supported")
    else:
        break
    i += 1
command = argv[i:]
if "--user" not in opts or "--unit" not in opts or not command:
    fail("systemd-run (stand-in): needs --user, --unit= and a command")
unit = opts["--unit"]
old = load_unit(unit)
if old is not None and group_alive(old["MainPID"]):
    fail(f"Failed to start transient service unit: Unit {unit} was already loaded or has a fragment file.")

def expand_word(s):
    out, i = [], 0
    while i < len(s):
        if s.startswith("$$", i):
            out.append("$"); i += 2
        elif s.startswith("${", i) and "}" in s[i + 2:]:
            j = s.index("}", i + 2); out.append(MANAGER_ENV.get(s[i + 2:j], "")); i = j + 1
        else:
            out.append(s[i]); i += 1
    return "".join(out)

expanded = []
for a in command:
    if re.fullmatch(r"\$[A-Za-z_][A-Za-z0-9_]*", a):
        expanded.extend(MANAGER_ENV.get(a[1:], "").split())
    else:
        expanded.append(expand_word(a))
proc = subprocess.Popen(expanded, cwd=opts.get("--working-directory") or MANAGER_ENV["HOME"], env=MANAGER_ENV,
                        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
os.makedirs(os.path.join(STATE, "units"), exist_ok=True)
with open(unit_path(unit), "w") as fh:
    json.dump({"MainPID": proc.pid, "properties": props, "command": expanded}, fh)
proc.returncode = 0  # detached: never waited for here (its parent is gone once we exit)
'''

SYSTEMCTL = r'''
"""STAND-IN for systemctl --user (tests only; NOT systemd): show-environment, is-active, stop and
kill of units the systemd-run stand-in started. The unit's control group is approximated by the
process group of its main process."""
argv = sys.argv[1:]
record_call(["systemctl", *argv])
if argv[:1] != ["--user"] or len(argv) < 2:
    fail("systemctl (stand-in): only --user VERB is supported")
verb, rest = argv[1], [a for a in argv[2:] if a != "--"]
flags = [a for a in rest if a.startswith("-")]
names = [a for a in rest if not a.startswith("-")]
if verb == "show-environment":
    print("\n".join(f"{k}={v}" for k, v in MANAGER_ENV.items()))
    sys.exit(0)
if len(names) != 1:
    fail(f"systemctl (stand-in): {verb} takes one unit")
unit = names[0]
rec = load_unit(unit)
if verb == "is-active":
    active = rec is not None and group_alive(rec["MainPID"])
    if "--quiet" not in flags:
        print("active" if active else "inactive")
    sys.exit(0 if active else 3)
if verb in ("stop", "kill"):
    if rec is None:
        fail(f"Failed to {verb} {unit}: Unit {unit} not loaded.", 5)
    sig = signal.SIGTERM
    for f in flags:
        if f.startswith("--signal="):
            sig = getattr(signal, f.partition("=")[2])
    try:
        os.killpg(rec["MainPID"], sig)
    except ProcessLookupError:
        pass
    sys.exit(0)
fail(f"systemctl (stand-in): {verb} is not supported")
'''

LOGINCTL = r'''
"""STAND-IN for loginctl (tests only; NOT systemd): `show-user USER -p Linger`."""
record_call(["loginctl", *sys.argv[1:]])
if sys.argv[1:2] != ["show-user"] or sys.argv[3:] != ["-p", "Linger"]:
    fail("loginctl (stand-in): only show-user USER -p Linger is supported")
print("Linger={linger}")
'''


def standin_tools(root: Path, linger: str = "yes") -> Path:
    """A folder with bin/systemd-run, bin/systemctl, bin/loginctl stand-ins; named as the host's
    ``venv`` it comes first on the remote PATH of every command. Returns the folder."""
    state = root / "state"
    (state / "units").mkdir(parents=True)
    (root / "bin").mkdir()
    for name, body in (("systemd-run", SYSTEMD_RUN), ("systemctl", SYSTEMCTL), ("loginctl", LOGINCTL)):
        tool = root / "bin" / name
        text = f"#!{sys.executable}\n" + _COMMON.format(state=str(state)) + body.replace("{linger}", linger)
        tool.write_text(text)
        tool.chmod(0o755)
    return root


def calls(tools: Path) -> list[list[str]]:
    path = tools / "state" / "calls.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def write_fleet(
    tmp_path: Path, server, servers: dict[str, dict], *, venv: Path | None, launcher: str = "systemd-run"
) -> tuple[Path, dict[str, int]]:
    """Sim servers on host "rig" (the sshd) with the given launcher; ``venv`` = the stand-ins."""
    ports = {name: free_port() for name in servers}
    remote = tmp_path / "remote home"
    remote.mkdir(exist_ok=True)
    host = (
        "[hosts.rig]\n"
        f'ssh = "{server.destination}"\nport = {server.port}\n'
        f'identity_file = "{server.identity_file}"\nknown_hosts = "{server.known_hosts}"\n'
        f'config_file = "{server.client_config()}"\nworkdir = {json.dumps(str(remote))}\n'
        f'python = "{sys.executable}"\nconnect_timeout = 3\nlauncher = "{launcher}"\n'
        f'env = {{ HF_TOKEN = "{SECRET}" }}\n' + (f"venv = {json.dumps(str(venv))}\n" if venv else "")
    )
    parts = [
        '[fleet]\nname = "sd"\ntimeout = 60\nstall = 30\n',
        host,
        '[defaults]\nengine = "sim"\nmodel = "sim-m"\nhost = "rig"\n',
    ]
    for name, extra in servers.items():
        fields = "".join(f"{k} = {json.dumps(v)}\n" for k, v in extra.items())
        parts.append(f'[[servers]]\nname = "{name}"\nport = {ports[name]}\n{fields}')
    path = tmp_path / "fleet.toml"
    path.write_text("\n".join(parts))
    return path, ports


def processes_under(folder: Path) -> list[int]:
    """Live processes whose command line names ``folder`` (what a launch would have started)."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline", "status"]):
        try:
            if proc.info["status"] != psutil.STATUS_ZOMBIE and str(folder) in " ".join(proc.info["cmdline"] or ()):
                found.append(proc.info["pid"])
        except psutil.Error:
            continue
    return found


def group_alive(pgid: int) -> bool:
    for proc in psutil.process_iter(["pid", "status"]):
        try:
            if proc.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(proc.info["pid"]) == pgid:
                return True
        except (ProcessLookupError, psutil.Error):
            continue
    return False


# -- no user manager: the clear error, before anything runs (real sshd, real tools) --------------


async def test_systemd_run_without_a_user_manager_fails_before_launching(sshd_server, tmp_path: Path, fleets) -> None:
    """This machine has no systemd user manager (whether or not systemd's tools are installed):
    the launch fails with what is missing and what to do, and nothing was started or written."""
    path, _ = write_fleet(tmp_path, sshd_server, {"a": {}, "b": {}}, venv=None)
    fleet = fleets(Fleet.load(path))
    outcomes = await fleet.start()
    work = tmp_path / "remote home" / "sd"
    for name, outcome in outcomes.items():
        assert outcome.action == Action.FAILED, outcome
        assert outcome.verdict is not None and outcome.verdict.state == State.FAILED
        msg = outcome.message or ""
        assert msg.startswith("ssh host 'rig': launcher = \"systemd-run\" cannot be used: "), msg
        assert re.search(r"not found on the host's PATH|cannot reach a user service manager|lingering", msg), msg
        assert 'set launcher = "setsid"' in msg and msg.endswith("nothing was launched")
        assert fleet.store.load(name) is None
    assert not (work / "logs").exists() and not (work / "run").exists()  # not even a launch marker
    assert processes_under(tmp_path / "remote home") == []


async def test_systemd_run_without_lingering_fails_before_launching(sshd_server, tmp_path: Path, fleets) -> None:
    """With the stand-ins (see the module docstring) reporting Linger=no: the exact linger error,
    and systemd-run is never called."""
    tools = standin_tools(tmp_path / "standin", linger="no")
    path, _ = write_fleet(tmp_path, sshd_server, {"a": {}}, venv=tools)
    fleet = fleets(Fleet.load(path))
    outcome = (await fleet.start())["a"]
    user = sshd_server.user
    assert outcome.action == Action.FAILED
    assert f"lingering is not enabled for user {user} (`loginctl show-user {user} -p Linger` says Linger=no)" in (
        outcome.message or ""
    )
    assert f"sudo loginctl enable-linger {user}" in (outcome.message or "")
    assert [c[0] for c in calls(tools)] == ["systemctl", "loginctl"]  # the check only
    assert calls(tools)[1] == ["loginctl", "show-user", user, "-p", "Linger"]
    assert processes_under(tmp_path / "remote home") == []


# -- end to end with the stand-ins -------------------------------------------------------------


async def test_launch_wait_and_down_through_systemd_run_standins(sshd_server, tmp_path: Path, fleets) -> None:
    """Through the real sshd, with STAND-INS for systemd-run/systemctl/loginctl first on the
    remote PATH (not systemd itself; see the module docstring): a server launched as a transient
    unit comes up ready through the forward, its model path (full of shell and systemd syntax)
    reaches it literally, secrets travel in the environment only, a failing one is diagnosed from
    the same log and status file, and down stops the unit and leaves nothing running."""
    tools = standin_tools(tmp_path / "standin tools")
    model_dir = tmp_path / "remote home" / WEIRD
    model_dir.mkdir(parents=True)
    path, ports = write_fleet(
        tmp_path,
        sshd_server,
        {
            "w": {"model": str(model_dir), "args": ["--load-time", "0.3"]},
            "oom": {"args": ["--fail-at-startup", "gpu_oom"]},
        },
        venv=tools,
    )
    fleet = fleets(Fleet.load(path))
    verdicts = await fleet.up(smoke=True)
    assert verdicts["w"].state == State.READY, verdicts["w"]
    oom = verdicts["oom"]
    assert oom.state == State.FAILED and oom.category == Category.GPU_OOM and oom.evidence is not None

    work = tmp_path / "remote home" / "sd"
    record = fleet.store.load("w")
    assert (
        record is not None
        and record.unit
        and UNIT_RE.match(record.unit)
        and UNIT_RE.match(record.unit).group(1) == "w"
    )
    assert (
        json.loads((work / "state" / "w.json").read_text())["unit"] == record.unit
    )  # adoptable from the remote record
    assert fleet.store.load("oom").unit != record.unit

    # what reached systemd-run, exactly (the check ran once for the host, then one call per server)
    runs = [c for c in calls(tools) if c[0] == "systemd-run"]
    assert len(runs) == 2 and [c[0] for c in calls(tools)][:2] == ["systemctl", "loginctl"]
    run = next(c for c in runs if f"--unit={record.unit}" in c)
    status = record.status_path
    wrapper = detach_argv(record.argv, record.log_path, status)
    assert run[:8] == [
        "systemd-run",
        "--user",
        "--quiet",
        "--collect",
        f"--unit={record.unit}",
        f"--working-directory={tmp_path / 'remote home'}",
        "--property=KillMode=control-group",
        "--",
    ]
    assert [unescape(a) for a in run[8:]] == [
        "sh",
        "-c",
        units.UNIT_PRELUDE,
        "sh",
        f"{status}.env",
        f"{status}.pid",
        *wrapper,
    ]
    assert not any(SECRET in arg for c in calls(tools) for arg in c)  # never on a command line

    # the unit's main process is the wrapper, session and group leader; the server runs under it
    unit_info = json.loads((tools / "state" / "units" / f"{record.unit}.json").read_text())
    assert unit_info["MainPID"] == record.pgid == os.getpgid(record.pgid) == os.getsid(record.pgid)
    server = next(
        p for p in psutil.Process(record.pgid).children(recursive=True) if "servefleet.sim" in " ".join(p.cmdline())
    )
    env = server.environ()
    assert env["HF_TOKEN"] == SECRET and env["PATH"].startswith(f"{tools}/bin:")
    assert str(model_dir) in server.cmdline()  # literally: no shell, no systemd expansion
    assert not list(tmp_path.rglob("pwned")) and not (Path.home() / "pwned").exists()
    assert not (work / "run" / "w.status.env").exists() and not (work / "run" / "w.status.pid").exists()

    endpoint = {e.name: e for e in await fleet.ready_endpoints()}["w"]
    assert endpoint.served_model == str(model_dir) and not endpoint.base_url.endswith(f":{ports['w']}")
    async with aiohttp.ClientSession() as session, session.get(f"{endpoint.base_url}/v1/models") as resp:
        assert resp.status == 200

    # status names the unit (--json always; the table grows a "unit" column)
    statuses = {s.name: s for s in await fleet.status()}
    assert statuses["w"].unit == record.unit and statuses["w"].to_json()["unit"] == record.unit
    assert statuses["oom"].unit == fleet.store.load("oom").unit

    # down: through systemctl --user stop, then the usual group checks
    results = await fleet.down(["w"], grace_s=10)
    assert results["w"].was_running and results["w"].ok, results["w"]
    assert ["systemctl", "--user", "stop", "--no-block", "--", record.unit] in calls(tools)
    assert not group_alive(record.pgid)
    assert results["w"].signal == "SIGTERM" and results["w"].message == "stopped"  # no SIGKILL needed
    assert not (work / "state" / "w.json").exists() and fleet.store.load("w") is None
    assert processes_under(model_dir) == []


async def test_a_unit_that_cannot_start_is_a_launch_failure(sshd_server, tmp_path: Path, fleets) -> None:
    """(Stand-ins.) systemd-run refusing the unit is reported as a failed launch with its words,
    and the environment file holding the secrets is removed."""
    tools = standin_tools(tmp_path / "standin")
    (tools / "bin" / "systemd-run").write_text(
        f"#!{sys.executable}\nimport sys\nprint('Failed to start transient service unit: Access denied', file=sys.stderr)\nsys.exit(1)\n"
    )
    path, _ = write_fleet(tmp_path, sshd_server, {"a": {}}, venv=tools)
    fleet = fleets(Fleet.load(path))
    outcome = (await fleet.start())["a"]
    assert outcome.action == Action.FAILED
    assert "systemd-run --user failed: Failed to start transient service unit: Access denied" in (
        outcome.message or ""
    )
    assert list((tmp_path / "remote home" / "sd" / "run").glob("*.env")) == []
    assert fleet.store.load("a") is None


async def test_down_escalates_to_sigkill_through_the_manager(sshd_server, tmp_path: Path, fleets) -> None:
    """(Stand-ins.) A server that ignores SIGTERM: after the grace period down asks the manager
    to SIGKILL the unit (and kills the group), and nothing is left."""
    tools = standin_tools(tmp_path / "standin")
    stubborn = {"engine": "openai", "command": ["sh", "-c", "trap '' TERM; echo started; while :; do sleep 0.2; done"]}
    path, _ = write_fleet(tmp_path, sshd_server, {"s": stubborn}, venv=tools)
    fleet = fleets(Fleet.load(path))
    outcome = (await fleet.start())["s"]
    assert outcome.action == Action.LAUNCHED and outcome.record is not None and outcome.record.unit
    record = outcome.record
    log = Path(record.log_path)

    async def started() -> bool:
        return log.exists() and b"started" in log.read_bytes()

    await async_wait_until(started, timeout=20, what="the stubborn server to start")
    result = (await fleet.down(["s"], grace_s=1))["s"]
    assert result.was_running and result.signal == "SIGKILL" and result.ok, result
    made = calls(tools)
    assert ["systemctl", "--user", "stop", "--no-block", "--", record.unit] in made
    assert ["systemctl", "--user", "kill", "--signal=SIGKILL", "--", record.unit] in made
    assert not group_alive(record.pgid)
