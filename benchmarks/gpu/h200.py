"""servefleet on a real GPU (issue 8): one driver, stages that can run in separate device commands.

    python3 benchmarks/gpu/h200.py [options] STAGE...       (usually through run_h200.sh)

Stages, in the order ``all`` runs them: setup, up, bench, plan, failures, vllm-bench, down, collect;
``generate`` (issue 8 step 6, a job with one server SIGKILLed midway) runs only when named.
``--rehearse`` runs the same plumbing on a CPU: servefleet's simulator prints vLLM's log in place
of real vLLM (same engine profile, fleet files and commands), nothing is installed, and ``vllm bench
serve`` is skipped. Standard library only: it starts before servefleet's dependencies are installed.

Every stage writes results/<stage>.json under the work folder; ``collect`` (run after every stage
of ``all``) packs them into the output folder ($OUT on the device machine). ``--budget S`` skips a
stage that would not finish within S seconds of the start (by its estimate), so a device command
ends inside its limit with down and collect done. The running of stages (order, budget, checkpoints)
is the shared stage runner's (stages.py); this file names the stages and their settings.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from h200_exec import T0, Runner
from h200_failures import stage_failures
from h200_generate import stage_generate
from h200_layout import Layout, Settings, child_env
from h200_multi import GROUPS_MULTI, STAGES_MULTI, estimates_multi
from h200_rank import ESTIMATES_RANK, STAGES_RANK
from h200_report import stage_collect
from h200_run2 import ESTIMATES2, GROUPS, STAGES2
from h200_stages import (
    Ctx,
    stage_bench,
    stage_down,
    stage_plan,
    stage_setup,
    stage_up,
    stage_vllm_bench,
)
from stages import Blocked, Stage, run_stages

# Most valuable first: if --budget runs out, what is skipped is the A/B against vllm bench serve.
ORDER = ("setup", "up", "bench", "plan", "failures", "vllm-bench", "down", "collect")
STAGES = {
    "setup": stage_setup,
    "up": stage_up,
    "bench": stage_bench,
    "vllm-bench": stage_vllm_bench,
    "failures": stage_failures,
    "plan": stage_plan,
    "down": stage_down,
    "generate": stage_generate,
    **STAGES2,
    **STAGES_RANK,
    **STAGES_MULTI,
}
GROUPS = {**GROUPS, **GROUPS_MULTI}
ALWAYS = ("down", "down-whole", "multi-down", "tp-down", "multi-summary", "collect")  # run even past the budget


def estimate_s(stage: str, st: Settings) -> float:
    """Seconds a stage takes on the H200 (first run: guesses from the recipe's reference figures)."""
    if st.rehearse:
        return 5.0
    points = len(st.levels())
    return {
        "setup": 120.0,  # wheels, editable install, model build
        "up": 200.0 if st.stagger == "kv" else 240.0,  # ~100 s per vLLM start, second one staggered
        "bench": 2 * points * (st.point_seconds + 6) + 20,
        "vllm-bench": 60.0,  # at least one level (the stage checks each level)
        "failures": 200.0,  # the cases one after another on GPU 0 (servefleet orders them): 159 s
        "plan": 15.0,
        "generate": st.generate_kill_after + 240.0,  # the rest of the job plus a ~100 s restart
        **ESTIMATES2,
        **ESTIMATES_RANK,
        **estimates_multi(st),
    }.get(stage, 10.0)


def stage_list(ctx: Ctx, names: list[str]) -> list[Stage]:
    """The named stages for the shared runner (stages.py): estimates, the ones that always run, and a
    setup that found no vLLM, servefleet or model blocking every stage after it."""

    def setup(_timings: list[dict]) -> dict:
        result = stage_setup(ctx)
        if not result.get("ready"):
            raise Blocked(
                "not ready",
                "setup not ready: vLLM, servefleet or the model is missing "
                "(was the first device command run on this same machine?)",
            )
        return result

    def stage(name: str) -> Stage:
        if name == "collect":
            return Stage(name, lambda timings: stage_collect(ctx, timings), always=True)
        run = setup if name == "setup" else (lambda _timings, fn=STAGES[name]: fn(ctx))
        return Stage(name, run, estimate_s=estimate_s(name, ctx.settings), always=name in ALWAYS)

    return [stage(name) for name in names]


def expand(names: list[str]) -> list[str]:
    """Stage names with the groups (all, run2a, run2b) replaced by their stages."""
    out: list[str] = []
    for name in names:
        out += list(ORDER) if name == "all" else list(GROUPS.get(name, (name,)))
    return out


def parse(argv: list[str]) -> tuple[argparse.Namespace, Settings]:
    p = argparse.ArgumentParser(prog="h200.py", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "stages",
        nargs="+",
        choices=[*ORDER, "generate", *STAGES2, *STAGES_RANK, *STAGES_MULTI, "all", *GROUPS],
        help="stages to run, in the given order (generate is not part of all); all = the first run, "
        "run2a / run2b = the second run's two device commands (h200_run2.py), "
        "multi = several GPUs of one host (h200_multi.py)",
    )
    p.add_argument("--rehearse", action="store_true", help="CPU rehearsal: the sim in vLLM style instead of vLLM")
    p.add_argument(
        "--work", type=Path, default=None, help="work folder (default /tmp/sf-h200; rehearsal: a temp folder)"
    )
    p.add_argument("--out", type=Path, default=None, help="folder for what comes back (default $OUT, else WORK/out)")
    d = Settings()
    p.add_argument("--concurrency", default=d.concurrency)
    p.add_argument("--point-seconds", type=float, default=d.point_seconds)
    p.add_argument("--input-len", type=int, default=d.input_len)
    p.add_argument("--output-len", type=int, default=d.output_len)
    p.add_argument("--vllm-bench-concurrency", default=d.vllm_bench_concurrency)
    p.add_argument("--vllm-bench-waves", type=int, default=d.vllm_bench_waves)
    p.add_argument("--stagger", choices=("kv", "serial", "none"), default=d.stagger)
    p.add_argument("--up-timeout", type=float, default=d.up_timeout)
    p.add_argument("--failure-timeout", type=float, default=d.failure_timeout)
    p.add_argument("--generate-prompts", type=int, default=d.generate_prompts)
    p.add_argument("--generate-max-tokens", type=int, default=d.generate_max_tokens)
    p.add_argument("--generate-kill-after", type=float, default=d.generate_kill_after)
    p.add_argument("--whole-prompts", type=int, default=d.whole_prompts)
    p.add_argument("--kill-prompts", type=int, default=d.kill_prompts)
    p.add_argument("--hang-prompts", type=int, default=d.hang_prompts)
    p.add_argument("--kill-after", type=float, default=d.kill_after)
    p.add_argument("--hang-stop-after", type=float, default=d.hang_stop_after)
    p.add_argument("--hang-after", type=float, default=d.hang_after)
    p.add_argument("--nostream-concurrency", default=d.nostream_concurrency)
    p.add_argument("--nostream-point-seconds", type=float, default=d.nostream_point_seconds)
    p.add_argument("--ab-stream-concurrency", default=d.ab_stream_concurrency)
    p.add_argument("--ab-stream-waves", type=int, default=d.ab_stream_waves)
    p.add_argument("--ab-shared-concurrency", default=d.ab_shared_concurrency)
    p.add_argument("--ab-min-requests", type=int, default=d.ab_min_requests)
    p.add_argument("--faults-prompts", type=int, default=d.faults_prompts)
    p.add_argument("--rank-prompts", type=int, default=d.rank_prompts)
    p.add_argument("--gpus", type=int, default=None, help="multi: servers, one per GPU (default: all visible)")
    p.add_argument("--multi-concurrency", default=d.multi_concurrency)
    p.add_argument("--multi-point-seconds", type=float, default=d.multi_point_seconds)
    p.add_argument("--multi-prompts-per-gpu", type=int, default=d.multi_prompts_per_gpu)
    p.add_argument("--multi-kill-after", type=float, default=d.multi_kill_after)
    p.add_argument("--multi-fault-prompts", type=int, default=d.multi_fault_prompts)
    p.add_argument("--budget", type=float, default=None, help="seconds: skip stages that would end past this")
    a = p.parse_args(argv)
    st = Settings(
        rehearse=a.rehearse,
        concurrency=a.concurrency,
        point_seconds=a.point_seconds,
        input_len=a.input_len,
        output_len=a.output_len,
        vllm_bench_concurrency=a.vllm_bench_concurrency,
        vllm_bench_waves=a.vllm_bench_waves,
        stagger=a.stagger,
        up_timeout=a.up_timeout,
        failure_timeout=a.failure_timeout,
        budget_s=a.budget,
        generate_prompts=a.generate_prompts,
        generate_max_tokens=a.generate_max_tokens,
        generate_kill_after=a.generate_kill_after,
        kill_after=a.kill_after,
        hang_stop_after=a.hang_stop_after,
        hang_after=a.hang_after,
        whole_prompts=a.whole_prompts,
        kill_prompts=a.kill_prompts,
        hang_prompts=a.hang_prompts,
        nostream_concurrency=a.nostream_concurrency,
        nostream_point_seconds=a.nostream_point_seconds,
        ab_stream_concurrency=a.ab_stream_concurrency,
        ab_stream_waves=a.ab_stream_waves,
        ab_shared_concurrency=a.ab_shared_concurrency,
        ab_min_requests=a.ab_min_requests,
        faults_prompts=a.faults_prompts,
        rank_prompts=a.rank_prompts,
        gpus=a.gpus,
        multi_concurrency=a.multi_concurrency,
        multi_point_seconds=a.multi_point_seconds,
        multi_prompts_per_gpu=a.multi_prompts_per_gpu,
        multi_kill_after=a.multi_kill_after,
        multi_fault_prompts=a.multi_fault_prompts,
    )
    return a, st


def main(argv: list[str] | None = None) -> int:
    a, st = parse(sys.argv[1:] if argv is None else argv)
    repo = Path(__file__).resolve().parents[2]
    work = a.work or (Path(tempfile.mkdtemp(prefix="sf-rehearse-")) if st.rehearse else Path("/tmp/sf-h200"))
    out = a.out or Path(os.environ.get("OUT") or work / "out")
    layout = Layout.load_or_create(repo, work.resolve(), out, st.rehearse)
    layout.results.mkdir(parents=True, exist_ok=True)
    runner = Runner(layout.results, child_env(layout), Path(layout.work))
    ctx = Ctx(layout, st, runner)
    stages = expand(a.stages)
    grouped = any(n == "all" or n in GROUPS for n in a.stages)
    runner.say(
        f"h200 driver: stages {' '.join(stages)}; work {layout.work}; out {layout.out}"
        f"{'; REHEARSAL (sim in vLLM style)' if st.rehearse else ''}"
    )
    _, failed = run_stages(
        stage_list(ctx, stages),
        say=runner.say,
        budget_s=st.budget_s,
        t0=T0,
        checkpoint=(lambda timings: stage_collect(ctx, timings)) if grouped and "collect" in stages else None,
    )
    summary = layout.results / "summary.md"
    if summary.exists() and "collect" in stages:
        print(summary.read_text())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
