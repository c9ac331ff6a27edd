"""Several GPUs of one host (issue 18): stages that the driver runs as the groups ``multi``
(on the device in two commands: ``multi-a``, ``multi-b``) and ``multi-tp`` (h200.py), on an
nvidia-h200-x4 or -x8 machine.

multi:    one vLLM server per GPU (gpus = [i] each) through ONE ``servefleet up`` (different GPUs start
          in parallel), each verified: time to ready per server and for the fleet; ``bench`` of one of
          them in the job's mode (non-streaming); ``plan`` of the job for 1, 2, 4 (8) GPUs; the same
          workload generated over 1, 2, 4 (8) of the servers (subset fleet files of the same fleet:
          multi_prompts_per_gpu x k prompts, so every size runs about as long), each with
          ``plan --check``; the coordinator's own CPU (user + sys of the generate process / wall);
          then one job over the whole fleet with the last server SIGKILLed mid-job: restarted on its
          GPU, every prompt exactly once, the job's throughput dip and recovery from its timeline.
multi-tp: after ``multi-down``: one server over GPUs 0 and 1 (--tensor-parallel-size 2), benched,
          planned beside the single-GPU run (2 GPUs each way), and the same job as the 2-server one
          generated on it: does the plan rank TP=2 against two replicas the way the jobs do?

Rehearsal: the sim in vLLM style, ``gpus`` only labels (the sim ignores CUDA_VISIBLE_DEVICES), 3
servers unless --gpus. Standard library only, like the rest of the driver.
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import time
from pathlib import Path

from h200_layout import _engine_defaults, _render, _sim_timing, free_port
from h200_run2 import _job, _plan, _ready, _recovery, _up, _words_for, check_summary
from h200_stages import Ctx, _bench_common, down_stage, read_json, write_json

__all__ = [
    "STAGES_MULTI",
    "GROUPS_MULTI",
    "estimates_multi",
    "fleet_sizes",
    "visible_gpus",
    "throughput_dip",
    "plan_rank",
    "multi_toml",
    "tp_toml",
    "cpu_share",
]

MULTI, TP = "multi", "tp"


# ---- pure helpers -------------------------------------------------------------------------------
def fleet_sizes(n: int) -> list[int]:
    """1, 2, 4, ... up to n, and n itself when it is not a power of two (3 -> [1, 2, 3])."""
    sizes, k = [], 1
    while k < n:
        sizes.append(k)
        k *= 2
    return [*sizes, n] if n >= 1 else []


def visible_gpus(env: dict[str, str], smi_lines: list[str]) -> int:
    """GPUs this process may use: CUDA_VISIBLE_DEVICES when set, else the ``nvidia-smi -L`` lines."""
    cvd = env.get("CUDA_VISIBLE_DEVICES")
    if cvd is not None and cvd.strip():
        return len([d for d in cvd.split(",") if d.strip()])
    return len([line for line in smi_lines if line.startswith("GPU ")])


def cpu_share(user_s: float, sys_s: float, wall_s: float) -> float | None:
    """Cores the process kept busy on average (1.0 = one core all the time)."""
    return round((user_s + sys_s) / wall_s, 3) if wall_s > 0 else None


def throughput_dip(timeline: dict, fault_at_s: float, window_s: float = 30.0, recovered_at: float = 0.9) -> dict:
    """The job's output rate around a fault at ``fault_at_s`` (seconds since the timeline's start),
    from its buckets: the mean rate over ``window_s`` before, the lowest bucket after, and when the
    rate first came back to ``recovered_at`` of the rate before (None: not before the job ended).
    The last bucket (partial, the job's tail) is left out."""
    width = float(timeline.get("bucket_s") or 1.0)
    tokens = list((timeline.get("job") or {}).get("output_tokens") or [])[:-1]
    series = [(round(i * width, 1), t / width) for i, t in enumerate(tokens)]
    before = [r for t, r in series if fault_at_s - window_s <= t < fault_at_s - width]
    after = [(t, r) for t, r in series if t >= fault_at_s]
    out: dict = {
        "bucket_s": width,
        "fault_at_s": round(fault_at_s, 1),
        "rate_before": round(sum(before) / len(before), 1) if before else None,
        "min_after": None,
        "min_at_s": None,
        "dip_fraction": None,
        "recovered_at_s": None,
        "recovery_s": None,
        "series": [[t, round(r, 1)] for t, r in series],
    }
    if not after or not out["rate_before"]:
        return out
    low_t, low = min(after, key=lambda p: p[1])
    out.update(min_after=round(low, 1), min_at_s=low_t, dip_fraction=round(1 - low / out["rate_before"], 3))
    back = next((t for t, r in after if t > low_t and r >= recovered_at * out["rate_before"]), None)
    if back is not None:
        out.update(recovered_at_s=back, recovery_s=round(back - fault_at_s, 1))
    return out


def plan_rank(plan_doc: dict | None, gpus: str) -> list[str]:
    """Configuration names of ``plan --json`` on ``gpus`` GPUs, shortest makespan first."""
    rows = (((plan_doc or {}).get("plans") or {}).get(gpus)) or []
    return [r.get("name") for r in sorted(rows, key=lambda r: r.get("makespan_s") or float("inf"))]


# ---- fleet files --------------------------------------------------------------------------------
def _server_args(ctx: Ctx) -> list[str]:
    st = ctx.settings
    args = [
        "--gpu-memory-utilization",
        str(st.whole_util),
        "--max-model-len",
        str(st.max_model_len),
        "--max-num-seqs",
        str(st.whole_max_seqs),
    ]
    return args + _sim_timing() if ctx.layout.rehearse else args


def _port(ctx: Ctx, name: str) -> int:
    lay = ctx.layout
    if name not in lay.ports:
        lay.ports[name] = free_port()
        lay.save()
    return lay.ports[name]


def server_names(n: int) -> list[str]:
    return [f"gpu{i}" for i in range(n)]


def multi_toml(ctx: Ctx, names: list[str]) -> str:
    """The multi fleet, or a subset of it (same name and state folder: the same running servers)."""
    lay, st = ctx.layout, ctx.settings
    header = {
        "name": MULTI,
        "state_dir": str(lay.path("state", MULTI)),
        "timeout": st.up_timeout,
        "stall": 240,
        "smoke": True,
    }
    defaults = {**_engine_defaults(lay, st), "args": _server_args(ctx)}
    servers = [{"name": n, "port": _port(ctx, n), "gpus": [int(n[3:])]} for n in names]
    return _render(header, defaults, servers)


def tp_toml(ctx: Ctx) -> str:
    """One server over GPUs 0 and 1 with --tensor-parallel-size 2."""
    lay, st = ctx.layout, ctx.settings
    header = {
        "name": TP,
        "state_dir": str(lay.path("state", TP)),
        "timeout": st.up_timeout,
        "stall": 240,
        "smoke": True,
    }
    defaults = {**_engine_defaults(lay, st), "args": [*_server_args(ctx), "--tensor-parallel-size", "2"]}
    return _render(header, defaults, [{"name": "tp2", "port": _port(ctx, "tp2"), "gpus": [0, 1]}])


def _fleet(ctx: Ctx, k: int | None = None) -> Path:
    return ctx.layout.path(f"fleet-multi{'' if k is None else f'-{k}'}.toml")


def _n(ctx: Ctx) -> int:
    """Servers of the multi group: --gpus, else the rehearsal's 3, else every GPU this machine shows."""
    if ctx.settings.gpus:
        return ctx.settings.gpus
    if ctx.layout.rehearse:
        return 3
    try:
        smi = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60).stdout.splitlines()
    except (OSError, subprocess.TimeoutExpired):
        smi = []
    return max(1, visible_gpus(dict(os.environ), smi))


def _res(ctx: Ctx, name: str) -> Path:
    return ctx.layout.results / "multi" / name


# ---- multi ------------------------------------------------------------------------------------------
def stage_multi_up(ctx: Ctx) -> dict:
    n = _n(ctx)
    names = server_names(n)
    out = _up(ctx, _fleet(ctx), multi_toml(ctx, names), "multi-up")
    out["gpus"] = n
    ttr = [s.get("time_to_ready_s") for s in out["servers"].values()]
    out["time_to_ready_s"] = {k: s.get("time_to_ready_s") for k, s in out["servers"].items()}
    out["fleet_ready_s"] = max((t for t in ttr if t is not None), default=None)  # the slowest server's
    out["all_ready"] = sorted(out["ready"]) == sorted(names)
    ctx.runner.say(
        f"  multi-up: {len(out['ready'])}/{n} ready; fleet ready in {out['fleet_ready_s']} s "
        f"(up wall {out['wall_s']} s)"
    )
    write_json(_res(ctx, "up.json"), out)
    return out


def _bench_one(ctx: Ctx, fleet: Path, server: str, path: Path, name: str) -> dict:
    """A non-streaming sweep of one server; the run file at ``path``."""
    st = ctx.settings
    path.parent.mkdir(parents=True, exist_ok=True)
    levels = st.multi_levels()
    res = ctx.runner.run(
        name,
        ctx.sf(
            "bench",
            "--fleet",
            str(fleet),
            "--servers",
            server,
            "-c",
            st.multi_concurrency,
            "--duration",
            str(st.multi_point_seconds),
            "--no-stream",
            *_bench_common(ctx),
            "--out",
            str(path),
            "--json",
        ),
        timeout=ctx.cap(len(levels) * (st.multi_point_seconds + 45) + 90),
    )
    if not path.exists():  # a fleet run may name its file after the server
        alt = sorted(path.parent.glob(f"{path.stem}*.json"))
        if alt:
            alt[0].replace(path)
    doc = read_json(path) or {}
    points = [
        {
            "concurrency": p.get("concurrency"),
            "output_tokens_per_s": p.get("output_tokens_per_s"),
            "errors": p.get("errors"),
        }
        for p in doc.get("points") or []
    ]
    return {
        "rc": res.rc,
        "seconds": round(res.seconds, 1),
        "run": str(path) if doc else None,
        "points": points,
        "best": max(points, key=lambda p: p.get("output_tokens_per_s") or 0, default=None),
    }


def _single_run(ctx: Ctx) -> Path:
    return _res(ctx, "bench-gpu0.json")


def stage_multi_bench(ctx: Ctx) -> dict:
    if "gpu0" not in _ready(ctx, _fleet(ctx)):
        out: dict = {"skipped": "gpu0 is not ready"}
    else:
        out = _bench_one(ctx, _fleet(ctx), "gpu0", _single_run(ctx), "multi-bench")
    write_json(_res(ctx, "bench.json"), out)
    return out


def _job_prompts(ctx: Ctx, k: int) -> int:
    return ctx.settings.multi_prompts_per_gpu * k


def stage_multi_plan(ctx: Ctx) -> dict:
    """The plan, made before the jobs: each size's job on its own GPU count, and the largest job on
    every size (how the makespan should shrink)."""
    st = ctx.settings
    sizes = fleet_sizes(_n(ctx))
    out: dict = {"sizes": sizes}
    if not _single_run(ctx).exists():
        out["skipped"] = "no bench run of gpu0"
    else:
        out["largest_job"] = _plan(
            ctx,
            "multi-plan",
            [_single_run(ctx)],
            _job_prompts(ctx, sizes[-1]),
            st.output_len,
            ",".join(map(str, sizes)),
        )
    write_json(_res(ctx, "plan.json"), out)
    return out


def _timed_job(ctx: Ctx, name: str, fleet: Path, prompts: int, **kw) -> dict:
    """``_job`` with the generate process's own CPU (it is the only child waited for meanwhile)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = _job(ctx, name, fleet, prompts, _words_for(ctx.settings.input_len), [], bench=_single_run(ctx), **kw)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    user, sys_ = after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime
    out["coordinator_cpu"] = {
        "user_s": round(user, 2),
        "sys_s": round(sys_, 2),
        "wall_s": out.get("seconds"),
        "cores": cpu_share(user, sys_, out.get("seconds") or 0.0),
    }
    return out


def _check(ctx: Ctx, name: str, dest: str) -> dict:
    res = ctx.runner.run(
        name, ctx.sf("plan", "--bench", str(_single_run(ctx)), "--check", dest, "--json"), timeout=300
    )
    return {"rc": res.rc, "summary": check_summary(res.json()), "check": res.json()}


# Seconds of one scale job on the H200: ~30k tok/s per server at 256 out = ~117 prompts/s, plus the ramp.
def _job_estimate(ctx: Ctx, prompts_per_server: int) -> float:
    return 1.0 if ctx.layout.rehearse else prompts_per_server * ctx.settings.output_len / 30_000 + 40


def stage_multi_scale(ctx: Ctx) -> dict:
    """The same workload over 1, 2, 4 (8) servers, each job with ``plan --check`` (written after
    every size, so a command cut short keeps the sizes done)."""
    st, run = ctx.settings, ctx.runner
    n = _n(ctx)
    ready = _ready(ctx, _fleet(ctx))
    done = ((read_json(_res(ctx, "scale.json")) or {}).get("jobs")) or {}
    # a later command resumes: sizes already measured (complete, every prompt once) are kept, not rerun
    out: dict = {"jobs": {k: j for k, j in done.items() if j.get("status") == "complete" and j.get("exactly_once")}}
    if not _single_run(ctx).exists():
        out["skipped"] = "no bench run of gpu0"
    for k in fleet_sizes(n) if not out.get("skipped") else []:
        names = server_names(k)
        if str(k) in out["jobs"]:
            run.say(f"  multi-scale {k}: kept from an earlier command")
            continue
        if not set(names) <= set(ready):
            out["jobs"][str(k)] = {"skipped": f"not all of {names} ready (ready: {ready})"}
            continue
        need = _job_estimate(ctx, st.multi_prompts_per_gpu) + 30
        left = ctx.short_of(need + 60)  # 60 s: summary and collect (multi-a leaves the servers up)
        if left is not None:
            out["jobs"][str(k)] = {"skipped": f"budget: {left:.0f} s left, ~{need:.0f} s needed"}
            continue
        fleet = _fleet(ctx, k)
        fleet.write_text(multi_toml(ctx, names))
        job = _timed_job(ctx, f"multi-gen-{k}", fleet, _job_prompts(ctx, k))
        job["check"] = _check(ctx, f"multi-check-{k}", job["dest"])["summary"] if job.get("dest") else {}
        job.pop("report", None)
        out["jobs"][str(k)] = job
        run.say(
            f"  multi-scale {k}: {job['status']}, {job['output_tokens_per_s']} tok/s, exactly once "
            f"{job['exactly_once']}, makespan error {job['check'].get('makespan_error_pct')} %, coordinator "
            f"{job['coordinator_cpu']['cores']} cores"
        )
        write_json(_res(ctx, "scale.json"), out)
    tps = {k: j.get("output_tokens_per_s") for k, j in out["jobs"].items() if j.get("output_tokens_per_s")}
    if "1" in tps:
        out["speedup"] = {k: round(v / tps["1"], 3) for k, v in tps.items()}
    write_json(_res(ctx, "scale.json"), out)
    return out


def _timeline(dest: str) -> dict | None:
    found = sorted(Path(dest).glob("timeline/*.json"))
    return read_json(found[-1]) if found else None


def _gpu_of_record(ctx: Ctx, server: str) -> dict:
    """The server's process group now (after a restart: the new one) and the CUDA_VISIBLE_DEVICES its
    leader runs with (/proc/PID/environ), so "restarted on its GPU" is read, not assumed."""
    record = read_json(ctx.layout.path("state", MULTI, f"{server}.json")) or {}
    pgid = record.get("pgid")
    out: dict = {"pgid": pgid, "cuda_visible_devices": None}
    try:
        env = Path(f"/proc/{int(pgid)}/environ").read_bytes().split(b"\0") if pgid else []
    except OSError:
        env = []
    for item in env:
        if item.startswith(b"CUDA_VISIBLE_DEVICES="):
            out["cuda_visible_devices"] = item.split(b"=", 1)[1].decode()
    return out


def stage_multi_fault(ctx: Ctx) -> dict:
    """One job over the whole fleet; the last server's process group SIGKILLed multi_kill_after s in.
    The fleet must restart it on its GPU; the dip and recovery come from the job's timeline."""
    st = ctx.settings
    n = _n(ctx)
    victim = server_names(n)[-1]
    if sorted(_ready(ctx, _fleet(ctx))) != sorted(server_names(n)):
        out: dict = {"skipped": "not every server of the fleet is ready"}
        write_json(_res(ctx, "fault.json"), out)
        return out
    killed_at: dict = {}

    def kill() -> dict:
        record = read_json(ctx.layout.path("state", MULTI, f"{victim}.json")) or {}
        if not record.get("pgid"):
            return {"error": f"no process group in {victim}'s record"}
        killed_at["unix"] = time.time()
        os.killpg(int(record["pgid"]), signal.SIGKILL)
        return {"signal": "SIGKILL", "server": victim, "pgid": record["pgid"], "after_s": st.multi_kill_after}

    prompts = st.multi_fault_prompts or 2 * _job_prompts(ctx, n)
    out = _timed_job(ctx, "multi-fault", _fleet(ctx), prompts, fault=kill, fault_after=st.multi_kill_after)
    out.update(_recovery(out.get("events") or [], victim))
    out["restarted_on"] = _gpu_of_record(ctx, victim)
    out["restarts"] = sum((s or {}).get("restarts", 0) for s in (out.get("report") or {}).get("servers") or [])
    out.pop("report", None)
    tl = _timeline(out["dest"]) if out.get("dest") else None
    if tl and killed_at:
        out["dip"] = throughput_dip(tl, killed_at["unix"] - float(tl.get("started") or 0))
        down = ((tl.get("servers") or {}).get(victim) or {}).get("down_s") or []
        out["victim_down_s"] = round(sum(down), 1)
    ctx.runner.say(
        f"  multi-fault: {out['status']}, exactly once {out['exactly_once']}, back in service "
        f"{out['back_in_service']}, dip {(out.get('dip') or {}).get('dip_fraction')}, recovered after "
        f"{(out.get('dip') or {}).get('recovery_s')} s"
    )
    write_json(_res(ctx, "fault.json"), out)
    return out


def stage_multi_down(ctx: Ctx) -> dict:
    return down_stage(ctx, "multi-down", _fleet(ctx), _res(ctx, "down.json"))


# ---- multi-tp -----------------------------------------------------------------------------------------
def _tp_fleet(ctx: Ctx) -> Path:
    return ctx.layout.path("fleet-tp.toml")


def stage_tp_up(ctx: Ctx) -> dict:
    if _fleet(ctx).exists() and _ready(ctx, _fleet(ctx)):
        stage_multi_down(ctx)  # GPUs 0 and 1 must be free
    out = _up(ctx, _tp_fleet(ctx), tp_toml(ctx), "tp-up")
    write_json(_res(ctx, "tp_up.json"), out)
    return out


def _tp_run(ctx: Ctx) -> Path:
    return _res(ctx, "bench-tp2.json")


def stage_tp_bench(ctx: Ctx) -> dict:
    """Bench the TP=2 server; plan 2 GPUs as one TP=2 replica or two single-GPU replicas."""
    st = ctx.settings
    if "tp2" not in _ready(ctx, _tp_fleet(ctx)):
        out: dict = {"skipped": "the TP=2 server is not ready"}
    else:
        out = _bench_one(ctx, _tp_fleet(ctx), "tp2", _tp_run(ctx), "tp-bench")
        if _single_run(ctx).exists() and _tp_run(ctx).exists():
            out["plan"] = _plan(
                ctx, "tp-plan", [_single_run(ctx), Path(f"{_tp_run(ctx)}:2")], _job_prompts(ctx, 2), st.output_len, "2"
            )
            out["plan_rank"] = plan_rank((out["plan"] or {}).get("plan"), "2")
    write_json(_res(ctx, "tp_bench.json"), out)
    return out


def stage_tp_generate(ctx: Ctx) -> dict:
    """The 2-server job's workload on the TP=2 server; ranked against the 2-server job by makespan."""
    if "tp2" not in _ready(ctx, _tp_fleet(ctx)):
        out: dict = {"skipped": "the TP=2 server is not ready"}
        write_json(_res(ctx, "tp_generate.json"), out)
        return out
    out = _job(
        ctx, "tp-gen", _tp_fleet(ctx), _job_prompts(ctx, 2), _words_for(ctx.settings.input_len), [], bench=_tp_run(ctx)
    )
    out.pop("report", None)
    two = ((read_json(_res(ctx, "scale.json")) or {}).get("jobs") or {}).get("2") or {}
    tp_bench = read_json(_res(ctx, "tp_bench.json")) or {}
    measured = {"gpu0": two.get("seconds"), "tp2": out.get("seconds")}  # plan's names: the benched servers
    out["makespan_s"] = measured
    if all(measured.values()):
        out["jobs_rank"] = sorted(measured, key=lambda k: measured[k])
        rank = tp_bench.get("plan_rank") or []
        out["plan_rank"] = rank
        out["plan_ranks_as_jobs"] = [r for r in rank if r in measured] == out["jobs_rank"] if rank else None
    ctx.runner.say(
        f"  tp-generate: {out['status']}, makespans {measured}, plan ranks as the jobs: "
        f"{out.get('plan_ranks_as_jobs')}"
    )
    write_json(_res(ctx, "tp_generate.json"), out)
    return out


def stage_tp_down(ctx: Ctx) -> dict:
    return down_stage(ctx, "tp-down", _tp_fleet(ctx), _res(ctx, "tp_down.json"))


# ---- the results in one file -----------------------------------------------------------------------
def stage_multi_summary(ctx: Ctx) -> dict:
    """results/multi/summary.json and summary.md: the figures of the issue, from the stages' JSON."""
    up, scale = read_json(_res(ctx, "up.json")) or {}, read_json(_res(ctx, "scale.json")) or {}
    fault, tp = read_json(_res(ctx, "fault.json")) or {}, read_json(_res(ctx, "tp_generate.json")) or {}
    out = {
        "rehearsal": ctx.layout.rehearse,
        "gpus": up.get("gpus"),
        "time_to_ready_s": up.get("time_to_ready_s"),
        "fleet_ready_s": up.get("fleet_ready_s"),
        "up_wall_s": up.get("wall_s"),
        "scale": {
            k: {
                "prompts": j.get("prompts"),
                "output_tokens_per_s": j.get("output_tokens_per_s"),
                "seconds": j.get("seconds"),
                "exactly_once": j.get("exactly_once"),
                "makespan_error_pct": (j.get("check") or {}).get("makespan_error_pct"),
                "within_tolerance": (j.get("check") or {}).get("within_tolerance"),
                "coordinator_cores": (j.get("coordinator_cpu") or {}).get("cores"),
                "skipped": j.get("skipped"),
            }
            for k, j in (scale.get("jobs") or {}).items()
        },
        "speedup": scale.get("speedup"),
        "fault": {
            k: fault.get(k)
            for k in (
                "status",
                "exactly_once",
                "duplicates",
                "restarts",
                "back_in_service",
                "victim_down_s",
                "restarted_on",
                "skipped",
            )
        }
        | {k: (fault.get("dip") or {}).get(k) for k in ("rate_before", "min_after", "dip_fraction", "recovery_s")},
        "tp": {k: tp.get(k) for k in ("makespan_s", "jobs_rank", "plan_rank", "plan_ranks_as_jobs", "skipped")},
    }
    lines = [
        f"# Several GPUs (issue 18){' — CPU rehearsal (sim)' if out['rehearsal'] else ''}",
        "",
        f"{out['gpus']} servers; fleet ready in {out['fleet_ready_s']} s (up wall {out['up_wall_s']} s); "
        f"per server: {out['time_to_ready_s']}",
        "",
        "| servers | prompts | tok/s | speedup | wall s | exactly once | makespan error % | coordinator cores |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for k, j in out["scale"].items():
        lines.append(
            f"| {k} | {j['prompts']} | {j['output_tokens_per_s']} | {(out['speedup'] or {}).get(k)} | "
            f"{j['seconds']} | {j['exactly_once']} | {j['makespan_error_pct']} | {j['coordinator_cores']} |"
            if not j.get("skipped")
            else f"| {k} | skipped: {j['skipped']} ||||||"
        )
    f = out["fault"]
    lines += [
        "",
        f"Fault: {f['status']}, exactly once {f['exactly_once']}, restarts {f['restarts']}, back in service "
        f"{f['back_in_service']}; rate {f['rate_before']} -> min {f['min_after']} tok/s (dip {f['dip_fraction']}), "
        f"recovered after {f['recovery_s']} s",
        "",
        f"TP=2 vs 2 replicas: makespans {out['tp']['makespan_s']}; jobs rank {out['tp']['jobs_rank']}, "
        f"plan ranks {out['tp']['plan_rank']}: same order {out['tp']['plan_ranks_as_jobs']}",
    ]
    write_json(_res(ctx, "summary.json"), out)
    _res(ctx, "summary.md").write_text("\n".join(lines) + "\n")
    out_dir = Path(ctx.layout.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in ("summary.json", "summary.md"):
        (out_dir / f"multi_{name}").write_text(_res(ctx, name).read_text())
    return out


STAGES_MULTI = {
    "multi-up": stage_multi_up,
    "multi-bench": stage_multi_bench,
    "multi-plan": stage_multi_plan,
    "multi-scale": stage_multi_scale,
    "multi-fault": stage_multi_fault,
    "multi-down": stage_multi_down,
    "tp-up": stage_tp_up,
    "tp-bench": stage_tp_bench,
    "tp-generate": stage_tp_generate,
    "tp-down": stage_tp_down,
    "multi-summary": stage_multi_summary,
}

# One device command is at most 10 minutes: multi-a and multi-b are ``multi`` in two (multi-b's
# multi-scale resumes the sizes multi-a's budget left out); ``multi`` whole is for the rehearsal.
GROUPS_MULTI = {
    "multi": (
        "setup",
        "multi-up",
        "multi-bench",
        "multi-plan",
        "multi-scale",
        "multi-fault",
        "multi-down",
        "multi-summary",
        "collect",
    ),
    "multi-a": ("setup", "multi-up", "multi-bench", "multi-plan", "multi-scale", "multi-summary", "collect"),
    "multi-b": ("multi-scale", "multi-fault", "multi-down", "multi-summary", "collect"),
    "multi-tp": ("setup", "tp-up", "tp-bench", "tp-generate", "tp-down", "multi-summary", "collect"),
}


def estimates_multi(st) -> dict[str, float]:
    """Seconds on H200s (run 2's figures: a cold start ~105 s, ~30k tok/s per server non-streaming)."""
    per_job = st.multi_prompts_per_gpu * st.output_len / 30_000 + 40
    points = len(st.multi_levels()) * (st.multi_point_seconds + 20) + 30
    return {
        "multi-up": 240.0,
        "multi-bench": points,
        "multi-plan": 15.0,
        "multi-scale": per_job + 60,  # one size at least; the stage checks the budget before each size
        "multi-fault": 2 * per_job + 120,
        "multi-down": 30.0,
        "tp-up": 240.0,
        "tp-bench": points,
        "tp-generate": 2 * per_job,
        "tp-down": 20.0,
        "multi-summary": 5.0,
    }
