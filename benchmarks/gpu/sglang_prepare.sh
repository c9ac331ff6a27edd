#!/usr/bin/env bash
# Prepare real SGLang 0.5.17 for the H200 machine (torch 2.11.0+cu130, Python 3.12, no network there).
# Run on this machine, from the project root: `bash benchmarks/gpu/sglang_prepare.sh` (a few minutes).
# Writes .gpu-sglang/ (add "/.gpu-sglang/" to .git/info/exclude):
#   .gpu-sglang/pkg/sgl.tar.xz.part-*  sglang + sglang-kernel (trimmed) + every wheel of sglang_deps.txt,
#                                      installed into one folder here and xz-packed (parts of <= 36 MiB)
#   .gpu-sglang/run/                   sglang_setup.sh, sitecustomize.py (the stand-ins), the checksum,
#                                      sglang_h200.sh, sglang_generate.py and the h200_*.py it imports
#   .gpu-sglang/sf-src.tar.gz          this checkout's src/ and benchmarks/gpu/ (the device gets the
#                                      session's checkout, which may be older)
# One device command then sends `carry=[".gpu-sglang"]` (~55 MiB with the tree) and starts with
# `source .gpu-sglang/run/sglang_setup.sh`.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${SGL_OUT:-$PWD/.gpu-sglang}   # SGL_OUT: another checkout's .gpu-sglang (the one the device gets)
root=$(cd "$here/../.." && pwd)
cache=${SGL_CACHE:-/tmp/sgl-prepare}
mkdir -p "$out"/{pkg,run} "$cache"/{wheels,deps}
plat=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_34_x86_64
      --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_26_x86_64
      --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
      --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64)
dl() { python3 -m pip download -q --no-deps "${plat[@]}" -d "$1" "$2" 2>&1 | grep -v "is ignored" || true; }
if [ -f "$out/pkg/sgl.tar.xz.part-00" ] && [ -z "${SGL_REPACK:-}" ]; then
  echo "sgl.tar.xz already packed (SGL_REPACK=1 to pack again): refreshing the scripts and servefleet's source only"
else
# downloads only when packing (a refresh needs none of them)
ls "$cache"/wheels/sglang-0.5.17-*.whl >/dev/null 2>&1 || dl "$cache/wheels" sglang==0.5.17
ls "$cache"/wheels/sglang_kernel-0.4.5-*.whl >/dev/null 2>&1 || dl "$cache/wheels" sglang-kernel==0.4.5
grep -v '^\s*#' "$here/sglang_deps.txt" | grep -v '^\s*$' | while read -r spec; do
  name=$(echo "${spec%%==*}" | tr '-' '_' | tr 'A-Z' 'a-z'); ver=${spec##*==}
  ls "$cache/deps/" | tr 'A-Z' 'a-z' | grep -q "^${name}-${ver}-" || dl "$cache/deps" "$spec"
done
stage=$(mktemp -d)
# every dependency wheel, installed for Python 3.12 (nothing runs here)
python3 -m pip install -q --no-deps --no-compile --target "$stage" "${plat[@]}" "$cache"/deps/*.whl
# sglang, without its diffusion runtime (multimodal_gen) and the Rust extensions of the native server,
# gRPC and one multimodal processor (off unless SGLANG_RUST_SERVER / --grpc-port / inkling models)
unzip -q -o "$cache"/wheels/sglang-0.5.17-*.whl -d "$stage"
rm -rf "$stage"/sglang/multimodal_gen "$stage"/sglang/srt/server/_core.*.so "$stage"/sglang/srt/grpc/_core.*.so \
       "$stage"/sglang/srt/multimodal/_core.*.so
# sglang-kernel without FA3 (flash_ops, 1.1 GB, imported inside a try), FlashMLA and InfLLM (MLA and
# sparse models, loaded lazily) and the Blackwell build (sm100): Hopper's sm90 common_ops stays
unzip -q -o "$cache"/wheels/sglang_kernel-0.4.5-*.whl -d "$stage" -x 'sgl_kernel/flash_ops.abi3.so' \
      'sgl_kernel/flashmla_ops.abi3.so' 'sgl_kernel/infllm_ops*' 'sgl_kernel/sm100/*'
# xgrammar's static library is for building against it, not for running
rm -rf "$stage"/xgrammar/lib/libxgrammar.a "$stage"/bin
find "$stage" -name __pycache__ -prune -exec rm -rf {} +
du -sh "$stage"
rm -f "$out"/pkg/sgl.tar.xz.part-*
(cd "$stage" && tar cf - .) | xz -9 -T0 > "$cache/sgl.tar.xz"
sha256sum "$cache/sgl.tar.xz" | cut -d' ' -f1 > "$out/run/sgl.sha256"
split -b 36M -d "$cache/sgl.tar.xz" "$out/pkg/sgl.tar.xz.part-"
rm -rf "$stage"
fi
# sglang_generate.py imports h200_generate (the prompt writer, the id count), which imports the other h200_*.py;
# sglang_h200.sh runs its stages through stages.py
cp "$here/sglang_setup.sh" "$here/sglang/sitecustomize.py" "$here/sglang_h200.sh" "$here/sglang_generate.py" "$here"/h200_*.py \
  "$here/stages.py" "$out/run/"
tar czf "$out/sf-src.tar.gz" -C "$root" --exclude=__pycache__ src benchmarks/gpu
du -sh "$out"/pkg "$out"/run "$out"/sf-src.tar.gz
echo "ready: carry .gpu-sglang"
