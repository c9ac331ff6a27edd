#!/usr/bin/env bash
# Call 2: vLLM installed (chunk 2), one whole-GPU server (as issue 25), the bench (-c 256,512,1024),
# then uniform work (12,000 x 256/256, ignore_eos) through generate --url with no hints.
cd "${PROJECT_ROOT:-.}"; source benchmarks/gpu/issue25/common.sh
cat > /tmp/ck/fleet.toml <<T
[fleet]
name = "ck"
state_dir = "/tmp/ck/state"
[defaults]
engine = "vllm"
model = "$M"
env = { VLLM_USE_FLASHINFER_SAMPLER = "0", HF_HUB_OFFLINE = "1" }
[[servers]]
name = "whole"
port = 48517
gpus = [0]
args = ["--served-model-name", "ck", "--gpu-memory-utilization", "0.90", "--max-model-len", "4096", "--max-num-seqs", "1024"]
T
t0=$(date +%s); $SF up /tmp/ck/fleet.toml --timeout 300 --json > $R/up.json 2>$R/up.err; echo "up rc=$? $(( $(date +%s)-t0 )) s"
$P - <<'PY'
import json, random
with open("/tmp/ck/uniform.jsonl", "w") as f:
    for i in range(12000):
        f.write(json.dumps({"id": f"p{i}", "prompt": " ".join(f"w{(i*7+j)%997}" for j in range(93)), "max_tokens": 256, "ignore_eos": True}) + "\n")
rng = random.Random(7)
with open("/tmp/ck/variable.jsonl", "w") as f:
    for i in range(6000):
        n = rng.randint(20, 400); m = rng.randint(64, 768)
        f.write(json.dumps({"id": f"v{i}", "prompt": " ".join(f"w{(i*13+j)%991}" for j in range(n)), "max_tokens": m, "ignore_eos": True}) + "\n")
PY
t0=$(date +%s); $SF bench --url $U -c 256,512,1024 --duration 25 --no-stream --input-len 256 --output-len 256 --api completions --temperature 0 --tokenizer $M --out /tmp/ck/bench.json > $R/bench.out 2>&1; echo "bench rc=$? $(( $(date +%s)-t0 )) s"
cp /tmp/ck/bench.json $R/bench.json; grep -E '^\s*(│|\|)|ran it again' $R/bench.out | head -14
gen uni-url 230 --input /tmp/ck/uniform.jsonl --url $U
