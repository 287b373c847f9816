"""A storm of failing jobs on a real Slurm cluster: the controller holds it (README "Running
inside Slurm", the queue).

The installed hooks (test_hooks.py's install, stand-in journals and nvidia-smi) on a cluster of
this module's own whose EpilogSlurmctld is the installed wrapper run under a timer of the
test's. Each burst is a job array of 40 one-node tasks that fail at once (a CUDA error in
their output; node02's kernel journal holds an Xid 79, so the tasks that ran there are node02's
GPU fault and call for a webhook). Checked: every task diagnosed, none lost, never more than
worker_concurrency (2) workers or jobs in progress (sampled from /proc), every
EpilogSlurmctld well under a second (wall clock, with the simulated nodes at the priority of
other machines; and its CPU), one job array's webhooks grouped; then the same burst with every
worker killed half way, resumed once by `sattrib queue --run` and once by the next
EpilogSlurmctld, losing nothing.

Run (as root, ~2-4 min)::

    .venv/bin/python -m pytest -q tests/integration/test_storm.py -m slurm -s

The measured figures are printed and written to tests/artifacts/hooks-timings.json.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import signal
import sqlite3
import threading
import time
from pathlib import Path

import pytest

from slurm_cluster import HARNESS_MARKER_VAR
from test_hooks import (NODES, Install, install, nodes, record, sattrib, timeout,  # noqa: F401
                        work, _bounded)
from test_slurm_actions import hook  # noqa: F401

TASKS = 40
CONCURRENCY = 2
GPU_PCI = "0000:00:1e"
XID79 = f"NVRM: Xid (PCI:{GPU_PCI}): 79, pid=0, name=<unknown>, GPU has fallen off the bus."


def _parent(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


class Sampler:
    """Every 0.25 s (a scan of /proc costs ~10-20 ms of CPU): the sattrib workers and job
    children of this cluster (/proc/PID/comm, and the harness marker in their environment),
    and their peak resident memory. A job child is named sattrib-job only once it runs: until
    then it is counted as the job, not as a second worker."""

    def __init__(self, marker: str):
        self.marker, self.peak, self.rss_kb = marker, {"sattrib-worker": 0, "sattrib-job": 0}, 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def procs(self) -> dict:
        """{pid: "sattrib-worker" or "sattrib-job"} of this cluster now: a worker is a process
        named sattrib-worker whose parent is not one, a job is a worker's child (the processes
        a job starts, its probes and readers, are neither)."""
        out, parent = {}, {}
        for pid in os.listdir("/proc"):
            try:
                comm = Path(f"/proc/{pid}/comm").read_text().strip()
                if comm in self.peak and (f"{HARNESS_MARKER_VAR}={self.marker}".encode()
                                          in Path(f"/proc/{pid}/environ").read_bytes()):
                    out[int(pid)], parent[int(pid)] = comm, _parent(int(pid))
            except OSError:
                pass
        return {p: "sattrib-job" if out.get(parent[p]) == "sattrib-worker" else c
                for p, c in out.items() if out.get(parent[p]) != "sattrib-job"}

    def run(self) -> None:
        while not self.stop.wait(0.25):
            now = self.procs()
            for comm in self.peak:
                self.peak[comm] = max(self.peak[comm], list(now.values()).count(comm))
            for pid in now:
                try:
                    status = Path(f"/proc/{pid}/status").read_text()
                    self.rss_kb = max(self.rss_kb, int(re.search(r"VmHWM:\s+(\d+)", status)[1]))
                except (OSError, TypeError):
                    pass

    def kill_all(self) -> int:
        """SIGKILL every worker and job child of this cluster (as a crash would)."""
        got = self.procs()
        for pid in got:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return len(got)


def timed(install, d: Path) -> tuple[Path, Path]:
    """(a wrapper that runs the installed EpilogSlurmctld and appends its job id, wall clock and
    CPU to the times file, that file)."""
    times = d / "epilog-slurmctld-times.txt"
    timer = d / "timed-epilog-slurmctld"
    q = shlex.quote
    timer.write_text(                       # wall clock, and the CPU of the hook's processes
        f"#!/bin/sh\nt0=$(date +%s.%N)\n{q(str(install.epilog_ctld))}\nt1=$(date +%s.%N)\n"
        f"times > {q(str(d))}/cpu.$$\n"
        f"echo \"$SLURM_JOB_ID $t0 $t1 $(tail -n 1 {q(str(d))}/cpu.$$)\" >> {q(str(times))}\n"
        f"rm -f {q(str(d))}/cpu.$$\nexit 0\n")
    timer.chmod(0o755)
    return timer, times


def prioritise(c) -> None:
    """On a real cluster slurmctld has the controller to itself, and the jobs and their node
    Epilogs run on other machines. Here they all share two cores, with whatever else runs on
    the test machine: the simulated nodes get the priority of another machine (nice 10) and
    slurmctld, whose slurmscriptd runs EpilogSlurmctld, that of its own (-5), each for its
    session, which the kernel's autogroup scheduler weighs as one."""
    for n in NODES:
        Path(f"/proc/{c.slurmd_pid(n)}/autogroup").write_text("10")
    Path(f"/proc/{(c.dir / 'run' / 'slurmctld.pid').read_text().strip()}/autogroup").write_text(
        "-5")


@pytest.fixture(scope="module")
def storm(slurm_cluster_factory_module, install, nodes, hook, tmp_path_factory):
    """The cluster, its EpilogSlurmctld under the test's timer, and the /proc sampler."""
    timer, times = timed(install, tmp_path_factory.mktemp("storm"))
    c = slurm_cluster_factory_module(nodes=NODES, epilog=str(install.epilog),
                                     epilog_slurmctld=str(timer), node_env=nodes.env)
    prioritise(c)
    install.base_settings = {"munge_socket": str(c.munge_socket),
                             "journal_dir": nodes.journal_pattern,
                             "probe_path": str(nodes.probe_dir), "notify_url": hook.url,
                             "notify_max_per_hour": 50, "worker_concurrency": CONCURRENCY,
                             "drain": "off"}
    install.configure()
    sampler = Sampler(str(c.dir))
    yield c, times, sampler
    sampler.stop.set()


def diagnosed(install: Install, jobs) -> set:
    if not install.database.exists():
        return set()
    con = sqlite3.connect(f"file:{install.database}?mode=ro", uri=True, timeout=10)
    try:
        got = {r[0] for r in con.execute("SELECT job_id FROM diagnoses WHERE restart = 0")}
    except sqlite3.OperationalError:
        got = set()
    finally:
        con.close()
    return got & {str(j) for j in jobs}


def burst(cluster, nodes, work, tag: str) -> tuple[int, list]:
    """A job array of TASKS failing tasks; (array id, task job ids once all have ended)."""
    nodes.write_journals({"node02": [(time.time(), XID79)]})
    w = shlex.quote(str(work))
    array = cluster.sbatch(
        "#!/bin/sh\necho 'RuntimeError: CUDA error: unspecified launch failure' >&2\n"
        f"date +%s.%N > {w}/end.{tag}.$SLURM_JOB_ID\nexit 1\n",
        array=f"0-{TASKS - 1}", nodes=1, ntasks=1, job_name=tag, no_requeue=True)
    deadline = time.monotonic() + 180
    while len(list(work.glob(f"end.{tag}.*"))) < TASKS:
        assert time.monotonic() < deadline, f"array {array}: {len(list(work.glob(f'end.{tag}.*')))} ended"
        time.sleep(0.2)
    return array, sorted(int(p.name.split(".")[-1]) for p in work.glob(f"end.{tag}.*"))


def hook_runs(times: Path, jobs) -> dict:
    """{job: (wall seconds, CPU seconds)} of the jobs whose EpilogSlurmctld has returned."""
    want, out = {str(j) for j in jobs}, {}
    for ln in times.read_text().splitlines() if times.exists() else []:
        job, t0, t1, user, system = ln.split()
        if job in want:
            cpu = sum(int(m) * 60 + float(s) for m, s in
                      (x.rstrip("s").split("m") for x in (user, system)))
            out[job] = (float(t1) - float(t0), cpu)
    return out


def wait_all(install, jobs, timeout_s: float) -> float:
    deadline = time.monotonic() + timeout_s
    while len(diagnosed(install, jobs)) < len(jobs):
        assert time.monotonic() < deadline, (
            f"{len(jobs) - len(diagnosed(install, jobs))} of {len(jobs)} not diagnosed\n"
            + install.logs_tail())
        time.sleep(0.2)
    return time.time()


def queue(cluster, install) -> dict:
    return json.loads(sattrib(cluster, install, "queue", "--json").stdout)


def kill_half_way(cluster, install, times, sampler, jobs) -> int:
    """Once every EpilogSlurmctld has returned and some jobs are diagnosed, kill every worker;
    then nothing moves until something resumes the queue. How many were diagnosed."""
    deadline = time.monotonic() + 120
    while len(hook_runs(times, jobs)) < len(jobs) or len(diagnosed(install, jobs)) < 3:
        assert time.monotonic() < deadline, install.logs_tail()
        time.sleep(0.1)
    assert sampler.kill_all() >= 1
    time.sleep(0.5)
    assert sampler.procs() == {}, "a worker survived"
    done = len(diagnosed(install, jobs))
    assert done < len(jobs), "the queue was empty before the kill: no storm to hold"
    left = queue(cluster, install)
    assert left["pending"]["count"] + left["claimed"]["count"] >= len(jobs) - done, left
    time.sleep(3)
    assert len(diagnosed(install, jobs)) == done, "something diagnosed with every worker dead"
    return done


def assert_queue_empty(cluster, install) -> None:
    q = queue(cluster, install)
    assert (q["pending"]["count"], q["claimed"]["count"], q["failed"]["count"]) == (0, 0, 0), q


@pytest.mark.slurm
@timeout(420)
def test_a_burst_of_failing_jobs_is_diagnosed_by_at_most_two_workers(storm, install, nodes,
                                                                      work, hook):
    cluster, times, sampler = storm
    before = len(hook.bodies)
    array, jobs = burst(cluster, nodes, work, "storm1")
    t_end = max(float((work / f"end.storm1.{j}").read_text()) for j in jobs)
    t_last = wait_all(install, jobs, 300)
    runs = hook_runs(times, jobs)
    wall = sorted(w for w, _ in runs.values())
    rss = [int(m) for m in re.findall(r"peak RSS (\d+) MB", install.log("worker.log"))]
    figures = {"storm_tasks": len(jobs),
               "storm_last_end_to_last_diagnosis_s": round(t_last - t_end, 1),
               "storm_epilog_slurmctld_max_ms": round(wall[-1] * 1000),
               "storm_epilog_slurmctld_median_ms": round(wall[len(wall) // 2] * 1000),
               "storm_epilog_slurmctld_max_cpu_ms": round(max(c for _, c in runs.values())
                                                          * 1000),
               "storm_peak_workers": sampler.peak["sattrib-worker"],
               "storm_peak_jobs_in_progress": sampler.peak["sattrib-job"],
               "storm_peak_rss_mb": round(max([sampler.rss_kb / 1024, *rss]), 1)}
    print(f"\narray {array}: {json.dumps(figures, indent=1)}")
    for k, v in figures.items():
        record(k, v)
    assert len(runs) == len(jobs) == TASKS
    assert wall[-1] < 1.0, wall[-5:]
    assert max(c for _, c in runs.values()) < 0.25, runs     # its own work, whatever the load
    assert 1 <= sampler.peak["sattrib-worker"] <= CONCURRENCY, sampler.peak
    assert 1 <= sampler.peak["sattrib-job"] <= CONCURRENCY, sampler.peak
    assert_queue_empty(cluster, install)
    # node02's GPU fault in several tasks of one array: one webhook, the rest in summaries,
    # which the last worker sends once it has finished
    deadline = time.monotonic() + 60
    while sampler.procs():
        assert time.monotonic() < deadline, sampler.procs()
        time.sleep(0.2)
    bodies = hook.bodies[before:]
    single = [b for b in bodies if b.get("kind") != "summary"]
    summarised = [j for b in bodies if b.get("kind") == "summary"
                  for g in b["groups"] for j in g["jobs"]]
    on_node02 = [j for j in jobs if json.loads(sattrib(cluster, install, str(j), "--json")
                                               .stdout)["root_cause"]["node"] == "node02"]
    assert len(on_node02) >= 2, on_node02
    assert len(single) == 1 and single[0]["culprit"]["node"] == "node02", single
    assert sorted([single[0]["job_id"], *summarised]) == sorted(map(str, on_node02))
    assert len(bodies) <= 3, [b.get("text") for b in bodies]


@pytest.mark.slurm
@timeout(420)
def test_workers_killed_half_way_resume_with_sattrib_queue_run(storm, install, nodes, work):
    cluster, times, sampler = storm
    _, jobs = burst(cluster, nodes, work, "storm2")
    done = kill_half_way(cluster, install, times, sampler, jobs)
    r = sattrib(cluster, install, "queue", "--run", timeout=300)
    assert "queued jobs taken" in r.stderr, r.stderr
    assert len(diagnosed(install, jobs)) == len(jobs), f"{done} before the kill"
    assert_queue_empty(cluster, install)
    assert sampler.peak["sattrib-worker"] <= CONCURRENCY, sampler.peak
    print(f"\nkilled with {done} of {len(jobs)} diagnosed; `sattrib queue --run` did the rest")


@pytest.mark.slurm
@timeout(420)
def test_workers_killed_half_way_resume_with_the_next_epilog_slurmctld(storm, install, nodes,
                                                                      work):
    cluster, times, sampler = storm
    _, jobs = burst(cluster, nodes, work, "storm3")
    done = kill_half_way(cluster, install, times, sampler, jobs)
    w = shlex.quote(str(work))
    nxt = cluster.sbatch(f"#!/bin/sh\ndate +%s.%N > {w}/end.next.$SLURM_JOB_ID\nexit 3\n",
                         nodes=1, ntasks=1, no_requeue=True)
    wait_all(install, [*jobs, nxt], 300)
    assert_queue_empty(cluster, install)
    assert sampler.peak["sattrib-worker"] <= CONCURRENCY, sampler.peak
    print(f"\nkilled with {done} of {len(jobs)} diagnosed; job {nxt}'s EpilogSlurmctld "
          "started the worker that did the rest")
