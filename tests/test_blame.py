"""One notion of the machine's fault: each category's blame and each action's service in
engine/taxonomy.py, the blame a rule or catalog row declares, and everything that counts
against a node (hotspots, `list --infra`, escalation, drains, the drain list, the node page)
reading the one stored answer."""
import json
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import CASES, ROOT, ended_now
from sattrib.actions import decide_drain, escalation
from sattrib.analysis import analyze_folder
from sattrib.config import Settings
from sattrib.demo import write_demo
from sattrib.engine.catalog import CatalogError, read_catalog
from sattrib.engine.models import Diagnosis
from sattrib.engine.taxonomy import (BLAME, LADDER, SERVICE, Action, Blame, Category, fault,
                                     gpu_fault, ladder_rank, out_of_service)
from sattrib.store import Store
from test_actions import slurm  # noqa: F401  (the scontrol/sinfo stand-ins, a fixture)
from test_dashboard import get

REAL = ROOT / "tests" / "cases-real"
JOB_OUTPUT_IB = REAL / "net-ib-local-catastrophic-error-hca-mpirun-tagged-4node"   # node-01
NODE_DRIVER = REAL / "net-sw-nvml-driver-library-mismatch-unattended-upgrade-slurm-node"
HOST_OOM = CASES / "host_oom_cgroup_kill"                                           # cpu-gpu01

JOB = """JobId={job} JobName=train
   UserId=carol(41003) GroupId=ml(5000) MCS_label=N/A
   JobState=FAILED Reason=NonZeroExitCode Dependency=(null)
   Requeue=0 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=1:0
   StartTime=2026-04-12T09:00:00 EndTime=2026-04-12T09:01:10 Deadline=N/A
   Partition=gpu AllocNode:Sid=login1:1234
   NodeList={node}
   NumNodes=1 NumCPUs=8 NumTasks=1 CPUs/Task=8
"""
# The user's own environment: two NCCL builds met in ~/.local; a binary built for another GPU.
TWO_WHEELS = ("ImportError: /home/carol/.local/lib/python3.10/site-packages/torch/lib/"
              "libtorch_cuda.so: undefined symbol: ncclMemFree")
OTHER_ARCH = "RuntimeError: CUDA error: no kernel image is available for execution on the device"


def user_env_job(tmp_path, job: str, node: str, line: str):
    folder = tmp_path / f"job{job}"
    (folder / "slurm").mkdir(parents=True)
    (folder / "slurm" / "job.txt").write_text(JOB.format(job=job, node=node))
    (folder / node).mkdir()
    (folder / node / "rank-0.stderr").write_text(
        'Traceback (most recent call last):\n  File "/home/carol/train.py", line 3, in '
        f"<module>\n    import torch\n{line}\n")
    return folder


def diagnose(folder, rules, job_id=None):
    """The folder's diagnosis as the hooks make it: its job ended now."""
    d, _ = analyze_folder(folder, rules=rules)
    return ended_now(d.model_copy(update={"job_id": job_id}) if job_id else d)


# -- the vocabularies -----------------------------------------------------------------------
def test_every_category_has_a_blame_and_every_action_a_service():
    assert set(BLAME) == set(Category) and all(isinstance(b, Blame) for b in BLAME.values())
    assert set(SERVICE) == set(Action)
    # The ladder climbs one rank a step, and every step empties the node.
    assert [ladder_rank(a) for a in LADDER] == list(range(1, len(LADDER) + 1))
    assert all(out_of_service(a) for a in LADDER)
    # A rank on the ladder is an action that takes the node out, and only such an action.
    assert all((s.rank > 0) == s.out_of_service for s in SERVICE.values())
    assert not out_of_service(None) and not out_of_service("no_such_action")


def test_whose_fault_in_words_and_the_gpu_s_own_fault():
    """The words the node and GPU pages use (stored as `fault`) and what GPU hotspots count
    (`gpu_fault`), from blame and trust."""
    assert fault("machine", "kernel") == "infrastructure"
    assert fault("machine", "job_output") == "unconfirmed"
    assert fault("machine", None) == "unconfirmed"
    assert [fault(b, "kernel") for b in ("workload", "site_environment", "scheduler")] == \
        ["workload", "site_environment", "scheduler"]
    assert fault(None, None) is None
    assert gpu_fault("gpu_memory_ecc", "machine", "kernel")
    assert gpu_fault("nvlink", "machine", "node_telemetry")
    assert not gpu_fault("network_ib", "machine", "kernel")
    assert not gpu_fault("gpu_hardware", "machine", "job_output")
    assert not gpu_fault("cuda_oom", "workload", "job_output") and not gpu_fault(None, None, None)


def test_a_rule_or_row_declares_blame_only_with_a_category(tmp_path):
    from pydantic import ValidationError
    from sattrib.engine.rule_spec import Rule
    with pytest.raises(ValidationError, match="needs a category"):
        Rule.model_validate({"id": "x.y", "title": "t", "role": "context", "source": "stderr",
                             "pattern": "x", "explain": "x", "blame": "machine",
                             "examples": {"match": [{"line": "x"}]}})
    head = "rule\tmatch\trole\tcategory\taction\tflags\texplained_by\temitter\tversion\texample\tnote\n"
    for flags, why in (("blame=owner", "blame must be one of"),
                       ("blame=machine,blame=workload", "one blame= flag")):
        path = tmp_path / "site.tsv"
        path.write_text(head + f"nccl.warn\tx\troot\tsoftware_incompat\t-\t{flags}\t-\ta b\t1\tx\t-\n")
        with pytest.raises(CatalogError, match=why):
            read_catalog(path, "site.tsv")


# -- the engine: whose fault, from the rule or row that named the cause -------------------------
def test_user_environment_is_workload_and_the_node_driver_is_machine(tmp_path, rules):
    for i, line in enumerate((TWO_WHEELS, OTHER_ARCH)):
        d = diagnose(user_env_job(tmp_path, f"81{i}", "u01", line), rules)
        assert (d.root_cause.category.value, d.root_cause.blame.value) == \
            ("software_incompat", "workload")
        # The user's environment is fixed by the user: no word of draining the node.
        assert d.action_code.value == "fix_software" and "drain" not in d.action
    d = diagnose(NODE_DRIVER, rules)
    assert (d.root_cause.category.value, d.root_cause.blame.value, d.root_cause.trust.value) \
        == ("software_incompat", "machine", "node_telemetry")
    assert d.action.startswith("drain node-01;") and out_of_service(d.action_code)
    assert diagnose(HOST_OOM, rules).root_cause.blame == Blame.workload


# -- what counts against a node -------------------------------------------------------------
@pytest.fixture(scope="module")
def mixed_db(tmp_path_factory, rules):
    """A job-output-only hardware fault and a node driver mismatch on node-01, three user OOM
    kills on cpu-gpu01, the user's own software on u01 and u02."""
    tmp = tmp_path_factory.mktemp("blame")
    store = Store(tmp / "d.db")
    store.upsert(diagnose(JOB_OUTPUT_IB, rules, "501"), "c1")
    store.upsert(diagnose(NODE_DRIVER, rules, "502"), "c1")
    for job in ("601", "602", "603"):
        store.upsert(diagnose(HOST_OOM, rules, job), "c1")
    store.upsert(diagnose(user_env_job(tmp, "701", "u01", TWO_WHEELS), rules), "c1")
    store.upsert(diagnose(user_env_job(tmp, "702", "u02", OTHER_ARCH), rules), "c1")
    store.sync_rules(rules)
    return tmp / "d.db"


def cli(*args):
    r = subprocess.run([sys.executable, "-m", "sattrib", *args], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_hotspots_and_list_infra_count_only_the_machine_s_faults(mixed_db):
    hot = cli("hotspots", "-S", "2000-01-01", "--json", "--database", str(mixed_db))
    assert [(h["node"], h["failures"], h["categories"]) for h in hot] == \
        [("node-01", 1, "software_incompat")]
    listed = cli("list", "-S", "2000-01-01", "--infra", "--json", "--database", str(mixed_db))
    assert [(r["job_id"], r["culprit_node"]) for r in listed] == [("502", "node-01")]
    assert len(cli("list", "-S", "2000-01-01", "--json", "--database", str(mixed_db))) == 7


def test_user_oom_kills_never_escalate_a_node_and_its_driver_does(mixed_db, rules):
    conn = sqlite3.connect(mixed_db)
    st = Settings(repeat_threshold=3)
    oom = json.loads(diagnose(HOST_OOM, rules, "604").model_dump_json())
    assert oom["root_cause"]["trust"] == "kernel"          # the kernel's OOM killer, trusted
    assert escalation(conn, "c1/604/0", oom, st, time.time()) is None
    driver = json.loads(diagnose(NODE_DRIVER, rules, "503").model_dump_json())
    assert escalation(conn, "c1/503/0", driver, st.model_copy(update={"repeat_threshold": 2}),
                      time.time())["to"] == "drain_node"


def marked(db, tmp_path, update: str) -> Path:
    """A copy of the database with its stored columns changed by `update`."""
    path = tmp_path / "marked.db"
    src = sqlite3.connect(db)
    src.backup(dst := sqlite3.connect(path))
    src.close()
    dst.execute(update)
    dst.commit()
    dst.close()
    return path


def test_the_node_page_and_hotspots_read_the_stored_column(mixed_db, tmp_path):
    _, body = get(mixed_db, "/diagnoses/node_history.json?_shape=array&node=node-01")
    roles = {j["job_id"]: j["role"] for j in json.loads(body)}
    assert roles == {"502": "cause", "501": "cause (unconfirmed)"}
    _, body = get(mixed_db, "/diagnoses/node_history.json?_shape=array&node=cpu-gpu01")
    assert {j["role"] for j in json.loads(body)} == {"cause (workload)"}
    _, html = get(mixed_db, "/diagnoses/node_history?node=node-01")
    assert "1 infrastructure fault on this node" in html and "job output only" in html
    # The pages follow the stored answer, whatever the category: mark the OOMs as the
    # machine's and they count.
    path = marked(mixed_db, tmp_path, "update diagnoses set machine_fault = 1, "
                  "fault = 'infrastructure' where category = 'host_oom'")
    _, body = get(path, "/diagnoses/node_history.json?_shape=array&node=cpu-gpu01")
    assert {j["role"] for j in json.loads(body)} == {"cause"}
    _, body = get(path, "/diagnoses/node_hotspots.json?_shape=array&days=3650")
    assert {(r["node"], r["failures"]) for r in json.loads(body)} == \
        {("node-01", 1), ("cpu-gpu01", 3)}


def test_the_pages_and_gpu_hotspots_read_the_stored_fault_columns(mixed_db, tmp_path):
    """Whose fault, in the node and GPU pages' words, and whether it is the GPU's own are
    stored with each diagnosis (fault, gpu_fault, from engine/taxonomy.py): the pages and the
    GPU hotspots read them and decide nothing again in their SQL."""
    conn = sqlite3.connect(mixed_db)
    assert dict(conn.execute("select job_id, fault || ' ' || gpu_fault from diagnoses")) == {
        "501": "unconfirmed 0", "502": "infrastructure 0", "601": "workload 0",
        "602": "workload 0", "603": "workload 0", "701": "workload 0", "702": "workload 0"}
    conn.close()
    path = marked(mixed_db, tmp_path, "update diagnoses set fault = 'scheduler', gpu_fault = 1, "
                  "culprit_gpu = '0000:3b:00.0', gpu_serial = 'S1' where job_id = '502'")
    _, body = get(path, "/diagnoses/node_history.json?_shape=array&node=node-01")
    assert {j["job_id"]: j["role"] for j in json.loads(body)} == {
        "502": "cause (scheduler)", "501": "cause (unconfirmed)"}
    _, body = get(path, "/diagnoses/gpu_history.json?_shape=array&gpu=S1")
    assert [(r["job_id"], r["fault"]) for r in json.loads(body)] == [("502", "scheduler")]
    _, body = get(path, "/diagnoses/gpu_hotspots.json?_shape=array&days=3650")
    assert [(r["node"], r["gpu"]) for r in json.loads(body)] == [("node-01", "0000:3b:00.0")]
    hot = cli("hotspots", "--gpu", "-S", "2000-01-01", "--json", "--database", str(path))
    assert [(h["node"], h["gpu"]) for h in hot] == [("node-01", "0000:3b:00.0")]


# -- out of service: the action text, the drain policy and the drain list agree ----------------
def drain_list(path) -> dict:
    rc, body = get(Path(path), "/-/summary.json")
    assert rc == 0
    return {r["node"]: r["action_code"] for r in json.loads(body)["drain"]}


def dry_run(tmp_path):
    return Settings(database=str(tmp_path / "d.db"), bundle_dir=str(tmp_path / "b"),
                    drain="dry-run", drain_max_per_hour=1000, drain_max_partition_percent=100.0)


def test_the_drain_list_and_the_drain_policy_agree_for_every_action_code(tmp_path, rules, slurm):  # noqa: F811
    st = dry_run(tmp_path)
    store = Store(st.database)
    base = json.loads(diagnose(CASES / "xid79_srun_combined_log", rules).model_dump_json())
    policy = {}
    for i, action in enumerate(Action):
        d = json.loads(json.dumps(base))
        node = f"n{i:02d}"
        d["job_id"], d["action_code"] = str(9100 + i), action.value
        d["root_cause"].update(node=node, action_code=action.value)
        d["job"]["nodes"] = [node]
        did = store.upsert(Diagnosis.model_validate(d), "c1")
        got = decide_drain(store.db.conn, did, d, action.value, st, time.time())
        policy[node] = got and got["decision"]
    listed = drain_list(st.database)
    for i, action in enumerate(Action):
        node = f"n{i:02d}"
        assert (policy[node] == "dry-run") == (node in listed) == out_of_service(action), action


def test_the_demo_nvlink_fault_is_drained_as_its_action_says(tmp_path, rules, slurm):  # noqa: F811
    st = dry_run(tmp_path)
    d = diagnose(write_demo(tmp_path / "demo"), rules)
    assert d.root_cause.category.value == "nvlink" and d.action.startswith("drain node-02;")
    store = Store(st.database)
    did = store.upsert(d, "c1")
    got = decide_drain(store.db.conn, did, json.loads(d.model_dump_json()),
                       d.action_code.value, st, time.time())
    assert (got["decision"], got["node"]) == ("dry-run", "node-02")
    assert drain_list(st.database) == {"node-02": "inspect_nvlink"}
