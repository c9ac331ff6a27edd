#!/usr/bin/env bash
# On the device, from the project root (carried as .gpu2/run2.sh by run2_prepare.sh): unpack the
# packed servefleet (src/ + benchmarks/gpu/) into /tmp/sf2, point it at this root's .gpu/ (the vLLM
# recipe and the wheels), put its src/ on PYTHONPATH (use-src-path) and run its run_h200.sh.
#   bash .gpu2/run2.sh setup collect          (first command)
#   bash .gpu2/run2.sh run2a --budget 530     (second)
#   bash .gpu2/run2.sh run2b --budget 540     (third)
set -u
root=$(pwd)
src=${SF2_SRC:-/tmp/sf2}
if [ ! -f "$src/.unpacked" ] || ! cmp -s "$root/.gpu2/sf2-src.tar.gz" "$src/.tarball"; then
  rm -rf "$src" && mkdir -p "$src"
  tar xzf "$root/.gpu2/sf2-src.tar.gz" -C "$src" && cp "$root/.gpu2/sf2-src.tar.gz" "$src/.tarball" && touch "$src/.unpacked"
fi
[ -e "$src/.gpu" ] || ln -s "$root/.gpu" "$src/.gpu"
work=/tmp/sf-h200; prev=""
for a in "$@"; do case "$prev" in --work) work=$a;; esac; prev=$a; done
mkdir -p "$work" && echo "run2.sh: servefleet from $src/src" > "$work/use-src-path"
echo "run2.sh: servefleet $(cat "$root/.gpu2/commit" 2>/dev/null) unpacked in $src"
exec bash "$src/benchmarks/gpu/run_h200.sh" "$@"
