"""Helpers for the verify tests (no tests here): a toy engine profile and a toy HTTP server.

The toy profile keeps the pure tests independent of the real engine profiles' evolving tables;
the toy server is a real process (stdlib only) that prints a start-up log and serves /health,
/v1/models and /v1/completions, with the failure behaviours the waiter must tell apart.
"""

from __future__ import annotations

import re
import sys
import textwrap
from pathlib import Path

from servefleet.capacity import Capacity
from servefleet.catalog import Category
from servefleet.engines.base import EngineProfile, Probe, Signature

__all__ = ["ToyEngine", "OtherToyEngine", "TOY_SERVER", "toy_server_argv"]


class ToyEngine(EngineProfile):
    name = "toy"
    probe = Probe(("/health",), timeout_s=1.0)
    signatures = (
        Signature.benign(r"^WARNING\b"),
        Signature.benign(r"Ignore import error when loading"),
        Signature.ready(r"ready to roll"),
        Signature.wrapper(r"Rank \d+ scheduler is dead"),
        Signature.wrapper(r"Engine core initialization failed\. See root cause above"),
        Signature.fatal(r"CUDA out of memory|Not enough memory", Category.GPU_OOM, "lower --mem-fraction-static"),
        Signature.fatal(r"Address already in use", Category.PORT_IN_USE),
        Signature.fatal(r"No module named", Category.IMPORT_ERROR),
        Signature.fatal(r"is not a local folder and is not a valid model identifier", Category.MODEL_NOT_FOUND),
        Signature.progress(r"Load weight begin", "loading weights"),
        Signature.progress(r"Capture cuda graph", "capturing CUDA graphs"),
    )
    detect = (re.compile(r"toy-engine v\d"),)

    def capacity_from_line(self, line: str) -> Capacity | None:
        m = re.search(r"max_total_num_tokens=(\d+), max_running_requests=(\d+)", line)
        if m:
            return Capacity(kv_cache_tokens=int(m.group(1)), max_running_requests=int(m.group(2)))
        return None


class OtherToyEngine(EngineProfile):
    """A second engine, to test detection."""

    name = "othertoy"
    signatures = (Signature.fatal(r"kaboom", Category.OTHER),)
    detect = (re.compile(r"othertoy starting"),)


# A stdlib server with scripted behaviours. Lines are flushed at once (like `python -u`).
TOY_SERVER = textwrap.dedent(
    r"""
    import http.server, json, os, sys, time, threading

    mode, port = sys.argv[1], int(sys.argv[2])
    delay = float(os.environ.get("TOY_DELAY", "0.3"))

    def say(line):
        sys.stdout.write(line + "\n"); sys.stdout.flush()

    say("toy-engine v1 starting, pid %d" % os.getpid())
    say("Load weight begin. avail mem=70.00 GB")
    if mode == "hang":
        time.sleep(3600)
    if mode == "silent_kill":
        time.sleep(3600)
    time.sleep(delay)
    if mode in ("fatal_exit", "exit0_after_fatal"):
        say("Traceback (most recent call last):")
        say('  File "model_runner.py", line 12, in init_memory_pool')
        say("RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.")
        say("[TP1] RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.")
        say("Rank 0 scheduler is dead. Please check if there are relevant logs.")
        sys.exit(0 if mode == "exit0_after_fatal" else 1)
    if mode == "fatal_hang":
        say("RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.")
        time.sleep(3600)
    if mode == "exit_plain":
        say("ValueError: something nobody recognises")
        sys.exit(3)
    say("max_total_num_tokens=4096, max_running_requests=8, context_len=2048")

    class H(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass
        def _send(self, code, body):
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        def do_GET(self):
            if self.path == "/health":
                self._send(200, {})
            elif self.path == "/v1/models":
                self._send(200, {"object": "list", "data": [{"id": "toy-model"}]})
            else:
                self._send(404, {})
        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if mode == "die_on_first_request":
                say("RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB")
                os._exit(1)
            if mode == "smoke_500":
                self._send(500, {"error": "head size 80 not supported"})
                return
            self._send(200, {"choices": [{"text": "x"}], "usage": {"completion_tokens": 1}})

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", port), H)
    say("Uvicorn running on http://127.0.0.1:%d" % port)
    say("The server is fired up and ready to roll!")
    srv.serve_forever()
    """
)


def toy_server_argv(tmp_path: Path, mode: str, port: int) -> list[str]:
    script = tmp_path / "toy_server.py"
    if not script.exists():
        script.write_text(TOY_SERVER)
    return [sys.executable, "-u", str(script), mode, str(port)]
