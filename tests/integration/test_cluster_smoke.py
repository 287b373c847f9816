"""Smoke tests for the single-host Slurm harness and the journal helper.

Run:  bash tests/integration/setup-system.sh && python -m pytest tests/integration -m slurm
(as root).  Measured on the 2-core dev VM: the whole file takes ~36 s, most
of it the NODE_FAIL test (slurmctld needs SlurmdTimeout=10 s + one ping
interval to notice a dead slurmd: 15-18 s) and the requeued job restarting.

Environment observed in the scripts (Slurm 22.05.8, Debian 12), captured by
test_epilog_env_*; "ctld" = EpilogSlurmctld, "node" = Epilog on each node:

  both : SLURM_CLUSTER_NAME SLURM_JOBID SLURM_JOB_ID SLURM_JOB_COMMENT
         SLURM_JOB_CPUS_PER_NODE SLURM_JOB_DERIVED_EC SLURM_JOB_EXIT_CODE
         SLURM_JOB_EXIT_CODE2 SLURM_JOB_GID SLURM_JOB_NUM_NODES
         SLURM_JOB_PARTITION SLURM_JOB_RESTART_COUNT SLURM_JOB_STDIN
         SLURM_JOB_STDOUT (unexpanded, e.g. ".../slurm-%j.out")
         SLURM_JOB_UID SLURM_JOB_USER SLURM_JOB_WORK_DIR SLURM_SCRIPT_CONTEXT PWD
  node : SLURMD_NODENAME SLURM_CONF SLURM_NODELIST SLURM_UID
         SLURM_SCRIPT_CONTEXT=epilog_slurmd   (NO SLURM_JOB_NODELIST, NO job name)
  ctld : SLURM_JOB_NODELIST SLURM_JOB_NAME SLURM_JOB_ACCOUNT SLURM_JOB_GROUP
         SLURM_SCRIPT_CONTEXT=epilog_slurmctld (NO SLURM_CONF, NO SLURMD_NODENAME,
         NO SLURM_NODELIST)
  neither: PATH (unset! /bin/sh falls back to its built-in default path,
         Python's subprocess to os.defpath "/bin:/usr/bin"), HOME, any variable
         of slurmd's/slurmctld's own environment, any SLURM_JOB_STATE.
  SLURM_JOB_EXIT_CODE is the raw wait() status (exit 3 -> "768"),
  SLURM_JOB_EXIT_CODE2 is "<exit>:<signal>" ("3:0"), SLURM_JOB_DERIVED_EC is
  the highest step exit code.  Comment/job-name only if set (SLURM_JOB_COMMENT
  absent when the job has no comment).
"""

from __future__ import annotations

import shlex
import time
from pathlib import Path

import pytest

from journal import (
    JournalEntry,
    journal_remote_binary,
    journalctl_json,
    new_boot_id,
    write_journal,
)
from slurm_cluster import SlurmCluster, parse_scontrol_oneliner

# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------

DUMP_SCRIPT = r"""#!/bin/sh
# test helper: record the environment this {kind} runs with
out={out}
kind={kind}
f="$out/$kind.${{SLURM_JOB_ID:-nojob}}.${{SLURMD_NODENAME:-ctld}}.$$"
env | sort > "$f.env.tmp"
{extra}
mv "$f.env.tmp" "$f.env"
exit 0
"""

CTLD_EXTRA = r"""
# does scontrol still know the job while EpilogSlurmctld runs?
/usr/bin/scontrol show job -d -o "$SLURM_JOB_ID" > "$f.scontrol" 2>&1
"""

NODE_EXTRA = r"""
# per-node stand-in binary reachable only via the per-node PATH prefix
command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi > "$f.nvsmi" 2>&1
"""


def make_dump_scripts(d: Path) -> dict[str, str]:
    out = d / "out"
    out.mkdir(parents=True, exist_ok=True)
    out.chmod(0o777)
    scripts = {}
    for kind, extra in (
        ("epilog", NODE_EXTRA),
        ("prolog", NODE_EXTRA),
        ("epilog_slurmctld", CTLD_EXTRA),
    ):
        p = d / f"{kind}.sh"
        p.write_text(DUMP_SCRIPT.format(out=shlex.quote(str(out)), kind=kind, extra=extra))
        p.chmod(0o755)
        scripts[kind] = str(p)
    return scripts


def read_env(p: Path) -> dict[str, str]:
    env = {}
    for line in p.read_text().splitlines():
        if "=" in line:
            k, _, v = line.partition("=")
            env[k] = v
    return env


def wait_files(d: Path, pattern: str, count: int, timeout: float = 30) -> list[Path]:
    deadline = time.monotonic() + timeout
    while True:
        files = sorted(d.glob(pattern))
        if len(files) >= count:
            return files
        if time.monotonic() > deadline:
            raise AssertionError(
                f"expected {count} files {pattern} in {d}, got {[f.name for f in files]}"
            )
        time.sleep(0.2)


def fake_nvidia_smi(bindir: Path, text: str) -> str:
    bindir.mkdir(parents=True, exist_ok=True)
    p = bindir / "nvidia-smi"
    p.write_text(f"#!/bin/sh\necho {shlex.quote(text)}\n")
    p.chmod(0o755)
    return str(bindir)


# ---------------------------------------------------------------------------
# module cluster: epilog + EpilogSlurmctld + prolog, per-node env/PATH
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def scripts_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("slurm-scripts")
    d.chmod(0o755)
    return d


@pytest.fixture(scope="module")
def cluster(slurm_cluster_factory_module, scripts_dir) -> SlurmCluster:
    s = make_dump_scripts(scripts_dir)
    node_path_prefix = {
        f"node0{i}": fake_nvidia_smi(scripts_dir / f"bin{i}", f"fake-gpu-node0{i}") for i in (1, 2)
    }
    c = slurm_cluster_factory_module(
        epilog=s["epilog"],
        prolog=s["prolog"],
        epilog_slurmctld=s["epilog_slurmctld"],
        node_env={
            "node01": {"SATTRIB_JOURNAL_DIR": "/journals/node01"},
            "node02": {"SATTRIB_JOURNAL_DIR": "/journals/node02"},
        },
        node_path_prefix=node_path_prefix,
    )
    print(f"cluster started in {c.start_seconds:.2f}s ({c.dir})")
    return c


def _out(scripts_dir: Path) -> Path:
    return scripts_dir / "out"


@pytest.mark.slurm
def test_four_node_job_completes(cluster):
    t0 = time.monotonic()
    jid = cluster.sbatch("srun hostname\nsrun printenv SLURMD_NODENAME\n", nodes=4)
    info = cluster.wait_job(jid, {"COMPLETED"}, timeout=60)
    assert info["NodeList"] == "node[01-04]"
    assert info["ExitCode"] == "0:0"
    names = set(cluster.job_output(jid).split())
    assert {"node01", "node02", "node03", "node04"} <= names
    print(f"4-node job done in {time.monotonic() - t0:.2f}s")


@pytest.mark.slurm
def test_epilog_env_and_epilog_slurmctld(cluster, scripts_dir):
    out = _out(scripts_dir)
    jid = cluster.sbatch("srun true\nexit 3\n", nodes=2, comment="smoke test", job_name="envjob")
    info = cluster.wait_job(jid, {"FAILED"}, timeout=60)
    assert info["ExitCode"] == "3:0"
    nodes = ["node01", "node02"]
    assert info["NodeList"] == "node[01-02]"

    epi = wait_files(out, f"epilog.{jid}.node0*.env", 2)
    ctld = wait_files(out, f"epilog_slurmctld.{jid}.ctld.*.env", 1)
    pro = wait_files(out, f"prolog.{jid}.node0*.env", 2)

    for f in epi:
        env = read_env(f)
        node = env["SLURMD_NODENAME"]
        assert node in nodes
        print(f"Epilog env on {node}: {sorted(env)}")
        assert env["SLURM_JOB_ID"] == str(jid)
        assert env["SLURM_JOB_EXIT_CODE"] == str(3 << 8)  # raw wait() status
        assert env["SLURM_JOB_EXIT_CODE2"] == "3:0"
        assert env["SLURM_JOB_DERIVED_EC"] == "0"
        assert env["SLURM_NODELIST"] == "node[01-02]"
        assert "SLURM_JOB_NODELIST" not in env
        assert env["SLURM_SCRIPT_CONTEXT"] == "epilog_slurmd"
        assert env["SLURM_CONF"] == str(cluster.conf_path)
        assert env["SLURM_JOB_COMMENT"] == "smoke test"
        # per-node environment arrives through the harness wrapper
        assert env["SATTRIB_JOURNAL_DIR"] == f"/journals/{node}"
        assert env["PATH"].startswith(str(scripts_dir / f"bin{node[-1]}"))
        nv = f.with_name(f.name[: -len(".env")] + ".nvsmi")
        assert nv.read_text().strip() == f"fake-gpu-{node}"

    for f in pro:
        env = read_env(f)
        assert env["SLURM_SCRIPT_CONTEXT"] == "prolog_slurmd"
        assert "SLURM_JOB_EXIT_CODE" not in env

    env = read_env(ctld[0])
    print(f"EpilogSlurmctld env: {sorted(env)}")
    assert env["SLURM_SCRIPT_CONTEXT"] == "epilog_slurmctld"
    assert env["SLURM_JOB_ID"] == str(jid)
    assert env["SLURM_JOB_NODELIST"] == "node[01-02]"
    assert env["SLURM_JOB_EXIT_CODE"] == "768"
    assert env["SLURM_JOB_EXIT_CODE2"] == "3:0"
    assert env["SLURM_JOB_NAME"] == "envjob"
    assert "SLURMD_NODENAME" not in env and "SLURM_NODELIST" not in env
    assert not any(k.startswith("SLURM_JOB_STATE") for k in env)
    # scontrol works inside EpilogSlurmctld; the job is still COMPLETING there
    sc = parse_scontrol_oneliner(ctld[0].with_name(ctld[0].name[: -len(".env")] + ".scontrol").read_text())
    assert sc["JobId"] == str(jid)
    assert sc["JobState"] == "COMPLETING"
    assert sc["ExitCode"] == "3:0"
    # ... and after the job ended (MinJobAge=300 default keeps the record)
    time.sleep(1)
    after = cluster.job(jid, detail=True)
    assert after["JobState"] == "FAILED" and after["Reason"] == "NonZeroExitCode"


@pytest.mark.slurm
def test_exit_1_is_failed(cluster):
    jid = cluster.sbatch("exit 1\n", nodes=1)
    info = cluster.wait_job(jid, {"FAILED"}, timeout=60)
    assert info["ExitCode"] == "1:0"


@pytest.mark.slurm
def test_scancel_is_cancelled(cluster):
    jid = cluster.sbatch("srun sleep 300\n", nodes=2)
    cluster.wait_job(jid, {"RUNNING"}, timeout=60)
    cluster.scancel(jid)
    info = cluster.wait_job(jid, {"CANCELLED"}, timeout=60)
    assert info["JobState"] == "CANCELLED"
    # all nodes free again
    cluster.wait_nodes(cluster.nodes, {"idle"}, timeout=60)


@pytest.mark.slurm
def test_raw_epilog_env_has_no_slurmd_env(slurm_cluster_factory, tmp_path):
    """Without the harness wrappers slurmd's own environment (PATH, custom
    vars) does NOT reach the Epilog."""
    tmp_path.chmod(0o755)
    s = make_dump_scripts(tmp_path)
    c = slurm_cluster_factory(
        nodes=2,
        epilog=s["epilog"],
        epilog_slurmctld=s["epilog_slurmctld"],
        node_env={"node01": {"SATTRIB_JOURNAL_DIR": "/journals/node01"}},
        ctld_env={"CTLD_MARKER": "1"},
        wrap_scripts=False,
    )
    jid = c.sbatch("true\n", nodes=1, nodelist="node01")
    c.wait_job(jid, {"COMPLETED"}, timeout=60)
    env = read_env(wait_files(tmp_path / "out", f"epilog.{jid}.node01.*.env", 1)[0])
    assert "SATTRIB_JOURNAL_DIR" not in env
    assert "PATH" not in env
    assert env["SLURMD_NODENAME"] == "node01"
    cenv = read_env(wait_files(tmp_path / "out", f"epilog_slurmctld.{jid}.ctld.*.env", 1)[0])
    assert "CTLD_MARKER" not in cenv and "PATH" not in cenv and "SLURM_CONF" not in cenv


# ---------------------------------------------------------------------------
# node failure
# ---------------------------------------------------------------------------


@pytest.mark.slurm
def test_node_fail_and_requeue(slurm_cluster_factory, tmp_path):
    """Kill one slurmd while two 4-node jobs run on it.

    * job A (--no-requeue, also the harness default JobRequeue=0) ends in
      NODE_FAIL within SlurmdTimeout + ping interval (measured 15-18 s with
      SlurmdTimeout=10);
    * job B (--requeue) is requeued instead: it never shows NODE_FAIL in
      scontrol, goes back to PENDING (Reason=BeginTime, Restarts=1) and runs
      again once the node is back (after AuthInfo cred_expire, default 120 s,
      5 s here).
    """
    tmp_path.chmod(0o755)
    s = make_dump_scripts(tmp_path)
    out = tmp_path / "out"
    c = slurm_cluster_factory(
        epilog=s["epilog"],
        epilog_slurmctld=s["epilog_slurmctld"],
        cred_expire=5,
        jobcomp_file=True,
    )
    started = tmp_path / "started"
    started.mkdir()
    # RUNNING only means the batch script started; the srun step may still be
    # launching.  Killing a slurmd during step launch makes srun fail and the
    # job end FAILED (exit 233/141) instead of NODE_FAIL, so wait until every
    # task really runs.
    step = f"srun sh -c 'touch {started}/$SLURM_JOB_ID.$SLURMD_NODENAME; exec sleep 300'\n"
    a = c.sbatch(step, nodes=4, no_requeue=True)
    b = c.sbatch(step, nodes=4, requeue=True)
    wait_files(started, f"{a}.node0*", 4)
    wait_files(started, f"{b}.node0*", 4)

    t0 = time.monotonic()
    c.stop_slurmd("node03")  # SIGKILL: slurmstepd + job processes keep running
    info = c.wait_job(a, {"NODE_FAIL"}, timeout=60)
    t_fail = time.monotonic() - t0
    print(f"NODE_FAIL after {t_fail:.1f}s")
    assert info["Reason"] == "NodeDown"
    assert c.node_state("node03").startswith("DOWN")

    binfo = c.wait_job(b, {"PENDING"}, timeout=30)
    assert binfo["Restarts"] == "1"
    assert binfo["Reason"] in ("BeginTime", "Resources", "ReqNodeNotAvail,_UnavailableNodes:node03")

    # EpilogSlurmctld of A: env says nothing about the failure (exit code 0,
    # no state var); scontrol inside it shows Reason=NodeDown and the failed
    # node already removed from NodeList.  (assertions below)
    af = wait_files(out, f"epilog_slurmctld.{a}.ctld.*.env", 1)[0]
    aenv = read_env(af)
    assert aenv["SLURM_JOB_EXIT_CODE"] == "0"
    assert aenv["SLURM_JOB_NODELIST"] == "node[01-04]"
    asc = parse_scontrol_oneliner(af.with_name(af.name[: -len(".env")] + ".scontrol").read_text())
    assert asc["Reason"] == "NodeDown"
    # NodeList there = nodes still completing: the dead node is dropped at
    # once, the others as their Epilog finishes (racy, so only check node03)
    assert "node03" not in c.hostnames(asc["NodeList"])
    assert c.hostnames(aenv["SLURM_JOB_NODELIST"]) == c.nodes
    # EpilogSlurmctld of B's failed run: RESTART_COUNT in env is the old one,
    # scontrol already shows Restarts=1.
    bf = wait_files(out, f"epilog_slurmctld.{b}.ctld.*.env", 1)[0]
    assert read_env(bf)["SLURM_JOB_RESTART_COUNT"] == "0"
    bsc = parse_scontrol_oneliner(bf.with_name(bf.name[: -len(".env")] + ".scontrol").read_text())
    assert bsc["Restarts"] == "1"

    # bring the node back: ReturnToService=2 makes it usable again at once
    c.start_slurmd("node03")
    c.wait_nodes(["node03"], {"idle", "mixed", "allocated"}, timeout=60)
    # the Epilog for the orphaned jobs runs on node03 when its slurmd restarts
    wait_files(out, f"epilog.{a}.node03.*.env", 1)
    binfo = c.wait_job(b, {"RUNNING"}, timeout=90)
    assert binfo["Restarts"] == "1"
    print(f"requeued job running again {time.monotonic() - t0:.1f}s after the kill")
    c.scancel(b)
    c.wait_job(b, {"CANCELLED"}, timeout=60)
    # jobcomp/filetxt logs every run: the requeued run of B as NODE_FAIL too
    deadline = time.monotonic() + 10
    while True:
        recs = [(r["JobId"], r["JobState"]) for r in c.jobcomp_records()]
        if (str(b), "CANCELLED") in recs or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert (str(a), "NODE_FAIL") in recs
    assert (str(b), "NODE_FAIL") in recs
    assert (str(b), "CANCELLED") in recs


# ---------------------------------------------------------------------------
# journal helper
# ---------------------------------------------------------------------------


def test_journal_round_trip(tmp_path):
    if journal_remote_binary() is None:
        pytest.fail("systemd-journal-remote missing: run tests/integration/setup-system.sh", pytrace=False)
    boot1, boot2 = new_boot_id(), new_boot_id()
    t = 1_700_000_000_000_000
    entries = [
        JournalEntry("NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.", t,
                     boot_id=boot1, hostname="node01"),
        JournalEntry("session opened", t + 1_000_000, transport="syslog", identifier="sshd",
                     boot_id=boot1, hostname="node01", priority=6),
        JournalEntry("mce: [Hardware Error]: CPU 0: Machine Check\nsecond line", t + 2_000_000,
                     boot_id=boot1, hostname="node01", priority=2),
        JournalEntry("after reboot", t + 100_000_000, boot_id=boot2, hostname="node01"),
    ]
    jdir = tmp_path / "journal"
    f = write_journal(jdir / "node01.journal", entries)
    assert f.exists()

    allk = journalctl_json("--file", str(f), "_TRANSPORT=kernel")
    assert [e["MESSAGE"] for e in allk] == [entries[0].message, entries[2].message, "after reboot"]
    for e, src in zip(allk, [entries[0], entries[2], entries[3]]):
        assert e["__REALTIME_TIMESTAMP"] == str(src.realtime_usec)
        assert e["_TRANSPORT"] == "kernel"
        assert e["_BOOT_ID"] == src.boot_id
        assert e["_HOSTNAME"] == "node01"
        assert e["__CURSOR"].startswith("s=") and f"b={src.boot_id}" in e["__CURSOR"]
    assert allk[0]["PRIORITY"] == "3" and allk[1]["PRIORITY"] == "2"

    # -k == _TRANSPORT=kernel + "-b" == the *last boot in the file(s)*
    k = journalctl_json("--file", str(f), "-k")
    assert [e["MESSAGE"] for e in k] == ["after reboot"]
    kall = journalctl_json("--file", str(f), "-k", "-b", "all")
    assert len(kall) == 3
    k1 = journalctl_json("--file", str(f), "-k", "-b", boot1)
    assert [e["_BOOT_ID"] for e in k1] == [boot1, boot1]

    # --since/--until with @epoch seconds, on the whole directory
    win = journalctl_json("--directory", str(jdir), "-k", "-b", boot1,
                          f"--since=@{(t + 500_000) / 1e6}", f"--until=@{(t + 3_000_000) / 1e6}")
    assert [e["__REALTIME_TIMESTAMP"] for e in win] == [str(t + 2_000_000)]
    d = journalctl_json("--directory", str(jdir), "-k")
    assert [e["MESSAGE"] for e in d] == ["after reboot"]

    # cursor round trip
    nxt = journalctl_json("--file", str(f), "_TRANSPORT=kernel", f"--after-cursor={allk[0]['__CURSOR']}")
    assert [e["MESSAGE"] for e in nxt] == [entries[2].message, "after reboot"]

    # syslog entry kept its transport and identifier
    sl = journalctl_json("--file", str(f), "_TRANSPORT=syslog")
    assert len(sl) == 1 and sl[0]["SYSLOG_IDENTIFIER"] == "sshd" and sl[0]["PRIORITY"] == "6"
