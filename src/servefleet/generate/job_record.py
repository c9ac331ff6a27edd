"""Reading a job from its destination alone: what `servefleet progress` and `servefleet report` show.

Everything comes from the files the job writes (``job.json``, ``progress.json``, ``timeline/*.json``,
``report.json``, ``failures.jsonl``), through the job's own sink, so it works from another terminal
or machine, on a folder or ``s3://``, while the job runs and after it ended. Nothing is written.

A snapshot that says ``running`` but has not been rewritten for a while (``STALE_AFTER`` intervals,
at least ``STALE_MIN_S``) belongs to a run that was killed: it is reported as ``stale``.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from servefleet.errors import ConfigError
from servefleet.generate.job import JOB_FILE
from servefleet.generate.ledger import SHARDS_DIR
from servefleet.generate.recorder import PROGRESS_FILE, TIMELINE_DIR
from servefleet.generate.sinks import Sink, open_existing_sink

__all__ = ["JobRecord", "read_job", "progress_of", "job_series", "FAILURE_KINDS", "STALE_AFTER", "STALE_MIN_S"]

REPORT_FILE = "report.json"  # servefleet.generate.runner.REPORT_FILE (runner imports the whole job)
FAILURES_FILE = "failures.jsonl"
STALE_AFTER = 10  # snapshot intervals without a new snapshot
STALE_MIN_S = 30.0
FAILURE_KINDS = 10  # most frequent failure messages kept in the record
FAILURE_EXAMPLES = 20


@dataclass
class JobRecord:
    destination: str
    manifest: dict[str, Any]
    progress: dict[str, Any] | None = None  # the latest snapshot (of the last run that sent anything)
    timelines: list[dict[str, Any]] = field(default_factory=list)  # one per run that sent anything, oldest first
    report: dict[str, Any] | None = None  # the last finished run's report
    failures: dict[str, Any] = field(default_factory=dict)  # {"total", "kinds": [[message, count]], "examples": [...]}
    damage: str | None = None  # the shards differ from what the last finished run left (a truncated or lost shard)

    @property
    def runs(self) -> list[dict[str, Any]]:
        return list(self.manifest.get("runs") or [])

    @property
    def last_run(self) -> dict[str, Any]:
        return self.runs[-1] if self.runs else {}


def _json(sink: Sink, rel: str) -> dict[str, Any] | None:
    data = sink.read_bytes(rel)
    if data is None:
        return None
    try:
        obj = json.loads(data)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{sink.url}/{rel}: not JSON ({exc})") from None
    return obj if isinstance(obj, dict) else None


def read_job(dest: str, *, timelines: bool = True, failures: bool = True) -> JobRecord:
    """The job at ``dest`` (a folder or an fsspec URL such as ``s3://bucket/prefix``)."""
    sink = open_existing_sink(dest)
    try:
        manifest = _json(sink, JOB_FILE)
        if manifest is None:
            raise ConfigError(f"{dest}: no {JOB_FILE}, so not the destination of a `servefleet generate` run")
        record = JobRecord(
            destination=sink.url,
            manifest=manifest,
            progress=_json(sink, PROGRESS_FILE),
            report=_json(sink, REPORT_FILE),
        )
        if timelines:
            names = [f"{TIMELINE_DIR}/{n}" for n in sink.list(TIMELINE_DIR) if n.endswith(".json")]
            found = sink.read_many(names)
            for rel in sorted(found):  # run ids sort by time
                try:
                    record.timelines.append(json.loads(found[rel]))
                except json.JSONDecodeError:
                    continue
        if failures:
            record.failures = _failures(sink)
        record.damage = _damage(sink, manifest)
        return record
    except OSError as exc:  # object storage unreachable, access denied...
        raise ConfigError(f"{dest}: cannot read the destination: {exc}") from exc
    finally:
        sink.close()


def _damage(sink: Sink, manifest: dict[str, Any]) -> str | None:
    """Whether the shards are still what the last finished run left (one listing: sizes, not contents)."""
    runs = manifest.get("runs") or []
    expected = manifest.get("shard_bytes")
    if expected is None or not runs or not runs[-1].get("finished"):
        return None  # a run is writing (or an older servefleet wrote no total): nothing to compare with
    rows, valid = int(manifest.get("rows", 0)), int((manifest.get("input") or {}).get("valid", 0))
    if valid and rows > valid:  # more committed rows than ids: some ids are in two shards
        return (
            f"{rows:,} committed rows for {valid:,} ids: {rows - valid:,} ids are committed more than once (two runs "
            "wrote this destination at the same time); keep one row per id when reading"
        )
    sizes = sink.sizes(SHARDS_DIR)
    count, total = len(sizes), sum(sizes.values())
    if count == int(manifest.get("shards", 0)) and total == int(expected):
        return None
    return (
        f"the shards are not what the last run committed ({count:,} files of {total:,} bytes where it left "
        f"{int(manifest.get('shards', 0)):,} of {int(expected):,}): some rows are unreadable or lost; run the same "
        "`servefleet generate` again: it checks every shard, moves damaged ones to quarantine/ and asks their ids again"
    )


def _failures(sink: Sink) -> dict[str, Any]:
    data = sink.read_bytes(FAILURES_FILE)
    if not data:
        return {"total": 0, "kinds": [], "examples": []}
    kinds: dict[str, int] = {}
    examples: list[dict[str, Any]] = []
    total = 0
    for raw in data.splitlines():
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError:
            continue
        total += 1
        msg = str(obj.get("error", "?"))[:160]
        kinds[msg] = kinds.get(msg, 0) + 1
        if len(examples) < FAILURE_EXAMPLES:
            examples.append({k: obj.get(k) for k in ("id", "server", "attempts", "error", "time")})
    top = sorted(kinds.items(), key=lambda kv: -kv[1])[:FAILURE_KINDS]
    return {"total": total, "kinds": [list(kv) for kv in top], "examples": examples}


def progress_of(record: JobRecord, now: float | None = None) -> dict[str, Any]:
    """What `servefleet progress` shows (and prints with ``--json``)."""
    now = time.time() if now is None else now
    manifest = record.manifest
    inp = manifest.get("input") or {}
    last = record.last_run
    snap = record.progress
    total = int(inp.get("valid", 0))
    out: dict[str, Any] = {
        "destination": record.destination,
        "run_id": last.get("run_id"),
        "runs": len(record.runs),
        "total": total,
        "rejected": int(inp.get("rejected", 0)),
    }
    if snap is None or snap.get("run_id") != last.get("run_id"):
        # this run has not sent anything yet (pre-pass, probing the servers), or never will
        if last.get("finished"):
            done = int(manifest.get("rows", 0))
        else:  # what the run before left committed
            prev = record.runs[-2] if len(record.runs) > 1 else {}
            done = int(prev.get("done_before", 0)) + int(prev.get("done", 0))
        state = last.get("status", "unknown")
        if state == "complete" and record.damage:
            state = "damaged"
        out.update(
            state="starting" if state == "running" else state,
            status=state,
            done=done,
            committed=done,
            remaining=max(0, total - done),
            failed=int(last.get("failed", 0)),
            note="the run has not started sending yet (pre-pass or probing the servers)"
            if state == "running"
            else record.damage
            if state == "damaged"
            else None,
            servers=[],
            events=[],
            updated_s_ago=None,
        )
        return out
    age = max(0.0, now - float(snap.get("updated_unix", now)))
    status = snap.get("status", "unknown")
    # the manifest wins: a finished run whose final snapshot did not make it (a failed write) still ended
    if status == "running" and last.get("finished"):
        status = last.get("status", status)
    state = status
    note = None
    stale_s = max(STALE_MIN_S, STALE_AFTER * float(snap.get("interval_s", 2.0)))
    if status == "running" and age > stale_s:
        # not running any more: the run stopped writing (killed, or its machine went); say so in both fields
        state = status = "stale"
        note = (
            f"no update for {age:,.0f}s (written every {snap.get('interval_s', 2.0):g}s): the run was probably killed; "
            "run the same `servefleet generate` again to resume"
        )
    if state == "complete" and record.damage:
        state = "damaged"
    if state == "damaged":
        note = record.damage
    out.update(
        {
            k: snap.get(k)
            for k in (
                "done",
                "remaining",
                "failed",
                "retries",
                "requeued",
                "output_tokens",
                "output_tokens_per_s_now",
                "output_tokens_per_s_avg",
                "eta_s",
                "elapsed_s",
                "started_unix",
                "updated",
                "servers",
                "events",
                "membership",
                "width",
            )
        }
    )
    # durable: rows in committed shards (answered rows still buffered are lost if the run is killed)
    committed = int(snap.get("done_before", 0)) + int(snap.get("committed_this_run", snap.get("done_this_run", 0)))
    out.update(state=state, status=status, note=note, updated_s_ago=round(age, 1), committed=committed)
    if state != "running":
        # nothing is being sent: no rate now, no ETA; done is what is committed, what is left is what a resumed run would send
        out.update(eta_s=None, output_tokens_per_s_now=None, done=committed, remaining=max(0, total - committed))
    return out


def job_series(record: JobRecord) -> dict[str, Any]:
    """The job's runs on one time axis (seconds since its first recorded run started), per server and
    for the job: rates per bucket (tokens / the bucket's seconds), concurrency, failures, the servers'
    outages as intervals and restarts as marks. Runs are separated by a gap (None) in every series."""
    tls = [t for t in record.timelines if t.get("started") is not None]
    if not tls:
        return {
            "destination": record.destination,
            "runs": [],
            "servers": {},
            "job": {},
            "outages": [],
            "events": [],
            "messages": [],
            "x_max": 0.0,
        }
    origin = float(tls[0]["started"])
    servers: dict[str, dict[str, list[Any]]] = {}
    job: dict[str, list[Any]] = {k: [] for k in ("t", "output_tokens_per_s", "done", "failed", "retries", "serving")}
    runs: list[dict[str, Any]] = []
    outages: list[dict[str, Any]] = []
    events: list[dict[str, Any]] = []
    messages: list[dict[str, Any]] = []
    x_max = 0.0
    for tl in tls:
        start = float(tl["started"]) - origin
        end = max(start, float(tl.get("updated_unix", tl["started"])) - origin)
        width = float(tl["bucket_s"])
        n = int(tl["buckets"])
        runs.append(
            {
                "run_id": tl.get("run_id"),
                "start_s": round(start, 3),
                "end_s": round(end, 3),
                "status": tl.get("status"),
                "bucket_s": width,
            }
        )
        x_max = max(x_max, end)
        spans = [max(1e-3, min(width, end - start - i * width)) for i in range(n)]
        mids = [round(start + i * width + s / 2, 3) for i, s in enumerate(spans)]
        gap = bool(job["t"])
        jd = tl.get("job") or {}
        if gap:
            for col in job.values():
                col.append(None)
        job["t"].extend(mids)
        job["output_tokens_per_s"].extend(
            round(v / s, 3) for v, s in zip(jd.get("output_tokens", [0] * n), spans, strict=True)
        )
        for key in ("done", "failed", "retries"):
            job[key].extend(jd.get(key, [0] * n))
        job["serving"].extend(tl.get("serving") or [None] * n)  # servers in service (timelines before it: unknown)
        for name, cols in (tl.get("servers") or {}).items():
            ser = servers.setdefault(
                name,
                {
                    k: []
                    for k in ("t", "output_tokens_per_s", "in_flight", "limit", "errors", "requests", "output_tokens")
                },
            )
            if ser["t"]:
                for col in ser.values():
                    col.append(None)
            ser["t"].extend(mids)
            ser["output_tokens_per_s"].extend(
                round(v / s, 3) for v, s in zip(cols["output_tokens"], spans, strict=True)
            )
            ser["in_flight"].extend(cols["in_flight_mean"])
            ser["limit"].extend(cols["limit"])
            ser["errors"].extend(cols["errors"])
            ser["requests"].extend(cols["requests"])
            ser["output_tokens"].extend(cols["output_tokens"])
        down: dict[str, float] = {}
        for e in (tl.get("events") or {}).get("items", []):
            t = round(start + float(e["t"]), 3)
            events.append({**e, "t": t})
            if e["kind"] in ("outage", "gone") and e["server"] not in down:
                down[e["server"]] = t
            elif e["kind"] == "back" and e["server"] in down:
                outages.append({"server": e["server"], "start_s": down.pop(e["server"]), "end_s": t})
        for name, t in down.items():  # still out when the run ended
            outages.append({"server": name, "start_s": t, "end_s": round(end, 3), "open": True})
        messages.extend(
            {**m, "t": round(start + float(m["t"]), 3), "run_id": tl.get("run_id")}
            for m in (tl.get("messages") or {}).get("items", [])
        )
    totals = {
        name: {
            "requests": sum(v for v in s["requests"] if v is not None),
            "output_tokens": sum(v for v in s["output_tokens"] if v is not None),
            "errors": sum(v for v in s["errors"] if v is not None),
            "restarts": sum(int(e.get("count", 1)) for e in events if e["server"] == name and e["kind"] == "restart"),
            "outages": sum(1 for o in outages if o["server"] == name),
        }
        for name, s in servers.items()
    }
    return {
        "destination": record.destination,
        "origin_unix": origin,
        "runs": runs,
        "x_max": round(x_max, 3),
        "job": job,
        "servers": servers,
        "totals": totals,
        "outages": outages,
        "events": events,
        "messages": messages,
    }
