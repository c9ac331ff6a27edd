#!/usr/bin/env bash
# Call 4: variable work (6,000 prompts of 20-400 words, max_tokens 64-768, ignore_eos): --fleet, --url, fixed 512; then down.
cd "${PROJECT_ROOT:-.}"; source benchmarks/gpu/issue25/common.sh
gen var-fleet 180 --input /tmp/ck/variable.jsonl --fleet /tmp/ck/fleet.toml
gen var-url 180 --input /tmp/ck/variable.jsonl --url $U
gen var-fixed 180 --input /tmp/ck/variable.jsonl --url $U --concurrency 512
$SF down --fleet /tmp/ck/fleet.toml --json > $R/down.json 2>&1; echo "down rc=$?"
cp /tmp/ck/state/logs/*.log $R/ 2>/dev/null; gzip -f $R/*.log 2>/dev/null
# Only 8 files come back from a call: everything in one tarball, with the earlier jobs' own reports and timelines
mkdir -p $R/reports; for d in /tmp/ck/out-*; do n=$(basename $d); mkdir -p $R/reports/$n; cp $d/report.json $R/reports/$n/ 2>/dev/null; cp $d/timeline/*.json $R/reports/$n/ 2>/dev/null; done
(cd $R && tar czf /tmp/call4.tgz . && find . -mindepth 1 -delete && mv /tmp/call4.tgz ./call4.tgz)
