"""Opt-in requeue of a failed job whose trusted diagnosis is the machine's fault, with the
culprit excluded, at most requeue_max_restarts times (real Slurm: tests/integration/
test_slurm_actions.py)."""
from types import SimpleNamespace

import pytest

from sattrib import actions
from sattrib.analysis import analyze_folder
from sattrib.config import Settings
from sattrib.demo import write_demo

JOB = ("JobId=1001 JobName=llm JobState={state} Restarts={restarts} BatchFlag=1 "
       "Partition=gpu ExcNodeList={exc}")


@pytest.fixture(scope="module")
def demo(tmp_path_factory, rules):
    d, _ = analyze_folder(write_demo(tmp_path_factory.mktemp("demo")), rules=rules)
    return __import__("json").loads(d.model_dump_json())          # node-02's NVLink


@pytest.fixture
def scontrol(monkeypatch):
    calls, job = [], {"state": "FAILED", "restarts": 0, "exc": "(null)"}

    def fake(args, timeout):
        calls.append(" ".join(args))
        out = JOB.format(**job).encode() if args[:2] == ["show", "job"] else b""
        return SimpleNamespace(ok=True, out=out, err=b"", reason="")
    monkeypatch.setattr(actions, "_scontrol", fake)
    return SimpleNamespace(calls=calls, job=job)


def st(**kw):
    return Settings(**{"requeue_partitions": ["gpu"], **kw})


def test_a_machine_fault_is_requeued_held_excluded_released(demo, scontrol):
    scontrol.job["exc"] = "node-07"
    row = actions.requeue_around(demo, st(), 0)
    assert (row["kind"], row["decision"], row["node"]) == ("requeue", "taken", "node-02")
    assert scontrol.calls[1:] == ["requeuehold 1001", "update JobId=1001 ExcNodeList=node-[02,07]",
                                  "release 1001"]
    assert row["detail"] == "requeued job 1001 (run 2), excluding node-02"


def test_at_most_requeue_max_restarts_times(demo, scontrol):
    scontrol.job["restarts"] = 1
    row = actions.requeue_around(dict(demo, restart=1), st(requeue_max_restarts=1), 0)
    assert row["decision"] == "refused" and "ran 2 times (requeue_max_restarts = 1)" in row["detail"]
    assert scontrol.calls == ["show job 1001"]


@pytest.mark.parametrize("why", ["not opted in", "job output only", "still pending", "completed"])
def test_nothing_is_requeued_otherwise(demo, scontrol, why):
    d, settings = demo, st()
    if why == "not opted in":
        settings = st(requeue_partitions=["other"])
    elif why == "job output only":
        d = dict(demo, root_cause=dict(demo["root_cause"], trust="job_output"))
    else:
        scontrol.job["state"] = "PENDING" if why == "still pending" else "COMPLETED"
    assert actions.requeue_around(d, settings, 0) is None
    assert not [c for c in scontrol.calls if not c.startswith("show job")]
