"""The generate stage (issue 8, step 6; not part of ``all``, since it does not fit in the second
command's ten minutes): ``servefleet generate`` of N prompts over both main servers, with the ngram
server SIGKILLed midway. The fleet must restart it, and the job must finish with every prompt
answered exactly once. The figure reported is achieved output tok/s as a fraction of the sum of the
two servers' best bench throughput.

The output is JSONL shards, so the driver can count ids with the standard library.
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from h200_exec import Started
from h200_stages import Ctx, read_json, ready_servers, write_json

__all__ = ["stage_generate", "generate_argv", "write_prompts", "count_answers", "wait_until_sending"]

PROGRESS_FILE = "progress.json"  # what a running generate job writes beside its shards (servefleet.generate.recorder)

WORDS = (
    "the server model token batch cache graph kernel memory request prompt answer fleet stage "
    "queue shard retry engine decode prefill latency throughput speculative draft accept"
).split()


def generate_argv(sf: list[str], prompts: Path, dest: Path, target: list[str], extra: Sequence[str] = ()) -> list[str]:
    """``servefleet generate`` (``sf``: how servefleet is run) of ``prompts`` into ``dest`` over ``target``
    (``--fleet F`` or ``--url U``): completions, greedy, JSONL shards of 1,000 rows (so the ids can be
    counted with the standard library), ``extra`` options, ``--json`` last (the report is read)."""
    return [
        *sf,
        "generate",
        "--input",
        str(prompts),
        "--output",
        str(dest),
        *target,
        "--completions",
        "--temperature",
        "0",
        "--format",
        "jsonl",
        "--shard-rows",
        "1000",
        *extra,
        "--json",
    ]


def write_prompts(path: Path, n: int, max_tokens: int, seed: int = 0) -> None:
    """N completion prompts of ~40 random words, ids p000000..., each with its max_tokens."""
    rng = random.Random(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        for i in range(n):
            words = " ".join(rng.choice(WORDS) for _ in range(40))
            fh.write(json.dumps({"id": f"p{i:06d}", "prompt": words, "max_tokens": max_tokens}) + "\n")


def count_answers(folder: Path) -> Counter:
    """How many times each id appears in the committed JSONL answer shards (not the failures, the rejected
    input records or a manifest, which carry ids too)."""
    ids: Counter = Counter()
    for shard in sorted(folder.rglob("*.jsonl")):
        if shard.name in ("failures.jsonl", "rejects.jsonl") or "manifest" in shard.name:
            continue
        for line in shard.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                if "id" in row:
                    ids[row["id"]] += 1
    return ids


def wait_until_sending(job: Started, dest: Path, seconds: float, limit_s: float = 120.0) -> None:
    """``seconds`` from now, then until the job's first progress record (it has its servers and sends),
    while it runs: on a loaded machine a fault sent earlier finds a server the job has not taken yet,
    which tests no recovery."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and job.proc.poll() is None:
        time.sleep(0.5)
    cap = time.monotonic() + limit_s
    while not (dest / PROGRESS_FILE).exists() and job.proc.poll() is None and time.monotonic() < cap:
        time.sleep(0.2)


def stage_generate(ctx: Ctx) -> dict:
    lay, st, run = ctx.layout, ctx.settings, ctx.runner
    out: dict = {
        "prompts": st.generate_prompts,
        "max_tokens": st.generate_max_tokens,
        "kill_after_s": st.generate_kill_after,
    }
    ready = ready_servers(ctx)
    if set(ready) != {"plain", "ngram"}:
        out["skipped"] = f"both main servers must be ready (ready: {ready})"
        write_json(lay.results / "generate.json", out)
        return out
    gen = lay.path("generate")
    prompts, dest = gen / "prompts.jsonl", gen / f"out-{int(time.time())}"
    write_prompts(prompts, st.generate_prompts, st.generate_max_tokens)
    job = run.start("generate", generate_argv(ctx.sf(), prompts, dest, ["--fleet", str(lay.main_fleet)]))
    wait_until_sending(job, dest, st.generate_kill_after)
    record = read_json(lay.path("state", "main", "ngram.json")) or {}
    if job.proc.poll() is None and record.get("pgid"):
        os.killpg(int(record["pgid"]), signal.SIGKILL)
        out["killed"] = {"server": "ngram", "pgid": record["pgid"], "after_s": round(st.generate_kill_after, 1)}
        run.say(f"  generate: SIGKILL to ngram (process group {record['pgid']})")
    else:
        out["killed"] = None
        run.say("  generate: the job ended before the kill (raise --generate-prompts)")
    res = job.finish(timeout=st.generate_timeout)
    report = res.json() or {}
    ids = count_answers(dest)
    bench = read_json(lay.results / "bench.json") or {}
    best = {
        r.get("label"): r.get("best_output_tokens_per_s") for r in ((bench.get("compare") or {}).get("runs") or [])
    }
    ceiling = sum(v for v in best.values() if v)
    out.update(
        {
            "rc": res.rc,
            "status": report.get("status"),
            "wall_s": report.get("wall_s"),
            "output_tokens_per_s": report.get("output_tokens_per_s"),
            "completion_tokens": report.get("completion_tokens"),
            "events": report.get("events"),
            "servers": report.get("servers"),
            "unique_ids": len(ids),
            "duplicates": sum(c - 1 for c in ids.values() if c > 1),
            "exactly_once": len(ids) == st.generate_prompts and all(c == 1 for c in ids.values()),
            "restarts": sum((s or {}).get("restarts", 0) for s in report.get("servers") or []),
            "best_bench_tok_s": best,
            "fraction_of_bench_sum": round(report["output_tokens_per_s"] / ceiling, 3)
            if ceiling and report.get("output_tokens_per_s")
            else None,
        }
    )
    run.say(
        f"  generate: {out['status']}, {out['unique_ids']} ids, {out['duplicates']} duplicates, "
        f"{out['restarts']} restart(s), {out['output_tokens_per_s']} tok/s = {out['fraction_of_bench_sum']} of the bench sum"
    )
    write_json(lay.results / "generate.json", out)
    return out
