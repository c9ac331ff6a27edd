"""How often `diagnose` is right on the real engine logs: outcome and category accuracy per engine.

Runs the diagnosis `servefleet diagnose LOG` makes (the engine auto-detected from the log, as a user
runs it) over every recorded real log in tests/fixtures/logs/real/ and scores it against
EXPECTED.json there (what each run really was):

  outcome   the state (ready / failed / loading) is the recorded one
  category  for the failed logs: the failure category is the recorded one
  evidence  for the failed logs with a recorded evidence line: the category is right *and* the
            evidence line is that one (the root cause, not a wrapper or a later line)

With --baseline-src (e.g. /work/main/src) the same logs are diagnosed by that source tree too, side
by side, so a change of the signatures shows as a change of accuracy on the same logs. Each tree is
run in its own interpreter (PYTHONPATH=tree) so the two never mix.

`--set heldout` scores tests/fixtures/logs/real/heldout/ instead: real runs of the same classes recorded
(scripts/record-real-engine-logs.py --set heldout) and labelled *before* any diagnosis of them, so the
signatures were not fixed on them -- the figure that says how well the rules generalise.

Run:  .venv/bin/python benchmarks/diagnose_accuracy.py [--set heldout] [--baseline-src /work/main/src]
Writes benchmarks/results/diagnose_accuracy[_heldout].json and .md (the table, with the misses listed).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
REAL = ROOT / "tests" / "fixtures" / "logs" / "real"
RESULTS = ROOT / "benchmarks" / "results"

# Run in a child interpreter with PYTHONPATH=<tree>: diagnose each log, print one JSON verdict per log.
_CHILD = r"""
import json, sys
from servefleet.verify.diagnose import diagnose_text
out = {}
for path in sys.argv[1:]:
    v = diagnose_text(open(path, "rb").read().decode("utf-8", errors="replace"))
    out[path] = {"state": v.state.value, "category": v.category.value if v.category else None,
                 "evidence": v.evidence.text if v.evidence else None, "engine": v.engine}
print(json.dumps(out))
"""


def engine_of(name: str) -> str:
    """ "vllm_kv_too_small.log", "vllm026_h200_ready.log" -> "vllm"."""
    match = re.match(r"[a-z]+", name)
    return match.group(0) if match else name


def diagnose_all(src: Path, logs: list[Path]) -> dict[str, dict[str, Any]]:
    env = {**os.environ, "PYTHONPATH": str(src)}
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, *map(str, logs)], capture_output=True, text=True, env=env, timeout=600
    )
    if done.returncode != 0:
        raise SystemExit(f"diagnose under {src} failed:\n{done.stderr[-3000:]}")
    return {Path(k).name: v for k, v in json.loads(done.stdout).items()}


def score(expected: dict[str, dict[str, Any]], got: dict[str, dict[str, Any]]) -> dict[str, Any]:
    per: dict[str, dict[str, Any]] = defaultdict(
        lambda: {
            "logs": 0,
            "outcome_ok": 0,
            "failed_logs": 0,
            "category_ok": 0,
            "evidence_logs": 0,
            "evidence_ok": 0,
            "misses": [],
        }
    )
    for name, want in sorted(expected.items()):
        g = got[name]
        for key in (engine_of(name), "all"):
            row = per[key]
            row["logs"] += 1
            outcome = g["state"] == want["state"]
            row["outcome_ok"] += outcome
            miss = None if outcome else f"state {g['state']} (want {want['state']})"
            if want["state"] == "failed":
                row["failed_logs"] += 1
                category = outcome and g["category"] == want["category"]
                row["category_ok"] += category
                if outcome and not category:
                    miss = f"category {g['category']} (want {want['category']})"
                if want.get("evidence_substring"):
                    row["evidence_logs"] += 1
                    evidence_ok = category and want["evidence_substring"] in (g["evidence"] or "")
                    row["evidence_ok"] += evidence_ok
                    if category and not evidence_ok:
                        miss = f"evidence {(g['evidence'] or '')[:100]!r} (want {want['evidence_substring']!r})"
            if miss and key != "all":
                row["misses"].append({"log": name, "miss": miss})
    for row in per.values():
        row["outcome_accuracy"] = round(row["outcome_ok"] / row["logs"], 4) if row["logs"] else None
        row["category_accuracy"] = round(row["category_ok"] / row["failed_logs"], 4) if row["failed_logs"] else None
        row["evidence_accuracy"] = (
            round(row["evidence_ok"] / row["evidence_logs"], 4) if row["evidence_logs"] else None
        )
    return dict(per)


def pct(ok: int, n: int) -> str:
    return f"{ok}/{n} ({100 * ok / n:.0f} %)" if n else "-"


def table(results: dict[str, dict[str, Any]]) -> str:
    names = list(results)
    lines = [
        "| engine | logs | " + " | ".join(f"outcome ({n}) | category ({n}) | evidence ({n})" for n in names) + " |",
        "| --- | --- | " + " | ".join("--- | --- | ---" for _ in names) + " |",
    ]
    engines = sorted({e for r in results.values() for e in r if e != "all"}) + ["all"]
    for engine in engines:
        cells = []
        for n in names:
            row = results[n].get(engine)
            cells += (
                [
                    pct(row["outcome_ok"], row["logs"]),
                    pct(row["category_ok"], row["failed_logs"]),
                    pct(row["evidence_ok"], row["evidence_logs"]),
                ]
                if row
                else ["-", "-", "-"]
            )
        logs = results[names[0]][engine]["logs"]
        lines.append(f"| {engine} | {logs} | " + " | ".join(cells) + " |")
    for n in names:
        misses = [m for e, row in results[n].items() if e != "all" for m in row["misses"]]
        lines.append(f"\nMisses ({n}): " + ("none" if not misses else ""))
        lines += [f"- `{m['log']}`: {m['miss']}" for m in misses]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--baseline-src", type=Path, help="another source tree to score side by side (e.g. /work/main/src)"
    )
    parser.add_argument(
        "--set",
        dest="which",
        choices=("real", "heldout"),
        default="real",
        help="real: tests/fixtures/logs/real/ (the logs the signatures were fixed on); heldout: real/heldout/ "
        "(runs labelled before they were first diagnosed)",
    )
    parser.add_argument(
        "--out",
        default=None,
        help="results file stem under benchmarks/results/ (default: diagnose_accuracy[_heldout])",
    )
    opts = parser.parse_args()
    folder = REAL / "heldout" if opts.which == "heldout" else REAL
    out = opts.out or ("diagnose_accuracy_heldout" if opts.which == "heldout" else "diagnose_accuracy")
    expected = json.loads((folder / "EXPECTED.json").read_text())
    logs = [folder / name for name in sorted(expected)]
    trees = {"this tree": ROOT / "src"}
    if opts.baseline_src:
        trees = {"baseline": opts.baseline_src, **trees}
    results = {label: score(expected, diagnose_all(src, logs)) for label, src in trees.items()}
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    RESULTS.mkdir(parents=True, exist_ok=True)
    where = folder.relative_to(ROOT)
    doc = {
        "what": f"diagnose (engine auto-detected) on every real log of {where}/ against its EXPECTED.json",
        "logs": len(logs),
        "commit": commit,
        "trees": {k: str(v) for k, v in trees.items()},
        "results": results,
    }
    (RESULTS / f"{out}.json").write_text(json.dumps(doc, indent=2) + "\n")
    text = (
        f"# diagnose accuracy on the real logs\n\n{len(logs)} logs of {where}/ (commit {commit}); "
        "outcome: the state; category: of the failed logs; evidence: right category and evidence line.\n"
        + "".join(f"\n- {k}: `{v}`" for k, v in trees.items())
        + "\n\n"
        + table(results)
    )
    (RESULTS / f"{out}.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
