"""`servefleet tune` on the sim: the ranking follows the job's own prompts, a failed candidate is a row,
the budget cuts the search (and says so), --then-generate runs the job once and the plan holds; bad
input is refused before anything is launched (exit 3)."""

from __future__ import annotations

import asyncio
import io
import json
import math
import random
import sys
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from conftest import free_port
from parquet_read import read_parquet
from servefleet.cli.main import app
from servefleet.sim.config import SimConfig
from servefleet.sim.theory import theoretical_output_tokens_per_s
from servefleet.tune import TuneRequest, prepare, run_tune
from servefleet.tune.space import load_space

# KV for ~36 short requests (20 words + 32 tokens) but only ~5 long ones (300 words + 128 tokens)
SIM = [
    "--load-time",
    "0.2",
    "--style",
    "vllm",
    "--max-running-requests",
    "64",
    "--max-total-tokens",
    "2200",
    "--prefill-ms-per-1k-tokens",
    "2",
]
SPEC = [
    "--tokens-per-step",
    "4",
    "--spec-ms-per-running",
    "1.0",
]  # 4 tokens a step, each running request verified at a cost
SETTINGS = "[tune]\npoint_requests = 16\n"


def base_fleet(tmp: Path, servers: int = 1, extra: str = "") -> Path:
    path = tmp / "base.toml"
    body = "".join(f'\n[[servers]]\nname = "s{i}"\nport = {free_port()}\n{extra}' for i in range(servers))
    path.write_text(
        f'[fleet]\nname = "tb"\ntimeout = 60\nstall = 30\n\n[defaults]\nengine = "sim"\nmodel = "sim-7b"\n'
        f"python = {json.dumps(sys.executable)}\nargs = {json.dumps(SIM)}\n{body}"
    )
    return path


def space(tmp: Path, text: str) -> Path:
    path = tmp / "space.toml"
    path.write_text(text)
    return path


def prompts(tmp: Path, n: int, words: tuple[int, int], max_tokens: int, name: str = "job.jsonl") -> Path:
    rng = random.Random(7)
    path = tmp / name
    path.write_text(
        "".join(
            json.dumps({"id": f"p{i}", "prompt": " ".join(["word"] * rng.randint(*words)), "max_tokens": max_tokens})
            + "\n"
            for i in range(n)
        )
    )
    return path


def tune(
    tmp: Path, fleet: Path, space_file: Path, job: Path, *extra: str, plot: bool = False
) -> tuple[int, dict, str]:
    result = CliRunner().invoke(
        app,
        [
            "tune",
            "--fleet",
            str(fleet),
            "--space",
            str(space_file),
            "--input",
            str(job),
            "--sample",
            "100",
            "--out",
            str(tmp / "out"),
            "--plot" if plot else "--no-plot",
            "--json",
            *extra,
        ],
    )
    out = result.stdout
    doc = json.loads(out[out.index("{") :]) if "{" in out else {}
    return result.exit_code, doc, result.output


PLAIN_VS_SPEC = (
    SETTINGS + f'[[candidate]]\nname = "plain"\n\n[[candidate]]\nname = "spec"\nargs = {json.dumps(SPEC)}\n'
)


def test_the_sim_speculative_gain_fades_as_the_batch_grows() -> None:
    plain = SimConfig(max_running=64, kv_tokens=1 << 20, prefill_ms_per_1k_tokens=2)
    spec = SimConfig(
        max_running=64, kv_tokens=1 << 20, prefill_ms_per_1k_tokens=2, tokens_per_step=4, spec_ms_per_running=1.0
    )
    free = SimConfig(max_running=64, kv_tokens=1 << 20, prefill_ms_per_1k_tokens=2, tokens_per_step=4)

    def ratio(cfg: SimConfig, c: int) -> float:
        return theoretical_output_tokens_per_s(cfg, c, output_tokens=128) / theoretical_output_tokens_per_s(
            plain, c, output_tokens=128
        )

    assert ratio(spec, 1) > 1.5 and ratio(spec, 32) < 0.9  # ahead alone, behind in a big batch
    assert ratio(free, 32) > 1.5  # without the verification cost it never falls behind


@pytest.mark.parametrize(("words", "max_tokens", "winner"), [((10, 25), 32, "plain"), ((250, 330), 128, "spec")])
def test_the_ranking_follows_the_jobs_prompt_lengths(
    tmp_path: Path, words: tuple[int, int], max_tokens: int, winner: str
) -> None:
    # short prompts: KV holds many requests, a big batch, where speculative decoding falls behind;
    # long ones: KV holds ~5, where it is ahead. Same two candidates, same fleet; only the job differs.
    code, doc, text = tune(
        tmp_path,
        base_fleet(tmp_path),
        space(tmp_path, PLAIN_VS_SPEC),
        prompts(tmp_path, 3000, words, max_tokens),
        "--gpus",
        "1,4",
    )
    assert code == 0, text
    assert doc["winner"] == winner
    rows = {r["name"]: r for r in doc["candidates"]}
    assert rows[winner]["outcome"] == "measured"
    assert {r["outcome"] for r in rows.values()} <= {
        "measured",
        "stopped_early",
    }  # the loser may be stopped once clearly behind
    for row in rows.values():
        assert [p["gpus"] for p in row["predictions"]] == [1, 4]
        assert row["predictions"][1]["makespan_s"] < row["predictions"][0]["makespan_s"]
        assert row["max_running"] == 64 and row["kv_tokens"] == 2200 and row["time_to_ready_s"] > 0
        assert Path(row["run"]).is_file() and row["concurrencies"][0] == 8
    assert rows["spec"]["acceptance"] is not None and rows["plain"]["acceptance"] is None
    # the RUN.json is what plan takes
    plan = CliRunner().invoke(
        app, ["plan", "--bench", rows[winner]["run"], "--prompts", "3000", "--output-tokens-mean", "30", "--json"]
    )
    assert plan.exit_code == 0, plan.output
    assert "[[servers]]" in Path(doc["winner_fleet"]).read_text()


def test_a_candidate_with_a_bad_flag_is_a_failed_row_and_the_rest_are_ranked(tmp_path: Path) -> None:
    text = SETTINGS + '[[candidate]]\nname = "typo"\nargs = ["--max-num-seqz", "8"]\n\n[[candidate]]\nname = "plain"\n'
    code, doc, out = tune(
        tmp_path, base_fleet(tmp_path), space(tmp_path, text), prompts(tmp_path, 500, (10, 25), 32), plot=True
    )
    assert code == 0, out
    assert doc["winner"] == "plain"
    for png in ("tune-throughput.png", "tune-latency.png", "tune-makespan.png"):
        assert (tmp_path / "out" / png).stat().st_size > 1000
    failed = next(r for r in doc["candidates"] if r["name"] == "typo")
    assert failed["outcome"] == "failed" and failed["category"] == "config_error"
    assert "--max-num-seqz" in failed["evidence"]
    assert doc["ran"] == ["plain", "typo"] and doc["skipped"] == []


def test_relative_paths_and_the_default_out_work_from_the_callers_folder(tmp_path: Path, monkeypatch) -> None:
    # every path as a user types it, relative to where they stand, and --out left at its default: the
    # candidates' fleet files under tune-out/fleets once named their state folder relative to themselves,
    # so each server's wrapper found no folder for its log and every candidate read 'killed'
    base, spc = base_fleet(tmp_path), space(tmp_path, SETTINGS + '[[candidate]]\nname = "plain"\n')
    job = prompts(tmp_path, 200, (10, 25), 32)
    monkeypatch.chdir(tmp_path)
    argv = ["tune", "--fleet", base.name, "--space", spc.name, "--input", job.name, "--sample", "100"]
    result = CliRunner().invoke(app, [*argv, "--no-plot", "--json"])
    doc = json.loads(result.stdout[result.stdout.index("{") :])
    assert result.exit_code == 0, result.output
    assert [(r["name"], r["outcome"]) for r in doc["candidates"]] == [("plain", "measured")]
    assert (tmp_path / "tune-out" / "state" / "logs" / "plain.log").is_file()
    assert not (tmp_path / "tune-out" / "fleets" / "tune-out").exists()


def test_a_budget_cuts_the_search_and_the_output_says_so(tmp_path: Path) -> None:
    three = SETTINGS + "".join(
        f'[[candidate]]\nname = "c{i}"\nargs = ["--max-running-requests", "{8 * (i + 1)}"]\n' for i in range(3)
    )
    request = TuneRequest(
        fleet=base_fleet(tmp_path),
        space=space(tmp_path, three),
        input=prompts(tmp_path, 500, (10, 25), 32),
        out=tmp_path / "out",
        sample=50,
        budget_s=150.0,
    )
    # the budget's clock: each launch costs 100 s, so after the first candidate less is left than one takes
    clock = [0.0]

    def event(msg: str) -> None:
        if msg.endswith(": launching"):
            clock[0] += 100.0

    result = asyncio.run(run_tune(prepare(request), on_event=event, now=lambda: clock[0]))
    outcomes = {r.name: r.outcome for r in result.rows}
    assert outcomes == {"c0": "measured", "c1": "skipped", "c2": "skipped"}
    assert "budget" in (result.rows[1].reason or "")
    assert any("the budget cut the search: 2 of 3" in n for n in result.notes)
    from servefleet.cli.tune_cmd import _render

    buf = io.StringIO()
    _render(result, None, Console(file=buf, width=250))
    assert "skipped: c1, c2" in buf.getvalue()


def test_then_generate_runs_the_job_once_and_the_plan_holds(tmp_path: Path) -> None:
    # 1,500 prompts (~11 s): with 800 (~6 s) the ramp and the tail were a tenth of the job, and on a busy
    # machine the check missed by 10.8 % while the server ran within 4 % of its bench (the check's own words)
    job = prompts(tmp_path, 1500, (10, 25), 32)
    dest = tmp_path / "dest"
    code, doc, out = tune(
        tmp_path,
        base_fleet(tmp_path),
        space(tmp_path, SETTINGS + '[[candidate]]\nname = "plain"\n'),
        job,
        "--then-generate",
        "--output",
        str(dest),
    )
    assert code == 0, out
    then = doc["then"]
    assert then["job"]["status"] == "complete" and then["servers"] == ["s0"]
    ids = read_parquet(dest / "shards", columns=["id"]).column("id").to_pylist()
    assert sorted(ids) == sorted(f"p{i}" for i in range(1500))  # every prompt exactly once
    assert then["check"]["within_tolerance"], then["check"]["verdict"]
    assert then["check"]["configuration"] == "plain"


# ---- refused before anything is launched ------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "extra", "said"),
    [
        ('[[candidate]]\nname = "a"\nargz = ["--x"]\n', (), 'candidate "a": argz: unknown key'),
        ('[[candidate]]\nname = "p"\nargs = ["--port", "9"]\n', (), 'candidate "p": port:'),
        ('[[candidate]]\nname = "tp2"\nargs = ["--tp", "2"]\n', (), 'candidate "tp2": gpus:'),
        ("", (), "empty space"),
        ("[grid]\n", (), "empty"),
        ('[tune]\nstartup = 60\n[[candidate]]\nname = "a"\n', ("--budget", "30s"), "below one candidate's start-up"),
        ('[tune]\nstartp = 60\n[[candidate]]\nname = "a"\n', (), "[tune]: startp: unknown key"),
    ],
)
def test_bad_input_is_refused_before_anything_is_launched(
    tmp_path: Path, text: str, extra: tuple[str, ...], said: str
) -> None:
    fleet = base_fleet(tmp_path, extra="gpus = [0]\n")
    code, doc, out = tune(tmp_path, fleet, space(tmp_path, text), prompts(tmp_path, 10, (3, 5), 8), *extra)
    assert code == 3, out
    assert said in doc["error"]["message"]
    assert not (tmp_path / "out" / "state").exists()  # no server was launched


def test_a_grid_is_the_product_of_its_axes(tmp_path: Path) -> None:
    got = load_space(
        space(
            tmp_path,
            '[grid]\nspec = { plain = [], ngram = ["--speculative-config", "{}"] }\n'
            '"--max-num-seqs" = [256, 1024]\n"--enforce-eager" = [true, false]\n',
        )
    )
    names = [c.name for c in got.candidates]
    assert len(names) == 8 and len(set(names)) == 8
    ngram = next(c for c in got.candidates if c.name == "ngram_max-num-seqs-1024_enforce-eager")
    assert ngram.args == ("--speculative-config", "{}", "--max-num-seqs", "1024", "--enforce-eager")
    plain = next(c for c in got.candidates if c.name == "plain_max-num-seqs-256_no-enforce-eager")
    assert plain.args == ("--max-num-seqs", "256")


@pytest.mark.parametrize("grid_first", [True, False])
def test_candidates_keep_the_files_order(tmp_path: Path, grid_first: bool) -> None:
    grid = '[grid]\n"--max-num-seqs" = [256, 1024]\n'
    listed = '[[candidate]]\nname = "other"\nargs = ["--x"]\n'
    got = load_space(space(tmp_path, f"{grid}\n{listed}" if grid_first else f"{listed}\n{grid}"))
    names = [c.name for c in got.candidates]
    gridded = ["max-num-seqs-256", "max-num-seqs-1024"]
    assert names == ([*gridded, "other"] if grid_first else ["other", *gridded])


EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "tune"


@pytest.mark.parametrize(
    ("base", "space_file", "names"),
    [
        ("sglang-base.toml", "sglang-mtp-vs-plain.space.toml", ["plain", "mtp", "mtp-wide"]),
        (
            "vllm-base.toml",
            "vllm-ngram-vs-plain.space.toml",
            ["plain_max-num-seqs-256", "plain_max-num-seqs-1024", "ngram_max-num-seqs-256", "ngram_max-num-seqs-1024"],
        ),
    ],
)
def test_the_example_spaces_are_valid_against_their_bases(
    tmp_path: Path, base: str, space_file: str, names: list[str]
) -> None:
    from servefleet.tune.candidates import candidate_fleets, load_base

    fleets = candidate_fleets(load_base(EXAMPLES / base, None), load_space(EXAMPLES / space_file).candidates, tmp_path)
    assert [f.candidate.name for f in fleets] == names
    for f in fleets:  # each one server on the base's GPU and port, the base's args first
        server = f.spec.servers[0]
        assert server.gpus == (0,) and server.port in (8000, 30000) and f.gpus_per_replica == 1
        assert server.args[:2] in (("--mem-fraction-static", "0.85"), ("--gpu-memory-utilization", "0.90"))


def test_the_optimistic_curve_grows_as_the_last_doubling_did() -> None:
    from servefleet.bench.result import Point
    from servefleet.tune.search import _optimistic

    def pts(*pairs: tuple[int, float]) -> list[Point]:
        return [Point.model_construct(concurrency=c, output_tokens_per_s=t) for c, t in pairs]

    growing = _optimistic(pts((8, 1000.0), (16, 1100.0)), cap=64, max_concurrency=4096)
    assert growing.total(64) == pytest.approx(1100 * 1.1**2)  # two more doublings at +10 % each
    falling = _optimistic(pts((8, 1000.0), (16, 900.0)), cap=64, max_concurrency=4096)
    assert falling.total(64) == pytest.approx(900.0)  # never below flat


def test_the_h200_driver_space_is_valid_against_its_base(tmp_path: Path) -> None:
    import argparse
    import importlib.util

    from servefleet.tune.candidates import candidate_fleets, load_base

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "gpu" / "tune" / "driver.py"
    spec = importlib.util.spec_from_file_location("tune_h200_driver", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sglang_env = tmp_path / "sgl-env.json"
    sglang_env.write_text(
        json.dumps({"PYTHONPATH": "/tmp/sgl-stubs:/tmp/sgl-site", "SGLANG_IS_FLASHINFER_AVAILABLE": "false"})
    )
    for rehearse, with_sglang in ((False, False), (False, True), (True, True)):
        args = argparse.Namespace(
            rehearse=rehearse,
            seconds=100.0,
            sim_load_time=2.0,
            out=str(tmp_path / f"out{rehearse}{with_sglang}"),
            work=str(tmp_path / f"w{rehearse}{with_sglang}"),
            python=sys.executable,
            sglang_env=str(sglang_env) if with_sglang else None,
            sglang_python="/usr/bin/python3",
        )
        driver = module.Driver(args)
        fleets = candidate_fleets(
            load_base(driver.base_fleet(), None),
            load_space(driver.space()).candidates,
            tmp_path / f"t{rehearse}{with_sglang}",
        )
        names = [f.candidate.name for f in fleets]
        seqs = ("32", "128") if rehearse else ("256", "1024")
        # plain and ngram first at the small cap; SGLang last (its pack may still be arriving when the tune starts)
        assert names == [f"max-num-seqs-{n}_{s}" for n in seqs for s in ("plain", "ngram")] + (
            ["sglang-plain"] if with_sglang else []
        )
        assert all(f.spec.servers[0].gpus == (0,) for f in fleets)
        if not rehearse:
            ngram = fleets[1].spec.servers[0].args
            assert ngram[-2] == "--speculative-config" and json.loads(ngram[-1])["method"] == "ngram"
        if with_sglang:  # another engine: none of the base's vLLM flags, the recipe's environment over the base's
            server = fleets[-1].spec.servers[0]
            assert "--gpu-memory-utilization" not in server.args and "--max-num-seqs" not in server.args
            assert server.engine == ("sim" if rehearse else "sglang")
            if not rehearse:
                assert (
                    server.env["PYTHONPATH"] == "/tmp/sgl-stubs:/tmp/sgl-site" and server.python == "/usr/bin/python3"
                )


def test_candidates_on_gpus_of_their_own_are_measured_at_the_same_time(tmp_path: Path) -> None:
    text = SETTINGS + f'[[candidate]]\nname = "g0"\n\n[[candidate]]\nname = "g1"\ngpus = [1]\nport = {free_port()}\n'
    code, doc, out = tune(
        tmp_path,
        base_fleet(tmp_path, extra="gpus = [0]\n"),
        space(tmp_path, text),
        prompts(tmp_path, 300, (10, 25), 32),
    )
    assert code == 0, out
    a, b = sorted(doc["candidates"], key=lambda r: r["name"])
    assert a["outcome"] == b["outcome"] == "measured"
    assert a["started_s"] < b["ended_s"] and b["started_s"] < a["ended_s"]  # the two windows overlap
    assert any("2 lanes" in n for n in doc["notes"])


def test_candidates_measured_at_the_same_time_need_ports_of_their_own(tmp_path: Path) -> None:
    text = '[[candidate]]\nname = "g0"\n\n[[candidate]]\nname = "g1"\ngpus = [1]\n'
    code, doc, out = tune(
        tmp_path, base_fleet(tmp_path, extra="gpus = [0]\n"), space(tmp_path, text), prompts(tmp_path, 10, (3, 5), 8)
    )
    assert code == 3, out
    assert 'candidate "g1": port:' in doc["error"]["message"] and 'candidate "g0"' in doc["error"]["message"]


def test_a_point_too_short_to_be_steady_is_counted_longer_from_its_own_lifetimes() -> None:
    from servefleet.bench.result import Point, SteadyWindow
    from servefleet.tune.measure import MAX_PER_CONCURRENCY, longer_requests

    def point(requests: int, steady_s: float, steady: bool, life_s: float = 3.1, duration_s: float = 8.4) -> Point:
        window = SteadyWindow(
            start_s=4.7, end_s=4.7 + steady_s, output_tokens=1.0, output_tokens_per_s=1.0, steady=steady
        )
        busy = life_s * requests / duration_s  # achieved concurrency: the sum of lifetimes over the span
        return Point.model_construct(
            concurrency=256, successful=requests, duration_s=duration_s, achieved_concurrency=busy, steady=window
        )

    # the H200's 256-ngram point: 2 x C requests, 0.45 s steady, 3.1 s lifetimes -> 2.35 waves more
    assert longer_requests(point(512, 0.45, False), 512) == 512 + math.ceil(((2 * 3.1 - 0.45) / 3.1 + 0.5) * 256)
    assert longer_requests(point(512, 7.0, True), 512) is None  # steady: as measured
    assert longer_requests(point(1900, 0.1, False), 1900) == MAX_PER_CONCURRENCY * 256  # up to the cap
    assert longer_requests(point(MAX_PER_CONCURRENCY * 256, 0.1, False), MAX_PER_CONCURRENCY * 256) is None


def test_the_tune_measures_a_short_point_again_longer_and_says_so(tmp_path: Path) -> None:
    short = "[tune]\npoint_requests = 8\nper_concurrency = 2\nstart_concurrency = 16\n"
    code, doc, out = tune(
        tmp_path,
        base_fleet(tmp_path),
        space(tmp_path, short + '[[candidate]]\nname = "plain"\n'),
        prompts(tmp_path, 200, (10, 25), 32),
    )
    assert code == 0, out
    from servefleet.bench.result import load_run

    run = load_run(Path(doc["candidates"][0]["run"]))
    lengthened = [n for n in run.notes if "measured again with" in n]
    assert lengthened, run.notes  # 2 x C requests hold no steady part: every such point is measured again
    first = run.points[0]
    assert first.requests > 2 * (first.concurrency or 0) and first.steady is not None
    assert first.steady.end_s - first.steady.start_s > 0
    # later points start at the multiple that gave the first one its steady part (no second short try)
    assert len(run.points) == len({p.concurrency for p in run.points})


@pytest.mark.parametrize("sample", [3000, 30])
def test_every_point_sends_prompts_the_server_has_not_seen(tmp_path: Path, monkeypatch, sample: int) -> None:
    """A job sends each prompt once; a repeat would find its prefix in the engine's cache. Each point (its
    warm-up too) takes the sample's next prompts; a sample too small to go round says so."""
    from servefleet.bench.result import load_run
    from servefleet.tune import measure

    sent: list[list[str]] = []
    real = measure.run_bench

    async def recording(target, config):  # what each point's dataset holds, then the real bench
        sent.append([json.loads(line)["prompt"] for line in Path(config.dataset).read_text().splitlines()])
        return await real(target, config)

    monkeypatch.setattr(measure, "run_bench", recording)
    job = tmp_path / "job.jsonl"
    job.write_text(
        "".join(
            json.dumps({"id": f"p{i}", "prompt": f"item {i} of the job", "max_tokens": 16}) + "\n" for i in range(3000)
        )
    )
    code, doc, out = tune(
        tmp_path,
        base_fleet(tmp_path),
        space(tmp_path, SETTINGS + '[[candidate]]\nname = "plain"\n'),
        job,
        "--sample",
        str(sample),
    )
    assert code == 0, out
    notes = load_run(Path(doc["candidates"][0]["run"])).notes
    every = [p for point in sent for p in point]
    assert len(sent) >= 2 and not any(Path(tmp_path / "out").glob("sample-point-*"))  # each point's file removed
    row = doc["candidates"][0]
    cached = [n for n in row["notes"] if "in its prefix cache" in n]
    if sample == 3000:
        assert len(set(every)) == len(every), "a prompt was sent twice"
        assert not [n for n in notes if "sent again" in n]
        # the engine's own counters: next to nothing cached (the latency sample's few streamed copies beside the load)
        assert row["prefix_cache_hit_rate"] < 0.05 and not cached
    else:
        # the repeats found their prompts in the engine's prefix cache, and the row says what that means
        assert row["prefix_cache_hit_rate"] > 0.5 and len(cached) == 1, row
        assert len(set(every)) == 30 < len(every)
        assert any(
            f"the sample's 30 prompts served {len(every):,} requests" in n and "--sample" in n for n in notes
        ), notes
