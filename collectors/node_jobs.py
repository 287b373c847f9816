"""The jobs that ran on some nodes since a time, as Slurm records them: what a cross-job incident
weighs its failures against (sattrib.incidents: a switch is suspect only if the jobs behind it
failed together, not while others behind it ran on).

`sacct` where accounting is on (every job, even those slurmctld has forgotten); else `squeue -t
all`, which knows the running jobs and those that ended within MinJobAge. Times as epoch
seconds (SLURM_TIME_FORMAT=%s). Parsing is pure (`parse`); `jobs_on` runs the command with a
deadline and never raises.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Optional

from . import probe
from ..engine.hostlist import compress, expand

FIELDS = "JobIDRaw,State,NodeList,Start,End"
SQUEUE_FORMAT = "%A|%T|%N|%S|%e"


@dataclass(frozen=True)
class Job:
    job_id: str
    state: str                  # COMPLETED, RUNNING, FAILED, CANCELLED by 0 -> CANCELLED, ...
    nodes: frozenset
    start: Optional[float]
    end: Optional[float]        # None while it runs (or when Slurm does not know)


def _epoch(text: str) -> Optional[float]:
    return float(text) if text.strip().isdigit() else None


def parse(text: str) -> list[Job]:
    """`id|state|nodelist|start|end` lines (sacct -P or squeue with SQUEUE_FORMAT)."""
    out = []
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) != 5 or not parts[0].strip():
            continue
        job, state, nodes, start, end = parts
        state = state.split()[0].upper() if state.strip() else "UNKNOWN"
        out.append(Job(job.strip(), state, frozenset(expand(nodes)), _epoch(start),
                       None if state in ("RUNNING", "COMPLETING", "SUSPENDED") else _epoch(end)))
    return out


def jobs_on(nodes, since: float, deadline: float) -> tuple[Optional[list[Job]], str]:
    """(the jobs, which command said so), or (None, why neither answered)."""
    hostlist = compress(sorted(nodes))
    env = dict(os.environ, SLURM_TIME_FORMAT="%s")
    start = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(since))
    r = probe.run("sacct", ["sacct", "-X", "-a", "-n", "-P", "-N", hostlist, "-S", start,
                            "-E", "now", "-o", FIELDS], deadline, max_bytes=16 << 20, env=env)
    if r.ok:
        return parse(r.out.decode("utf-8", "replace")), "sacct"
    q = probe.run("squeue", ["squeue", "-h", "-a", "-t", "all", "-w", hostlist, "-o",
                             SQUEUE_FORMAT], deadline, max_bytes=16 << 20, env=env)
    if q.ok:
        return parse(q.out.decode("utf-8", "replace")), "squeue"
    why = (q.err or q.out).decode("utf-8", "replace").strip().splitlines()
    return None, (why[-1] if why else q.reason)[:200]
