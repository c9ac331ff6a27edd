"""One run at a time on object storage: a lease object with a heartbeat, taken and kept by conditional writes.

A local folder is locked with ``flock``; object storage has no lock, so a run holds ``PREFIX/.lease.json``:

* taking it is a PUT with ``If-None-Match: *`` (it fails when the object exists);
* a heartbeat thread rewrites it every ``heartbeat_s`` with ``If-Match: <our ETag>``: the rewrite fails
  when another run took the lease over, and from then on this run's commits are refused;
* a lease not rewritten for ``expires_s`` (by the storage's own clock: its ``Date`` minus the object's
  ``Last-Modified``, so no two machines' clocks are compared) belongs to a dead run and may be taken over,
  again conditionally (``If-Match`` on the ETag read), so of two runs racing for it one wins;
* a lease whose holder is a process of this machine that no longer exists (killed) is taken over at once,
  so a resume right after a kill is not kept waiting;
* at the end the run deletes it (``If-Match`` again: never another run's lease).

S3 has honoured ``If-None-Match``/``If-Match`` on PUT since 2024 (as do moto and most S3-compatible servers).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import email.utils
import json
import logging
import os
import socket
import threading
import time
from typing import Any

from servefleet.errors import ConfigError

__all__ = ["ObjectLease", "DestinationBusy", "LEASE_FILE", "HEARTBEAT_S", "EXPIRES_S"]

log = logging.getLogger(__name__)

LEASE_FILE = ".lease.json"
HEARTBEAT_S = 10.0
EXPIRES_S = 90.0  # nine missed heartbeats: a run this silent is dead (or cut off, and then refused on its next commit)


class DestinationBusy(ConfigError):
    """Another `generate` holds the destination."""


def _precondition_failed(exc: BaseException) -> bool:
    """An S3 412 (the condition of a conditional write did not hold), however the client wrapped it."""
    for e in (exc, exc.__cause__):
        err = (getattr(e, "response", None) or {}).get("Error") or {}
        if err.get("Code") in ("PreconditionFailed", "ConditionalRequestConflict", "412"):
            return True
    return False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


class ObjectLease:
    """The lease of one destination prefix (``fs``: an s3fs filesystem; ``key`` under ``bucket``)."""

    def __init__(
        self,
        fs: Any,
        bucket: str,
        key: str,
        url: str,
        *,
        heartbeat_s: float = HEARTBEAT_S,
        expires_s: float = EXPIRES_S,
    ) -> None:
        self.fs = fs
        self.bucket = bucket
        self.key = key
        self.url = url
        self.heartbeat_s = heartbeat_s
        self.expires_s = expires_s
        self.run_id: str | None = None
        self.etag: str | None = None
        self.lost: str | None = None  # why this run may not write any more
        self.took_over: str | None = None  # whose expired lease this run took
        self._renewed = 0.0  # monotonic time of the last successful write
        self._started = time.time()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ---- what the lease says ----------------------------------------------------------------------
    def _body(self) -> bytes:
        return json.dumps(
            {
                "run_id": self.run_id,
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "started_unix": round(self._started, 3),
                "renewed_unix": round(time.time(), 3),
                "heartbeat_s": self.heartbeat_s,
            }
        ).encode()

    def _holder(self) -> tuple[str, str | None, float | None]:
        """(who holds the lease, its ETag, seconds since it was last written by the storage's clock). The age is
        infinite when the holder is a process of this machine that no longer exists (killed: resume at once)."""
        try:
            head = self.fs.call_s3("head_object", Bucket=self.bucket, Key=self.key)
            data = self.fs.cat_file(f"{self.bucket}/{self.key}")
        except FileNotFoundError:
            return "nobody (the lease was just released)", None, None
        try:
            info = json.loads(data)
        except ValueError:
            info = {}
        who = f"run {info.get('run_id') or '(starting)'}, pid {info.get('pid', '?')} on {info.get('host', '?')}"
        age = None
        date = (head.get("ResponseMetadata", {}).get("HTTPHeaders") or {}).get("date")
        modified = head.get("LastModified")
        if date and isinstance(modified, dt.datetime):
            age = max(0.0, (email.utils.parsedate_to_datetime(date) - modified).total_seconds())
        if info.get("host") == socket.gethostname() and isinstance(info.get("pid"), int) and not _alive(info["pid"]):
            who += " (no longer running)"
            age = float("inf")
        return who, head.get("ETag"), age

    # ---- taking, keeping, giving back -----------------------------------------------------------------
    def acquire(self) -> None:
        try:
            resp = self.fs.call_s3("put_object", Bucket=self.bucket, Key=self.key, Body=self._body(), IfNoneMatch="*")
        except (FileExistsError, OSError) as exc:
            if not isinstance(exc, FileExistsError) and not _precondition_failed(exc):
                raise
            resp = self._take_over()
        self.etag = resp["ETag"]
        self._renewed = time.monotonic()

    def _take_over(self) -> dict[str, Any]:
        who, etag, age = self._holder()
        if etag is not None and age is not None and age >= self.expires_s:
            try:
                resp = self.fs.call_s3("put_object", Bucket=self.bucket, Key=self.key, Body=self._body(), IfMatch=etag)
            except OSError as exc:
                if not _precondition_failed(exc):
                    raise
                who, _, age = self._holder()  # another run took it first
            else:
                self.took_over = f"{who}: not renewed for {age:,.0f}s" if age != float("inf") else who
                return dict(resp)
        if etag is None:  # released between our two requests: try once more from the start
            try:
                return dict(
                    self.fs.call_s3("put_object", Bucket=self.bucket, Key=self.key, Body=self._body(), IfNoneMatch="*")
                )
            except (FileExistsError, OSError):
                who, _, age = self._holder()
        seen = f", renewed {age:,.0f}s ago" if age is not None else ""
        raise DestinationBusy(
            f"another `servefleet generate` is writing to {self.url} ({who}{seen}); one run per destination: wait for it "
            f"to end, or if it is dead, run again once its lease ({self.url}/{LEASE_FILE}) is {self.expires_s:.0f}s old"
        )

    def claim(self, run_id: str) -> None:
        """Name this run in the lease (what a second run's refusal names)."""
        self.run_id = run_id
        self.renew()

    def renew(self) -> None:
        """Rewrite the lease if it is still ours; when another run took it, remember why we may not write."""
        if self.lost or self.etag is None:
            return
        try:
            resp = self.fs.call_s3(
                "put_object", Bucket=self.bucket, Key=self.key, Body=self._body(), IfMatch=self.etag
            )
        except OSError as exc:
            if _precondition_failed(exc) or isinstance(exc, FileNotFoundError):
                who, _, _ = self._holder()
                self.lost = (
                    f"{self.url}: this run's lease was taken over by {who} (it was not renewed for "
                    f"{self.expires_s:.0f}s); this run stops writing so that one run writes the destination"
                )
            else:
                log.warning("%s: renewing the lease failed (%s); retrying", self.url, exc)
            return
        self.etag = resp["ETag"]
        self._renewed = time.monotonic()

    def check(self) -> None:
        """Before each commit: refuse to write when the lease is lost, or too old to be sure it is still ours."""
        if self.lost is None and self.etag is not None and time.monotonic() - self._renewed >= self.expires_s:
            self.lost = (
                f"{self.url}: the lease could not be renewed for {self.expires_s:.0f}s, so another run may have "
                "taken the destination over; this run stops writing"
            )
        if self.lost:
            raise DestinationBusy(self.lost)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._beat, name="servefleet-lease", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            self.renew()

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.heartbeat_s)
        if self.lost or self.etag is None:
            return
        try:
            self.fs.call_s3("delete_object", Bucket=self.bucket, Key=self.key, IfMatch=self.etag)
        except OSError as exc:
            if _precondition_failed(exc):
                return  # not ours any more
            with contextlib.suppress(OSError):  # a server without conditional deletes: compare, then delete
                _, etag, _ = self._holder()
                if etag == self.etag:
                    self.fs.call_s3("delete_object", Bucket=self.bucket, Key=self.key)
        self.etag = None
