"""`generate`: a bulk job over every ready server -- streamed input, continuous dispatch with
adaptive per-server concurrency, retries, dead servers restarted, sharded output that is its own
ledger (resume after any crash, every id exactly once), to a folder or object storage.

    from servefleet.generate import GenerateConfig, JobParams, run_generate
    report = await run_generate(GenerateConfig(input="prompts.jsonl", output="s3://bucket/run1",
                                               urls=["http://127.0.0.1:30000"], params=JobParams(max_tokens=2048)))

Modules, one job each: ``inputs`` (records), ``prepass`` (fingerprint, rejects, duplicates),
``job`` (manifest), ``sinks`` (folder / object storage), ``shards`` (row buffers and files),
``ledger`` (commit and resume), ``committer``, ``client`` (HTTP), ``retry``, ``concurrency``,
``health``, ``endpoints`` (servers and the fleet link), ``dispatch``, ``stats``, ``report`` (the
summary, as data), ``timeline`` (the bounded time series), ``recorder`` (progress.json and the
timeline, written while the job runs), ``job_record`` (reading a job from its destination),
``metrics`` (Prometheus), ``runner`` (the whole job). The live view and the rendering of the report
are the CLI's (``servefleet.cli.generate_view``, ``progress_cmd``, ``report_html``).
"""

from servefleet.generate.endpoints import FleetRestarter, Restarter, Target
from servefleet.generate.job import JobParams
from servefleet.generate.report import JobReport
from servefleet.generate.runner import GenerateConfig, JobMismatch, run_generate

__all__ = [
    "GenerateConfig",
    "JobParams",
    "JobReport",
    "JobMismatch",
    "Restarter",
    "FleetRestarter",
    "Target",
    "run_generate",
]
