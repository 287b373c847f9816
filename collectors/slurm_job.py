"""Controller-side scheduler facts and the job's own output, read with deadlines and care.

Scheduler state comes from pyslurm when it imports and matches the installed Slurm, otherwise
from `scontrol show job -d`, `scontrol show node -o` and `sacct -P` (when accounting works).
The job's stdout/stderr are written by the user: they are read only if they are regular files
owned by the job's user (no symlinks, no FIFOs), and only up to a size cap (head and tail kept).
"""
from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from . import probe, slurm_state
from .reader import SkipFile, open_regular

FINAL_WAIT_STATES = {"COMPLETING", "RUNNING", "CONFIGURING", "SUSPENDED", "STAGE_OUT",
                     "RESIZING", "SIGNALING"}


@dataclass
class SchedulerFacts:
    job_text: str = ""
    nodes_text: str = ""
    sacct_text: str = ""
    source: str = ""
    notes: list = field(default_factory=list)


def scontrol_job(job_id: str, deadline: float) -> tuple[str, str]:
    r = probe.run("scontrol", ["scontrol", "show", "job", "-d", str(job_id)], deadline,
                  max_bytes=4 << 20)
    if r.ok:
        return r.out.decode("utf-8", "replace"), ""
    return "", (r.err.decode("utf-8", "replace").strip() or r.reason)[:300]


def cluster_name(deadline: float) -> Optional[str]:
    """ClusterName from `scontrol show config` (what the hooks see as SLURM_CLUSTER_NAME)."""
    r = probe.run("scontrol", ["scontrol", "show", "config"], deadline, max_bytes=1 << 20)
    m = re.search(r"^ClusterName\s*=\s*(\S+)", r.out.decode("utf-8", "replace"), re.M)
    return m.group(1) if r.ok and m else None


def scontrol_nodes(nodes: list, deadline: float) -> str:
    if not nodes:
        return ""
    from ..engine.hostlist import compress
    r = probe.run("scontrol", ["scontrol", "show", "node", "-o", compress(nodes)], deadline,
                  max_bytes=8 << 20)
    return r.out.decode("utf-8", "replace") if r.ok else ""


def sacct(job_id: str, deadline: float) -> str:
    r = probe.run("sacct", ["sacct", "-j", str(job_id), "-P", "-o",
                            "JobID,JobName,Partition,User,State,ExitCode,Start,End,NodeList",
                            "--duplicates"], deadline, max_bytes=4 << 20)
    return r.out.decode("utf-8", "replace") if r.ok else ""


def pyslurm_job(job_id: str) -> Optional[str]:
    """The job as `scontrol show job` text built from pyslurm, when pyslurm imports and was
    built for the Slurm that is installed; None otherwise (the caller falls back to scontrol)."""
    try:
        import pyslurm  # noqa: PLC0415 - optional, never imported at import time
    except Exception:
        return None
    try:
        lib = pyslurm.version() if hasattr(pyslurm, "version") else ""
        import time
        r = probe.run("scontrol", ["scontrol", "--version"], time.monotonic() + 5,
                      max_bytes=4096)
        installed = re.search(r"(\d+)\.(\d+)", r.out.decode())
        ours = re.search(r"(\d+)\.(\d+)", str(lib))
        if not installed or not ours or installed.groups() != ours.groups():
            return None
        job = pyslurm.Job.load(int(job_id.split("_")[0]))
    except Exception:
        return None
    fields = {"JobId": job_id, "JobName": getattr(job, "name", None),
              "UserId": getattr(job, "user_name", None), "JobState": getattr(job, "state", None),
              "Reason": getattr(job, "state_reason", None),
              "Restarts": getattr(job, "requeue_count", None) or getattr(job, "restart_cnt", 0),
              "NodeList": getattr(job, "nodes", None), "Partition": getattr(job, "partition", None),
              "WorkDir": getattr(job, "working_directory", None),
              "StdOut": getattr(job, "standard_output", None),
              "StdErr": getattr(job, "standard_error", None)}
    return " ".join(f"{k}={v}" for k, v in fields.items() if v not in (None, "")) + "\n"


def wait_final(job_id: str, deadline: float, poll: float = 1.0):
    """`scontrol show job` until the job has left COMPLETING (or the deadline passes)."""
    import time
    text, err = "", ""
    while True:
        text, err = scontrol_job(job_id, min(deadline, time.monotonic() + 10))
        jobs = slurm_state.parse_scontrol(text) if text else []
        if not jobs or (jobs[0].state or "") not in FINAL_WAIT_STATES:
            return text, err
        if time.monotonic() + poll > deadline:
            return text, err
        time.sleep(poll)


# --------------------------------------------------------------------------------------------
# The job's own output
# --------------------------------------------------------------------------------------------


def expand_pattern(pattern: str, job_id: str, name: str = "", user: str = "",
                   node: str = "", array_job: str = "", array_task: str = "") -> str:
    """sbatch filename patterns: %j %J %x %u %N %A %a %t %%; `%3a`-style padding too."""
    def rep(m):
        width, key = m.group(1), m.group(2)
        val = {"j": job_id, "J": job_id, "x": name, "u": user, "N": node, "n": "0", "t": "0",
               "A": array_job or job_id, "a": array_task or "", "s": "batch", "%": "%"}.get(
            key, m.group(0))
        return val.zfill(int(width)) if width and val.isdigit() else val
    return re.sub(r"%(\d*)([jJxuNntAas%])", rep, pattern)


def output_paths(info: dict, extra_globs: list) -> list[str]:
    """StdOut/StdErr of the job plus the site's extra per-rank globs, absolute and unique."""
    work = info.get("WorkDir") or "/"
    paths = []
    for key in ("StdOut", "StdErr"):
        p = info.get(key)
        if not p or p in ("(null)", "/dev/null"):
            continue
        p = expand_pattern(p, info.get("JobId", ""), info.get("JobName", ""),
                           info.get("User", ""), info.get("BatchHost", ""))
        paths.append(p if os.path.isabs(p) else os.path.join(work, p))
    for g in extra_globs:
        g = expand_pattern(g, info.get("JobId", ""), info.get("JobName", ""),
                           info.get("User", ""))
        g = g if os.path.isabs(g) else os.path.join(work, g)
        paths.extend(sorted(glob.glob(g))[:2000])
    seen, out = set(), []
    for p in paths:
        p = os.path.normpath(p)
        if p not in seen:
            seen.add(p)
            out.append(p)
    return out


def copy_output(src: str, dest: Path, owner: Optional[int], cap: int, notes: list) -> bool:
    """Copy one output file safely: regular, owned by the job's user, head+tail within cap."""
    try:
        fd, st = open_regular(src, owner=owner)
    except SkipFile as e:
        notes.append(f"{src}: {e}")
        return False
    try:
        with open(dest, "wb") as out:
            if st.st_size <= cap:
                pos = 0
                while pos < st.st_size:
                    chunk = os.pread(fd, min(8 << 20, st.st_size - pos), pos)
                    if not chunk:
                        break
                    out.write(chunk)
                    pos += len(chunk)
            else:
                half = cap // 2
                out.write(os.pread(fd, half, 0))
                out.write(os.pread(fd, half, st.st_size - half))
                notes.append(f"{src}: {st.st_size} bytes, kept the first and last {half} bytes")
    except OSError as e:
        notes.append(f"{src}: cannot copy ({e.strerror})")
        return False
    finally:
        os.close(fd)
    return True


kv = slurm_state.parse_kv
