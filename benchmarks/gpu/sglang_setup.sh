#!/usr/bin/env bash
# On the H200 machine, from the repo root: `source .gpu-sglang/run/sglang_setup.sh`.
# Idempotent: stashes the parts of sgl.tar.xz under /tmp/sgl-parts as they arrive (one call or two),
# unpacks them into /tmp/sgl-site once all are there and the checksum matches, unpacks servefleet's
# source from this checkout's .gpu-sglang/sf-src.tar.gz into /tmp/sf-src, and exports the environment.
mkdir -p /tmp/sgl-parts /tmp/sgl-site /tmp/sgl-stubs /tmp/sf-src
[ -d .gpu-sglang/pkg ] && cp -n .gpu-sglang/pkg/* /tmp/sgl-parts/ 2>/dev/null
[ -f .gpu-sglang/run/sgl.sha256 ] && cp .gpu-sglang/run/sgl.sha256 /tmp/sgl-parts/sha256
if [ ! -f /tmp/sgl-site/sglang/__init__.py ]; then
  sum=$(cat /tmp/sgl-parts/sgl.tar.xz.part-* 2>/dev/null | sha256sum | cut -d' ' -f1)
  if [ "$sum" = "$(cat /tmp/sgl-parts/sha256 2>/dev/null)" ]; then
    cat /tmp/sgl-parts/sgl.tar.xz.part-* | python3 -c "import sys,lzma,tarfile; tarfile.open(fileobj=lzma.LZMAFile(sys.stdin.buffer),mode='r|').extractall('/tmp/sgl-site')"
  else
    echo "SGLang: parts incomplete or checksum mismatch ($(ls /tmp/sgl-parts | tr '\n' ' '))"
  fi
fi
cp .gpu-sglang/run/sitecustomize.py /tmp/sgl-stubs/ 2>/dev/null
if [ -f .gpu-sglang/sf-src.tar.gz ]; then rm -rf /tmp/sf-src/* && tar xzf .gpu-sglang/sf-src.tar.gz -C /tmp/sf-src; fi
# /tmp/sgl-stubs first: its sitecustomize.py installs the stand-ins named in STANDIN_MODULES (README.md).
export PYTHONPATH=/tmp/sgl-stubs:/tmp/sgl-site:/tmp/sf-src/src${PYTHONPATH:+:$PYTHONPATH}
# IPython: sglang.utils imports IPython.display (notebook helpers); soundfile: the ASR/realtime audio
# endpoints; flashinfer (the package, flashinfer.sampling and flashinfer.prefill only): on CUDA, fp8_utils
# imports `flashinfer.bmm_fp8`, the sampler `flashinfer.sampling` and vision attention `flashinfer.prefill`
# unguarded, while sgl_kernel's norms probe `import flashinfer.norm` in a try and must keep failing. None is used by a
# bf16 text model on the triton backend; all are stand-ins (sitecustomize.py). SGLANG_IS_FLASHINFER_AVAILABLE=false
# keeps SGLang's own availability checks (find_spec, which a stand-in would satisfy) off flashinfer.
export STANDIN_MODULES=${STANDIN_MODULES:-IPython=9.0.0,soundfile=0.13.1,flashinfer/sampling+prefill=0.6.15.post1}
export SGLANG_IS_FLASHINFER_AVAILABLE=false
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 SGLANG_DISABLE_TELEMETRY=1 DO_NOT_TRACK=1 TOKENIZERS_PARALLELISM=false \
       PYTHONUNBUFFERED=1
[ -f /tmp/sgl-site/sglang/__init__.py ] && echo "SGLang 0.5.17 unpacked: python3 -m sglang.launch_server ... --attention-backend triton --sampling-backend pytorch"
true
