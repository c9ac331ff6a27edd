#!/bin/sh
# `make test`'s first step: what the tests need beyond Python -- a real sshd (tests/sshd.py), Slurm
# and munge (tests/slurm_rig.py), chromium (tests/test_report.py) -- installed through the same
# scripts CI runs (.ci/run), or, where that cannot be done here, a stop within the first second with
# the one command to run. The SSH, Slurm and browser tests fail (never skip) when what they need is
# missing, unless their opt-out is set: SERVEFLEET_SKIP_SSH=1, SERVEFLEET_SKIP_SLURM=1,
# SERVEFLEET_SKIP_BROWSER=1. Each setup script returns at once when everything is installed.
set -eu
cd "$(dirname "$0")/.."

skip() { eval "[ \"\${$1:-}\" = 1 ]"; }
uid=$(id -u)

# The Slurm rig and the network-namespace SSH tests run daemons as root.
if [ "$uid" -ne 0 ] && ! { skip SERVEFLEET_SKIP_SLURM && skip SERVEFLEET_SKIP_SSH; }; then
    echo "make test: the Slurm and SSH tests start slurmd and network namespaces as root: run \`sudo make test\`" >&2
    echo "  (or opt out of them: SERVEFLEET_SKIP_SLURM=1 SERVEFLEET_SKIP_SSH=1 make test)" >&2
    exit 1
fi

# Not root from here on only when the root-only suites are opted out; the scripts use sudo then.
if [ "$uid" -ne 0 ] && ! skip SERVEFLEET_SKIP_BROWSER && ! command -v sudo >/dev/null 2>&1; then
    echo "make test: not root and no sudo to install chromium with; as root run:" >&2
    echo "  sh scripts/ci-browser-setup.sh   (or opt out: SERVEFLEET_SKIP_BROWSER=1)" >&2
    exit 1
fi

run() { echo "make test: $1"; sh "$1" >/dev/null; }
skip SERVEFLEET_SKIP_SSH || run scripts/ci-sshd-setup.sh
skip SERVEFLEET_SKIP_SLURM || run scripts/ci-slurm-setup.sh
skip SERVEFLEET_SKIP_BROWSER || run scripts/ci-browser-setup.sh
