"""The final summary of a run: a pydantic model (what ``--json`` prints; the CLI renders it:
``servefleet.cli.generate_view``)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from servefleet.generate.stats import JobStats

__all__ = ["ServerReport", "JobReport", "build_report"]


class ServerReport(BaseModel):
    name: str
    base_url: str
    state: str
    state_reason: str = ""  # why it is out for good: a crash loop, stopped or drained by the user
    requests: int
    errors: int
    completion_tokens: int
    prompt_tokens: int
    output_tokens_per_s: float
    mean_latency_s: float
    final_concurrency: int
    limit_source: str = ""  # fixed | bench | capacity | search
    limit_reason: str = ""  # the concurrency controller's last decision
    outages: int
    restarts: int
    # share of the job's prompt tokens the server found in its prefix cache (its /metrics; None: not told)
    prefix_cache_hit_rate: float | None = None


class JobReport(BaseModel):
    status: str  # complete | incomplete | stalled | interrupted | rejected | failed_fast
    destination: str
    input: str
    run_id: str | None = None
    resumed: bool = False
    total: int = 0  # valid ids in the input
    records: int = 0  # every input record: the valid ones and the rejected ones (rejects.jsonl)
    rejected: int = 0
    duplicates: int = 0
    done_before: int = 0
    to_send: int = 0
    done: int = 0
    committed: int = 0
    failed: int = 0
    retries: int = 0
    requeued: int = 0
    remaining: int = 0  # valid ids not in any committed shard after this run
    shards: int = 0
    completion_tokens: int = 0
    prompt_tokens: int = 0
    wall_s: float = 0.0
    output_tokens_per_s: float = 0.0
    startup_s: float = 0.0  # from the start until the first request could go out
    peak_rss_mb: float | None = None
    servers: list[ServerReport] = Field(default_factory=list)
    events: list[str] = Field(default_factory=list)
    membership: dict[str, int] = Field(default_factory=dict)  # an elastic job's joins, leaves, replacements, releases
    files: dict[str, str] = Field(default_factory=dict)
    message: str | None = None

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


def _rounded(rate: float | None) -> float | None:
    return None if rate is None else round(rate, 4)


def build_report(stats: JobStats, **fields: Any) -> JobReport:
    wall = stats.elapsed_s()
    servers = [
        ServerReport(
            name=s.name,
            base_url=s.base_url,
            state=s.state,
            state_reason=s.state_reason,
            requests=s.requests,
            errors=s.errors,
            completion_tokens=s.completion_tokens,
            prompt_tokens=s.prompt_tokens,
            output_tokens_per_s=round(s.completion_tokens / wall, 2) if wall > 0 else 0.0,
            mean_latency_s=round(s.mean_latency_s(), 4),
            final_concurrency=s.limit,
            limit_source=s.limit_source,
            limit_reason=s.limit_reason,
            outages=s.outages,
            restarts=s.restarts,
            prefix_cache_hit_rate=_rounded(s.prefix_cache.hit_rate()),
        )
        for s in stats.servers.values()
    ]
    return JobReport(
        total=stats.total,
        done_before=stats.done_before,
        to_send=stats.to_send,
        done=stats.done,
        committed=stats.committed,
        failed=stats.failed,
        retries=stats.retries,
        requeued=stats.requeued,
        rejected=stats.rejected,
        shards=stats.shards,
        completion_tokens=stats.completion_tokens,
        prompt_tokens=stats.prompt_tokens,
        wall_s=round(wall, 3),
        output_tokens_per_s=round(stats.completion_tokens / wall, 2) if wall > 0 else 0.0,
        servers=servers,
        events=list(stats.events),
        membership=dict(stats.membership),
        **fields,
    )
