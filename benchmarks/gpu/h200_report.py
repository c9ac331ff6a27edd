"""The collect stage: one summary of the whole run (JSON and a Markdown table), and everything packed
for the trip back from the device machine.

$OUT may hold at most 8 files, so collect writes exactly these: h200-results.tar.gz (the whole
results folder: every JSON, plot, command output, server log and failure fixture), summary.json,
summary.md, timings.json and driver.log. It runs after every stage of ``all``, so a run cut short by
the device's time limit still brings back what it had.
"""

from __future__ import annotations

import shutil
import tarfile
from pathlib import Path

from h200_stages import Ctx, read_json, write_json

__all__ = ["summarize", "markdown", "stage_collect", "plateau"]


def _points(run_path: str | None) -> list[dict]:
    doc = read_json(Path(run_path)) if run_path else None
    return (doc or {}).get("points", [])


def plateau(points: list[dict]) -> dict | None:
    """Is the flattening from 64 to 256 the client or the server? The data that says so: the
    client's self-check at 256, and the server's own /metrics (requests running vs. queued,
    KV-cache use) — a server-bound plateau shows a full batch or a queue; a client-bound one flags
    the client and leaves the server's batch below the offered concurrency."""
    by_c = {p.get("concurrency"): p for p in points}
    lo, hi = by_c.get(64), by_c.get(256)
    if not lo or not hi:
        return None
    server = hi.get("server") or {}
    client = hi.get("client") or {}
    gain = hi["output_tokens_per_s"] / lo["output_tokens_per_s"] if lo.get("output_tokens_per_s") else None
    if hi.get("client_bound"):
        verdict = "client"
    elif server.get("saturated") or (server.get("running_mean") or 0) >= 0.9 * 256:
        verdict = "server"
    else:
        verdict = "undetermined"
    return {
        "tok_s_64": round(lo["output_tokens_per_s"], 1),
        "tok_s_256": round(hi["output_tokens_per_s"], 1),
        "gain_256_over_64": round(gain, 3) if gain else None,
        "verdict": verdict,
        "client_bound_256": hi.get("client_bound"),
        "client_reasons_256": client.get("reasons"),
        "client_cpu_max_256": client.get("cpu_percent_max"),
        "loop_lag_p99_ms_256": (client.get("loop_lag_ms") or {}).get("p99"),
        "server_running_mean_256": server.get("running_mean"),
        "server_queued_mean_256": server.get("queued_mean"),
        "server_kv_usage_max_256": server.get("kv_cache_usage_max"),
        "server_saturated_256": server.get("saturated"),
        "tpot_p50_ms_64": (lo.get("tpot_ms") or {}).get("p50"),
        "tpot_p50_ms_256": (hi.get("tpot_ms") or {}).get("p50"),
    }


def summarize(ctx: Ctx, timings: list[dict]) -> dict:
    """The figures the issue asks for, pulled from each stage's JSON."""
    res = ctx.layout.results
    setup, up, bench = (
        read_json(res / "setup.json") or {},
        read_json(res / "up.json") or {},
        read_json(res / "bench.json") or {},
    )
    ab, plan, fails = (
        read_json(res / "vllm_bench.json") or {},
        read_json(res / "plan.json") or {},
        read_json(res / "failures.json") or {},
    )
    gen = read_json(res / "generate.json")
    out: dict = {
        "rehearsal": ctx.layout.rehearse,
        "timings": timings,
        "machine": {"gpu": setup.get("gpu"), "cpu_count": setup.get("cpu_count"), "versions": setup.get("versions")},
        "model": setup.get("model_config")
        and {
            k: setup["model_config"].get(k)
            for k in (
                "hidden_size",
                "num_hidden_layers",
                "num_attention_heads",
                "num_key_value_heads",
                "head_dim",
                "intermediate_size",
                "vocab_size",
                "dtype",
            )
        },
    }
    out["up"] = {
        name: {
            "state": s.get("state"),
            "time_to_ready_s": s.get("time_to_ready_s"),
            "kv_cache_tokens": (s.get("capacity") or {}).get("kv_cache_tokens"),
            "max_running_requests": (s.get("capacity") or {}).get("max_running_requests"),
            "max_concurrency": (s.get("capacity") or {}).get("max_concurrency"),
            "speculative": (s.get("capacity") or {}).get("speculative"),
            "log_first_to_ready_s": (s.get("server_log") or {}).get("log_first_to_ready_s"),
            "log_kv_line": (s.get("server_log") or {}).get("kv_cache_line"),
            "log_spec_line": (s.get("server_log") or {}).get("spec_line"),
        }
        for name, s in (up.get("servers") or {}).items()
    }
    sweep: dict = {}
    for name, path in (bench.get("runs") or {}).items():
        pts = _points(path)
        sweep[name] = {
            str(p["concurrency"]): {
                "output_tok_s": round(p["output_tokens_per_s"], 1),
                "tpot_p50_ms": (p.get("tpot_ms") or {}).get("p50"),
                "ttft_p50_ms": (p.get("ttft_ms") or {}).get("p50"),
                "errors": p.get("errors"),
                "client_bound": p.get("client_bound"),
                "spec_accept_length": (p.get("server") or {}).get("spec_accept_length"),
            }
            for p in pts
        }
        out.setdefault("plateau", {})[name] = plateau(pts)
    out["sweep"] = sweep
    out["vllm_bench"] = [
        {
            "concurrency": p.get("concurrency"),
            "requests": p.get("requests"),
            "servefleet_tok_s": (p.get("servefleet") or {}).get("output_tokens_per_s"),
            "vllm_tok_s": p["vllm"].get("output_throughput") if isinstance(p.get("vllm"), dict) else p.get("vllm"),
            "ratio": p.get("ratio"),
        }
        for p in ab.get("points", [])
    ]
    plans = (plan.get("plan") or {}).get("plans") or {}
    out["plan"] = {
        g: [
            {k: row.get(k) for k in ("name", "best_concurrency", "replica_tps", "makespan_s", "gpu_hours")}
            for row in rows[:2]
        ]
        for g, rows in plans.items()
    }
    out["failures"] = {
        name: {
            "expected": c.get("expected"),
            "got": c.get("category"),
            "match": c.get("match"),
            "evidence": ((c.get("verdict") or {}).get("evidence") or {}).get("text"),
            "hint": (c.get("verdict") or {}).get("hint"),
            "diagnose": (c.get("diagnose_vllm") or {}).get("category"),
            "fixture": c.get("fixture"),
        }
        for name, c in (fails.get("cases") or {}).items()
    }
    if gen:
        out["generate"] = {
            k: gen.get(k)
            for k in (
                "prompts",
                "status",
                "unique_ids",
                "duplicates",
                "exactly_once",
                "restarts",
                "killed",
                "wall_s",
                "output_tokens_per_s",
                "fraction_of_bench_sum",
                "skipped",
            )
        }
    return out


def markdown(summary: dict) -> str:
    lines = [f"# H200 run summary{' (CPU rehearsal: simulated vLLM)' if summary.get('rehearsal') else ''}", ""]
    lines += ["| stage | status | seconds |", "|---|---|---|"]
    lines += [f"| {t['stage']} | {t['status']} | {t['seconds']} |" for t in summary.get("timings", [])]
    lines += [
        "",
        "| server | state | time to ready (s) | KV tokens | log first line to ready (s) |",
        "|---|---|---|---|---|",
    ]
    for name, s in (summary.get("up") or {}).items():
        lines.append(
            f"| {name} | {s['state']} | {s['time_to_ready_s']} | {s['kv_cache_tokens']} | {s['log_first_to_ready_s']} |"
        )
    sweep = summary.get("sweep") or {}
    if sweep:
        names = list(sweep)
        levels = sorted({int(c) for s in sweep.values() for c in s})
        lines += [
            "",
            "| concurrency | " + " | ".join(f"{n} tok/s | {n} TPOT p50 ms" for n in names) + " |",
            "|---|" + "---|---|" * len(names),
        ]
        for c in levels:
            cells = []
            for n in names:
                p = sweep[n].get(str(c)) or {}
                tpot = p.get("tpot_p50_ms")
                cells += [f"{p.get('output_tok_s', '–')}", f"{tpot:.2f}" if isinstance(tpot, (int, float)) else "–"]
            lines.append(f"| {c} | " + " | ".join(cells) + " |")
    for name, p in (summary.get("plateau") or {}).items():
        if p:
            lines.append(
                f"\nPlateau 64→256 on {name}: ×{p['gain_256_over_64']} — {p['verdict']}-bound "
                f"(client_bound={p['client_bound_256']}, server running mean {p['server_running_mean_256']}, "
                f"queued mean {p['server_queued_mean_256']}, KV use max {p['server_kv_usage_max_256']})"
            )
    if summary.get("vllm_bench"):
        lines += [
            "",
            "| concurrency | requests | servefleet tok/s | vllm bench serve tok/s | ratio |",
            "|---|---|---|---|---|",
        ]
        for p in summary["vllm_bench"]:
            lines.append(
                f"| {p['concurrency']} | {p['requests']} | {p['servefleet_tok_s']} | {p['vllm_tok_s']} | {p['ratio']} |"
            )
    if summary.get("failures"):
        lines += ["", "| failure | expected | servefleet said | diagnose | evidence |", "|---|---|---|---|---|"]
        for name, f in summary["failures"].items():
            ev = (f.get("evidence") or "").replace("|", "\\|")[:120]
            lines.append(
                f"| {name} | {f['expected']} | {f['got']} {'✓' if f['match'] else '✗'} | {f['diagnose']} | {ev} |"
            )
    gen = summary.get("generate")
    if gen and not gen.get("skipped"):
        lines.append(
            f"\nGenerate: {gen['prompts']} prompts, {gen['status']}, exactly once: {gen['exactly_once']} "
            f"({gen['duplicates']} duplicates), {gen['restarts']} restart(s) after SIGKILL, "
            f"{gen['output_tokens_per_s']} tok/s = {gen['fraction_of_bench_sum']} of the two servers' best bench sum"
        )
    for g, rows in (summary.get("plan") or {}).items():
        if rows:
            best = rows[0]
            lines.append(
                f"\nPlan on {g} GPU(s): {best['name']} at concurrency {best['best_concurrency']}, "
                f"makespan {best['makespan_s'] / 3600:.1f} h, {best['gpu_hours']:.0f} GPU-hours"
            )
    return "\n".join(lines) + "\n"


def stage_collect(ctx: Ctx, timings: list[dict]) -> dict:
    lay = ctx.layout
    summary = summarize(ctx, timings)
    write_json(lay.results / "summary.json", summary)
    (lay.results / "summary.md").write_text(markdown(summary))
    write_json(lay.results / "timings.json", timings)
    out = Path(lay.out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / "h200-results.tar.gz.tmp"
    with tarfile.open(tmp, "w:gz") as tar:
        tar.add(lay.results, arcname="results")
    tmp.replace(out / "h200-results.tar.gz")
    for name in ("summary.json", "summary.md", "timings.json", "driver.log"):
        if (lay.results / name).exists():
            shutil.copy(lay.results / name, out / name)
    return {"out": str(out), "files": sorted(p.name for p in out.iterdir())}
