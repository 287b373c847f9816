"""Acting on a diagnosis (sattrib.actions) against stand-in scontrol/sinfo: the drain etiquette,
the rate limits, repeat-offender escalation, the recorded decisions and `sattrib resume`.
The same behaviour on a real Slurm cluster: tests/integration/test_slurm_actions.py."""
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from click.testing import CliRunner

from sattrib.actions import act, escalation, resume
from sattrib.analysis import analysis_settings, analyze_folder, load_rules, reader_limits
from sattrib.cli import main
from sattrib.config import Settings
from sattrib.errors import UserError
from sattrib.store import open_store

from helpers import Hook, ended_now

CASES = Path(__file__).parent / "cases"


@pytest.fixture
def slurm(tmp_path, monkeypatch):
    """scontrol and sinfo stand-ins: node state from <tmp>/state/<node>, calls in <tmp>/calls."""
    b = tmp_path / "bin"
    b.mkdir()
    (tmp_path / "state").mkdir()
    (b / "scontrol").write_text(textwrap.dedent(f"""\
        #!/bin/sh
        echo "$*" >> {tmp_path}/calls
        if [ "$1 $2" = "show node" ]; then
          f={tmp_path}/state/$4
          [ -f "$f" ] && cat "$f" || echo "NodeName=$4 State=IDLE Partitions=gpu OS=Linux 6.1 #1 SMP Reason=(null)"
        fi
        exit 0
        """))
    (b / "sinfo").write_text("#!/bin/sh\nprintf 'gn01|none\\ngn02|none\\nhx1|none\\nhx2|none\\n'\n")
    for f in b.iterdir():
        f.chmod(0o755)
    monkeypatch.setenv("PATH", f"{b}:{os.environ['PATH']}")

    class S:
        def calls(self):
            p = tmp_path / "calls"
            return p.read_text().splitlines() if p.exists() else []

        def node(self, name, line):
            (tmp_path / "state" / name).write_text(line + "\n")
    return S()


def settings(tmp_path, **kw):
    return Settings(database=str(tmp_path / "d.db"), bundle_dir=str(tmp_path / "b"),
                    **{"drain": "on", "drain_max_partition_percent": 100.0, **kw})


def diagnose(case, job_id=None, ended=None):
    """The recorded case as the hooks see it: its job ended now (or at `ended`)."""
    st = Settings()
    d, _ = analyze_folder(CASES / case, settings=analysis_settings(st), rules=load_rules([]),
                          limits=reader_limits(st), timezone="UTC")
    if job_id:
        d = d.model_copy(update={"job_id": job_id})
    return ended_now(d, ended)


def run(st, case, job_id=None, ended=None):
    db = open_store(st.database)
    d = diagnose(case, job_id, ended)
    did = db.upsert(d, "c1")
    return act(db, did, d, st)


def test_trusted_xid79_drains_the_culprit_with_a_sattrib_reason(tmp_path, slurm):
    got = run(settings(tmp_path), "xid79_srun_combined_log")
    (a,) = got["actions"]
    assert (a["kind"], a["decision"], a["node"]) == ("drain", "taken", "gn02")
    upd = [c for c in slurm.calls() if c.startswith("update")]
    assert upd == [f"update NodeName=gn02 State=DRAIN Reason={a['command'].split('Reason=')[1][1:-1]}"]
    assert "Reason=sattrib:7001 gpu_hardware " in upd[0]


def test_dry_run_records_the_command_and_changes_nothing(tmp_path, slurm):
    (a,) = run(settings(tmp_path, drain="dry-run"), "xid79_srun_combined_log")["actions"]
    assert a["decision"] == "dry-run" and a["command"].startswith("scontrol update NodeName=gn02")
    assert not [c for c in slurm.calls() if c.startswith("update")]


def test_job_output_only_cause_is_never_drained(tmp_path, slurm):
    got = run(settings(tmp_path), "app_exception_fake_kernel_lines")
    assert got["actions"] == [] and slurm.calls() == []


def test_a_lost_gpu_that_nvidia_smi_answers_for_is_held_not_drained(tmp_path, slurm):
    """The kernel says GPU 0000:3b:00.0 of gn02 fell off the bus; gn02's nvidia-smi, taken after
    the job, answers for that very GPU with no fault: a second source says otherwise."""
    case = tmp_path / "case"
    shutil.copytree(CASES / "xid79_srun_combined_log", case)
    shutil.copy(CASES.parent / "data" / "samples" /
                "nvidia-smi-q.h100-8gpu.535.161.08.healthy.txt", case / "gn02" / "nvidia-smi.txt")
    (a,) = run(settings(tmp_path), case)["actions"]
    assert (a["kind"], a["decision"], a["node"]) == ("drain", "held", "gn02")
    assert a["detail"].startswith("nvidia-smi on gn02 answers for GPU 0000:3b:00.0")
    assert not [c for c in slurm.calls() if c.startswith("update")]


def test_a_reason_set_by_someone_else_is_kept(tmp_path, slurm):
    slurm.node("gn02", "NodeName=gn02 State=IDLE+DRAIN Partitions=gpu "
                       "Reason=bad fan ticket 42 [admin@2026-12-01T10:00:00]")
    (a,) = run(settings(tmp_path), "xid79_srun_combined_log")["actions"]
    assert a["decision"] == "refused" and "'bad fan ticket 42' set by someone else" in a["detail"]
    assert not [c for c in slurm.calls() if c.startswith("update")]


def test_rate_limit_per_hour_then_would_drain(tmp_path, slurm):
    st = settings(tmp_path, drain_max_per_hour=1)
    assert run(st, "xid79_srun_combined_log")["actions"][0]["decision"] == "taken"
    (a,) = run(st, "xid48_ecc_nvidia_smi_xml")["actions"]
    assert a["decision"] == "would-drain" and "drain_max_per_hour = 1" in a["detail"]
    assert [c.split()[1] for c in slurm.calls() if c.startswith("update")] == ["NodeName=gn02"]


def test_partition_limit_counts_nodes_sattrib_drained(tmp_path, slurm, monkeypatch):
    b = Path(os.environ["PATH"].split(":")[0])
    (b / "sinfo").write_text("#!/bin/sh\nprintf 'gn01|sattrib:1 nvlink x\\ngn02|none\\n"
                             "hx1|none\\nhx2|none\\n'\n")
    (a,) = run(settings(tmp_path, drain_max_partition_percent=25.0),
               "xid79_srun_combined_log")["actions"]
    assert a["decision"] == "would-drain" and "1 of 4 nodes of gpu" in a["detail"]


def test_replay_never_drains_twice(tmp_path, slurm):
    st = settings(tmp_path)
    run(st, "xid79_srun_combined_log")
    again = run(st, "xid79_srun_combined_log")
    assert again["actions"][0]["decision"] == "taken"
    assert len([c for c in slurm.calls() if c.startswith("update")]) == 1


def test_repeat_offender_escalates_on_the_third_failure(tmp_path, slurm):
    st = settings(tmp_path, drain="dry-run")
    first = run(st, "xid79_srun_combined_log", "101")
    second = run(st, "xid79_srun_combined_log", "102")
    third = run(st, "xid79_srun_combined_log", "103")
    assert first["escalation"] is None and second["escalation"] is None
    esc = third["escalation"]
    assert esc["failures"] == 3 and (esc["from"], esc["to"]) == ("reboot_node", "drain_node")
    assert [j["job_id"] for j in esc["earlier_jobs"]] == ["101", "102"]
    assert esc["culprit"].startswith("GPU ") and esc["culprit"].endswith(" on gn02")


def test_the_repeat_window_counts_jobs_by_their_end(tmp_path, slurm):
    """Failures whose jobs ended before the window do not count, however recently sattrib
    diagnosed them (a backlog replayed, a bundle analysed late)."""
    st = settings(tmp_path, drain="dry-run")
    long_ago = datetime.now(timezone.utc) - timedelta(days=st.repeat_window_days + 1)
    run(st, "xid79_srun_combined_log", "101", ended=long_ago)
    run(st, "xid79_srun_combined_log", "102", ended=long_ago)
    assert run(st, "xid79_srun_combined_log", "103")["escalation"] is None


def test_escalation_ignores_workload_faults_and_other_gpus(tmp_path):
    st = settings(tmp_path)
    db = open_store(st.database)
    for j, case in (("1", "app_exception_fake_kernel_lines"), ("2", "xid48_ecc_nvidia_smi_xml")):
        db.upsert(diagnose(case, j), "c1")
    d = json.loads(diagnose("xid79_srun_combined_log", "3").model_dump_json())
    assert escalation(db.db.conn, "c1/3/0", d, st.model_copy(update={"repeat_threshold": 2}),
                      __import__("time").time()) is None


def test_show_json_and_text_carry_the_decisions(tmp_path, slurm):
    st = settings(tmp_path)
    run(st, "xid79_srun_combined_log")
    r = CliRunner().invoke(main, ["show", "7001", "--json", "--database", st.database])
    doc = json.loads(r.output)
    assert doc["actions"][0]["decision"] == "taken" and doc["escalation"] is None
    assert doc["root_cause"]["node"] == "gn02"        # the diagnosis itself is unchanged
    r = CliRunner().invoke(main, ["show", "7001", "--database", st.database],
                           env={"NO_COLOR": "1"})
    assert "Done: drain gn02: taken" in r.output


def test_resume_refuses_a_foreign_reason_and_resumes_ours(tmp_path, slurm):
    slurm.node("n1", "NodeName=n1 State=IDLE+DRAIN Reason=maintenance [root@2026-12-01T10:00]")
    with pytest.raises(UserError, match="not drained by sattrib: its reason is 'maintenance'"):
        resume("n1", 5)
    slurm.node("n2", "NodeName=n2 State=IDLE+DRAIN Reason=sattrib:7001 gpu_hardware x "
                     "[root@2026-12-01T10:00]")
    assert resume("n2", 5).startswith("n2: resumed")
    assert slurm.calls()[-1] == "update NodeName=n2 State=RESUME"
    r = CliRunner().invoke(main, ["resume", "n1"])
    assert r.exit_code == 1 and "Traceback" not in r.output


def test_unreachable_webhook_is_recorded_and_never_raises(tmp_path, slurm):
    st = settings(tmp_path, notify_url="http://127.0.0.1:9/hook", notify_retries=1,
                  notify_timeout_s=1.0)
    got = run(st, "xid79_srun_combined_log")
    (n,) = [a for a in got["actions"] if a["kind"] == "notify"]
    assert n["decision"] == "failed" and "after 2 attempts" in n["detail"]


# -- the trust checks, the lock and the budget --------------------------------------------------

def test_a_job_without_a_node_list_drains_nothing(tmp_path, slurm):
    st = settings(tmp_path)
    db = open_store(st.database)
    d = diagnose("xid79_srun_combined_log")
    d = d.model_copy(update={"job": d.job.model_copy(update={"nodes": []})})
    (a,) = act(db, db.upsert(d, "c1"), d, st)["actions"]
    assert a["decision"] == "refused" and "node list is unknown" in a["detail"], a
    assert not [c for c in slurm.calls() if c.startswith("update")]


def test_a_busy_drain_lock_holds_the_drain(tmp_path, slurm):
    st = settings(tmp_path, action_timeout_s=1.0)
    lock = Path(st.bundle_dir) / "c1" / ".locks" / "drain"
    lock.parent.mkdir(parents=True)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, os, sys, time\n"
         "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)\nfcntl.flock(fd, fcntl.LOCK_EX)\n"
         "print('held', flush=True)\ntime.sleep(120)\n", str(lock)],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        got = run(st, "xid79_srun_combined_log")
    finally:
        holder.kill()
        holder.wait()
    (a,) = got["actions"]
    assert (a["decision"], a["node"]) == ("held", "gn02") and "lock busy" in a["detail"], a
    assert not [c for c in slurm.calls() if c.startswith("update")]


def test_only_drains_that_pass_the_trust_checks_spend_the_hourly_budget(tmp_path, slurm):
    """Job 101 drained gn02 within the hour; replayed since (as after a rules update), its
    diagnosis rests on the job's own output: it no longer spends the budget of one."""
    st = settings(tmp_path, drain_max_per_hour=1)
    db = open_store(st.database)
    assert run(st, "xid79_srun_combined_log", "101")["actions"][0]["decision"] == "taken"
    fake = diagnose("app_exception_fake_kernel_lines", "101")
    assert db.upsert(fake, "c1") == "c1/101/0"
    (a,) = run(st, "xid48_ecc_nvidia_smi_xml", "102")["actions"]
    assert (a["decision"], a["node"]) == ("taken", "hx2"), a


def test_only_drains_that_pass_the_trust_checks_spend_the_partition_share(tmp_path, slurm):
    b = Path(os.environ["PATH"].split(":")[0])
    (b / "sinfo").write_text("#!/bin/sh\nprintf 'gn01|sattrib:101 gpu_hardware x\\ngn02|none\\n"
                             "hx1|none\\nhx2|none\\n'\n")
    st = settings(tmp_path, drain_max_partition_percent=25.0)
    db = open_store(st.database)
    d = diagnose("xid79_srun_combined_log", "101")
    d = d.model_copy(update={"root_cause": d.root_cause.model_copy(update={"node": "gn01"})})
    did = db.upsert(d, "c1")
    db.record_actions(did, [{"kind": "drain", "decision": "taken", "node": "gn01",
                             "detail": "drained", "command": None}], None)
    # while job 101's diagnosis stands, gn01 fills the partition's share (1 of 4 nodes)
    (a,) = run(st, "xid79_srun_combined_log", "102")["actions"]
    assert a["decision"] == "would-drain" and "1 of 4 nodes of gpu" in a["detail"], a
    db.upsert(diagnose("app_exception_fake_kernel_lines", "101"), "c1")
    (a,) = run(st, "xid79_srun_combined_log", "103")["actions"]
    assert (a["decision"], a["node"]) == ("taken", "gn02"), a


# -- notifications: a limit per hour, one job array grouped, the rest summarised ----------------

@pytest.fixture
def webhook():
    h = Hook()
    yield h
    h.server.shutdown()


def notified(st, tmp_path, jobs, array=None, now=None) -> list:
    """Act on a GPU fault diagnosis for each job (all named alike, as `sbatch --wrap` names
    them); `array`: the jobs are that job array's tasks (the bundle's run record says so)."""
    db = open_store(st.database)
    out = []
    for i, j in enumerate(jobs):
        d = diagnose("xid79_srun_combined_log", str(j))
        d = d.model_copy(update={"job": d.job.model_copy(update={"name": "wrap"})})
        bundle = tmp_path / "bundles" / str(j)
        (bundle / "slurm").mkdir(parents=True)
        (bundle / "slurm" / "sattrib-run.json").write_text(json.dumps({"array_job_id": array}))
        got = act(db, db.upsert(d, "c1"), d, st, bundle, now=(now or time.time()) + i)
        out += [a["decision"] for a in got["actions"] if a["kind"] == "notify"]
    return out


def notify_rows(st) -> dict:
    """{job: [(decision, detail) of each notify row]}."""
    import sqlite3
    con = sqlite3.connect(st.database)
    out: dict = {}
    try:
        for did, dec, det in con.execute("SELECT diagnosis_id, decision, detail FROM actions "
                                         "WHERE kind = 'notify' ORDER BY diagnosis_id, seq"):
            out.setdefault(did.split("/")[1], []).append((dec, det))
        return out
    finally:
        con.close()


def test_webhooks_past_the_hourly_limit_are_held_then_summarised(tmp_path, slurm, webhook):
    from sattrib.actions import send_held
    st = settings(tmp_path, drain="off", notify_url=webhook.url, notify_max_per_hour=2)
    db, now = open_store(st.database), time.time()
    assert notified(st, tmp_path, range(8100, 8105), now=now) == [
        "taken", "taken", "held", "held", "held"]             # same name, but no job array
    assert [b["job_id"] for b in webhook.bodies] == ["8100", "8101"]
    assert "rate limit: 2 webhooks in the last hour" in notify_rows(st)["8102"][0][1]
    assert send_held(db, st, now=now + 60) is None        # this hour's two are spent
    assert len(webhook.bodies) == 2
    assert send_held(db, st, now=now + 3700)["decision"] == "taken"     # the next hour
    (summary,) = webhook.bodies[2:]
    assert summary["kind"] == "summary" and summary["held"] == 3
    assert summary["groups"] == [{"cluster": "c1", "user": "alice", "array_job_id": None,
                                  "jobs": ["8102", "8103", "8104"],
                                  "causes": {"gpu_hardware on gn02": 3}}]
    assert "3 notifications held" in summary["text"] and "wrap" not in summary["text"]
    rows = notify_rows(st)
    assert [rows[j][0][0] for j in ("8102", "8103", "8104")] == ["summarised"] * 3
    assert rows["8104"][1][0] == "taken"                 # the summary, beside the newest
    assert rows["8104"][1][1].startswith("summary of 3 held notifications: sent: HTTP 200")
    assert send_held(db, st, now=now + 3800) is None and len(webhook.bodies) == 3


def test_a_job_arrays_failures_make_one_webhook_and_one_summary(tmp_path, slurm, webhook):
    """13 tasks of one job array fail with a GPU fault: one webhook at once, then one summary
    of the other twelve when the queue is empty (not 13 webhooks)."""
    from sattrib.actions import send_held
    st = settings(tmp_path, drain="off", notify_url=webhook.url)
    got = notified(st, tmp_path, range(8200, 8213), array="8200")
    assert got == ["taken"] + ["held"] * 12
    assert "job 8200 of the same job array" in notify_rows(st)["8201"][0][1]
    assert send_held(open_store(st.database), st)["decision"] == "taken"
    assert [b.get("kind") for b in webhook.bodies] == [None, "summary"]
    summary = webhook.bodies[1]
    assert summary["groups"][0]["jobs"] == [str(j) for j in range(8201, 8213)]
    assert summary["groups"][0]["array_job_id"] == "8200"
    assert "job array 8200 of user alice on c1: 12 failed job(s) (8201, 8202" in summary["text"]
    assert "and 2 more" in summary["text"]
    assert notified(st, tmp_path, [8300]) == ["taken"]       # another job: a webhook of its own
