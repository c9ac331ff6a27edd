"""`tune`: which engine configuration finishes *this* job soonest on *these* GPUs, decided from the
job's own prompts -- each candidate of a space file launched as a temporary server, verified, measured
in the job's mode, stopped, and ranked by the planner's predicted makespan -- and then, if asked, the job.

    prep = prepare(TuneRequest(fleet=Path("base.toml"), space=Path("space.toml"), input=Path("prompts.jsonl"), out=Path("tune")))
    result = await run_tune(prep)          # TuneResult: ranked rows, RUN.json per candidate

Modules: ``space`` (the space file), ``candidates`` (candidate -> one-server fleet file, the winner's
fleet), ``sample`` (the job's prompts, sampled), ``measure`` (the concurrency ladder of one server),
``search`` (launch, verify, measure, stop early, budget, rank), ``then`` (--then-generate), ``result``.
"""

from servefleet.tune.result import CandidateRow, Prediction, TuneResult
from servefleet.tune.search import Prepared, TuneRequest, prepare, run_tune
from servefleet.tune.space import Candidate, Space, TuneSettings, load_space

__all__ = [
    "Candidate",
    "CandidateRow",
    "Prediction",
    "Prepared",
    "Space",
    "TuneRequest",
    "TuneResult",
    "TuneSettings",
    "load_space",
    "prepare",
    "run_tune",
]
