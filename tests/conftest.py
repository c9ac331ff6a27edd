"""Shared test helpers. Append small helpers here; keep them generic."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PYTHON = sys.executable


def free_port() -> int:
    """A TCP port that was free a moment ago on 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(
    predicate: Callable[[], bool], timeout: float = 10.0, interval: float = 0.01, what: str = "condition"
) -> None:
    """Poll ``predicate`` until it is true; fail the test with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


async def async_wait_until(
    predicate: Callable[[], Awaitable[bool]], timeout: float = 10.0, interval: float = 0.01, what: str = "condition"
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await predicate():
            return
        await asyncio.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """Render a failure with the garbage collector paused. CPython 3.11 before 3.11.8 (gh-106905)
    raises "SystemError: AST constructor recursion depth mismatch" when a finalizer run by the GC
    (an un-awaited asyncio task logging its exception: the traceback module parses source) calls
    ast.parse while pytest is parsing a test's source to show the failure -- an INTERNALERROR that
    ends the whole session and hides which test failed."""
    import gc

    enabled = gc.isenabled()
    gc.disable()
    try:
        return (yield)
    finally:
        if enabled:
            gc.enable()


@pytest.fixture
def port() -> int:
    return free_port()


# --- real OpenSSH server on loopback (tests/sshd.py) -------------------------------------------


@pytest.fixture(scope="session")
def sshd_server(tmp_path_factory: pytest.TempPathFactory):
    """A real sshd on 127.0.0.1 (a free port) for the whole session; when sshd is not installed
    (scripts/ci-sshd-setup.sh installs it) the SSH tests fail, unless SERVEFLEET_SKIP_SSH=1."""
    from sshd import SSHServer, require, sshd_unavailable_reason

    require(sshd_unavailable_reason())
    server = SSHServer(tmp_path_factory.mktemp("sshd")).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def slurm(tmp_path_factory: pytest.TempPathFactory):
    """A real one-node Slurm (tests/slurm_rig.py) for the whole session; fails with the command
    that installs it when it is missing, skipped only with SERVEFLEET_SKIP_SLURM=1."""
    from slurm_rig import SKIP_ENV, SlurmCluster, slurm_unavailable_reason

    if os.environ.get(SKIP_ENV) == "1":
        pytest.skip(f"{SKIP_ENV}=1")
    reason = slurm_unavailable_reason()
    if reason:
        pytest.fail(reason, pytrace=False)
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm"))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


# --- the simulated engine as a real subprocess (servefleet.sim) ---------------------------------


# The sim's timing for tests that measure no speed: a server ready at once, answering at once
# (INSTANT_SIM) or one millisecond per decode step (FAST_SIM).
INSTANT_SIM = (
    "--load-time",
    "0",
    "--decode-ms",
    "0",
    "--decode-ms-per-running",
    "0",
    "--prefill-ms-per-1k-tokens",
    "0",
)
FAST_SIM = ("--load-time", "0", "--decode-ms", "1", "--decode-ms-per-running", "0", "--prefill-ms-per-1k-tokens", "0")


class SimProcess:
    """``python -m servefleet.sim`` on a free loopback port, its stdout+stderr in ``log_path``.

    ``start()`` returns at once (start several, then wait on each); ``wait_ready()`` polls /health
    with a deadline and fails with the log if the process dies first."""

    def __init__(self, *args: str, log_path: Path, port: int | None = None) -> None:
        self.port = free_port() if port is None else port
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self.argv = [PYTHON, "-m", "servefleet.sim", "--port", str(self.port), *args]
        self.proc = None

    def start(self) -> SimProcess:
        import subprocess

        with open(self.log_path, "wb") as log:
            # its own process group, as servefleet launches servers: stop() takes the children too
            self.proc = subprocess.Popen(
                self.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
            )
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def health(self) -> int | None:
        import urllib.error
        import urllib.request

        try:
            with urllib.request.urlopen(self.url + "/health", timeout=2) as resp:
                return resp.status
        except urllib.error.HTTPError as exc:
            return exc.code
        except OSError:
            return None

    def wait_ready(self, timeout: float = 60.0) -> SimProcess:
        def ready() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"sim exited with {self.proc.returncode} before ready:\n{self.log()[-3000:]}")
            return self.health() == 200

        wait_until(ready, timeout=timeout, interval=0.05, what=f"sim on {self.url} to be ready")
        return self

    def wait_exit(self, timeout: float = 60.0) -> int:
        import subprocess

        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"sim still running after {timeout}s:\n{self.log()[-3000:]}") from None

    def stop(self) -> None:
        """SIGKILL the whole group: children (``--children``) outlive a killed or crashed sim otherwise."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)


@pytest.fixture
async def fleets():
    """Track every Fleet a test opens (``fleets(Fleet.load(...))``): each is brought down and
    closed afterwards, whatever happened."""
    from servefleet.fleet import Fleet

    opened: list[Fleet] = []

    def track(fleet: Fleet) -> Fleet:
        opened.append(fleet)
        return fleet

    yield track
    for fleet in opened:
        try:
            await fleet.down(grace_s=2)
        except Exception:
            pass
        await fleet.close()


# --- a real `transformers serve` on a tiny model built here (shared by the engine tests) ---------


@pytest.fixture(scope="module")
def transformers_serve(tmp_path_factory: pytest.TempPathFactory):
    """``(base_url, model_dir)`` of a real ``transformers serve`` on the CPU, started through the
    engine profile's own argv and env, stopped (its whole process group) after the module."""
    import os
    import signal
    import subprocess
    import urllib.error
    import urllib.request

    from servefleet.engines.base import LaunchSpec
    from servefleet.engines.transformers import TransformersEngine
    from servefleet.modelgen import build_tiny_model, spec_from_preset

    folder = tmp_path_factory.mktemp("transformers-serve")
    model = folder / "tiny"
    build_tiny_model(model, spec_from_preset("tiny", seed=11))
    port = free_port()
    engine = TransformersEngine()
    spec = LaunchSpec(model=str(model), port=port, extra_args=("--device", "cpu"), python=sys.executable)
    env = {**os.environ, **engine.build_env(spec), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    log = folder / "serve.log"
    with log.open("wb") as fh:
        server = subprocess.Popen(
            engine.build_argv(spec), stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        if server.poll() is not None:
            raise AssertionError(f"transformers serve exited with {server.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as resp:
                return resp.status == 200
        except (urllib.error.HTTPError, OSError):
            return False

    try:
        wait_until(ready, timeout=600, interval=0.5, what="transformers serve /health")
        yield url, model
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


# ---- object storage: moto's S3 server on loopback (the real protocol), for generate and plan --check ----
S3_SECRET = "servefleet-test-secret-key"  # tests assert it is never written anywhere


@pytest.fixture
def moto_url():
    pytest.importorskip("s3fs")
    moto_server = pytest.importorskip("moto.server")
    port = free_port()
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


def s3_env(endpoint: str) -> dict[str, str]:
    """The environment of a CLI subprocess that talks to ``endpoint`` (and to no real AWS account)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY=S3_SECRET,
        AWS_DEFAULT_REGION="us-east-1",
        AWS_ENDPOINT_URL=endpoint,
    )
    return env


def s3fs_for(endpoint: str):
    """A client of ``endpoint`` for the test itself (no instance cache: every moto server is new)."""
    import s3fs

    return s3fs.S3FileSystem(
        key="testing",
        secret=S3_SECRET,
        endpoint_url=endpoint,
        client_kwargs={"region_name": "us-east-1"},
        skip_instance_cache=True,
        use_listings_cache=False,
    )
