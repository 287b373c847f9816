"""The controller worker without Slurm: scheduler answers are recorded text, node snapshots are
real spool files. A worker killed at any point and run again leaves the same single diagnosis."""
import json
import os
import random
import signal
import sqlite3
import time
from pathlib import Path

import pytest

from sattrib.collectors import slurm_env, slurm_job, spool
from sattrib.config import Settings

JOB_TXT = """JobId=8801 JobName=pretrain
   UserId={user}({uid}) GroupId=ml(5000) MCS_label=N/A
   JobState=FAILED Reason=NonZeroExitCode Dependency=(null)
   Requeue=0 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=1:0
   StartTime={start} EndTime={end} Deadline=N/A
   Partition=gpu AllocNode:Sid=login1:1
   NodeList=k[1-2]
   NumNodes=2 NumCPUs=16 NumTasks=2 CPUs/Task=8
   WorkDir={work}
   StdErr={work}/slurm-%j.out
   StdOut={work}/slurm-%j.out
"""
NODES = "".join(f"NodeName=k{i} Arch=x86_64 State=IDLE ThreadsPerCore=1\n" for i in (1, 2, 3))


def _iso(t):
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t))


def _fake_slurm(monkeypatch, now, work):
    """scontrol / sacct answers for job 8801 that ended at `now`, recorded text instead of
    a running slurmctld."""
    job = JOB_TXT.format(user="root", uid=os.getuid(), start=_iso(now - 600), end=_iso(now),
                         work=work)
    monkeypatch.setattr(slurm_job, "scontrol_job", lambda j, d: (job, ""))
    monkeypatch.setattr(slurm_job, "wait_final", lambda j, d, poll=1.0: (job, ""))
    monkeypatch.setattr(slurm_job, "scontrol_nodes", lambda n, d: NODES)
    monkeypatch.setattr(slurm_job, "sacct", lambda j, d: "")
    monkeypatch.setattr(slurm_job, "cluster_name", lambda d: "kc")


@pytest.fixture()
def site(tmp_path, monkeypatch):
    now = time.time()
    work = tmp_path / "work"
    work.mkdir()
    (work / "slurm-8801.out").write_text(
        "0: [rank0]:[E0101 00:00:00.0 ProcessGroupNCCL.cpp:1] [Rank 0] Process group watchdog "
        "thread terminated with exception: CUDA error: uncorrectable ECC error encountered\n")
    _fake_slurm(monkeypatch, now, work)
    st = Settings(cluster="kc", database=str(tmp_path / "d.db"), bundle_dir=str(tmp_path / "b"),
                  spool_dir=str(tmp_path / "spool"), spool_auth="owner", collect_wait_s=1.0)
    msg = ("NVRM: Xid (PCI:0000:3b:00): 48, pid=1, name=python3, An uncorrectable double bit "
           "error (DBE) has been detected on GPU in the framebuffer at [physAddr 0x1 ]partition "
           "1, subpartition 0.")
    for node in ("k1", "k2"):
        rec = {"__CURSOR": f"s={node}", "__REALTIME_TIMESTAMP": str(int((now - 60) * 1e6)),
               "_TRANSPORT": "kernel", "MESSAGE": msg if node == "k2" else "hrtimer: ok"}
        spool.write_snapshot(Path(st.spool_dir), "kc", "8801", 0, node, {
            "format": spool.FORMAT, "job_id": "8801", "restart": 0, "node": node,
            "files": {"journal.jsonl": json.dumps(rec) + "\n"}, "probes": []},
            time.monotonic() + 10, munge=False)
    env = slurm_env.from_env({"SLURM_JOB_ID": "8801", "SLURM_JOB_EXIT_CODE": "256",
                              "SLURM_JOB_EXIT_CODE2": "1:0", "SLURM_JOB_NODELIST": "k[1-2]",
                              "SLURM_CLUSTER_NAME": "kc", "SLURM_JOB_RESTART_COUNT": "0"})
    return st, env


def rows(db):
    c = sqlite3.connect(db)
    return c.execute("select id, diagnosis_json from diagnoses").fetchall()


def test_collect_diagnoses_from_spool_and_output(site):
    from sattrib.collect import collect_job
    st, env = site
    out = collect_job("8801", st, env_job=env)
    assert out.diagnosed
    d = out.diagnosis
    assert (d.root_cause.category.value, d.root_cause.node) == ("gpu_memory_ecc", "k2")
    assert (out.bundle / "k2" / "journal.jsonl").is_file()
    assert (out.bundle / "slurm" / "job.txt").is_file() and (out.bundle / "logs").is_dir()
    assert not Path(st.spool_dir, "kc", "8801.0").exists()     # handed over, spool emptied
    again = collect_job("8801", st, env_job=env)                  # a rerun replays the bundle
    assert again.diagnosis.model_dump_json() == d.model_dump_json()
    assert len(rows(st.database)) == 1


def _collect_in_child(st, env, kill_after):
    pid = os.fork()
    if pid == 0:
        try:
            from sattrib.collect import collect_job
            collect_job("8801", st, env_job=env)
        finally:
            os._exit(0)
    time.sleep(kill_after)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    os.waitpid(pid, 0)


def test_worker_killed_at_any_point_then_rerun_gives_one_same_diagnosis(site, tmp_path):
    from sattrib.collect import collect_job
    st, env = site
    # A reference run on a copy of the spool.
    import shutil
    ref_spool = tmp_path / "ref-spool"
    shutil.copytree(st.spool_dir, ref_spool)
    ref_st = st.model_copy(update={"database": str(tmp_path / "ref.db"),
                                   "bundle_dir": str(tmp_path / "ref-b"),
                                   "spool_dir": str(ref_spool)})
    ref = collect_job("8801", ref_st, env_job=env).diagnosis.model_dump_json()
    rnd = random.Random(7)
    for _ in range(6):
        _collect_in_child(st, env, rnd.uniform(0.05, 1.5))
    final = collect_job("8801", st, env_job=env)
    assert final.diagnosis.model_dump_json() == ref
    got = rows(st.database)
    assert len(got) == 1 and json.loads(got[0][1]) == json.loads(ref)
    assert not list(Path(st.bundle_dir, "kc").glob(".*.tmp"))     # no half-built bundle left


def test_a_node_clock_ahead_is_corrected(tmp_path, monkeypatch):
    """A node whose clock runs 200 s ahead of its peers': its snapshot says so (node time when
    its Epilog started, which all nodes do as the job ends), and its kernel events are put back
    on the others' clock. The delay every Epilog shares (1.5 s here) is left alone."""
    from sattrib.collect import collect_job
    now = round(time.time())
    work = tmp_path / "w"
    work.mkdir()
    _fake_slurm(monkeypatch, now, work)
    st = Settings(cluster="kc", database=str(tmp_path / "d.db"), bundle_dir=str(tmp_path / "b"),
                  spool_dir=str(tmp_path / "spool"), spool_auth="owner", collect_wait_s=1.0)
    true_fault = now - 60
    for node, ahead in (("k1", 0), ("k2", 200), ("k3", 0)):
        msg = ("NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has "
               "fallen off the bus.") if node == "k2" else "hrtimer: ok"
        rec = {"__REALTIME_TIMESTAMP": str(int((true_fault + ahead) * 1e6)),
               "_TRANSPORT": "kernel", "MESSAGE": msg}
        spool.write_snapshot(Path(st.spool_dir), "kc", "8801", 0, node, {
            "format": spool.FORMAT, "job_id": "8801", "restart": 0, "node": node,
            "taken_at": now + 1.5 + ahead,
            "files": {"journal.jsonl": json.dumps(rec) + "\n"}, "probes": []},
            time.monotonic() + 10, munge=False)
    env = slurm_env.from_env({"SLURM_JOB_ID": "8801", "SLURM_JOB_EXIT_CODE": "256",
                              "SLURM_JOB_NODELIST": "k[1-3]", "SLURM_CLUSTER_NAME": "kc"})
    d = collect_job("8801", st, env_job=env).diagnosis
    assert (d.root_cause.category.value, d.root_cause.node) == ("gpu_hardware", "k2")
    assert d.root_cause.first_seen == _iso(true_fault) + "Z"
    assert any("k2: its clock ran +200 s" in n for n in d.completeness.notes)
    assert not any(n.startswith(("k1:", "k3:")) and "clock" in n for n in d.completeness.notes)


def test_collect_by_hand_says_when_slurmctld_cannot_be_reached(tmp_path, monkeypatch):
    from test_fail_closed import _no_slurmctld, _settings

    from sattrib.collect import collect_job
    from sattrib.collectors import slurm_job
    from sattrib.errors import UserError
    _no_slurmctld(monkeypatch)
    monkeypatch.setattr(slurm_job, "cluster_name", lambda d: None)
    with pytest.raises(UserError) as e:
        collect_job("8801", _settings(tmp_path))
    assert str(e.value).startswith("cannot reach slurmctld (slurm_load_jobs error: Unable")
    assert "SLURM_CONF" in e.value.hint
    monkeypatch.setattr(slurm_job, "scontrol_job",
                        lambda j, d: ("", "slurm_load_jobs error: Invalid job id specified"))
    with pytest.raises(UserError) as e:
        collect_job("8801", _settings(tmp_path))
    assert "slurmctld does not know job 8801" in str(e.value)
