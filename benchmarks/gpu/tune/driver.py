"""Issue 28 on the H200, in one device command: `servefleet tune` over vLLM {plain, ngram} x
{--max-num-seqs 256, 1024} on a 1,000-prompt sample of a variable-length job, then the tune's top two
run as real jobs (`up`, `generate --bench`, `plan --check`, `down`) of as many prompts as the time left
allows (at most 10,000 each; the summary says how many), to compare the tune's ranking and predicted
makespan with the measured ones.

Only the standard library; every servefleet step through its CLI with --json. Everything goes under
``--out`` (``$OUT``), ``summary.json`` rewritten after every step so a cut-short run still says what it got.

``--rehearse``: the same steps on the CPU with ``servefleet sim`` as the engine (vLLM's log style, the
sim's own spec-decoding flags in place of ngram's, smaller numbers) -- so the driver is known to work
before device time is spent.

SGLang plain joins the space when ``--sglang-env FILE`` names the environment of the SGLang recipe
(``.gpu-sglang/run/sglang_setup.sh``'s PYTHONPATH and stand-ins, as JSON; the rehearsal adds the sim in SGLang's
log style instead). After the tune, every candidate's log goes through ``servefleet diagnose`` (its start-up phases,
beside the engine's own timing lines: issue 25 item 7), and while the second real job's server still holds the GPU,
a second fleet is brought up on the same GPU (issue 25 item 6: ``up`` must name the holder before launching, and the
memory failure's verdict must name it too).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent.parent
MODEL = "/tmp/sf-h200/model"
PORT = 48517
NGRAM = '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}'


class Driver:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.t0 = time.monotonic()
        self.deadline = self.t0 + args.seconds
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.work = Path(args.work)
        if self.work.exists():
            shutil.rmtree(self.work)
        self.work.mkdir(parents=True)
        self.summary: dict[str, Any] = {
            "rehearsal": args.rehearse,
            "seconds": args.seconds,
            "steps": [],
            "jobs": [],
            "notes": [],
        }
        self.log = (self.out / "driver.log").open("a")
        self.python = args.python or sys.executable

    # ---- plumbing --------------------------------------------------------------------------------
    def say(self, msg: str) -> None:
        line = f"[{time.monotonic() - self.t0:6.1f}s] {msg}"
        print(line, flush=True)
        self.log.write(line + "\n")
        self.log.flush()

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def save(self) -> None:
        self.summary["elapsed_s"] = round(time.monotonic() - self.t0, 1)
        tmp = self.out / "summary.json.tmp"
        tmp.write_text(json.dumps(self.summary, indent=2) + "\n")
        tmp.replace(self.out / "summary.json")

    def sf(self, name: str, *argv: str, timeout: float) -> tuple[int, Any]:
        """One servefleet command with --json; its stdout kept as NAME.json, stderr as NAME.err."""
        cmd = [self.python, "-m", "servefleet.cli.main", *argv, "--json"]
        self.say("$ " + " ".join(cmd[2:]))
        t = time.monotonic()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=max(5.0, timeout))
            code, out, err = proc.returncode, proc.stdout, proc.stderr
        except subprocess.TimeoutExpired as exc:
            code, out, err = 124, exc.stdout or "", exc.stderr or ""
            out, err = (
                (out.decode() if isinstance(out, bytes) else out),
                (err.decode() if isinstance(err, bytes) else err),
            )
        (self.work / f"{name}.json").write_text(out)
        (self.work / f"{name}.err").write_text(err[-20000:])
        seconds = round(time.monotonic() - t, 1)
        self.summary["steps"].append({"step": name, "rc": code, "seconds": seconds})
        self.say(f"{name}: rc={code} in {seconds} s")
        try:
            doc = json.loads(out[out.index("{") :]) if "{" in out else None
        except json.JSONDecodeError:
            doc = None
        self.save()
        return code, doc

    # ---- inputs ----------------------------------------------------------------------------------
    def job_file(self, n: int) -> Path:
        """The variable job: prompts of 20-400 words, max_tokens 64-768 (rehearsal: 8-96), greedy, every answer
        its full max_tokens (ignore_eos: a random model's EOS is noise), as issue 25's variable job.

        Each prompt's words are drawn at random, so no two share a prefix the engine could cache. Until
        2026-12-06 they were a window ``w{(i*13+j) % 991}``: prompt i and i+991 began alike, the job (in
        file order) met each repeat 991 requests later, mostly evicted, while the tune's sample, shuffled,
        met them close together: the H100 lease's tune points found 38-52 % of their prompt tokens cached
        (vLLM's log), the jobs 6-25 %, and the plan was 7-15 % optimistic. The lengths and max_tokens
        are drawn as before (``rng``), so the jobs' sizes match the earlier leases'."""
        rng = random.Random(7)
        vocab = random.Random(11)
        lo, hi = (8, 96) if self.args.rehearse else (64, 768)
        path = self.work / "job.jsonl"
        with path.open("w") as fh:
            for i in range(n):
                words = rng.randint(20, 400)
                fh.write(
                    json.dumps(
                        {
                            "id": f"v{i}",
                            "prompt": " ".join(f"w{vocab.randrange(991)}" for _ in range(words)),
                            "max_tokens": rng.randint(lo, hi),
                            "temperature": 0,
                            "ignore_eos": True,
                        }
                    )
                    + "\n"
                )
        return path

    def sim_args(self, style: str) -> list[str]:
        """The rehearsal's sim, in ``style``'s log format, with the timing the rehearsal runs at."""
        return [
            "--style",
            style,
            "--load-time",
            str(self.args.sim_load_time),
            "--max-total-tokens",
            "400000",
            "--prefill-ms-per-1k-tokens",
            "2",
            "--served-model-name",
            "ck",
        ]

    def fleet_file(
        self, file: str, name: str, server: str, port: int, args: list[str], timeout: int, stall: int
    ) -> Path:
        """``FILE.toml``, its state in ``FILE-state``: one server on GPU 0, the real vLLM (python3 on PATH, as in
        issue 25's runs: gpu-setup.sh's vLLM), or in the rehearsal the sim."""
        path = self.work / f"{file}.toml"
        if self.args.rehearse:
            engine = f'engine = "sim"\nmodel = "sim-h200"\npython = {json.dumps(self.python)}\n'
            env = ""
        else:
            engine = f'engine = "vllm"\nmodel = "{MODEL}"\n'
            env = 'env = { VLLM_USE_FLASHINFER_SAMPLER = "0", HF_HUB_OFFLINE = "1" }\n'
        path.write_text(
            f'[fleet]\nname = "{name}"\nstate_dir = "{self.work / f"{file}-state"}"\ntimeout = {timeout}\n'
            f"stall = {stall}\n\n[defaults]\n{engine}args = {json.dumps(args)}\n{env}\n"
            f'[[servers]]\nname = "{server}"\nport = {port}\ngpus = [0]\n'
        )
        return path

    def base_fleet(self) -> Path:
        if self.args.rehearse:
            args = self.sim_args("vllm")
        else:
            args = ["--served-model-name", "ck", "--gpu-memory-utilization", "0.90", "--max-model-len", "4096"]
        return self.fleet_file("base", "tune-h200", "g0", PORT, args, timeout=300, stall=200)

    def space(self) -> Path:
        path = self.work / "space.toml"
        if self.args.rehearse:
            # the same grid, the sim's flags: a speculative step of 2.5 tokens, a cost per running request
            text = (
                "[tune]\nstart_concurrency = 16\npoint_requests = 64\nper_concurrency = 2\n\n[grid]\n"
                '"--max-num-seqs" = [32, 128]\n'
                'spec = { plain = [], ngram = ["--tokens-per-step", "2.5", "--spec-ms-per-running", "0.3"] }\n'
            )
        else:
            text = (HERE / "space.toml").read_text()
        sglang = self.sglang_candidate()
        if sglang:
            text += sglang
        path.write_text(text)
        return path

    def sglang_candidate(self) -> str:
        """SGLang plain as a candidate of its own: another engine, so none of the base's vLLM args
        (inherit_args = false), and the recipe's environment (PYTHONPATH without vLLM's /tmp/site)."""
        if self.args.rehearse:
            args = [*self.sim_args("sglang"), "--max-running-requests", "128"]
            return f'\n[[candidate]]\nname = "sglang-plain"\ninherit_args = false\nargs = {json.dumps(args)}\n'
        if not self.args.sglang_env:
            self.summary["notes"].append(
                "SGLang plain is not in this run: no --sglang-env (its recipe was not set up)"
            )
            return ""
        env = json.loads(Path(self.args.sglang_env).read_text())
        args = ["--served-model-name", "ck", "--context-length", "4096", "--mem-fraction-static", "0.85"]
        args += ["--max-running-requests", "1024", "--attention-backend", "triton", "--sampling-backend", "pytorch"]
        args += ["--log-level", "info"]
        env_toml = ", ".join(f"{k} = {json.dumps(v)}" for k, v in env.items())
        return (
            '\n[[candidate]]\nname = "sglang-plain"\nengine = "sglang"\ninherit_args = false\n'
            f"python = {json.dumps(self.args.sglang_python)}\nargs = {json.dumps(args)}\nenv = {{ {env_toml} }}\n"
        )

    # ---- the run ---------------------------------------------------------------------------------
    def run(self) -> int:
        a = self.args
        job = self.job_file(a.job_prompts)
        base, space = self.base_fleet(), self.space()
        tune_out = self.work / "tune"
        budget = max(60.0, min(a.tune_budget, self.left() - a.reserve))
        self.summary["tune_budget_s"] = budget
        self.say(f"tune: budget {budget:.0f} s of {self.left():.0f} s left")
        code, doc = self.sf(
            "tune",
            "tune",
            "--fleet",
            str(base),
            "--space",
            str(space),
            "--input",
            str(job),
            "--sample",
            str(a.sample),
            "--gpus",
            "1,8",
            "--budget",
            f"{budget:.0f}s",
            "--out",
            str(tune_out),
            timeout=budget + 120,
        )
        self.summary["tune"] = _tune_summary(doc)
        self.save()
        self.startup_phases(tune_out)
        if not doc or not doc.get("candidates"):
            self.say("tune gave no result: stopping")
            return 1
        ranked = [c for c in doc["candidates"] if c["run"] and c["predictions"] and c["predictions"][0]["makespan_s"]]
        top = ranked[:2]
        n = self.prompts_that_fit(top, doc)
        self.summary["job_prompts"] = n
        self.summary["notes"].append(
            f"the real jobs: {n:,} prompts each (the first {n:,} of the job file), "
            f"{f'all {a.job_prompts:,} asked for' if n >= a.job_prompts else 'as many as the device time left allowed'}"
        )
        self.save()
        if n < 100:
            self.say("no time left for the real jobs")
            return 1
        sub = self.work / f"job-{n}.jsonl"
        with job.open() as src, sub.open("w") as dst:
            for i, line in enumerate(src):
                if i >= n:
                    break
                dst.write(line)
        for rank, cand in enumerate(top, 1):
            self.real_job(rank, cand, sub, tune_out, holder_check=a.holder_check and rank == len(top))
        self.compare()
        return 0

    def startup_phases(self, tune_out: Path) -> None:
        """Each candidate's start-up phases as ``diagnose`` reads them from its log, beside the
        engine's own timing lines in the same log (issue 25 item 7: the phases against the log)."""
        own = ("took", "Took", "takes", "elapsed", "Elapsed", "startup timings", "Capture", "capturing", "Loading")
        rows = []
        for log in sorted((tune_out / "state" / "logs").glob("*.log")):
            code, doc = self.sf(f"diagnose-{log.stem}", "diagnose", str(log), timeout=60)
            lines = [ln.rstrip() for ln in log.open(errors="replace") if any(k in ln for k in own)][:40]
            rows.append(
                {
                    "log": log.name,
                    "rc": code,
                    "state": (doc or {}).get("state"),
                    "engine": (doc or {}).get("engine"),
                    "startup_phases": (doc or {}).get("startup_phases"),
                    "engine_timing_lines": [ln[-300:] for ln in lines],
                }
            )
        self.summary["startup_phases"] = rows
        self.save()

    def holder_fleet(self) -> Path:
        """A second fleet on the GPU the real job's server holds: vLLM asking for half the card (eager, so
        it fails soon), or in the rehearsal the sim (no nvidia-smi here: the warning list stays empty)."""
        if self.args.rehearse:
            args = ["--style", "vllm", "--load-time", "1", "--fail-at-startup", "gpu_oom"]
        else:
            args = ["--gpu-memory-utilization", "0.50", "--max-model-len", "1024", "--enforce-eager"]
        return self.fleet_file("holder", "holder-check", "second", PORT + 83, args, timeout=150, stall=120)

    def holder_check(self) -> None:
        fleet = self.holder_fleet()
        code, up = self.sf("holder-up", "up", str(fleet), "--timeout", "120", timeout=min(160, max(10, self.left())))
        entry: dict[str, Any] = {"up_rc": code}
        if up:
            entry["up"] = up
        self.sf("holder-down", "down", "--fleet", str(fleet), timeout=40)
        logs = sorted((self.work / "holder-state" / "logs").glob("*.log"))
        if logs:
            entry["log_tail"] = logs[0].read_text(errors="replace").splitlines()[-25:]
        self.summary["holder_check"] = entry
        self.save()

    def prompts_that_fit(self, top: list[dict[str, Any]], doc: dict[str, Any]) -> int:
        """Prompts per job so that both jobs (a relaunch each, the job, the check, a stop) end before the deadline."""
        mean_out = doc["job"]["output_tokens_mean"] or 416.0
        # a relaunch of a configuration the tune just started is faster (warm caches: 52 s against 104 s cold on the H200)
        fixed = sum(
            0.75 * (c["time_to_ready_s"] or 100.0) + 25.0 for c in top
        )  # relaunch, generate's start, check, down
        rate = sum(
            1.0 / (0.8 * c["output_tps"]) for c in top if c["output_tps"]
        )  # s per output token, both jobs, 20 % margin
        spare = self.left() - fixed - 15.0 - 60.0  # 60 s: the holder check beside the second job
        n = int(spare / (rate * mean_out)) if rate > 0 and spare > 0 else 0
        return max(0, min(self.args.job_prompts, n))

    def real_job(self, rank: int, cand: dict[str, Any], job: Path, tune_out: Path, holder_check: bool) -> None:
        name = cand["name"]
        fleet = tune_out / "fleets" / f"{name}.toml"
        run = tune_out / "runs" / f"{name}.json"
        dest = self.work / f"dest-{name}"
        entry: dict[str, Any] = {"rank": rank, "candidate": name, "prompts": sum(1 for _ in job.open())}
        self.summary["jobs"].append(entry)
        try:
            code, up = self.sf(f"up-{name}", "up", str(fleet), "--timeout", "240", timeout=min(300, self.left()))
            entry["up_rc"] = code
            if code != 0:
                return
            code, gen = self.sf(
                f"generate-{name}",
                "generate",
                "--fleet",
                str(fleet),
                "--input",
                str(job),
                "--output",
                str(dest),
                "--bench",
                str(run),
                timeout=max(30.0, self.left() - 40),
            )
            entry["generate_rc"] = code
            if gen:
                entry["status"] = gen.get("status")
                entry["wall_s"] = gen.get("wall_s")
            code, check = self.sf(f"check-{name}", "plan", "--check", str(dest), "--bench", str(run), timeout=60)
            if check:
                mk = (check.get("metrics") or {}).get("makespan_s") or {}
                entry.update(
                    {
                        "predicted_makespan_s": mk.get("predicted"),
                        "measured_makespan_s": mk.get("measured"),
                        "error_pct": mk.get("error_pct"),
                        "within_10pct": check.get("within_tolerance"),
                        "verdict": check.get("verdict"),
                        # the server against its tune point, and the prompts' prefix-cache hits in each
                        "against_bench": check.get("against_bench"),
                        "prefix_cache_hit_rate": check.get("prefix_cache_hit_rate"),
                    }
                )
            if holder_check and self.left() > 60:
                self.holder_check()  # while this server still holds the GPU
        finally:
            self.sf(f"down-{name}", "down", "--fleet", str(fleet), timeout=60)
            self.save()

    def compare(self) -> None:
        jobs = [j for j in self.summary["jobs"] if j.get("measured_makespan_s")]
        if len(jobs) == 2:
            first, second = jobs
            gap = (first["measured_makespan_s"] - second["measured_makespan_s"]) / second["measured_makespan_s"] * 100
            self.summary["ranking_held"] = gap <= 3.0
            self.summary["first_vs_second_measured_pct"] = round(gap, 2)
        self.save()

    def collect(self) -> None:
        with tarfile.open(self.out / "tune-h200.tar.gz", "w:gz") as tar:
            for path in sorted(self.work.rglob("*")):
                if (
                    path.is_file()
                    and path.suffix in (".json", ".err", ".toml", ".png", ".log")
                    and path.stat().st_size < 4 << 20
                    and "shards" not in path.parts
                ):
                    tar.add(path, arcname=str(path.relative_to(self.work)))
        self.save()


def _tune_summary(doc: dict[str, Any] | None) -> dict[str, Any] | None:
    if not doc:
        return None
    keep = (
        "name",
        "outcome",
        "reason",
        "category",
        "evidence",
        "time_to_ready_s",
        "kv_tokens",
        "max_running",
        "best_concurrency",
        "output_tps",
        "acceptance",
        "accept_length",
        "concurrencies",
        "predictions",
        "measured_s",
    )
    return {
        "winner": doc.get("winner"),
        "wall_s": doc.get("wall_s"),
        "measured_s": doc.get("measured_s"),
        "overhead_share": doc.get("overhead_share"),
        "ran": doc.get("ran"),
        "skipped": doc.get("skipped"),
        "job": doc.get("job"),
        "candidates": [{k: c.get(k) for k in keep} for c in doc.get("candidates", [])],
        "notes": doc.get("notes"),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rehearse", action="store_true", help="on the CPU, the sim as the engine")
    p.add_argument(
        "--seconds",
        type=float,
        default=500.0,
        help="the whole driver's wall time (the device command's limit less setup)",
    )
    p.add_argument("--tune-budget", type=float, default=300.0, help="the tune's --budget at most")
    p.add_argument(
        "--reserve", type=float, default=190.0, help="seconds kept for the real jobs when the tune's budget is set"
    )
    p.add_argument(
        "--sim-load-time",
        type=float,
        default=2.0,
        help="--rehearse: the sim's start-up seconds (the H200's vLLM: 50-100)",
    )
    p.add_argument("--sample", type=int, default=1000)
    p.add_argument("--job-prompts", type=int, default=10000)
    p.add_argument("--out", default=os.environ.get("OUT", "/tmp/tune-h200-out"))
    p.add_argument("--work", default="/tmp/tune-h200")
    p.add_argument("--python", default=None, help="the interpreter with servefleet (default: this one)")
    p.add_argument("--sglang-env", default=None, help="JSON file: the SGLang recipe's environment (adds SGLang plain)")
    p.add_argument("--sglang-python", default="python3", help="the interpreter SGLang runs under")
    p.add_argument(
        "--no-holder-check",
        dest="holder_check",
        action="store_false",
        help="skip the second fleet beside the second job (~50 s; met on the H200 on 2026-12-02)",
    )
    args = p.parse_args()
    driver = Driver(args)
    try:
        return driver.run()
    finally:
        driver.collect()


if __name__ == "__main__":
    sys.exit(main())
