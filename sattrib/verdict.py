"""The user's verdict on a failed job, in words and as an exit status: was it my code, can I
resubmit and how do I avoid that node, how much did I lose.

A job script or retry wrapper runs `sattrib verdict $SLURM_JOB_ID` and acts on the status
(EXIT); a person reads the same sentence as the first line of `sattrib JOBID`."""
from __future__ import annotations

import textwrap
from datetime import datetime
from typing import Optional

from .engine.taxonomy import blame_of

# `sattrib verdict` exit status per blame: clear of 0 (no failure), 1 (error) and 2 (usage).
EXIT = {"machine": 10, "site_environment": 11, "scheduler": 12, "workload": 13, "unknown": 14}

# What failed, in the user's words, for the machine's and the site's categories.
PART = {"gpu_hardware": "GPU{gpu}", "gpu_memory_ecc": "the memory of GPU{gpu}",
        "pcie": "the PCIe link of GPU{gpu}", "thermal_power": "cooling or power of GPU{gpu}",
        "nvlink": "NVLink of GPU{gpu}", "nvswitch_fabric": "the NVSwitch fabric",
        "network_ib": "the network link", "network_config": "the network settings",
        "storage_io": "the filesystem", "software_incompat": "the driver install",
        "scheduler_node_failure": "the node"}


def job_blame(d: dict) -> str:
    """The diagnosis' blame; for one stored before diagnoses carried it, from its causes."""
    if d.get("blame"):
        return d["blame"]
    try:
        blames = {blame_of(c["category"], c.get("blame")).value for c in _causes(d)}
    except (KeyError, ValueError):
        return "unknown"
    return blames.pop() if d.get("outcome") != "unattributed" and len(blames) == 1 else "unknown"


def lost_seconds(d: dict) -> Optional[float]:
    """From the root cause's first line to the job's end: the time the job ran on, broken."""
    first = (d.get("root_cause") or {}).get("first_seen")
    end = (d.get("job") or {}).get("end")
    if not first or not end:
        return None
    try:
        s = (_when(end) - _when(first)).total_seconds()
    except ValueError:
        return None
    return s if s >= 0 else None


def _when(iso: str) -> datetime:
    return datetime.fromisoformat(iso.replace("Z", "+00:00"))


def duration(s: float) -> str:
    """12 s, 10 min, 2 h 14 min, 3 d 2 h."""
    s = int(round(s))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min"
    if s < 86400:
        return f"{s // 3600} h" + (f" {s % 3600 // 60} min" if s % 3600 // 60 else "")
    return f"{s // 86400} d" + (f" {s % 86400 // 3600} h" if s % 86400 // 3600 else "")


def _out_of_service(node: str, acted: dict) -> bool:
    """The culprit is drained: by sattrib for this job, earlier, or by someone else."""
    for a in acted.get("actions") or []:
        if a.get("kind") != "drain" or a.get("node") != node:
            continue
        detail = a.get("detail") or ""
        if a.get("decision") == "taken" or "already drained" in detail or (
                "left as it is: state" in detail and any(s in detail for s in ("DRAIN", "DOWN"))):
            return True
    return False


def _requeued(node: str, acted: dict) -> bool:
    return any(a.get("kind") == "requeue" and a.get("node") == node
               and a.get("decision") == "taken" for a in acted.get("actions") or [])


def _causes(d: dict) -> list[dict]:
    return [d["root_cause"]] if d.get("root_cause") else d.get("candidates") or []


def exclude(d: dict) -> list[str]:
    """The nodes to keep a resubmitted job away from: the culprits of the machine's fault."""
    if job_blame(d) != "machine":
        return []
    return sorted({c["node"] for c in _causes(d) if c.get("node")})


def _part(c: dict) -> str:
    part = PART.get(c.get("category"), c.get("category") or "the machine")
    part = part.format(gpu=f" {c['gpu']}" if c.get("gpu") else "")
    return f"{part} on {c['node']}" if c.get("node") else part


def _machine(d: dict, acted: dict) -> str:
    causes, nodes = _causes(d), exclude(d)
    where = " or ".join(_part(c) for c in causes) or "the machine"
    if not nodes:
        advice = "Resubmit"
    elif all(_requeued(n, acted) for n in nodes):
        advice = f"sattrib requeued the job without {', '.join(nodes)}"
    elif all(_out_of_service(n, acted) for n in nodes):
        advice = f"Resubmit; {', '.join(nodes)} {'is' if len(nodes) == 1 else 'are'} drained"
    else:
        advice = f"Resubmit with --exclude={','.join(nodes)}"
    if all(c.get("trust") == "job_output" for c in causes):
        return f"Probably not your code: only your job's output says {where} failed. {advice}"
    return f"Not your code: {where} failed. {advice}"


def sentence(d: dict, acted: Optional[dict] = None) -> str:
    """The verdict in one sentence, for the job's user."""
    blame, root = job_blame(d), d.get("root_cause") or {}
    if blame == "machine":
        return _machine(d, acted or {})
    if blame == "site_environment":
        return (f"Not your code: {' or '.join(_part(c) for c in _causes(d))} failed (shared by "
                "the nodes, not one machine). Resubmit from your last checkpoint once it is fixed")
    if blame == "workload":
        frames = root.get("user_frames") or []
        at = f" at {frames[0]['file']}:{frames[0]['line']}" if frames else ""
        return f"Your job's own error: {root.get('summary') or 'see below'}{at}"
    if blame == "scheduler":
        return f"Not a fault: the scheduler ended the job ({root.get('summary') or 'see below'})"
    if d.get("outcome") == "ambiguous":
        return ("Not known whose fault: several causes fit; "
                + "; ".join(f"{c['category']} on {c.get('node') or '?'}" for c in _causes(d)))
    return "Not known whose fault: nothing in the evidence proves a cause"


def lines(d: dict, acted: Optional[dict] = None, width: int = 80) -> list[str]:
    """The verdict sentence and the time lost, wrapped to `width` columns."""
    text = sentence(d, acted)
    lost = lost_seconds(d)
    if lost is not None and d.get("outcome") == "attributed" and job_blame(d) != "scheduler":
        text += f"; {duration(lost)} lost (fault to job end)"
    return textwrap.wrap(text + ".", width, subsequent_indent="  ",
                         break_on_hyphens=False, break_long_words=False)
