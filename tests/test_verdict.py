"""The user's verdict: every diagnosis says whose fault the failure is (`blame`), the text
output says it first, in words, with the time lost, and `sattrib verdict` exits with one status
per blame for job scripts and retry wrappers."""
import json

import pytest
from click.testing import CliRunner

from helpers import CASES
from sattrib.analysis import analyze_folder
from sattrib.cli import main
from sattrib.demo import write_demo
from sattrib.engine.models import Diagnosis
from sattrib.store import Store

BLAMES = {"machine", "workload", "site_environment", "scheduler", "unknown"}
MACHINE = "Not your code: NVLink of GPU 0000:9d:00.0 on node-02 failed."


@pytest.fixture(scope="module")
def demo(tmp_path_factory, rules):
    d, _ = analyze_folder(write_demo(tmp_path_factory.mktemp("demo")), rules=rules)
    return d


def store(tmp_path, d, actions=()):
    db = Store(tmp_path / "diagnoses.db")
    did = db.upsert(d, "default")
    if actions:
        db.record_actions(did, list(actions), None)
    return tmp_path / "diagnoses.db"


def cli(*args):
    return CliRunner().invoke(main, list(args))


@pytest.mark.parametrize("case, blame", [
    ("xid79_srun_combined_log", "machine"), ("exception_peers_gloo_errors", "workload"),
    ("timelimit_teardown_noise", "scheduler"), ("hang_all_ranks_unattributed", "unknown"),
    ("two_faults_same_second_ambiguous", "machine")])
def test_every_diagnosis_carries_its_blame(rules, case, blame):
    d = json.loads(analyze_folder(CASES / case, rules=rules)[0].model_dump_json())
    assert d["blame"] == blame
    assert list(d)[:4] == ["job_id", "restart", "outcome", "blame"]


def test_every_case_has_a_known_blame(rules):
    for case in sorted(p for p in CASES.iterdir() if p.is_dir()):
        assert analyze_folder(case, rules=rules)[0].blame in BLAMES, case.name


def test_first_line_after_the_header_is_the_verdict(tmp_path, demo):
    db = store(tmp_path, demo)
    out = cli("1001", "--database", str(db)).output.splitlines()
    assert out[0].startswith("Job 1001")
    verdict = " ".join(x.strip() for x in out[1:3])
    assert verdict.startswith(MACHINE)
    assert "Resubmit with --exclude=node-02; 10 min lost (fault to job end)." in verdict
    assert out[3].startswith("State: FAILED")


def test_a_drained_culprit_needs_no_exclude(tmp_path, demo):
    drained = {"kind": "drain", "decision": "taken", "node": "node-02", "detail": "drained",
               "command": None, "created_at": "2026-11-02T10:30:00Z"}
    db = store(tmp_path, demo, [drained])
    out = cli("1001", "--database", str(db)).output
    assert "Resubmit; node-02 is drained; 10 min lost" in " ".join(out.split())
    assert "--exclude" not in out


def test_a_workload_fault_is_the_users_own_error(tmp_path, rules):
    d, _ = analyze_folder(CASES / "exception_peers_gloo_errors", rules=rules)
    out = cli(str(d.job_id), "--database", str(store(tmp_path, d))).output.splitlines()
    assert out[1].startswith("Your job's own error: rank ")


def _as(d: Diagnosis, category: str, blame: str) -> Diagnosis:
    root = d.root_cause.model_copy(update={"category": category, "blame": blame})
    return d.model_copy(update={"root_cause": root, "blame": blame})


@pytest.mark.parametrize("case, status", [
    (None, 10), ("site", 11), ("timelimit_teardown_noise", 12),
    ("exception_peers_gloo_errors", 13), ("hang_all_ranks_unattributed", 14)])
def test_verdict_exits_with_one_status_per_blame(tmp_path, rules, demo, case, status):
    d = (demo if case is None else _as(demo, "storage_io", "site_environment") if case == "site"
         else analyze_folder(CASES / case, rules=rules)[0])
    db = store(tmp_path, d)
    r = cli("verdict", str(d.job_id), "--database", str(db))
    assert r.exit_code == status, r.output
    assert r.output.startswith(("Not your code", "Not a fault", "Your job's own error",
                                "Not known whose fault"))
    j = json.loads(cli("verdict", str(d.job_id), "--database", str(db), "--json").output)
    assert j["status"] == status and j["exclude"] == (["node-02"] if status == 10 else [])


def test_verdict_statuses_are_documented():
    text = cli("verdict", "--help").output
    for status, blame in ((10, "machine"), (11, "site_environment"), (12, "scheduler"),
                          (13, "workload"), (14, "unknown")):
        assert f"{status} {blame}" in text


def test_verdict_of_an_unknown_job_is_an_error(tmp_path, demo):
    r = cli("verdict", "4242", "--database", str(store(tmp_path, demo)))
    assert r.exit_code == 1 and "no diagnosis for job 4242" in r.output


def test_a_diagnosis_stored_before_blame_gets_it_from_its_cause(tmp_path, demo):
    d = json.loads(demo.model_dump_json())
    del d["blame"]
    from sattrib.verdict import job_blame, sentence
    assert job_blame(d) == "machine" and sentence(d).startswith(MACHINE)
