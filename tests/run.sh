#!/bin/sh
# Install what the test suite needs and run all of it. As root on Debian 12, this also installs
# the system packages the integration tests start for real (Slurm, munge, journal-remote,
# Chromium); elsewhere those tests skip with a reason.
set -eu
cd "$(dirname "$0")/.."
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    bash tests/integration/setup-system.sh
fi
python3 -m venv .venv
.venv/bin/pip install -q --disable-pip-version-check -e '.[test]'
exec .venv/bin/python -m pytest -q "$@"
