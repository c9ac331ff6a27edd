#!/bin/sh
# Installs what the Slurm test rig (tests/slurm_rig.py) needs on a Debian/Ubuntu machine: Debian's
# slurm-wlm (slurmctld, slurmd and the client commands sbatch/squeue/scontrol/scancel) and munge
# (the authentication daemon every Slurm daemon and client talks to). CI runs this as root on a
# fresh machine; on a developer machine it is run with sudo once.
#
# The rig writes its own one-node slurm.conf and starts munged, slurmctld and slurmd itself, as
# plain daemons with their state under a temporary folder; this script starts nothing and removes
# the autostart the packages may set up.
set -eu

need=""
command -v slurmctld >/dev/null 2>&1 || need="$need slurmctld"
command -v slurmd >/dev/null 2>&1 || need="$need slurmd"
command -v sbatch >/dev/null 2>&1 || need="$need slurm-client"
command -v munged >/dev/null 2>&1 || need="$need munge"

SUDO=
[ "$(id -u)" -eq 0 ] || SUDO=sudo

if [ -n "$need" ]; then
    # Do not let the packages start system daemons (no init system in CI containers anyway).
    own_policy=0
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
        $SUDO chmod +x /usr/sbin/policy-rc.d
        own_policy=1
    fi
    $SUDO apt-get update
    # shellcheck disable=SC2086
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $need
    [ "$own_policy" = 0 ] || $SUDO rm -f /usr/sbin/policy-rc.d
fi

slurmctld -V
