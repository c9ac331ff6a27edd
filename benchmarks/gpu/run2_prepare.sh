#!/usr/bin/env bash
# Pack this checkout's src/ and benchmarks/gpu/ for the second GPU run (issue 17 step 2) into
# DEST/.gpu2/ (default: the checkout itself; add "/.gpu2/" to DEST/.git/info/exclude). The device
# machine gets the *session's* checkout, which may be older than this branch: the run unpacks this
# tarball there and runs from it (benchmarks/gpu/run2.sh). Carry ".gpu2" with every device command.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
dest=$(cd "${1:-$root}" && pwd)/.gpu2
mkdir -p "$dest"
tar czf "$dest/sf2-src.tar.gz" -C "$root" --exclude=__pycache__ \
    src benchmarks/gpu pyproject.toml
cp "$here/run2.sh" "$dest/run2.sh"
git -C "$root" rev-parse HEAD > "$dest/commit" 2>/dev/null || true
du -sh "$dest"
echo "ready: carry .gpu2 (and .gpu/...); command: bash .gpu2/run2.sh STAGES..."
