"""What each server of a fleet is doing now, from its state record plus a live look: process-group
liveness, the detach wrapper's exit code, one HTTP probe and the log of the current attempt.

``look`` asks those questions (each only when the answer can change the state) and returns the
facts as a ``status_decide.Snapshot``; ``status_decide.decide`` (pure) says what they mean, the
log's part by replaying `wait`'s readiness machine over the attempt's lines, the probe and the exit.
Nothing here is kept in memory between calls: any CLI process (a second terminal, a new shell)
computes the same answer from the files and the server itself.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

from servefleet.capacity import Capacity
from servefleet.catalog import State
from servefleet.engines.base import EngineProfile, Probe
from servefleet.engines.registry import get_engine
from servefleet.errors import EngineError
from servefleet.fleet import questions
from servefleet.fleet.hosts import HostBinding
from servefleet.fleet.lifecycle import owns_group, read_exit_code
from servefleet.fleet.questions import DIAGNOSE_LIMIT, STALL_TAIL
from servefleet.fleet.state import ServerState, utcnow
from servefleet.fleet.status_decide import AttemptLog, Liveness, Snapshot, decide, replay
from servefleet.hosts.capabilities import scheduler_of
from servefleet.hosts.questions import ask, inner_host, read_tail
from servefleet.http import HttpClient
from servefleet.verify.bounded import HostSource, read_big_log
from servefleet.verify.diagnose import last_attempt_start, split_lines
from servefleet.verify.events import LogLines, ProbeOutcome
from servefleet.verify.probe import Prober
from servefleet.verify.verdict import Verdict

__all__ = [
    "Liveness",
    "ServerStatus",
    "server_status",
    "look",
    "not_launched",
    "read_attempt",
    "diagnose_attempt",
    "read_tail",
    "DIAGNOSE_LIMIT",
    "STALL_TAIL",
]


class ServerStatus(BaseModel):
    name: str
    engine: str | None = None
    host: str = "local"
    port: int | None = None
    pid: int | None = None  # the process group id (= the detach wrapper's pid)
    state: Liveness
    detail: str | None = None  # exit code, category, progress, or why
    exit_code: int | None = None
    category: str | None = None
    launched_at: datetime | None = None
    uptime_s: float | None = None
    time_to_ready_s: float | None = None
    capacity: Capacity = Field(default_factory=Capacity)
    base_url: str | None = None
    log_path: str | None = None
    served_model: str | None = None
    unit: str | None = None  # the transient systemd --user unit (launcher = "systemd-run")
    in_fleet: bool = True  # false: a record of a server no longer in the fleet file
    spec_changed: bool = False

    def to_json(self) -> dict[str, Any]:
        data = self.model_dump(mode="json", exclude={"capacity"})
        data["pgid"] = self.pid  # what `pid` is: the process group (the wrapper's pid), named as such
        data["capacity"] = self.capacity.model_dump(exclude_defaults=True)
        return data


async def read_attempt(binding: HostBinding, record: ServerState, profile: EngineProfile | None) -> AttemptLog:
    """The current attempt's part of the (appended) log, as lines for the readiness machine. One
    read of up to DIAGNOSE_LIMIT bytes (the status batch prefetches exactly that read); a longer
    attempt goes through the bounded reader that `wait` and `diagnose` use (its start-up, first
    fatal block and end), so a crash at the end of a big log is seen and memory stays bounded."""
    raw = await ask(binding.host, questions.attempt_log(record))
    if raw is None:
        return AttemptLog(missing=True)
    if len(raw) < DIAGNOSE_LIMIT:
        return _whole(raw)
    source = HostSource(inner_host(binding.host), record.log_path)
    try:
        read = await read_big_log(source, profile, start=record.log_offset)
        if read is None:  # within the bounded reader's cap after all: read whole
            size = await source.size()
            if size is None:
                return AttemptLog(missing=True)
            return _whole(await source.read(record.log_offset, max(0, size - record.log_offset)))
    except FileNotFoundError:
        return AttemptLog(missing=True)
    windows = tuple(LogLines(tuple(w.lines), first_line_no=w.line_no) for w in read.windows)
    return AttemptLog(windows, skipped=read.skipped, detected=read.profile)


def _whole(raw: bytes) -> AttemptLog:
    """A log read whole, from the attempt's offset: its lines after the last launch marker (numbered from 1
    at the offset)."""
    lines = split_lines(raw.decode("utf-8", errors="replace"))
    first = last_attempt_start(lines)
    return AttemptLog((LogLines(tuple(lines[first:]), first_line_no=first + 1),))


async def diagnose_attempt(binding: HostBinding, record: ServerState, profile: EngineProfile | None) -> Verdict:
    """The readiness machine's verdict of the current attempt's log alone (the process alive, no probe answer)."""
    log = await read_attempt(binding, record, profile)
    snap = Snapshot(name=record.name, pgid=record.pgid, owned=True, log=log, engine=profile, log_path=record.log_path)
    return replay(snap)


async def serving_stall(binding: HostBinding, record: ServerState, profile: EngineProfile) -> str | None:
    """What the engine's own statistics at the end of the current attempt's log say of a stall
    (``EngineProfile.serving_stall``), from at most STALL_TAIL bytes; None for an engine that logs
    none (nothing read), or when they show progress or are not in that tail."""
    if not reports_serving_stats(profile):
        return None
    found = await ask(binding.host, questions.log_end(record))  # answered by the host's batch where it was asked there
    if found is None:
        return None
    start, raw = found
    text = raw.decode("utf-8", errors="replace")
    if start > record.log_offset:
        text = text.partition("\n")[2]  # the first line is cut
    return profile.serving_stall(text)


def reports_serving_stats(profile: EngineProfile | None) -> bool:
    """Whether the engine's log carries statistics ``serving_stall`` reads (else nothing is read)."""
    return profile is not None and type(profile).serving_stall is not EngineProfile.serving_stall


def not_launched(name: str, engine: str | None, host: str, port: int | None, log_path: str | None) -> ServerStatus:
    return ServerStatus(name=name, engine=engine, host=host, port=port, state=Liveness.NOT_LAUNCHED, log_path=log_path)


async def server_status(
    record: ServerState,
    binding: HostBinding,
    client: HttpClient,
    *,
    in_fleet: bool = True,
    spec_changed: bool = False,
) -> ServerStatus:
    """Compute one server's status from its record and a live look at it (``look``), decided by
    ``status_decide.decide``."""
    try:
        profile: EngineProfile | None = get_engine(record.engine)
    except EngineError:
        profile = None
    base_url = await binding.host.url_for(record.port, record.bind)
    now = utcnow()
    snap = await look(record, binding, client, profile, base_url)
    decision = decide(snap)
    return ServerStatus(
        name=record.name,
        engine=record.engine,
        host=record.host,
        port=record.port,
        pid=record.pgid,
        state=decision.state,
        detail=decision.detail,
        exit_code=decision.exit_code,
        category=decision.category,
        launched_at=record.launched_at,
        uptime_s=round((now - record.launched_at).total_seconds(), 1) if snap.owned else None,
        time_to_ready_s=(
            round((record.ready_at - record.launched_at).total_seconds(), 3) if record.ready_at is not None else None
        ),
        capacity=decision.capacity,
        base_url=base_url,
        log_path=record.log_path,
        served_model=record.served_model,
        unit=record.unit,
        in_fleet=in_fleet,
        spec_changed=spec_changed,
    )


async def look(
    record: ServerState, binding: HostBinding, client: HttpClient, profile: EngineProfile | None, base_url: str
) -> Snapshot:
    """One look at a recorded server: each fact asked only when ``decide`` needs it (a dead server is
    not probed, a serving one's log is read only for its statistics, a stale group nothing more)."""
    host = binding.host
    last = record.last_verdict or {}
    gone = Snapshot(  # what the record says, with the group gone; each fact found is replaced into it
        name=record.name,
        pgid=record.pgid,
        owned=False,
        recorded_capacity=Capacity(**last["capacity"]) if last.get("capacity") else Capacity(),
        last_state=last.get("state"),
        last_category=last.get("category"),
        after_failure=record.after_failure,
        engine=profile,
        log_path=record.log_path,
    )
    scheduler = scheduler_of(host)  # a scheduler's host (Slurm): how a job ended, or that it still waits
    if not await owns_group(binding, record):
        if await ask(host, questions.alive(record)):
            return replace(gone, alive=True)
        exit_code = await read_exit_code(binding, record)
        log = await read_attempt(binding, record, profile)
        ended = await scheduler.ended(record.pgid) if scheduler is not None else None
        return replace(gone, alive=False, exit_code=exit_code, log=log, ended=ended or None)

    probe = (
        Probe(tuple(record.probe_paths)) if record.probe_paths else (profile.probe if profile else Probe(("/health",)))
    )
    # The same probe and identity rule as `wait` (verify/probe.py): the port's owner, else the served name.
    prober = Prober(client, base_url, host, pgid=record.pgid, port=record.port, served_model=record.served_model)
    try:
        result = await prober.probe_once(probe)
        if result.outcome is ProbeOutcome.OK:
            if profile is None:  # capacity is a nicety here (empty on failure): readiness was proven above
                return replace(gone, owned=True, probe=result)
            served = await prober.capacity(profile, timeout_s=3.0)
            stall = await serving_stall(binding, record, profile)
            return replace(gone, owned=True, probe=result, served_capacity=served, stall=stall)
    finally:
        await prober.close()
    if last.get("state") == State.READY.value:  # unresponsive: nothing more to ask
        return replace(gone, owned=True, probe=result)
    if scheduler is not None and (note := await scheduler.queued(record.pgid)):
        return replace(gone, owned=True, probe=result, queued=note)
    return replace(gone, owned=True, probe=result, log=await read_attempt(binding, record, profile))
