"""Issue 25's prompt files (calls 2, 6 and 7 alike): uniform work (UNI_N prompts of 93 words, 256 tokens out)
and variable work (VAR_N prompts of 20-400 words, max_tokens 64-768, seed 7), both ignore_eos; and the bench's
variable sample, 8,000 prompts of the same kind that are not in the job. Usage: prompts.py UNI_N VAR_N [DIR]
(default /tmp/ck).

Every word is drawn at random, so no two prompts share a prefix the engine's prefix cache could serve. Until
2026-12-06 they were windows of one sequence: uniform prompt i was prompt i+997 again (a job met each repeat 997
requests on, still in an H100's KV cache: most of its prefill skipped), variable prompt i began as i+991 did, and
the bench's sample was the job's first 1,000, sent round again within a point. The lengths and max_tokens are drawn
as before, so the jobs' sizes match the earlier leases'."""

import json
import random
import sys
from pathlib import Path

SAMPLE = 8000  # the bench's 40-s points at 256 and 512 (and 1024) send a few thousand: none sent twice


def words(vocab: random.Random, n: int) -> str:
    return " ".join(f"w{vocab.randrange(991)}" for _ in range(n))


def variable(path: Path, n: int, lengths: random.Random, vocab: random.Random, prefix: str) -> None:
    with path.open("w") as f:
        for i in range(n):
            k, m = lengths.randint(20, 400), lengths.randint(64, 768)
            row = {"id": f"{prefix}{i}", "prompt": words(vocab, k), "max_tokens": m, "ignore_eos": True}
            f.write(json.dumps(row) + "\n")


uni_n, var_n = int(sys.argv[1]), int(sys.argv[2])
out = Path(sys.argv[3] if len(sys.argv) > 3 else "/tmp/ck")
out.mkdir(parents=True, exist_ok=True)
vocab = random.Random(5)
with (out / "uniform.jsonl").open("w") as f:
    for i in range(uni_n):
        f.write(json.dumps({"id": f"p{i}", "prompt": words(vocab, 93), "max_tokens": 256, "ignore_eos": True}) + "\n")
variable(out / "variable.jsonl", var_n, random.Random(7), random.Random(11), "v")
variable(out / "variable-sample.jsonl", SAMPLE, random.Random(8), random.Random(12), "s")
