"""Issue 25's prompt files (calls 2, 6 and 7 alike): uniform work (UNI_N prompts of 93 words, 256 tokens out)
and variable work (VAR_N prompts of 20-400 words, max_tokens 64-768, seed 7), both ignore_eos; the first
1,000 variable ones also as the bench's sample. Usage: prompts.py UNI_N VAR_N [DIR] (default /tmp/ck)."""

import json
import random
import sys
from pathlib import Path

uni_n, var_n = int(sys.argv[1]), int(sys.argv[2])
out = Path(sys.argv[3] if len(sys.argv) > 3 else "/tmp/ck")
out.mkdir(parents=True, exist_ok=True)
with (out / "uniform.jsonl").open("w") as f:
    for i in range(uni_n):
        words = " ".join(f"w{(i * 7 + j) % 997}" for j in range(93))
        f.write(json.dumps({"id": f"p{i}", "prompt": words, "max_tokens": 256, "ignore_eos": True}) + "\n")
rng = random.Random(7)
with (out / "variable.jsonl").open("w") as f, (out / "variable-sample.jsonl").open("w") as s:
    for i in range(var_n):
        n, m = rng.randint(20, 400), rng.randint(64, 768)
        words = " ".join(f"w{(i * 13 + j) % 991}" for j in range(n))
        line = json.dumps({"id": f"v{i}", "prompt": words, "max_tokens": m, "ignore_eos": True}) + "\n"
        f.write(line)
        if i < 1000:
            s.write(line)
