#!/bin/sh
# Installs the headless browser of the report tests (tests/test_report.py): Debian's chromium, and a
# font to draw the text with. The tests drive it with playwright (a pinned test dependency) through
# `executable_path`; playwright's own browser download is never used. CI runs this as root on a
# fresh machine; on a developer machine run it with sudo once (the browser tests fail, naming this
# script, when chromium is missing).
set -eu

need=""
command -v chromium >/dev/null 2>&1 || need="$need chromium"
[ -e /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ] || need="$need fonts-dejavu-core"

SUDO=
[ "$(id -u)" -eq 0 ] || SUDO=sudo

if [ -n "$need" ]; then
    $SUDO apt-get update
    # shellcheck disable=SC2086
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $need
fi

# (Debian's wrapper script may print a shell warning about the memory size; harmless)
chromium --version 2>/dev/null
