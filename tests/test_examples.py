"""Every file under examples/ is exercised: the GPU and remote ones parsed, validated and rendered to
the argv and environment they would launch; the simulated fleet brought up for real with `servefleet
up` (issue 12.8: it failed with `--tokens-per-step: invalid int value: '2.5'`)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from conftest import free_port
from servefleet.engines.registry import get_engine
from servefleet.fleet import Fleet

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def rendered(name: str) -> dict[str, Any]:
    """server -> (argv, added env, served model, native facts) of an example, as `up` would launch it."""
    out = {}
    for item in Fleet.load(EXAMPLES / name).resolve():
        native = get_engine(item.server.engine).native_args(item.server.args, item.server.command or ())
        out[item.name] = {
            "argv": item.argv,
            "gpus": item.env.get("CUDA_VISIBLE_DEVICES"),
            "served": item.served_model,
            "native": dict(native.values),
            "host": item.server.host,
        }
    return out


def test_demo_two_transformers_servers_on_the_cpu() -> None:
    servers = rendered("demo.toml")
    assert set(servers) == {"cpu-a", "cpu-b"}
    # two configurations of one model: transformers' default (sequential) and continuous batching
    for name, port, own in (
        ("cpu-a", 38401, []),
        ("cpu-b", 38402, ["--continuous-batching", "--cb-num-blocks", "64"]),
    ):
        argv = servers[name]["argv"]
        assert argv[1:4] == ["-m", "transformers.cli.transformers", "serve"]
        assert argv[4].endswith("demo-out/tiny-llama")
        assert argv[5:] == ["--host", "127.0.0.1", "--port", str(port), "--device", "cpu", *own]
        assert servers[name]["gpus"] is None and servers[name]["served"] == argv[4]


def test_remote_ssh_sglang_on_two_gpus_of_one_host() -> None:
    fleet = Fleet.load(EXAMPLES / "remote-ssh.toml")
    assert fleet.spec.hosts["gpu1"].ssh == "root@gpu1.example.internal"
    servers = rendered("remote-ssh.toml")
    mtp, plain = servers["gpu1-mtp"], servers["gpu1-plain"]
    assert mtp["host"] == plain["host"] == "gpu1"
    assert mtp["argv"][:3] == ["/opt/sglang/.venv/bin/python", "-m", "sglang.launch_server"]
    assert mtp["argv"][-2:] == ["--speculative-algorithm", "NEXTN"] and mtp["gpus"] == "0"
    assert mtp["native"] == {"speculative": {"speculative_algorithm": "NEXTN"}}
    assert "--speculative-algorithm" not in plain["argv"] and plain["gpus"] == "1"


def test_sglang_mtp_against_plain() -> None:
    servers = rendered("sglang-mtp-vs-plain.toml")
    mtp, plain = servers["mtp"], servers["plain"]
    for server in (mtp, plain):
        assert server["served"] == "qwen3-next"
        assert server["argv"].count("--served-model-name") == 1
        assert server["native"]["memory_fraction"] == 0.85 and server["native"]["context_length"] == 32768
    assert mtp["native"]["speculative"] == {
        "speculative_algorithm": "NEXTN",
        "speculative_num_steps": 3,
        "speculative_eagle_topk": 1,
        "speculative_num_draft_tokens": 4,
    }
    assert plain["native"]["max_running_requests"] == 256 and "speculative" not in plain["native"]
    assert (mtp["gpus"], plain["gpus"]) == ("0", "1")


def test_vllm_tensor_parallel_pair() -> None:
    servers = rendered("vllm.toml")
    for name, gpus in (("tp2", "0,1"), ("tp2-mtp", "2,3")):
        server = servers[name]
        assert server["gpus"] == gpus
        assert server["native"]["tensor_parallel_size"] == 2 and server["native"]["context_length"] == 16384
        assert server["argv"].count("--tensor-parallel-size") == 1  # the user's, not one added from gpus
    assert servers["tp2-mtp"]["native"]["speculative"] == {"method": "mtp", "num_speculative_tokens": 1}


def test_every_example_has_its_test() -> None:
    tested = {
        "demo.toml",
        "remote-ssh.toml",
        "sglang-mtp-vs-plain.toml",
        "vllm.toml",
        "sim-fleet.toml",
        "slurm.toml",
    }  # slurm.toml: tests/test_slurm_units.py loads it
    assert {p.name for p in EXAMPLES.iterdir() if p.is_file()} == tested


def test_sim_fleet_comes_up_for_real(tmp_path: Path) -> None:
    """The example as shipped, but on free ports and with its state in tmp_path (the fixed ports
    31000/31001 may be taken on a shared machine)."""
    text = (EXAMPLES / "sim-fleet.toml").read_text()
    ports = {31000: free_port(), 31001: free_port()}
    text, count = re.subn(r"^port = (\d+)", lambda m: f"port = {ports[int(m.group(1))]}", text, flags=re.M)
    assert count == 2
    fleet_file = tmp_path / "sim-fleet.toml"
    fleet_file.write_text(text)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "servefleet.cli.main", *args],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            timeout=180,
        )

    try:
        up = cli("up", str(fleet_file), "--json")
        assert up.stdout, up.stderr[-2000:]
        servers = {s["name"]: s for s in json.loads(up.stdout)["servers"]}
        assert up.returncode == 0, {n: s["verdict"] for n, s in servers.items()}
        assert {n: s["verdict"]["state"] for n, s in servers.items()} == {"fast": "ready", "wide": "ready"}
        fast, wide = servers["fast"]["verdict"]["capacity"], servers["wide"]["verdict"]["capacity"]
        assert fast["max_running_requests"] == 4 and wide["max_running_requests"] == 64
        assert fast["speculative"]  # the MTP-like server reports its speculative settings
    finally:
        down = cli("down", "--fleet", str(fleet_file), "--json")
        assert down.returncode == 0, down.stderr
