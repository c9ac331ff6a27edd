"""What produced a run's rows: recorded per run in job.json (``RunRecord.provenance``), shown by ``report``.

servefleet's version and the coordinator's host, and per server: engine and its version, the launch
arguments (a fleet server's, masked as its state record keeps them), the model path with a revision
(a Hugging Face cache snapshot's commit) or a content hash (a local folder: file names, sizes and the
small JSON files' bytes -- not the weights' bytes, which would take minutes per run), GPU type and
count, and the host. What a server does not tell (a bare ``--url`` has no launch arguments) is null.
A job resumed on another fleet has a run per fleet in job.json, each with its own servers.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import socket
import subprocess
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import servefleet

if TYPE_CHECKING:
    from servefleet.generate.client import Client
    from servefleet.generate.endpoints import Target

__all__ = ["collect", "fleet_launch", "model_fingerprint", "gpu_types"]

_SMALL = 1 << 20  # JSON files up to this size are hashed by content


async def collect(targets: list[Target], client: Client) -> dict[str, Any]:
    servers = await asyncio.gather(*(_server(t, client) for t in targets))
    return {"servefleet": servefleet.__version__, "coordinator": socket.gethostname(), "servers": list(servers)}


async def _server(t: Target, client: Client) -> dict[str, Any]:
    launch: Mapping[str, Any] = t.launch or {}
    listed = await _get(client, t.base_url + "/v1/models")
    entry = (
        next((m for m in (listed or {}).get("data", []) if isinstance(m, dict)), {})
        if isinstance(listed, dict)
        else {}
    )
    version = await _get(client, t.base_url + "/version")
    model_path = launch.get("model") or entry.get("root") or t.served_model
    local = launch.get("host", "local") == "local"
    finger = await asyncio.to_thread(model_fingerprint, model_path) if local and model_path else {}
    gpus = launch.get("gpus")
    return {
        "name": t.name,
        "base_url": t.base_url,
        "host": launch.get("host") or _url_host(t.base_url),
        "engine": launch.get("engine") or entry.get("owned_by"),
        "engine_version": version.get("version") if isinstance(version, dict) else None,
        "served_model": t.served_model,
        "model_path": model_path,
        **finger,
        "launch_args": list(launch["argv"]) if launch.get("argv") else None,
        "gpu_count": len(gpus) if gpus is not None else None,
        "gpu_type": gpu_types(gpus) if local and gpus else None,
    }


async def _get(client: Client, url: str) -> Any:
    try:
        return await client.http.get_json(url, timeout=client.probe_timeout)
    except Exception:  # provenance is best effort: a server that does not answer this is null here
        return None


def _url_host(url: str) -> str:
    return url.split("://", 1)[-1].split("/", 1)[0].rsplit(":", 1)[0]


def model_fingerprint(path: str) -> dict[str, Any]:
    """``model_revision`` for a Hugging Face cache snapshot, ``model_content_hash`` for a local folder."""
    real = os.path.realpath(os.path.expanduser(path))
    if not os.path.isdir(real):
        return {}
    parts = real.split(os.sep)
    out: dict[str, Any] = {}
    if len(parts) >= 2 and parts[-2] == "snapshots":
        out["model_revision"] = parts[-1]
    digest = hashlib.sha256()
    for root, dirs, files in os.walk(real):
        dirs.sort()
        for name in sorted(files):
            full = os.path.join(root, name)
            size = os.path.getsize(full)
            digest.update(f"{os.path.relpath(full, real)}\0{size}\0".encode())
            if name.endswith(".json") and size <= _SMALL:
                with open(full, "rb") as f:
                    digest.update(f.read())
    out["model_content_hash"] = "sha256:" + digest.hexdigest()
    return out


def gpu_types(gpus: Any) -> list[str] | None:
    """The names of this machine's GPUs of these indexes (nvidia-smi); None without it."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run(
            [exe, "--query-gpu=index,name", "--format=csv,noheader"], capture_output=True, text=True, timeout=10
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    names = dict(line.split(", ", 1) for line in out.splitlines() if ", " in line)
    return [names.get(str(i), "?") for i in gpus]


async def fleet_launch(fleet: Any, name: str) -> dict[str, Any]:
    """A fleet server's launch as its spec and state record have it (argv masked)."""
    spec = fleet.spec.server(name)
    record = await fleet.record(name)
    return {
        "engine": spec.engine,
        "model": spec.model,
        "host": spec.host,
        "gpus": list(spec.gpus) if spec.gpus is not None else None,
        "argv": list(record.argv) if record is not None else list(spec.args),
    }
