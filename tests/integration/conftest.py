"""pytest glue for the Slurm / journal integration harness.

* puts this directory on sys.path so tests can ``import slurm_cluster`` and
  ``import journal`` (there is deliberately no __init__.py here);
* registers the ``slurm`` marker (select with ``-m slurm``, skip with
  ``-m "not slurm"``);
* provides the ``slurm_cluster_factory`` (function scope) and
  ``slurm_cluster_factory_module`` fixtures.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from slurm_cluster import SlurmCluster, slurm_available  # noqa: E402


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "slurm: needs root and a real single-host Slurm cluster "
        "(install with tests/integration/setup-system.sh)",
    )


def require_slurm() -> None:
    """Skip if not root; fail loudly if root but Slurm is not installed."""
    if os.geteuid() != 0:
        pytest.skip("Slurm integration tests need root (slurmd must run as root)")
    if not slurm_available():
        pytest.fail(
            "slurmctld/slurmd/munged/sbatch not installed: run "
            "`bash tests/integration/setup-system.sh` first",
            pytrace=False,
        )


@contextlib.contextmanager
def _cluster_factory():
    require_slurm()
    clusters: list[SlurmCluster] = []

    def make(**kwargs) -> SlurmCluster:
        c = SlurmCluster(**kwargs)
        clusters.append(c)
        c.start()
        return c

    try:
        yield make
    finally:
        for c in clusters:
            try:
                c.stop()
            except Exception as e:  # pragma: no cover - best effort
                print(f"error stopping cluster {c.dir}: {e}")


@pytest.fixture
def slurm_cluster_factory():
    """``make(**SlurmCluster kwargs) -> started SlurmCluster``.

    Every cluster made through it is stopped at teardown, also when the test
    fails (SlurmClusterError messages carry the daemons' log tails).
    """
    with _cluster_factory() as make:
        yield make


@pytest.fixture(scope="module")
def slurm_cluster_factory_module():
    """Like slurm_cluster_factory, but clusters live for the whole module."""
    with _cluster_factory() as make:
        yield make
