#!/usr/bin/env bash
# Install the system packages the integration tests start for real: Slurm, munge,
# systemd-journal-remote (journal files), Chromium (the dashboard browser test), acl (setfacl:
# the job's user is granted read on their own evidence bundle), Prometheus (promtool backfills
# recorded exporter samples into a TSDB the metrics tests serve), openssl (the self-signed CA
# and certificate of the TLS + basic-auth Prometheus test; its bcrypt hash comes from the
# `bcrypt` test extra).
#
# Idempotent and quick when everything is already present (no apt-get call at
# all in that case).  Does NOT start any service: there is no systemd PID 1 on
# the target machines; tests/integration/slurm_cluster.py starts munged,
# slurmctld and the slurmd's itself.
#
# Usage:  sudo bash tests/integration/setup-system.sh
set -euo pipefail

PKGS=(slurmctld slurmd slurm-client munge systemd-journal-remote systemd chromium fonts-dejavu-core acl prometheus openssl)

if [ "$(id -u)" -ne 0 ]; then
    echo "setup-system.sh: must run as root" >&2
    exit 1
fi

missing=()
for p in "${PKGS[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$p")
    fi
done

if [ "${#missing[@]}" -gt 0 ]; then
    echo "setup-system.sh: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    # Without a PID-1 systemd, maintainer scripts would try to start the
    # daemons via invoke-rc.d.  A policy-rc.d returning 101 forbids that; we
    # only install it for the duration of the install and only if none exists.
    policy_created=0
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
        chmod 755 /usr/sbin/policy-rc.d
        policy_created=1
    fi
    trap '[ "$policy_created" = 1 ] && rm -f /usr/sbin/policy-rc.d' EXIT
    apt_opts=(-y -q -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold)
    if ! apt-get install "${apt_opts[@]}" --no-install-recommends "${missing[@]}"; then
        apt-get update -q
        apt-get install "${apt_opts[@]}" --no-install-recommends "${missing[@]}"
    fi
fi

# Munge key: the Debian package normally creates it in postinst, but make sure.
if [ ! -s /etc/munge/munge.key ]; then
    echo "setup-system.sh: creating /etc/munge/munge.key"
    install -d -m 0700 -o munge -g munge /etc/munge
    if command -v mungekey >/dev/null 2>&1; then
        mungekey --create --keyfile=/etc/munge/munge.key --force
    else
        dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key status=none
    fi
    chown munge:munge /etc/munge/munge.key
    chmod 0400 /etc/munge/munge.key
fi

# Directories munged wants (normally created by systemd-tmpfiles).
install -d -m 0755 -o munge -g munge /run/munge
install -d -m 0700 -o munge -g munge /var/lib/munge /var/log/munge

echo "setup-system.sh: ok ($(slurmd -V 2>/dev/null || echo "slurmd missing"))"
