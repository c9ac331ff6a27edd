"""`servefleet up` with the served name and the port given only as engine-native args (simulated
vLLM, which answers 404 to a request for any other model name, as vLLM does). Before servefleet
read them, the smoke request asked for the model path and `up` said `failed (other)` about a
healthy server; the real-engine version of this is in tests/test_real_vllm.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from conftest import free_port


def cli(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "servefleet.cli.main", *args], capture_output=True, text=True, cwd=cwd, timeout=timeout
    )


@pytest.mark.parametrize("port_in", ["field", "args"])
async def test_up_requests_the_served_name_from_the_args(tmp_path: Path, port_in: str) -> None:
    port = free_port()
    args = ["--style", "vllm", "--load-time", "0.2", "--served-model-name", "tiny"]
    field = f"port = {port}\n" if port_in == "field" else ""
    args += [f"--port={port}"] if port_in == "args" else []
    (tmp_path / "fleet.toml").write_text(
        '[fleet]\nname = "n"\ntimeout = 60\nstall = 30\nsmoke = true\n\n'
        f'[[servers]]\nname = "v"\nengine = "sim"\nmodel = "/models/sim-7b"\n{field}args = {json.dumps(args)}\n'
    )
    try:
        up = cli("up", "fleet.toml", "--json", cwd=tmp_path)
        assert up.stdout, up.stderr[-2000:]
        (entry,) = json.loads(up.stdout)["servers"]
        assert (up.returncode, entry["verdict"]["state"]) == (0, "ready"), entry["verdict"]
        record = json.loads((tmp_path / ".servefleet" / "n" / "v.json").read_text())
        assert record["served_model"] == "tiny" and record["port"] == port
        if port_in == "args":  # the user's flag, once; none of ours
            assert record["argv"].count(f"--port={port}") == 1 and "--port" not in record["argv"]
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{port}/v1/models") as resp:
                assert [m["id"] for m in (await resp.json())["data"]] == ["tiny"]
    finally:
        down = cli("down", "--fleet", "fleet.toml", "--json", cwd=tmp_path)
        assert down.returncode == 0, down.stderr
