"""Acting on diagnoses on a real Slurm cluster (README "Acting on diagnoses").

The installed hooks (test_hooks.py's install, stand-in journals and nvidia-smi) on a cluster of
this module's own with RequeueExit=42 (a job exiting 42 is requeued) and cred_expire=12 (a
requeued job waits ~13 s before it may start again, time enough for the worker). Real jobs fail
with a kernel Xid 79 on one node; the EpilogSlurmctld worker drains, escalates, requeues around
the culprit and posts to a webhook served by the test.

Run (as root, ~3 min)::

    .venv/bin/python -m pytest -q tests/integration/test_slurm_actions.py -m slurm -s
"""
from __future__ import annotations

import json
import os
import shlex
import shutil
import sqlite3
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from helpers import Hook
from test_hooks import (NODES, Install, Nodes, db_rows, install, job_user, nodes,  # noqa: F401
                        sattrib, timeout, wait_diagnosis, wait_files, work, _bounded)

GPU_PCI = "0000:00:1e"
XID79 = (f"NVRM: Xid (PCI:{GPU_PCI}): 79, pid=0, name=<unknown>, GPU has fallen off the bus.")


@pytest.fixture(scope="module")
def hook():
    h = Hook()
    yield h
    h.server.shutdown()


@pytest.fixture(scope="module")
def cluster(slurm_cluster_factory_module, install, nodes, hook):
    c = slurm_cluster_factory_module(
        nodes=NODES, epilog=str(install.epilog), epilog_slurmctld=str(install.epilog_ctld),
        node_env=nodes.env, job_requeue=True, requeue_exit="42", cred_expire=12,
        slurmd_timeout=10)
    install.base_settings = {"munge_socket": str(c.munge_socket),
                             "journal_dir": nodes.journal_pattern,
                             "probe_path": str(nodes.probe_dir), "notify_url": hook.url,
                             "dashboard_url": "https://sattrib.example/",
                             "drain_max_partition_percent": 100.0}
    install.configure(drain="on")
    return c


def failing_job(cluster, nodes, work, on: list, culprit: str, while_running=None,
                record: str = XID79, gpu_lost: bool = True) -> int:
    """A job on `on` whose ranks exit 1, with a kernel `record` (an Xid 79) on `culprit` while it
    runs, and its nvidia-smi no longer reaching the GPU (`gpu_lost`); `while_running()`, if
    given, is called while the ranks run."""
    w = shlex.quote(str(work))
    jid = cluster.sbatch(
        f"#!/bin/sh\nsrun -l sh -c 'touch {w}/started.$SLURM_JOB_ID.$SLURMD_NODENAME; "
        f"while [ ! -e {w}/go.$SLURM_JOB_ID ]; do sleep 0.1; done; "
        "echo \"rank $SLURM_PROCID: CUDA error: unspecified launch failure\" >&2; exit 1'\n",
        nodes=len(on), nodelist=",".join(on), ntasks_per_node=1, no_requeue=True)
    wait_files(work, f"started.{jid}.*", len(on))
    nodes.write_journals({culprit: [(time.time(), record)]})
    if gpu_lost:
        nodes.lose_gpu(culprit)
    if while_running:
        while_running()
    (work / f"go.{jid}").touch()
    return jid


def actions(install: Install, jid) -> list[dict]:
    con = sqlite3.connect(f"file:{install.database}?mode=ro", uri=True, timeout=10)
    try:
        cur = con.execute("SELECT a.kind, a.decision, a.node, a.detail FROM actions a JOIN "
                          "diagnoses d ON d.id = a.diagnosis_id WHERE d.job_id = ? "
                          "ORDER BY d.restart, a.seq", [str(jid)])
        return [dict(zip(("kind", "decision", "node", "detail"), r)) for r in cur]
    finally:
        con.close()


def wait_actions(cluster, install, jid, kind: str, timeout_s: float = 60) -> dict:
    wait_diagnosis(cluster, install, jid)
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        got = [a for a in actions(install, jid) if a["kind"] == kind]
        if got:
            return got[0]
        time.sleep(0.3)
    raise AssertionError(f"no {kind} decision for job {jid}: {actions(install, jid)}\n"
                         + install.logs_tail())


def sinfo_reasons(cluster) -> dict:
    r = cluster.run(["sinfo", "-R", "-h", "-N", "-o", "%N|%E"])
    return dict(ln.split("|", 1) for ln in r.stdout.splitlines() if "|" in ln)


def drains_in_last_hour(install) -> int:
    con = sqlite3.connect(f"file:{install.database}?mode=ro", uri=True, timeout=10)
    try:
        return con.execute("SELECT count(*) FROM actions WHERE kind = 'drain' AND "
                           "decision IN ('taken', 'dry-run') AND created_at >= "
                           "strftime('%Y-%m-%dT%H:%M:%SZ', 'now', '-1 hour')").fetchone()[0]
    finally:
        con.close()


@pytest.mark.slurm
@timeout(240)
def test_repeat_offender_escalates_on_the_third_failure(cluster, install, nodes, work):
    install.configure(drain="dry-run")             # node04 stays in service for each run
    jobs, diags = [], []
    for _ in range(3):
        jid = failing_job(cluster, nodes, work, ["node04"], "node04")
        wait_actions(cluster, install, jid, "drain")
        jobs.append(jid)
    shown = json.loads(sattrib(cluster, install, str(jobs[2]), "--json").stdout)
    first = json.loads(sattrib(cluster, install, str(jobs[1]), "--json").stdout)
    assert first["escalation"] is None
    esc = shown["escalation"]
    assert shown["root_cause"]["action_code"] == "reboot_node"       # the diagnosis unchanged
    assert esc["failures"] == 3 and (esc["from"], esc["to"]) == ("reboot_node", "drain_node")
    assert [j["job_id"] for j in esc["earlier_jobs"]] == [str(j) for j in jobs[:2]]
    text = sattrib(cluster, install, str(jobs[2]), check=True).stdout
    assert "Repeat offender" in text and f"earlier: {jobs[0]}, {jobs[1]}" in text
    assert "DRAIN" not in cluster.node_state("node04")


@pytest.mark.slurm
@timeout(180)
def test_trusted_xid79_drains_exactly_the_culprit_and_posts_the_webhook(cluster, install,
                                                                       nodes, work, hook):
    install.configure(drain="on")
    jid = failing_job(cluster, nodes, work, ["node01", "node02"], "node02")
    a = wait_actions(cluster, install, jid, "drain")
    assert (a["decision"], a["node"]) == ("taken", "node02"), a
    reasons = sinfo_reasons(cluster)
    assert reasons.get("node02", "").startswith(f"sattrib:{jid} gpu_hardware"), reasons
    # node01 only showed the symptom (its rank failed): it is not drained
    assert "node01" not in reasons and "DRAIN" not in cluster.node_state("node01")
    assert [x["node"] for x in actions(install, jid) if x["kind"] == "drain"] == ["node02"]
    body = hook.wait(jid)
    assert body["culprit"]["node"] == "node02" and body["category"] == "gpu_hardware"
    assert body["dashboard_url"] == f"https://sattrib.example/diagnosis/sattribtest/{jid}/0"
    assert f"job {jid}" in body["text"] and "drain node02: taken" in body["text"]
    r = sattrib(cluster, install, "resume", "node02")
    assert "node02: resumed" in r.stdout
    cluster.wait_nodes(["node02"], {"idle"}, timeout=30)


@pytest.mark.slurm
@timeout(180)
def test_a_segfault_naming_an_xid_drains_nothing(cluster, install, nodes, work):
    """The kernel's report of a user program's segfault names the file it ran from, here one
    named like the driver's Xid 79 line: it is the job's own event, never the GPU's."""
    install.configure(drain="on")
    segv = (f"kernel[29915]: segfault at 0 ip 00007ff6e9824000 sp 00007ffd5e2a1b80 error 4 in "
            f"{XID79}[0,7ff6e9824000+1000] likely on CPU 1 (core 1, socket 0)")
    jid = failing_job(cluster, nodes, work, ["node02"], "node02", record=segv, gpu_lost=False)
    diag, _ = wait_diagnosis(cluster, install, jid)
    root = diag["root_cause"] or {}
    assert root.get("category") != "gpu_hardware", json.dumps(diag, indent=1)[:3000]
    assert not any(e["rule"] == "gpu.xid" for e in diag["evidence"]), diag["evidence"]
    acted = Path(db_rows(install, jid)[0]["bundle"]) / "actions.json"    # the worker's last word
    end = time.monotonic() + 30
    while not acted.is_file() and time.monotonic() < end:
        time.sleep(0.2)
    assert json.loads(acted.read_text())["actions"] == []
    assert "DRAIN" not in cluster.node_state("node02")


@pytest.mark.slurm
@timeout(180)
def test_a_lost_gpu_that_nvidia_smi_still_answers_for_is_held(cluster, install, nodes, work):
    """An Xid 79 in node02's kernel log while node02's nvidia-smi, taken by the Epilog after the
    job, answers for that very GPU: a second source says otherwise, the drain is held."""
    install.configure(drain="on")
    jid = failing_job(cluster, nodes, work, ["node02"], "node02", gpu_lost=False)
    a = wait_actions(cluster, install, jid, "drain")
    assert (a["decision"], a["node"]) == ("held", "node02"), a
    assert a["detail"].startswith("nvidia-smi on node02 answers for GPU 0000:00:1e.0"), a
    assert "DRAIN" not in cluster.node_state("node02")


@pytest.mark.slurm
@timeout(180)
def test_a_node_drained_by_someone_else_keeps_its_reason(cluster, install, nodes, work):
    install.configure(drain="on")
    # the admin drains node03 while the job runs on it: DRAINING, then DRAINED
    jid = failing_job(cluster, nodes, work, ["node03"], "node03", while_running=lambda:
                      cluster.set_node_state("node03", "DRAIN", "fan replacement ticket 42"))
    a = wait_actions(cluster, install, jid, "drain")
    assert a["decision"] == "refused" and "set by someone else" in a["detail"], a
    assert sinfo_reasons(cluster)["node03"] == "fan replacement ticket 42"
    r = sattrib(cluster, install, "resume", "node03", check=False)
    assert r.returncode == 1 and "not drained by sattrib" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    assert sinfo_reasons(cluster)["node03"] == "fan replacement ticket 42"
    cluster.resume_node("node03")
    cluster.wait_nodes(["node03"], {"idle"}, timeout=30)


@pytest.mark.slurm
@timeout(240)
def test_rate_limit_stops_the_third_drain_in_a_burst(cluster, install, nodes, work):
    install.configure(drain="on", drain_max_per_hour=drains_in_last_hour(install) + 2)
    w = shlex.quote(str(work))
    burst = ["node01", "node03", "node04"]
    jobs = []
    for n in burst:
        jobs.append(cluster.sbatch(
            f"#!/bin/sh\nsrun sh -c 'touch {w}/started.$SLURM_JOB_ID.$SLURMD_NODENAME; "
            f"while [ ! -e {w}/go.burst ]; do sleep 0.1; done; exit 1'\n",
            nodes=1, nodelist=n, no_requeue=True))
    for jid in jobs:
        wait_files(work, f"started.{jid}.*", 1)
    nodes.write_journals({n: [(time.time(), XID79)] for n in burst})
    for n in burst:
        nodes.lose_gpu(n)
    (work / "go.burst").touch()
    got = [wait_actions(cluster, install, jid, "drain") for jid in jobs]
    decisions = sorted(a["decision"] for a in got)
    assert decisions == ["taken", "taken", "would-drain"], got
    held = [a for a in got if a["decision"] == "would-drain"][0]
    assert "rate limit" in held["detail"]
    reasons = sinfo_reasons(cluster)
    assert held["node"] not in reasons
    for a in got:
        if a["decision"] == "taken":
            assert reasons[a["node"]].startswith("sattrib:")
            sattrib(cluster, install, "resume", a["node"])
    cluster.wait_nodes(burst, {"idle"}, timeout=30)


@pytest.mark.slurm
@timeout(240)
def test_requeued_job_restarts_without_the_culprit(cluster, install, nodes, work):
    # drain off: the restart must avoid node01 because of its ExcNodeList, not a drain
    install.configure(drain="off", requeue_exclude_partitions=["debug"])
    nodes.write_journals({"node01": [(time.time(), XID79)]})
    w = shlex.quote(str(work))
    jid = cluster.sbatch(
        f"#!/bin/sh\necho \"run on $SLURMD_NODENAME\" >> {w}/runs.$SLURM_JOB_ID\n"
        "if [ \"$SLURMD_NODENAME\" = node01 ]; then\n"
        "  echo 'CUDA error: unspecified launch failure' >&2; exit 42\nfi\nexit 0\n",
        nodes=1, nodelist=None, requeue=True)
    a = wait_actions(cluster, install, jid, "requeue")
    assert (a["decision"], a["node"]) == ("taken", "node01"), a
    info = cluster.wait_job(jid, {"COMPLETED"}, timeout=90)
    runs = (work / f"runs.{jid}").read_text().split("\n")
    assert runs[0] == "run on node01" and len([r for r in runs if r]) == 2, runs
    assert info["NodeList"] != "node01" and info["Restarts"] == "1", info
    assert "node01" in info["ExcNodeList"], info
    assert "DRAIN" not in cluster.node_state("node01")


def _fails_on_node01(cluster, nodes, work) -> int:
    """A job that fails on node01 (where the kernel logged an Xid 79 and nvidia-smi lost the
    GPU) and succeeds elsewhere."""
    nodes.write_journals({"node01": [(time.time(), XID79)]})
    nodes.lose_gpu("node01")
    w = shlex.quote(str(work))
    return cluster.sbatch(
        f"#!/bin/sh\necho \"run on $SLURMD_NODENAME\" >> {w}/runs.$SLURM_JOB_ID\n"
        "if [ \"$SLURMD_NODENAME\" = node01 ]; then\n"
        "  echo 'CUDA error: unspecified launch failure' >&2; exit 1\nfi\nexit 0\n",
        nodes=1, nodelist=None, requeue=True)


@pytest.mark.slurm
@timeout(240)
def test_a_failed_job_is_requeued_without_the_culprit_when_its_partition_opts_in(
        cluster, install, nodes, work):
    install.configure(drain="off", requeue_partitions=["debug"], requeue_max_restarts=1)
    jid = _fails_on_node01(cluster, nodes, work)
    a = wait_actions(cluster, install, jid, "requeue")
    assert (a["decision"], a["node"]) == ("taken", "node01"), a
    info = cluster.wait_job(jid, {"COMPLETED"}, timeout=90)
    runs = [r for r in (work / f"runs.{jid}").read_text().split("\n") if r]
    assert runs[0] == "run on node01" and len(runs) == 2, runs
    assert info["NodeList"] != "node01" and info["Restarts"] == "1", info
    assert "node01" in info["ExcNodeList"], info
    r = sattrib(cluster, install, "verdict", str(jid), "--restart", "0", check=False)
    assert r.returncode == 10, r.stdout + r.stderr
    assert "sattrib requeued the job without node01" in " ".join(r.stdout.split())


@pytest.mark.slurm
@timeout(240)
def test_a_job_is_requeued_at_most_requeue_max_restarts_times(cluster, install, nodes, work):
    install.configure(drain="off", requeue_partitions=["debug"], requeue_max_restarts=0)
    jid = _fails_on_node01(cluster, nodes, work)
    a = wait_actions(cluster, install, jid, "requeue")
    assert (a["decision"], a["node"]) == ("refused", "node01"), a
    assert "requeue_max_restarts = 0" in a["detail"]
    info = cluster.wait_job(jid, {"FAILED"}, timeout=60)
    assert info["Restarts"] == "0", info


# -- what the job's user writes into its own record -------------------------------------------------

def user_sbatch(cluster, job_user, *argv: str, cwd) -> int:
    """sbatch as the unprivileged test user (what anyone with a login can do)."""
    r = subprocess.run(["runuser", "-u", job_user.pw_name, "--", "sbatch", "--parsable",
                        "--no-requeue", *argv], env=cluster.env, capture_output=True,
                       text=True, timeout=60, cwd=str(cwd))
    assert r.returncode == 0, r.stderr
    return int(r.stdout.strip().split(";")[0])


def user_dir(job_user) -> Path:
    """A folder of the job's user's own (the cwd of their jobs)."""
    d = Path(tempfile.mkdtemp(prefix="sattrib-hooktest-user-"))
    d.chmod(0o755)
    os.chown(d, job_user.pw_uid, job_user.pw_gid)
    return d


def resume_ours(cluster, install):
    """A node a failing test let sattrib drain goes back to service for the tests after it."""
    for node, why in sinfo_reasons(cluster).items():
        if why.startswith("sattrib:"):
            sattrib(cluster, install, "resume", node, check=False)


@pytest.mark.slurm
@timeout(240)
def test_a_comment_name_or_path_that_reads_like_slurm_drains_nothing(cluster, install, nodes,
                                                                     work, job_user):
    """The fields a user writes (comment, job name, output path) are not the scheduler's
    words: imitating slurmctld's node-failure lines there blames and drains no node."""
    install.configure(drain="on")
    nodes.write_journals()
    udir = user_dir(job_user)
    try:
        jobs = {
            user_sbatch(cluster, job_user, "-N2", "-w", "node01,node02",
                        "--comment=srun: error: Node failure on node02", "--wrap=exit 1",
                        cwd=udir): "node02",
            user_sbatch(cluster, job_user, "-N2", "-w", "node03,node04",
                        "-J", "Nodes node04 not responding, setting DOWN",
                        f"--output={udir}/Nodes node04 not responding, setting DOWN-%j.out",
                        "--wrap=exit 1", cwd=udir): "node04",
        }
        for jid, named in jobs.items():
            diag, _ = wait_diagnosis(cluster, install, jid)
            root = diag["root_cause"] or {}
            assert root.get("category") != "scheduler_node_failure", json.dumps(diag)[:3000]
            assert all(e["rule"] not in ("slurm.node_failure", "slurm.node_not_responding")
                       for e in diag["evidence"]), diag["evidence"]
            drains = [a for a in actions(install, jid) if a["kind"] == "drain"]
            assert all(a["decision"] not in ("taken", "dry-run", "would-drain")
                       for a in drains), drains
            assert named not in sinfo_reasons(cluster), sinfo_reasons(cluster)
    finally:
        resume_ours(cluster, install)
        shutil.rmtree(udir, ignore_errors=True)


@pytest.mark.slurm
@timeout(240)
def test_a_job_name_cannot_rewrite_whose_job_it_is(cluster, install, nodes, work, job_user):
    """`-J 'x UserId=root(0) StdOut=/root/...'`: the worker (root here) copies the job's own
    output only, never the root-only file the name points at; the bundle's ACL and the mail
    go to the job's real user, and a name that makes the user `-Eshell` is no option."""
    mails = work / f"mail-{uuid.uuid4().hex[:8]}"
    mails.mkdir()
    recorder = mails / "mail.sh"
    recorder.write_text(f"#!/bin/sh\ncat >/dev/null\nprintf '%s\\n' \"$@\" > "
                        f"{shlex.quote(str(mails))}/$$.args\n")
    recorder.chmod(0o755)
    install.configure(drain="on", mail_prog=str(recorder))
    nodes.write_journals()
    marker = f"SATTRIB-SECRET-{uuid.uuid4().hex}"
    secret = Path(tempfile.mkdtemp(prefix="sattrib-hooktest-secret-")) / "secret-note.txt"
    secret.parent.chmod(0o755)                  # anyone may enter; the file is root's, 0600
    secret.write_text(f"RuntimeError: {marker}\n")
    secret.chmod(0o600)
    udir = user_dir(job_user)
    try:
        names = [f"x UserId=root(0) StdOut={secret}", "x UserId=-Eshell(2001)"]
        jobs = [user_sbatch(cluster, job_user, "-N1", "-J", name,
                            "--wrap=echo 'ValueError: bad shard' >&2; exit 1", cwd=udir)
                for name in names]
        for jid, name in zip(jobs, names):
            diag, _ = wait_diagnosis(cluster, install, jid)
            assert diag["job"]["user"] == job_user.pw_name, diag["job"]
            assert diag["job"]["name"] == name, diag["job"]
            bundle = Path(db_rows(install, jid)[0]["bundle"])
            acl = subprocess.run(["getfacl", "-n", "-p", str(bundle)], capture_output=True,
                                 text=True, timeout=30).stdout
            assert f"user:{job_user.pw_uid}:r-x" in acl, acl
            run = json.loads((bundle / "slurm" / "sattrib-run.json").read_text())
            assert [o["source"] for o in run["outputs"]] == [f"{udir}/slurm-{jid}.out"], run
            mail = [p.read_text().split("\n") for p in mails.glob("*.args")
                    if f"job {jid} " in p.read_text()]
            assert mail and mail[0][:1] == ["-s"] and mail[0][2] == job_user.pw_name, mail
        hits = [str(p) for top in (install.prefix / "var",) for p in top.rglob("*")
                if p.is_file() and not p.is_symlink() and marker.encode() in p.read_bytes()]
        assert not hits, f"the root-only file was read into {hits}"
    finally:
        install.configure(drain="on")
        resume_ours(cluster, install)
        shutil.rmtree(udir, ignore_errors=True)
        shutil.rmtree(secret.parent, ignore_errors=True)
