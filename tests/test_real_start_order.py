"""Real vLLM (the CPU build) started in turn by `servefleet up` (issue 12.1 and 12.4): two servers
on "GPU 0" (``gpus = [0]``: the CPU build ignores CUDA_VISIBLE_DEVICES, the rule does not), the
first one's log already holding an earlier run's lines. The second must start after the first one's
real "init engine (profile, create kv cache, warmup model) took" line of this launch -- not at the
earlier run's line, not together -- and both must be ready with the capacity of this launch."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

from real_engines import (
    VLLM_ARGS,
    VLLM_ENV,
    build_tiny_model,
    cli,
    engine_python,
    expected_vllm_kv_tokens,
    free_port,
    real_test,
)

EARLIER = [
    "==== servefleet launch 2026-12-01T07:00:00+00:00 ====",
    "(EngineCore pid=11) INFO 12-01 07:00:40 [kv_cache_utils.py:2327] CPU KV cache size: 999,999 tokens, "
    "Maximum concurrency for 2,048 tokens per request: 488.28x",
    "(EngineCore pid=11) INFO 12-01 07:00:41 [core.py:402] init engine (profile, create kv cache, warmup model) took 0.77 s",
    "(EngineCore pid=11) ERROR 12-01 07:03:57 [core.py:1330] ValueError: To serve at least one request with the model's max seq len",
]


@real_test(1500)
def test_real_vllm_servers_on_one_gpu_start_in_turn(tmp_path: Path) -> None:
    python = engine_python("vllm")
    model = build_tiny_model(tmp_path / "tiny")
    state = tmp_path / "state"
    env = "{ " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in VLLM_ENV.items()) + " }"
    servers = "".join(f'[[servers]]\nname = "{n}"\nport = {free_port()}\ngpus = [0]\n\n' for n in ("first", "second"))
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(
        f'[fleet]\nname = "order"\nstate_dir = {json.dumps(str(state))}\ntimeout = 900\nstall = 300\n\n'
        f'[defaults]\nengine = "vllm"\npython = {json.dumps(str(python))}\nmodel = {json.dumps(str(model))}\n'
        f"args = {json.dumps(list(VLLM_ARGS))}\nenv = {env}\n\n{servers}"
    )
    (state / "logs").mkdir(parents=True)
    (state / "logs" / "first.log").write_text("\n".join(EARLIER) + "\n")
    try:
        done = cli("up", str(fleet), "--json", "--no-smoke", timeout=1000)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
        report = {s["name"]: s for s in json.loads(done.stdout)["servers"]}
        first, second = (json.loads((state / f"{n}.json").read_text()) for n in ("first", "second"))
        (settled,) = report["second"]["started_after"]
        assert settled["server"] == "first" and settled["signal"] == "memory settled", settled
        assert settled["offset"] >= first["log_offset"] > len("\n".join(EARLIER))
        line = Path(first["log_path"]).read_bytes()[settled["offset"] :].split(b"\n", 1)[0]
        assert b"init engine (profile, create kv cache, warmup model) took" in line
        when = {
            k: datetime.fromisoformat(v)
            for k, v in (
                ("first", first["launched_at"]),
                ("settled", settled["at"]),
                ("second", second["launched_at"]),
            )
        }
        assert when["first"] < when["settled"] < when["second"]
        ready = datetime.fromisoformat(first["ready_at"])
        print(
            f"\nfirst launched -> memory line seen {(when['settled'] - when['first']).total_seconds():.1f} s, "
            f"-> second launched {(when['second'] - when['first']).total_seconds():.1f} s, "
            f"-> first ready {(ready - when['first']).total_seconds():.1f} s"
        )
        kv = expected_vllm_kv_tokens(model)
        assert report["first"]["verdict"]["capacity"]["kv_cache_tokens"] == kv != 999_999
    finally:
        cli("down", "--fleet", str(fleet), "--grace", "20", timeout=300)
