#!/usr/bin/env bash
# Entry point of the H200 run (issue 8); README.md beside this file says which device commands to send.
#   on the GPU machine:  bash benchmarks/gpu/run_h200.sh setup collect    (first command)
#                        bash benchmarks/gpu/run_h200.sh all --budget 560 (second command)
#   CPU rehearsal here:  bash benchmarks/gpu/run_h200.sh --rehearse all
# Sources the vLLM recipe's gpu-setup.sh (it installs vLLM once both chunks are there and exports
# PYTHONPATH, VLLM_USE_FLASHINFER_SAMPLER=0, HF_HUB_OFFLINE=1, ...) and hands over to h200.py.
set -u
cd "$(dirname "$0")/../.." || exit 3
rehearse=0
for arg in "$@"; do [ "$arg" = "--rehearse" ] && rehearse=1; done
if [ "$rehearse" = 1 ]; then
  PY=${PYTHON:-.venv/bin/python}
  [ -x "$PY" ] || PY=python3
else
  if [ -f .gpu/run/gpu-setup.sh ]; then
    t0=$(date +%s)
    # shellcheck disable=SC1091
    source .gpu/run/gpu-setup.sh
    echo "gpu-setup.sh: $(( $(date +%s) - t0 )) s"
  else
    echo "no .gpu/run/gpu-setup.sh here: carry .gpu/run (see benchmarks/gpu/README.md)" >&2
  fi
  PY=${PYTHON:-python3}
fi
export PYTHONUNBUFFERED=1
exec "$PY" benchmarks/gpu/h200.py "$@"
