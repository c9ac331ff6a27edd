"""``status``'s pure decider (fleet/status_decide.py): one snapshot of facts in, a server's state,
detail, category and capacity out, with no host, no HTTP and no clock. The log's part is the
verdict of `wait`'s readiness machine replayed over the snapshot's lines, probe and exit, so the
snapshots here hold real vLLM log lines. Table-driven; the words are the ones `servefleet status`
shows (tests/test_ssh_status.py and test_fleet_lifecycle.py check the same decisions end to end
over real hosts)."""

from __future__ import annotations

import ast
from dataclasses import replace
from pathlib import Path

import pytest

from servefleet.capacity import Capacity
from servefleet.engines.registry import get_engine
from servefleet.fleet import status_decide
from servefleet.fleet.status_decide import AttemptLog, Decision, Liveness, Snapshot, decide
from servefleet.verify.events import LogLines, ProbeOutcome, ProbeResult


def lines(*text: str) -> AttemptLog:
    return AttemptLog((LogLines(text, first_line_no=1),))


OOM_LINE = "  torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB  "
READY_LINE = "INFO:     Application startup complete."
KV_LINE = "INFO 12-01 09:00:05 [kv_cache_utils.py:1] GPU KV cache size: 7 tokens"
OOM = lines(OOM_LINE)
LOG_SILENT = lines()  # the log says nothing of a failure (an empty one)
LOADING_SHARDS = lines("INFO Loading safetensors checkpoint shards:  38% Completed | 3/8 [00:01<00:02]")
WRAPPER_ONLY = lines("ERROR 12-01 09:00:09 [core.py:1] Engine core initialization failed. See root cause above")
OK = ProbeResult(ProbeOutcome.OK, 200, "/health")
REFUSED = ProbeResult(ProbeOutcome.REFUSED, detail="connection refused")
NOT_OURS = ProbeResult(ProbeOutcome.WRONG_IDENTITY, 200, "/health", "port 8000 is held by pid 99 (pgid 99), not 42")

VLLM = get_engine("vllm")
GONE = Snapshot(name="a", pgid=42, owned=False, alive=False, engine=VLLM, log_path="/logs/a.log")
OWNED = Snapshot(name="a", pgid=42, owned=True, engine=VLLM, log_path="/logs/a.log")

CASES: list[tuple[str, Snapshot, Liveness, str | None, str | None]] = [
    # (case, snapshot, state, detail, category)
    (
        "the recorded group lives but is another process's",
        replace(GONE, alive=True, log=OOM, after_failure="stopped"),  # neither the log nor the record matters
        Liveness.STALE,
        "pgid 42 now belongs to another process; run `servefleet down a`",
        None,
    ),
    (
        "dead with an exit code and a fatal line",
        replace(GONE, exit_code=1, log=OOM),
        Liveness.DEAD,
        "exit code 1, gpu_oom: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
        "gpu_oom",
    ),
    (
        "dead, exit code 0, nothing in the log: a failure, as `wait` says (it never became ready)",
        replace(GONE, exit_code=0, log=LOG_SILENT),
        Liveness.DEAD,
        "exit code 0, other",
        "other",
    ),
    (
        "dead, exit code 1, no error line: other, as `wait` says",
        replace(GONE, exit_code=1, log=LOADING_SHARDS),
        Liveness.DEAD,
        "exit code 1, other",
        "other",
    ),
    (
        "dead, exit code 137, empty log: killed, as `wait` says",
        replace(GONE, exit_code=137, log=LOG_SILENT),
        Liveness.DEAD,
        "exit code 137, killed",
        "killed",
    ),
    (
        "dead, an unrecognised error line: the machine's nearest error line is the evidence",
        replace(GONE, exit_code=1, log=lines("ERROR something went wrong: ValueError: bad value")),
        Liveness.DEAD,
        "exit code 1, other: ERROR something went wrong: ValueError: bad value",
        "other",
    ),
    (
        "dead with no exit code recorded: killed",
        replace(GONE, exit_code=None, log=LOG_SILENT),
        Liveness.DEAD,
        "killed (no exit code recorded: the whole group got SIGKILL), killed",
        "killed",
    ),
    (
        "dead with no exit code but a fatal line: the log's category",
        replace(GONE, exit_code=None, log=OOM),
        Liveness.DEAD,
        f"killed (no exit code recorded: the whole group got SIGKILL), gpu_oom: {OOM_LINE.strip()}",
        "gpu_oom",
    ),
    (
        "a dead scheduler job says how it ended",
        replace(GONE, exit_code=None, log=LOG_SILENT, ended="Slurm job 7 ended CANCELLED by 0"),
        Liveness.DEAD,
        "killed (no exit code recorded: the whole group got SIGKILL), killed; Slurm job 7 ended CANCELLED by 0",
        "killed",
    ),
    (
        "stopped by `up` after it failed: the record's category when the log has none",
        replace(GONE, exit_code=143, log=LOG_SILENT, after_failure="stopped", last_category="model_not_found"),
        Liveness.DEAD,
        "stopped by `up` after it failed (model_not_found); exit code 143",
        "model_not_found",
    ),
    (
        "stopped by `up` after it failed: the log's category first",
        replace(GONE, exit_code=143, log=OOM, after_failure="stopped", last_category="model_not_found"),
        Liveness.DEAD,
        f"stopped by `up` after it failed (gpu_oom); exit code 143, gpu_oom: {OOM_LINE.strip()}",
        "gpu_oom",
    ),
    (
        "stopped by `up` with no category anywhere: the machine's (how it ended)",
        replace(GONE, exit_code=143, log=LOG_SILENT, after_failure="stopped"),
        Liveness.DEAD,
        "stopped by `up` after it failed (other); exit code 143",
        "other",
    ),
    (
        "the probe answers and the port is ours",
        replace(OWNED, probe=OK, served_capacity=Capacity()),
        Liveness.READY,
        None,
        None,
    ),
    (
        "the probe answers but the engine's statistics say it stopped generating",
        replace(OWNED, probe=OK, stall="Engine 000: 0.0 tokens/s with 256 requests running"),
        Liveness.HUNG,
        "Engine 000: 0.0 tokens/s with 256 requests running; `servefleet restart a`",
        None,
    ),
    (
        "was ready, the probe no longer answers (the log is not consulted)",
        replace(OWNED, probe=REFUSED, last_state="ready", log=OOM, queued="pending"),
        Liveness.UNRESPONSIVE,
        "was ready; the probe no longer answers",
        None,
    ),
    (
        "was ready, another process answers on the port",
        replace(OWNED, probe=NOT_OURS, last_state="ready"),
        Liveness.UNRESPONSIVE,
        NOT_OURS.detail,
        None,
    ),
    (
        "a scheduler job still waits to run",
        replace(OWNED, probe=NOT_OURS, queued="Slurm job 7 pending (Resources) for 12s"),
        Liveness.LOADING,
        "Slurm job 7 pending (Resources) for 12s",
        None,
    ),
    (
        "alive and not answering, a fatal line in the log",
        replace(OWNED, probe=REFUSED, log=OOM, last_state="failed"),
        Liveness.FAILED,
        f"gpu_oom: {OOM_LINE.strip()} (process still alive)",
        "gpu_oom",
    ),
    (
        "alive, a fatal line that a ready line follows: failed (the first fatal line wins, as in `wait`)",
        replace(OWNED, probe=REFUSED, log=lines(OOM_LINE, READY_LINE)),
        Liveness.FAILED,
        f"gpu_oom: {OOM_LINE.strip()} (process still alive)",
        "gpu_oom",
    ),
    (
        "alive, a wrapper line and no cause above it: failed once its grace period is over",
        replace(OWNED, probe=REFUSED, log=WRAPPER_ONLY),
        Liveness.FAILED,
        "other (process still alive)",
        "other",
    ),
    (
        "alive, still loading: the log's progress",
        replace(OWNED, probe=REFUSED, log=LOADING_SHARDS),
        Liveness.LOADING,
        "loading weight shards",
        None,
    ),
    (
        "alive, no log file: the machine's message",
        replace(OWNED, probe=REFUSED, log=AttemptLog(missing=True)),
        Liveness.LOADING,
        "log file /logs/a.log does not exist (is the path right?)",
        None,
    ),
    (
        "alive, not our port's answer: that is said before the log's progress",
        replace(OWNED, probe=NOT_OURS, log=LOADING_SHARDS),
        Liveness.LOADING,
        NOT_OURS.detail,
        None,
    ),
    (
        "alive, the log says ready but the probe does not: still loading (a ready line is no proof)",
        replace(OWNED, probe=REFUSED, log=lines(READY_LINE)),
        Liveness.LOADING,
        None,
        None,
    ),
]


@pytest.mark.parametrize(("snap", "state", "detail", "category"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_each_state_from_a_snapshot(snap: Snapshot, state: Liveness, detail: str | None, category: str | None) -> None:
    got = decide(snap)
    assert (got.state, got.detail, got.category) == (state, detail, category)


def test_every_state_a_look_can_give_is_in_the_table() -> None:
    assert {c[2] for c in CASES} == set(Liveness) - {Liveness.NOT_LAUNCHED}  # not launched: no record to look at


def test_only_a_dead_server_reports_an_exit_code() -> None:
    assert decide(replace(GONE, exit_code=137, log=LOG_SILENT)).exit_code == 137
    assert decide(replace(GONE, alive=True, exit_code=137)).exit_code is None  # stale: the code is not its
    assert decide(replace(OWNED, probe=REFUSED, exit_code=3, log=LOG_SILENT)).exit_code is None


RECORDED = Capacity(kv_cache_tokens=50_000, context_length=4096)


@pytest.mark.parametrize(
    ("snap", "kv_cache_tokens", "max_running_requests"),
    [
        # the server's own endpoint wins over the record; the record fills the gaps
        (replace(OWNED, probe=OK, served_capacity=Capacity(kv_cache_tokens=80_000)), 80_000, None),
        (replace(OWNED, probe=OK, stall="stopped", served_capacity=Capacity(max_running_requests=8)), 50_000, 8),
        (replace(OWNED, probe=OK), 50_000, None),  # an engine with no profile: nothing read
        # ... and the log's capacity lines, while it loads or after it failed
        (replace(OWNED, probe=REFUSED, log=lines(KV_LINE)), 7, None),
        (replace(OWNED, probe=REFUSED, log=lines(KV_LINE, OOM_LINE)), 7, None),
        # a dead, stale, unresponsive or queued server keeps what the record says
        (replace(GONE, exit_code=1, log=lines(KV_LINE)), 50_000, None),
        (replace(GONE, alive=True), 50_000, None),
        (replace(OWNED, probe=REFUSED, last_state="ready"), 50_000, None),
        (replace(OWNED, probe=REFUSED, queued="pending"), 50_000, None),
    ],
)
def test_capacity_merges_what_was_read_over_the_record(
    snap: Snapshot, kv_cache_tokens: int | None, max_running_requests: int | None
) -> None:
    got = decide(replace(snap, recorded_capacity=RECORDED)).capacity
    assert (got.kv_cache_tokens, got.max_running_requests, got.context_length) == (
        kv_cache_tokens,
        max_running_requests,
        4096,
    )


def test_a_long_evidence_line_is_cut_in_the_detail() -> None:
    line = "torch.OutOfMemoryError: CUDA out of memory. " + "E" * 500
    long = lines(line)
    assert decide(replace(GONE, exit_code=1, log=long)).detail == "exit code 1, gpu_oom: " + line[:120]
    assert decide(replace(OWNED, probe=REFUSED, log=long)).detail == f"gpu_oom: {line[:120]} (process still alive)"


def test_the_decision_is_a_value() -> None:
    assert decide(replace(GONE, exit_code=0, log=LOG_SILENT)) == Decision(
        Liveness.DEAD, "exit code 0, other", "other", exit_code=0
    )


def test_a_one_shot_look_waits_out_no_grace_period() -> None:
    """An unrecognised error line is only a provisional cause while the log may still bring a named
    one (`wait` waits WRAPPER_GRACE_S for it); a look has no later moment: it is the cause now."""
    got = decide(replace(OWNED, probe=REFUSED, log=lines("ERROR something went wrong: ValueError: bad value")))
    assert (got.state, got.category) == (Liveness.FAILED, "other")


def test_a_big_log_read_in_windows_keeps_its_line_numbers() -> None:
    """The bounded reader's windows (a gap between them) are fed with the file's own numbers."""
    log = AttemptLog(
        (
            LogLines(("INFO 12-01 09:00:00 [api_server.py:1] vLLM API server version 0.32.0",), first_line_no=1),
            LogLines(("x", OOM_LINE), first_line_no=90_000),
        ),
        skipped="read 2 KB of 1.0 GB",
    )
    verdict = status_decide.replay(replace(GONE, exit_code=1, log=log))
    assert verdict.evidence is not None and verdict.evidence.line_no == 90_001
    assert verdict.skipped == "read 2 KB of 1.0 GB"


def test_the_decider_does_no_io() -> None:
    """Read statically: the decider imports no host, HTTP, state-file or event-loop module (status.py asks)."""
    source = Path(status_decide.__file__).read_text()
    imported = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module)
    allowed = {
        "__future__",
        "dataclasses",
        "enum",
        "math",
        "servefleet.capacity",
        "servefleet.catalog",
        "servefleet.engines.base",  # the engine profile the machine classifies with: data and regexes
        "servefleet.verify.events",
        "servefleet.verify.machine",  # pure: events and a clock reading in, a verdict out
        "servefleet.verify.verdict",
    }
    assert imported <= allowed, imported - allowed
