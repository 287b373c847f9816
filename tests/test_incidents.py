"""Cross-job incidents (sattrib.incidents) on real SQLite, against stand-in scontrol, squeue and
sacct and a real local webhook server: failures behind one switch (rack, file system) become
one incident that holds their drains and sends one notification; a lone fault is decided when
the queue is empty; a switch whose other ports' jobs ran on is not the suspect. The same on a
real Slurm cluster: tests/integration/test_incidents_storm.py."""
import json
import os
import textwrap
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest
from click.testing import CliRunner

from sattrib.analysis import analysis_settings, analyze_folder, load_rules, reader_limits
from sattrib.cli import main
from sattrib.collectors import node_jobs, topology
from sattrib.config import Settings
from sattrib.incidents import act, failure_of, settle, span
from sattrib.store import open_store

from helpers import Hook, folder

DATA = Path(__file__).parent / "data" / "topology"
T0 = time.time() // 60 * 60 - 3600            # an hour ago: every incident closed, all this week
TOPOLOGY = "SwitchName=s1 Nodes=gn[01-04]\nSwitchName=s2 Nodes=gn[05-08]\nSwitchName=spine Switches=s[1-2]\n"
LINK_DOWN = "mlx5_core 0000:17:00.0 ibp23s0: Link down"


def _stamp(t: float, sep: str = "T") -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime(f"%Y-%m-%d{sep}%H:%M:%S")


@pytest.fixture
def slurm(tmp_path, monkeypatch):
    """scontrol (node state from <tmp>/state/<node>, calls in <tmp>/calls), sinfo, sacct
    (accounting off, as on the test cluster) and squeue (its answer from <tmp>/squeue)."""
    b = tmp_path / "bin"
    b.mkdir()
    (tmp_path / "state").mkdir()
    (tmp_path / "squeue").write_text("")
    (b / "scontrol").write_text(textwrap.dedent(f"""\
        #!/bin/sh
        echo "$*" >> {tmp_path}/calls
        if [ "$1 $2" = "show node" ]; then
          f={tmp_path}/state/$4
          [ -f "$f" ] && cat "$f" || echo "NodeName=$4 State=IDLE Partitions=gpu Reason=(null)"
        fi
        exit 0
        """))
    (b / "sinfo").write_text("#!/bin/sh\nfor i in 1 2 3 4 5 6 7 8; do echo \"gn0$i|none\"; done\n")
    (b / "sacct").write_text("#!/bin/sh\necho 'sacct: error: Slurm accounting storage is "
                             "disabled' >&2\nexit 1\n")
    (b / "squeue").write_text(f"#!/bin/sh\necho \"$*\" >> {tmp_path}/calls\n"
                              f"cat {tmp_path}/squeue\n")
    for f in b.iterdir():
        f.chmod(0o755)
    monkeypatch.setenv("PATH", f"{b}:{os.environ['PATH']}")

    class S:
        def calls(self, word=""):
            p = tmp_path / "calls"
            return [c for c in (p.read_text().splitlines() if p.exists() else [])
                    if c.startswith(word)]

        def node(self, name, line):
            (tmp_path / "state" / name).write_text(line + "\n")

        def running(self, *jobs):
            """squeue's answer: (job id, state, nodes, start, end or None)."""
            (tmp_path / "squeue").write_text("".join(
                f"{j}|{s}|{n}|{int(a)}|{int(e) if e else 'Unknown'}\n" for j, s, n, a, e in jobs))
    return S()


@pytest.fixture
def hook():
    h = Hook()
    yield h
    h.server.shutdown()


def settings(tmp_path, hook=None, **kw):
    (tmp_path / "topology.conf").write_text(TOPOLOGY)
    return Settings(database=str(tmp_path / "d.db"), bundle_dir=str(tmp_path / "b"),
                    notify_url=hook.url if hook else "", **{
                        "incident_topology": str(tmp_path / "topology.conf"),
                        "incident_site_file": "", "drain": "on",
                        "drain_max_partition_percent": 100.0, "drain_max_per_hour": 50,
                        "notify_max_per_hour": 50, **kw})


JOB = """JobId={job} JobName=train-{job}
   UserId=alice(41001) GroupId=ml(5000) MCS_label=N/A
   JobState=FAILED Reason=NonZeroExitCode Dependency=(null)
   Requeue=0 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=1:0
   StartTime={start} EndTime={end} Deadline=N/A
   Partition=gpu AllocNode:Sid=login1:1234
   NodeList={node}
   NumNodes=1 NumCPUs=8 NumTasks=1 CPUs/Task=8 ReqB:S:C:T=0:0:*:*
"""


def failed_job(tmp_path, job, node, end, kernel=LINK_DOWN, output=""):
    """The evidence folder of a one-node job that ended at `end` (seconds after T0) with
    `kernel` in its node's journal 20 s before, and `output` as its rank's stderr."""
    t = T0 + end
    files = {"slurm/job.txt": JOB.format(job=job, node=node, start=_stamp(t - 120),
                                         end=_stamp(t))}
    if kernel:
        files[f"{node}/journal.log"] = f"{_stamp(t - 20)}+0000 {node} kernel: {kernel}\n"
    if output:
        files[f"{node}/rank-0.stderr"] = output + "\n"
    st = Settings()
    d, _ = analyze_folder(folder(tmp_path / f"job{job}", files), settings=analysis_settings(st),
                          rules=load_rules([]), limits=reader_limits(st), timezone="UTC")
    return d


def stored_and_acted(st, d, now=None):
    db = open_store(st.database)
    did = db.upsert(d, "c1")
    return did, act(db, did, d, st, now=now)


def burst(tmp_path, st, placement, now=T0 + 400, **kw):
    """Each (job, node, end) fails and is acted on as the worker would, one after another."""
    return [stored_and_acted(st, failed_job(tmp_path, j, n, e, **kw), now=now)
            for j, n, e in placement]


def decisions(result):
    return {(a["kind"], a["decision"]) for a in result["actions"]}


# -- reading the topology and Slurm's record -----------------------------------------------------
def test_topology_conf_and_scontrol_show_topology_give_the_same_switches():
    conf, _ = topology.switches((DATA / "topology.conf").read_text(), "topology.conf")
    shown, _ = topology.switches((DATA / "scontrol-show-topology.txt").read_text(),
                                 "scontrol show topology")
    assert conf and {(e.kind, e.name, e.nodes) for e in conf} == \
        {(e.kind, e.name, e.nodes) for e in shown}
    by = {e.name: e for e in conf}
    assert by["s1"].kind == "leaf switch" and by["s1"].nodes == {"node01", "node02"}
    assert by["spine"].kind == "spine switch" and by["spine"].nodes == {
        "node01", "node02", "node03", "node04"}


def test_a_spine_covers_the_nodes_below_its_leaves_at_any_depth():
    got, notes = topology.switches("SwitchName=a Nodes=x[1-2]\nSwitchName=b Nodes=x[3-4]\n"
                                   "SwitchName=mid Switches=a\nSwitchName=top Switches=mid,b,"
                                   "ghost  # ghost is not declared\n", "t")
    assert {e.name: e.nodes for e in got}["top"] == {"x1", "x2", "x3", "x4"}
    assert notes == ["t: switch top names ghost, which is not declared"]


def test_the_site_file_in_toml_and_csv():
    toml, notes = topology.site('[rack]\nr12 = "gn[01-04]"\n[nvlink_domain]\nnvl1 = "gn[05-08]"'
                                '\n[room]\nx = "gn01"\n', "/etc/sattrib/site.toml")
    csv, _ = topology.site("kind,name,nodes\nrack,r12,\"gn[01-04]\"\nnvlink_domain,nvl1,"
                           "gn[05-08]\n", "/etc/sattrib/site.csv")
    assert [(e.kind, e.name, e.nodes) for e in toml] == [(e.kind, e.name, e.nodes) for e in csv]
    assert {e.kind for e in toml} == {"rack", "nvlink domain"}
    assert notes == ["/etc/sattrib/site.toml: unknown kind 'room' (known: rack, pdu, chassis, "
                     "nvlink_domain): skipped"]


def test_slurms_record_of_the_jobs_on_some_nodes():
    jobs = node_jobs.parse((DATA / "squeue-t-all.txt").read_text())
    got = {j.job_id: (j.state, sorted(j.nodes), j.end is None) for j in jobs}
    assert got["1"] == ("FAILED", ["node01"], False)
    assert got["2"] == ("RUNNING", ["node03"], True)          # an end to come is no end
    sacct = node_jobs.parse("4417|CANCELLED by 0|gn[01-02]|1796449264|1796449300\n")
    assert (sacct[0].state, sacct[0].nodes) == ("CANCELLED", {"gn01", "gn02"})


def test_span_reads_as_words():
    assert [span(s) for s in (0, 1, 40, 130, 7200)] == [
        "within 1 second", "within 1 second", "within 40 seconds", "within 2 minutes",
        "within 2 hours"]


# -- grouping -------------------------------------------------------------------------------------
def test_a_dead_leaf_switch_is_one_incident_its_drains_held_and_one_webhook(tmp_path, slurm, hook):
    """Five jobs behind leaf s1 fail with a link down; two jobs behind s2 run on. The first
    two wait (an incident may be forming), the third opens the incident on s1 (not the spine:
    s2's jobs ran on), the rest join it; no node is drained and one webhook goes out."""
    st = settings(tmp_path, hook)
    slurm.running(("50", "RUNNING", "gn05", T0 - 600, None),
                  ("51", "RUNNING", "gn06", T0 - 600, None))
    got = burst(tmp_path, st, [(101, "gn01", 10), (102, "gn02", 15), (103, "gn03", 20),
                               (104, "gn01", 40), (105, "gn04", 130)])
    assert [decisions(r) for _, r in got[:2]] == [{("drain", "deferred"),
                                                   ("notify", "deferred")}] * 2
    assert all(decisions(r) == {("drain", "held"), ("notify", "summarised")} for _, r in got[2:])
    db = open_store(st.database)
    assert settle(db, st, now=T0 + 500) == 0            # the deferred ones were amended
    assert not slurm.calls("update")
    assert [(b["kind"], b["element"]["name"]) for b in hook.bodies] == [("incident", "s1")]
    out = CliRunner().invoke(main, ["show", "105", "--database", st.database])
    assert "Part of incident 1: leaf switch s1, 5 jobs within 2 minutes" in out.output
    first = json.loads(CliRunner().invoke(main, ["show", "101", "--database", st.database,
                                                 "--json"]).output)
    assert first["incident"]["line"] == "part of incident 1: leaf switch s1, 5 jobs within 2 minutes"
    assert [a["decision"] for a in first["actions"]] == ["held", "summarised"]
    doc = json.loads(CliRunner().invoke(main, ["incidents", "1", "--json", "--database",
                                               st.database]).output)
    assert (doc["jobs"], doc["failed_nodes"], doc["ran_on"], doc["category"]) == (
        5, "gn[01-04]", [], "network_ib")
    assert [c["element"] for c in doc["considered"]] == ["spine switch spine"]
    assert "3 of its 5 busy nodes failed: jobs on gn[05-06] ran on (2 jobs" in doc["considered"][0]["why"]
    assert {e["id"][0] for e in doc["evidence"]} == {"t", "j"}


def test_a_lone_network_fault_is_decided_when_the_queue_is_empty(tmp_path, slurm, hook):
    st = settings(tmp_path, hook)
    (did, r), = burst(tmp_path, st, [(201, "gn01", 10)])
    assert decisions(r) == {("drain", "deferred"), ("notify", "deferred")}
    assert not slurm.calls("update") and not hook.bodies
    assert settle(open_store(st.database), st, now=T0 + 500) == 1
    (upd,) = slurm.calls("update")
    assert upd.startswith("update NodeName=gn01 State=DRAIN Reason=sattrib:201 network_ib")
    assert [b["job_id"] for b in hook.bodies] == ["201"]
    shown = json.loads(CliRunner().invoke(main, ["201", "--database", st.database,
                                                 "--json"]).output)
    assert [(a["kind"], a["decision"]) for a in shown["actions"]] == [("drain", "taken"),
                                                                      ("notify", "taken")]
    assert shown["incident"] is None


def test_a_switch_whose_other_ports_jobs_ran_on_is_not_the_suspect(tmp_path, slurm):
    """Failures on two of s1's four nodes while jobs on its other two ran on: no incident; the
    faults are decided as on their own when the queue empties."""
    st = settings(tmp_path)
    slurm.running(("60", "COMPLETED", "gn03", T0 - 600, T0 + 200),
                  ("61", "RUNNING", "gn04", T0 - 600, None))
    burst(tmp_path, st, [(301, "gn01", 10), (302, "gn02", 15), (303, "gn01", 20)])
    db = open_store(st.database)
    assert db.db.conn.execute("SELECT count(*) FROM incidents").fetchone()[0] == 0
    settle(db, st, now=T0 + 500)
    drains = [c.split()[1] for c in slurm.calls("update")]
    assert drains and set(drains) <= {"NodeName=gn01", "NodeName=gn02"}


def test_a_spine_is_the_suspect_when_every_leaf_under_it_failed(tmp_path, slurm):
    st = settings(tmp_path)
    burst(tmp_path, st, [(401, "gn01", 10), (402, "gn05", 12), (403, "gn02", 14),
                         (404, "gn06", 16)])
    db = open_store(st.database)
    (kind, name, jobs), = db.db.conn.execute("SELECT kind, element, jobs FROM incidents")
    assert (kind, name, jobs) == ("spine switch", "spine", 4)


def test_failures_further_apart_than_the_window_do_not_group(tmp_path, slurm):
    st = settings(tmp_path, incident_window_s=60.0)
    burst(tmp_path, st, [(501, "gn01", 0), (502, "gn02", 100), (503, "gn03", 200)])
    assert open_store(st.database).db.conn.execute(
        "SELECT count(*) FROM incidents").fetchone()[0] == 0


def test_a_jobs_own_faults_never_make_an_incident(tmp_path, slurm):
    st = settings(tmp_path)
    got = burst(tmp_path, st, [(601, "gn01", 10), (602, "gn02", 12), (603, "gn03", 14)],
                kernel="", output="RuntimeError: CUDA error: an illegal memory access was "
                                  "encountered")
    assert all(failure_of(did, json.loads(open_store(st.database).db.conn.execute(
        "SELECT diagnosis_json FROM diagnoses WHERE id = ?", [did]).fetchone()[0])) is None
        for did, _ in got)
    assert open_store(st.database).db.conn.execute(
        "SELECT count(*) FROM incidents").fetchone()[0] == 0


def test_storage_faults_naming_one_nfs_server_are_one_file_system_incident(tmp_path, slurm):
    st = settings(tmp_path, incident_topology="off")
    burst(tmp_path, st, [(701, "gn01", 10), (702, "gn05", 12), (703, "gn07", 14)],
          kernel="nfs: server fs01 not responding, still trying")
    doc = json.loads(CliRunner().invoke(main, ["incidents", "1", "--json", "--database",
                                               st.database]).output)
    assert (doc["kind"], doc["element"], doc["jobs"], doc["failed_nodes"]) == (
        "filesystem", "NFS server fs01", 3, "gn[01,05,07]")
    assert doc["action_code"] == "check_storage"


def test_a_rack_from_the_site_file_groups_node_failures(tmp_path, slurm):
    site = tmp_path / "site.toml"
    site.write_text('[rack]\nr7 = "gn[05-08]"\n')
    st = settings(tmp_path, incident_topology="off", incident_site_file=str(site))
    burst(tmp_path, st, [(801, "gn05", 10), (802, "gn06", 12), (803, "gn07", 14)],
          kernel="NVRM: Xid (PCI:0000:3b:00): 79, pid=0, name=<unknown>, GPU has fallen off "
                 "the bus.")
    (kind, name), = open_store(st.database).db.conn.execute("SELECT kind, element FROM incidents")
    assert (kind, name) == ("rack", "r7")


def test_an_incident_opened_after_a_drain_gives_the_node_back(tmp_path, slurm, hook):
    """The queue emptied after the first failure (its node drained); the failures behind the
    same switch that follow open the incident, which resumes that node (only sattrib's drain
    of that job) and sends the incident's one webhook."""
    st = settings(tmp_path, hook)
    burst(tmp_path, st, [(901, "gn01", 10)])
    settle(open_store(st.database), st, now=T0 + 400)
    assert [c.split()[1] for c in slurm.calls("update")] == ["NodeName=gn01"]
    slurm.node("gn01", "NodeName=gn01 State=IDLE+DRAIN Partitions=gpu "
                       "Reason=sattrib:901 network_ib on gn01 [slurm@2026-12-03T10:01:00]")
    burst(tmp_path, st, [(902, "gn02", 30), (903, "gn03", 40)], now=T0 + 410)
    assert slurm.calls("update")[-1] == "update NodeName=gn01 State=RESUME"
    shown = json.loads(CliRunner().invoke(main, ["901", "--database", st.database,
                                                 "--json"]).output)
    assert [(a["kind"], a["decision"]) for a in shown["actions"]] == [
        ("drain", "taken"), ("resume", "taken"), ("notify", "taken")]
    assert [b.get("kind") for b in hook.bodies] == [None, "incident"]


def test_sattrib_incidents_lists_them(tmp_path, slurm):
    st = settings(tmp_path)
    burst(tmp_path, st, [(1001, "gn01", 10), (1002, "gn02", 12), (1003, "gn03", 14)],
          now=T0 + 60)
    r = CliRunner().invoke(main, ["incidents", "-S", "7d", "--database", st.database])
    assert r.exit_code == 0, r.output
    head, row = r.output.splitlines()
    assert head.split()[:4] == ["ID", "STATUS", "CLUSTER", "ELEMENT"]
    assert row.split()[:7] == ["1", "closed", "c1", "leaf", "switch", "s1", "3"]
    rows = json.loads(CliRunner().invoke(main, ["incidents", "-S", "7d", "--json",
                                                "--database", st.database]).output)
    assert [(r["id"], r["summary"]) for r in rows] == [(1, "leaf switch s1, 3 jobs within 4 seconds")]
    r = CliRunner().invoke(main, ["incidents", "7", "--database", st.database])
    assert r.exit_code == 1 and "no incident 7" in r.output
