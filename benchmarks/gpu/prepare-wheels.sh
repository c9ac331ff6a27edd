#!/usr/bin/env bash
# Download the wheels in wheels.txt into .gpu/servefleet-wheels (ignored by git: /.gpu/ is in
# .gitignore) for the device command's `carry`. Run from anywhere; uses this machine's pip.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
dest="$root/.gpu/servefleet-wheels"
mkdir -p "$dest"
grep -v '^\s*#' "$here/wheels.txt" | grep -v '^\s*$' | while read -r spec; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform any -d "$dest" "$spec"
done
ls -la "$dest"
du -sh "$dest"
