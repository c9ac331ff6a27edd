"""vLLM's CPU build on an SSH host (the test rig's sshd on 127.0.0.1): where the polling wait was
seen (hundreds of remote commands per start, one every 50-100 ms), a start now costs its wait at
most five remote commands, counted by SSHHost and by sshd's own session log.

The smoke request is off: started over SSH on this machine, vLLM 0.32.0's CPU worker died with
SIGILL on the first completion (benchmarks/results/remote-up.md); readiness by the HTTP probe and
the capacity read from the log are what the watcher delivers."""

from __future__ import annotations

import json
from pathlib import Path

from real_engines import VLLM_ARGS, VLLM_ENV, build_tiny_model, engine_python, real_test
from servefleet.catalog import State
from servefleet.fleet import Fleet
from servefleet.hosts.ssh import SSHHost
from test_ssh_fleet import write_fleet
from test_ssh_watch import WAIT_COMMANDS, sshd_sessions


@real_test(1500)
async def test_a_vllm_start_over_ssh_costs_at_most_five_commands_for_its_wait(
    sshd_server, tmp_path: Path, fleets
) -> None:
    python = engine_python("vllm")
    model = build_tiny_model(tmp_path / "tiny-model")
    path, _ports = write_fleet(tmp_path, sshd_server, {"v": []}, timeout=900, stall=300)
    env = ", ".join(f"{k} = {json.dumps(v)}" for k, v in VLLM_ENV.items())
    defaults = (
        f'[defaults]\nengine = "vllm"\nmodel = {json.dumps(str(model))}\nhost = "rig"\n'
        f"python = {json.dumps(str(python))}\nargs = {json.dumps(list(VLLM_ARGS))}\nenv = {{ {env} }}\n"
    )
    text = path.read_text()
    sim_defaults = '[defaults]\nengine = "sim"\nmodel = "sim-m"\nhost = "rig"\nargs = ["--load-time", "0.3"]\n'
    assert sim_defaults in text
    path.write_text(text.replace(sim_defaults, defaults))
    fleet = fleets(Fleet.load(path))
    outcomes = await fleet.start()
    host = fleet.binding("rig").host
    assert isinstance(host, SSHHost)
    commands, sessions = host.commands, sshd_sessions(sshd_server)
    verdict = (await fleet.wait(outcomes, smoke=False))["v"]
    assert verdict.state is State.READY, verdict
    assert verdict.capacity.kv_cache_tokens, verdict.capacity  # read from the log the watcher streamed
    assert host.commands - commands <= WAIT_COMMANDS, host.commands - commands
    assert sshd_sessions(sshd_server) - sessions <= WAIT_COMMANDS, sshd_sessions(sshd_server) - sessions
