"""Where shards go: a local folder or object storage (``s3://bucket/prefix``, through fsspec).

A sink publishes whole files atomically and nothing else:

* local: the file is written under ``DEST/.staging/``, flushed to disk, then ``os.replace``-d into
  place (same filesystem, so the rename is atomic), and the folder entry is flushed too;
* object storage: the file is written to a local staging folder, then uploaded as one object
  (a single PUT, or a multipart upload for large files) -- neither is visible until complete.

Readers of the destination therefore never see a partial shard. Leftovers of a killed run (staging
files, unfinished multipart uploads) are discarded by :meth:`Sink.discard_partial` at the next start.

Credentials come from the usual environment (``AWS_ACCESS_KEY_ID``, ``AWS_PROFILE``, instance roles,
``AWS_ENDPOINT_URL`` for S3-compatible servers) through botocore; nothing of them is stored.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import Protocol

from servefleet.errors import ConfigError
from servefleet.generate.lease import EXPIRES_S, HEARTBEAT_S, LEASE_FILE, DestinationBusy, ObjectLease

__all__ = ["Sink", "LocalSink", "FsspecSink", "open_sink", "DestinationBusy"]

log = logging.getLogger(__name__)

STAGING = ".staging"
LOCK_FILE = ".lock"


class Sink(Protocol):
    url: str

    def new_staging_file(self, suffix: str = "") -> str:
        """A fresh local path to write a file that :meth:`commit_file` will publish."""
        ...

    def commit_file(self, local_path: str, rel: str) -> int:
        """Publish ``local_path`` atomically as ``rel`` (consumes the local file); returns its size."""
        ...

    def write_bytes(self, rel: str, data: bytes) -> None:
        """Publish ``data`` atomically as ``rel``."""
        ...

    def read_bytes(self, rel: str) -> bytes | None: ...

    def read_many(self, rels: list[str]) -> dict[str, bytes]:
        """The contents of the files that exist among ``rels``."""
        ...

    def list(self, rel_dir: str) -> list[str]:
        """Names of the published files directly in ``rel_dir`` (sorted; empty if it does not exist)."""
        ...

    def sizes(self, rel_dir: str) -> dict[str, int]:
        """Name -> size in bytes of the published files directly in ``rel_dir``."""
        ...

    def move(self, rel: str, new_rel: str) -> None:
        """Move a published file aside (to quarantine a damaged shard)."""
        ...

    def remove(self, rel: str) -> None: ...

    def discard_partial(self) -> int:
        """Remove leftovers of killed runs; returns how many."""
        ...

    def lock(self) -> contextlib.AbstractContextManager[None]:
        """Exclusive use of the destination for one run (advisory)."""
        ...

    def claim(self, run_id: str) -> None:
        """Name the run holding the lock (what a second run's refusal names)."""
        ...

    def close(self) -> None: ...


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class LocalSink:
    """A local folder. Atomic by write-to-staging, fsync, rename."""

    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(os.path.expanduser(root))
        self.url = self.root
        self._staging = os.path.join(self.root, STAGING)
        self._lock_fd: int | None = None

    def _path(self, rel: str) -> str:
        return os.path.join(self.root, *rel.split("/"))

    def new_staging_file(self, suffix: str = "") -> str:
        os.makedirs(self._staging, exist_ok=True)
        fd, path = tempfile.mkstemp(dir=self._staging, suffix=suffix)
        os.close(fd)
        return path

    def commit_file(self, local_path: str, rel: str) -> int:
        with open(local_path, "rb+") as f:
            os.fsync(f.fileno())
            size = os.fstat(f.fileno()).st_size
        target = self._path(rel)
        folder = os.path.dirname(target)
        os.makedirs(folder, exist_ok=True)
        os.replace(local_path, target)
        _fsync_dir(folder)
        return size

    def write_bytes(self, rel: str, data: bytes) -> None:
        tmp = self.new_staging_file()
        with open(tmp, "wb") as f:
            f.write(data)
        self.commit_file(tmp, rel)

    def read_bytes(self, rel: str) -> bytes | None:
        try:
            with open(self._path(rel), "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None

    def read_many(self, rels: list[str]) -> dict[str, bytes]:
        out = {}
        for rel in rels:
            data = self.read_bytes(rel)
            if data is not None:
                out[rel] = data
        return out

    def list(self, rel_dir: str) -> list[str]:
        try:
            names = os.listdir(self._path(rel_dir))
        except FileNotFoundError:
            return []
        return sorted(n for n in names if not n.startswith("."))

    def sizes(self, rel_dir: str) -> dict[str, int]:
        out = {}
        for name in self.list(rel_dir):
            with contextlib.suppress(FileNotFoundError):
                out[name] = os.stat(self._path(f"{rel_dir}/{name}")).st_size
        return out

    def move(self, rel: str, new_rel: str) -> None:
        target = self._path(new_rel)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        os.replace(self._path(rel), target)
        _fsync_dir(os.path.dirname(target))

    def remove(self, rel: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.remove(self._path(rel))

    def discard_partial(self) -> int:
        if not os.path.isdir(self._staging):
            return 0
        names = os.listdir(self._staging)
        shutil.rmtree(self._staging, ignore_errors=True)
        return len(names)

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        try:  # the first write of a run: a folder that cannot be written is the user's to fix, before any work
            os.makedirs(self.root, exist_ok=True)
            fd = os.open(os.path.join(self.root, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise ConfigError(
                f"--output {self.root}: cannot write there ({exc.strerror or exc}); choose a folder you can write to"
            ) from None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 64, 0).decode(errors="replace").strip()
                raise DestinationBusy(
                    f"another `servefleet generate` is writing to {self.root} (pid {holder or '?'})"
                ) from None
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(os.getpid()).encode(), 0)
            self._lock_fd = fd
            yield
        finally:
            self._lock_fd = None
            os.close(fd)  # closing releases the lock, also when the process is killed

    def claim(self, run_id: str) -> None:
        if self._lock_fd is not None:
            os.ftruncate(self._lock_fd, 0)
            os.pwrite(self._lock_fd, f"{os.getpid()}, run {run_id}".encode(), 0)

    def close(self) -> None:
        pass


class FsspecSink:
    """Object storage through fsspec (s3fs for ``s3://``). Atomic by single-object upload."""

    def __init__(
        self,
        url: str,
        *,
        part_bytes: int = 64 << 20,
        lease_heartbeat_s: float = HEARTBEAT_S,
        lease_expires_s: float = EXPIRES_S,
    ) -> None:
        import fsspec

        try:
            self.fs, root = fsspec.core.url_to_fs(url)
        except ImportError as exc:
            raise ConfigError(
                f"{url}: object storage needs the s3 extra (pip install 'servefleet[s3]'): {exc}"
            ) from exc
        self.url = url.rstrip("/")
        self.root = root.rstrip("/")
        self.part_bytes = part_bytes
        self.lease_heartbeat_s = lease_heartbeat_s
        self.lease_expires_s = lease_expires_s
        self._lease: ObjectLease | None = None
        self._staging = tempfile.mkdtemp(prefix="servefleet-stage-")

    def _path(self, rel: str) -> str:
        return f"{self.root}/{rel}"

    def new_staging_file(self, suffix: str = "") -> str:
        fd, path = tempfile.mkstemp(dir=self._staging, suffix=suffix)
        os.close(fd)
        return path

    def commit_file(self, local_path: str, rel: str) -> int:
        if self._lease is not None:
            self._lease.check()  # another run took the destination over: write nothing more
        size = os.path.getsize(local_path)
        kwargs = {"chunksize": self.part_bytes} if self._is_s3 else {}
        self.fs.put_file(local_path, self._path(rel), **kwargs)
        os.remove(local_path)
        return size

    @property
    def _is_s3(self) -> bool:
        return "s3" in (self.fs.protocol if isinstance(self.fs.protocol, tuple) else (self.fs.protocol,))

    def write_bytes(self, rel: str, data: bytes) -> None:
        if self._lease is not None:
            self._lease.check()
        self.fs.pipe_file(self._path(rel), data)

    def read_bytes(self, rel: str) -> bytes | None:
        try:
            return self.fs.cat_file(self._path(rel))
        except FileNotFoundError:
            return None

    def read_many(self, rels: list[str]) -> dict[str, bytes]:
        if not rels:
            return {}
        paths = {self._path(r): r for r in rels}
        got = self.fs.cat(list(paths), on_error="omit")
        if not isinstance(got, dict):  # one path: fsspec returns the bytes themselves
            got = {next(iter(paths)): got}
        out = {paths[p]: v for p, v in got.items() if p in paths and isinstance(v, bytes)}
        if len(out) < len(got):  # keys spelt differently by this filesystem: read one by one
            out = {r: d for r in rels if (d := self.read_bytes(r)) is not None}
        return out

    def list(self, rel_dir: str) -> list[str]:
        path = self._path(rel_dir)
        self.fs.invalidate_cache(path)
        try:
            entries = self.fs.ls(path, detail=True)
        except FileNotFoundError:
            return []
        names = [e["name"].rstrip("/").rsplit("/", 1)[-1] for e in entries if e.get("type") == "file"]
        return sorted(n for n in names if not n.startswith("."))

    def sizes(self, rel_dir: str) -> dict[str, int]:
        path = self._path(rel_dir)
        self.fs.invalidate_cache(path)
        try:
            entries = self.fs.ls(path, detail=True)
        except FileNotFoundError:
            return {}
        out = {
            e["name"].rstrip("/").rsplit("/", 1)[-1]: int(e.get("size") or 0)
            for e in entries
            if e.get("type") == "file"
        }
        return {n: v for n, v in out.items() if not n.startswith(".")}

    def move(self, rel: str, new_rel: str) -> None:
        self.fs.mv(self._path(rel), self._path(new_rel))

    def remove(self, rel: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm_file(self._path(rel))

    def discard_partial(self) -> int:
        """Abort multipart uploads left under the prefix by a killed run (they are invisible, but cost
        storage until aborted)."""
        if not self._is_s3:
            return 0
        bucket, _, prefix = self.root.partition("/")
        found = 0
        resp = self.fs.call_s3("list_multipart_uploads", Bucket=bucket, Prefix=prefix + "/" if prefix else "")
        for up in resp.get("Uploads", []):
            self.fs.call_s3("abort_multipart_upload", Bucket=bucket, Key=up["Key"], UploadId=up["UploadId"])
            found += 1
        return found

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """On S3, a lease object (servefleet.generate.lease); other fsspec stores have no conditional
        writes, so one run per destination there is the user's to ensure."""
        if not self._is_s3:
            yield
            return
        bucket, _, prefix = self.root.partition("/")
        lease = ObjectLease(
            self.fs,
            bucket,
            f"{prefix}/{LEASE_FILE}" if prefix else LEASE_FILE,
            self.url,
            heartbeat_s=self.lease_heartbeat_s,
            expires_s=self.lease_expires_s,
        )
        lease.acquire()
        if lease.took_over:
            log.warning("%s: took over the lease of a dead run (%s)", self.url, lease.took_over)
        self._lease = lease
        lease.start()
        try:
            yield
        finally:
            self._lease = None
            lease.release()

    def claim(self, run_id: str) -> None:
        if self._lease is not None:
            self._lease.claim(run_id)

    @property
    def lease(self) -> ObjectLease | None:
        return self._lease

    def close(self) -> None:
        shutil.rmtree(self._staging, ignore_errors=True)


def open_sink(dest: str) -> Sink:
    """A sink for a local path or an fsspec URL (``s3://...``, ``memory://...``, ...)."""
    if "://" in dest and not dest.startswith("file://"):
        return FsspecSink(dest)
    return LocalSink(dest.removeprefix("file://"))


def open_existing_sink(dest: str) -> Sink:
    """The sink of a destination a job wrote, for reading it (progress, report, plan --check): a
    local folder must exist already (opening it for reading creates nothing)."""
    if "://" not in dest or dest.startswith("file://"):
        folder = os.path.expanduser(dest.removeprefix("file://"))
        if not os.path.isdir(folder):
            raise ConfigError(f"{dest}: no such folder")
    return open_sink(dest)
