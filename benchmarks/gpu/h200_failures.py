"""The failures stage: provoke each real failure, let servefleet name it, keep the log as a fixture.

All cases run at once (they are independent and most fail within a minute): the ``up`` cases as one
failure fleet, the hand-started server on a held port through ``servefleet wait``, and ``servefleet
up`` onto a held port (which must refuse before launching and name the holder). The SIGKILL case is
killed here, as soon as its log shows it loading. Every log then goes through ``servefleet diagnose``
(with the vLLM profile, and with auto-detection) and is copied to results/fixtures/.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import time

from h200_exec import wait_for_line
from h200_layout import failure_cases, failures_toml, manual_argv, port_toml
from h200_stages import Ctx, read_json, write_json

__all__ = ["stage_failures", "LOADING", "expected_entry", "evidence_substring"]

# Start-up lines that mean "loading now" in vLLM (and in the sim's vLLM style).
LOADING = r"Starting to load model|Loading weights|Loading safetensors|Loading model|Model loading took"


_PREFIX = re.compile(
    r"^(?:\(\w+ pid=\d+\)\s*)?(?:(?:INFO|WARNING|ERROR|DEBUG|CRITICAL) \d\d-\d\d [\d:]+ \[[^\]]*\]\s*)?"
)


def evidence_substring(text: str | None) -> str | None:
    """The evidence line without the process prefix and the time stamp (these change every run)."""
    if not text:
        return None
    return _PREFIX.sub("", text).strip()[:160] or None


def expected_entry(entry: dict, scenario: str, argv: list[str] | None) -> dict:
    """One tests/fixtures/logs/real/EXPECTED.json record: what `diagnose` must say from the log alone,
    whether auto-detection finds the engine, and (as a record) what up/wait said live."""
    diag, auto, live = entry.get("diagnose_vllm") or {}, entry.get("diagnose_auto") or {}, entry.get("verdict") or {}
    return {
        "state": diag.get("state"),
        "category": diag.get("category"),
        "evidence_substring": evidence_substring((diag.get("evidence") or {}).get("text")),
        "detect": auto.get("engine") == "vllm",
        "engine": "vllm",
        "scenario": scenario,
        "live_verdict": {
            "state": live.get("state"),
            "category": live.get("category"),
            "evidence": (live.get("evidence") or {}).get("text"),
            "exit_code": live.get("exit_code"),
        },
        "argv": argv,
    }


# `diagnose` with the vLLM profile (the verdict that counts) and auto-detected (EXPECTED.json's
# `detect`); the rehearsal runs only the first: the same code path, half the processes on 2 cores.
MODES = {False: ("vllm", "auto"), True: ("vllm",)}


def _hold(port: int) -> socket.socket:
    """Listen on a port and never answer: what a forgotten server does to the next one."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", port))
    sock.listen(64)
    return sock


def _verdict_of(doc: dict | None, name: str) -> dict | None:
    for entry in (doc or {}).get("servers", []):
        if entry.get("name") == name:
            return {**(entry.get("verdict") or {}), "action": entry.get("action"), "message_up": entry.get("message")}
    return None


def stage_failures(ctx: Ctx) -> dict:
    lay, st, run = ctx.layout, ctx.settings, ctx.runner
    cases = failure_cases(lay)
    by_name = {c.name: c for c in cases}
    lay.failures_fleet.write_text(failures_toml(lay, st, cases))
    lay.port_fleet.write_text(port_toml(lay, st, by_name["portup"]))
    fixtures = lay.results / "fixtures"
    fixtures.mkdir(parents=True, exist_ok=True)
    out: dict = {"fleet_file": lay.failures_fleet.read_text(), "cases": {}}
    limit = ctx.cap(st.failure_timeout)
    out["timeout_s"] = round(limit)
    held = [_hold(lay.ports["portheld"]), _hold(lay.ports["portup"])]
    manual: subprocess.Popen | None = None
    t0 = time.monotonic()
    try:
        up = run.start("failures-up", ctx.sf("up", str(lay.failures_fleet), "--timeout", f"{limit:.0f}", "--json"))
        # ---- by hand onto a held port, watched by `servefleet wait`
        manual_log = lay.path("manual-portheld.log")
        with open(manual_log, "wb") as fh:
            manual = subprocess.Popen(
                manual_argv(lay, by_name["portheld"]),
                stdout=fh,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=run.env,
                cwd=lay.work,
                start_new_session=True,
            )
        waiter = run.start(
            "failures-wait-portheld",
            ctx.sf(
                "wait",
                "--url",
                lay.url("portheld"),
                "--log",
                str(manual_log),
                "--pid",
                str(manual.pid),
                "--engine",
                "vllm",
                "--timeout",
                f"{limit:.0f}",
                "--stall",
                "180",
                "--json",
            ),
        )
        # ---- servefleet up onto a held port: refused before launch
        blocked = run.run("failures-up-blocked", ctx.sf("up", str(lay.port_fleet), "--json"), timeout=120)
        # ---- SIGKILL while loading
        kill_log = lay.log_of("failures", "sigkill")
        # servefleet starts servers sharing a GPU one after another (each once the one before has settled or
        # failed), so sigkill, last in the file, may start only after the other cases' whole start-ups: wait
        # as long as `up` runs (each server's own timeout counts from its launch).
        in_fleet = sum(1 for c in cases if c.via == "up")
        line = wait_for_line(kill_log, LOADING, timeout=limit * in_fleet, alive=up.proc)
        record = read_json(lay.path("state", "failures", "sigkill.json")) or {}
        killed = {"saw_line": line, "pgid": record.get("pgid")}
        if line and record.get("pgid"):
            try:
                os.killpg(int(record["pgid"]), signal.SIGKILL)
                killed["killed_after_s"] = round(time.monotonic() - t0, 1)
                run.say(f"  sigkill: SIGKILL to process group {record['pgid']} on: {line.strip()[:120]}")
            except ProcessLookupError:
                killed["error"] = "the group was already gone"
        out["sigkill"] = killed
        up_res = up.finish(limit + 60)
        wait_res = waiter.finish(limit + 60)
    finally:
        for sock in held:
            sock.close()
        if manual is not None and manual.poll() is None:
            os.killpg(manual.pid, signal.SIGKILL)
            manual.wait()
    out["wall_s"] = round(time.monotonic() - t0, 1)
    up_doc, wait_doc = up_res.json(), wait_res.json()
    out["up_rc"], out["wait_rc"], out["blocked_rc"] = up_res.rc, wait_res.rc, blocked.rc
    logs: dict[str, tuple] = {}
    for case in cases:
        if case.via == "up":
            logs[case.name] = (_verdict_of(up_doc, case.name), lay.log_of("failures", case.name))
        elif case.via == "wait":
            logs[case.name] = (wait_doc, manual_log)
        else:
            logs[case.name] = (_verdict_of(blocked.json(), case.name), None)
    # Every kept log through `servefleet diagnose`, with the vLLM profile and with auto-detection (in parallel).
    pending = {}
    for case in cases:
        log, fixture = logs[case.name][1], case.fixture_name(lay.rehearse)
        if log is not None and fixture and log.exists():
            shutil.copy(log, fixtures / fixture)
            for mode in MODES[lay.rehearse]:
                pending[(case.name, mode)] = run.start(
                    f"diagnose-{case.name}-{mode}",
                    ctx.sf("diagnose", str(fixtures / fixture), "--engine", mode, "--json"),
                    quiet=True,
                )
    diagnosed = {key: started.finish(120, quiet=True) for key, started in pending.items()}
    expected = read_json(fixtures / "EXPECTED.json") or {}
    for case in cases:
        verdict, log = logs[case.name]
        entry: dict = {
            "expected": case.expected,
            "how": case.how,
            "via": case.via,
            "args": list(case.args),
            "verdict": verdict,
            "category": (verdict or {}).get("category"),
            "state": (verdict or {}).get("state"),
        }
        entry["match"] = entry["category"] == case.expected
        if (case.name, "vllm") in diagnosed:
            entry["fixture"] = case.fixture_name(lay.rehearse)
            for mode in MODES[lay.rehearse]:
                diag = diagnosed[(case.name, mode)]
                d = diag.json() or {}
                entry[f"diagnose_{mode}"] = {
                    "state": d.get("state"),
                    "category": d.get("category"),
                    "engine": d.get("engine"),
                    "evidence": d.get("evidence"),
                    "hint": d.get("hint"),
                    "rc": diag.rc,
                }
            argv = (
                manual_argv(lay, case)
                if case.via == "wait"
                else (read_json(lay.path("state", "failures", f"{case.name}.json")) or {}).get("argv")
            )
            expected[entry["fixture"]] = expected_entry(entry, case.how, argv)
        out["cases"][case.name] = entry
        run.say(
            f"  {case.name:9s} expected {case.expected:16s} got {entry['category']!s:16s} "
            f"{'OK' if entry['match'] else 'MISMATCH'}  "
            f"{((verdict or {}).get('evidence') or {}).get('text', (verdict or {}).get('message', ''))!s:.100}"
        )
    write_json(fixtures / "EXPECTED.json", expected)
    down = run.run(
        "down-failures", ctx.sf("down", "--fleet", str(lay.failures_fleet), "--grace", "5", "--json"), timeout=120
    )
    out["down_rc"] = down.rc
    out["all_match"] = all(c["match"] for c in out["cases"].values())
    write_json(lay.results / "failures.json", out)
    return out
