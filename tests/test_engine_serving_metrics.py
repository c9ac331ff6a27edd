"""Each engine's ``/metrics`` load series live in its profile (``EngineProfile.serving_metrics``);
``engines.registry.serving_metrics`` gives one engine's names, or for a server of unknown engine every
engine's, in the order bench and generate read them. No engine's metric name is spelled in bench/ or generate/.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

import servefleet
from servefleet.bench.server_metrics import Snapshot, parse_prometheus, summarize_server
from servefleet.engines.base import ServingMetrics
from servefleet.engines.registry import engine_names, get_engine, serving_metrics
from servefleet.generate.server_load import sample_from_text
from servefleet.sim.config import SimConfig
from servefleet.sim.info import metrics_text
from servefleet.sim.scheduler import Stats

# What bench/server_metrics.py and generate/server_load.py read before the names moved into the
# engine profiles, in their order of preference (the engines' own names: facts of vLLM, SGLang,
# llama.cpp and TGI).
BEFORE = {
    "running": (
        "vllm:num_requests_running",
        "sglang:num_running_reqs",
        "llamacpp:requests_processing",
        "tgi_batch_current_size",
    ),
    "queued": ("vllm:num_requests_waiting", "sglang:num_queue_reqs", "llamacpp:requests_deferred", "tgi_queue_size"),
    "kv_usage": (
        "vllm:kv_cache_usage_perc",
        "vllm:gpu_cache_usage_perc",
        "sglang:token_usage",
        "llamacpp:kv_cache_usage_ratio",
    ),
    "generation_tokens": (
        "vllm:generation_tokens_total",
        "sglang:generation_tokens_total",
        "llamacpp:tokens_predicted_total",
    ),
    "prompt_tokens": ("vllm:prompt_tokens_total", "sglang:prompt_tokens_total", "llamacpp:prompt_tokens_total"),
    "steps": ("vllm:iteration_tokens_total_count",),
    "preemptions": ("vllm:num_preemptions_total",),
    "spec_drafts": ("vllm:spec_decode_num_drafts_total",),
    "spec_draft_tokens": ("vllm:spec_decode_num_draft_tokens_total",),
    "spec_accepted_tokens": ("vllm:spec_decode_num_accepted_tokens_total",),
    "spec_accept_length": ("sglang:spec_accept_length",),
    "spec_accept_rate": ("sglang:spec_accept_rate",),
    # added since: the prefix cache's lookups and hits, in prompt tokens (vLLM's own counters; SGLang's
    # every finished prompt and its cached part)
    "prefix_looked_up": ("vllm:prefix_cache_queries_total", "sglang:prompt_tokens_total"),
    "prefix_hits": ("vllm:prefix_cache_hits_total", "sglang:cached_tokens_total"),
}
ENGINES = ("vllm", "sglang", "llamacpp", "tgi")  # the engines with load series, in the order of preference


@pytest.mark.parametrize("engine", [None, "openai", "OpenAI", "no-such-engine"])
def test_a_server_of_unknown_engine_is_read_by_the_old_names_in_the_old_order(engine: str | None) -> None:
    assert dataclasses.asdict(serving_metrics(engine)) == BEFORE


def test_every_engines_names_are_in_the_union_in_engine_order() -> None:
    union = serving_metrics()
    for field, names in dataclasses.asdict(union).items():
        # the union is each engine's names, engine after engine: nothing else, nothing reordered
        assert names == tuple(n for e in ENGINES for n in getattr(get_engine(e).serving_metrics, field)), field
    spelled = {
        n for e in ENGINES for names in dataclasses.asdict(get_engine(e).serving_metrics).values() for n in names
    }
    assert spelled == {n for names in BEFORE.values() for n in names}


@pytest.mark.parametrize("engine", ENGINES)
def test_a_known_engine_is_read_by_its_own_names(engine: str) -> None:
    own = get_engine(engine).serving_metrics
    assert serving_metrics(engine) == serving_metrics(engine.upper()) == own
    assert own.running and own.queued, "every engine with load series says how busy it is"
    prefix = get_engine(engine).metrics_prefix
    assert prefix and all(n.startswith(prefix) for names in dataclasses.asdict(own).values() for n in names)


def test_engines_without_load_series_have_none() -> None:
    assert serving_metrics("transformers") == ServingMetrics()


def test_the_union_is_built_once() -> None:
    assert serving_metrics() is serving_metrics()


def test_union_keeps_order_and_drops_repeats() -> None:
    a = ServingMetrics(running=("a", "b"), steps=("s",))
    b = ServingMetrics(running=("b", "c"), queued=("q",))
    assert ServingMetrics.union(a, b) == ServingMetrics(running=("a", "b", "c"), queued=("q",), steps=("s",))
    assert ServingMetrics.union() == ServingMetrics()


def test_every_name_of_the_sims_profile_is_published_by_the_sim() -> None:
    names = serving_metrics("sim")
    text = metrics_text(SimConfig(tokens_per_step=2.5), Stats())  # speculative: its spec series too
    published = {line.split("{")[0].split()[0] for line in text.splitlines() if line and not line.startswith("#")}
    declared = {n for names_ in dataclasses.asdict(names).values() for n in names_}
    assert declared and declared <= published
    assert names.running[0].startswith("vllm:"), "vLLM's names first, as for a server of unknown engine"


def test_llamacpp_and_tgi_series_are_read_by_bench_and_generate() -> None:
    llama = (
        "llamacpp:requests_processing 3\nllamacpp:requests_deferred 2\nllamacpp:kv_cache_usage_ratio 0.25\n"
        "llamacpp:tokens_predicted_total {gen}\nllamacpp:prompt_tokens_total 40\n"
    )
    before, after = parse_prometheus(llama.format(gen=100)), parse_prometheus(llama.format(gen=160))
    s = summarize_server(Snapshot(before), Snapshot(after), [after], max_running=3)
    assert s is not None and s.running_max == 3 and s.queued_max == 2 and s.saturated is True
    assert s.kv_cache_usage_max == pytest.approx(0.25) and s.generation_tokens == 60
    load = sample_from_text(llama.format(gen=160), 1.0)
    assert load is not None and (load.generation_tokens, load.prompt_tokens, load.running, load.waiting) == (
        160,
        40,
        3,
        2,
    )
    tgi = sample_from_text("tgi_batch_current_size 5\ntgi_queue_size 1\n", 2.0)
    assert tgi is not None and (tgi.running, tgi.waiting, tgi.generation_tokens) == (5, 1, None)


def test_vllms_names_are_preferred_where_a_server_publishes_two_families() -> None:
    both = "vllm:num_requests_running 7\nsglang:num_running_reqs 9\nvllm:generation_tokens_total 5\nsglang:generation_tokens_total 6\n"
    load = sample_from_text(both, 0.0)
    assert load is not None and load.running == 7 and load.generation_tokens == 5


# ---- no engine's metric name is spelled in the jobs -------------------------------------------------

PACKAGE = Path(servefleet.__file__).resolve().parent
JOBS = ("bench", "generate")


def _engine_name_pattern() -> re.Pattern[str]:
    prefixes = sorted({p.metrics_prefix for p in (get_engine(n) for n in engine_names()) if p.metrics_prefix})
    assert len(prefixes) >= 4, prefixes
    return re.compile("(?:" + "|".join(re.escape(p) for p in prefixes) + r")[a-z]")


def spelled_engine_names(source: str) -> list[str]:
    """The engine metric names (any registered engine's ``metrics_prefix`` and a name) in ``source``."""
    return [m.group(0) for m in _engine_name_pattern().finditer(source)]


def test_spelled_engine_names_finds_every_family() -> None:
    source = 'X = ("vllm:num_requests_running",)\n# sglang:token_usage\n"""llamacpp:x and tgi_queue_size"""\nvllm: the engine\n'
    assert spelled_engine_names(source) == ["vllm:n", "sglang:t", "llamacpp:x", "tgi_q"]


def test_no_engine_metric_name_is_spelled_in_bench_or_generate() -> None:
    files = [p for job in JOBS for p in sorted((PACKAGE / job).rglob("*.py"))]
    assert len(files) > 10, f"bench/ and generate/ were not found under {PACKAGE}"
    offenders = {
        p.relative_to(PACKAGE).as_posix(): found for p in files if (found := spelled_engine_names(p.read_text()))
    }
    assert offenders == {}, "engine metric names belong in the engine's profile (EngineProfile.serving_metrics)"
