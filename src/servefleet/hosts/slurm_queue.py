"""What the Slurm scheduler says about jobs: one ``squeue`` answer parsed, and Slurm's job states
mapped to what servefleet needs (alive or not; for an ended job, how it ended and what to do).

Pure: no I/O here (slurm.py asks the scheduler), so every mapping is tested with tables.
Facts from Slurm's documentation (squeue(1) "JOB STATE CODES", "JOB REASON CODES").
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

__all__ = [
    "JobInfo",
    "slurm_seconds",
    "SQUEUE_FORMAT",
    "squeue_argv",
    "parse_squeue",
    "ENDED",
    "is_alive",
    "EndReport",
    "end_report",
    "parse_submit",
]

FIELD_SEP = "|"
# id, state, reason, node list, submit time, time used, time limit, job name
SQUEUE_FORMAT = FIELD_SEP.join(("%i", "%T", "%r", "%N", "%V", "%M", "%l", "%j"))

# Terminal states: the job's processes are gone (or being killed: COMPLETING is not here).
ENDED = frozenset(
    {
        "BOOT_FAIL",
        "CANCELLED",
        "COMPLETED",
        "DEADLINE",
        "FAILED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "TIMEOUT",
        "REVOKED",
        "SPECIAL_EXIT",
    }
)


@dataclass(frozen=True)
class JobInfo:
    job_id: str
    state: str  # RUNNING, PENDING, COMPLETING, TIMEOUT, ...
    reason: str = ""  # PENDING: Resources, Priority, QOSMaxJobsPerUserLimit...; ended: TimeLimit, NonZeroExitCode...
    nodes: str = ""
    submitted: datetime | None = None
    used: str = ""  # time used, Slurm's format (M:SS, H:MM:SS, D-HH:MM:SS)
    limit: str = ""  # time limit, same format, or UNLIMITED
    name: str = ""

    @property
    def pending(self) -> bool:
        return self.state in ("PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED")

    @property
    def remaining_s(self) -> float | None:
        """Seconds before the time limit ends a running job; None without a limit or before it runs."""
        limit, used = slurm_seconds(self.limit), slurm_seconds(self.used)
        if self.state != "RUNNING" or limit is None or used is None:
            return None
        return max(0.0, limit - used)


def slurm_seconds(value: str) -> float | None:
    """Slurm's durations in seconds: minutes, minutes:seconds, hours:minutes:seconds, days-hours,
    days-hours:minutes, days-hours:minutes:seconds (sbatch(1) --time; squeue prints the last forms);
    None for UNLIMITED, INVALID, NOT_SET or blank."""
    value = value.strip()
    if not value or not (value[0].isdigit()):
        return None
    days, dash, clock = value.partition("-")
    if not dash:
        days, clock = "0", value
    try:
        parts = [int(p) for p in clock.split(":")]
        d = int(days)
    except ValueError:
        return None
    if dash:  # after a day count the clock starts with hours
        if len(parts) > 3:
            return None
        h, m, s = (parts + [0, 0])[:3]
    elif len(parts) == 1:
        h, m, s = 0, parts[0], 0  # a bare number is minutes
    elif len(parts) == 2:
        h, m, s = 0, parts[0], parts[1]
    elif len(parts) == 3:
        h, m, s = parts
    else:
        return None
    return float(((d * 24 + h) * 60 + m) * 60 + s)


def squeue_argv(job_ids: list[str] | None = None) -> list[str]:
    """One question about all of this user's jobs (or ``job_ids``), every state, so a job that just
    ended is still seen with its end state (for the controller's ``MinJobAge`` seconds)."""
    argv = ["squeue", "--noheader", "--states=all", f"--format={SQUEUE_FORMAT}"]
    argv += ["--jobs=" + ",".join(job_ids)] if job_ids else ["--me"]
    return argv


def parse_submit(value: str) -> datetime | None:
    try:
        return datetime.fromisoformat(value.strip())
    except ValueError:
        return None


def parse_squeue(stdout: str) -> dict[str, JobInfo]:
    """``squeue --format=SQUEUE_FORMAT`` lines -> {job id: JobInfo}; lines that are not that are
    skipped (a job name may hold the separator: it is the last field)."""
    jobs = {}
    for line in stdout.splitlines():
        parts = line.strip().split(FIELD_SEP, 7)
        if len(parts) < 8 or not parts[0].strip():
            continue
        job_id, state, reason, nodes, submitted, used, limit, name = (p.strip() for p in parts)
        state = state.split()[0].rstrip("+") if state else ""
        jobs[job_id] = JobInfo(
            job_id,
            state,
            "" if reason in ("None", "(null)") else reason,
            nodes,
            parse_submit(submitted),
            used,
            limit,
            name,
        )
    return jobs


def is_alive(state: str) -> bool:
    """Whether a job in ``state`` still has (or will have) processes: pending, running, completing."""
    return state not in ENDED


@dataclass(frozen=True)
class EndReport:
    """How a job ended, as servefleet reports it. ``killed``: the scheduler ended it (the log may
    hold no error: the category is ``killed``); otherwise the server's own exit and log decide."""

    note: str
    hint: str | None
    killed: bool


# The states in which the scheduler, not the server, ended a job (the report's ``killed``): the
# words after "Slurm job N ended STATE (REASON)" and the hint. Fields: {limit} (" of 1:00" when
# the job had a limit), {table} (the host's fleet-file table), {nodes} (its node, when known).
_SCHEDULER_ENDS: dict[str, tuple[str, str]] = {
    "TIMEOUT": (
        ": it reached its time limit{limit}",
        "raise `time` in {table} (sbatch --time), or split the job; generate restarts it with a new job",
    ),
    "PREEMPTED": (
        ": preempted by a higher-priority job",
        "use a QOS or partition without preemption (`qos`/`partition` in {table}), or let generate resubmit it",
    ),
    "NODE_FAIL": (
        " on {nodes}: the node failed",
        'resubmit (servefleet restart); exclude the node with sbatch_args = ["--exclude={node}"] if it recurs',
    ),
    "BOOT_FAIL": (": the node failed to boot", "resubmit (servefleet restart); ask the cluster's admins if it recurs"),
    "OUT_OF_MEMORY": (
        ": the job exceeded its memory allocation (host RAM, not GPU memory)",
        "raise `mem` in {table} (sbatch --mem), or lower the engine's CPU-side memory use",
    ),
    "CANCELLED": (
        ": cancelled (scancel, by you or an admin)",
        "see who cancelled it (sacct -j JOB -o State,Reason); servefleet restart resubmits it",
    ),
    "DEADLINE": (": its deadline passed", "drop or move the job's --deadline in sbatch_args"),
}


def end_report(job: JobInfo | None, job_id: str, host: str) -> EndReport:
    """The words for an ended job (``job`` None: the scheduler no longer knows it). A state the
    scheduler did not end it in (FAILED, COMPLETED, ...): the server's own exit and log decide."""
    if job is None:
        return EndReport(
            f"Slurm job {job_id} is no longer known to the scheduler (ended more than MinJobAge ago)", None, False
        )
    said = f"Slurm job {job_id} ended {job.state}" + (f" ({job.reason})" if job.reason else "")
    ended = _SCHEDULER_ENDS.get(job.state)
    if ended is None:
        return EndReport(said, None, False)
    fields = {
        "limit": f" of {job.limit}" if job.limit and job.limit != "UNLIMITED" else "",
        "table": f"[hosts.{host}]",
        "nodes": job.nodes or "its node",
        "node": job.nodes or "NODE",
    }
    words, hint = ended
    return EndReport(said + words.format(**fields), hint.format(**fields), True)
    return EndReport(said, None, False)
