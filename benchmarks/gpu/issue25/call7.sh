#!/usr/bin/env bash
# Call 7 (issue 25's targets, every job side by side on one server): on a machine that has had
# `run_h200.sh setup collect` (chunk 1, deps, servefleet) and chunk 2, the whole-GPU server of call 2 comes up, then
#   bench-uni  servefleet bench, uniform 256/256, -c 256,512,1024, 25 s points (the --bench path's RUN.json)
#   bench-var  servefleet bench on 8,000 variable prompts of their own (their lengths and max_tokens, none in the job:
#              prompts.py), 40 s points (lifetimes reach ~15 s at 768 tokens)
# and for each work (uniform UNI_N x 256/256; variable VAR_N prompts of 20-400 words, max_tokens 64-768):
#   fixed (--url --concurrency BEST, BEST the bench's best point), fleet (--fleet, no hints), url (--url, no hints),
#   and, after both works, bench (--url --bench RUN.json): the target is fleet and url within 5 % of the better of
#   fixed and bench; then, as the budget allows, var-fixed-again and uni-fixed-again (the fixed jobs once more: how far
#   the host drifted over the lease).
# Each job runs if it still fits in BUDGET (s from the start, gpu-setup and up included) and says so when skipped.
#   bash benchmarks/gpu/issue25/call7.sh --start [BUDGET]   # detached (setsid): it outlives this command
#   bash benchmarks/gpu/issue25/call7.sh --poll [S]          # wait up to S s (default 540), bring back call7.tgz
#   bash benchmarks/gpu/issue25/call7.sh --stop              # stop the driver and its job (the server stays up), e.g.
#                                                             # to --start again with other JOBS in the time left
# JOBS="uni-fixed uni-fleet" runs only those, in that order; NO_BENCH=var skips only the variable bench; BENCH_C=256,512 benches fewer points (on 2026-12-02 the uniform
# bench's 1024 point was lengthened to 58 s and read 31 % under 256: the whole bench took 178 s). A job's budget need and
# timeout come from its bench's best rate (1.15x and 2x the time its tokens take there); NO_BENCH=1 skips the benches
# (fixed at 256 uniform / 512 variable, or UNI_C / VAR_C) and VAR_SIZES="NEED CAP" then sizes the variable jobs (on the H100 on
# 2026-12-06 they ran at ~25k tok/s: ~200 s each for 12,000 prompts); MONITOR=1 adds monitor.jsonl (monitor_jobs.py reads it per job). targets.py on the unpacked call7.tgz: each auto job against
# its work's fixed runs (their mean with fixed-again) and issue 25's targets. CPU check: CALL6_DRY=1 OUT=/tmp/x bash benchmarks/gpu/issue25/call7.sh
cd "${PROJECT_ROOT:-.}"
W=/tmp/ck/r7; DONE=/tmp/ck/call7.rc
if [ "${1:-}" = "--poll" ]; then
  until=$(( $(date +%s) + ${2:-540} ))
  while [ ! -f $DONE ] && [ $(date +%s) -lt $until ]; do sleep 5; done
  mkdir -p "$OUT"; cp /tmp/ck/call7.tgz /tmp/ck/call7.out "$OUT"/ 2>/dev/null
  if [ -f $DONE ]; then echo "call7 done: rc=$(cat $DONE)"; else echo "call7 still running"; fi
  tail -n 20 /tmp/ck/call7.out 2>/dev/null; exit 0
fi
if [ "${1:-}" = "--start" ]; then
  mkdir -p /tmp/ck; rm -f $DONE; rm -rf /tmp/ck/src7; mkdir -p /tmp/ck/src7; cp -r src benchmarks /tmp/ck/src7/
  # a copy of the tree (the device re-sends it with every command) and of the recipe's scripts (gpu-setup.sh)
  mkdir -p /tmp/ck/src7/.gpu; cp -r .gpu/run /tmp/ck/src7/.gpu/ 2>/dev/null
  setsid bash -c "cd /tmp/ck/src7 && PYTHONPATH=/tmp/ck/src7/src${PYTHONPATH:+:$PYTHONPATH} BUDGET=${2:-1200} OUT=/tmp/ck/res7 bash benchmarks/gpu/issue25/call7.sh > /tmp/ck/call7.out 2>&1; \
      echo \$? > $DONE" < /dev/null > /dev/null 2>&1 &
  echo $! > /tmp/ck/call7.pid  # setsid's own session: its pid is the group to stop
  echo "call7 started detached (budget ${2:-1200} s)"; exit 0
fi
if [ "${1:-}" = "--stop" ]; then
  # the driver's group (its samplers too), then the job under way: generate runs in timeout's own group and, on
  # SIGTERM, commits what is answered. The server stays up (`up` detached it), for a --start that adopts it.
  [ -f /tmp/ck/call7.pid ] && kill -TERM -- -"$(cat /tmp/ck/call7.pid)" 2>/dev/null
  pkill -TERM -f 'generate --output /tmp/ck/out-'
  for _ in $(seq 60); do pgrep -f 'generate --output /tmp/ck/out-' > /dev/null || break; sleep 1; done
  rm -f /tmp/ck/call7.pid; echo "call7 stopped"; tail -n 3 /tmp/ck/call7.out 2>/dev/null; exit 0
fi
T_START=$(date +%s); BUDGET=${BUDGET:-1200}; UNI_N=${UNI_N:-12000}; VAR_N=${VAR_N:-12000}
if [ -n "${CALL6_DRY:-}" ]; then
  set -u; R=$OUT; mkdir -p $R /tmp/ck; P=${P:-python3}; H=benchmarks/gpu/issue25; U=http://127.0.0.1:48517; M=/tmp/sf-h200/model
  gen() { echo "would run: generate $1 (timeout $2 s) ${*:3}"; }
  sf() { echo "would run: servefleet $*"; }
else
  source benchmarks/gpu/issue25/common.sh
  sed -n '/^cat > \/tmp\/ck\/fleet.toml/,/^T$/p' $H/call2.sh > /tmp/ck/mkfleet.sh; source /tmp/ck/mkfleet.sh
  sf() { $SF "$@"; }
  # MONITOR=1: the GPU's clock, power, throttle reasons and each busy process's CPU share, once a second (monitor.py)
  if [ -n "${MONITOR:-}" ]; then mkdir -p $W; rm -f /tmp/ck/mon.stop; $P $H/monitor.py $W/monitor.jsonl /tmp/ck/mon.stop & fi
  t0=$(date +%s); $SF up /tmp/ck/fleet.toml --timeout 300 --json > $R/up.json 2>$R/up.err; echo "up rc=$? $(( $(date +%s)-t0 )) s"
fi
$P $H/prompts.py $UNI_N $VAR_N  # the prompts of call 2 (the same generator, the first UNI_N / VAR_N of them)
echo "prompts: uniform $(wc -l < /tmp/ck/uniform.jsonl), variable $(wc -l < /tmp/ck/variable.jsonl)"
RES=$R; R=$W; mkdir -p $R  # gen writes here; packed into call7.tgz after every step
pack() { mkdir -p $R/reports; for d in /tmp/ck/out-*; do [ -d "$d" ] || continue; n=$(basename $d); mkdir -p $R/reports/$n
  cp $d/report.json $R/reports/$n/ 2>/dev/null; cp $d/timeline/*.json $R/reports/$n/ 2>/dev/null; done
  cp /tmp/ck/bench-*.json $R/ 2>/dev/null; tar czf /tmp/ck/call7.tgz.part -C $R . && mv /tmp/ck/call7.tgz.part /tmp/ck/call7.tgz
  mkdir -p $RES; cp /tmp/ck/call7.tgz $RES/; }
left() { echo $(( T_START + BUDGET - 20 - $(date +%s) )); }
want() { case " ${JOBS:-$1} " in *" $1 "*) return 0 ;; esac; return 1; }
# bench WORK DURATION ARGS...: the sweep whose RUN.json the --bench job takes and whose best point the fixed job uses
bench() {
  local work=$1 dur=$2; shift 2
  want $work-fixed || want $work-bench || return 0
  # NO_BENCH=1: no bench, the fixed jobs at the defaults below (a lease too short for the benches); NO_BENCH=var (or uni):
  # that work's bench only
  case " ${NO_BENCH:-} " in *" 1 "*|*" $work "*) return 0 ;; esac
  if [ $(left) -lt 110 ]; then echo "skipped bench-$work: $(left) s left" | tee -a $R/skipped.txt; return; fi
  local t0=$(date +%s)
  sf bench --url $U -c ${BENCH_C:-256,512,1024} --duration $dur --no-stream --api completions --temperature 0 --tokenizer $M \
     --out /tmp/ck/bench-$work.json "$@" > $R/bench-$work.out 2>&1
  echo "bench-$work rc=$? $(( $(date +%s)-t0 )) s"; grep -E '^\s*(│|\|)|ran it again' $R/bench-$work.out | head -8
}
# from_bench WORK FILE: "C NEED CAP" from the bench of WORK: its best point's concurrency, and for one job of FILE (every
# max_tokens generated: ignore_eos) 1.15 x the time its tokens take at that point's rate + 15 s, cap twice that + 30 s;
# nothing without a bench (the defaults below stand)
from_bench() { [ -f /tmp/ck/bench-$1.json ] && $P -c "import json,sys; d=json.load(open(sys.argv[1])); \
  p=max(d['points'], key=lambda p: p['output_tokens_per_s']); n=sum(json.loads(l)['max_tokens'] for l in open(sys.argv[2])); \
  t=n/p['output_tokens_per_s']; print(p['concurrency'], int(15+1.15*t), int(30+2*t))" /tmp/ck/bench-$1.json $2; }
# job NAME NEED_S CAP_S ARGS...: run it if NEED_S still fits in the budget (20 s kept for down and the tarball)
job() {
  local name=$1 need=$2 cap=$3; shift 3
  want $name || return 0
  local l=$(left)
  if [ $l -lt $need ]; then echo "skipped $name: ${l} s left of the budget, it needs ~${need} s" | tee -a $R/skipped.txt; return; fi
  gen $name $(( l < cap ? l : cap )) "$@"; [ -n "${CALL6_DRY:-}" ] || pack
}
# without a bench: uniform 12,000 x 256 tokens at ~29k tok/s ~110 s a job; variable 12,000 x ~416 tokens ~150-280 s
bench uni 25 --input-len 256 --output-len 256
read -r CU SU < <(from_bench uni /tmp/ck/uniform.jsonl); CU=${CU:-${UNI_C:-256}}; SU=${SU:-130 200}
echo "uniform: the bench's best concurrency $CU; a job needs ~${SU% *} s (cap ${SU#* } s)"
bench var 40 --dataset /tmp/ck/variable-sample.jsonl
read -r CV SV < <(from_bench var /tmp/ck/variable.jsonl); CV=${CV:-${VAR_C:-512}}; SV=${SV:-${VAR_SIZES:-200 280}}
echo "variable: the bench's best concurrency $CV; a job needs ~${SV% *} s (cap ${SV#* } s)"
# run_job NAME: fixed (and fixed-again: the same job once more, to say how far the host drifted), fleet, url, bench
run_job() {
  local work=${1%%-*} input size c
  case $work in uni) input=/tmp/ck/uniform.jsonl size=$SU c=$CU ;; var) input=/tmp/ck/variable.jsonl size=$SV c=$CV ;;
    *) echo "unknown job $1" | tee -a $R/skipped.txt; return ;; esac
  case ${1#*-} in
    fixed|fixed-again) job $1 $size --input $input --url $U --concurrency $c ;;
    fleet) job $1 $size --input $input --fleet /tmp/ck/fleet.toml ;;
    url) job $1 $size --input $input --url $U ;;
    bench) job $1 $size --input $input --url $U --bench /tmp/ck/bench-$work.json ;;
    *) echo "unknown job $1" | tee -a $R/skipped.txt ;;
  esac
}
# In the order JOBS names them. The default: both works' fixed, fleet and url; the --bench jobs last (a budget that cuts
# them leaves fleet and url of both works measured against the fixed limit); then the fixed baselines once more: on the
# H100 hosts of 2026-12-06 one concurrency's engine rate swung +-15 % over minutes. A bracket (fixed, fleet, url,
# fixed-again of one work, then the other's) compares each auto job with fixed runs before and after it.
for name in ${JOBS:-uni-fixed uni-fleet uni-url var-fixed var-fleet var-url uni-bench var-bench var-fixed-again uni-fixed-again}; do
  run_job $name
done
[ -n "${CALL6_DRY:-}" ] && exit 0
$SF down --fleet /tmp/ck/fleet.toml --json > $R/down.json 2>&1; echo "down rc=$?"; touch /tmp/ck/mon.stop
cp /tmp/ck/state/logs/*.log $R/ 2>/dev/null; gzip -f $R/*.log 2>/dev/null; pack
echo "total $(( $(date +%s)-T_START )) s"
