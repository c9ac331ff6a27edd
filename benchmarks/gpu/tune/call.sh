#!/usr/bin/env bash
# Issue 28's one device command (see README.md here): the vLLM recipe, then driver.py within 540 s in all.
#   bash benchmarks/gpu/tune/call.sh              # on the H200 (after the setup stage built /tmp/sf-h200/model)
#   bash benchmarks/gpu/tune/call.sh --rehearse   # on the CPU: the same steps, servefleet sim as the engine
cd "${PROJECT_ROOT:-.}"
set -u
OUT=${OUT:-/tmp/tune-h200-out}; mkdir -p "$OUT"
t0=$(date +%s)
if [ "${1:-}" = "--rehearse" ]; then
  P=${PYTHON:-python3}; export PYTHONPATH=$PWD/src:${PYTHONPATH:-}
  exec $P benchmarks/gpu/tune/driver.py --rehearse --seconds ${SECONDS_BUDGET:-240} --tune-budget 120 --reserve 90 \
       --sample 300 --job-prompts 2000 --out "$OUT" --python "$P" --sim-load-time ${SIM_LOAD_TIME:-2}
fi
source .gpu/run/gpu-setup.sh > "$OUT/gpu-setup.out" 2>&1
export PYTHONPATH=$PWD/src:/tmp/sf-site:${PYTHONPATH:-} PYTHONUNBUFFERED=1
P=/opt/torch/.venv/bin/python3
ls /tmp/sf-h200/model/config.json >/dev/null || { echo "no model at /tmp/sf-h200/model: run the setup stage first"; exit 3; }
[ -f /tmp/site/vllm/__init__.py ] || { echo "no vLLM in /tmp/site: send .gpu/c2 (the setup stage's second command) first"; exit 3; }
used=$(( $(date +%s) - t0 )); echo "gpu-setup ${used} s"
# the driver's share of the 540 s: what setup left, less 10 s for the tarball and the transfer back
timeout $(( 540 - used )) $P benchmarks/gpu/tune/driver.py --seconds $(( 530 - used )) --tune-budget 300 --reserve 190 \
     --sample 1000 --job-prompts 10000 --out "$OUT" --python "$P"
echo "driver rc=$? after $(( $(date +%s) - t0 )) s"
