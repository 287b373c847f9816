"""The node Epilog's own bookkeeping: the job's start from slurmd's spool when Slurm does not
pass it (22.05), and one snapshot per job run however often Slurm runs the Epilog."""
from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from sattrib.collectors import slurm_env, spool

DATA = Path(__file__).parent / "data" / "slurmd"


def _cred_state() -> bytes:
    text = (DATA / "cred_state.22.05.hex").read_text()
    return bytes.fromhex("".join(ln for ln in text.splitlines() if not ln.startswith("#")))


def test_start_of_each_job_in_a_recorded_cred_state():
    data = _cred_state()
    # StartTime of jobs 1..3 as scontrol showed them: 03:02:01, :05 and :09 UTC.
    assert [slurm_env.cred_state_start(data, j) for j in ("1", "2", "3")] == [
        1796439721.0, 1796439725.0, 1796439729.0]
    assert slurm_env.cred_state_start(data, "4") is None
    assert slurm_env.cred_state_start(data[:40], "3") is None      # cut: not read past the end
    assert slurm_env.cred_state_start(b"", "3") is None


def test_spool_start_follows_slurm_conf_to_the_nodes_spool(tmp_path):
    spool_dir = tmp_path / "spool" / "node07"
    spool_dir.mkdir(parents=True)
    (spool_dir / "cred_state").write_bytes(_cred_state())
    conf = tmp_path / "slurm.conf"
    conf.write_text(f"ClusterName=c\nslurmdspooldir = {tmp_path}/spool/%n\n")
    env = {"SLURM_CONF": str(conf), "SLURMD_NODENAME": "node07"}
    if os.geteuid() == 0:
        assert slurm_env.spool_start(env, "2") == 1796439725.0
    else:                            # only root's own cred_state is believed
        assert slurm_env.spool_start(env, "2") is None
    assert slurm_env.spool_start(dict(env, SLURMD_NODENAME="node08"), "2") is None


def test_a_job_run_is_claimed_once(tmp_path):
    root = tmp_path / "spool"
    results: list = []
    threads = [threading.Thread(target=lambda: results.append(
        spool.claim_run(root, "kc", "8801", 0, "k1"))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [False] * 7 + [True]
    assert spool.claim_run(root, "kc", "8801", 1, "k1")          # the next run of the job
    assert spool.claim_run(root, "kc", "8801", 0, "k2")          # another node
    assert not spool.claim_run(root, "kc", "8801", 0, "k1")


def test_a_claim_walks_no_symlinked_level(tmp_path):
    root = tmp_path / "spool"
    (root / "kc").mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.symlink(elsewhere, root / "kc" / spool.MARKS)
    with pytest.raises(spool.SpoolError, match="symbolic link"):
        spool.claim_run(root, "kc", "8801", 0, "k1")
    assert not any(elsewhere.iterdir())
