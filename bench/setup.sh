#!/bin/sh
# Set-up for bench/run.py: ripgrep (Debian's package) for the rg row. Run as root; does
# nothing when rg is already on PATH. The test suite does not need it.
set -eu
if command -v rg >/dev/null 2>&1; then
    echo "bench/setup.sh: $(rg --version | head -n1) already installed"
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "bench/setup.sh: ripgrep is missing; run me as root (sudo bench/setup.sh)" >&2
    exit 1
fi
apt-get update -q
DEBIAN_FRONTEND=noninteractive apt-get install -y -q ripgrep
rg --version | head -n1
