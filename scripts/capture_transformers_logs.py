#!/usr/bin/env python3
"""Regenerate tests/fixtures/logs/transformers_*.log from real `transformers serve` runs.

Each case launches the real server (the argv servefleet's `transformers` profile builds) on the
tiny model, provokes one outcome — ready, missing model, port in use, bad argument, ... — and keeps
the whole output byte for byte. `transformers_cases.json` records, per log, the argv, the exit code
and the verdict servefleet must reach (tests/test_transformers_engine.py checks it), so when a new
transformers version changes its words, rerunning this script shows exactly what moved.

    .venv/bin/python scripts/capture_transformers_logs.py            # every case, two at a time
    .venv/bin/python scripts/capture_transformers_logs.py ready port_in_use

Runs offline (HF_HUB_OFFLINE=1) and on 127.0.0.1 only; a few minutes on 2 cores (each case imports torch).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))

from servefleet.engines.base import LaunchSpec  # noqa: E402 - after the sys.path.insert above
from servefleet.engines.transformers import TransformersEngine  # noqa: E402 - after the sys.path.insert above
from servefleet.modelgen import build_tiny_model, spec_from_preset  # noqa: E402 - after the sys.path.insert above

OUT = REPO / "tests" / "fixtures" / "logs"
WORK = Path(tempfile.gettempdir()) / "servefleet-capture-transformers"
MODEL = WORK / "tiny"
START_TIMEOUT_S = 180


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(method: str, url: str, body: dict | None = None, timeout: float = 60) -> tuple[int, str]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
        return 0, str(exc)


@dataclass
class Case:
    name: str
    state: str  # the verdict diagnose must reach on the whole log
    category: str | None
    evidence: str | None  # a substring of the evidence line
    model: Callable[[], str] = lambda: str(MODEL)
    args: tuple[str, ...] = ("--device", "cpu")
    env: dict[str, str] = field(default_factory=dict)
    action: str = "exit"  # exit: wait for it to end; ready: serve, request, stop; kill: SIGKILL while loading
    hold_port: bool = False  # another process listens on the port first
    note: str = ""


def _variant(name: str, edit: Callable[[Path], None]) -> Callable[[], str]:
    def make() -> str:
        dest = WORK / name
        if dest.exists():
            shutil.rmtree(dest)
        shutil.copytree(MODEL, dest)
        edit(dest)
        return str(dest)

    return make


def _unknown_type(folder: Path) -> None:
    config = json.loads((folder / "config.json").read_text())
    config.update(model_type="fancynet", architectures=["FancyNetForCausalLM"])
    (folder / "config.json").write_text(json.dumps(config, indent=2))


CASES = [
    Case(
        "ready",
        "ready",
        None,
        "Uvicorn running on",
        action="ready",
        note="ready; one completion; GET /v1/models answers 500 (it scans the HF cache, absent here); SIGTERM",
    ),
    Case(
        "model_not_found",
        "failed",
        "model_not_found",
        "Repo id must be in the form",
        model=lambda: str(WORK / "does-not-exist"),
        note="a local folder that does not exist",
    ),
    Case(
        "model_not_cached_offline",
        "failed",
        "model_not_found",
        "Cannot find the requested files in the disk cache",
        model=lambda: "servefleet-tests/not-a-real-model",
        note="a repo id, offline, not in the cache",
    ),
    Case(
        "no_weights",
        "failed",
        "model_not_found",
        "no file named model.safetensors",
        model=_variant("no-weights", lambda d: (d / "model.safetensors").unlink()),
        note="folder without weights",
    ),
    Case(
        "no_tokenizer",
        "failed",
        "model_not_found",
        "Unrecognized processing class",
        model=_variant("no-tokenizer", lambda d: (d / "tokenizer.json").unlink()),
        note="folder without tokenizer.json",
    ),
    Case(
        "unsupported_model",
        "failed",
        "unsupported_model",
        "does not recognize this architecture",
        model=_variant("unknown-type", _unknown_type),
        note="config.json with an unknown model_type",
    ),
    Case(
        "port_in_use",
        "failed",
        "port_in_use",
        "address already in use",
        hold_port=True,
        note="another process listens on the port: the model loads, startup completes, then the bind fails",
    ),
    Case("bad_argument", "failed", "config_error", "No such option", args=("--device", "cpu", "--bogus-flag")),
    Case("bad_value", "failed", "config_error", "Unsupported dtype", args=("--device", "cpu", "--dtype", "float99")),
    Case(
        "no_cuda",
        "failed",
        "cuda_driver",
        "Torch not compiled with CUDA enabled",
        args=("--device", "cuda"),
        note="--device cuda with a CPU-only torch",
    ),
    Case(
        "killed",
        "loading",
        None,
        None,
        action="kill",
        note="SIGKILL while loading: the log just stops; the exit status (137) is the evidence",
    ),
]


def run_case(case: Case) -> dict:
    port = free_port()
    engine = TransformersEngine()
    spec = LaunchSpec(model=case.model(), port=port, extra_args=case.args, python=sys.executable)
    argv = engine.build_argv(spec)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", **engine.build_env(spec), **case.env}
    log_path = OUT / f"transformers_{case.name}.log"
    holder = None
    if case.hold_port:
        holder = socket.socket()
        holder.bind(("127.0.0.1", port))
        holder.listen()
    started = time.monotonic()
    ready_s = None
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=WORK,
            start_new_session=True,
        )
        try:
            if case.action == "ready":
                base = f"http://127.0.0.1:{port}"
                while proc.poll() is None and time.monotonic() - started < START_TIMEOUT_S:
                    if http("GET", base + "/health", timeout=2)[0] == 200:
                        ready_s = round(time.monotonic() - started, 2)
                        break
                    time.sleep(0.1)
                if ready_s is None:
                    raise RuntimeError(f"{case.name}: not ready within {START_TIMEOUT_S}s; see {log_path}")
                http("POST", base + "/v1/completions", {"model": spec.model, "prompt": "Hello", "max_tokens": 4})
                http("GET", base + "/v1/models")
                proc.send_signal(signal.SIGTERM)
            elif case.action == "kill":
                while proc.poll() is None and b"Loading" not in log_path.read_bytes():
                    time.sleep(0.05)
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=START_TIMEOUT_S)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            if holder is not None:
                holder.close()
    code = proc.returncode if proc.returncode >= 0 else 128 - proc.returncode  # -9 -> 137, as a shell says
    shown = [a.replace(str(WORK), "$WORK").replace(sys.executable, "python") for a in argv]
    print(
        f"{case.name:26s} exit {code:3d}  {time.monotonic() - started:5.1f}s"
        + (f"  ready after {ready_s}s" if ready_s else "")
    )
    return {
        "argv": shown,
        "exit_code": code,
        "state": case.state,
        "category": case.category,
        "evidence_substring": case.evidence,
        "engine": "transformers",
        "ready_after_s": ready_s,
        "note": case.note,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("cases", nargs="*", help=f"cases to run (default: all): {', '.join(c.name for c in CASES)}")
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    unknown = set(args.cases) - {c.name for c in CASES}
    if unknown:
        parser.error(f"unknown case(s): {', '.join(sorted(unknown))}")
    chosen = [c for c in CASES if not args.cases or c.name in args.cases]

    WORK.mkdir(parents=True, exist_ok=True)
    OUT.mkdir(parents=True, exist_ok=True)
    build_tiny_model(MODEL, spec_from_preset("tiny"), force=True)
    index_path = OUT / "transformers_cases.json"
    index = json.loads(index_path.read_text()) if index_path.exists() else {}
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        for case, result in zip(chosen, pool.map(run_case, chosen), strict=True):
            index[f"transformers_{case.name}.log"] = result
    index = dict(sorted(index.items()))
    index_path.write_text(json.dumps(index, indent=2) + "\n")
    print(f"wrote {len(chosen)} logs and {index_path.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
