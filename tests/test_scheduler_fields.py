"""The job's record as scheduler evidence: what its user wrote (name, comment, paths) is read
as their words, never as Slurm's. On `scontrol show job` text recorded on the real 22.05
cluster (tests/data/slurm/README.md); the same on a real cluster with the worker:
tests/integration/test_slurm_actions.py."""
import json
import os
import re
import time
from pathlib import Path

import pytest

from sattrib.actions import act
from sattrib.analysis import analyze_folder
from sattrib.collectors import slurm_job, slurm_state
from sattrib.config import Settings
from sattrib.store import open_store

DATA = Path(__file__).parent / "data" / "slurm"
TEXT = (DATA / "scontrol-show-job-d.22.05.user-fields.txt").read_text()
ONE_LINERS = (DATA / "scontrol-show-job-d-o.22.05.user-fields.txt").read_text()


def record(job: int, text: str = TEXT) -> str:
    """The text scontrol prints for one of the recorded jobs (`scontrol show job -d N`)."""
    parts = re.split(r"(?m)^(?=JobId=\d)", text)
    return next(p for p in parts if p.startswith(f"JobId={job} "))


def test_a_name_full_of_keys_stays_the_name():
    kv = slurm_state.parse_kv(record(1))
    assert kv["JobName"] == "x UserId=root(0) StdOut=/root/secret-note.txt"
    assert (kv["User"], kv["Uid"]) == ("sattrib-hooktest", "1001")
    assert kv["StdOut"] == "/tmp/sf/u/slurm-1.out"
    assert slurm_state.parse_kv(record(6))["User"] == "sattrib-hooktest"
    kv = slurm_state.parse_kv(record(7))
    assert (kv["JobName"], kv["JobState"]) == ("a=b c=d", "FAILED")
    assert kv["Comment"] == "JobState=NODE_FAIL Reason=NodeDown"
    (job,) = slurm_state.parse_scontrol(record(1))
    assert (job.user, job.state, job.nodes) == ("sattrib-hooktest", "FAILED", ["node01"])


@pytest.mark.parametrize("job", [4, 5])
def test_a_line_break_that_imitates_a_line_leaves_only_the_job_id(job):
    """A name (4) or comment (5) holding a line break and a whole `UserId=`/`StdOut=` line:
    that line is printed twice, so the record cannot be read safely."""
    kv = slurm_state.parse_kv(record(job))
    assert kv.get("Ambiguous") and kv["JobId"] == str(job)
    assert not {"User", "Uid", "StdOut", "JobState"} & set(kv)
    notes: list = []
    (info,) = slurm_state.parse_scontrol(record(job), notes)
    assert info.job_id == str(job) and info.user is None and info.state is None
    assert "cannot be read safely" in notes[0]


def test_no_output_path_for_a_job_slurm_prints_none_for():
    """Job 9 ran without a batch script: Slurm prints no StdOut, so the one its working
    directory's name holds is not the job's. The text alone cannot tell where that name ends;
    the working directory slurmctld gives the worker can, and the record is then not used."""
    kv = slurm_state.parse_kv(record(9))
    assert kv["BatchFlag"] == "0" and "StdOut" not in kv and kv["Uid"] == "1001"
    exact = {"JobId": "9", "Uid": "1001", "WorkDir": "/tmp/sf/u/w\n   StdOut=/root/secret-note.txt"}
    got = slurm_job.job_facts(kv, exact, notes := [])
    assert got == exact and "WorkDir is not the one slurmctld gave" in notes[0]


def test_one_line_records_with_keys_in_a_name_are_ambiguous():
    assert slurm_state.parse_kv(record(1, ONE_LINERS)).get("Ambiguous")
    kv = slurm_state.parse_kv(record(2, ONE_LINERS))
    assert (kv["User"], kv["Comment"]) == ("sattrib-hooktest", "srun: error: Node failure on node02")


def test_the_job_id_picks_its_record_and_two_records_of_one_job_are_ambiguous():
    assert slurm_state.parse_kv(TEXT, "3")["JobName"] == "Nodes node02 not responding, setting DOWN"
    forged = record(2) + record(2).replace("Comment=", "Comment=x")
    assert slurm_state.parse_kv(forged, "2").get("Ambiguous")


def folder(tmp_path, **files) -> Path:
    for rel, text in files.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return tmp_path


@pytest.mark.parametrize("job", [2, 3, 4, 5, 7, 9])
def test_what_the_user_wrote_into_the_record_is_no_scheduler_evidence(tmp_path, rules, job):
    """`srun: error: Node failure on node02` in a comment, `Nodes node02 not responding,
    setting DOWN` as a name and output path, `JobState=NODE_FAIL` in a comment, whole lines
    after a line break: no scheduler event, no node blamed."""
    d, _ = analyze_folder(folder(tmp_path, **{"slurm/job.txt": record(job)}), rules=rules)
    assert not d.root_cause or d.root_cause.category.value != "scheduler_node_failure", d.root_cause
    assert not [e for e in d.evidence if e.source.value == "scheduler"
                and re.search(r"Node failure|not responding|NODE_FAIL|root", e.text)]


def test_the_rules_still_read_slurms_own_fields(tmp_path, rules):
    text = record(7).replace("JobState=FAILED Reason=NonZeroExitCode",
                             "JobState=NODE_FAIL Reason=NodeDown")
    view = slurm_state.rule_view("slurm_job", text)
    assert view.count("\n") == text.count("\n")
    assert "JobState=NODE_FAIL Reason=NodeDown Dependency=(null)" in view
    assert "a=b" not in view and view.count("NODE_FAIL") == 1
    d, _ = analyze_folder(folder(tmp_path, **{"slurm/job.txt": text}), rules=rules)
    (e,) = [e for e in d.evidence if e.rule == "slurm.job_state"]
    assert e.line == 4 and e.text.strip().startswith("JobState=NODE_FAIL")


SACCT = ("JobID|JobName|Partition|User|State|ExitCode|Start|End|NodeList\n"
         "8|p|NODE_FAIL|q|debug|sattrib-hooktest|FAILED|1:0|2026-12-05T03:02:03|"
         "2026-12-05T03:02:04|node01\n"
         "8.batch|batch|||FAILED|1:0|2026-12-05T03:02:03|2026-12-05T03:02:04|node01\n"
         "9|x\n9|y|debug|sattrib-hooktest|COMPLETED|0:0|2026-12-05T03:02:03|"
         "2026-12-05T03:02:04|node02\n")


def test_sacct_a_bar_or_line_break_in_a_name_stays_in_the_name(tmp_path, rules):
    a, b = slurm_state.parse_sacct(SACCT)
    assert (a.name, a.state, a.nodes, a.user) == ("p|NODE_FAIL|q", "FAILED", ["node01"],
                                                 "sattrib-hooktest")
    assert (b.job_id, b.name, b.state) == ("9", "x\n9|y", "COMPLETED")
    view = slurm_state.rule_view("sacct", SACCT)
    assert "NODE_FAIL" not in view and view.count("\n") == SACCT.count("\n")
    d, _ = analyze_folder(folder(tmp_path, **{"slurm/sacct.txt": SACCT}), rules=rules)
    assert not [e for e in d.evidence if "NODE_FAIL" in e.text], d.evidence


def test_json_record_fields_are_exact(tmp_path, rules):
    """--json (23.02 on, and pyslurm's record): every value is a string, whatever it holds."""
    text = json.dumps({"jobs": [{
        "job_id": 5, "name": "a\n   UserId=root(0) StdOut=/root/x", "user_id": 1001,
        "user_name": "sattrib-hooktest", "job_state": ["NODE_FAIL"], "state_reason": "NodeDown",
        "comment": "srun: error: Node failure on node02", "batch_flag": True,
        "standard_output": "/tmp/sf/u/slurm-%j.out", "nodes": "node[01-02]",
        "start_time": {"set": True, "infinite": False, "number": 1796439743}}]}, indent=2)
    kv = slurm_state.parse_kv(text, "5")
    assert (kv["Uid"], kv["User"], kv["JobState"]) == ("1001", "sattrib-hooktest", "NODE_FAIL")
    assert kv["JobName"] == "a\n   UserId=root(0) StdOut=/root/x"
    assert slurm_state.parse_time(kv["StartTime"]) == 1796439743
    view = slurm_state.rule_view("slurm_json", text, "5").split("\n")
    assert [ln for ln in view if ln] == ["JobState=NODE_FAIL Reason=NodeDown"]
    assert '"job_state"' in text.split("\n")[view.index("JobState=NODE_FAIL Reason=NodeDown")]
    d, _ = analyze_folder(folder(tmp_path, **{"slurm/job.json": text}), rules=rules)
    assert {e.rule for e in d.evidence if e.source.value == "scheduler"} == {"slurm.job_state"}


def test_exact_facts_win_and_a_misread_record_is_not_used():
    exact = {"JobId": "4", "JobName": "a\n   UserId=root(0) GroupId=root(0) MCS_label=N/A",
             "Uid": "1001", "User": "sattrib-hooktest", "StdOut": "/tmp/sf/u/o-%j.txt"}
    notes: list = []
    got = slurm_job.job_facts(slurm_state.parse_kv(record(4)), exact, notes)
    assert got["Uid"] == "1001" and got["StdOut"] == "/tmp/sf/u/o-%j.txt" and "JobState" not in got
    assert "was not used" in notes[0]
    # A record read cleanly completes the facts (its state, restarts), never overrides them.
    kv = slurm_state.parse_kv(record(1))
    got = slurm_job.job_facts(dict(kv, Uid="0"), {"JobId": "1", "Uid": "1001"}, notes := [])
    assert got == {"JobId": "1", "Uid": "1001"} and notes
    got = slurm_job.job_facts(kv, {"JobId": "1", "Uid": "1001", "User": "sattrib-hooktest",
                                   "JobName": kv["JobName"]}, notes := [])
    assert got["JobState"] == "FAILED" and got["StdOut"] == "/tmp/sf/u/slurm-1.out" and not notes


def test_mail_goes_to_the_jobs_user_and_never_as_an_option(tmp_path, rules):
    rec = tmp_path / "mail.sh"
    rec.write_text(f"#!/bin/sh\ncat >/dev/null\nprintf '%s\\n' \"$@\" > {tmp_path}/mail.args\n")
    rec.chmod(0o755)
    st = Settings(database=str(tmp_path / "d.db"), bundle_dir=str(tmp_path / "b"),
                  drain="off", mail_prog=str(rec))
    db = open_store(st.database)
    d, _ = analyze_folder(folder(tmp_path / "f", **{"slurm/job.txt": record(6)}), rules=rules)
    act(db, db.upsert(d, "c1"), d, st)
    assert (tmp_path / "mail.args").read_text().split("\n")[2] == "sattrib-hooktest"
    os.unlink(tmp_path / "mail.args")
    bad = d.model_copy(update={"job": d.job.__class__(**{**d.job.__dict__, "user": "-Eshell"}),
                               "job_id": "66"})
    got = act(db, db.upsert(bad, "c1"), bad, st)
    assert not (tmp_path / "mail.args").exists() and not [a for a in got["actions"]
                                                          if a["kind"] == "mail"]


def test_squeue_gives_sattrib_collect_the_exact_owner_and_name(tmp_path, monkeypatch):
    """By hand there is no EpilogSlurmctld environment: squeue's fields (the name last, so a
    `|` or a line break in it stays in it) take its place."""
    squeue = tmp_path / "squeue"
    squeue.write_text("#!/bin/sh\nprintf '7|1001|alice|gpu|gn[01-02]|x|y\\n   UserId=root(0)\\n'\n")
    squeue.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    got = slurm_job.squeue_facts("7", time.monotonic() + 10)
    assert got == {"JobId": "7", "Uid": "1001", "User": "alice", "UserId": "alice(1001)",
                   "Partition": "gpu", "NodeList": "gn[01-02]",
                   "JobName": "x|y\n   UserId=root(0)"}
    assert slurm_job.squeue_facts("8", time.monotonic() + 10) == {}
