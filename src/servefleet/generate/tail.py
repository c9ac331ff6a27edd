"""What the tail of a finished run cost, read from its timeline (``generate/timeline.py``'s JSON).

A server is idle at the tail from its last busy moment (the end of the last bucket with a request
in flight) until it left service (released by ``--release-tail``, or out for good) or the run
ended; a released server gave back the time from its release to the run's end. Accurate to one
bucket per server (1 s for a job under 8 minutes, coarser for longer ones). Pure: no I/O.
"""

from __future__ import annotations

from typing import Any

__all__ = ["tail_of_timeline", "RELEASED_TEXT"]

RELEASED_TEXT = "released at the tail"  # the job's event when --release-tail drains a server (generate/membership.py)


def tail_of_timeline(tl: dict[str, Any]) -> dict[str, Any]:
    """``{"idle_server_s", "released_server_s", "released", "job_s", "bucket_s", "per_server":
    {name: {"idle_s", "released_s"}}}`` of one run's timeline."""
    width, n = float(tl["bucket_s"]), int(tl["buckets"])
    end = max(0.0, float(tl.get("updated_unix", tl["started"])) - float(tl["started"]))
    released: dict[str, float] = {}
    for m in (tl.get("messages") or {}).get("items", []):
        name, _, rest = m["text"].partition(": ")
        if rest.startswith(RELEASED_TEXT):
            released.setdefault(name, min(end, float(m["t"])))
    out_at = _out_for_good(tl)
    per: dict[str, dict[str, float]] = {}
    for name, cols in (tl.get("servers") or {}).items():
        flight = cols.get("in_flight_max") or []
        busy = [i for i in range(min(n, len(flight))) if flight[i] > 0]
        last_busy = min(end, (busy[-1] + 1) * width) if busy else out_at.get(("join", name), 0.0)
        stop = released.get(name, out_at.get(("out", name), end))
        per[name] = {
            "idle_s": round(max(0.0, stop - last_busy), 2),
            "released_s": round(end - released[name], 2) if name in released else 0.0,
        }
    return {
        "idle_server_s": round(sum(p["idle_s"] for p in per.values()), 2),
        "released_server_s": round(sum(p["released_s"] for p in per.values()), 2),
        "released": len(released),
        "job_s": round(end, 2),
        "bucket_s": width,
        "per_server": per,
    }


def _out_for_good(tl: dict[str, Any]) -> dict[tuple[str, str], float]:
    """("out", server): when it left service with no "back" after; ("join", server): when it joined."""
    found: dict[tuple[str, str], float] = {}
    for e in (tl.get("events") or {}).get("items", []):
        server, t = e.get("server", ""), float(e["t"])
        if e["kind"] in ("outage", "gone"):
            found.setdefault(("out", server), t)
        elif e["kind"] == "back":
            found.pop(("out", server), None)
        elif e["kind"] == "join":
            found.setdefault(("join", server), t)
    return found
