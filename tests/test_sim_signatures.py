"""Every failure text of the sim, for every style, category and variant, rendered in-process
(:func:`servefleet.sim.script.transcript`, the exact text the process prints) and checked twice:

* by itself -- the failure's messages are all there, in order, after the start-up lines before it,
  with the exit status that engine uses;
* through the classifier (``servefleet.verify.diagnose_text``) with the style's own engine profile,
  the ``sim`` profile, and engine auto-detection -- it must find the category the sim meant, and read
  the capacity lines of a healthy start-up. These parts skip only if those modules cannot be imported.
"""

from __future__ import annotations

import pytest

from servefleet.catalog import Category, State
from servefleet.sim.config import SimConfig
from servefleet.sim.failures import SIGKILL_SELF, after_ready_failure, first_request_crash, startup_failure, variants
from servefleet.sim.logline import Renderer
from servefleet.sim.script import transcript

CASES = [(style, cat, v) for style in ("sglang", "vllm") for cat in Category for v in range(variants(style, cat))]
IDS = [f"{s}-{c.value}-{v}" for s, c, v in CASES]


def _config(style: str, **kw) -> SimConfig:
    return SimConfig(style=style, tp=2, load_time=0.5, **kw)


def _classifier():
    diagnose = pytest.importorskip("servefleet.verify.diagnose")  # skips only on ImportError
    sglang = pytest.importorskip("servefleet.engines.sglang")
    vllm = pytest.importorskip("servefleet.engines.vllm")
    sim = pytest.importorskip("servefleet.engines.sim")
    return diagnose.diagnose_text, {"sglang": sglang.SGLangEngine(), "vllm": vllm.VLLMEngine(), "sim": sim.SimEngine()}


def _last_lines(lines) -> list[str]:
    return [[p for p in line.text.split("\n") if p.strip()][-1] for line in lines]


@pytest.mark.parametrize(("style", "category", "variant"), CASES, ids=IDS)
def test_failure_text_is_complete_and_exits_like_the_engine(style: str, category: Category, variant: int) -> None:
    cfg = _config(style, fail_at_startup=category, fail_variant=variant)
    failure = startup_failure(cfg, category, cfg.bind_port)
    text = transcript(cfg)
    positions = [text.find(last) for last in _last_lines(failure.lines)]
    assert -1 not in positions and positions == sorted(positions), text[-1500:]
    if failure.before_log:
        assert text.startswith(failure.lines[0].text.split("\n")[0])  # nothing printed before it
    elif category is not Category.KILLED:
        progress = "server_args=ServerArgs(" if style == "sglang" else "Automatically detected platform cuda."
        assert text.index(progress) < positions[0]
    if category is Category.KILLED:
        expected = SIGKILL_SELF
    elif failure.before_log and category is Category.CONFIG_ERROR:
        expected = 2  # argparse (a vLLM pydantic config error is raised by the API server: 1)
    elif style == "sglang" and any("hit an exception" in line.text for line in failure.lines):
        expected = SIGKILL_SELF  # SGLang's launcher kills its own process tree after a child failed
    else:
        expected = 1
    assert failure.exit_code == expected
    if (
        failure.exit_code is SIGKILL_SELF and category is not Category.KILLED
    ):  # SGLang: the wrapper line after the cause
        assert text.rstrip().endswith("Received sigquit from a child process. It usually means the child failed.")
    if style == "vllm" and "EngineCore failed to start." in text:
        assert text.rstrip().endswith(
            "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}"
        )


@pytest.mark.parametrize(("style", "category", "variant"), CASES, ids=IDS)
def test_classifier_finds_the_category(style: str, category: Category, variant: int) -> None:
    diagnose_text, engines = _classifier()
    text = transcript(_config(style, fail_at_startup=category, fail_variant=variant))
    for engine in (engines[style], engines["sim"], None):
        verdict = diagnose_text(text, engine)
        who = engine.name if engine else "auto"
        if category is Category.KILLED:  # no text: only the exit by SIGKILL tells (the waiter's job)
            assert verdict.state is not State.FAILED, (who, verdict)
            continue
        assert verdict.state is State.FAILED and verdict.category is category, (
            who,
            verdict.category,
            verdict.evidence,
        )
        assert verdict.evidence is not None and "Received sigquit" not in verdict.evidence.text
        assert "Engine core initialization failed" not in verdict.evidence.text  # the root cause, not the wrapper


@pytest.mark.parametrize("style", ["sglang", "vllm"])
@pytest.mark.parametrize("category", [c for c in Category if c is not Category.KILLED], ids=lambda c: c.value)
def test_classifier_after_ready_failures(style: str, category: Category) -> None:
    diagnose_text, engines = _classifier()
    cfg = _config(style, fail_after_ready=category)
    text = transcript(cfg)
    assert text.index("Application startup complete.") < text.rfind(
        _last_lines(after_ready_failure(cfg, category, cfg.bind_port).lines)[-1]
    )
    verdict = diagnose_text(text, engines[style])
    assert verdict.state is State.FAILED and verdict.category is category, verdict


@pytest.mark.parametrize("style", ["sglang", "vllm"])
def test_classifier_reads_capacity_and_ready_and_first_request_crash(style: str) -> None:
    diagnose_text, engines = _classifier()
    cfg = _config(style, kv_tokens=123456, max_running=48, context_length=8192)
    text = transcript(cfg)
    for engine in (engines[style], engines["sim"]):
        verdict = diagnose_text(text, engine)
        # The sim profile reads uvicorn's "Application startup complete." the cautious SGLang way (not
        # ready: the probe decides); the style's own profile takes its ready line as the log's word.
        assert verdict.state is (State.READY if engine is engines[style] or style == "sglang" else State.LOADING), (
            verdict
        )
        assert (
            verdict.capacity.kv_cache_tokens,
            verdict.capacity.max_running_requests,
            verdict.capacity.context_length,
        ) == (123456, 48, 8192)
    crash = first_request_crash(cfg, cfg.bind_port)
    renderer = Renderer(style, tp=cfg.tp)
    verdict = diagnose_text(text + "".join(renderer.render(line) for line in crash.lines), engines[style])
    assert verdict.state is State.FAILED and "illegal memory access" in verdict.evidence.text
    assert crash.exit_code == (SIGKILL_SELF if style == "sglang" else 0)
