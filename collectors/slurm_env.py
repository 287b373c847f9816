"""What Slurm tells a Prolog/Epilog through its environment, across 22.05 .. 25.x.

Differences handled: the node Epilog gets SLURM_NODELIST (22.05) or SLURM_JOB_NODELIST (newer),
the job's start and end times only on newer releases (SLURM_JOB_START_TIME, SLURM_JOB_END_TIME:
23.02 on), and SLURM_JOB_EXIT_CODE is the raw wait() status (exit 3 -> 768) while
SLURM_JOB_EXIT_CODE2 is "exit:signal".

EpilogSlurmctld's environment (slurmctld's job_common_env_vars, 22.05 .. 25.11) also carries
the job's name, user and uid, partition, node list, restart count, array ids and, when set,
SLURM_JOB_STDOUT / SLURM_JOB_STDERR / SLURM_JOB_WORK_DIR (the unexpanded --output patterns).
That is enough to file a diagnosis under the right job when scontrol cannot reach slurmctld.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping, Optional

from ..engine.hostlist import expand


@dataclass
class JobEnv:
    job_id: str
    restart: int
    node: Optional[str]              # SLURMD_NODENAME (node side only)
    nodes: list
    uid: Optional[int]
    user: Optional[str]
    cluster: Optional[str]
    start: Optional[float]
    exit_status: Optional[int]       # raw wait status
    exit_code: Optional[int]
    signal: Optional[int]
    derived: Optional[str]
    work_dir: Optional[str]
    stdout: Optional[str]
    stderr: Optional[str]
    name: Optional[str] = None
    partition: Optional[str] = None
    end: Optional[float] = None
    array_job: Optional[str] = None
    array_task: Optional[str] = None

    @property
    def nonzero(self) -> bool:
        """The environment says the job did not end cleanly. The derived exit code (highest
        step exit code) is not used: a requeued job carries its earlier run's value."""
        if self.exit_status not in (None, 0):
            return True
        return self.exit_code not in (None, 0) or self.signal not in (None, 0)

    @property
    def known(self) -> bool:
        return self.exit_status is not None or self.exit_code is not None


def _int(v: Optional[str]) -> Optional[int]:
    try:
        return int(v) if v not in (None, "") else None
    except ValueError:
        return None


def from_env(env: Mapping[str, str] = os.environ) -> Optional[JobEnv]:
    job_id = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    if not job_id:
        return None
    status = _int(env.get("SLURM_JOB_EXIT_CODE"))
    code = sig = None
    ec2 = env.get("SLURM_JOB_EXIT_CODE2", "")
    if ":" in ec2:
        code, sig = _int(ec2.split(":")[0]), _int(ec2.split(":")[1])
    elif status is not None:
        code, sig = (status >> 8) & 0xFF, status & 0x7F
    start = _int(env.get("SLURM_JOB_START_TIME"))
    end = _int(env.get("SLURM_JOB_END_TIME"))
    return JobEnv(
        job_id=job_id, restart=_int(env.get("SLURM_JOB_RESTART_COUNT")) or 0,
        node=env.get("SLURMD_NODENAME"),
        nodes=expand(env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or ""),
        uid=_int(env.get("SLURM_JOB_UID") or env.get("SLURM_UID")),
        user=env.get("SLURM_JOB_USER"), cluster=env.get("SLURM_CLUSTER_NAME"),
        start=float(start) if start else None, exit_status=status, exit_code=code, signal=sig,
        derived=env.get("SLURM_JOB_DERIVED_EC"), work_dir=env.get("SLURM_JOB_WORK_DIR"),
        stdout=env.get("SLURM_JOB_STDOUT"), stderr=env.get("SLURM_JOB_STDERR"),
        name=env.get("SLURM_JOB_NAME"), partition=env.get("SLURM_JOB_PARTITION"),
        end=float(end) if end else None, array_job=env.get("SLURM_ARRAY_JOB_ID"),
        array_task=env.get("SLURM_ARRAY_TASK_ID"))
