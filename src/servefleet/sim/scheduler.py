"""The batching/timing model: ONE loop task steps every running request (see :mod:`.theory`).

Requests never sleep on their own. The loop admits from a FIFO queue at each step boundary (bounded
by ``max_running`` and the KV tokens reserved), sleeps for the step's cost (:mod:`.timing`), then
hands each request its new tokens: a streaming request gets a count per step (one SSE chunk each), a
non-streaming one is woken only when it finishes. In realistic timing a streamed step's event goes
through the :class:`EventPipe` first -- the API process, which sends at most ``api_events_per_s``
events a second -- so a streaming client waits for it while the engine has moved on. With 256+
concurrent requests the cost per step is one pass over a list, which keeps the sim cheap next to the
clients it is measuring.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from servefleet.sim.config import SimConfig
from servefleet.sim.prefix_cache import PrefixCache
from servefleet.sim.timing import tokens_after
from servefleet.stopping import cancel_and_wait

__all__ = ["EventPipe", "Histogram", "SimRequest", "Scheduler", "Stats", "StepInfo"]

# vLLM 0.32's default buckets (vllm/v1/metrics/buckets.py), seconds.
TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
ITL_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
LATENCY_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)


class Histogram:
    """A Prometheus histogram: per-bucket counts (not cumulative here), sum and count."""

    __slots__ = ("bounds", "counts", "sum", "count")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one is +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float, n: int = 1) -> None:
        i = 0
        while i < len(self.bounds) and value > self.bounds[i]:
            i += 1
        self.counts[i] += n
        self.sum += value * n
        self.count += n


class SimRequest:
    """One request's progress through the scheduler."""

    __slots__ = (
        "prompt_tokens",
        "target",
        "reserve",
        "stream",
        "generated",
        "delivered",
        "decode_steps",
        "pending",
        "waiter",
        "done",
        "cancelled",
        "prefilled",
        "arrived",
        "first_token_at",
        "finished_at",
        "prefix_key",
        "cached",
    )

    def __init__(
        self, prompt_tokens: int, target: int, reserve: int, stream: bool, prefix_key: int | None = None
    ) -> None:
        self.prompt_tokens = prompt_tokens
        self.prefix_key = prefix_key  # the prompt's identity for the prefix cache (None: never cached)
        self.cached = 0  # prompt tokens the prefix cache held when it was admitted
        self.target = target  # tokens it will produce (max_tokens, or fewer when EOS comes early)
        self.reserve = reserve  # KV tokens held while it runs (prompt + max_tokens)
        self.stream = stream
        self.generated = 0
        self.delivered = 0  # tokens handed to the stream (after the API process, in realistic timing)
        self.decode_steps = 0
        self.pending: list[int] = []  # token counts per step not yet sent (streaming only)
        self.waiter: asyncio.Future[None] | None = None
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.cancelled = False
        self.prefilled = False
        self.arrived = time.monotonic()
        self.first_token_at: float | None = None
        self.finished_at: float | None = None

    @property
    def finished(self) -> bool:
        return self.generated >= self.target

    async def next_steps(self) -> list[int]:
        """Token counts of the steps since the last call (waits for at least one, or the end)."""
        while not self.pending and self.delivered < self.target and not self.cancelled:
            self.waiter = asyncio.get_running_loop().create_future()
            await self.waiter
            self.waiter = None
        steps, self.pending = self.pending, []
        return steps


@dataclass
class Stats:
    """Counters shared by the scheduler, the instant path and /metrics."""

    prompt_tokens_total: int = 0
    generation_tokens_total: int = 0
    requests_finished: int = 0
    spec_accepted_total: int = 0
    spec_draft_total: int = 0
    spec_drafts_total: int = 0
    steps: int = 0
    running: int = 0
    waiting: int = 0
    used_tokens: int = 0
    prefix: PrefixCache = field(default_factory=lambda: PrefixCache(0))  # the server sizes it to its KV cache

    def __post_init__(self) -> None:
        self._samples: deque[tuple[float, int]] = deque(maxlen=64)
        # Request latencies as the engine sees them (from arrival; engine-side times, so a streamed
        # request's wait in the API process is not in them).
        self.ttft = Histogram(TTFT_BUCKETS)
        self.tpot = Histogram(ITL_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)
        self.e2e = Histogram(LATENCY_BUCKETS)

    def observe_finished(self, req: SimRequest, now: float) -> None:
        first = req.first_token_at
        self.e2e.observe(now - req.arrived)
        if first is None:
            return
        self.ttft.observe(first - req.arrived)
        if req.generated > 1:
            self.tpot.observe((now - first) / (req.generated - 1))
        if req.decode_steps:
            self.itl.observe((now - first) / req.decode_steps, req.decode_steps)

    def sample(self, now: float) -> None:
        if not self._samples or now - self._samples[-1][0] >= 0.25:
            self._samples.append((now, self.generation_tokens_total))

    def gen_throughput(self, now: float, window_s: float = 5.0) -> float:
        """Output tokens/s over the last few seconds (SGLang's gen_throughput)."""
        if not self._samples:
            return 0.0
        old_t, old_n = self._samples[0]
        for t, n in self._samples:
            if now - t <= window_s:
                old_t, old_n = t, n
                break
        if now - old_t <= 0:
            return 0.0
        return (self.generation_tokens_total - old_n) / (now - old_t)


@dataclass(frozen=True)
class StepInfo:
    """What one step did, for the engine-style batch log lines."""

    admitted: int
    admitted_tokens: int
    batch: int
    waiting: int
    used_tokens: int
    step_s: float


def _hand_over(req: SimRequest, n: int) -> None:
    """Give a streaming request ``n`` more tokens (one SSE chunk) and wake its handler."""
    req.pending.append(n)
    req.delivered += n
    w = req.waiter
    if w is not None and not w.done():
        w.set_result(None)


class EventPipe:
    """The API process of a realistic sim: streamed events leave one after another, ``1 / rate`` seconds
    each (vLLM's API server sends one SSE event per step per request; on the H200 that capped
    streaming at ~18.5k tok/s). Events are released in small batches, at most every millisecond."""

    def __init__(self, events_per_s: float) -> None:
        self.cost_s = 1.0 / events_per_s
        self.queue: deque[tuple[float, SimRequest, int]] = deque()
        self.free_at = 0.0  # when the API process is done with the events already sent
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def push(self, at: float, req: SimRequest, n: int) -> None:
        self.queue.append((at, req, n))
        self._wake.set()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self.run(), name="sim-api-events")

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        queue, cost = self.queue, self.cost_s
        while True:
            if not queue:
                self._wake.clear()
                await self._wake.wait()
                continue
            now = loop.time()
            while queue:
                at, req, n = queue[0]
                sent = max(self.free_at, at) + cost
                if sent > now:
                    break
                queue.popleft()
                self.free_at = sent
                if not req.cancelled:
                    _hand_over(req, n)
            if queue:
                at = queue[0][0]
                await asyncio.sleep(max(max(self.free_at, at) + cost - loop.time(), 0.001))


class Scheduler:
    def __init__(self, config: SimConfig, stats: Stats, on_step: Callable[[StepInfo], None] | None = None) -> None:
        self.cfg = config
        self.steps = config.steps
        self.prefix = stats.prefix
        rate = self.steps.api_events_per_s
        self.pipe = EventPipe(rate) if rate else None
        self.stats = stats
        self.on_step = on_step
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.kv_reserved = 0
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    # ---- requests -------------------------------------------------------------------------------
    def submit(self, req: SimRequest) -> None:
        self.waiting.append(req)
        self.stats.waiting = len(self.waiting)
        self._wake.set()

    def cancel(self, req: SimRequest) -> None:
        """The client went away: free its slot and KV at once."""
        if req.cancelled or req.done.done():
            return
        req.cancelled = True
        try:
            self.waiting.remove(req)
        except ValueError:
            if req in self.running:
                self.running.remove(req)
                self.kv_reserved -= req.reserve
        self.stats.waiting = len(self.waiting)
        self.stats.running = len(self.running)
        req.done.set_result(None)

    # ---- loop -----------------------------------------------------------------------------------
    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self.run(), name="sim-scheduler")
        if self.pipe is not None:
            self.pipe.start()

    async def stop(self) -> None:
        if self.pipe is not None:
            await self.pipe.stop()
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None

    def _admit(self) -> list[SimRequest]:
        admitted: list[SimRequest] = []
        cfg = self.cfg
        while self.waiting and len(self.running) < cfg.max_running:
            head = self.waiting[0]
            if self.kv_reserved + head.reserve > cfg.kv_tokens:
                break  # FIFO: the head waits for KV, and so does everyone behind it
            self.waiting.popleft()
            self.running.append(head)
            self.kv_reserved += head.reserve
            head.cached = self.prefix.admit(head.prefix_key, head.prompt_tokens)
            admitted.append(head)
        return admitted

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        cfg = self.cfg
        k = cfg.tokens_per_step
        stats = self.stats
        next_at: float | None = None  # planned end of the previous step (keeps the cadence under jitter)
        while True:
            admitted = self._admit()
            stats.waiting = len(self.waiting)
            stats.running = len(self.running)
            if admitted:
                # An admitted request holds its prompt's KV from now on, before its first step: a
                # /metrics scrape in between must not show running requests on an empty cache.
                stats.used_tokens += sum(r.prompt_tokens for r in admitted)
            if not self.running:
                self._wake.clear()
                next_at = None
                await self._wake.wait()
                continue
            batch = list(self.running)
            new_tokens = sum(r.prompt_tokens - r.cached for r in admitted)  # a cached prefix is not prefilled
            step_s = (self.steps.step_ms(len(batch)) + cfg.prefill_ms_per_1k_tokens * new_tokens / 1000.0) / 1000.0
            now = loop.time()
            # Start where the last step planned to end, unless we fell more than a step behind.
            start = next_at if next_at is not None and now - next_at < max(step_s, 0.002) else now
            end = start + step_s
            delay = end - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                await asyncio.sleep(0)  # let handlers run even when steps cost nothing
            next_at = end
            stats.steps += 1
            stats.prompt_tokens_total += sum(r.prompt_tokens for r in admitted)
            self._advance(batch, k, loop.time())
            stats.running = len(self.running)
            stats.waiting = len(self.waiting)
            stats.sample(time.monotonic())
            if self.on_step is not None:
                self.on_step(
                    StepInfo(len(admitted), new_tokens, len(batch), len(self.waiting), stats.used_tokens, step_s)
                )

    def _advance(self, batch: list[SimRequest], k: float, now: float) -> None:
        stats = self.stats
        pipe = self.pipe
        drafts = self.cfg.spec_draft_tokens
        produced = 0
        used = 0
        finished: list[SimRequest] = []
        for req in batch:
            if req.cancelled:
                continue
            if req.prefilled:
                req.decode_steps += 1
                n = min(1 + tokens_after(req.decode_steps, k) - req.generated, req.target - req.generated)
                if drafts:
                    stats.spec_drafts_total += 1
                    stats.spec_draft_total += drafts
                    stats.spec_accepted_total += max(n - 1, 0)
            else:
                req.prefilled = True
                req.first_token_at = now
                n = min(1, req.target - req.generated)
            req.generated += n
            produced += n
            used += req.prompt_tokens + req.generated
            if req.stream and n:
                if pipe is None:
                    _hand_over(req, n)
                else:
                    pipe.push(now, req, n)
            if req.generated >= req.target:
                req.finished_at = now
                finished.append(req)
        stats.generation_tokens_total += produced
        if finished:
            gone = set(finished)
            self.running = [r for r in self.running if r not in gone]
        for req in finished:
            self.kv_reserved -= req.reserve
            used -= req.prompt_tokens + req.generated
            stats.requests_finished += 1
            stats.observe_finished(req, now)
            w = req.waiter
            if w is not None and not w.done():
                w.set_result(None)
            if not req.done.done():
                req.done.set_result(None)
        stats.used_tokens = used
