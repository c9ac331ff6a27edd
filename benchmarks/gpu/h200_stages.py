"""The stages of the H200 run except the failures (h200_failures): setup, up, bench, vllm-bench,
plan, down. Each writes what it found to results/<stage>.json and returns that dict.

Everything goes through servefleet's own command line with --json (the point is to prove the tool,
not a library call), except installing and ``vllm bench serve``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from h200_exec import T0, Runner, wait_for_line
from h200_layout import (
    JOB_OUTPUT_TOKENS,
    JOB_PROMPTS,
    PLAN_GPUS,
    Layout,
    Settings,
    fleet_toml,
    servefleet_argv,
    vllm_bench_argv,
)
from stages import seconds_left, short_of

__all__ = [
    "Ctx",
    "stage_setup",
    "stage_up",
    "stage_bench",
    "stage_vllm_bench",
    "stage_plan",
    "stage_down",
    "down",
    "down_stage",
    "write_json",
    "read_json",
]

KV_LINE = r"KV cache size:|Maximum concurrency for|Application startup complete"
VLLM_TS = re.compile(r"^(?:\(\w+ pid=\d+\) )?(?:INFO|WARNING|ERROR|DEBUG) (\d\d-\d\d \d\d:\d\d:\d\d)")


@dataclass
class Ctx:
    layout: Layout
    settings: Settings
    runner: Runner

    def sf(self, *args: str) -> list[str]:
        return servefleet_argv(self.layout, *args)

    def cap(self, seconds: float, reserve: float = 60.0) -> float:
        """``seconds``, shortened so that the budget (if any) keeps ``reserve`` s for down and collect."""
        left = seconds_left(self.settings.budget_s, T0)
        return seconds if left is None else max(30.0, min(seconds, left - reserve))

    def short_of(self, need_s: float) -> float | None:
        """The seconds left of the driver's budget when fewer than ``need_s`` are, else None."""
        return short_of(self.settings.budget_s, T0, need_s)


def write_json(path: Path, data: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


# ---- setup ------------------------------------------------------------------------------------------
def stage_setup(ctx: Ctx) -> dict:
    """Install servefleet (carried wheels, then an editable install of the working tree), check vLLM,
    build the random-weight model. Idempotent: a second run on the same machine only checks."""
    lay, run = ctx.layout, ctx.runner
    out: dict = {"rehearse": lay.rehearse}
    repo = Path(lay.repo)
    if not lay.rehearse:
        wheels = sorted((repo / ".gpu" / "servefleet-wheels").glob("*.whl"))
        if wheels and not Path("/tmp/sf-site/typer").exists():
            res = run.run(
                "pip-wheels",
                [
                    lay.python,
                    "-m",
                    "pip",
                    "install",
                    "-q",
                    "--no-index",
                    "--no-deps",
                    "--no-compile",
                    "--no-cache-dir",
                    "--target",
                    "/tmp/sf-site",
                    *map(str, wheels),
                ],
                timeout=300,
            )
            out["wheels"] = {"count": len(wheels), "rc": res.rc}
        if Path("/tmp/sf-site").is_dir() and "/tmp/sf-site" not in run.env.get("PYTHONPATH", ""):
            run.env["PYTHONPATH"] = "/tmp/sf-site:" + run.env.get("PYTHONPATH", "")  # now, for this process's children
        probe = run.run(
            "import-servefleet", [lay.python, "-c", "import servefleet, sys; print(servefleet.__file__)"], timeout=60
        )
        if probe.rc != 0 or str(repo) not in probe.stdout:
            res = run.run(
                "pip-editable",
                [
                    lay.python,
                    "-m",
                    "pip",
                    "install",
                    "-q",
                    "--no-deps",
                    "--no-index",
                    "--no-build-isolation",
                    "-e",
                    str(repo),
                ],
                timeout=300,
            )
            out["editable_install_rc"] = res.rc
            if res.rc != 0:  # the image's setuptools could not build it: run from the source tree instead
                lay.path("use-src-path").write_text("editable install failed; src/ is put on PYTHONPATH\n")
                run.env["PYTHONPATH"] = str(repo / "src") + ":" + run.env.get("PYTHONPATH", "")
    check = run.run("servefleet-version", ctx.sf("--help"), timeout=120)
    out["servefleet_cli_ok"] = check.rc == 0
    versions = run.run(
        "versions",
        [
            lay.python,
            "-c",
            (
                "import importlib.metadata as m, json\n"
                "out = {}\n"
                "for n in ('servefleet','typer','rich','pydantic','aiohttp','torch','transformers','tokenizers','vllm'):\n"
                "    try: out[n] = m.version(n)\n"
                "    except Exception as e: out[n] = None\n"
                "print(json.dumps(out))"
            ),
        ],
        timeout=120,
    )
    out["versions"] = versions.json()
    if not lay.rehearse:
        vllm = run.run("import-vllm", [lay.python, "-c", "import vllm; print(vllm.__version__)"], timeout=300)
        out["vllm_import"] = vllm.stdout.strip() if vllm.rc == 0 else f"failed: {vllm.stderr_tail[-300:]}"
        out["vllm_ok"] = vllm.rc == 0
        smi = run.run(
            "nvidia-smi",
            ["nvidia-smi", "--query-gpu=name,memory.total,memory.used,driver_version", "--format=csv,noheader"],
            timeout=60,
        )
        out["gpu"] = smi.stdout.strip()
        out["cpu_count"] = os.cpu_count()
    if lay.rehearse:  # the sim loads nothing and the rehearsal's bench counts with /tokenize
        out["model"] = "skipped (rehearsal: the sim loads no model)"
    elif not (lay.model / "config.json").exists():
        res = run.run("model", ctx.sf("model", "tiny", str(lay.model), "--preset", "realistic", "--json"), timeout=900)
        out["model"] = res.json() or {"rc": res.rc, "stderr": res.stderr_tail[-500:]}
        out["model_build_s"] = round(res.seconds, 1)
    else:
        out["model"] = "already built"
    out["model_config"] = read_json(lay.model / "config.json")
    out["ready"] = bool(out["servefleet_cli_ok"] and (lay.rehearse or (out["model_config"] and out.get("vllm_ok"))))
    write_json(lay.results / "setup.json", out)
    return out


# ---- up ---------------------------------------------------------------------------------------------
def _server_log_facts(log: Path) -> dict:
    """What the server's own log says about its start-up, to set beside servefleet's view."""
    facts: dict = {}
    if not log.exists():
        return facts
    stamps: list[str] = []
    for line in log.read_text(errors="replace").splitlines():
        if m := VLLM_TS.match(line):
            stamps.append(m.group(1))
        for key, pattern in (
            ("kv_cache_line", r"KV cache size: .*"),
            ("concurrency_line", r"Maximum concurrency for .*"),
            ("init_engine_line", r"init engine \(profile.*took .*"),
            ("available_kv_line", r"Available KV cache memory: .*"),
            ("compile_line", r"torch\.compile take.*|torch\.compile took.*"),
            ("graphs_line", r"Graph capturing finished.*"),
            ("spec_line", r"[Ss]peculative.*ngram.*"),
            ("startup_complete", r"Application startup complete.*"),
        ):
            if key not in facts and (m2 := re.search(pattern, line)):
                facts[key] = m2.group(0)[:300]
    if stamps:
        fmt = "%m-%d %H:%M:%S"
        facts["first_log_stamp"] = stamps[0]
        latest = None
        for line in log.read_text(errors="replace").splitlines():
            if m := VLLM_TS.match(line):
                latest = m.group(1)
            if "Application startup complete" in line and latest:
                # uvicorn's line has no time stamp of its own: the last stamped line before it
                span = datetime.strptime(latest, fmt) - datetime.strptime(stamps[0], fmt)
                facts["log_first_to_ready_s"] = span.seconds
                break
    return facts


def stage_up(ctx: Ctx) -> dict:
    """``servefleet up`` of the two main servers. Stagger 'kv' starts ngram once plain has printed its
    KV-cache size (two vLLMs profiling GPU memory at the same moment see each other's allocations)."""
    lay, st, run = ctx.layout, ctx.settings, ctx.runner
    lay.main_fleet.write_text(fleet_toml(lay, st))
    fleet = str(lay.main_fleet)
    limit = ctx.cap(st.up_timeout, reserve=240.0)  # leave room for the failures, down and collect
    wait = ("--timeout", f"{limit:.0f}")
    out: dict = {"fleet_file": fleet_toml(lay, st), "stagger": st.stagger, "timeout_s": round(limit)}
    t0 = time.monotonic()
    if st.stagger == "none":
        res = run.run("up-main", ctx.sf("up", fleet, *wait, "--json"), timeout=limit + 60)
        out["up"] = [res.json()]
    elif st.stagger == "serial":
        out["up"] = [
            run.run(f"up-{n}", ctx.sf("up", fleet, "--only", n, *wait, "--json"), timeout=limit + 60).json()
            for n in ("plain", "ngram")
        ]
    else:
        first = run.start("up-plain", ctx.sf("up", fleet, "--only", "plain", *wait, "--json"))
        line = wait_for_line(lay.log_of("main", "plain"), KV_LINE, timeout=limit, alive=first.proc)
        out["second_started_after_s"] = round(time.monotonic() - t0, 1)
        out["second_started_on"] = line
        second = run.start("up-ngram", ctx.sf("up", fleet, "--only", "ngram", *wait, "--json"))
        out["up"] = [first.finish(limit + 60).json(), second.finish(limit + 60).json()]
    out["wall_s"] = round(time.monotonic() - t0, 1)
    status = run.run("status-main", ctx.sf("status", "--fleet", fleet, "--json"), timeout=120).json() or {}
    servers = {}
    for entry in status.get("servers", []):
        name = entry.get("name")
        servers[name] = {
            "state": entry.get("state"),
            "category": entry.get("category"),
            "time_to_ready_s": entry.get("time_to_ready_s"),
            "capacity": entry.get("capacity"),
            "base_url": entry.get("base_url"),
            "log_path": entry.get("log_path"),
            "server_log": _server_log_facts(Path(entry.get("log_path") or "/nonexistent")),
        }
    for doc in out["up"]:
        for entry in (doc or {}).get("servers", []):
            if entry.get("name") in servers:
                servers[entry["name"]]["up_verdict"] = entry.get("verdict")
                servers[entry["name"]]["up_time_to_ready_s"] = entry.get("time_to_ready_s")
    out["servers"] = servers
    out["ready"] = sorted(n for n, s in servers.items() if s["state"] == "ready")
    _keep_ready_logs(ctx, servers)
    write_json(lay.results / "up.json", out)
    return out


def _keep_ready_logs(ctx: Ctx, servers: dict) -> None:
    """The start-up logs of the ready servers, as fixtures (before any benchmark traffic), with what
    ``diagnose`` reads from them: ready, and the capacity facts."""
    lay = ctx.layout
    fixtures = lay.results / "fixtures"
    fixtures.mkdir(parents=True, exist_ok=True)
    expected = read_json(fixtures / "EXPECTED.json") or {}
    for name, info in servers.items():
        log = Path(info.get("log_path") or "/nonexistent")
        if info["state"] != "ready" or not log.exists():
            continue
        fixture = f"{'sim_rehearsal' if lay.rehearse else 'vllm026_h200'}_ready_{name}.log"
        shutil.copy(log, fixtures / fixture)
        diag = (
            ctx.runner.run(
                f"diagnose-ready-{name}",
                ctx.sf("diagnose", str(fixtures / fixture), "--engine", "vllm", "--json"),
                timeout=120,
                quiet=True,
            ).json()
            or {}
        )
        info["diagnose"] = {"state": diag.get("state"), "capacity": diag.get("capacity")}
        cap = diag.get("capacity") or {}
        expected[fixture] = {
            "state": diag.get("state"),
            "category": diag.get("category"),
            "evidence_substring": None,
            "detect": True,
            "engine": "vllm",
            "scenario": f"healthy start-up of the {name} server (main fleet)",
            "capacity": {
                k: cap.get(k)
                for k in ("kv_cache_tokens", "context_length", "max_running_requests")
                if cap.get(k) is not None
            },
            "live_verdict": {"state": info["state"], "time_to_ready_s": info.get("time_to_ready_s")},
        }
    write_json(fixtures / "EXPECTED.json", expected)


def ready_servers(ctx: Ctx) -> list[str]:
    status = (
        ctx.runner.run(
            "status-check", ctx.sf("status", "--fleet", str(ctx.layout.main_fleet), "--json"), timeout=120, quiet=True
        ).json()
        or {}
    )
    return [s["name"] for s in status.get("servers", []) if s.get("state") == "ready"]


# ---- bench ------------------------------------------------------------------------------------------
def _bench_common(ctx: Ctx) -> list[str]:
    """Random prompts of exact token lengths (the model's own tokenizer; the rehearsal counts with the
    server's /tokenize instead, sparing a transformers import per bench), completions API, greedy."""
    st = ctx.settings
    args = [
        "--input-len",
        str(st.input_len),
        "--output-len",
        str(st.output_len),
        "--api",
        "completions",
        "--temperature",
        "0",
    ]
    return args if ctx.layout.rehearse else [*args, "--tokenizer", str(ctx.layout.model)]


def stage_bench(ctx: Ctx) -> dict:
    """The concurrency sweep on both servers in turn, then ``compare`` with its plots."""
    lay, st, run = ctx.layout, ctx.settings, ctx.runner
    names = [n for n in ("plain", "ngram") if n in ready_servers(ctx)]
    out: dict = {"servers": names}
    if not names:
        out["skipped"] = "no main server is ready"
        write_json(lay.results / "bench.json", out)
        return out
    bench_dir = lay.results / "bench"
    bench_dir.mkdir(parents=True, exist_ok=True)
    levels = st.levels()
    per_point = st.point_seconds + 30  # generous: drain of a 256-token request at 256-way concurrency
    res = run.run(
        "bench",
        ctx.sf(
            "bench",
            "--fleet",
            str(lay.main_fleet),
            "--servers",
            ",".join(names),
            "-c",
            st.concurrency,
            "--duration",
            str(st.point_seconds),
            *_bench_common(ctx),
            "--out",
            str(bench_dir / "run.json"),
            "--json",
        ),
        timeout=ctx.cap(len(names) * len(levels) * per_point + 120, reserve=120.0),
    )
    out["rc"] = res.rc
    out["seconds"] = round(res.seconds, 1)
    runs = {n: str(bench_dir / f"run-{n}.json") for n in names if (bench_dir / f"run-{n}.json").exists()}
    if len(names) == 1 and not runs and (bench_dir / "run.json").exists():
        runs = {names[0]: str(bench_dir / "run.json")}
    out["runs"] = runs
    if runs:
        cmp = run.run("compare", ctx.sf("compare", *runs.values(), "--out-dir", str(bench_dir), "--json"), timeout=300)
        out["compare"] = cmp.json()
        out["plots"] = sorted(p.name for p in bench_dir.glob("*.png"))
    write_json(lay.results / "bench.json", out)
    return out


def stage_vllm_bench(ctx: Ctx) -> dict:
    """A/B on the plain server: servefleet bench and ``vllm bench serve`` with the same request count,
    concurrency and workload, back to back. Rehearsal runs only the servefleet half."""
    lay, st, run = ctx.layout, ctx.settings, ctx.runner
    out: dict = {"server": "plain", "points": []}
    if "plain" not in ready_servers(ctx):
        out["skipped"] = "the plain server is not ready"
        write_json(lay.results / "vllm_bench.json", out)
        return out
    vb_dir = lay.results / "vllm-bench"
    vb_dir.mkdir(parents=True, exist_ok=True)
    for c in st.vllm_levels():  # in the order given: the first is the one that matters most
        prompts = max(c * st.vllm_bench_waves, 16 if lay.rehearse else 256)
        point: dict = {"concurrency": c, "requests": prompts}
        left = ctx.short_of(AB_LEVEL_S)
        if left is not None:
            point["skipped"] = f"budget: {left:.0f} s left, ~{AB_LEVEL_S:.0f} s needed"
            run.say(f"  A/B at concurrency {c}: skipped ({point['skipped']})")
            out["points"].append(point)
            continue
        point.update(ab_point(ctx, "plain", c, prompts, vb_dir, "ab"))
        out["points"].append(point)
    write_json(lay.results / "vllm_bench.json", out)
    return out


AB_LEVEL_S = 60.0  # one A/B level on the H200: servefleet ~15 s, vllm bench serve ~20 s import + ~15 s


def ab_point(ctx: Ctx, server: str, concurrency: int, requests: int, folder: Path, stem: str) -> dict:
    """One A/B point: ``servefleet bench --stream`` then ``vllm bench serve`` (which always streams) on
    ``server``, the same concurrency, request count and workload, back to back; both JSON files kept in
    ``folder``. Rehearsal: the servefleet half only."""
    lay, st, run = ctx.layout, ctx.settings, ctx.runner
    point: dict = {}
    sf_path = folder / f"servefleet-c{concurrency}.json"
    res = run.run(
        f"{stem}-servefleet-c{concurrency}",
        ctx.sf(
            "bench",
            "--url",
            lay.url(server),
            "--label",
            f"{server}-c{concurrency}",
            "-c",
            str(concurrency),
            "--requests",
            str(requests),
            "--stream",
            *_bench_common(ctx),
            "--out",
            str(sf_path),
            "--json",
        ),
        timeout=ctx.cap(300.0),
    )
    doc = read_json(sf_path)
    if doc and doc.get("points"):
        p = doc["points"][0]
        point["servefleet"] = {
            "output_tokens_per_s": round(p["output_tokens_per_s"], 1),
            "output_tokens_per_s_span": p.get("output_tokens_per_s_span"),
            "duration_s": p.get("duration_s"),
            "tpot_p50_ms": (p.get("tpot_ms") or {}).get("p50"),
            "ttft_p50_ms": (p.get("ttft_ms") or {}).get("p50"),
            "client_bound": p.get("client_bound"),
            "errors": p.get("errors"),
            "seconds": round(res.seconds, 1),
        }
    if lay.rehearse:
        point["vllm"] = "skipped (rehearsal: no vLLM here)"
    else:
        name = f"vllm-c{concurrency}.json"
        vres = run.run(
            f"{stem}-vllm-c{concurrency}",
            vllm_bench_argv(lay, st, concurrency, requests, folder, name, server=server),
            timeout=ctx.cap(300.0),
        )
        vdoc = read_json(folder / name)
        if vdoc:
            point["vllm"] = {
                k: vdoc.get(k)
                for k in (
                    "output_throughput",
                    "total_token_throughput",
                    "completed",
                    "failed",
                    "duration",
                    "median_tpot_ms",
                    "median_ttft_ms",
                    "max_concurrency",
                )
            }
            point["vllm"]["seconds"] = round(vres.seconds, 1)
        else:
            point["vllm"] = {"error": f"rc={vres.rc}", "stderr": vres.stderr_tail[-1500:]}
    point["ratio"] = ab_ratio(point)
    point.update(ab_point_ratios(point))
    return point


def ab_point_ratios(point: dict) -> dict:
    """servefleet's tok/s over ``vllm bench serve``'s ``output_throughput`` (all tokens over the whole
    run): like for like with servefleet's span rate (first start to last end); its steady-window rate
    (what ``bench`` reports) is given beside it."""
    sf, vl = point.get("servefleet"), point.get("vllm")
    if not isinstance(sf, dict) or not isinstance(vl, dict) or not vl.get("output_throughput"):
        return {"ratio_span": None, "ratio_steady": None}
    ref = vl["output_throughput"]
    span = sf.get("output_tokens_per_s_span")
    return {
        "ratio_span": round(span / ref, 4) if span else None,
        "ratio_steady": round(sf["output_tokens_per_s"] / ref, 4),
    }


def ab_ratio(point: dict) -> float | None:
    """servefleet's output tok/s over vLLM's own benchmark's, at one concurrency (None if either is missing)."""
    sf, vl = point.get("servefleet"), point.get("vllm")
    if not isinstance(sf, dict) or not isinstance(vl, dict) or not vl.get("output_throughput"):
        return None
    return round(sf["output_tokens_per_s"] / vl["output_throughput"], 4)


# ---- plan -------------------------------------------------------------------------------------------
def stage_plan(ctx: Ctx) -> dict:
    lay, run = ctx.layout, ctx.runner
    bench = read_json(lay.results / "bench.json") or {}
    runs = list((bench.get("runs") or {}).values())
    out: dict = {"job": {"prompts": JOB_PROMPTS, "output_tokens_mean": JOB_OUTPUT_TOKENS}, "gpus": PLAN_GPUS}
    if not runs:
        out["skipped"] = "no bench runs"
        write_json(lay.results / "plan.json", out)
        return out
    args = []
    for path in runs:
        args += ["--bench", path]
    res = run.run(
        "plan",
        ctx.sf(
            "plan",
            *args,
            "--prompts",
            str(JOB_PROMPTS),
            "--output-tokens-mean",
            str(JOB_OUTPUT_TOKENS),
            "--gpus",
            PLAN_GPUS,
            "--plot",
            str(lay.results / "plan" / "plan.png"),
            "--json",
        ),
        timeout=300,
    )
    out["rc"] = res.rc
    out["plan"] = res.json()
    write_json(lay.results / "plan.json", out)
    return out


# ---- down -------------------------------------------------------------------------------------------
def down(ctx: Ctx, name: str, fleet: Path) -> object | None:
    """``servefleet down`` of ``fleet`` (10 s grace), as the command ``name``, if its file was written;
    what it printed as JSON (None: not written, or no JSON)."""
    if not fleet.exists():
        return None
    return ctx.runner.run(name, ctx.sf("down", "--fleet", str(fleet), "--grace", "10", "--json"), timeout=180).json()


def down_stage(ctx: Ctx, name: str, fleet: Path, result: Path) -> dict:
    """A stage that downs one fleet: its JSON (``{}`` when the fleet was never written) kept in ``result``."""
    doc = down(ctx, name, fleet)
    out = doc if isinstance(doc, dict) else {}  # servefleet down --json prints an object
    write_json(result, out)
    return out


def stage_down(ctx: Ctx) -> dict:
    """Stop every fleet this run started and keep the servers' logs in results/logs/."""
    lay = ctx.layout
    out: dict = {}
    for name, path in (
        ("main", lay.main_fleet),
        ("whole", lay.whole_fleet),
        ("failures", lay.failures_fleet),
        ("portheld", lay.port_fleet),
    ):
        if path.exists():
            out[name] = down(ctx, f"down-{name}", path)
    logs = lay.results / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    for log in lay.path("state").glob("*/logs/*.log"):
        shutil.copy(log, logs / f"{log.parent.parent.name}-{log.name}")
    write_json(lay.results / "down.json", out)
    return out
