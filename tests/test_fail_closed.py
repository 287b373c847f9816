"""Never lose a diagnosis, and fail closed: what the worker cannot fetch or read is noted as
missing, never a lost row; what cannot be verified is refused, never trusted."""
import gzip
import json
import os
import sqlite3
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from sattrib.collectors import slurm_env, slurm_job, spool
from sattrib.config import Settings, load

from hungfs import HungMount

RANK_ERR = ("Traceback (most recent call last):\n  File \"train.py\", line 3, in <module>\n"
            "ValueError: learning rate must be positive\n")


def _no_slurmctld(monkeypatch):
    """scontrol as it answers when slurm.conf is not where it looks (SLURM_CONF not passed)."""
    err = "slurm_load_jobs error: Unable to contact slurm controller (connect failure)"
    monkeypatch.setattr(slurm_job, "scontrol_job", lambda j, d: ("", err))
    monkeypatch.setattr(slurm_job, "wait_final", lambda j, d, poll=1.0: ("", err))
    monkeypatch.setattr(slurm_job, "pyslurm_job", lambda j: None)
    monkeypatch.setattr(slurm_job, "scontrol_nodes", lambda n, d: "")
    monkeypatch.setattr(slurm_job, "sacct", lambda j, d: "")


def _ctld_env(work, **extra):
    """EpilogSlurmctld's environment as slurmctld 22.05 sets it (job_common_env_vars)."""
    env = {"SLURM_JOB_ID": "8801", "SLURM_JOBID": "8801", "SLURM_JOB_EXIT_CODE": "256",
           "SLURM_JOB_EXIT_CODE2": "1:0", "SLURM_JOB_DERIVED_EC": "1",
           "SLURM_JOB_NODELIST": "k[1-2]", "SLURM_CLUSTER_NAME": "kc",
           "SLURM_JOB_RESTART_COUNT": "0", "SLURM_JOB_NAME": "pretrain",
           "SLURM_JOB_PARTITION": "gpu", "SLURM_JOB_USER": "alice",
           "SLURM_JOB_UID": str(os.getuid()), "SLURM_JOB_STDOUT": "out.%j",
           "SLURM_JOB_WORK_DIR": str(work)}
    env.update(extra)
    return env


def _settings(tmp_path, **kw):
    return Settings(cluster="kc", database=str(tmp_path / "d.db"),
                    bundle_dir=str(tmp_path / "b"), spool_dir=str(tmp_path / "spool"),
                    spool_auth="owner", collect_wait_s=0.5, **kw)


def _rows(db):
    con = sqlite3.connect(db)
    try:
        return con.execute("select job_id, cluster, restart, diagnosis_json from diagnoses"
                           ).fetchall()
    finally:
        con.close()


@pytest.fixture()
def work(tmp_path):
    w = tmp_path / "work"
    w.mkdir()
    (w / "out.8801").write_text(RANK_ERR)
    return w


# ---- 1. scontrol cannot reach slurmctld -----------------------------------------------------

def test_diagnosis_without_scontrol_is_filed_under_the_job_from_the_environment(
        tmp_path, monkeypatch, work):
    from sattrib.collect import collect_job
    from sattrib.store import open_store
    _no_slurmctld(monkeypatch)
    st = _settings(tmp_path)
    out = collect_job("8801", st, env_job=slurm_env.from_env(_ctld_env(work)))
    assert out.diagnosed
    assert [(r[0], r[1], r[2]) for r in _rows(st.database)] == [("8801", "kc", 0)]
    assert open_store(st.database).find("8801")          # what `sattrib 8801` finds
    got = out.diagnosis
    assert got.job_id == "8801"
    assert (got.job.name, got.job.user, got.job.partition) == ("pretrain", "alice", "gpu")
    # out.%j expanded with the job id from the environment: the job's output was read
    assert (out.bundle / "logs" / "output-000.txt").read_text() == RANK_ERR
    assert got.root_cause is not None and got.root_cause.category.value == "application_error"
    assert "scheduler:job" in got.completeness.missing
    assert any("scontrol show job 8801 failed" in n and "Unable to contact" in n
               for n in got.completeness.notes), got.completeness.notes


# ---- 2. a typo in sattrib.toml --------------------------------------------------------------

def test_lenient_load_keeps_valid_keys_and_names_the_bad_ones(tmp_path):
    cfg = tmp_path / "sattrib.toml"
    cfg.write_text('databse = "/x.db"\ncluster = "c1"\nserve_port = 70000\n'
                   'timezone = "Mars/Olympus"\n')
    got = load(path=cfg, env={}, lenient=True)
    assert got.settings.cluster == "c1" and got.sources["cluster"] == str(cfg)
    assert got.settings.serve_port == 8001 and got.settings.timezone == "UTC"
    assert any("unknown key 'databse'" in p and "defaults used" in p for p in got.problems)
    assert any(p.startswith("invalid setting serve_port") for p in got.problems)
    assert any(p.startswith("invalid setting timezone") for p in got.problems)
    cfg.write_text("cluster = \n")
    broken = load(path=cfg, env={}, lenient=True)
    assert broken.settings == Settings() and "whole file ignored" in broken.problems[0]
    with pytest.raises(Exception, match="unknown timezone"):     # the CLI stays strict
        load(path=tmp_path / "tz.toml", env={"SATTRIB_TIMEZONE": "Mars/Olympus"})


def test_worker_with_a_config_typo_still_stores_the_diagnosis_and_says_so(
        tmp_path, monkeypatch, work):
    from sattrib.worker import diagnose
    _no_slurmctld(monkeypatch)
    cfg = tmp_path / "sattrib.toml"
    cfg.write_text(f'databse = "/nowhere.db"\ndatabase = "{tmp_path / "d.db"}"\n'
                   f'bundle_dir = "{tmp_path / "b"}"\nspool_dir = "{tmp_path / "spool"}"\n'
                   'spool_auth = "owner"\ncollect_wait_s = 0.5\n')
    diagnose(_ctld_env(work, SATTRIB_CONFIG=str(cfg)))
    rows = _rows(tmp_path / "d.db")
    assert [r[0] for r in rows] == ["8801"]
    notes = json.loads(rows[0][3])["completeness"]["notes"]
    assert any("unknown key 'databse'" in n and n.startswith("config:") for n in notes), notes


def test_node_epilog_with_a_config_typo_still_takes_its_snapshot(tmp_path, monkeypatch):
    from sattrib.slurm_hooks import epilog
    cfg = tmp_path / "sattrib.toml"
    cfg.write_text(f'spool_dir = "{tmp_path / "spool"}"\nspool_auth = "owner"\n'
                   'probe_timeout_s = 2.0\nprobe_timeout = 9\n')
    monkeypatch.setenv("PATH", str(tmp_path / "nobin"))
    env = {"SLURM_JOB_ID": "8801", "SLURM_JOB_EXIT_CODE2": "1:0", "SLURMD_NODENAME": "k1",
           "SLURM_CLUSTER_NAME": "kc", "SATTRIB_CONFIG": str(cfg)}
    epilog.snapshot(env, time.monotonic() + 10)
    snap = json.loads(gzip.decompress((tmp_path / "spool" / "kc" / "8801.0" /
                                       "k1.snap.gz").read_bytes()))
    assert any("unknown key 'probe_timeout'" in n for n in snap["notes"]), snap["notes"]


# ---- 3. the hooks take no setting from the environment -----------------------------------------

def test_hooks_take_no_settings_from_the_environment(tmp_path, monkeypatch):
    """Not even journal_dir: it chooses which journal root reads and hands on to the job's
    bundle, so it comes from the root-owned config file only."""
    from sattrib.config import load_for_hook
    from sattrib.slurm_hooks import epilog
    cfg = tmp_path / "sattrib.toml"
    cfg.write_text(f'spool_dir = "{tmp_path / "spool"}"\nspool_auth = "owner"\n'
                   'probe_timeout_s = 2.0\n')
    evil = tmp_path / "evil"
    evil.mkdir()
    marker = tmp_path / "ran-as-root"
    (evil / "nvidia-smi").write_text(f"#!/bin/sh\ntouch {marker}\n")
    (evil / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("SATTRIB_CONFIG", str(cfg))
    monkeypatch.setenv("SATTRIB_PROBE_PATH", str(evil))
    monkeypatch.setenv("SATTRIB_SPOOL_DIR", str(tmp_path / "elsewhere"))
    monkeypatch.setenv("SATTRIB_JOURNAL_DIR", str(tmp_path / "journals"))
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.setenv("SLURM_JOB_ID", "8802")
    monkeypatch.setenv("SLURM_JOB_EXIT_CODE2", "1:0")
    monkeypatch.setenv("SLURMD_NODENAME", "k1")
    monkeypatch.setenv("SLURM_CLUSTER_NAME", "kc")
    st = load_for_hook(os.environ).settings
    assert (st.probe_path, st.spool_dir) == ("", str(tmp_path / "spool"))
    assert st.journal_dir == ""
    epilog.snapshot(os.environ, time.monotonic() + 10)
    assert not marker.exists()
    assert (tmp_path / "spool" / "kc" / "8802.0" / "k1.snap.gz").is_file()
    assert load(env=os.environ).settings.probe_path == str(evil)    # the CLI reads them all


# ---- 4. user fields in extra_output_globs ----------------------------------------------------

def test_job_name_is_literal_in_output_globs(tmp_path):
    for name in ("a.log", "b.log", "secret.log", "[ab].log"):
        (tmp_path / name).write_text("x\n")
    info = {"JobId": "1", "WorkDir": str(tmp_path), "User": "alice"}
    assert slurm_job.output_paths(dict(info, JobName="*"), ["%x.log"]) == []
    assert slurm_job.output_paths(dict(info, JobName="[ab]"), ["%x.log"]) == [
        str(tmp_path / "[ab].log")]
    assert slurm_job.output_paths(dict(info, JobName="a"), ["%x.log"]) == [
        str(tmp_path / "a.log")]
    notes = []
    outside = tmp_path / "w"
    outside.mkdir()
    got = slurm_job.output_paths(dict(info, WorkDir=str(outside), JobName="../secret"),
                                 ["%x.log", "rank-%j.txt"], notes)
    assert got == [] and "'../secret'" in notes[0]
    (tmp_path / "d[1]").mkdir()
    (tmp_path / "d[1]" / "r0.log").write_text("x\n")
    assert slurm_job.output_paths(dict(info, WorkDir=str(tmp_path / "d[1]")), ["r*.log"]) == [
        str(tmp_path / "d[1]" / "r0.log")]


# ---- 5. the worker's deadline: a job output on a hung mount ---------------------------------

@pytest.fixture()
def hung(tmp_path):
    try:
        m = HungMount(tmp_path / "hung")
    except OSError as e:
        pytest.skip(f"cannot mount a FUSE filesystem here ({e}); needs root and /dev/fuse")
    yield m
    m.close()


def test_output_on_a_hung_mount_is_abandoned_at_the_deadline(tmp_path, work, hung):
    pairs = [(str(work / "out.8801"), tmp_path / "c0"), (str(hung.path / "out.8801"),
                                                         tmp_path / "c1")]
    notes = []
    t0 = time.monotonic()
    copied = slurm_job.copy_outputs(pairs, os.getuid(), 1 << 20, notes, t0 + 2)
    assert time.monotonic() - t0 < 4
    assert copied == 1 and (tmp_path / "c0").read_text() == RANK_ERR
    assert not (tmp_path / "c1").exists()
    assert notes == [f"{hung.path}/out.8801: job output not read: timed out after 2 s"]


def test_worker_stores_the_diagnosis_when_stdout_is_on_a_hung_mount(
        tmp_path, monkeypatch, work, hung):
    from sattrib.collect import collect_job
    _no_slurmctld(monkeypatch)
    st = _settings(tmp_path, worker_deadline_s=3.0)
    env = slurm_env.from_env(_ctld_env(work, SLURM_JOB_STDOUT=str(hung.path / "out.%j"),
                                       SLURM_JOB_STDERR=str(work / "out.%j")))
    done = {}
    t = threading.Thread(target=lambda: done.update(out=collect_job("8801", st, env_job=env)),
                         daemon=True)
    t0 = time.monotonic()
    t.start()
    t.join(20)
    assert "out" in done, "the worker was still held by the hung mount after 20 s"
    assert time.monotonic() - t0 < 10
    notes = done["out"].diagnosis.completeness.notes
    assert any("job output not read: timed out after" in n and str(hung.path) in n
               for n in notes), notes
    assert [r[0] for r in _rows(st.database)] == ["8801"]


# ---- 6. bundles are pruned after keep_bundles_days ------------------------------------------

def test_worker_prunes_old_bundles_at_most_hourly_and_keeps_rows(tmp_path, monkeypatch, work):
    from sattrib.collect import collect_job, prune_bundles
    _no_slurmctld(monkeypatch)
    st = _settings(tmp_path, keep_bundles_days=7)
    env = slurm_env.from_env(_ctld_env(work))
    collect_job("8801", st, env_job=env)
    old = Path(st.bundle_dir) / "kc" / "8801.0"
    month_ago = time.time() - 30 * 86400
    os.utime(old, (month_ago, month_ago))
    young = Path(st.bundle_dir) / "kc" / "8700.0"
    young.mkdir()
    stamp = Path(st.bundle_dir) / ".pruned"                   # the first run pruned just now
    os.utime(stamp, (time.time() - 7200, time.time() - 7200))
    collect_job("8802", st, env_job=slurm_env.from_env(_ctld_env(work, SLURM_JOB_ID="8802")))
    assert not old.exists() and young.is_dir()
    assert (Path(st.bundle_dir) / "kc" / "8802.0" / "diagnosis.json").is_file()
    assert sorted(r[0] for r in _rows(st.database)) == ["8801", "8802"]      # rows kept
    os.utime(young, (month_ago, month_ago))
    assert prune_bundles(Path(st.bundle_dir), 7) == 0          # pruned less than an hour ago
    assert prune_bundles(Path(st.bundle_dir), 7, now=time.time() + 3700) == 1
    assert not young.exists()
    assert prune_bundles(Path(st.bundle_dir), 0, now=time.time() + 9e6) == 0


# ---- 7. the database on a network filesystem ------------------------------------------------

MOUNTINFO = """\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
40 22 0:45 / /shared rw,relatime shared:20 - nfs4 fs1:/export rw,vers=4.2
41 40 8:2 / /shared/local\\040disk rw,relatime - xfs /dev/sdb1 rw
"""


def test_network_database_warning(tmp_path, monkeypatch):
    from sattrib import mounts
    from sattrib.cli import main
    mi = tmp_path / "mountinfo"
    mi.write_text(MOUNTINFO)
    assert mounts.fs_type("/shared/sattrib/db", str(mi)) == "nfs4"
    assert mounts.fs_type("/shared/local disk/sattrib", str(mi)) == "xfs"
    assert mounts.fs_type("/var/lib/sattrib", str(mi)) == "ext4"
    assert mounts.network_fs_warning("/var/lib/sattrib/diagnoses.db", str(mi)) is None
    assert "nfs4" in mounts.network_fs_warning("/shared/sattrib/diagnoses.db", str(mi))
    monkeypatch.setattr(mounts, "MOUNTINFO", str(mi))
    monkeypatch.setenv("SATTRIB_DATABASE", "/shared/sattrib/diagnoses.db")
    r = CliRunner().invoke(main, ["config"])
    assert r.exit_code == 0
    assert "# warning: the database /shared/sattrib/diagnoses.db is on a network filesystem " \
           "(nfs4)" in r.output


# ---- 8. required MUNGE without unmunge ------------------------------------------------------

def test_required_munge_without_unmunge_rejects_snapshots(tmp_path, monkeypatch):
    d = spool.write_snapshot(tmp_path, "kc", "8801", 0, "k1", {
        "format": spool.FORMAT, "job_id": "8801", "restart": 0, "node": "k1", "files": {},
        "probes": []}, time.monotonic() + 10, munge=False)
    d = Path(d)
    d.with_name(d.name + ".munge").write_text("MUNGE:AwQDAACm...:\n")   # a node had munge
    monkeypatch.setenv("PATH", str(tmp_path / "nobin"))                # this host has not
    notes = []
    got = spool.read_snapshots(d.parent, "8801", 0, {os.getuid()}, True,
                               time.monotonic() + 5, notes)
    assert got == {}
    assert notes == ["snapshot from k1 rejected: MUNGE required but unmunge is not installed: "
                     'snapshot rejected; install munge or set spool_auth = "owner"']
    notes = []
    got = spool.read_snapshots(d.parent, "8801", 0, {os.getuid()}, False,
                               time.monotonic() + 5, notes)
    assert list(got) == ["k1"] and "owner checked" in got["k1"].trusted_by


# ---- 9. a bad site rule is skipped, loudly; rule files are size-capped ----------------------

SITE_RULE = """\
id: site.lr_negative
title: Negative learning rate
category: application_error
role: root
source: stderr
pattern: 'learning rate must be positive'
explain: 'the learning rate was negative'
action: fix_application
examples:
  match:
    - line: 'ValueError: learning rate must be positive'
  no_match:
    - line: 'learning rate 0.1'
"""


def test_bad_site_rule_is_skipped_with_a_note_in_the_diagnosis(tmp_path):
    from sattrib.analysis import analyze_folder, load_rules
    site = tmp_path / "rules.d"
    (site / "site").mkdir(parents=True)
    (site / "site" / "lr_negative.yaml").write_text(SITE_RULE)
    (site / "site" / "broken.yaml").write_text("id: site.broken\ntitle: [unclosed\n")
    (site / "site" / "huge.yaml").write_bytes(b"# " + b"x" * (2 << 20) + b"\n")
    (site / "extra.tsv").write_text("not a catalog\n")
    rules = load_rules([site])
    assert "site.lr_negative" in rules.by_id
    assert len(rules.problems) == 3, rules.problems
    ev = tmp_path / "ev"
    (ev / "logs").mkdir(parents=True)
    (ev / "logs" / "job.err").write_text(RANK_ERR)
    d, _ = analyze_folder(ev, rules=rules)
    notes = [n for n in d.completeness.notes if n.startswith("site rules: ")]
    assert any("site/broken.yaml" in n and "skipped" in n for n in notes), notes
    assert any("site/huge.yaml" in n and "over the cap of 1 MiB" in n for n in notes), notes
    assert any("extra.tsv" in n for n in notes), notes


def test_rules_test_reports_an_oversized_rule_file(tmp_path):
    from sattrib.cli import main
    site = tmp_path / "rules.d"
    (site / "site").mkdir(parents=True)
    (site / "site" / "lr_negative.yaml").write_text(SITE_RULE + "#" * (1 << 20) + "\n")
    r = CliRunner().invoke(main, ["rules", "test", str(site)])
    assert r.exit_code == 1
    assert "FAIL site/lr_negative.yaml: cannot read:" in r.output and "cap of 1 MiB" in r.output


def test_builtin_rules_stay_strict(tmp_path, monkeypatch):
    from sattrib.engine import rules as rules_mod
    fake = tmp_path / "builtin"
    (fake / "gpu").mkdir(parents=True)
    (fake / "gpu" / "broken.yaml").write_text("id: gpu.broken\n")
    monkeypatch.setattr(rules_mod, "BUILTIN_DIR", fake)
    with pytest.raises(rules_mod.RuleError, match="broken.yaml"):
        rules_mod.load_rules(lenient_site=True)


def test_node_epilog_leaves_output_on_a_hung_mount_to_the_controller(tmp_path, work, hung):
    """The node's own output files: one on a hung mount is left unshipped at the deadline (the
    controller copies it, under its own deadline), the other is shipped; a pattern whose folder
    hangs does not hold the Epilog either."""
    from sattrib.analysis import reader_limits
    from sattrib.collectors import node_output
    from sattrib.slurm_hooks import epilog
    t0 = time.monotonic()
    out, notes = node_output.ship([str(work / "out.8801"), str(hung.path / "out.8801")],
                                  os.getuid(), 1 << 20, reader_limits(Settings()), [],
                                  t0 + 3)
    assert time.monotonic() - t0 < 5
    assert [o["source"] for o in out] == [str(work / "out.8801")]
    assert notes == ["1 of 2 output files left to the controller (the Epilog's deadline came "
                     "first)"]
    job = slurm_env.from_env({"SLURM_JOB_ID": "8801", "SLURMD_NODENAME": "k1",
                              "SLURM_JOB_UID": str(os.getuid()),
                              "SLURM_NODELIST": "k1", "SLURM_JOB_WORK_DIR": str(work),
                              "SLURM_JOB_STDOUT": str(hung.path / "sub" / "%N.out")})
    st = Settings(probe_timeout_s=1.0)
    notes = []
    t0 = time.monotonic()
    assert epilog._ship_outputs(job, st, t0 + 10, notes) == []
    assert time.monotonic() - t0 < 3
    assert notes == ["output files not looked for: their folders did not answer in 1 s "
                     "(the controller copies them)"]
