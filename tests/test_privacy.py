"""Private output stays private: evidence bundles are never world-readable, whatever the umask;
the job's user reads their own bundle through a POSIX ACL, but not the nodes' kernel logs in it,
another user reads nothing; a user
who cannot open the database still gets `sattrib JOBID` for their own job from its bundle.

Runs as root with real `setfacl` and real unprivileged processes (setpriv)."""
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from sattrib.collectors import slurm_env, slurm_job, spool
from sattrib.config import Settings

SETPRIV = shutil.which("setpriv")
pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not SETPRIV,
                                reason="needs root and setpriv (util-linux)")

JOB_USER, OTHER_USER = 65534, 4242           # nobody, and a uid with no account at all
JOB_TXT = """JobId=8801 JobName=pretrain
   UserId=nobody({uid}) GroupId=nogroup({uid}) MCS_label=N/A
   JobState=FAILED Reason=NonZeroExitCode Dependency=(null)
   Requeue=0 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=1:0
   StartTime={start} EndTime={end} Deadline=N/A
   Partition=gpu AllocNode:Sid=login1:1
   NodeList=k[1-2]
   NumNodes=2 NumCPUs=16 NumTasks=2 CPUs/Task=8
   Command={work}/secret-train.sh --token hunter2
   WorkDir={work}
   StdErr={work}/slurm-%j.out
   StdOut={work}/slurm-%j.out
"""
XID48 = ("NVRM: Xid (PCI:0000:3b:00): 48, pid=1, name=python3, An uncorrectable double bit "
         "error (DBE) has been detected on GPU in the framebuffer at [physAddr 0x1 ]partition "
         "1, subpartition 0.")


def _iso(t):
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t))


def as_user(uid, *argv, env=None):
    return subprocess.run([SETPRIV, f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
                           *map(str, argv)], capture_output=True, text=True, timeout=120,
                          env=env, cwd="/")


@pytest.fixture()
def site(monkeypatch):
    """A controller layout in a directory other users can traverse (pytest's tmp_path is
    root-only), a job of user nobody with a 0600 output file, and two node snapshots."""
    base = Path(tempfile.mkdtemp(prefix="sattrib-priv-", dir="/tmp"))
    os.chmod(base, 0o711)
    work = base / "work"
    work.mkdir(mode=0o700)
    out = work / "slurm-8801.out"
    out.write_text("0: [rank0]: secret-dataset-path /home/nobody/private loaded\n"
                   "0: CUDA error: uncorrectable ECC error encountered\n")
    os.chmod(out, 0o600)
    os.chown(out, JOB_USER, JOB_USER)
    os.chown(work, JOB_USER, JOB_USER)
    now = time.time()
    job = JOB_TXT.format(uid=JOB_USER, start=_iso(now - 600), end=_iso(now), work=work)
    monkeypatch.setattr(slurm_job, "scontrol_job", lambda j, d: (job, ""))
    monkeypatch.setattr(slurm_job, "wait_final", lambda j, d, poll=1.0: (job, ""))
    monkeypatch.setattr(slurm_job, "scontrol_nodes", lambda n, d: "")
    monkeypatch.setattr(slurm_job, "sacct", lambda j, d: "")
    var = base / "var"
    st = Settings(cluster="kc", database=str(var / "diagnoses.db"),
                  bundle_dir=str(var / "bundles"), spool_dir=str(base / "spool"),
                  spool_auth="owner", collect_wait_s=1.0)
    for node in ("k1", "k2"):
        rec = {"__CURSOR": f"s={node}", "__REALTIME_TIMESTAMP": str(int((now - 60) * 1e6)),
               "_TRANSPORT": "kernel", "MESSAGE": XID48 if node == "k2" else "hrtimer: ok"}
        spool.write_snapshot(Path(st.spool_dir), "kc", "8801", 0, node, {
            "format": spool.FORMAT, "job_id": "8801", "restart": 0, "node": node,
            "files": {"journal.jsonl": json.dumps(rec) + "\n"}, "probes": []},
            time.monotonic() + 10, munge=False)
    env = slurm_env.from_env({"SLURM_JOB_ID": "8801", "SLURM_JOB_EXIT_CODE": "256",
                              "SLURM_JOB_EXIT_CODE2": "1:0", "SLURM_JOB_NODELIST": "k[1-2]",
                              "SLURM_CLUSTER_NAME": "kc", "SLURM_JOB_RESTART_COUNT": "0",
                              "SLURM_JOB_UID": str(JOB_USER)})
    config = base / "sattrib.toml"
    config.write_text(f'database = "{st.database}"\nbundle_dir = "{st.bundle_dir}"\n'
                      'cluster = "kc"\n')
    os.chmod(config, 0o644)
    old = os.umask(0o022)                     # what the ctld wrapper used to set
    try:
        yield st, env, base, config
    finally:
        os.umask(old)
        shutil.rmtree(base, ignore_errors=True)


def _collect(st, env):
    from sattrib.collect import collect_job
    out = collect_job("8801", st, env_job=env)
    assert out.diagnosed
    return out


def test_bundle_is_private_whatever_the_umask(site):
    st, env, base, _ = site
    out = _collect(st, env)
    bundle = out.bundle
    seen = 0
    for d, dirs, files in os.walk(bundle):
        assert stat.S_IMODE(os.stat(d).st_mode) == 0o750, d
        for f in files:
            mode = stat.S_IMODE(os.stat(os.path.join(d, f)).st_mode)
            assert mode == 0o640, (f, oct(mode))
            seen += 1
    assert seen >= 6                          # job.txt, run record, journals, output, diagnosis
    assert (bundle / "logs").is_dir() and any((bundle / "logs").iterdir())
    for parent in (Path(st.bundle_dir), bundle.parent):
        assert stat.S_IMODE(os.stat(parent).st_mode) == 0o751, parent
    assert stat.S_IMODE(os.stat(bundle.parent / ".locks").st_mode) == 0o750
    assert stat.S_IMODE(os.stat(st.database).st_mode) & 0o007 == 0       # the database too


def test_job_user_reads_own_bundle_and_nobody_else_does(site):
    st, env, base, _ = site
    bundle = _collect(st, env).bundle
    output = next((bundle / "logs").iterdir())
    for path in (output, bundle / "slurm" / "job.txt", bundle / "diagnosis.json"):
        r = as_user(JOB_USER, "/bin/cat", path)
        assert r.returncode == 0, (path, r.stderr)
        r = as_user(OTHER_USER, "/bin/cat", path)
        assert r.returncode != 0 and "Permission denied" in r.stderr, (path, r.stdout)
    # The nodes' kernel logs are the admins': other users' tasks and files are named there.
    for node in ("k1", "k2"):
        r = as_user(JOB_USER, "/bin/cat", bundle / node / "journal.jsonl")
        assert r.returncode != 0 and "Permission denied" in r.stderr, (node, r.stdout)
    assert "Xid" in json.dumps(json.loads((bundle / "diagnosis.json").read_text())["evidence"])
    assert "secret-dataset-path" in as_user(JOB_USER, "/bin/cat", output).stdout
    # The job's user reaches a path they know but cannot list other users' jobs.
    r = as_user(JOB_USER, "/bin/ls", bundle.parent)
    assert r.returncode != 0 and "Permission denied" in r.stderr
    assert as_user(JOB_USER, "/bin/ls", bundle / "logs").returncode == 0


def test_without_setfacl_the_bundle_stays_private_and_says_so(site, monkeypatch):
    st, env, base, _ = site
    empty = base / "no-tools"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    bundle = _collect(st, env).bundle
    notes = (bundle / "slurm" / "collect-notes.txt").read_text()
    assert f"the job's user (uid {JOB_USER}) cannot read this bundle" in notes
    assert "setfacl is not installed" in notes
    r = as_user(JOB_USER, "/bin/cat", bundle / "diagnosis.json")
    assert r.returncode != 0 and "Permission denied" in r.stderr
    assert stat.S_IMODE(os.stat(bundle / "diagnosis.json").st_mode) == 0o640


def _sattrib(uid, config, *args):
    env = {"PATH": "/usr/bin:/bin", "SATTRIB_CONFIG": str(config), "HOME": "/nonexistent"}
    return as_user(uid, sys.executable, "-m", "sattrib", *args, env=env)


def test_show_for_a_user_who_cannot_open_the_database(site):
    st, env, base, config = site
    _collect(st, env)
    assert as_user(JOB_USER, "/bin/cat", st.database).returncode != 0
    r = _sattrib(JOB_USER, config, "8801")
    assert r.returncode == 0, r.stderr
    assert "Job 8801" in r.stdout and "gpu_memory_ecc on k2" in r.stdout
    r = _sattrib(JOB_USER, config, "8801", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["root_cause"]["node"] == "k2"
    # Another user: one line and a hint saying who can read it, no traceback.
    r = _sattrib(OTHER_USER, config, "8801")
    assert r.returncode == 1 and "Traceback" not in r.stderr and not r.stdout
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith("sattrib: error: no diagnosis of job 8801 "
                                                   "that you may read"), r.stderr
    assert "readable by root and group root only" in lines[0] and lines[1].startswith("hint:")
