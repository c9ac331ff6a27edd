"""The second GPU run (issue 17, step 2): stages that the driver runs as the groups ``run2a`` and
``run2b`` (h200.py), each one device command.

run2a: one plain vLLM server given the whole GPU (up-whole), bench in the job's mode (non-streaming)
       to find its best point, plan (902,087 x 1,800 and the job size), generate of >= 20,000 prompts of
       the same workload on that server, ``plan --check`` of that job, then the streaming bench beside
       ``vllm bench serve`` (same concurrency and request count), down.
run2b: the two servers sharing GPU 0 (plain, ngram) through ONE ``servefleet up`` (servefleet orders
       them; no driver stagger), one short non-streaming point per server (bench-shared), ONE generate
       job with ngram SIGKILLed mid-job and then plain's EngineCore SIGSTOPped (faults: each must be
       taken out, restarted through the fleet and back in service, every prompt exactly once), the real
       failures, down. generate-kill and hang are the same two faults as separate jobs (no group).

Each stage writes results/<stage>.json. Standard library only, like the rest of the driver.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import time
from collections.abc import Callable
from pathlib import Path

from h200_exec import answers_health
from h200_generate import count_answers, generate_argv, wait_until_sending
from h200_layout import JOB_OUTPUT_TOKENS, JOB_PROMPTS, PLAN_GPUS, fleet_toml, whole_toml
from h200_stages import (
    Ctx,
    _bench_common,
    _keep_ready_logs,
    _server_log_facts,
    ab_point,
    down,
    down_stage,
    read_json,
    write_json,
)

__all__ = [
    "STAGES2",
    "ESTIMATES2",
    "engine_core_pids",
    "api_server_pids",
    "same_workload_prompts",
    "check_summary",
    "start_order",
]

WHOLE = "whole"


# ---- helpers ----------------------------------------------------------------------------------------
def _status(ctx: Ctx, fleet: Path) -> dict:
    return (
        ctx.runner.run(
            f"status-{fleet.stem}", ctx.sf("status", "--fleet", str(fleet), "--json"), timeout=120, quiet=True
        ).json()
        or {}
    )


def _ready(ctx: Ctx, fleet: Path) -> list[str]:
    if not fleet.exists():
        return []
    return [s["name"] for s in _status(ctx, fleet).get("servers", []) if s.get("state") == "ready"]


def _up(ctx: Ctx, fleet: Path, text: str, name: str) -> dict:
    """One ``servefleet up`` of the whole fleet file (servefleet itself orders servers sharing a GPU),
    then ``status`` and each server's own log facts beside it."""
    st, run = ctx.settings, ctx.runner
    fleet.write_text(text)
    limit = ctx.cap(st.up_timeout, reserve=120.0)
    t0 = time.monotonic()
    res = run.run(name, ctx.sf("up", str(fleet), "--timeout", f"{limit:.0f}", "--json"), timeout=limit + 90)
    out: dict = {"fleet_file": text, "rc": res.rc, "wall_s": round(time.monotonic() - t0, 1), "up": res.json()}
    servers = {}
    for entry in _status(ctx, fleet).get("servers", []):
        servers[entry.get("name")] = {
            "state": entry.get("state"),
            "category": entry.get("category"),
            "time_to_ready_s": entry.get("time_to_ready_s"),
            "capacity": entry.get("capacity"),
            "base_url": entry.get("base_url"),
            "log_path": entry.get("log_path"),
            "server_log": _server_log_facts(Path(entry.get("log_path") or "/nonexistent")),
        }
    for entry in (out["up"] or {}).get("servers", []):
        if entry.get("name") in servers:
            servers[entry["name"]]["up_verdict"] = entry.get("verdict")
    out["servers"] = servers
    out["ready"] = sorted(n for n, s in servers.items() if s["state"] == "ready")
    _keep_ready_logs(ctx, servers)
    return out


STAMP = re.compile(r"(\d\d-\d\d \d\d:\d\d:\d\d)")
SETTLED = re.compile(r"KV cache size:|Graph capturing finished|Application startup complete")


def _stamps(log: Path) -> tuple[str | None, str | None]:
    """(first time stamp, time stamp of the line where the engine's memory settled) of a vLLM log."""
    first = settled = None
    latest = None
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return None, None
    for line in lines:
        m = STAMP.search(line)
        if m:
            latest = m.group(1)
            first = first or latest
        if settled is None and latest and "Graph capturing finished" in line:
            settled = latest
    if settled is None:  # enforce-eager or the sim: the KV-cache line, else readiness
        for line in lines:
            m = STAMP.search(line)
            latest = m.group(1) if m else latest
            if latest and SETTLED.search(line):
                settled = latest
                break
    return first, settled


def start_order(first_log: Path, second_log: Path) -> dict:
    """Did the second server start only after the first one's memory settled? From both logs' stamps
    (whole seconds): ``ordered`` is True when the second's first line is not before the first's
    settling line."""
    f_first, f_settled = _stamps(first_log)
    s_first, _ = _stamps(second_log)
    out = {"first_log_start": f_first, "first_settled": f_settled, "second_log_start": s_first, "ordered": None}
    if f_settled and s_first:
        out["ordered"] = s_first >= f_settled  # same MM-DD HH:MM:SS format: string order is time order
    return out


def same_workload_prompts(path: Path, n: int, max_tokens: int, words: int, seed: int = 0) -> None:
    """N completion prompts of ``words`` distinct-ish tokens each (w0..w996: one BPE token or two per
    word), ``ignore_eos`` so every answer is ``max_tokens`` long, as in the bench."""
    rng = random.Random(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        for i in range(n):
            prompt = " ".join(f"w{rng.randrange(997)}" for _ in range(words))
            fh.write(
                json.dumps({"id": f"p{i:06d}", "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True}) + "\n"
            )


def _proc_table() -> dict[int, tuple[int, int, str, str]]:
    """pid -> (ppid, pgid, comm, cmdline) of every process (Linux /proc)."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        rparen = stat.rfind(")")
        comm = stat[stat.find("(") + 1 : rparen]
        fields = stat[rparen + 2 :].split()
        table[int(entry)] = (int(fields[1]), int(fields[2]), comm, cmd)
    return table


def engine_core_pids(pgid: int, table: dict[int, tuple[int, int, str, str]] | None = None) -> tuple[list[int], str]:
    """The engine-core process(es) of a vLLM server whose process group is ``pgid``, and how they
    were found: by vLLM's process title (``VLLM::EngineCore_DP0``; ``comm`` holds its first 15
    characters), else the children of the API server (the group leader is servefleet's ``sh``
    wrapper, the API server its child) other than multiprocessing's resource tracker. Empty when the
    API server has no child (the sim: one process)."""
    table = _proc_table() if table is None else table
    group = {pid: row for pid, row in table.items() if row[1] == pgid}
    named = [pid for pid, (_, _, comm, cmd) in group.items() if "EngineCor" in comm or "EngineCore" in cmd]
    if named:
        return sorted(named), "process title EngineCore"
    api = {pid for pid, row in group.items() if row[0] == pgid} or {pgid}
    children = [pid for pid, (ppid, _, _, cmd) in group.items() if ppid in api and "resource_tracker" not in cmd]
    if children:
        return sorted(children), "child of the API server"
    return [], "no child process"


def api_server_pids(pgid: int, table: dict[int, tuple[int, int, str, str]] | None = None) -> list[int]:
    """The processes servefleet's wrapper started (its children in the group): the API server."""
    table = _proc_table() if table is None else table
    return sorted(pid for pid, row in table.items() if row[1] == pgid and row[0] == pgid)


def _job(
    ctx: Ctx,
    name: str,
    fleet: Path | str,
    prompts: int,
    words: int,
    extra: list[str],
    fault: Callable[[], dict] | None = None,
    fault_after: float = 0.0,
    bench: Path | None = None,
    holder: dict | None = None,
) -> dict:
    """``servefleet generate`` over a fleet (or one server's URL: a str), optionally with ``fault()``
    called ``fault_after`` s in; counts the ids of the JSONL shards (every prompt exactly once)."""
    lay, st, run = ctx.layout, ctx.settings, ctx.runner
    gen = lay.path("jobs", name)
    src, dest = gen / "prompts.jsonl", gen / f"out-{int(time.time())}"
    same_workload_prompts(src, prompts, st.output_len, words)
    target = ["--url", fleet] if isinstance(fleet, str) else ["--fleet", str(fleet)]
    with_bench = ["--bench", str(bench)] if bench is not None and bench.exists() else []
    argv = generate_argv(ctx.sf(), src, dest, target, [*extra, *with_bench])
    out: dict = {
        "prompts": prompts,
        "words_per_prompt": words,
        "max_tokens": st.output_len,
        "dest": str(dest),
        "argv": argv,
    }
    job = run.start(name, argv)
    if holder is not None:
        holder["job"] = job
    if fault is not None:
        wait_until_sending(job, dest, fault_after)
        out["fault"] = fault() if job.proc.poll() is None else {"skipped": "the job ended before the fault"}
        run.say(f"  {name}: fault {out['fault']}")
    res = job.finish(timeout=ctx.cap(st.generate_timeout, reserve=60.0))
    report = res.json() or {}
    ids = count_answers(dest)
    events = report.get("events") or []
    out.update(
        {
            "rc": res.rc,
            "timed_out": res.timed_out,
            "seconds": round(res.seconds, 1),
            "report": report,
            "status": report.get("status"),
            "output_tokens_per_s": report.get("output_tokens_per_s"),
            "unique_ids": len(ids),
            "duplicates": sum(c - 1 for c in ids.values() if c > 1),
            "exactly_once": len(ids) == prompts and all(c == 1 for c in ids.values()),
            "events": events,
        }
    )
    return out


def _event_text(e: object) -> str:
    return e if isinstance(e, str) else json.dumps(e)


# ---- run2a ------------------------------------------------------------------------------------------
def stage_up_whole(ctx: Ctx) -> dict:
    lay = ctx.layout
    down(ctx, "down-shared-first", lay.main_fleet)  # the whole GPU: the shared servers go down first
    out = _up(ctx, lay.whole_fleet, whole_toml(lay, ctx.settings), "up-whole")
    write_json(lay.results / "up_whole.json", out)
    return out


def _nostream_run(lay) -> Path:
    return lay.results / "bench2" / "nostream-whole.json"


def stage_bench_nostream(ctx: Ctx) -> dict:
    """``servefleet bench`` in the job's mode (non-streaming, the default) on the whole-GPU server."""
    lay, st, run = ctx.layout, ctx.settings, ctx.runner
    out: dict = {"server": WHOLE}
    if WHOLE not in _ready(ctx, lay.whole_fleet):
        out["skipped"] = "the whole-GPU server is not ready"
        write_json(lay.results / "bench_nostream.json", out)
        return out
    path = _nostream_run(lay)
    path.parent.mkdir(parents=True, exist_ok=True)
    levels = st.nostream_levels()
    res = run.run(
        "bench-nostream",
        ctx.sf(
            "bench",
            "--fleet",
            str(lay.whole_fleet),
            "--servers",
            WHOLE,
            "-c",
            st.nostream_concurrency,
            "--duration",
            str(st.nostream_point_seconds),
            "--no-stream",
            *_bench_common(ctx),
            "--out",
            str(path),
            "--json",
        ),
        timeout=ctx.cap(len(levels) * (st.nostream_point_seconds + 45) + 90, reserve=60.0),
    )
    if not path.exists():  # a fleet run may name its file after the server
        alt = sorted(path.parent.glob("nostream-whole*.json"))
        if alt:
            alt[0].replace(path)
    doc = read_json(path) or {}
    out.update(
        {
            "rc": res.rc,
            "seconds": round(res.seconds, 1),
            "run": str(path) if doc else None,
            "points": [
                {
                    "concurrency": p.get("concurrency"),
                    "output_tokens_per_s": p.get("output_tokens_per_s"),
                    "duration_s": p.get("duration_s"),
                    "errors": p.get("errors"),
                    "client_bound": p.get("client_bound"),
                }
                for p in doc.get("points") or []
            ],
        }
    )
    best = max(out["points"], key=lambda p: p.get("output_tokens_per_s") or 0, default=None)
    out["best"] = best
    write_json(lay.results / "bench_nostream.json", out)
    return out


def _plan(
    ctx: Ctx, name: str, runs: list[Path], prompts: int, tokens: float, gpus: str, plot: Path | None = None
) -> dict:
    args: list[str] = []
    for p in runs:
        args += ["--bench", str(p)]
    if plot is not None:
        args += ["--plot", str(plot)]
    res = ctx.runner.run(
        name,
        ctx.sf(
            "plan", *args, "--prompts", str(prompts), "--output-tokens-mean", str(tokens), "--gpus", gpus, "--json"
        ),
        timeout=300,
    )
    return {"rc": res.rc, "plan": res.json(), "stderr": res.stderr_tail[-800:] if res.rc else None}


def stage_plan2(ctx: Ctx) -> dict:
    """Plans from the non-streaming run: the real job (902,087 x 1,800 on 1, 8, 64 GPUs) and the
    job this run sends next (whole_prompts x output_len on 1 GPU), made before that job."""
    lay, st = ctx.layout, ctx.settings
    run_path = _nostream_run(lay)
    out: dict = {}
    if not run_path.exists():
        out["skipped"] = "no non-streaming bench run"
    else:
        out["job"] = _plan(
            ctx,
            "plan-job",
            [run_path],
            JOB_PROMPTS,
            JOB_OUTPUT_TOKENS,
            PLAN_GPUS,
            lay.results / "plan2" / "plan-job.png",
        )
        out["whole_job"] = _plan(ctx, "plan-whole-job", [run_path], st.whole_prompts, st.output_len, "1")
    write_json(lay.results / "plan2.json", out)
    return out


def stage_generate_whole(ctx: Ctx) -> dict:
    """generate of whole_prompts on the whole-GPU server, the bench's workload (~input_len tokens in,
    output_len out, ignore_eos), starting at the bench's best point (--bench)."""
    lay, st = ctx.layout, ctx.settings
    if WHOLE not in _ready(ctx, lay.whole_fleet):
        out = {"skipped": "the whole-GPU server is not ready"}
    else:
        out = _job(
            ctx,
            "generate-whole",
            lay.whole_fleet,
            st.whole_prompts,
            _words_for(st.input_len),
            [],
            bench=_nostream_run(lay),
        )
        best = ((read_json(lay.results / "bench_nostream.json") or {}).get("best") or {}).get("output_tokens_per_s")
        out["bench_best_tok_s"] = best
        tps = out.get("output_tokens_per_s")
        out["fraction_of_bench_best"] = round(tps / best, 3) if tps and best else None
        ctx.runner.say(
            f"  generate-whole: {out['status']}, {out['unique_ids']} ids, {tps} tok/s = "
            f"{out['fraction_of_bench_best']} of the bench's best ({best})"
        )
    write_json(lay.results / "generate_whole.json", out)
    return out


def _words_for(tokens: int) -> int:
    """Words of w0..w996 per prompt for about ``tokens`` prompt tokens: the tokenizer trained on the
    machine splits most into two tokens (measured on the first run: 93 words gave ~256 tokens with the
    report's prompt_tokens; the rehearsal's sim counts one token per word or so)."""
    return max(1, round(tokens * 93 / 256))


def check_summary(doc: dict | None) -> dict:
    """The figures of ``plan --check --json`` the issue asks about: the makespan's error (target within
    10 %), the configuration and concurrency checked, and the verdict line."""
    if not isinstance(doc, dict) or not isinstance(doc.get("metrics"), dict):
        return {}
    span = doc["metrics"].get("makespan_s") or {}
    tps = doc["metrics"].get("output_tps_per_server") or {}
    return {
        "configuration": doc.get("configuration"),
        "concurrency": doc.get("concurrency"),
        "makespan_predicted_s": span.get("predicted"),
        "makespan_measured_s": span.get("measured"),
        "makespan_error_pct": span.get("error_pct"),
        "tps_predicted": tps.get("predicted"),
        "tps_measured": tps.get("measured"),
        "within_tolerance": doc.get("within_tolerance"),
        "verdict": doc.get("verdict"),
    }


def stage_plan_check(ctx: Ctx) -> dict:
    lay = ctx.layout
    gen = read_json(lay.results / "generate_whole.json") or {}
    out: dict = {}
    if not gen.get("dest") or not _nostream_run(lay).exists():
        out["skipped"] = "no generate job or no bench run"
    else:
        res = ctx.runner.run(
            "plan-check-whole",
            ctx.sf("plan", "--bench", str(_nostream_run(lay)), "--check", gen["dest"], "--json"),
            timeout=300,
        )
        out = {
            "rc": res.rc,
            "check": res.json(),
            "summary": check_summary(res.json()),
            "stderr": res.stderr_tail[-800:] if res.rc else None,
        }
    write_json(lay.results / "plan_check.json", out)
    return out


AB2_LEVEL_S = 90.0  # one streaming A/B level: 8 waves of 256-token answers at ~19k tok/s each side, + vLLM's import


def stage_ab_stream(ctx: Ctx) -> dict:
    """Streaming: servefleet bench and ``vllm bench serve`` on the whole-GPU server at the same
    concurrency and request count, back to back (rehearsal: the servefleet half only)."""
    st = ctx.settings
    return _ab_stream(
        ctx, ctx.layout.whole_fleet, WHOLE, "ab_stream", st.ab_stream_levels(), lambda c: c * st.ab_stream_waves
    )


def stage_ab_stream_shared(ctx: Ctx) -> dict:
    """The same A/B on the shared plain server (ngram idle beside it), at the first run's levels
    (256 and 64), each with at least ``ab_min_requests`` requests so that start and tail weigh little."""
    st = ctx.settings
    return _ab_stream(
        ctx,
        ctx.layout.main_fleet,
        "plain",
        "ab_stream_shared",
        st.ab_shared_levels(),
        lambda c: max(c * st.ab_stream_waves, st.ab_min_requests),
    )


def _ab_stream(
    ctx: Ctx, fleet: Path, server: str, stem: str, levels: list[int], requests_at: Callable[[int], int]
) -> dict:
    lay, run = ctx.layout, ctx.runner
    out: dict = {"server": server, "points": []}
    if server not in _ready(ctx, fleet):
        out["skipped"] = f"the {server} server is not ready"
        write_json(lay.results / f"{stem}.json", out)
        return out
    folder = lay.results / stem.replace("_", "-")
    folder.mkdir(parents=True, exist_ok=True)
    for c in levels:
        n = requests_at(c)
        point: dict = {"concurrency": c, "requests": n}
        left = ctx.short_of(AB2_LEVEL_S + 30)
        if left is not None:
            point["skipped"] = f"budget: {left:.0f} s left"
            out["points"].append(point)
            continue
        point.update(ab_point(ctx, server, c, n, folder, stem))
        run.say(f"  {stem} C={c} n={n}: ratio span {point['ratio_span']}, steady {point['ratio_steady']}")
        out["points"].append(point)
        write_json(lay.results / f"{stem}.json", out)
    write_json(lay.results / f"{stem}.json", out)
    return out


def stage_down_whole(ctx: Ctx) -> dict:
    return down_stage(ctx, "down-whole", ctx.layout.whole_fleet, ctx.layout.results / "down_whole.json")


# ---- run2b ------------------------------------------------------------------------------------------
def stage_up_shared(ctx: Ctx) -> dict:
    """plain and ngram on GPU 0 through one ``servefleet up``: servefleet must start ngram only after
    plain's memory has settled (checked from both logs' time stamps)."""
    lay = ctx.layout
    if lay.whole_fleet.exists() and _ready(ctx, lay.whole_fleet):
        stage_down_whole(ctx)
    out = _up(ctx, lay.main_fleet, fleet_toml(lay, ctx.settings), "up-shared")
    out["start_order"] = start_order(lay.log_of("main", "plain"), lay.log_of("main", "ngram"))
    ctx.runner.say(f"  up-shared: ready {out['ready']}; order {out['start_order']}")
    write_json(lay.results / "up_shared.json", out)
    return out


def stage_bench_shared(ctx: Ctx) -> dict:
    """A short non-streaming point (C = max running) on each shared server, so that the plan can rank
    plain against ngram in the job's mode before the jobs run on them."""
    lay, st, run = ctx.layout, ctx.settings, ctx.runner
    names = [n for n in ("plain", "ngram") if n in _ready(ctx, lay.main_fleet)]
    out: dict = {"servers": names}
    if not names:
        out["skipped"] = "no shared server is ready"
    else:
        folder = lay.results / "bench2"
        folder.mkdir(parents=True, exist_ok=True)
        res = run.run(
            "bench-shared",
            ctx.sf(
                "bench",
                "--fleet",
                str(lay.main_fleet),
                "--servers",
                ",".join(names),
                "-c",
                str(st.max_num_seqs),
                "--duration",
                str(st.shared_point_seconds),
                "--no-stream",
                *_bench_common(ctx),
                "--out",
                str(folder / "shared.json"),
                "--json",
            ),
            timeout=ctx.cap(len(names) * (st.shared_point_seconds + 45) + 60),
        )
        runs = {n: folder / f"shared-{n}.json" for n in names if (folder / f"shared-{n}.json").exists()}
        out.update(
            {
                "rc": res.rc,
                "seconds": round(res.seconds, 1),
                "runs": {n: str(p) for n, p in runs.items()},
                "points": {
                    n: [
                        (q.get("concurrency"), q.get("output_tokens_per_s"))
                        for q in (read_json(p) or {}).get("points") or []
                    ]
                    for n, p in runs.items()
                },
            }
        )
        if runs:
            out["plan_job"] = _plan(ctx, "plan-shared-job", list(runs.values()), JOB_PROMPTS, JOB_OUTPUT_TOKENS, "1")
    write_json(lay.results / "bench_shared.json", out)
    return out


def _pgid(ctx: Ctx, server: str) -> int | None:
    record = read_json(ctx.layout.path("state", "main", f"{server}.json")) or {}
    return int(record["pgid"]) if record.get("pgid") else None


def _stop_engine_core(ctx: Ctx, pgid: int, stopped: list[int]) -> tuple[list[int], str]:
    """SIGSTOP the EngineCore of the server whose process group is ``pgid`` (the rehearsal's sim has
    none: its own process); the pids stopped join ``stopped``, and how they were found is returned."""
    pids, how = engine_core_pids(pgid)
    if not pids and ctx.layout.rehearse:
        pids, how = api_server_pids(pgid), "rehearsal: the sim's own process (it has no engine core)"
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
        stopped.append(pid)
    return pids, how


def _resume(stopped: list[int]) -> None:
    """SIGCONT what is left of ``stopped`` (a restart that failed leaves it): down's signals must reach it."""
    for pid in stopped:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass


def stage_generate_kill(ctx: Ctx) -> dict:
    """generate over both shared servers; ngram's whole process group SIGKILLed kill_after s in."""
    lay, st = ctx.layout, ctx.settings
    if set(_ready(ctx, lay.main_fleet)) != {"plain", "ngram"}:
        out: dict = {"skipped": "both shared servers must be ready"}
    else:

        def kill() -> dict:
            pgid = _pgid(ctx, "ngram")
            if not pgid:
                return {"error": "no process group in ngram's record"}
            os.killpg(pgid, signal.SIGKILL)
            return {"signal": "SIGKILL", "server": "ngram", "pgid": pgid, "after_s": st.kill_after}

        out = _job(
            ctx,
            "generate-kill",
            lay.main_fleet,
            st.kill_prompts,
            _words_for(st.input_len),
            [],
            fault=kill,
            fault_after=st.kill_after,
        )
        out.update(_recovery(out.get("events") or [], "ngram"))
        ctx.runner.say(
            f"  generate-kill: {out['status']}, exactly once {out['exactly_once']}, "
            f"back in service {out['back_in_service']}"
        )
    write_json(lay.results / "generate_kill.json", out)
    return out


def _recovery(events: list, server: str) -> dict:
    texts = [_event_text(e) for e in events]
    mine = [t for t in texts if f"{server}:" in t or f"'{server}'" in t or f'"{server}"' in t]
    return {
        "taken_out": next((t for t in mine if "taken out" in t), None),
        "restarting": next((t for t in mine if "restart" in t), None),
        "back_in_service": any("back in service" in t for t in mine),
        "server_events": mine[:20],
    }


def stage_hang(ctx: Ctx) -> dict:
    """generate over both shared servers; plain's EngineCore process SIGSTOPped hang_stop_after s in
    (its API server keeps answering /health): generate must see no progress, take plain out, restart
    it through the fleet, and finish. The rehearsal's sim has no engine-core child: the whole sim
    process is stopped there (then its probes fail too)."""
    lay, st = ctx.layout, ctx.settings
    stopped: list[int] = []
    if set(_ready(ctx, lay.main_fleet)) != {"plain", "ngram"}:
        out: dict = {"skipped": "both shared servers must be ready"}
    else:

        def stop() -> dict:
            pgid = _pgid(ctx, "plain")
            if not pgid:
                return {"error": "no process group in plain's record"}
            pids, how = _stop_engine_core(ctx, pgid, stopped)
            return {
                "signal": "SIGSTOP",
                "server": "plain",
                "pgid": pgid,
                "pids": pids,
                "found_by": how,
                "after_s": st.hang_stop_after,
            }

        out = _job(
            ctx,
            "generate-hang",
            lay.main_fleet,
            st.hang_prompts,
            _words_for(st.input_len),
            ["--hang-after", str(st.hang_after)],
            fault=stop,
            fault_after=st.hang_stop_after,
        )
        out.update(_recovery(out.get("events") or [], "plain"))
        out["detected_as_hang"] = bool(out.get("taken_out") and "hung" in out["taken_out"])
        ctx.runner.say(
            f"  hang: {out['status']}, detected as hang {out['detected_as_hang']}, "
            f"back in service {out['back_in_service']}, exactly once {out['exactly_once']}"
        )
    _resume(stopped)
    write_json(lay.results / "hang.json", out)
    return out


def stage_faults(ctx: Ctx) -> dict:
    """Both faults in ONE job over the shared fleet (it saves a job's worth of device time): ngram's
    process group SIGKILLed kill_after s in; once ngram answers /health again (restarted by the
    fleet), plain's EngineCore SIGSTOPped (a hang behind a live API server). The job must take each
    out, restart it through the fleet, put it back, and answer every prompt exactly once."""
    lay, st, run = ctx.layout, ctx.settings, ctx.runner
    stopped: list[int] = []
    if set(_ready(ctx, lay.main_fleet)) != {"plain", "ngram"}:
        out: dict = {"skipped": "both shared servers must be ready"}
        write_json(lay.results / "faults.json", out)
        return out
    t_job = time.monotonic()

    def faults() -> dict:
        done: dict = {}
        pgid = _pgid(ctx, "ngram")
        if not pgid:
            return {"error": "no process group in ngram's record"}
        os.killpg(pgid, signal.SIGKILL)
        done["kill"] = {
            "signal": "SIGKILL",
            "server": "ngram",
            "pgid": pgid,
            "at_s": round(time.monotonic() - t_job, 1),
        }
        run.say(f"  faults: SIGKILL to ngram's process group {pgid}")
        deadline = time.monotonic() + st.generate_timeout
        time.sleep(2.0)
        while time.monotonic() < deadline and job_alive() and not answers_health(lay.url("ngram")):
            time.sleep(1.0)
        done["ngram_answers_health_at_s"] = round(time.monotonic() - t_job, 1)
        if not job_alive():
            done["stop"] = {"skipped": "the job ended before ngram came back"}
            return done
        time.sleep(st.hang_gap)  # let the job put ngram back in service first
        pgid = _pgid(ctx, "plain")
        pids, how = _stop_engine_core(ctx, pgid, stopped) if pgid else ([], "no record")
        done["stop"] = {
            "signal": "SIGSTOP",
            "server": "plain",
            "pgid": pgid,
            "pids": pids,
            "found_by": how,
            "at_s": round(time.monotonic() - t_job, 1),
        }
        run.say(f"  faults: SIGSTOP to plain's {pids} ({how})")
        return done

    holder: dict = {}

    def job_alive() -> bool:
        return holder["job"].proc.poll() is None

    out = _job(
        ctx,
        "generate-faults",
        lay.main_fleet,
        st.faults_prompts,
        _words_for(st.input_len),
        ["--hang-after", str(st.hang_after)],
        fault=faults,
        fault_after=st.kill_after,
        holder=holder,
    )
    events = out.get("events") or []
    out["ngram"] = _recovery(events, "ngram")
    out["plain"] = _recovery(events, "plain")
    out["hang_detected"] = bool(out["plain"].get("taken_out") and "hung" in out["plain"]["taken_out"])
    run.say(
        f"  faults: {out['status']}, exactly once {out['exactly_once']}; ngram back {out['ngram']['back_in_service']}; "
        f"plain hang detected {out['hang_detected']}, back {out['plain']['back_in_service']}"
    )
    _resume(stopped)
    write_json(lay.results / "faults.json", out)
    return out


STAGES2 = {
    "up-whole": stage_up_whole,
    "bench-nostream": stage_bench_nostream,
    "plan2": stage_plan2,
    "generate-whole": stage_generate_whole,
    "plan-check": stage_plan_check,
    "ab-stream": stage_ab_stream,
    "ab-stream-shared": stage_ab_stream_shared,
    "down-whole": stage_down_whole,
    "up-shared": stage_up_shared,
    "bench-shared": stage_bench_shared,
    "generate-kill": stage_generate_kill,
    "hang": stage_hang,
    "faults": stage_faults,
}

# Seconds on the H200 (run 1's figures: a start ~105 s cold / ~50 s warm, ~30k tok/s for one server
# without streaming, ~56k tok/s over both shared servers).
ESTIMATES2 = {
    "up-whole": 150.0,
    "bench-nostream": 110.0,
    "plan2": 15.0,
    "generate-whole": 200.0,
    "plan-check": 10.0,
    "ab-stream": AB2_LEVEL_S,
    "ab-stream-shared": AB2_LEVEL_S,
    "down-whole": 20.0,
    "up-shared": 200.0,
    "bench-shared": 70.0,
    "generate-kill": 170.0,
    "hang": 150.0,
    "faults": 280.0,
}

GROUPS = {
    "run2a": (
        "setup",
        "up-whole",
        "bench-nostream",
        "plan2",
        "generate-whole",
        "plan-check",
        "ab-stream",
        "down-whole",
        "collect",
    ),
    "run2b": ("setup", "up-shared", "bench-shared", "faults", "failures", "down", "collect"),
    # what run2b's budget left out, in two commands on one machine: the shared servers stay up between them
    "run2c": ("setup", "up-shared", "bench-shared", "ab-stream-shared", "failures", "collect"),
    "run2d": ("setup", "up-shared", "rank-jobs", "faults", "down", "collect"),
}
