"""A leaf switch dies on a real Slurm cluster: the failures of the jobs behind it are one
incident (README "Incidents").

The installed hooks (test_hooks.py's install, stand-in journals and nvidia-smi) on a cluster
with TopologyPlugin=topology/tree and a topology.conf of two leaf switches under one spine: s1
over node[01-02], s2 over node[03-04]. The kernel journals of node01 and node02 say their IB
link went down, and a job array of 200 one-node tasks runs on them only, each printing the NCCL
IB completion error that names its peer behind the same switch, while two jobs behind s2 run
on. drain = "on". Checked: every task diagnosed, none lost, one incident naming leaf switch s1
(not the spine, whose other leaf's jobs ran on) holding all 200, no node drained, one webhook;
then a second such burst with every worker killed half way, resumed by `sattrib queue --run`:
nothing lost, every task in the incident, no drain, no second webhook. The figures (last
task's end to last diagnosis stored, the workers' peak memory, EpilogSlurmctld's longest run)
are printed and written to tests/artifacts/hooks-timings.json.

Run (as root, ~10-20 min on 2 cores)::

    .venv/bin/python -m pytest -q tests/integration/test_incidents_storm.py -m slurm -s
"""
from __future__ import annotations

import json
import re
import shlex
import sqlite3
import time

import pytest

from test_hooks import (NODES, install, nodes, record, sattrib, timeout,  # noqa: F401
                        work, _bounded)
from test_slurm_actions import hook  # noqa: F401
from test_storm import (Sampler, assert_queue_empty, diagnosed, hook_runs, kill_half_way,
                        prioritise, timed, wait_all)

TASKS = 200
TOPOLOGY = ("SwitchName=s1 Nodes=node[01-02]\nSwitchName=s2 Nodes=node[03-04]\n"
            "SwitchName=spine Switches=s[1-2]\n")
PEER = {"node01": "10.40.8.12", "node02": "10.40.8.11"}     # each one's peer behind s1
LINK_DOWN = "mlx5_core 0000:17:00.0 ibp23s0: Link down"
NCCL = ("$SLURMD_NODENAME:$$:$$ [0] transport/net_ib.cc:1696 NCCL WARN NET/IB : Got completion "
        "from peer $peer<43817> with error 12, opcode 0, len 0, vendor err 129 (Send) localGid "
        "::ffff:10.40.8.1 remoteGids::ffff:$peer hca mlx5_0")


@pytest.fixture(scope="module")
def leafs(slurm_cluster_factory_module, install, nodes, hook, tmp_path_factory):
    """The cluster with its two leaf switches, EpilogSlurmctld under the test's timer, the
    /proc sampler, and two jobs behind s2 that run on until the test lets them end."""
    d = tmp_path_factory.mktemp("leafs")
    timer, times = timed(install, d)
    c = slurm_cluster_factory_module(nodes=NODES, epilog=str(install.epilog),
                                     epilog_slurmctld=str(timer), node_env=nodes.env,
                                     topology=TOPOLOGY)
    prioritise(c)
    install.base_settings = {"munge_socket": str(c.munge_socket),
                             "journal_dir": nodes.journal_pattern,
                             "probe_path": str(nodes.probe_dir), "notify_url": hook.url,
                             "notify_max_per_hour": 50, "worker_concurrency": 2,
                             "drain": "on", "incident_site_file": ""}
    install.configure()
    sampler = Sampler(str(c.dir))
    stop = d / "stop"
    behind_s2 = [c.sbatch(f"#!/bin/sh\nwhile [ ! -e {shlex.quote(str(stop))} ]; do sleep 1; "
                          "done\nexit 0\n", nodes=1, ntasks=1, nodelist=n, no_requeue=True)
                 for n in ("node03", "node04")]
    for j in behind_s2:
        c.wait_job(j, {"RUNNING"}, timeout=60)
    yield c, times, sampler
    stop.touch()
    sampler.stop.set()


def burst(cluster, nodes, work, tag: str) -> tuple[int, list]:
    """The IB links of node01 and node02 go down, and TASKS one-node tasks behind s1 fail with
    NCCL naming their peer; (array id, task job ids once all have ended)."""
    now = time.time()
    nodes.write_journals({n: [(now, LINK_DOWN)] for n in PEER})
    w = shlex.quote(str(work))
    script = ("#!/bin/sh\ncase $SLURMD_NODENAME in node01) peer=10.40.8.12 ;; "
              "*) peer=10.40.8.11 ;; esac\n"
              f"echo \"{NCCL}\" >&2\ndate +%s.%N > {w}/end.{tag}.$SLURM_JOB_ID\nexit 1\n")
    array = cluster.sbatch(script, array=f"0-{TASKS - 1}", nodes=1, ntasks=1, job_name=tag,
                           exclude="node03,node04", no_requeue=True)
    deadline = time.monotonic() + 900
    while len(list(work.glob(f"end.{tag}.*"))) < TASKS:
        assert time.monotonic() < deadline, f"{len(list(work.glob(f'end.{tag}.*')))} ended"
        time.sleep(0.5)
    return array, sorted(int(p.name.split(".")[-1]) for p in work.glob(f"end.{tag}.*"))


def idle(sampler, within: float = 120) -> None:
    """Every worker has ended (the last one decided what waited and sent what was due)."""
    deadline = time.monotonic() + within
    while sampler.procs():
        assert time.monotonic() < deadline, sampler.procs()
        time.sleep(0.2)


def stored(install, sql: str, args=()) -> list:
    con = sqlite3.connect(f"file:{install.database}?mode=ro", uri=True, timeout=30)
    try:
        return con.execute(sql, args).fetchall()
    finally:
        con.close()


def assert_nothing_drained(cluster, install) -> None:
    """No drain taken, tried or counted (only held), and no node drained."""
    assert not stored(install, "SELECT diagnosis_id, node, decision FROM actions WHERE "
                               "kind = 'drain' AND decision != 'held'")
    states = cluster.node_states()
    assert not [s for s in states.values() if "drain" in s.lower()], states


def assert_one_incident_on_s1(cluster, install, jobs) -> dict:
    """Every task is a member of one incident, on leaf switch s1; the spine was weighed and
    left out for s2's jobs that ran on."""
    (n,), = stored(install, "SELECT DISTINCT incident_id FROM incident_jobs WHERE job_id IN "
                            f"({','.join('?' * len(jobs))})", [str(j) for j in jobs])
    doc = json.loads(sattrib(cluster, install, "incidents", str(n), "--json").stdout)
    assert (doc["kind"], doc["element"], doc["failed_nodes"]) == ("leaf switch", "s1",
                                                                  "node[01-02]"), doc
    assert {j["job_id"] for j in doc["failed_jobs"]} >= {str(j) for j in jobs}
    assert doc["ran_on"] == [] and doc["category"] == "network_ib"
    (spine,) = [c for c in doc["considered"] if c["element"] == "spine switch spine"]
    assert "jobs on node[03-04] ran on (2 jobs" in spine["why"], spine
    shown = sattrib(cluster, install, str(jobs[-1])).stdout
    assert re.search(rf"Part of incident {n}: leaf switch s1, \d+ jobs within \d+ \w+", shown), shown
    return doc


@pytest.mark.slurm
@timeout(1800)
def test_a_dead_leaf_switch_is_one_incident_not_200_tickets(leafs, install, nodes, work, hook):
    cluster, times, sampler = leafs
    before = len(hook.bodies)
    array, jobs = burst(cluster, nodes, work, "leaf1")
    t_end = max(float((work / f"end.leaf1.{j}").read_text()) for j in jobs)
    t_last = wait_all(install, jobs, 1200)
    idle(sampler)
    runs = hook_runs(times, jobs)
    wall = sorted(w for w, _ in runs.values())
    rss = [int(m) for m in re.findall(r"peak RSS (\d+) MB", install.log("worker.log"))]
    figures = {"incident_tasks": len(jobs),
               "incident_last_end_to_last_diagnosis_s": round(t_last - t_end, 1),
               "incident_epilog_slurmctld_max_ms": round(wall[-1] * 1000),
               "incident_epilog_slurmctld_median_ms": round(wall[len(wall) // 2] * 1000),
               "incident_peak_workers": sampler.peak["sattrib-worker"],
               "incident_worker_peak_rss_mb": round(max([sampler.rss_kb / 1024, *rss]), 1)}
    print(f"\narray {array}: {json.dumps(figures, indent=1)}")
    for k, v in figures.items():
        record(k, v)
    assert len(jobs) == len(runs) == TASKS and len(diagnosed(install, jobs)) == TASKS
    assert_queue_empty(cluster, install)
    assert_nothing_drained(cluster, install)
    bodies = hook.bodies[before:]
    assert [(b.get("kind"), b.get("element", {}).get("name")) for b in bodies] == [
        ("incident", "s1")], [b.get("text") for b in bodies]
    assert_one_incident_on_s1(cluster, install, jobs)
    assert wall[-1] < 1.0, wall[-5:]
    assert sampler.peak["sattrib-worker"] <= 2, sampler.peak


@pytest.mark.slurm
@timeout(1800)
def test_the_same_burst_with_the_workers_killed_half_way_loses_nothing(leafs, install, nodes,
                                                                         work, hook):
    cluster, times, sampler = leafs
    before = len(hook.bodies)
    _, jobs = burst(cluster, nodes, work, "leaf2")
    done = kill_half_way(cluster, install, times, sampler, jobs)
    r = sattrib(cluster, install, "queue", "--run", timeout=1200)
    assert "queued jobs taken" in r.stderr, r.stderr
    assert len(diagnosed(install, jobs)) == TASKS, f"{done} before the kill"
    assert_queue_empty(cluster, install)
    assert_nothing_drained(cluster, install)
    assert_one_incident_on_s1(cluster, install, jobs)
    new = hook.bodies[before:]                # none, or one if the burst opened its own
    assert all((b.get("kind"), b["element"]["name"]) == ("incident", "s1") for b in new) \
        and len(new) <= 1, [b.get("text") for b in new]
    print(f"\nkilled with {done} of {TASKS} diagnosed; `sattrib queue --run` did the rest, "
          "all of them in the incident")
