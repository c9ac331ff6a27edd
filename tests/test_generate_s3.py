"""generate to object storage: a real S3-protocol server (moto in server mode on loopback), the
CLI in a subprocess, credentials from the environment -- including a SIGKILL while a shard is being
uploaded (a proxy in front of moto holds that upload until the kill)."""

from __future__ import annotations

import asyncio
import json
import signal

import pytest
from aiohttp import ClientSession, web

from conftest import FAST_SIM, PYTHON, SimProcess, free_port, s3_env, s3fs_for
from conftest import S3_SECRET as SECRET
from parquet_read import read_parquet

pytest.importorskip("s3fs")
pytest.importorskip("moto.server")


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory):
    proc = (
        SimProcess(*FAST_SIM, "--max-running", "16", log_path=tmp_path_factory.mktemp("sim") / "sim.log")
        .start()
        .wait_ready()
    )
    yield proc
    proc.stop()


def write_prompts(path, n: int):
    path.write_text("".join(json.dumps({"id": f"p{i}", "prompt": f"prompt {i}"}) + "\n" for i in range(n)))
    return path


def argv(src, dest: str, url: str, *extra: str) -> list[str]:
    return [
        PYTHON,
        "-m",
        "servefleet.cli.main",
        "generate",
        "-i",
        str(src),
        "-o",
        dest,
        "--url",
        url,
        "--max-tokens",
        "4",
        "--json",
        *extra,
    ]


async def run_cli(args: list[str], env: dict[str, str]) -> tuple[int, dict, str]:
    proc = await asyncio.create_subprocess_exec(
        *args, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    try:
        return proc.returncode or 0, json.loads(out), err.decode()
    except ValueError:
        raise AssertionError(f"rc {proc.returncode}: {out.decode()[-2000:]}\n{err.decode()[-3000:]}") from None


def committed_ids(fs, prefix: str) -> list[str]:
    ids: list[str] = []
    for path in sorted(fs.ls(f"{prefix}/shards", detail=False)):
        with fs.open(path, "rb") as f:
            ids.extend(read_parquet(f.read(), columns=["id"]).column("id").to_pylist())
    return ids


async def test_generate_to_s3_and_resume_without_writing_credentials(moto_url, sim, tmp_path):
    fs = s3fs_for(moto_url)
    fs.call_s3("create_bucket", Bucket="bucket")
    src = write_prompts(tmp_path / "in.jsonl", 120)
    rc, report, err = await run_cli(
        argv(src, "s3://bucket/jobs/one", sim.url, "--shard-rows", "25", "--shard-seconds", "600"), s3_env(moto_url)
    )
    assert rc == 0 and report["status"] == "complete", err[-3000:]
    assert report["destination"] == "s3://bucket/jobs/one" and report["shards"] == 5
    names = {p.rsplit("/", 1)[-1] for p in fs.find("bucket/jobs/one")}
    # job manifest, the run's report, its progress snapshot and time series, and one sidecar per shard
    assert {"job.json", "report.json", "progress.json"} <= names and sum(n.endswith(".parquet") for n in names) == 5
    assert sum(n.endswith(".json") for n in names) == 9 and fs.ls("bucket/jobs/one/timeline")
    assert json.loads(fs.cat_file("bucket/jobs/one/report.json"))["committed"] == 120
    assert sorted(committed_ids(fs, "bucket/jobs/one")) == sorted(f"p{i}" for i in range(120))
    for path in fs.find("bucket/jobs/one"):
        assert SECRET.encode() not in fs.cat_file(path) and b"testing" not in fs.cat_file(path)
    rc, again, _ = await run_cli(argv(src, "s3://bucket/jobs/one", sim.url, "--shard-rows", "25"), s3_env(moto_url))
    assert rc == 0 and again["resumed"] and again["done_before"] == 120 and again["to_send"] == 0


class StallProxy:
    """An HTTP proxy to moto that forwards everything except the upload of the n-th shard object,
    which it holds (never answering) and reports."""

    def __init__(self, upstream: str, hold_nth: int) -> None:
        self.upstream = upstream
        self.hold_nth = hold_nth
        self.shard_puts = 0
        self.held = asyncio.Event()
        self.held_key = ""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        app = web.Application(client_max_size=1 << 30)
        app.router.add_route("*", "/{tail:.*}", self.forward)
        self.session = ClientSession(auto_decompress=False)
        self.runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=0.2)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()

    async def stop(self) -> None:
        await self.runner.cleanup()
        await self.session.close()

    async def forward(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        if request.method == "PUT" and "/shards/" in request.path:
            self.shard_puts += 1
            if self.shard_puts == self.hold_nth:
                self.held_key = request.path.lstrip("/")
                self.held.set()
                await asyncio.sleep(3600)  # the client is killed while it waits for this answer
        headers = {
            k: v
            for k, v in request.headers.items()
            if k.lower() not in ("host", "content-length", "transfer-encoding")
        }
        async with self.session.request(
            request.method, self.upstream + request.path_qs, headers=headers, data=body
        ) as up:
            data = await up.read()
            out = {
                k: v
                for k, v in up.headers.items()
                if k.lower() not in ("content-length", "transfer-encoding", "content-encoding")
            }
            return web.Response(status=up.status, body=data, headers=out)


async def test_a_kill_during_a_shard_upload_leaves_no_partial_shard_and_resume_is_exact(moto_url, sim, tmp_path):
    fs = s3fs_for(moto_url)
    fs.call_s3("create_bucket", Bucket="bucket")
    src = write_prompts(tmp_path / "in.jsonl", 150)
    proxy = StallProxy(moto_url, hold_nth=3)
    await proxy.start()
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv(src, "s3://bucket/jobs/two", sim.url, "--shard-rows", "20"),
            env=s3_env(proxy.url),
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        try:
            await asyncio.wait_for(proxy.held.wait(), 60)
        finally:
            proc.send_signal(signal.SIGKILL)
            await proc.wait()
    finally:
        await proxy.stop()
    # Large shards go up in parts: one cut off mid-way is an unfinished multipart upload, which is
    # invisible until completed, and which the next run aborts. (Made here: the held upload is a single PUT.)
    bucket, key = "bucket", "jobs/two/shards/part-20260101T000000-dead-000001.parquet"
    mpu = fs.call_s3("create_multipart_upload", Bucket=bucket, Key=key)
    fs.call_s3(
        "upload_part", Bucket=bucket, Key=key, UploadId=mpu["UploadId"], PartNumber=1, Body=b"PAR1 partial bytes"
    )
    visible = {p.split("/", 1)[1] for p in fs.find("bucket/jobs/two")}
    assert proxy.held_key.split("/", 1)[1] not in visible and key not in visible
    shards = sorted(p for p in visible if p.startswith("jobs/two/shards/"))
    assert len(shards) == 2  # the two uploads that completed before the held one
    ids = committed_ids(fs, "bucket/jobs/two")
    assert len(ids) == len(set(ids)) == 40
    assert fs.call_s3("list_multipart_uploads", Bucket=bucket, Prefix="jobs/two/").get("Uploads")

    rc, report, err = await run_cli(argv(src, "s3://bucket/jobs/two", sim.url, "--shard-rows", "20"), s3_env(moto_url))
    assert rc == 0 and report["status"] == "complete", err[-3000:]
    assert report["done_before"] == 40 and report["committed"] == 110
    assert sorted(committed_ids(fs, "bucket/jobs/two")) == sorted(f"p{i}" for i in range(150))
    assert not fs.call_s3("list_multipart_uploads", Bucket=bucket, Prefix="jobs/two/").get("Uploads")
