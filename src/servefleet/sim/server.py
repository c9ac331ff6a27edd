"""The sim's HTTP server (aiohttp): OpenAI endpoints, health, metrics, info, request faults.

Timed requests go through the one :class:`~servefleet.sim.scheduler.Scheduler` loop; in instant mode
(no time model at all) a request is answered at once from precomputed text, so a client-overhead
benchmark measures the client, not the sim. Process-level faults (crash after N requests, dying on
the first request) call back into the process layer (:mod:`.startup`) through ``exit_with``.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Awaitable, Callable
from functools import lru_cache

from aiohttp import web

from servefleet.sim import info
from servefleet.sim.config import SimConfig
from servefleet.sim.failures import Failure, first_request_crash
from servefleet.sim.faults import RequestFaults
from servefleet.sim.logline import LogWriter
from servefleet.sim.openai_api import DONE, ApiError, Job, StreamEncoder, error_body, full_body, parse_job
from servefleet.sim.prefix_cache import PrefixCache
from servefleet.sim.scheduler import Scheduler, SimRequest, Stats, StepInfo
from servefleet.sim.styles import access_line, sglang_batch_line, vllm_stats_lines
from servefleet.sim.timing import tokens_after
from servefleet.sim.tokens import TextBank, render_chat, token_ids

__all__ = ["SimServer"]

_SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    429: "Too Many Requests",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


def _dumps(obj: object) -> str:
    return json.dumps(obj, separators=(",", ":"))


def _json(obj: object, status: int = 200) -> web.Response:
    return web.json_response(obj, status=status, dumps=_dumps)


def _error(status: int, message: str, kind: str) -> web.Response:
    return _json(error_body(status, message, kind), status=status)


class SimServer:
    """State and handlers of one simulated server. ``ready`` flips when start-up ends."""

    def __init__(
        self,
        cfg: SimConfig,
        log: LogWriter,
        port: int,
        exit_with: Callable[[Failure], None],
        hard_exit: Callable[[str], None],
    ) -> None:
        self.cfg = cfg
        self.log = log
        self.port = port
        self.exit_with = exit_with  # print a failure's text and end the process as it says
        self.hard_exit = hard_exit  # end the process silently ("exit" or "kill")
        self.stats = Stats(prefix=PrefixCache(cfg.kv_tokens))
        self.bank = TextBank(cfg.context_length)
        self.scheduler = Scheduler(cfg, self.stats, on_step=self._on_step)
        self.faults = RequestFaults(cfg)
        self.ready = False
        self.completed = 0
        self.created = int(time.time())
        self._decode_steps = 0
        self._crash: asyncio.Task[None] | None = None
        self._last_stats = (time.monotonic(), 0, 0)

    # ---- application ----------------------------------------------------------------------------
    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._access] if self.cfg.access_log else [], client_max_size=64 * 2**20)
        get, post = web.get, web.post
        app.add_routes(
            [
                get("/health", self.health),
                get("/health_generate", self.health_generate),
                get("/ping", self.health),
                get("/v1/models", self.models),
                get("/metrics", self.metrics),
                get("/version", self.version),
                get("/server_info", self.server_info),
                get("/get_server_info", self.server_info),
                get("/get_model_info", self.model_info),
                get("/model_info", self.model_info),
                post("/tokenize", self.tokenize),
                post("/v1/completions", self.completions),
                post("/v1/chat/completions", self.chat_completions),
            ]
        )
        app.on_startup.append(self._start)
        app.on_cleanup.append(self._stop)
        return app

    async def _start(self, app: web.Application) -> None:
        if not self.cfg.instant:
            self.scheduler.start()

    async def _stop(self, app: web.Application) -> None:
        await self.scheduler.stop()

    @web.middleware
    async def _access(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        resp = await handler(request)
        peer = request.transport.get_extra_info("peername") if request.transport else None
        who = f"{peer[0]}:{peer[1]}" if peer else "127.0.0.1:0"
        self.log.emit(
            [access_line(self.cfg, who, request.method, request.path_qs, resp.status, _REASONS.get(resp.status, ""))]
        )
        return resp

    # ---- health and info ------------------------------------------------------------------------
    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self.ready else 503)

    async def health_generate(self, request: web.Request) -> web.Response:
        if not self.ready:
            return web.Response(status=503)
        if self.cfg.die_on_first_request:
            self.exit_with(first_request_crash(self.cfg, self.port))
        if not self.cfg.instant:  # one real token through the scheduler, as SGLang does
            req = SimRequest(1, 1, 2, stream=False)
            self.scheduler.submit(req)
            await req.done
        return web.Response(status=200)

    async def models(self, request: web.Request) -> web.Response:
        return _json(info.models_body(self.cfg, self.created))

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=info.metrics_text(self.cfg, self.stats), content_type="text/plain", charset="utf-8")

    async def version(self, request: web.Request) -> web.Response:
        return _json({"version": self.cfg.version})

    async def server_info(self, request: web.Request) -> web.Response:
        if not self.cfg.server_info:
            raise web.HTTPNotFound()
        return _json(info.server_info(self.cfg, self.stats, self.port))

    async def model_info(self, request: web.Request) -> web.Response:
        return _json(info.model_info(self.cfg))

    async def tokenize(self, request: web.Request) -> web.Response:
        try:
            body = json.loads(await request.read())
        except ValueError:
            return _error(400, "the request body is not valid JSON", "BadRequestError")
        if isinstance(body, dict) and isinstance(body.get("messages"), list):
            text = render_chat(body["messages"])
        elif isinstance(body, dict) and isinstance(prompt := body.get("prompt", body.get("text")), str):
            text = prompt
        else:
            return _error(400, "give a prompt (string) or messages (list)", "BadRequestError")
        ids = token_ids(text)
        return _json({"tokens": ids, "count": len(ids), "max_model_len": self.cfg.context_length, "token_strs": None})

    # ---- completions ----------------------------------------------------------------------------
    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._complete(request, chat=False)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._complete(request, chat=True)

    async def _complete(self, request: web.Request, chat: bool) -> web.StreamResponse:
        if not self.ready:
            return _error(503, "The server is not ready yet.", "ServiceUnavailableError")
        if self.cfg.die_on_first_request:
            self.exit_with(first_request_crash(self.cfg, self.port))
        try:
            body = json.loads(await request.read())
        except ValueError:
            return _error(400, "the request body is not valid JSON", "BadRequestError")
        draw = self.faults.draw()
        if draw.status == 500:
            return _error(500, "Internal server error (injected by the simulator)", "InternalServerError")
        if draw.status == 429:
            return _error(429, "Too many requests (injected by the simulator)", "RateLimitError")
        try:
            job = parse_job(body, chat=chat, cfg=self.cfg)
        except ApiError as exc:
            return _error(exc.status, exc.message, exc.kind)
        if draw.slow_s:
            await asyncio.sleep(draw.slow_s)
        if self.cfg.instant:
            resp = await self._instant(request, job)
        else:
            resp = await self._timed(request, job)
        self.completed += 1
        if self.cfg.crash_after is not None and self.completed >= self.cfg.crash_after:
            if not resp.prepared:
                await resp.prepare(request)
            await resp.write_eof()
            # Not in this handler: the client closing after it read the answer cancels the handler.
            self._crash = asyncio.get_running_loop().create_task(self._crash_when_delivered(request.transport))
        return resp

    async def _crash_when_delivered(self, transport: asyncio.Transport | None) -> None:
        await _delivered(transport)
        self.hard_exit(self.cfg.crash_mode)

    def _full(self, job: Job) -> dict:
        return full_body(
            job, self.bank.text(job.start, 0, job.target), [self.bank.text(s, 0, t) for s, t, _ in job.more]
        )

    async def _instant(self, request: web.Request, job: Job) -> web.StreamResponse:
        stats = self.stats
        stats.prompt_tokens_total += job.prompt_tokens
        stats.prefix.admit(hash(job.prompt_text), job.prompt_tokens)
        stats.generation_tokens_total += job.target
        stats.requests_finished += 1
        if not job.stream:
            return _json(self._full(job))
        enc = StreamEncoder(job)
        pieces = _pieces(self.bank, job.start, job.target, self.cfg.tokens_per_step)
        last = len(pieces) - 1
        data = enc.role() + b"".join(
            enc.chunk(p, job.finish_reason if i == last else None) for i, p in enumerate(pieces)
        )
        resp = web.StreamResponse(headers=_SSE_HEADERS)
        await resp.prepare(request)
        await resp.write(data + enc.usage(job.target) + DONE)
        await resp.write_eof()
        return resp

    async def _timed(self, request: web.Request, job: Job) -> web.StreamResponse:
        req = SimRequest(
            job.prompt_tokens,
            job.target,
            job.prompt_tokens + job.max_tokens,
            stream=job.stream,
            prefix_key=hash(job.prompt_text),
        )
        try:
            if not job.stream:
                self.scheduler.submit(req)
                await req.done
                return _json(self._full(job))
            enc = StreamEncoder(job)
            resp = web.StreamResponse(headers=_SSE_HEADERS)
            await resp.prepare(request)
            role = enc.role()
            if role:
                await resp.write(role)
            self.scheduler.submit(req)
            sent = 0
            while sent < job.target:
                parts = []
                for n in await req.next_steps():
                    start, sent = sent, sent + n
                    parts.append(
                        enc.chunk(
                            self.bank.text(job.start, start, sent), job.finish_reason if sent >= job.target else None
                        )
                    )
                if parts:
                    await resp.write(b"".join(parts))
            await resp.write(enc.usage(job.target) + DONE)
            await resp.write_eof()
            return resp
        except (asyncio.CancelledError, ConnectionResetError):
            self.scheduler.cancel(req)
            raise

    # ---- engine-style batch log lines -----------------------------------------------------------
    def _on_step(self, step: StepInfo) -> None:
        cfg = self.cfg
        now = time.monotonic()
        if cfg.style == "sglang":
            if step.admitted:
                self.log.emit(
                    [
                        sglang_batch_line(
                            cfg,
                            prefill=True,
                            new_seq=step.admitted,
                            new_tokens=step.admitted_tokens,
                            running=step.batch - step.admitted,
                            queued=step.waiting,
                            used_tokens=step.used_tokens,
                            gen_throughput=0.0,
                        )
                    ]
                )
            self._decode_steps += 1
            if self._decode_steps % 40 == 0:
                self.log.emit(
                    [
                        sglang_batch_line(
                            cfg,
                            prefill=False,
                            new_seq=0,
                            new_tokens=0,
                            running=self.stats.running,
                            queued=step.waiting,
                            used_tokens=step.used_tokens,
                            gen_throughput=self.stats.gen_throughput(now),
                        )
                    ]
                )
            return
        t0, p0, g0 = self._last_stats
        if now - t0 >= cfg.log_interval:
            s = self.stats
            self.log.emit(
                vllm_stats_lines(
                    cfg,
                    prompt_tps=(s.prompt_tokens_total - p0) / (now - t0),
                    gen_tps=(s.generation_tokens_total - g0) / (now - t0),
                    running=s.running,
                    waiting=s.waiting,
                    kv_usage=s.used_tokens / cfg.kv_tokens,
                    accepted=s.spec_accepted_total,
                    drafted=s.spec_draft_total,
                )
            )
            self._last_stats = (now, s.prompt_tokens_total, s.generation_tokens_total)


async def _delivered(transport: asyncio.Transport | None, limit_s: float = 1.0) -> None:
    """Let the last answer leave before a crash: flush, then FIN, so the client reads it whole
    (an exit with bytes still queued, or with the peer's next bytes unread, resets the connection)."""
    if transport is None or transport.is_closing():
        return
    deadline = time.monotonic() + limit_s
    while transport.get_write_buffer_size() and time.monotonic() < deadline:
        await asyncio.sleep(0.005)
    sock = transport.get_extra_info("socket")
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass
    await asyncio.sleep(0.05)


@lru_cache(maxsize=8192)
def _pieces(bank: TextBank, start: int, target: int, k: float) -> tuple[str, ...]:
    """The text of each step of an instant stream: 1 token (prefill), then k per step (a mean)."""
    out = [bank.text(start, 0, min(1, target))]
    pos, steps = 1, 0
    while pos < target:
        steps += 1
        nxt = min(1 + tokens_after(steps, k), target)
        out.append(bank.text(start, pos, nxt))
        pos = nxt
    return tuple(out)
