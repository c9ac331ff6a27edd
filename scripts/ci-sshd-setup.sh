#!/bin/sh
# Installs what the SSH test rig (tests/sshd.py) needs on a Debian/Ubuntu machine: the OpenSSH
# server and client, iproute2 (ss, ip netns) and procps (ps, pgrep). CI runs this as root on a
# fresh machine; on a developer machine it is run with sudo once, or not at all (the SSH tests
# are skipped, with the reason, when /usr/sbin/sshd is missing).
#
# The rig starts its own sshd on 127.0.0.1 with a generated config; this script does not start
# or enable the system's ssh service, and removes the autostart Debian's package may set up.
set -eu

need=""
[ -x /usr/sbin/sshd ] || need="$need openssh-server"
command -v ssh >/dev/null 2>&1 || need="$need openssh-client"
command -v ss >/dev/null 2>&1 || need="$need iproute2"
command -v pgrep >/dev/null 2>&1 || need="$need procps"

SUDO=
[ "$(id -u)" -eq 0 ] || SUDO=sudo

if [ -n "$need" ]; then
    # Do not let the package start a system sshd (no init system in CI containers anyway).
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

# sshd refuses to start without its privilege-separation folder.
if [ ! -d /run/sshd ]; then
    $SUDO mkdir -p /run/sshd
    $SUDO chmod 0755 /run/sshd
fi

ssh -V
