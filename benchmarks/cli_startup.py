"""Start-up time of the CLI: each command from a fresh interpreter, side by side with `python -c pass`.

Cases (each a fresh process, as a user or a script sees it):

  python -c pass             the named baseline: the interpreter alone
  import typer               what the CLI framework costs by itself (informational)
  servefleet --help          the command list
  --help, TYPER_USE_RICH=0   the same in typer's plain (click) format: what rich's help rendering costs
  diagnose LOG --json        a small real log (tests/fixtures/logs/vllm_success.log)
  wait (to first probe)      `servefleet wait --url http://127.0.0.1:PORT --json`: from spawn to the first
                             HTTP request a local stub server receives (the process is then stopped)
  status --json (no fleet)   `status --fleet MISSING.toml --json`: the fleet layer's import cost up to its
                             first error (informational)

The runs are interleaved (one of each case per round), so a load spike hits every case alike; the table
gives min and median of the rounds and each case's excess over the baseline. `--src` measures another
source tree; `--before-src` measures a second one in the same rounds, side by side (e.g. main before the change).

Run:  git archive 962b232 src | tar -x -C /tmp/before    # main before the lazy CLI
      .venv/bin/python benchmarks/cli_startup.py --before-src /tmp/before/src [--runs 15] [--label LABEL]
Writes benchmarks/results/cli_startup.json and .md (cli_startup-LABEL.* with --label).
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
LOG = ROOT / "tests" / "fixtures" / "logs" / "vllm_success.log"
RESULTS = ROOT / "benchmarks" / "results"


class _FirstProbe(http.server.BaseHTTPRequestHandler):
    """Answers every GET with 503 (a server still loading) and records when the first one came."""

    first: threading.Event  # set per server

    def do_GET(self) -> None:  # http.server's name
        self.server.first_at = time.perf_counter()  # type: ignore[attr-defined]  # attributes added to this HTTPServer instance
        self.server.first.set()  # type: ignore[attr-defined]  # attributes added to this HTTPServer instance
        self.send_response(503)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def _env(src: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(src), "NO_COLOR": "1", "COLUMNS": "120"}


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "servefleet.cli.main", *args]


CPU: dict[
    str, list[float]
] = {}  # case -> the child's user+system CPU seconds per run (less load-bound than wall time)


def time_command(argv: list[str], env: dict[str, str], expect_rc: set[int], cpu_key: str = "") -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    proc = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=60)
    elapsed = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode not in expect_rc:
        raise SystemExit(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.decode()[-500:]}")
    if cpu_key:
        CPU.setdefault(cpu_key, []).append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return elapsed


def time_wait_first_probe(env: dict[str, str]) -> float:
    """Spawn `servefleet wait` against a stub server; seconds from spawn to its first request."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _FirstProbe)
    server.first = threading.Event()  # type: ignore[attr-defined]  # attributes added to this HTTPServer instance
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        started = time.perf_counter()
        proc = subprocess.Popen(
            _cli("wait", "--url", url, "--timeout", "30", "--no-smoke", "--json"),
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            if not server.first.wait(30):  # type: ignore[attr-defined]  # attributes added to this HTTPServer instance
                raise SystemExit(f"servefleet wait sent no request within 30 s (exit {proc.poll()})")
            return server.first_at - started  # type: ignore[attr-defined]  # attributes added to this HTTPServer instance
        finally:
            proc.terminate()
            proc.wait(10)
    finally:
        server.shutdown()
        server.server_close()


def cases(src: Path, tree: str = "after") -> dict[str, Any]:
    env = _env(src)
    return {
        "python -c pass": lambda: time_command([sys.executable, "-c", "pass"], env, {0}, f"{tree}/python -c pass"),
        "import typer": lambda: time_command([sys.executable, "-c", "import typer"], env, {0}, f"{tree}/import typer"),
        "servefleet --help": lambda: time_command(_cli("--help"), env, {0}, f"{tree}/servefleet --help"),
        "--help, TYPER_USE_RICH=0": lambda: time_command(
            _cli("--help"), {**env, "TYPER_USE_RICH": "0"}, {0}, f"{tree}/--help, TYPER_USE_RICH=0"
        ),
        "diagnose LOG --json": lambda: time_command(
            _cli("diagnose", str(LOG), "--json"), env, {0}, f"{tree}/diagnose LOG --json"
        ),
        "wait (to first probe)": lambda: time_wait_first_probe(env),
        "status --json (no fleet)": lambda: time_command(
            _cli("status", "--fleet", "/nonexistent/fleet.toml", "--json"),
            env,
            {1, 3},
            f"{tree}/status --json (no fleet)",
        ),
    }


def summary(times: list[float], base: list[float]) -> dict[str, Any]:
    return {
        "min_ms": round(min(times) * 1000, 1),
        "median_ms": round(statistics.median(times) * 1000, 1),
        "min_over_baseline_ms": round((min(times) - min(base)) * 1000, 1),
        "runs_ms": [round(t * 1000, 1) for t in times],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15, help="rounds (each case of each tree once per round)")
    parser.add_argument("--src", type=Path, default=ROOT / "src", help="source tree to measure (default: this one)")
    parser.add_argument(
        "--before-src", type=Path, help="a second tree measured in the same rounds (e.g. main before the change)"
    )
    parser.add_argument(
        "--label", default="", help="results go to cli_startup-LABEL.{json,md} (default: cli_startup.{json,md})"
    )
    args = parser.parse_args()

    trees = {"after": args.src.resolve()}
    if args.before_src:
        trees = {"before": args.before_src.resolve(), **trees}
    todo = {
        (tree, name): run
        for tree, src in trees.items()
        for name, run in cases(src, tree).items()
        if not (tree == "before" and name in ("python -c pass", "import typer"))
    }  # the baselines once
    for run in todo.values():  # warm the file cache and .pyc files; not counted
        run()
    CPU.clear()
    samples: dict[tuple[str, str], list[float]] = {key: [] for key in todo}
    for _ in range(args.runs):
        for key, run in todo.items():
            samples[key].append(run())

    base = samples[("after", "python -c pass")]
    names = list(cases(args.src))  # the order of the table
    rows = []
    for name in names:
        row: dict[str, Any] = {"case": name}
        for tree in trees:
            if (tree, name) in samples:
                row[tree] = summary(samples[(tree, name)], base)
                cpu = CPU.get(f"{tree}/{name}")
                if cpu:
                    row[tree]["cpu_min_ms"] = round(min(cpu) * 1000, 1)
        rows.append(row)
    result = {
        "benchmark": "cli_startup",
        "label": args.label,
        "trees": {tree: str(src) for tree, src in trees.items()},
        "runs": args.runs,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "loadavg_at_end": os.getloadavg(),
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "cases": rows,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    stem = f"cli_startup-{args.label}" if args.label else "cli_startup"
    (RESULTS / f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n")
    head = " | ".join(f"{tree} min ms | {tree} median ms | {tree} CPU min ms" for tree in trees)
    lines = [
        f"# CLI start-up: {args.runs} interleaved rounds, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f} at the end",
        "",
        "Trees: " + ", ".join(f"{tree} = {src}" for tree, src in trees.items()),
        "Wall time from spawn to exit (wait: to its first HTTP request); CPU: the child's user+system time.",
        "",
        f"| case | {head} |",
        "| --- |" + " ---: | ---: | ---: |" * len(trees),
    ]
    for row in rows:
        cells = []
        for tree in trees:
            got = row.get(tree) or row.get("after")  # the baselines are measured once
            cells += [str(got["min_ms"]), str(got["median_ms"]), str(got.get("cpu_min_ms", "-"))]
        lines.append(f"| {row['case']} | " + " | ".join(cells) + " |")
    table = "\n".join(lines) + "\n"
    (RESULTS / f"{stem}.md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()
