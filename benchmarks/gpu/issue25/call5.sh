#!/usr/bin/env bash
# Call 5 (a fresh machine after call 4 found none): vLLM installed, the whole-GPU server up, then the variable work
# through generate --fleet and --url with no hints (as many as the device time left allows).
cd "${PROJECT_ROOT:-.}"; source benchmarks/gpu/issue25/common.sh
sed -n '/^cat > \/tmp\/ck\/fleet.toml/,/^T$/p' $H/call2.sh > /tmp/ck/mkfleet.sh; source /tmp/ck/mkfleet.sh
t0=$(date +%s); $SF up /tmp/ck/fleet.toml --timeout 300 --json > /tmp/ck/up.json 2>$R/up.err; echo "up rc=$? $(( $(date +%s)-t0 )) s"
$P - <<'PY'
import json, random
rng = random.Random(7)
with open("/tmp/ck/variable.jsonl", "w") as f:
    for i in range(6000):
        n = rng.randint(20, 400); m = rng.randint(64, 768)
        f.write(json.dumps({"id": f"v{i}", "prompt": " ".join(f"w{(i*13+j)%991}" for j in range(n)), "max_tokens": m, "ignore_eos": True}) + "\n")
PY
gen var-fleet 150 --input /tmp/ck/variable.jsonl --fleet /tmp/ck/fleet.toml; rm -f $R/gen-var-fleet.err $R/gpu-setup.out
gen var-url 150 --input /tmp/ck/variable.jsonl --url $U
