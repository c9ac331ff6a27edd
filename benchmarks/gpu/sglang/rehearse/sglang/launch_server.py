# CPU rehearsal stand-in for `python -m sglang.launch_server`: servefleet's SGLang simulator with the
# flags it knows; the real-only ones dropped. Slow start (--load-time) stands in for CUDA-graph capture.
import os
import sys

from servefleet.sim.__main__ import main

drop_with_value = {"--attention-backend", "--sampling-backend", "--log-level", "--speculative-num-draft-tokens"}
argv, it = [], iter(sys.argv[1:])
for a in it:
    if a in drop_with_value:
        next(it, None)
        continue
    argv.append(a)
tps = ["--tokens-per-step", "2.5"] if "--speculative-algorithm" in argv else []
sys.exit(main(["--style", "sglang", "--load-time", os.environ.get("FAKE_LOAD", "6"), "--decode-ms", "1", *tps, *argv]))
