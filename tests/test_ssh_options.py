"""The ssh command lines SSHHost builds and how it reads ssh's failures (no server needed)."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
from itertools import pairwise
from pathlib import Path

import pytest

from conftest import wait_until
from servefleet.errors import CommandError, ConfigError, HostError, HostUnreachable
from servefleet.hosts import ssh_scripts as scripts
from servefleet.hosts.base import PortHolder
from servefleet.hosts.ssh_follow import classify_tail_notice
from servefleet.hosts.ssh_options import (
    SSHSpec,
    classify_ssh_failure,
    control_dir,
    control_path,
    ssh_argv,
    ssh_error,
    ssh_options,
)


def opts_dict(argv: list[str]) -> dict[str, str]:
    """The ``-o KEY=VALUE`` settings of an argv, first value winning (as ssh reads them)."""
    out: dict[str, str] = {}
    for flag, value in pairwise(argv):
        if flag == "-o":
            key, _, val = value.partition("=")
            out.setdefault(key, val)
    return out


def test_master_client_and_direct_options() -> None:
    spec = SSHSpec(destination="gpu-box", port=2222, identity_file="/k/id", jump="bastion", connect_timeout=7)
    master = ssh_options(spec, "master", "/tmp/sf/abc.0.%C")
    o = opts_dict(master)
    assert o["BatchMode"] == "yes" and o["StrictHostKeyChecking"] == "yes"
    assert o["ControlMaster"] == "auto" and o["ControlPath"] == "/tmp/sf/abc.0.%C" and o["ControlPersist"] == "300s"
    assert (
        o["ConnectTimeout"] == "7" and o["ServerAliveInterval"] == "4" and o["ServerAliveCountMax"] == "3"
    )  # a silent link: ~16 s
    assert o["IdentitiesOnly"] == "yes"
    assert (
        master[master.index("-p") + 1] == "2222"
        and master[master.index("-J") + 1] == "bastion"
        and master[master.index("-i") + 1] == "/k/id"
    )
    client = opts_dict(ssh_options(spec, "client", "/tmp/sf/abc.0.%C"))
    assert (
        client["ControlMaster"] == "no"
        and client["ControlPath"] == "/tmp/sf/abc.0.%C"
        and "ControlPersist" not in client
    )
    direct = opts_dict(ssh_options(spec, "direct"))
    assert direct["ControlMaster"] == "no" and direct["ControlPath"] == "none"
    with pytest.raises(ValueError):
        ssh_options(spec, "client")


def test_host_key_checking_is_on_and_accept_new_is_opt_in() -> None:
    assert opts_dict(ssh_options(SSHSpec(destination="h"), "direct"))["StrictHostKeyChecking"] == "yes"
    tofu = SSHSpec(destination="h", strict_host_key="accept-new", known_hosts="/tmp/kh")
    o = opts_dict(ssh_options(tofu, "direct"))
    assert o["StrictHostKeyChecking"] == "accept-new" and o["UserKnownHostsFile"] == "/tmp/kh"
    with pytest.raises(ConfigError, match="strict_host_key"):
        SSHSpec(destination="h", strict_host_key="no")  # type: ignore[arg-type]  # deliberately invalid input: the test checks it is refused


def test_user_options_cannot_override_ours() -> None:
    spec = SSHSpec(
        destination="h", options={"StrictHostKeyChecking": "no", "ControlPath": "/evil", "Compression": "yes"}
    )
    o = opts_dict(ssh_options(spec, "client", "/tmp/sf/x.0.%C"))
    assert o["StrictHostKeyChecking"] == "yes" and o["ControlPath"] == "/tmp/sf/x.0.%C" and o["Compression"] == "yes"


def test_argv_ends_with_destination_then_one_quoted_command() -> None:
    spec = SSHSpec(destination="root@10.0.0.5")
    remote = shlex.join(["echo", "a b", "$(x)"])
    argv = ssh_argv(spec, "client", "/tmp/sf/t.0.%C", flags=["-T"], remote=remote)
    assert argv[0] == "ssh" and argv[1] == "-T"
    assert argv[-3:] == ["--", "root@10.0.0.5", "echo 'a b' '$(x)'"]


@pytest.mark.parametrize(
    "field,value",
    [
        ("destination", "-oProxyCommand=touch /tmp/x"),
        ("destination", ""),
        ("jump", "-oProxyCommand=x"),
        ("user", "-l"),
        ("identity_file", "-i"),
        ("port", 0),
        ("port", 70000),
        ("connect_timeout", 0),
        ("env", {"BAD-NAME": "x"}),
        ("options", {"Bad Key": "x"}),
        ("max_sessions", 0),
    ],
)
def test_invalid_specs_are_config_errors(field: str, value: object) -> None:
    kwargs: dict[str, object] = {"destination": "h", field: value}
    with pytest.raises(ConfigError):
        SSHSpec(**kwargs)  # type: ignore[arg-type]  # deliberately invalid input: the test checks it is refused


# (exit code, stderr written by ssh) -> the reason the connection failed; None = the remote
# command itself failed (its exit code may well be 255).
FAILURES = [
    (255, "ssh: connect to host 127.0.0.1 port 1: Connection refused\r\n", "connection refused"),
    (
        255,
        "Connection timed out during banner exchange\r\nConnection to 10.1.1.1 port 22 timed out\r\n",
        "connection timed out",
    ),
    (255, "ssh: connect to host 10.9.9.9 port 22: Connection timed out\r\n", "connection timed out"),
    (255, "ssh: Could not resolve hostname gpu-box: Name or service not known\r\n", "name resolution failed"),
    (255, "ssh: connect to host 10.0.0.1 port 22: No route to host\r\n", "network unreachable"),
    (255, "ssh: connect to host 10.0.0.1 port 22: Network is unreachable\r\n", "network unreachable"),
    (255, "root@127.0.0.1: Permission denied (publickey).\r\n", "authentication failed"),
    (
        255,
        "No ED25519 host key is known for [127.0.0.1]:2222 and you have requested strict checking.\r\nHost key verification failed.\r\n",
        "host key verification failed",
    ),
    (
        255,
        "@@@@@@@\r\n@    WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!     @\r\nHost key verification failed.\r\n",
        "host key verification failed",
    ),
    (255, "kex_exchange_identification: read: Connection reset by peer\r\n", "connection closed"),
    (255, "Connection closed by 127.0.0.1 port 2222\r\n", "connection closed"),
    (255, "mux_client_request_session: read from master failed: Broken pipe\r\n", "connection closed"),
    (255, "Control socket connect(/tmp/sf/x): No such file or directory\r\n", "master connection lost"),
    (
        255,
        "channel 0: open failed: connect failed: Connection refused\r\nstdio forwarding failed\r\n",
        "connection refused",
    ),
    (255, "", None),  # the remote command exited 255 and said nothing
    (255, "my-tool: fatal: bad input\n", None),
    (1, "ssh: connect to host x port 22: Connection refused\n", None),  # not 255: the command's own words
    (127, "sh: 1: /nonexistent: not found\n", None),
]


@pytest.mark.parametrize("code,stderr,reason", FAILURES)
def test_classify_ssh_failure(code: int, stderr: str, reason: str | None) -> None:
    assert classify_ssh_failure(code, stderr) == reason


def test_ssh_error_translates_to_our_tree() -> None:
    spec = SSHSpec(destination="root@gpu", name="gpu1")
    err = ssh_error(spec, ["ssh"], 255, "root@gpu: Permission denied (publickey).\n")
    assert isinstance(err, HostUnreachable) and "gpu1" in str(err) and "authentication failed" in str(err)
    err = ssh_error(spec, ["ssh"], 255, "Host key verification failed.\n")
    assert isinstance(err, HostUnreachable) and "accept-new" in str(err)  # says how to opt in
    cmd = ssh_error(spec, ["python", "-m", "x"], 2, "usage: x\n", shown=["python", "-m", "x"])
    assert isinstance(cmd, CommandError) and cmd.returncode == 2 and cmd.argv == ["python", "-m", "x"]


def test_control_dir_is_private_and_refuses_a_foreign_folder(tmp_path) -> None:
    mine = tmp_path / "ctl"
    assert control_dir(str(mine)) == str(mine)
    assert mine.stat().st_mode & 0o777 == 0o700
    os.chmod(mine, 0o755)
    control_dir(str(mine))
    assert mine.stat().st_mode & 0o777 == 0o700  # repaired
    path = control_path(control_dir(), "tok", 3)  # the default folder: short enough for sun_path
    assert path.endswith("/tok.3.%C") and len(path.replace("%C", "x" * 40)) < 100
    with pytest.raises(HostError, match="too long"):
        control_path(str(tmp_path / ("long" * 20)), "tok", 0)
    if os.geteuid() == 0:
        foreign = tmp_path / "foreign"
        foreign.mkdir(mode=0o700)
        os.chown(foreign, 65534, 65534)
        with pytest.raises(HostError, match="not a folder owned by us"):
            control_dir(str(foreign))
    link = tmp_path / "link"
    link.symlink_to(mine)
    with pytest.raises(HostError):
        control_dir(str(link))


@pytest.mark.parametrize(
    "line,kind",
    [
        ("tail: /x/y.log: file truncated", "truncated"),
        ("tail: '/x/y.log' has been replaced;  following new file", "truncated"),
        ("tail: '/x/y.log' has appeared;  following new file", "appeared"),
        ("tail: cannot open '/x/y.log' for reading: No such file or directory", "ignore"),
        ("tail: '/x/y.log' has become inaccessible: No such file or directory", "ignore"),
        ("tail: inotify cannot be used, reverting to polling", "ignore"),
        ("tail: unrecognized option '--pid=1'", "error"),
    ],
)
def test_tail_notices(line: str, kind: str) -> None:
    assert classify_tail_notice(line) == kind


def test_parsers() -> None:
    assert scripts.parse_follow_header(b"123 456\n") == (123, 456)
    assert scripts.parse_follow_header(b"- -\n") == (None, None)
    assert scripts.parse_port_holder(
        "LISTEN 0 5 127.0.0.1:8000 0.0.0.0:* users:((...))\nholder 42 40\n"
    ) == PortHolder(42, 40)
    assert scripts.parse_port_holder("holder - -\n") == PortHolder(None, None)
    assert scripts.parse_port_holder("") is None
    assert scripts.parse_probe("home=/home/me dir\ntailpid=1\n") == {"home": "/home/me dir", "tailpid": "1"}
    with pytest.raises(HostError):
        scripts.env_lines({"TOKEN": "two\nlines"})


def test_remote_scripts_run_under_dash_and_bash(tmp_path) -> None:
    """The remote programs are POSIX sh: run them locally under every shell we can find."""
    target = tmp_path / "a $(b) 'c'.txt"
    target.write_bytes(b"0123456789")
    for shell in ("/bin/sh", "/bin/dash", "/bin/bash"):
        if not os.path.exists(shell):
            continue
        argv = scripts.read_argv(str(target), 3, 4)
        argv[0] = shell
        assert subprocess.run(argv, capture_output=True).stdout == b"3456"
        argv = scripts.size_argv(str(tmp_path / "missing"))
        argv[0] = shell
        assert subprocess.run(argv, capture_output=True).returncode == scripts.MISSING_RC
        argv = scripts.group_alive_argv(os.getpgid(0))
        argv[0] = shell
        assert subprocess.run(argv).returncode == 0


def test_group_alive_without_ps_reads_proc_and_skips_zombies() -> None:
    """On a host without ps, both remote programs (GROUP_ALIVE and the status batch) read /proc: a
    group with a live process is alive; a group whose only member is a zombie, or no group, is not."""
    from servefleet.hosts.questions import Alive
    from servefleet.hosts.ssh_batch import batch_argv, parse_batch

    live = subprocess.Popen(["sleep", "60"], start_new_session=True)
    zombie = subprocess.Popen(["sleep", "60"], start_new_session=True)
    os.kill(zombie.pid, signal.SIGKILL)  # not reaped: a zombie, and `kill -0 -PGID` still succeeds
    gone = subprocess.Popen(["true"], start_new_session=True)
    gone.wait()
    no_ps = {"PATH": "/nonexistent"}  # the shells' builtins only: no ps, no awk
    try:
        wait_until(lambda: _state(zombie.pid) == "Z", what="the zombie")
        for shell in ("/bin/sh", "/bin/dash", "/bin/bash"):
            if not os.path.exists(shell):
                continue
            for pgid, alive in ((live.pid, True), (zombie.pid, False), (gone.pid, False)):
                argv = scripts.group_alive_argv(pgid)
                argv[0] = shell
                assert (subprocess.run(argv, env=no_ps).returncode == 0) is alive, (shell, pgid, alive)
            ops = [Alive(live.pid), Alive(zombie.pid), Alive(gone.pid)]
            argv, token = batch_argv(ops)
            argv[0] = shell
            done = subprocess.run(argv, env=no_ps, capture_output=True)
            assert done.returncode == 0, done.stderr
            assert [parse_batch(ops, done.stdout, token)[op] for op in ops] == [True, False, False], shell
    finally:
        for proc in (live, zombie):
            proc.kill()
            proc.wait()


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()[0]


def test_alive_timeout_from_the_fleet_file_sets_the_keep_alives(tmp_path) -> None:
    """``[hosts.X] alive_timeout`` (default 15 s) becomes three keep-alives over that time."""
    from servefleet.errors import ConfigError as _ConfigError
    from servefleet.fleet import Fleet

    assert SSHSpec.alive_settings(15) == {"alive_interval": 4, "alive_count_max": 3}
    assert SSHSpec.alive_settings(3) == {"alive_interval": 1, "alive_count_max": 2}
    assert SSHSpec.alive_settings(1) == {"alive_interval": 1, "alive_count_max": 1}
    assert (
        SSHSpec(destination="h").alive_timeout
        == SSHSpec(destination="h", **SSHSpec.alive_settings(15)).alive_timeout
        == 16
    )
    assert SSHSpec(destination="h", **SSHSpec.alive_settings(3)).alive_timeout == 3
    text = '[hosts.a]\nssh = "a"\n{extra}\n[[servers]]\nname = "s"\nengine = "sim"\nmodel = "m"\nhost = "a"\nport = 9000\n'
    for extra, interval, count in (("", "4", "3"), ("alive_timeout = 30", "8", "3")):
        path = tmp_path / "fleet.toml"
        path.write_text(text.format(extra=extra))
        host = Fleet.load(path).binding("a").host
        o = opts_dict(ssh_options(host.spec, "master", "/tmp/sf/x.0.%C"))
        assert (o["ServerAliveInterval"], o["ServerAliveCountMax"]) == (interval, count)
    path.write_text(text.format(extra="alive_timeout = 0"))
    with pytest.raises(_ConfigError, match="alive_timeout"):
        Fleet.load(path)
