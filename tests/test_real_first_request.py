"""The smoke request of `servefleet up` on a real engine: a server that starts cleanly and fails its first
request is a failed start-up, with the cause from its log.

`transformers serve --continuous-batching` allocates its KV cache on the first request: with 10 M blocks
the allocation is refused ("MemoryError: Memory footprint ... is more than available memory") after
uvicorn says it is running. `up` must not call that server ready (tests/real_breadth.py, scenario
transformers/kv_cache_too_large; the recorded log is checked without an engine in test_real_logs_recorded)."""

from __future__ import annotations

import sys
from pathlib import Path

from real_breadth import TRANSFORMERS_ARGS, TRANSFORMERS_ENV, breadth
from real_engines import PortHolder, build_tiny_model, check_verdict, cli_json, real_test, run_fleet


@real_test(600)
def test_up_fails_a_server_whose_first_request_fails(tmp_path: Path) -> None:
    sc = next(s for s in breadth("transformers") if s.server == "kv_cache_too_large")
    model = build_tiny_model(tmp_path / "tiny")
    with PortHolder() as holder:
        run = run_fleet(
            tmp_path,
            "transformers",
            Path(sys.executable),
            model,
            (sc,),
            holder.port,
            TRANSFORMERS_ENV,
            TRANSFORMERS_ARGS,
            timeout_s=300,
        )
        try:
            verdict = run.report[sc.server]["verdict"]
            check_verdict(verdict, sc)
            assert sc.hint and sc.hint in verdict["hint"]
            log = Path(run.report[sc.server]["log_path"]).read_text(errors="replace")
            # it did start: the failure came after uvicorn was up, on the smoke request
            assert log.index("Uvicorn running on") < log.index("MemoryError")
        finally:
            cli_json("down", "--fleet", str(run.fleet), "--grace", "10", timeout=300)
