"""Running the commands of the H200 run: every command is logged (argv, exit status, seconds) so
RESULTS.md can quote exactly what ran, and its output is kept under results/cmd/.

Standard library only (see h200_layout). The clock starts when the driver starts; ``say`` prefixes
each line with it, so the device reply's output tail shows where the time went.
"""

from __future__ import annotations

import http.client
import json
import re
import shlex
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Runner", "Result", "wait_for_line", "answers_health"]

T0 = time.monotonic()


@dataclass
class Result:
    argv: list[str]
    rc: int | None
    seconds: float
    stdout: str
    stderr_tail: str
    timed_out: bool = False

    def json(self) -> object | None:
        """The command's stdout as JSON (servefleet's --json), or None when it is not JSON."""
        text = self.stdout.strip()
        if not text:
            return None
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            start = text.find("{")  # tolerate a warning printed before the document
            try:
                return json.loads(text[start:]) if start >= 0 else None
            except json.JSONDecodeError:
                return None


class Runner:
    """Runs commands with an environment and records them in results/commands.jsonl."""

    def __init__(self, results: Path, env: dict[str, str], cwd: Path) -> None:
        self.results = results
        self.env = env
        self.cwd = cwd
        (results / "cmd").mkdir(parents=True, exist_ok=True)
        self._log = open(results / "driver.log", "a", buffering=1)

    def say(self, message: str) -> None:
        line = f"[{time.monotonic() - T0:7.1f}s] {message}"
        print(line, flush=True)
        self._log.write(line + "\n")

    def _record(self, name: str, result: Result) -> None:
        entry = {
            "name": name,
            "argv": shlex.join(result.argv),
            "rc": result.rc,
            "seconds": round(result.seconds, 2),
            "timed_out": result.timed_out,
        }
        with open(self.results / "commands.jsonl", "a") as fh:
            fh.write(json.dumps(entry) + "\n")

    def run(self, name: str, argv: list[str], timeout: float = 600.0, quiet: bool = False) -> Result:
        """Run to completion; stdout kept whole (JSON), stderr kept in results/cmd/NAME.err."""
        safe = re.sub(r"[^A-Za-z0-9._-]", "_", name)
        start = time.monotonic()
        if not quiet:
            self.say(f"$ {shlex.join(argv)}")
        try:
            proc = subprocess.run(
                argv,
                env=self.env,
                cwd=self.cwd,
                capture_output=True,
                text=True,
                timeout=timeout,
                stdin=subprocess.DEVNULL,
            )
            result = Result(argv, proc.returncode, time.monotonic() - start, proc.stdout, proc.stderr[-4000:])
            err = proc.stderr
        except subprocess.TimeoutExpired as exc:
            out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
            err = exc.stderr.decode() if isinstance(exc.stderr, bytes) else (exc.stderr or "")
            result = Result(argv, None, time.monotonic() - start, out, err[-4000:], timed_out=True)
        except OSError as exc:  # no such program (e.g. nvidia-smi on a CPU machine)
            err = f"{type(exc).__name__}: {exc}"
            result = Result(argv, 127, time.monotonic() - start, "", err)
        (self.results / "cmd" / f"{safe}.out").write_text(result.stdout)
        (self.results / "cmd" / f"{safe}.err").write_text(err)
        self._record(name, result)
        if not quiet:
            status = "timed out" if result.timed_out else f"rc={result.rc}"
            self.say(f"  {name}: {status} in {result.seconds:.1f} s")
        return result

    def start(self, name: str, argv: list[str], quiet: bool = False) -> Started:
        """Start without waiting (output to results/cmd/NAME.out/.err); ``Started.finish`` collects it."""
        safe = re.sub(r"[^A-Za-z0-9._-]", "_", name)
        if not quiet:
            self.say(f"$ {shlex.join(argv)} &")
        out = open(self.results / "cmd" / f"{safe}.out", "w")
        err = open(self.results / "cmd" / f"{safe}.err", "w")
        proc = subprocess.Popen(argv, env=self.env, cwd=self.cwd, stdout=out, stderr=err, stdin=subprocess.DEVNULL)
        return Started(
            self,
            name,
            argv,
            proc,
            time.monotonic(),
            self.results / "cmd" / f"{safe}.out",
            self.results / "cmd" / f"{safe}.err",
            (out, err),
        )


@dataclass
class Started:
    runner: Runner
    name: str
    argv: list[str]
    proc: subprocess.Popen
    t0: float
    out_path: Path
    err_path: Path
    files: tuple

    def finish(self, timeout: float, quiet: bool = False) -> Result:
        timed_out = False
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            self.proc.kill()
            self.proc.wait()
        for fh in self.files:
            fh.close()
        result = Result(
            self.argv,
            None if timed_out else self.proc.returncode,
            time.monotonic() - self.t0,
            self.out_path.read_text(),
            self.err_path.read_text()[-4000:],
            timed_out,
        )
        self.runner._record(self.name, result)
        if not quiet:
            status = "timed out" if timed_out else f"rc={result.rc}"
            self.runner.say(f"  {self.name}: {status} in {result.seconds:.1f} s")
        return result


def wait_for_line(
    path: Path, pattern: str, timeout: float, alive: subprocess.Popen | None = None, poll: float = 0.2
) -> str | None:
    """The first line of ``path`` matching ``pattern`` within ``timeout`` s (None: none came, or
    ``alive`` exited first). Polls the file: these logs are written by other processes."""
    regex = re.compile(pattern)
    deadline = time.monotonic() + timeout
    offset = 0
    while time.monotonic() < deadline:
        if path.exists():
            with open(path, "rb") as fh:
                fh.seek(offset)
                chunk = fh.read()
            last_nl = chunk.rfind(b"\n")
            if last_nl >= 0:
                for line in chunk[: last_nl + 1].decode("utf-8", "replace").splitlines():
                    if regex.search(line):
                        return line
                offset += last_nl + 1
        if alive is not None and alive.poll() is not None:
            return None
        time.sleep(poll)
    return None


def answers_health(url: str, timeout: float = 2.0) -> bool:
    """Whether the server at ``url`` answers ``GET /health`` with 200 (a server going down or coming
    up may refuse, reset or cut the answer short: each is a no)."""
    try:
        with urllib.request.urlopen(url + "/health", timeout=timeout) as resp:
            return resp.status == 200
    except (OSError, http.client.HTTPException):
        return False
