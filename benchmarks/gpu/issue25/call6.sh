#!/usr/bin/env bash
# Call 6 (issue 25, the controller's halving from the capacity start and ramp windows of two lifetimes):
# on a machine that has had `run_h200.sh setup collect` (chunk 1, deps, servefleet), chunk 2 installs vLLM,
# the whole-GPU server of call 2 comes up (~110 s), then, most important first:
#   uniform (UNI_N x 256/256, ignore_eos): --fleet no hints, --url no hints, --url --concurrency 256 (call 2's bench best);
#   variable (VAR_N prompts, 20-400 words, max_tokens 64-768): --url no hints, --url --concurrency 512.
# The budget (BUDGET s from this script's start, gpu-setup and up included) decides: a job that no longer fits is
# skipped and says so. Everything goes back as one tarball, rewritten after every job (at most 8 files come back).
# JOBS="uni-fleet var-url" runs only those (call 7: JOBS=uni-fleet BUDGET=280, the refill spread after a lowering).
# CPU check: `CALL6_DRY=1 OUT=/tmp/x bash benchmarks/gpu/issue25/call6.sh` writes the prompt files and prints the plan.
cd "${PROJECT_ROOT:-.}"
T_START=$(date +%s); BUDGET=${BUDGET:-540}; UNI_N=${UNI_N:-8000}; VAR_N=${VAR_N:-2000}
if [ -n "${CALL6_DRY:-}" ]; then
  set -u; R=$OUT; mkdir -p $R /tmp/ck; P=${P:-python3}; H=benchmarks/gpu/issue25
  gen() { echo "would run: generate $1 (timeout $2 s) ${*:3}"; }
else
  source benchmarks/gpu/issue25/common.sh
  sed -n '/^cat > \/tmp\/ck\/fleet.toml/,/^T$/p' $H/call2.sh > /tmp/ck/mkfleet.sh; source /tmp/ck/mkfleet.sh
  t0=$(date +%s); $SF up /tmp/ck/fleet.toml --timeout 300 --json > $R/up.json 2>$R/up.err; echo "up rc=$? $(( $(date +%s)-t0 )) s"
fi
$P $H/prompts.py $UNI_N $VAR_N  # the prompts of call 2 (the same generator, the first UNI_N / VAR_N of them)
echo "prompts: uniform $(wc -l < /tmp/ck/uniform.jsonl), variable $(wc -l < /tmp/ck/variable.jsonl)"
RES=$R; R=/tmp/ck/r6; mkdir -p $R  # gen writes here; packed into $RES after every job
pack() { mkdir -p $R/reports; for d in /tmp/ck/out-*; do [ -d "$d" ] || continue; n=$(basename $d); mkdir -p $R/reports/$n
  cp $d/report.json $R/reports/$n/ 2>/dev/null; cp $d/timeline/*.json $R/reports/$n/ 2>/dev/null; done
  tar czf $RES/call6.tgz.part -C $R . && mv $RES/call6.tgz.part $RES/call6.tgz; }
# job NAME NEED_S CAP_S ARGS...: run it if NEED_S still fits in the budget (20 s kept for down and the tarball)
job() {
  local name=$1 need=$2 cap=$3; shift 3
  case " ${JOBS:-$name} " in *" $name "*) ;; *) return ;; esac  # JOBS="uni-fleet ...": only those
  local left=$(( T_START + BUDGET - 20 - $(date +%s) ))
  if [ $left -lt $need ]; then echo "skipped $name: ${left} s left of the budget, it needs ~${need} s" | tee -a $R/skipped.txt; return; fi
  gen $name $(( left < cap ? left : cap )) "$@"; [ -n "${CALL6_DRY:-}" ] || pack
}
# ~22k tok/s at best: 8,000 x 256 tokens ~95 s; the variable 2,000 prompts (~0.83 M tokens) ~40 s. Expected: gpu-setup ~30 s +
# up ~110 s + 3 x ~100 + 2 x ~45: var-fixed is the first to be skipped when the machine is slower (it says so in skipped.txt)
job uni-fleet 100 170 --input /tmp/ck/uniform.jsonl --fleet /tmp/ck/fleet.toml
job uni-url 100 170 --input /tmp/ck/uniform.jsonl --url ${U:-http://127.0.0.1:48517}
job uni-fixed 95 150 --input /tmp/ck/uniform.jsonl --url ${U:-http://127.0.0.1:48517} --concurrency 256
job var-url 50 100 --input /tmp/ck/variable.jsonl --url ${U:-http://127.0.0.1:48517}
job var-fixed 50 100 --input /tmp/ck/variable.jsonl --url ${U:-http://127.0.0.1:48517} --concurrency 512
[ -n "${CALL6_DRY:-}" ] && exit 0
$SF down --fleet /tmp/ck/fleet.toml --json > $R/down.json 2>&1; echo "down rc=$?"
cp /tmp/ck/state/logs/*.log $R/ 2>/dev/null; gzip -f $R/*.log 2>/dev/null; pack
echo "total $(( $(date +%s)-T_START )) s"
