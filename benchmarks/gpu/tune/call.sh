#!/usr/bin/env bash
# Issue 28's device run (see README.md here): the vLLM recipe, then driver.py.
#   bash benchmarks/gpu/tune/call.sh                  # on the H200, in one command of at most 540 s
#   bash benchmarks/gpu/tune/call.sh --start S        # on the H200: the driver detached (S s in all), then --poll
#   bash benchmarks/gpu/tune/call.sh --poll [S]       # the next commands: wait up to S s (default 540) for it, bring back what it has
#   bash benchmarks/gpu/tune/call.sh --stash          # only keep the SGLang parts sent with this command (before --start)
#   bash benchmarks/gpu/tune/call.sh --rehearse       # on the CPU: the same steps, servefleet sim as the engine
#   bash benchmarks/gpu/tune/call.sh --rehearse --start S, then --poll   # on the CPU, detached as on the device
# --start runs the driver in a process session of its own (setsid), from a copy of src/ and of this folder in
# /tmp/tune-src (the device re-sends the tree with every command), so it outlives the command that started it:
# a run longer than one command's 600 s goes on over several, each sent at once after the last one's reply.
# DRIVER_ARGS: more of driver.py's options for --start (e.g. --no-holder-check).
# With .gpu-sglang/run/sglang_setup.sh there (the SGLang recipe, its parts sent with this or an earlier command
# into /tmp/sgl-parts), SGLang is unpacked first and SGLang plain joins the space.
cd "${PROJECT_ROOT:-.}"
set -u
OUT=${OUT:-/tmp/tune-h200-out}; mkdir -p "$OUT"
RES=/tmp/tune-h200-out; DONE=$RES/driver.rc
t0=$(date +%s)
# the rehearsal's interpreter (PYTHON, made absolute: the driver's servers start elsewhere) and this checkout's src
rehearse_env() { P=${PYTHON:-$(command -v python3)}; case $P in /*) ;; *) P=$PWD/$P ;; esac; export PYTHONPATH=$PWD/src:${PYTHONPATH:-}; }
REH=(); if [ "${1:-}" = "--rehearse" ]; then REH=(--rehearse --sim-load-time ${SIM_LOAD_TIME:-2}); shift; fi
if [ -n "${REH[*]}" ] && [ "${1:-}" != "--start" ]; then
  rehearse_env
  exec $P benchmarks/gpu/tune/driver.py "${REH[@]}" --seconds ${SECONDS_BUDGET:-300} --tune-budget 150 --reserve 110 \
       --sample 300 --job-prompts 2000 --out "$OUT" --python "$P"
fi
# poll S: wait up to S s for the detached driver, then copy its results (a snapshot of the work folder) to $OUT
poll() {
  local until=$(( $(date +%s) + $1 ))
  while [ ! -f $DONE ] && [ $(date +%s) -lt $until ]; do sleep 5; done
  cp $RES/summary.json $RES/driver.log $RES/gpu-setup.out $RES/sglang-setup.out "$OUT"/ 2>/dev/null
  if [ -f $DONE ]; then cp $RES/tune-h200.tar.gz "$OUT"/ 2>/dev/null; echo "driver done: rc=$(cat $DONE)"
  else (cd /tmp/tune-h200 && find . -type f \( -name '*.json' -o -name '*.err' -o -name '*.toml' -o -name '*.log' \) \
          -size -4M -not -path '*shards*' | tar czf "$OUT"/tune-h200-partial.tar.gz -T - 2>/dev/null); echo "driver still running"; fi
  tail -n 15 $RES/driver.log 2>/dev/null
}
# sglang_setup: stash the SGLang parts sent with this command (.gpu-sglang*/pkg: the pack is larger than one
# command's transfer beside the vLLM chunks, so it comes in pieces), unpack once all are there (the recipe's
# checksum), and write its environment as JSON for the driver's SGLang candidate. Its own shell: the recipe exports
# a PYTHONPATH of its own (SGLang's packages, not vLLM's /tmp/site).
sglang_setup() {
  mkdir -p /tmp/sgl-parts; for d in .gpu-sglang*/pkg; do [ -d "$d" ] && cp -n "$d"/* /tmp/sgl-parts/; done
  [ -f .gpu-sglang/run/sglang_setup.sh ] || return 0
  env -u PYTHONPATH bash -c 'source .gpu-sglang/run/sglang_setup.sh && python3 -c "
import json, os; keys = (\"PYTHONPATH\", \"STANDIN_MODULES\", \"SGLANG_IS_FLASHINFER_AVAILABLE\", \"HF_HUB_OFFLINE\",
  \"TRANSFORMERS_OFFLINE\", \"SGLANG_DISABLE_TELEMETRY\", \"TOKENIZERS_PARALLELISM\")
json.dump({k: os.environ[k] for k in keys if k in os.environ}, open(\"/tmp/sgl-env.json\", \"w\"))"' >> $RES/sglang-setup.out 2>&1
  echo "sglang: $(tail -n 1 $RES/sglang-setup.out)"
}
if [ "${1:-}" = "--stash" ]; then mkdir -p $RES; sglang_setup; exit 0; fi
if [ "${1:-}" = "--poll" ]; then sglang_setup; poll ${2:-540}; exit 0; fi
rm -rf $RES; mkdir -p $RES
if [ -n "${REH[*]}" ]; then
  rehearse_env
else
  source .gpu/run/gpu-setup.sh > "$RES/gpu-setup.out" 2>&1
  export PYTHONPATH=$PWD/src:/tmp/sf-site:${PYTHONPATH:-} PYTHONUNBUFFERED=1
  P=/opt/torch/.venv/bin/python3
  ls /tmp/sf-h200/model/config.json >/dev/null || { echo "no model at /tmp/sf-h200/model: run the setup stage first"; exit 3; }
  [ -f /tmp/site/vllm/__init__.py ] || { echo "no vLLM in /tmp/site: send .gpu/c2 (the setup stage's second command) first"; exit 3; }
fi
used=$(( $(date +%s) - t0 )); echo "gpu-setup ${used} s"
if [ "${1:-}" != "--start" ]; then
  # the driver's share of the 540 s: what setup left, less 10 s for the tarball and the transfer back
  timeout $(( 540 - used )) $P benchmarks/gpu/tune/driver.py --seconds $(( 530 - used )) --tune-budget 300 --reserve 190 \
       --sample 10000 --job-prompts 10000 --out "$OUT" --python "$P"
  echo "driver rc=$? after $(( $(date +%s) - t0 )) s"; exit 0
fi
TOTAL=${2:-1300}; SGL=()
if [ -f .gpu-sglang/run/sglang_setup.sh ] && [ -z "${REH[*]}" ]; then
  sglang_setup   # the parts that are here; the environment is known before the last part arrives
  [ -f /tmp/sgl-env.json ] && SGL=(--sglang-env /tmp/sgl-env.json --sglang-python "$(command -v python3)")
fi
rm -rf /tmp/tune-src $DONE; mkdir -p /tmp/tune-src; cp -r src benchmarks/gpu/tune /tmp/tune-src/
export PYTHONPATH=/tmp/tune-src/src:$PYTHONPATH
used=$(( $(date +%s) - t0 ))
setsid bash -c "$P /tmp/tune-src/tune/driver.py --seconds $(( TOTAL - used )) --tune-budget ${TUNE_BUDGET:-780} \
    --reserve ${RESERVE:-560} --sample 10000 --job-prompts 10000 --out $RES --python $P ${SGL[*]:-} ${REH[*]:-} ${DRIVER_ARGS:-} > $RES/driver.out 2>&1; \
    echo \$? > $DONE" < /dev/null > /dev/null 2>&1 &
echo "driver started detached after ${used} s (${TOTAL} s in all)"
poll $(( ${POLL_S:-540} - used ))
