"""SlurmUser cannot steer root's writes: the spool writer (root, on every node) and the hook logs
never follow a symbolic link planted in a directory SlurmUser's group can write, and the spool
writer refuses a level owned by anyone but root or `spool_writer_uid`.

"SlurmUser" here is a throwaway uid given to files with os.chown (the tests that need that
run as root); the "root-only" targets are 0700 directories and 0600 files.
"""
from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sattrib.collectors import spool
from sattrib.slurm_hooks import launch

OTHER_UID = 54321                     # a uid no account has: stands in for SlurmUser
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="gives files to another uid (root only)")


def _snap(node="n1", job="77", restart=0):
    return {"format": spool.FORMAT, "job_id": job, "restart": restart, "node": node,
            "files": {"journal.jsonl": ""}, "probes": []}


def _write(sp: Path, **kw):
    return spool.write_snapshot(sp, "c", "77", 0, "n1", _snap(), time.monotonic() + 10,
                                munge=False, **kw)


@pytest.fixture
def root_only(tmp_path) -> Path:
    d = tmp_path / "root-only"
    d.mkdir(mode=0o700)
    return d


@pytest.fixture
def sp(tmp_path) -> Path:
    d = tmp_path / "spool"
    d.mkdir()
    d.chmod(0o2770)
    return d


# ---- the writer ---------------------------------------------------------------------------

def test_writer_does_not_follow_a_symlinked_job_directory(sp, root_only):
    (sp / "c").mkdir()
    os.symlink(root_only, sp / "c" / "77.0")
    with pytest.raises(spool.SpoolError, match=r"77\.0 is a symbolic link \(not followed\)"):
        _write(sp)
    assert list(root_only.iterdir()) == []


def test_writer_does_not_follow_a_symlinked_cluster_directory(sp, root_only):
    os.symlink(root_only, sp / "c")
    with pytest.raises(spool.SpoolError, match=r"/c is a symbolic link"):
        _write(sp)
    assert list(root_only.iterdir()) == []


def test_writer_does_not_follow_a_symlinked_spool(tmp_path, root_only):
    os.symlink(root_only, tmp_path / "spool")
    with pytest.raises(spool.SpoolError, match="is a symbolic link"):
        _write(tmp_path / "spool")
    assert list(root_only.iterdir()) == []


@as_root
def test_writer_refuses_a_cluster_directory_someone_else_owns(sp):
    (sp / "c").mkdir()
    os.chown(sp / "c", OTHER_UID, -1)
    with pytest.raises(spool.SpoolError, match=rf"owned by uid {OTHER_UID}, not by root"):
        _write(sp)
    assert list((sp / "c").iterdir()) == []


@as_root
def test_writer_refuses_a_job_directory_someone_else_owns(sp):
    (sp / "c" / "77.0").mkdir(parents=True)
    os.chown(sp / "c" / "77.0", OTHER_UID, -1)
    with pytest.raises(spool.SpoolError, match=rf"owned by uid {OTHER_UID}"):
        _write(sp)
    assert list((sp / "c" / "77.0").iterdir()) == []


@as_root
def test_writer_accepts_the_spool_writer_uid(sp):
    """A root-squashed NFS spool: the levels belong to the squash uid (spool_writer_uid)."""
    (sp / "c").mkdir()
    os.chown(sp / "c", OTHER_UID, -1)
    p = _write(sp, writer_uid=OTHER_UID)
    assert p == sp / "c" / "77.0" / "n1.snap.gz" and p.is_file()


def test_writer_refuses_a_directory_every_user_can_write(sp):
    (sp / "c").mkdir()
    (sp / "c").chmod(0o777)
    with pytest.raises(spool.SpoolError, match="writable by every user"):
        _write(sp)


def test_writer_makes_missing_levels_group_writable_and_replaces_a_planted_final_name(sp,
                                                                                      root_only):
    secret = root_only / "secret"
    secret.write_text("root only\n")
    (sp / "c" / "77.0").mkdir(parents=True)
    os.symlink(secret, sp / "c" / "77.0" / "n1.snap.gz")          # a link at the final name
    p = _write(sp)
    assert not p.is_symlink() and p.is_file()
    assert secret.read_text() == "root only\n"
    d = sp / "c" / "77.1"
    spool.write_snapshot(sp, "c", "77", 1, "n1", _snap(restart=1), time.monotonic() + 10,
                         munge=False)
    assert d.stat().st_mode & 0o7777 == 0o2770
    assert [f.name for f in d.iterdir()] == ["n1.snap.gz"]       # no temporary file left


def test_epilog_logs_one_line_and_goes_on(sp, root_only, tmp_path, caplog):
    from sattrib.slurm_hooks import epilog
    caplog.set_level(logging.INFO)
    os.symlink(root_only, sp / "c")
    cfg = tmp_path / "s.toml"
    cfg.write_text(f'spool_dir = "{sp}"\nspool_auth = "owner"\ncluster = "c"\n'
                   'epilog_budget_s = 5.0\nprobe_timeout_s = 1.0\n')
    env = {"SLURM_JOB_ID": "77", "SLURM_JOB_EXIT_CODE": "256", "SLURMD_NODENAME": "n1",
           "SLURM_JOB_RESTART_COUNT": "0", "SATTRIB_CONFIG": str(cfg)}
    assert epilog.main(env) == 0
    assert list(root_only.iterdir()) == []
    line = [r for r in caplog.records if "snapshot not written" in r.getMessage()]
    assert line and line[0].exc_info is None, caplog.text           # one line, no traceback
    assert f"{sp}/c is a symbolic link (not followed)" in line[0].getMessage()


# ---- the reader (the controller worker, SlurmUser) --------------------------------------------

def test_reader_does_not_follow_a_symlinked_job_directory(sp, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    p = spool.write_snapshot(elsewhere, "c", "77", 0, "n1", _snap(), time.monotonic() + 10,
                             munge=False)
    (sp / "c").mkdir()
    os.symlink(p.parent, sp / "c" / "77.0")
    notes: list = []
    got = spool.read_snapshots(sp / "c" / "77.0", "77", 0, {0, os.geteuid()}, False,
                               time.monotonic() + 10, notes)
    assert got == {}
    assert notes == [f"spool {sp}/c/77.0 is a symbolic link (not followed)"]
    spool.remove_job(sp / "c" / "77.0")
    assert p.is_file()                                    # nothing deleted through the link
    assert spool.read_snapshots(p.parent, "77", 0, {0, os.geteuid()}, False,
                                time.monotonic() + 10, [])      # the real one still reads


def test_remove_job_deletes_the_real_directory(sp):
    p = _write(sp)
    spool.remove_job(p.parent)
    assert not p.parent.exists() and (sp / "c").is_dir()


# ---- the logs ---------------------------------------------------------------------------------

def test_open_log_does_not_follow_a_symlink_a_hard_link_or_a_fifo(tmp_path, root_only):
    secret = root_only / "secret"
    secret.write_text("root only\n")
    secret.chmod(0o600)
    logs = tmp_path / "logs"
    logs.mkdir()
    os.symlink(secret, logs / "link.log")
    os.link(secret, logs / "hard.log")
    os.mkfifo(logs / "fifo.log")
    for name in ("link.log", "hard.log", "fifo.log", "missing-dir/x.log"):
        fd = launch.open_log(str(logs / name))              # returns at once, even for a FIFO
        try:
            assert os.path.samefile(f"/proc/self/fd/{fd}", os.devnull), name
            os.write(fd, b"appended\n")
        finally:
            os.close(fd)
    assert secret.read_text() == "root only\n"
    fd = launch.open_log(str(logs / "new.log"))
    os.write(fd, b"one\n")
    os.close(fd)
    assert (logs / "new.log").read_text() == "one\n"


def _launch(log: Path, module: str, env=None):
    return subprocess.run([sys.executable, "-I", "-m", "sattrib.slurm_hooks.launch", str(log),
                           module], capture_output=True, text=True, timeout=60, env=env)


def test_launcher_puts_the_hooks_output_on_the_log(tmp_path, root_only):
    log = tmp_path / "epilog.log"
    r = _launch(log, "sattrib.slurm_hooks.no_such_module")
    assert r.returncode == 1 and r.stdout == r.stderr == ""
    assert "cannot import the hook module: No module named " \
           "'sattrib.slurm_hooks.no_such_module'" in log.read_text()
    secret = root_only / "secret"
    secret.write_text("root only\n")
    log.unlink()
    log.symlink_to(secret)
    r = _launch(log, "sattrib.slurm_hooks.no_such_module")
    assert r.returncode == 1 and r.stdout == r.stderr == ""
    assert secret.read_text() == "root only\n"


def test_detached_worker_does_not_follow_a_symlinked_worker_log(tmp_path, root_only):
    """The EpilogSlurmctld worker opens worker.log itself (as SlurmUser on the controller)."""
    secret = root_only / "secret"
    secret.write_text("root only\n")
    done = tmp_path / "done"
    for log in (tmp_path / "worker.log", tmp_path / "link.log"):
        if log.name == "link.log":
            log.symlink_to(secret)
        code = ("import os, sys\n"
                "from sattrib.slurm_hooks.epilog_slurmctld import _detach\n"
                f"if _detach({str(log)!r}):\n"
                "    print('worker line', flush=True)\n"
                f"    open({str(done)!r}, 'w').close()\n"
                "    os._exit(0)\n")
        subprocess.run([sys.executable, "-I", "-c", code], check=True, timeout=30)
        t_end = time.monotonic() + 20
        while not done.exists() and time.monotonic() < t_end:
            time.sleep(0.05)
        assert done.exists(), "the detached worker did not run"
        done.unlink()
    assert (tmp_path / "worker.log").read_text() == "worker line\n"
    assert secret.read_text() == "root only\n"
