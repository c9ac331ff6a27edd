"""rank-jobs (issue 17 step 2): is the configuration the plan ranks first the one that finishes a job
soonest? One job per shared server, each on its own (the other idle beside it, as in bench-shared),
the same prompts; the plan for that job is made from bench-shared's runs before either starts; then
``plan --check`` of each job against its own bench run (makespan error, target within 10 %).

Standard library only, like the rest of the driver.
"""

from __future__ import annotations

from pathlib import Path

from h200_run2 import _job, _plan, _ready, _words_for, check_summary
from h200_stages import Ctx, read_json, write_json

__all__ = ["STAGES_RANK", "ESTIMATES_RANK", "plan_order", "rank_summary"]

SHARED = ("plain", "ngram")


def plan_order(plan: dict | None, gpus: str = "1") -> list[str]:
    """Configurations of a ``plan --json`` document, soonest makespan first, at ``gpus`` GPUs."""
    rows = ((plan or {}).get("plans") or {}).get(gpus) or []
    return [r["name"] for r in sorted(rows, key=lambda r: r.get("makespan_s") or float("inf"))]


def rank_summary(plan: dict | None, checks: dict[str, dict]) -> dict:
    """The plan's order beside the jobs' measured one (shortest measured makespan first)."""
    planned = plan_order(plan)
    timed = {n: c.get("makespan_measured_s") for n, c in checks.items() if c.get("makespan_measured_s")}
    measured = sorted(timed, key=lambda n: timed[n])
    return {
        "plan_order": planned,
        "measured_order": measured,
        "measured_makespan_s": timed,
        "first_agrees": bool(planned and measured and planned[0] == measured[0]) if len(measured) > 1 else None,
    }


def stage_rank_jobs(ctx: Ctx) -> dict:
    lay, st, run = ctx.layout, ctx.settings, ctx.runner
    bench = read_json(lay.results / "bench_shared.json") or {}
    runs = {n: Path(p) for n, p in (bench.get("runs") or {}).items() if Path(p).exists()}
    ready = _ready(ctx, lay.main_fleet)
    out: dict = {"prompts": st.rank_prompts, "max_tokens": st.output_len}
    if set(runs) != set(SHARED) or not set(SHARED) <= set(ready):
        out["skipped"] = (
            f"needs both shared servers ready (ready: {ready}) and bench-shared's runs (have: {sorted(runs)})"
        )
        write_json(lay.results / "rank_jobs.json", out)
        return out
    out["plan"] = _plan(ctx, "plan-rank", [runs[n] for n in SHARED], st.rank_prompts, st.output_len, "1")
    jobs: dict = {}
    checks: dict = {}
    for name in SHARED:
        job = _job(ctx, f"rank-{name}", lay.url(name), st.rank_prompts, _words_for(st.input_len), [], bench=runs[name])
        res = run.run(
            f"plan-check-rank-{name}",
            ctx.sf("plan", "--bench", str(runs[name]), "--check", job["dest"], "--json"),
            timeout=300,
        )
        checks[name] = check_summary(res.json())
        jobs[name] = {
            k: job.get(k)
            for k in (
                "status",
                "rc",
                "seconds",
                "output_tokens_per_s",
                "unique_ids",
                "duplicates",
                "exactly_once",
                "dest",
            )
        }
        jobs[name]["check"] = checks[name]
        run.say(
            f"  rank-{name}: {job.get('status')}, {job.get('output_tokens_per_s')} tok/s, "
            f"makespan error {checks[name].get('makespan_error_pct')} %"
        )
        write_json(lay.results / "rank_jobs.json", {**out, "jobs": jobs})
    out["jobs"] = jobs
    out["ranking"] = rank_summary((out["plan"] or {}).get("plan"), checks)
    run.say(f"  rank-jobs: {out['ranking']}")
    write_json(lay.results / "rank_jobs.json", out)
    return out


STAGES_RANK = {"rank-jobs": stage_rank_jobs}
ESTIMATES_RANK = {"rank-jobs": 150.0}  # two jobs of 6,000 x 256 at ~23-28k tok/s, plus the plans and checks
