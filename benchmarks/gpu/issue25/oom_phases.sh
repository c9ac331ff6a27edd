#!/usr/bin/env bash
# Issue 25 item 6 on a real GPU: a vLLM memory failure in each start-up phase, with the holder named. For each phase a
# foreign process (grab.py, its CUDA context up before the launch) takes the GPU's free memory the moment the server's
# log reaches that phase; `servefleet up` (the same whole-GPU server as call 7, on a fleet of its own) then fails there,
# and its verdict (category, phase, evidence, hint), `diagnose` on the log, and the log itself are kept:
#   load      at "Using V2 Model Runner"           (after the start-up memory check, before the model's tensors)
#   profile   at "Model loading took"              (torch.compile and the profiling run)
#   kv        at "Initial profiling/warmup run"    (the KV cache's size and allocation)
#   graphs    at "Capturing CUDA graphs"           (tqdm's bar, mid-capture)
#   warmup    at "Graph capturing finished"        (what runs after the capture: the sampler's warm-up, if any)
#   request   at "Starting vLLM server on"         (ready: the smoke request of `up`; if it passes, a job of long
#                                                   prompts on the grabbed card)
# On a machine that has had `run_h200.sh setup collect` and chunk 2 (vLLM). Foreground, ~40-60 s a phase:
#   bash benchmarks/gpu/issue25/oom_phases.sh [PHASE ...]     # default: all six; results under $OUT/oom
# OOM_BUDGET (s, default 540): no phase starts with less than 75 s of it left.
# CPU check (no GPU, no vLLM: the watch and the files): OOM_DRY=1 OUT=/tmp/x bash benchmarks/gpu/issue25/oom_phases.sh
cd "${PROJECT_ROOT:-.}"
H=benchmarks/gpu/issue25
if [ -n "${OOM_DRY:-}" ]; then
  set -u; P=${P:-python3}; R=$OUT/oom; mkdir -p $R
  sf() { # the engine's log lines, one a step, so the grabber's watch sees each phase in turn
    [ "$1" = up ] || { echo '{}'; return 0; }
    local log=$STATE/logs/g0.log; mkdir -p $(dirname $log)
    for line in "Loading model from scratch..." "Model loading took 0.84 GiB" "Initial profiling/warmup run took 0.23 s" \
      $'Capturing CUDA graphs (PIECEWISE):   0%|\r' "Graph capturing finished in 3 secs" "Starting vLLM server on http://x"; do
      printf '%s\n' "$line" >> $log; done; echo '{"servers": []}'; }
else
  OUT_SAVE=$OUT; source $H/common.sh; R=$OUT_SAVE/oom; mkdir -p $R
  sf() { $SF "$@"; }
fi
declare -A AT=(
  [load]="Using V2 Model Runner|Loading model from scratch"
  [profile]="Model loading took"
  [kv]="Initial profiling/warmup run"
  [graphs]="Capturing CUDA graphs"
  [warmup]="Graph capturing finished"
  [request]="Starting vLLM server on"
)
port=48600
attempt() {
  local name=$1 d=/tmp/oom/$1; port=$((port + 1))
  rm -rf $d; mkdir -p $d; STATE=$d/state
  cat > $d/fleet.toml <<T
[fleet]
name = "oom-$name"
state_dir = "$STATE"
timeout = 180
stall = 120
[defaults]
engine = "vllm"
model = "${M:-/tmp/sf-h200/model}"
env = { VLLM_USE_FLASHINFER_SAMPLER = "0", HF_HUB_OFFLINE = "1" }
[[servers]]
name = "g0"
port = $port
gpus = [0]
args = ["--served-model-name", "ck", "--gpu-memory-utilization", "0.90", "--max-model-len", "4096", "--max-num-seqs", "1024"]
T
  local log=$STATE/logs/g0.log
  $P $H/grab.py $log "${AT[$name]}" $d/armed --timeout 280 ${OOM_DRY:+--dry} > $R/$name-grab.json 2> $R/$name-grab.err &
  local gp=$!
  # the grabber's CUDA context first (a few seconds of torch start), so the launch sees a foreign holder on the card
  for _ in $(seq 300); do [ -f $d/armed ] || ! kill -0 $gp 2>/dev/null && break; sleep 0.1; done
  local t0=$(date +%s)
  sf up $d/fleet.toml --timeout 180 --json > $R/$name-up.json 2> $R/$name-up.err
  local rc=$?
  for _ in $(seq 50); do [ -s $R/$name-grab.json ] && break; sleep 0.1; done  # its report, if it matched (5 s at most)
  echo "$name: up rc=$rc $(( $(date +%s)-t0 )) s, grab: $(cat $R/$name-grab.json 2>/dev/null)"
  if [ $name = request ] && [ -z "${OOM_DRY:-}" ] && grep -q '"state": "ready"' $R/$name-up.json; then
    # the smoke request passed before the grab: long prompts at a full batch, to need memory the profile did not cache
    $P -c "import json; [print(json.dumps({'id': str(i), 'prompt': 'word ' * 1500, 'max_tokens': 512})) for i in range(400)]" > $d/long.jsonl
    timeout $(( T_END - $(date +%s) > 20 ? T_END - $(date +%s) - 15 : 5 )) $SF generate --output $d/gen --model ck --completions --temperature 0 --json --input $d/long.jsonl \
      --url http://127.0.0.1:$port --concurrency 256 > $R/$name-generate.json 2> $R/$name-generate.err
    echo "$name: generate rc=$?"
  fi
  [ -f $log ] && { sf diagnose $log --json > $R/$name-diagnose.json 2> $R/$name-diagnose.err; cp $log $R/$name.log; }
  kill $gp 2>/dev/null; wait $gp 2>/dev/null
  [ -n "${OOM_DRY:-}" ] || sf down --fleet $d/fleet.toml --json > $R/$name-down.json 2>&1
}
T_END=$(( $(date +%s) + ${OOM_BUDGET:-540} ))  # a phase starts only with 75 s left (a warm start fails in ~30-45 s)
for name in ${@:-load profile kv graphs warmup request}; do
  [ -n "${AT[$name]:-}" ] || { echo "unknown phase $name (load profile kv graphs warmup request)"; continue; }
  [ $(( T_END - $(date +%s) )) -ge 75 ] || { echo "skipped $name: $(( T_END - $(date +%s) )) s left of OOM_BUDGET"; continue; }
  attempt $name
done
$P $H/oom_summary.py $R | tee $R/summary.md
