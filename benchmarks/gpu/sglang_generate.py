"""The SGLang generate stage (issue 19, step 4), run by sglang_h200.sh's `generate`:
``servefleet generate`` of N prompts over the fleet's servers, one server SIGKILLed (its process
group) once the job is under way; the fleet must restart it and put it back in service, and the job
must end with every prompt answered exactly once (ids counted in the JSONL shards here, with the
standard library). A deadline interrupts the job (SIGINT: resumable) so the device command ends in time.

    python3 sglang_generate.py --fleet F --state-dir D --work W --out generate.json
        [--prompts 20000] [--max-tokens 256] [--kill ngram] [--kill-after 15] [--deadline 240]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

# h200_exec and h200_generate sit next to this script: in benchmarks/gpu/, and in the run folder
# sglang_prepare.sh fills
from h200_exec import answers_health
from h200_generate import count_answers, generate_argv, write_prompts


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fleet", required=True)
    ap.add_argument("--state-dir", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--prompts", type=int, default=20000)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--kill", default="ngram")
    ap.add_argument("--kill-after", type=float, default=15.0)
    ap.add_argument("--deadline", type=float, default=240.0, help="seconds before the job is interrupted")
    ap.add_argument("--sf", default=f"{sys.executable} -m servefleet.cli.main")
    a = ap.parse_args()
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    prompts, dest = work / "prompts.jsonl", work / "out"
    write_prompts(prompts, a.prompts, a.max_tokens)
    record_path = Path(a.state_dir) / f"{a.kill}.json"
    record = json.loads(record_path.read_text()) if record_path.exists() else {}
    port = int(record.get("port") or 0)
    out: dict = {
        "prompts": a.prompts,
        "max_tokens": a.max_tokens,
        "kill": a.kill,
        "kill_after_s": a.kill_after,
        "deadline_s": a.deadline,
        "killed": None,
        "health": [],
    }
    argv = generate_argv(a.sf.split(), prompts, dest, ["--fleet", a.fleet])
    out["command"] = " ".join(argv)
    t0 = time.monotonic()
    with open(work / "generate.stdout", "w") as so, open(work / "generate.stderr", "w") as se:
        job = subprocess.Popen(argv, stdout=so, stderr=se)
        was_up = None
        while job.poll() is None:
            now = time.monotonic() - t0
            if out["killed"] is None and now >= a.kill_after and record.get("pgid"):
                try:
                    os.killpg(int(record["pgid"]), signal.SIGKILL)
                    out["killed"] = {"server": a.kill, "pgid": record["pgid"], "at_s": round(now, 1)}
                except ProcessLookupError as exc:
                    out["killed"] = {"server": a.kill, "error": str(exc)}
                print(f"generate: SIGKILL to {a.kill} (group {record['pgid']}) at {now:.1f} s", flush=True)
            if port:
                up = answers_health(f"http://127.0.0.1:{port}")
                if up != was_up:  # the killed server's /health, as it changes
                    out["health"].append({"t_s": round(now, 1), "healthy": up})
                    was_up = up
            if now >= a.deadline:
                job.send_signal(signal.SIGINT)
                out["interrupted_at_s"] = round(now, 1)
                try:
                    job.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    job.kill()
                break
            time.sleep(1.0)
        job.wait()
    out["rc"] = job.returncode
    out["wall_s_measured"] = round(time.monotonic() - t0, 1)
    try:
        report = json.loads((work / "generate.stdout").read_text())
    except Exception as exc:
        report = {"error": f"no JSON report: {exc}"}
    servers = report.get("servers") or []
    ids = count_answers(dest)
    expected = {f"p{i:06d}" for i in range(a.prompts)}
    out.update(
        {
            "status": report.get("status"),
            "wall_s": report.get("wall_s"),
            "startup_s": report.get("startup_s"),
            "output_tokens_per_s": report.get("output_tokens_per_s"),
            "completion_tokens": report.get("completion_tokens"),
            "done": report.get("done"),
            "committed": report.get("committed"),
            "failed": report.get("failed"),
            "retries": report.get("retries"),
            "requeued": report.get("requeued"),
            "remaining": report.get("remaining"),
            "events": report.get("events"),
            "servers": [
                {
                    k: s.get(k)
                    for k in (
                        "name",
                        "state",
                        "requests",
                        "errors",
                        "completion_tokens",
                        "output_tokens_per_s",
                        "final_concurrency",
                        "limit_source",
                        "outages",
                        "restarts",
                    )
                }
                for s in servers
            ],
            "restarts": sum(int(s.get("restarts") or 0) for s in servers),
            "unique_ids": len(ids),
            "duplicates": sum(c - 1 for c in ids.values() if c > 1),
            "missing": len(expected - set(ids)),
            "unexpected": len(set(ids) - expected),
            "exactly_once": set(ids) == expected and all(c == 1 for c in ids.values()),
            "back_in_service": any("back in service" in e for e in report.get("events") or []),
        }
    )
    if "error" in report:
        out["report_error"] = report["error"]
    Path(a.out).write_text(json.dumps(out, indent=1))
    print(
        f"generate: {out['status']} rc={out['rc']} in {out['wall_s']} s, {out['unique_ids']} ids, "
        f"{out['duplicates']} duplicates, {out['missing']} missing, exactly_once={out['exactly_once']}, "
        f"{out['restarts']} restart(s), back_in_service={out['back_in_service']}, "
        f"{out['output_tokens_per_s']} out tok/s"
    )
    for e in out["events"] or []:
        print("  event:", e)
    return 0


if __name__ == "__main__":
    sys.exit(main())
