"""The table of oom_phases.sh: for each phase, where the grabber took the card, what `up` said (state, category, the
phase of a memory failure, the evidence line, the hint that names the holder) and whether `diagnose` on the log agrees.
Usage: oom_summary.py DIR [--json]"""

import json
import sys
from pathlib import Path

PHASES = ("load", "profile", "kv", "graphs", "warmup", "request")


def load(path: Path) -> dict:
    try:
        return json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        return {}


def verdict_of_up(doc: dict) -> dict:
    servers = doc.get("servers") or [{}]
    return {**(servers[0].get("verdict") or {}), "gpu_holders": servers[0].get("gpu_holders") or []}


def row(d: Path, name: str) -> dict | None:
    if not (d / f"{name}-up.json").exists():
        return None
    grab = load(d / f"{name}-grab.json")
    up = verdict_of_up(load(d / f"{name}-up.json"))
    diag = load(d / f"{name}-diagnose.json")
    gen = load(d / f"{name}-generate.json")
    return {
        "phase_grabbed": name,
        "grab": grab,
        "up_state": up.get("state"),
        "category": up.get("category"),
        "oom_phase": up.get("phase"),
        "evidence": (up.get("evidence") or {}).get("text"),
        "hint": up.get("hint"),
        "holders_before_launch": up["gpu_holders"],
        "diagnose": {k: diag.get(k) for k in ("state", "category", "phase")},
        "diagnose_evidence": (diag.get("evidence") or {}).get("text"),
        "generate": {k: gen.get(k) for k in ("status", "done", "failed", "message")} if gen else None,
    }


def cut(text: str | None) -> str:
    return (text or "")[:140].replace("|", "\\|")


def main() -> int:
    d = Path(sys.argv[1])
    rows = [r for r in (row(d, n) for n in PHASES) if r]
    if "--json" in sys.argv:
        print(json.dumps(rows, indent=1))
        return 0
    print("| grabbed at | grab (log age s, GiB) | up | category | phase | diagnose | evidence | hint |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        g = r["grab"]
        grab = f"{g.get('log_age_s')} s, {g.get('held_gib')}" if g.get("matched") else "no match"
        dg = r["diagnose"]
        same = (
            "same"
            if (dg["category"], dg["phase"]) == (r["category"], r["oom_phase"])
            else f"{dg['category']} / {dg['phase']}"
        )
        print(
            f"| {r['phase_grabbed']} | {grab} | {r['up_state']} | {r['category']} | {r['oom_phase']} | {same} "
            f"| {cut(r['evidence'])} | {cut(r['hint'])} |"
        )
        if r["generate"]:
            print(f"|  | then a job of long prompts: {r['generate']} |  |  |  |  |  |  |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
