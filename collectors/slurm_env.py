"""What Slurm tells a Prolog/Epilog through its environment, across 22.05 .. 25.x.

Differences handled: the node Epilog gets SLURM_NODELIST (22.05) or SLURM_JOB_NODELIST (newer),
the job's start and end times only on newer releases (SLURM_JOB_START_TIME, SLURM_JOB_END_TIME:
23.02 on), and SLURM_JOB_EXIT_CODE is the raw wait() status (exit 3 -> 768) while
SLURM_JOB_EXIT_CODE2 is "exit:signal".

EpilogSlurmctld's environment (slurmctld's job_common_env_vars, 22.05 .. 25.11) also carries
the job's name, user and uid, partition, node list, restart count, array ids and, when set,
SLURM_JOB_STDOUT / SLURM_JOB_STDERR / SLURM_JOB_WORK_DIR (the unexpanded --output patterns).
That is enough to file a diagnosis under the right job when scontrol cannot reach slurmctld.

Where the node Epilog has no start time (22.05), `spool_start` reads it from slurmd's own
spool on this node, never from slurmctld: the credential state slurmd saves when the job ends
(`<SlurmdSpoolDir>/cred_state`) holds, for each job it ran recently, the time it first saw the
job's credential here, which is when the job started on this node.
"""
from __future__ import annotations

import os
import re
import struct
import time
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


SPOOL_DEFAULT = "/var/spool/slurmd"       # SlurmdSpoolDir when slurm.conf does not set it
CRED_STATE_MAX = 4 << 20


def spool_start(env: Mapping[str, str], job_id: str) -> Optional[float]:
    """When this node started the job, from slurmd's saved credential state; None when it
    cannot be told (no slurm.conf, another layout, the job not in it)."""
    from .reader import SkipFile, open_regular
    node = env.get("SLURMD_NODENAME") or ""
    spool = slurmd_spool_dir(env.get("SLURM_CONF") or "/etc/slurm/slurm.conf", node)
    try:
        fd, st = open_regular(os.path.join(spool, "cred_state"), owner=0)
    except SkipFile:
        return None
    try:
        data = os.pread(fd, min(st.st_size, CRED_STATE_MAX), 0)
    except OSError:
        return None
    finally:
        os.close(fd)
    return cred_state_start(data, job_id)


def slurmd_spool_dir(conf: str, node: str) -> str:
    """SlurmdSpoolDir from slurm.conf (`%n` is the node's name, `%h` the host's)."""
    try:
        with open(conf, encoding="utf-8", errors="replace") as f:
            text = f.read(1 << 20)
    except OSError:
        text = ""
    m = re.findall(r"^\s*SlurmdSpoolDir\s*=\s*(\S+)", text, re.I | re.M)
    spool = m[-1] if m else SPOOL_DEFAULT
    return spool.replace("%n", node).replace("%h", os.uname().nodename.split(".")[0])


def cred_state_start(data: bytes, job_id: str) -> Optional[float]:
    """The `ctime` of the job's entry in a cred_state file (Slurm 20.11 .. 22.05: a 32-bit
    count of job states, then per job its 32-bit id and 64-bit revoke, ctime and expiration
    times, all big-endian). None when the bytes do not look like that or the job is absent."""
    if not job_id.isdigit() or len(data) < 4:
        return None
    (count,) = struct.unpack_from(">I", data, 0)
    if len(data) < 4 + 28 * count:
        return None
    for i in range(count):
        jid, _revoked, ctime, _expires = struct.unpack_from(">IQQQ", data, 4 + 28 * i)
        if jid == int(job_id):
            return float(ctime) if 1e9 < ctime <= time.time() + 60 else None
    return None
