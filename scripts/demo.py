#!/usr/bin/env python3
"""The main job on the embedded default, end to end (what `make demo` runs). No GPU, no download.

 1. build the tiny model locally              servefleet model tiny demo-out/tiny-llama
 2. launch two servers, two configurations    servefleet up examples/demo.toml
    (cpu-a: transformers' default, one request at a time; cpu-b: continuous batching)
 3. the status table, capacity included       servefleet status --fleet examples/demo.toml
 4. benchmark both in the job's mode          servefleet bench --fleet examples/demo.toml -c 1,4,16 ...
 5. compare them (table, PNG plots)           servefleet compare RUN-cpu-a.json RUN-cpu-b.json
 6. plan a stated job from those runs         servefleet plan --bench ... --prompts N ...
 7. generate N prompts over both servers      servefleet generate --fleet ... --input ... --output ...
    cpu-b is SIGKILLed mid-job and restarted by the fleet; the run is interrupted (SIGINT)
 8. resume it: the same command again         servefleet generate ... (skips what is committed)
 9. every prompt answered exactly once        (the Parquet shards, read with pyarrow)
10. the plan against the run                  servefleet plan --check DEST --bench ...
11. the job's report, one HTML file           servefleet report demo-out/job --out demo-out/report.html
12. stop everything                           servefleet down --fleet examples/demo.toml

Each step is the real command (a subprocess of the venv's `servefleet`), printed before it runs, so
the demo doubles as a tutorial; where the demo reads a result it asks for `--json`. The fleet is
stopped whatever happens (a failure or Ctrl-C included). `--out DIR --ports A,B` run it elsewhere
(the test does): the fleet file is then a copy of examples/demo.toml with those paths and ports.
DIR/demo-summary.json records what each step found.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
EXAMPLE_FLEET = REPO / "examples" / "demo.toml"
DEFAULT_OUT = REPO / "demo-out"
SERVEFLEET = str(Path(sys.executable).parent / "servefleet")
SERVERS = ("cpu-a", "cpu-b")
VICTIM = "cpu-b"  # the server killed mid-job: the faster one, so the job is still running when it is back
OUTPUT_TOKENS = 96  # max_tokens of the job's prompts (random weights rarely stop early)
# 64 requests a point: four waves at concurrency 16, so every point has a steady part to plan from
BENCH = [
    "-c",
    "1,4,16",
    "--requests",
    "64",
    "--input-len",
    "32",
    "--output-len",
    str(OUTPUT_TOKENS),
    "--api",
    "completions",
]


class DemoError(Exception):
    """A step did not show what it must; the message says which and what it saw."""


def say(text: str) -> None:
    print(f"\n\033[1m== {text}\033[0m" if sys.stdout.isatty() else f"\n== {text}", flush=True)


def note(text: str) -> None:
    print(f"   {text}", flush=True)


def short(arg: str) -> str:
    """Paths inside the repository, as a person would type them."""
    try:
        return str(Path(arg).relative_to(REPO)) if arg.startswith("/") else arg
    except ValueError:
        return arg


def shown(argv: list[str]) -> str:
    return shlex.join([".venv/bin/servefleet" if a == SERVEFLEET else short(a) for a in argv])


def servefleet(
    *args: str, check: bool = True, capture: bool = False, timeout: float = 900
) -> subprocess.CompletedProcess[str]:
    argv = [SERVEFLEET, *args]
    print(f"$ {shown(argv)}", flush=True)
    proc = subprocess.run(argv, cwd=REPO, text=True, capture_output=capture, timeout=timeout)
    if check and proc.returncode != 0:
        tail = (proc.stderr or "")[-2000:] if capture else ""
        raise DemoError(f"`{shown(argv)}` exited with {proc.returncode}\n{tail}")
    return proc


def servefleet_json(*args: str, check: bool = True, quiet: bool = False, timeout: float = 900) -> Any:
    argv = [SERVEFLEET, *args, "--json"]
    if not quiet:
        print(f"$ {shown(argv)}", flush=True)
    proc = subprocess.run(argv, cwd=REPO, text=True, capture_output=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise DemoError(f"`{shown(argv)}` exited with {proc.returncode}\n{proc.stderr[-2000:]}")
    try:
        return json.loads(proc.stdout)
    except json.JSONDecodeError:
        raise DemoError(
            f"`{shown(argv)}` printed no JSON (exit {proc.returncode}):\n{proc.stdout[-1000:]}\n{proc.stderr[-2000:]}"
        ) from None


# ---- the fleet file: examples/demo.toml, or a copy pointing elsewhere ------------------------------
def fleet_file(out: Path, ports: list[int] | None) -> Path:
    if out == DEFAULT_OUT and ports is None:
        return EXAMPLE_FLEET
    text = EXAMPLE_FLEET.read_text()
    subs = [
        (r'^state_dir = "[^"]*"', f"state_dir = {json.dumps(str(out / 'fleet'))}"),
        (r'^model = "[^"]*"', f"model = {json.dumps(str(out / 'tiny-llama'))}"),
    ]
    for default, port in zip((38401, 38402), ports or (38401, 38402), strict=True):
        subs.append((rf"^port = {default}\b", f"port = {port}"))
    for pattern, value in subs:
        text, n = re.subn(pattern, value, text, count=1, flags=re.M)
        if n != 1:
            raise DemoError(f"{EXAMPLE_FLEET}: no line matches {pattern!r} to point the demo elsewhere")
    out.mkdir(parents=True, exist_ok=True)
    path = out / "demo.toml"
    path.write_text(text)
    return path


# ---- the job's input ---------------------------------------------------------------------------------
WORDS = (
    "fleet server batch token cache prompt answer engine model queue shard job plan bench "
    "restart resume crash ready kernel memory block request stream"
).split()


def write_prompts(path: Path, n: int, seed: int = 15) -> list[str]:
    """``n`` prompts, a fifth of them chat messages; ids ``p00000``..."""
    rng = random.Random(seed)
    ids = []
    with path.open("w") as fh:
        for i in range(n):
            pid = f"p{i:05d}"
            text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 24)))
            record: dict[str, Any] = {"id": pid, "max_tokens": OUTPUT_TOKENS}
            if i % 5 == 4:
                record["messages"] = [{"role": "user", "content": text}]
            else:
                record["prompt"] = text
            fh.write(json.dumps(record) + "\n")
            ids.append(pid)
    return ids


def committed_rows(dest: Path) -> int:
    """Rows in committed shards, from the ledger entries (``ledger/*.json``: the ids each shard answers)."""
    rows = 0
    for entry in (dest / "ledger").glob("*.json"):
        try:
            rows += len(json.loads(entry.read_text()).get("ids", []))
        except (OSError, ValueError):
            continue  # being published right now: counted on the next look
    return rows


def wait_for(predicate, timeout_s: float, what: str, proc: subprocess.Popen | None = None, interval_s: float = 0.5):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            raise DemoError(f"generate exited with {proc.returncode} while waiting for {what}")
        time.sleep(interval_s)
    raise DemoError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def server_status(fleet: Path, name: str) -> dict[str, Any]:
    # status exits 1 while the server is down and 2 while it loads: the state is what is asked
    status = servefleet_json("status", "--fleet", str(fleet), name, quiet=True, check=False)
    return {s["name"]: s for s in status["servers"]}[name]


def kill_engine(pgid: int) -> str:
    """SIGKILL the engine process (the detach wrapper's child, as the OOM killer would pick it); the
    wrapper records the exit. The whole group when the child cannot be found."""
    try:
        import psutil

        children = psutil.Process(pgid).children()
        if children:
            children[0].send_signal(signal.SIGKILL)
            return f"pid {children[0].pid}"
    except Exception:
        pass
    os.killpg(pgid, signal.SIGKILL)
    return f"process group {pgid}"


# ---- the steps ------------------------------------------------------------------------------------------
class Demo:
    def __init__(self, out: Path, fleet: Path, prompts: int) -> None:
        self.out, self.fleet, self.prompts = out, fleet, prompts
        self.bench_dir, self.dest = out / "bench", out / "job"
        self.summary: dict[str, Any] = {"steps": {}, "files": {}}
        self.restart_s = 0.0
        self._t0 = time.monotonic()

    def timed(self, name: str, started: float) -> None:
        self.summary["steps"][name] = {"s": round(time.monotonic() - started, 1)}

    def fresh(self) -> None:
        """A new job each time: a destination left by an earlier demo would be resumed (nothing left to send)."""
        for folder in (self.dest, self.bench_dir, self.out / "plots"):
            if folder.exists():
                shutil.rmtree(folder)

    def model(self) -> None:
        say("1/12 build the tiny model (random weights, tokenizer trained here, nothing downloaded)")
        t = time.monotonic()
        built = servefleet_json("model", "tiny", str(self.out / "tiny-llama"), "--force")
        note(f"{built['arch']}, {built['parameters']:,} parameters, in {short(built['path'])}")
        self.timed("model", t)

    def up(self) -> None:
        say("2/12 launch the fleet: two `transformers serve` servers on the CPU, detached, verified ready")
        note(
            "cpu-a: transformers' default (one generate() at a time); cpu-b: --continuous-batching --cb-num-blocks 64"
        )
        t = time.monotonic()
        servefleet("up", str(self.fleet))
        self.timed("up", t)
        say("3/12 the status table (any terminal can ask: state lives in files); capacity from flags and config.json")
        servefleet("status", "--fleet", str(self.fleet))
        status = {s["name"]: s for s in servefleet_json("status", "--fleet", str(self.fleet), quiet=True)["servers"]}
        self.summary["capacity"] = {n: status[n]["capacity"] for n in SERVERS}

    def bench(self) -> dict[str, Path]:
        say("4/12 benchmark both, briefly, non-streaming (the job's mode)")
        t = time.monotonic()
        self.bench_dir.mkdir(parents=True, exist_ok=True)
        servefleet("bench", "--fleet", str(self.fleet), *BENCH, "--out", str(self.bench_dir / "run.json"))
        runs = {n: self.bench_dir / f"run-{n}.json" for n in SERVERS}
        missing = [str(p) for p in runs.values() if not p.exists()]
        if missing:
            raise DemoError(f"bench wrote no {', '.join(missing)}")
        self.timed("bench", t)
        say("5/12 compare the two configurations (cpu-a is the reference)")
        plots = self.out / "plots"
        servefleet("compare", *map(str, runs.values()), "--out-dir", str(plots), "--prefix", "compare")
        pngs = sorted(str(p) for p in plots.glob("compare*.png"))
        if not pngs:
            raise DemoError(f"compare wrote no PNG plot in {plots}")
        self.summary["compare"] = {"plots": pngs}
        self.summary["files"]["bench"] = [str(p) for p in runs.values()]
        self.summary["files"]["plots"] = pngs
        return runs

    def plan(self, runs: dict[str, Path]) -> None:
        say(f"6/12 plan the job: {self.prompts} prompts of up to {OUTPUT_TOKENS} tokens, on 1 or 2 servers")
        args = [a for n in SERVERS for a in ("--bench", str(runs[n]))]
        args += [
            "--prompts",
            str(self.prompts),
            "--output-tokens-mean",
            str(OUTPUT_TOKENS),
            "--gpus",
            "2,1",
            "--plot",
            str(self.out / "plots" / "plan.png"),
        ]
        servefleet("plan", *args)
        planned = servefleet_json("plan", *args, quiet=True)
        self.summary["plan"] = {"recommendation": planned["recommendation"]}
        if planned.get("plot"):
            self.summary["files"]["plots"].append(planned["plot"])

    def generate(self, runs: dict[str, Path]) -> None:
        input_path = self.out / "prompts.jsonl"
        ids = write_prompts(input_path, self.prompts)
        self.summary["files"]["input"] = str(input_path)
        self.summary["files"]["output"] = str(self.dest)
        argv = [
            SERVEFLEET,
            "generate",
            "--fleet",
            str(self.fleet),
            "--input",
            str(input_path),
            "--output",
            str(self.dest),
            *[a for n in SERVERS for a in ("--bench", str(runs[n]))],
            "--shard-rows",
            "20",
            "--shard-seconds",
            "2",
            "--hang-after",
            "30",
            "--json",
        ]
        say(
            f"7/12 generate {len(ids)} prompts over both servers; {VICTIM} is SIGKILLed mid-job, then the run is interrupted"
        )
        print(f"$ {shown(argv)}", flush=True)
        t = time.monotonic()
        self._interrupted_run(argv)
        self.summary["steps"]["generate_first"] = {"s": round(time.monotonic() - t, 1)}
        say("8/12 resume: the same command again (committed shards are skipped, nothing is asked twice)")
        print(f"$ {shown(argv)}", flush=True)
        t = time.monotonic()
        done = subprocess.run(argv, cwd=REPO, text=True, stdout=subprocess.PIPE, timeout=900)
        second = json.loads(done.stdout)
        self.timed("generate_resume", t)
        note(
            f"exit {done.returncode}, status {second['status']}: {second['done']} answered in this run, "
            f"{second['done_before']} were already committed; {second['output_tokens_per_s']:,.0f} output tok/s"
        )
        if done.returncode != 0 or second["status"] != "complete":
            raise DemoError(f"the resumed run ended {second['status']} (exit {done.returncode})")
        self.summary["resume"] = {
            "status": second["status"],
            "done": second["done"],
            "done_before": second["done_before"],
        }
        say("9/12 check the output: every prompt answered exactly once (pyarrow reads the Parquet shards)")
        self.summary["output"] = check_output(self.dest, ids)

    def _interrupted_run(self, argv: list[str]) -> dict[str, Any]:
        proc = subprocess.Popen(argv, cwd=REPO, text=True, stdout=subprocess.PIPE)
        try:
            kill_at = max(20, self.prompts // 8)
            wait_for(lambda: committed_rows(self.dest) >= kill_at, 300, f"{kill_at} committed rows", proc)
            before = server_status(self.fleet, VICTIM)
            killed = kill_engine(before["pid"])
            at_rows = committed_rows(self.dest)
            note(f"[demo] {at_rows} rows committed: SIGKILL {VICTIM}'s engine ({killed})")

            def back() -> dict[str, Any] | None:
                # the job's own view (`servefleet progress`, from DEST): the fleet's record turns ready
                # before generate has the server back in service
                progress = servefleet_json("progress", str(self.dest), quiet=True, check=False)
                server = {s["name"]: s for s in progress.get("servers", [])}.get(VICTIM, {})
                return server if server.get("state") == "up" and server.get("restarts", 0) >= 1 else None

            t_kill = time.monotonic()
            wait_for(back, 600, f"{VICTIM} restarted by the fleet and back in the job", proc, interval_s=1.0)
            after = server_status(self.fleet, VICTIM)
            rows = committed_rows(self.dest)
            self.restart_s = time.monotonic() - t_kill
            note(
                f"[demo] `servefleet progress` shows {VICTIM} back (new pid {after['pid']}) {self.restart_s:.0f} s after the kill; "
                f"{rows} rows committed: SIGINT to generate (Ctrl-C)"
            )
            proc.send_signal(signal.SIGINT)
            out, _ = proc.communicate(timeout=300)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        report = json.loads(out)
        servers = {s["name"]: s for s in report["servers"]}
        note(
            f"exit {proc.returncode}, status {report['status']}: {report['committed']} committed, "
            f"{VICTIM}: {servers[VICTIM]['outages']} outage(s), {servers[VICTIM]['restarts']} restart(s), "
            f"{report['requeued']} in-flight requests re-queued"
        )
        for event in report.get("events", [])[-8:]:
            note(f"  event: {event}")
        if report["status"] != "interrupted" or proc.returncode != 130:
            raise DemoError(
                f"the first run ended {report['status']} (exit {proc.returncode}), not interrupted: "
                f"the job finished before the interrupt"
            )
        if servers[VICTIM]["restarts"] < 1:
            raise DemoError(f"{VICTIM} was killed but the first run's report shows no restart")
        self.summary["first_run"] = {
            "status": report["status"],
            "exit": proc.returncode,
            "committed": report["committed"],
            "killed_at_rows": at_rows,
            "restart_s": round(self.restart_s, 1),
            "restarts": servers[VICTIM]["restarts"],
            "outages": servers[VICTIM]["outages"],
            "requeued": report["requeued"],
        }
        return report

    def check_plan(self, runs: dict[str, Path]) -> None:
        say("10/12 the plan against the run (plan --check reads the job's manifest and shards)")
        # one bench run per server (named after it): each server is planned with its own configuration
        args = ["plan", "--check", str(self.dest), *[a for n in SERVERS for a in ("--bench", str(runs[n]))]]
        # exit 1 is a verdict (the prediction missed its tolerance), not a failure of the step
        shown_check = servefleet(*args, check=False)
        if shown_check.returncode not in (0, 1):
            raise DemoError(f"plan --check exited with {shown_check.returncode}")
        checked = servefleet_json(*args, quiet=True, check=False)
        if "verdict" not in checked:
            raise DemoError(f"plan --check gave no verdict: {checked}")
        note(
            f"[demo] the plan knows no crash: {VICTIM} was out for about {self.restart_s:.0f} s of the job while the fleet "
            "restarted it, and the job ran as two runs (interrupted, resumed)"
        )
        self.summary["plan_check"] = {
            "within_tolerance": checked.get("within_tolerance"),
            "verdict": checked.get("verdict"),
            "metrics": checked.get("metrics"),
        }

    def report(self, runs: dict[str, Path]) -> None:
        say(
            "11/12 the job's report: one self-contained HTML file (tok/s and concurrency per server over time, the restart)"
        )
        html = self.out / "report.html"
        servefleet("report", str(self.dest), "--out", str(html))
        if not html.exists():
            raise DemoError(f"report wrote no {html}")
        self.summary["files"]["report"] = str(html)
        note(f"open it in a browser: {short(str(html))}")

    def where(self) -> None:
        say("where the files are")
        files = self.summary["files"]
        note(f"prompts:      {short(files['input'])}")
        note(f"output:       {short(files['output'])}/  (job.json, shards/*.parquet, ledger/, report.json)")
        note(f"bench runs:   {', '.join(short(p) for p in files['bench'])}")
        note(f"plots:        {', '.join(short(p) for p in files['plots'])}")
        if files.get("report"):
            note(f"report:       {short(files['report'])}")
        note(f"fleet logs:   servefleet logs cpu-a --fleet {short(str(self.fleet))}")
        note(f"this summary: {short(str(self.out / 'demo-summary.json'))}")

    def save(self, ok: bool, error: str | None) -> None:
        self.summary.update(ok=ok, error=error, total_s=round(time.monotonic() - self._t0, 1))
        (self.out / "demo-summary.json").write_text(json.dumps(self.summary, indent=2) + "\n")


def check_output(dest: Path, ids: list[str]) -> dict[str, Any]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    shards = sorted((dest / "shards").glob("*.parquet"))
    # from Arrow buffers, in this thread: Arrow's pools (pq.read_table, datasets, file readers) can abort
    # a process at exit ("terminate called without an active exception")
    table = (
        pa.concat_tables([pq.ParquetFile(pa.BufferReader(p.read_bytes())).read(use_threads=False) for p in shards])
        if shards
        else None
    )
    got = table.column("id").to_pylist() if table is not None else []
    wanted, seen = set(ids), set(got)
    duplicates = len(got) - len(seen)
    missing, extra = len(wanted - seen), len(seen - wanted)
    note(
        f"{len(shards)} shards, {len(got)} rows, {len(seen)} distinct ids of {len(ids)}: "
        f"{missing} missing, {duplicates} duplicated, {extra} unknown"
    )
    if table is not None:
        row = table.slice(0, 1).to_pylist()[0]
        sample = {
            k: (v[:60] + "..." if isinstance(v, str) and len(v) > 60 else v)
            for k, v in row.items()
            if k in ("id", "server", "text", "completion_tokens", "finish_reason")
        }
        note(f"columns: {', '.join(table.column_names)}")
        note(f"a row: {sample}")
    if missing or duplicates or extra:
        raise DemoError(f"not exactly once: {missing} missing, {duplicates} duplicated, {extra} unknown ids")
    return {
        "shards": len(shards),
        "rows": len(got),
        "distinct": len(seen),
        "missing": missing,
        "duplicates": duplicates,
        "columns": table.column_names if table is not None else [],
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description="servefleet demo: the main job on two CPU `transformers serve` servers"
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_OUT,
        help="folder for the model, runs, plots and the job (default: demo-out/)",
    )
    parser.add_argument("--ports", help="two ports, e.g. 40001,40002 (default: the fleet file's 38401,38402)")
    # 1,500: long enough that the job's fixed costs (two runs' start, the restart) do not swamp plan --check
    parser.add_argument("--prompts", type=int, default=1500, help="prompts in the job (default: 1500)")
    parser.add_argument(
        "--keep", action="store_true", help="leave the fleet running at the end (stop it with `servefleet down`)"
    )
    args = parser.parse_args()
    out = args.out.resolve()
    ports = [int(p) for p in args.ports.split(",")] if args.ports else None
    error = None
    try:
        fleet = fleet_file(out, ports)
    except DemoError as exc:
        print(f"demo: {exc}", file=sys.stderr)
        return 1
    demo = Demo(out, fleet, args.prompts)
    try:
        demo.fresh()
        demo.model()
        demo.up()
        runs = demo.bench()
        demo.plan(runs)
        demo.generate(runs)
        demo.check_plan(runs)
        demo.report(runs)
    except DemoError as exc:
        error = str(exc)
    except KeyboardInterrupt:
        error = "interrupted"
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
    finally:
        if args.keep and error is None:
            say("12/12 left running (--keep): stop it with")
            print(f"$ {shown([SERVEFLEET, 'down', '--fleet', str(fleet)])}")
        else:
            say("12/12 stop the fleet: whole process groups, ports confirmed free")
            down = servefleet("down", "--fleet", str(fleet), check=False)
            if down.returncode != 0 and error is None:
                error = f"down exited with {down.returncode}"
    demo.summary.setdefault("files", {})
    if error is None:
        demo.where()
    demo.save(error is None, error)
    total = time.monotonic() - demo._t0
    say(f"demo finished in {total:.0f} s" if error is None else f"demo FAILED after {total:.0f} s: {error}")
    return 0 if error is None else 1


if __name__ == "__main__":
    sys.exit(main())
