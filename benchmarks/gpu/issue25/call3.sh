#!/usr/bin/env bash
# Call 3: the same server; uniform work through generate --fleet (no hints), --url --bench RUN.json,
# and --url --concurrency at the bench's best point.
cd "${PROJECT_ROOT:-.}"; source benchmarks/gpu/issue25/common.sh
BEST=$($P -c "import json;d=json.load(open('/tmp/ck/bench.json'));p=max(d['points'],key=lambda p:p['output_tokens_per_s']);print(p['concurrency'])")
echo "bench best C=$BEST"; echo $BEST > $R/bench-best.txt
gen uni-fleet 200 --input /tmp/ck/uniform.jsonl --fleet /tmp/ck/fleet.toml
gen uni-bench 200 --input /tmp/ck/uniform.jsonl --url $U --bench /tmp/ck/bench.json
gen uni-fixed 200 --input /tmp/ck/uniform.jsonl --url $U --concurrency $BEST
