# Sourced by each call: the vLLM recipe, servefleet, the fleet file, one generate job with the sampler beside it.
set -u
R=$OUT; mkdir -p $R
t0=$(date +%s); source .gpu/run/gpu-setup.sh >$R/gpu-setup.out 2>&1; echo "gpu-setup $(( $(date +%s)-t0 )) s"
export PYTHONPATH=/tmp/sf-site:${PYTHONPATH:-} PYTHONUNBUFFERED=1
P=/opt/torch/.venv/bin/python3; SF="$P -m servefleet.cli.main"; M=/tmp/sf-h200/model
H=benchmarks/gpu/issue25; U=http://127.0.0.1:48517
ls $M >/dev/null || { echo "no model: setup missing"; exit 3; }
mkdir -p /tmp/ck
# gen NAME TIMEOUT ARGS...: one generate job, its /metrics samples, its analysis line
gen() {
  local name=$1 to=$2; shift 2
  rm -rf /tmp/ck/out-$name /tmp/ck/stop-$name
  $P $H/sampler.py $U $R/samples-$name.json /tmp/ck/stop-$name & local sp=$!
  local t0=$(date +%s)
  timeout $to $SF generate --output /tmp/ck/out-$name --model ck --completions --temperature 0 --json "$@" > $R/gen-$name.json 2>$R/gen-$name.err
  echo "generate $name rc=$? $(( $(date +%s)-t0 )) s"
  touch /tmp/ck/stop-$name; wait $sp
  $P $H/analyse.py $R/samples-$name.json $R/gen-$name.json | tee $R/an-$name.json
}
