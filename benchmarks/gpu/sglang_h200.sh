#!/usr/bin/env bash
# Real SGLang 0.5.17 on the H200 under servefleet (issue 19). One device command, from the repo root:
#   bash benchmarks/gpu/sglang_h200.sh [--budget S] STAGE...     stages: setup smoke up failures bench ab generate down
# (carry .gpu-sglang, made by benchmarks/gpu/sglang_prepare.sh). Everything lives in /tmp/sgw; results
# go to /tmp/sgw/results and, after every stage, to $OUT (sglang-results.tar.gz, summary.txt, stages.json),
# so a command cut short still returns what it did. Later commands on the same warm machine skip what is done.
# The stages are run by the shared stage runner (stages.py: order, budget, a checkpoint after each,
# stages.json), each as `bash sglang_h200.sh --stage NAME --budget LEFT`; a failed smoke skips all but down.
set -u
self=$(cd "$(dirname "$0")" && pwd)  # benchmarks/gpu/, or the run folder sglang_prepare.sh fills (stages.py beside it)
cd "$(dirname "$0")/../.." || exit 3
BUDGET=560
stages=()
one=""
while [ $# -gt 0 ]; do
  case "$1" in --budget) BUDGET=$2; shift 2 ;; --stage) one=$2; shift 2 ;; *) stages+=("$1"); shift ;; esac
done
t_setup=$SECONDS
# SGL_SETUP, SGW, SGL_PY: a CPU rehearsal's own setup, folder and Python (README.md). Sourced once per
# command: the stages' own processes inherit what it exported.
[ -n "${SGL_SETUP_DONE:-}" ] || source "${SGL_SETUP:-.gpu-sglang/run/sglang_setup.sh}"
W=${SGW:-/tmp/sgw}; R=$W/results; OUT=${OUT:-$W/out}
mkdir -p "$R"/logs "$R"/fixtures "$R"/cmd "$OUT"
# stand-ins the smoke stage added (each stage is a process of its own)
[ -s "$W/standin_modules" ] && export STANDIN_MODULES=$(cat "$W/standin_modules")
P=${SGL_PY:-python3}
SF="$P -m servefleet.cli.main"
MODEL=$W/model
NAME=sf-realistic
# The SGLang flags every server here shares: no FA3 (not shipped) and no flashinfer (not installed).
BASE=(--attention-backend triton --sampling-backend pytorch --context-length 4096 --log-level info)
export SGL_T0=${SGL_T0:-$(date +%s)}  # the command's start: driver.log's clock across the stages' processes
say() { echo "[$(( $(date +%s) - SGL_T0 )) s] $*" | tee -a "$R/driver.log"; }
left() { echo $(( BUDGET - SECONDS )); }
summary() { echo "$*" | tee -a "$R/summary.txt"; }
checkpoint() { tar czf "$OUT/sglang-results.tar.gz" -C "$W" results 2>/dev/null; cp "$R/summary.txt" "$R/driver.log" "$R/stages.json" "$OUT/" 2>/dev/null; true; }
stage_checkpoint() { checkpoint; }
[ -n "$one" ] || say "setup script: $(( SECONDS - t_setup )) s; PYTHONPATH=$PYTHONPATH STANDIN_MODULES=$STANDIN_MODULES"

# ---- helpers ----------------------------------------------------------------------------------------
health() { curl -s -m 5 -o /dev/null -w '%{http_code}' "http://127.0.0.1:$1/$2" 2>/dev/null; }
port_of() { [ "$1" = plain ] && echo 31000 || echo 32000; }  # the main fleet's servers
# ready_main: the main fleet's servers whose /health answers 200, one a line
ready_main() { local n; for n in plain ngram; do [ "$(health "$(port_of $n)" health)" = 200 ] && echo $n; done; true; }
# wait_ready PORT PID LOG TIMEOUT: 0 when /health_generate answers 200, 1 when the process died, 2 on timeout
wait_ready() {
  local port=$1 pid=$2 log=$3 limit=$4 t0=$SECONDS
  while [ $(( SECONDS - t0 )) -lt "$limit" ]; do
    [ "$(health "$port" health_generate)" = 200 ] && return 0
    kill -0 "$pid" 2>/dev/null || return 1
    sleep 2
  done
  return 2
}
kill_group() { kill -TERM -- "-$1" 2>/dev/null; for _ in $(seq 1 20); do kill -0 -- "-$1" 2>/dev/null || return 0; sleep 0.5; done; kill -KILL -- "-$1" 2>/dev/null; true; }
gpu_used() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null | head -1; }
wait_gpu_free() { for _ in $(seq 1 30); do [ "$(gpu_used)" -lt 2000 ] 2>/dev/null && return 0; sleep 1; done; say "GPU still holds $(gpu_used) MiB"; }

# ---- stages -----------------------------------------------------------------------------------------
stage_setup() {
  nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv,noheader > "$R/nvidia-smi.txt" 2>&1
  $P - > "$R/versions.json" 2>&1 <<'PY'
import importlib.metadata as m, json, sys
out = {"python": sys.version.split()[0]}
for n in ("sglang", "sglang-kernel", "torch", "triton", "transformers", "tokenizers", "xgrammar", "apache-tvm-ffi",
          "fastapi", "uvicorn", "pydantic", "openai", "huggingface-hub", "servefleet", "typer", "rich", "aiohttp"):
    try: out[n] = m.version(n)
    except Exception: out[n] = None
print(json.dumps(out))
PY
  cat "$R/versions.json"
  local t0=$SECONDS
  [ "${SGL_IMPORT_CHECK:-1}" = 1 ] && $P -c "import sglang.srt.entrypoints.http_server, sglang.srt.managers.scheduler, sglang.srt.models.llama, sglang.srt.layers.attention.triton_backend, sgl_kernel; print('IMPORT_OK', sglang.__version__)" > "$R/cmd/import.out" 2>&1
  say "import check ($(( SECONDS - t0 )) s): $(grep -E 'IMPORT_OK|Error' "$R/cmd/import.out" | tail -2)"
  if [ ! -f "$MODEL/config.json" ]; then
    t0=$SECONDS
    $SF model tiny "$MODEL" --preset realistic --json > "$R/cmd/model.out" 2> "$R/cmd/model.err"
    say "model: rc=$? in $(( SECONDS - t0 )) s"
  fi
  summary "setup: $(cat "$R/nvidia-smi.txt"); $(grep -o 'IMPORT_OK.*' "$R/cmd/import.out" || echo 'import not checked or FAILED'); model $([ -f "$MODEL/config.json" ] && echo ok || echo MISSING)"
}

# SGLang launched by hand (no servefleet): proves the recipe. A start-up that dies on a missing module
# gets one more stand-in for it (STANDIN_MODULES) and is tried again, at most 4 times; the stand-ins added
# are reported (results/autostubs.txt) so the recipe can name them.
stage_smoke() {
  local port=30000 n pid rc miss log
  for n in 1 2 3 4 5; do
    log=$R/logs/smoke-$n.log
    setsid $P -m sglang.launch_server --model-path "$MODEL" --served-model-name $NAME --host 127.0.0.1 --port $port \
      "${BASE[@]}" --mem-fraction-static 0.40 > "$log" 2>&1 < /dev/null &
    pid=$!
    local t0=$SECONDS
    # servefleet watching the by-hand server (the `wait` path: log, process and /health_generate)
    $SF wait --url http://127.0.0.1:$port --log "$log" --pid $pid --engine sglang --timeout $(( $(left) - 60 )) --json \
      > "$R/cmd/wait-smoke-$n.out" 2> "$R/cmd/wait-smoke-$n.err" &
    waiter=$!
    wait_ready $port $pid "$log" $(( $(left) - 60 )); rc=$?
    wait $waiter; say "servefleet wait: rc=$? $(head -c 400 "$R/cmd/wait-smoke-$n.out" | tr '\n' ' ')"
    say "smoke try $n: rc=$rc after $(( SECONDS - t0 )) s"
    if [ $rc = 0 ]; then
      summary "smoke: READY after $(( SECONDS - t0 )) s (try $n, STANDIN_MODULES=$STANDIN_MODULES)"
      curl -s -m 30 "http://127.0.0.1:$port/generate" -H 'Content-Type: application/json' \
        -d '{"text":"def f(","sampling_params":{"max_new_tokens":16,"temperature":0}}' > "$R/smoke-generate.json"
      curl -s -m 30 "http://127.0.0.1:$port/v1/completions" -H 'Content-Type: application/json' \
        -d "{\"model\":\"$NAME\",\"prompt\":\"def f(\",\"max_tokens\":16,\"temperature\":0}" > "$R/smoke-completions.json"
      curl -s -m 10 "http://127.0.0.1:$port/server_info" > "$R/smoke-server_info.json"
      curl -s -m 10 "http://127.0.0.1:$port/v1/models" > "$R/smoke-models.json"
      summary "smoke: completions: $(head -c 300 "$R/smoke-completions.json")"
      kill_group $pid; sleep 2
      cp "$log" "$R/fixtures/sglang0517_h200_ready_by_hand.log"
      wait_gpu_free
      return 0
    fi
    kill_group $pid
    # the exception that ended the start-up, not "Ignore import error" notices of optional models
    miss=$(grep -oP "^(\[[^]]*\] )?ModuleNotFoundError: No module named '\K[^'.]+" "$log" | tail -1)
    if [ -n "$miss" ] && [ $n -lt 5 ] && ! echo ",$STANDIN_MODULES," | grep -q ",$miss[=,/]"; then
      echo "$miss <- $(grep -B2 "No module named '$miss" "$log" | grep File | tail -1)" >> "$R/autostubs.txt"
      export STANDIN_MODULES="$STANDIN_MODULES,$miss"
      echo "$STANDIN_MODULES" > "$W/standin_modules"
      say "smoke: stand-in added for $miss"
      continue
    fi
    summary "smoke: FAILED (rc=$rc, try $n): $(grep -E 'Error|error|Traceback' "$log" | tail -3 | cut -c1-300)"
    tail -40 "$log"
    cp "$log" "$R/fixtures/sglang0517_h200_smoke_failed.log"
    return 1
  done
}

# fleet_header NAME STATE TIMEOUT STALL: the [fleet] and [defaults] tables of both fleet files
fleet_header() {
  cat <<T
[fleet]
name = "$1"
state_dir = "$W/state/$2"
timeout = $3
stall = $4
smoke = true

[defaults]
engine = "sglang"
model = "$MODEL"
served_model_name = "$NAME"
python = "$(command -v $P)"
gpus = [0]
env = { PYTHONPATH = "$PYTHONPATH", STANDIN_MODULES = "$STANDIN_MODULES", SGLANG_IS_FLASHINFER_AVAILABLE = "false", HF_HUB_OFFLINE = "1", TOKENIZERS_PARALLELISM = "false" }
T
}
# args_line ARG...: a server's args line, BASE's flags first
args_line() { local a; a=$(printf '"%s", ' "${BASE[@]}" "$@"); echo "args = [${a%, }]"; }
# server_toml NAME PORT ARG...: a [[servers]] table (SERVER_MODEL: a model of its own)
server_toml() {
  printf '\n[[servers]]\nname = "%s"\nport = %s\n' "$1" "$2"
  [ -z "${SERVER_MODEL:-}" ] || echo "model = \"$SERVER_MODEL\""
  shift 2; args_line "$@"
}

fleet_main() {
  { fleet_header sgmain main 400 240
    server_toml plain 31000 --mem-fraction-static 0.40 --max-running-requests 256
    server_toml ngram 32000 --mem-fraction-static 0.70 --max-running-requests 128 --speculative-algorithm NGRAM \
      --speculative-num-draft-tokens 8
  } > $W/fleet-main.toml
}

fleet_fail() {
  { fleet_header sgfail fail 240 200
    server_toml lowmem 33000 --mem-fraction-static 0.001 --disable-cuda-graph
    SERVER_MODEL=$W/no-such-model server_toml missing 34000 --mem-fraction-static 0.05 --disable-cuda-graph
    server_toml badarg 35000 --mem-fraction-static abc
    server_toml sigkill 36000 --mem-fraction-static 0.05 --disable-cuda-graph
  } > $W/fleet-fail.toml
}

stage_up() {
  fleet_main
  cp $W/fleet-main.toml "$R/"
  local n t0
  for n in ${UP_SERVERS:-plain ngram}; do
    t0=$SECONDS
    $SF up $W/fleet-main.toml --only $n --timeout $(( $(left) > 420 ? 400 : $(left) - 20 )) --json > "$R/cmd/up-$n.out" 2> "$R/cmd/up-$n.err"
    say "up $n: rc=$? in $(( SECONDS - t0 )) s"
    cp $W/state/main/logs/$n.log "$R/logs/main-$n.log" 2>/dev/null
    $P - "$R/cmd/up-$n.out" <<'PY' | tee -a "$R/summary.txt"
import json, sys
try: d = json.load(open(sys.argv[1]))
except Exception as e: print("up: no JSON", e); sys.exit()
for s in d.get("servers", []):
    v = s.get("verdict") or {}
    print(f"up {s.get('name')}: {v.get('state')} {v.get('category')} ttr={s.get('time_to_ready_s')} "
          f"evidence={((v.get('evidence') or {}).get('text') or '')[:200]!r} hint={v.get('hint')!r}")
    print(f"   capacity={json.dumps({k: x for k, x in (v.get('capacity') or {}).items() if k != 'source'})}")
PY
  done
  $SF status --fleet $W/fleet-main.toml --json > "$R/cmd/status-main.out" 2>&1
  for n in ${UP_SERVERS:-plain ngram}; do
    curl -s -m 10 "http://127.0.0.1:$(port_of $n)/server_info" > "$R/server_info-$n.json"
    grep -E "max_total_num_tokens=|KV Cache is allocated|KV cache allocated|fired up|Capture cuda graph end|Load weight end" \
      "$R/logs/main-$n.log" | cut -c1-300 > "$R/loglines-$n.txt"
    summary "log lines $n: $(grep -o 'max_total_num_tokens=[^ ]* .*' "$R/loglines-$n.txt" | head -1 | cut -c1-200)"
    summary "server_info $n: $($P -c "import json,sys; d=json.load(open(sys.argv[1])); s=(d.get('internal_states') or [{}])[0]; print({k: d.get(k) for k in ('max_total_num_tokens','max_running_requests','context_length','speculative_algorithm','version')}, {k: s.get(k) for k in ('effective_max_running_requests_per_dp','max_total_num_tokens')})" "$R/server_info-$n.json" 2>&1 | cut -c1-300)"
    [ -s "$R/logs/main-$n.log" ] && cp "$R/logs/main-$n.log" "$R/fixtures/sglang0517_h200_up_$n.log"
  done
}

# The real failures, all at once, while the main servers keep running: a failure fleet through `up`
# (mem fraction too low, missing model, bad value, SIGKILL while loading), SGLang by hand on a held
# port through `servefleet wait`.
stage_failures() {
  fleet_fail
  cp $W/fleet-fail.toml "$R/"
  # a port held by a listener that never answers
  $P -c "import socket,time; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(('127.0.0.1', 37000)); s.listen(8); time.sleep(400)" &
  local holder=$! t0=$SECONDS
  sleep 1
  $SF up $W/fleet-fail.toml --timeout 240 --json > "$R/cmd/up-fail.out" 2> "$R/cmd/up-fail.err" &
  local up=$!
  setsid $P -m sglang.launch_server --model-path "$MODEL" --served-model-name $NAME --host 127.0.0.1 --port 37000 \
    "${BASE[@]}" --mem-fraction-static 0.05 --disable-cuda-graph > "$R/logs/fail-portheld.log" 2>&1 < /dev/null &
  local manual=$!
  $SF wait --url http://127.0.0.1:37000 --log "$R/logs/fail-portheld.log" --pid $manual --engine sglang --timeout 240 --json \
    > "$R/cmd/wait-portheld.out" 2> "$R/cmd/wait-portheld.err" &
  local waiter=$!
  # SIGKILL the sigkill server's process group as soon as its log says it loads weights
  local klog=$W/state/fail/logs/sigkill.log
  for _ in $(seq 1 240); do
    if grep -qE "Load weight begin|Init torch distributed begin" "$klog" 2>/dev/null; then
      local pg; pg=$($P -c "import json; print(json.load(open('$W/state/fail/sigkill.json'))['pgid'])" 2>/dev/null)
      [ -n "$pg" ] && kill -KILL -- "-$pg" && say "failures: SIGKILL to group $pg on: $(grep -E 'Load weight begin|Init torch distributed begin' "$klog" | head -1 | cut -c1-120)"
      break
    fi
    sleep 0.5
  done
  wait $up; say "failures: up rc=$? in $(( SECONDS - t0 )) s"
  wait $waiter; say "failures: wait rc=$?"
  kill_group $manual; kill $holder 2>/dev/null
  for n in lowmem missing badarg sigkill; do cp $W/state/fail/logs/$n.log "$R/logs/fail-$n.log" 2>/dev/null; done
  declare -A fx=([lowmem]=mem_fraction_too_low [missing]=missing_model [badarg]=bad_argument [sigkill]=killed_loading [portheld]=port_in_use)
  for n in lowmem missing badarg sigkill portheld; do
    [ -s "$R/logs/fail-$n.log" ] || continue
    cp "$R/logs/fail-$n.log" "$R/fixtures/sglang0517_h200_${fx[$n]}.log"
    $SF diagnose "$R/fixtures/sglang0517_h200_${fx[$n]}.log" --json > "$R/cmd/diagnose-$n.out" 2>&1
  done
  $P - "$R" <<'PY' | tee -a "$R/summary.txt"
import json, sys, os
R = sys.argv[1]
def load(p):
    try: return json.load(open(p))
    except Exception: return None
up = load(f"{R}/cmd/up-fail.out") or {}
live = {s.get("name"): (s.get("verdict") or {}) for s in up.get("servers", [])}
live["portheld"] = load(f"{R}/cmd/wait-portheld.out") or {}
for n in ("lowmem", "missing", "badarg", "sigkill", "portheld"):
    d = load(f"{R}/cmd/diagnose-{n}.out") or {}
    v = live.get(n) or {}
    print(f"failure {n}: live={v.get('state')}/{v.get('category')} diagnose={d.get('engine')}/{d.get('state')}/{d.get('category')} "
          f"evidence={((d.get('evidence') or {}).get('text') or '')[:220]!r}")
PY
  $SF down --fleet $W/fleet-fail.toml --grace 5 --json > /dev/null 2>&1
}

stage_bench() {
  local ready n
  mapfile -t ready < <(ready_main)
  [ ${#ready[@]} = 0 ] && { summary "bench: skipped (no server ready)"; return; }
  mkdir -p "$R/bench"
  local common=(--input-len 256 --output-len 256 --api completions --temperature 0 --tokenizer "$MODEL")
  local names; names=$(IFS=,; echo "${ready[*]}")
  # servefleet's client and SGLang's own on the plain server first (the A/B), then the sweeps
  SGLANG_BENCH_C=${SGLANG_BENCH_C:-256}
  local nreq=$(( SGLANG_BENCH_C * 2 ))
  STANDIN_MODULES="$STANDIN_MODULES,datasets=4.0.0" timeout 150 $P -m sglang.bench_serving --backend sglang-oai \
    --base-url http://127.0.0.1:31000 --model $NAME --tokenizer "$MODEL" --dataset-name random-ids \
    --random-input-len 256 --random-output-len 256 --random-range-ratio 1 --num-prompts $nreq \
    --max-concurrency $SGLANG_BENCH_C --output-file "$R/bench/sglang-bench-c$SGLANG_BENCH_C.jsonl" --disable-tqdm \
    > "$R/cmd/sglang-bench.out" 2>&1
  say "sglang.bench_serving: rc=$?"
  grep -E "Output token throughput|Successful requests|Benchmark duration|Median TPOT|Total token throughput" "$R/cmd/sglang-bench.out" \
    | sed 's/^/sglang.bench_serving C='$SGLANG_BENCH_C': /' | tee -a "$R/summary.txt"
  $SF bench --url http://127.0.0.1:31000 -c $SGLANG_BENCH_C --requests $nreq --stream "${common[@]}" \
    --out "$R/bench/sf-ab-c$SGLANG_BENCH_C.json" --json > "$R/cmd/bench-ab.out" 2> "$R/cmd/bench-ab.err"
  say "servefleet bench A/B: rc=$?"
  points "$R/bench/sf-ab-c$SGLANG_BENCH_C.json" "A/B servefleet"
  [ "$(left)" -lt 110 ] && return
  $SF bench --fleet $W/fleet-main.toml --servers "$names" -c 64,256 --duration 10 --no-stream "${common[@]}" \
    --out "$R/bench/nostream.json" --json > "$R/cmd/bench-nostream.out" 2> "$R/cmd/bench-nostream.err"
  say "bench no-stream: rc=$?"
  for n in "${ready[@]}"; do points "$R/bench/nostream-$n.json" "no-stream $n"; done
  [ "$(left)" -lt 110 ] && return
  $SF bench --fleet $W/fleet-main.toml --servers "$names" -c 64,256 --duration 10 --stream "${common[@]}" \
    --out "$R/bench/stream.json" --json > "$R/cmd/bench-stream.out" 2> "$R/cmd/bench-stream.err"
  say "bench stream: rc=$?"
  for n in "${ready[@]}"; do points "$R/bench/stream-$n.json" "stream $n"; done
}

# points FILE LABEL: one summary line per bench point
points() {
  $P - "$1" "$2" <<'PY' | tee -a "$R/summary.txt"
import json, sys
try: d = json.load(open(sys.argv[1]))
except Exception as e: print(sys.argv[2], "no result", e); sys.exit()
for p in d.get("points", []):
    print(f"{sys.argv[2]} C={p.get('concurrency')}: {p['output_tokens_per_s']:.0f} out tok/s, TPOT p50 "
          f"{(p.get('tpot_ms') or {}).get('p50')}, errors {p.get('errors')}, client_bound {p.get('client_bound')}")
PY
}

# The A/B again, longer and in both orders: servefleet bench, sglang.bench_serving, servefleet bench,
# the same request count and concurrency on the plain server (AB_C, AB_N).
stage_ab() {
  [ "$(health 31000 health)" = 200 ] || { summary "ab: skipped (plain not ready)"; return; }
  mkdir -p "$R/ab"
  local c=${AB_C:-256} n=${AB_N:-1024} i
  local common=(--input-len 256 --output-len 256 --api completions --temperature 0 --tokenizer "$MODEL")
  for i in 1 2 3; do
    [ "$(left)" -lt 45 ] && return
    if [ $i = 2 ]; then
      STANDIN_MODULES="$STANDIN_MODULES,datasets=4.0.0" timeout 120 $P -m sglang.bench_serving --backend sglang-oai \
        --base-url http://127.0.0.1:31000 --model $NAME --tokenizer "$MODEL" --dataset-name random-ids \
        --random-input-len 256 --random-output-len 256 --random-range-ratio 1 --num-prompts $n \
        --max-concurrency $c --output-file "$R/ab/sglang-bench-c$c-n$n.jsonl" --disable-tqdm > "$R/ab/sglang-bench.out" 2>&1
      grep -E "Output token throughput|Benchmark duration|Median TPOT|Median ITL|Median TTFT" "$R/ab/sglang-bench.out" \
        | sed "s/^/ab sglang.bench_serving C=$c N=$n: /" | tee -a "$R/summary.txt"
    else
      # --stream: sglang.bench_serving always streams, and servefleet bench no longer does by default
      $SF bench --url http://127.0.0.1:31000 -c $c --requests $n --stream "${common[@]}" --out "$R/ab/sf-$i-c$c-n$n.json" --json \
        > "$R/ab/sf-$i.out" 2> "$R/ab/sf-$i.err"
      points "$R/ab/sf-$i-c$c-n$n.json" "ab servefleet run $i N=$n"
    fi
  done
}

# servefleet generate of GEN_N prompts (~40 words, GEN_TOKENS max tokens) over the main fleet, the ngram
# server's process group SIGKILLed GEN_KILL_AFTER s in; the fleet restarts it, the job must end with every
# id exactly once (sglang_generate.py counts them). Interrupted (resumable) before the budget runs out.
stage_generate() {
  [ -f $W/fleet-main.toml ] || fleet_main
  local ready n
  mapfile -t ready < <(ready_main)
  [ ${#ready[@]} = 2 ] || { summary "generate: skipped (ready: ${ready[*]:-none}; both needed)"; return 1; }
  local dl=$(( $(left) - ${GEN_RESERVE:-60} ))
  $P .gpu-sglang/run/sglang_generate.py --fleet $W/fleet-main.toml --state-dir $W/state/main --work $W/gen \
    --out "$R/generate.json" --prompts ${GEN_N:-20000} --max-tokens ${GEN_TOKENS:-256} --kill ${GEN_KILL:-ngram} \
    --kill-after ${GEN_KILL_AFTER:-15} --deadline $dl --sf "$SF" 2>&1 | tee "$R/cmd/generate.out"
  cp $W/gen/generate.stdout "$R/cmd/generate-report.json" 2>/dev/null
  tail -50 $W/gen/generate.stderr > "$R/cmd/generate.stderr.tail" 2>/dev/null
  cp $W/gen/out/job.json $W/gen/out/report.json "$R/cmd/" 2>/dev/null
  cp $W/state/main/logs/${GEN_KILL:-ngram}.log "$R/logs/main-${GEN_KILL:-ngram}-after-restart.log" 2>/dev/null
  ls $W/state/main/logs/ > "$R/cmd/state-logs.txt" 2>/dev/null
  grep '^generate:' "$R/cmd/generate.out" | tee -a "$R/summary.txt"
  $SF status --fleet $W/fleet-main.toml --json > "$R/cmd/status-after-generate.out" 2>&1
}

stage_down() {
  [ -f $W/fleet-main.toml ] && $SF down --fleet $W/fleet-main.toml --grace 10 --json > "$R/cmd/down.out" 2>&1
  for n in plain ngram; do cp $W/state/main/logs/$n.log "$R/logs/main-$n.log" 2>/dev/null; done
  true
}

if [ -n "$one" ]; then  # one stage, run by stages.py
  "stage_$one"; exit $?
fi
export SGL_SETUP_DONE=1
$P "$self/stages.py" --script "$self/sglang_h200.sh" --budget "$(left)" --always down --blocking smoke \
  --checkpoint "bash '$self/sglang_h200.sh' --stage checkpoint" --summary "$R/stages.json" --log "$R/driver.log" "${stages[@]}"
rc=$?
cat "$R/summary.txt" 2>/dev/null
exit $rc
