"""`servefleet serve` as a command: its refusals (exit 3, the option named), a graceful SIGTERM, and
a fleet whose servers come up while it serves (`servefleet up --only`)."""

from __future__ import annotations

import concurrent.futures
import json
import signal
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import openai
import pytest

from conftest import PYTHON, SimProcess, free_port, wait_until
from test_generate_sim import FAST_SIM

SERVEFLEET = [PYTHON, "-m", "servefleet.cli.main"]
MODEL = "sim-model"


def run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SERVEFLEET, *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--url", "http://127.0.0.1:9", "--host", "0.0.0.0"), "--api-key"),
        (("--url", "http://127.0.0.1:9", "--host", "192.168.1.5", "--api-key", ""), "--api-key"),
        (("--url", "http://127.0.0.1:9", "--api-key-file", "/nonexistent/keys"), "--api-key-file"),
        ((), "--fleet FILE or --url"),
    ],
)
def test_refusals_are_usage_errors_naming_the_option(args: tuple[str, ...], says: str) -> None:
    proc = run("serve", *args)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert says in proc.stderr, proc.stderr


def test_an_empty_key_file_is_refused(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text("# nothing here\n\n")
    proc = run("serve", "--url", "http://127.0.0.1:9", "--api-key-file", str(keys), "--json")
    assert proc.returncode == 3 and "holds no key" in proc.stderr
    assert json.loads(proc.stdout)["error"]["kind"] == "usage"


class Serving:
    """`servefleet serve ... --json` in a subprocess: its URL from its first line."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [*SERVEFLEET, "serve", "--port", "0", "--json", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        line = self.proc.stdout.readline()
        if not line:
            raise AssertionError(f"serve exited {self.proc.wait()} before serving:\n{self.proc.stderr.read()}")
        self.start = json.loads(line)
        self.url = self.start["url"]

    def get(self, path: str) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(self.url.removesuffix("/v1") + path, timeout=10) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def stop(self, *, signalled: bool = False) -> tuple[int, str]:
        """SIGTERM (unless sent already: a second one during the exit would end it the default way) and its exit."""
        if not signalled:
            self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(timeout=60)
        return rc, self.proc.stderr.read()


def test_sigterm_lets_requests_in_flight_finish_then_exits_0(tmp_path: Path) -> None:
    sim = (
        SimProcess(*FAST_SIM, "--decode-ms", "25", "--max-running", "8", log_path=tmp_path / "sim.log")
        .start()
        .wait_ready()
    )
    try:
        gw = Serving("--url", sim.url, "--grace", "30")
        client = openai.OpenAI(base_url=gw.url, api_key="none", max_retries=0, timeout=60)
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            futures = [
                pool.submit(
                    client.completions.create, model=MODEL, prompt="p", max_tokens=60, extra_body={"ignore_eos": True}
                )
                for _ in range(4)
            ]  # ~1.5 s each

            def all_in_flight() -> bool:
                _, text = gw.get("/metrics")
                return 'servefleet_serve_server_in_flight{model="sim-model",server="url"} 4.0' in text.decode()

            wait_until(all_in_flight, timeout=30, interval=0.05, what="four requests in flight")
            gw.proc.send_signal(signal.SIGTERM)
            answers = [f.result(timeout=60) for f in futures]
        assert all(a.usage.completion_tokens == 60 for a in answers)  # finished, not cut
        rc, err = gw.stop(signalled=True)
        assert rc == 0, err
        with pytest.raises(openai.APIConnectionError):  # no longer listening
            client.models.list()
        client.close()
    finally:
        sim.stop()


def requests_by_server(gw: Serving) -> dict[str, float]:
    _, metrics = gw.get("/metrics")
    return {
        line.split('server="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1])
        for line in metrics.decode().splitlines()
        if line.startswith("servefleet_serve_server_requests_total")
    }


def fleet_file(tmp_path: Path, names: list[str]) -> Path:
    path = tmp_path / "fleet.toml"
    text = '[fleet]\nname = "gw"\ntimeout = 60\nstall = 30\nsmoke = false\n'
    for name in names:
        text += (
            f'\n[[servers]]\nname = "{name}"\nengine = "sim"\nmodel = "sim-7b"\nport = {free_port()}\n'
            f"args = {json.dumps([*FAST_SIM, '--decode-ms', '3', '--max-running', '4'])}\n"
        )
    path.write_text(text)
    return path


def test_a_server_started_with_up_only_while_serving_is_admitted_used_and_can_be_drained(tmp_path: Path) -> None:
    fleet = fleet_file(tmp_path, ["a", "b"])
    gw = None
    try:
        up = run("up", str(fleet), "--only", "a", timeout=120)
        assert up.returncode == 0, up.stdout + up.stderr
        gw = Serving("--fleet", str(fleet), "--poll", "0.3")
        assert gw.start["servers"] == ["a"]
        up = run("up", str(fleet), "--only", "b", timeout=120)
        assert up.returncode == 0, up.stdout + up.stderr

        def serves_b() -> bool:
            status, body = gw.get("/v1/models")
            servers = {s["name"]: s["state"] for m in json.loads(body)["data"] for s in m["servers"]}
            return status == 200 and servers.get("b") == "up"

        wait_until(serves_b, timeout=30, interval=0.1, what="b admitted")
        with (
            openai.OpenAI(base_url=gw.url, api_key="none", max_retries=0) as client,
            concurrent.futures.ThreadPoolExecutor(8) as pool,
        ):
            answers = list(
                pool.map(
                    lambda _: client.completions.create(
                        model="sim-7b", prompt="p", max_tokens=30, extra_body={"ignore_eos": True}
                    ),
                    range(32),
                )
            )
        assert len(answers) == 32
        served = requests_by_server(gw)
        assert served["b"] > 0 and served["a"] > 0, served

        # `drain a` while serving: the gateway stops sending to it, parks it, and drain returns
        drained = run("drain", "a", "--keep", "--fleet", str(fleet), "--timeout", "60", timeout=120)
        assert drained.returncode == 0, drained.stdout + drained.stderr
        before = requests_by_server(gw)
        with openai.OpenAI(base_url=gw.url, api_key="none", max_retries=0) as client:
            for _ in range(8):
                client.completions.create(model="sim-7b", prompt="p", max_tokens=3)
        after = requests_by_server(gw)
        assert after["a"] == before["a"] and after["b"] == before["b"] + 8, (before, after)
        rc, err = gw.stop()
        assert rc == 0 and "b: admitted" in err and "a: drained" in err, err
    finally:
        if gw is not None and gw.proc.poll() is None:
            gw.proc.kill()
        run("down", "--fleet", str(fleet), timeout=120)
