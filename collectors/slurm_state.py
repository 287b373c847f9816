"""Scheduler facts: `scontrol show job`, `sacct -P` and `--json` output -> JobInfo.

Pure parsers over text. Several sources may be present; `merge` keeps the first value seen for
each field in the order given (scontrol first: it describes this run of the job).
"""
from __future__ import annotations

import json
import re
from typing import Optional

from ..engine.hostlist import expand
from ..engine.lineparse import TimeContext, parse_stamp_text
from ..engine.models import JobInfo

_KV = re.compile(r"(?:(?<=\s)|^)([A-Za-z][\w:/]*)=(\S*)", re.M)
_TC = TimeContext()


def parse_time(s: Optional[str]) -> Optional[float]:
    """A Slurm time field (`2026-04-12T09:00:00`, `Unknown`) -> epoch seconds or None."""
    if not s or s in ("Unknown", "None", "N/A"):
        return None
    return _TC.epoch(parse_stamp_text(s))


_t = parse_time


def parse_kv(text: str) -> dict:
    """`scontrol show job` text -> the first value of each key, plus User and Uid split out of
    `UserId=alice(41001)`."""
    out: dict = {}
    for k, v in _KV.findall(text):
        out.setdefault(k, v)
    user = out.get("UserId", "")
    out["User"] = user.split("(")[0]
    m = re.search(r"\((\d+)\)", user)
    out["Uid"] = m.group(1) if m else ""
    return out


def _int(s) -> Optional[int]:
    try:
        return int(str(s).split("(")[0])
    except (TypeError, ValueError):
        return None


def parse_scontrol(text: str) -> list[JobInfo]:
    """`scontrol show job [-d]` text: one JobInfo per JobId= record."""
    jobs: list[JobInfo] = []
    cur: dict[str, str] = {}

    def flush():
        if cur:
            jobs.append(_from_kv(cur))

    for line in text.splitlines():
        if line.lstrip().startswith("JobId="):
            flush()
            cur = {}
        for k, v in _KV.findall(line):
            # -d adds per-node lines (Nodes=... CPU_IDs=...): keep the job-level NodeList.
            cur.setdefault(k, v)
    flush()
    return jobs


def _from_kv(kv: dict[str, str]) -> JobInfo:
    tpn = kv.get("NtasksPerN:B:S:C", "").split(":")[0]
    user = kv.get("UserId", "")
    return JobInfo(
        job_id=kv.get("JobId"),
        restart=_int(kv.get("Restarts")) or 0,
        name=kv.get("JobName"),
        user=user.split("(")[0] or None,
        partition=kv.get("Partition"),
        state=kv.get("JobState"),
        reason=kv.get("Reason"),
        exit_code=kv.get("ExitCode"),
        start=_t(kv.get("StartTime")),
        end=_t(kv.get("EndTime")),
        nodes=expand(kv.get("NodeList", "")),
        num_tasks=_int(kv.get("NumTasks")),
        tasks_per_node=_int(tpn) if tpn not in ("", "0") else None,
        batch_host=kv.get("BatchHost"),
    )


def parse_sacct(text: str) -> list[JobInfo]:
    """`sacct -P` (pipe-separated, with header) -> one JobInfo per top-level job record."""
    lines = [ln for ln in text.splitlines() if "|" in ln]
    if not lines:
        return []
    head = [h.strip() for h in lines[0].split("|")]
    idx = {h.lower(): i for i, h in enumerate(head)}
    if "jobid" not in idx and "jobidraw" not in idx:
        return []
    out = []
    for ln in lines[1:]:
        f = ln.split("|")
        if len(f) < len(head):
            continue

        def g(*names):
            for n in names:
                i = idx.get(n.lower())
                if i is not None and f[i].strip():
                    return f[i].strip()
            return None
        jid = g("JobID", "JobIDRaw") or ""
        if "." in jid:
            continue  # steps
        out.append(JobInfo(job_id=jid, name=g("JobName"), user=g("User"),
                           partition=g("Partition"), state=g("State"),
                           exit_code=g("ExitCode"), start=_t(g("Start")), end=_t(g("End")),
                           nodes=expand(g("NodeList") or "")))
    return out


def parse_json(text: str) -> list[JobInfo]:
    """`scontrol show job --json` / `sacct --json` (data_parser v0.0.3x) or a flat record."""
    try:
        data = json.loads(text)
    except ValueError:
        return []
    recs = data.get("jobs") if isinstance(data, dict) and "jobs" in data else [data]
    out = []
    for r in recs or []:
        if not isinstance(r, dict):
            continue
        state = r.get("job_state") or (r.get("state") or {}).get("current")
        if isinstance(state, list):
            state = state[0] if state else None
        times = r.get("time") or {}

        def num(v):
            if isinstance(v, dict):
                return v.get("number") if v.get("set", True) else None
            return v
        start = num(r.get("start_time")) or num(times.get("start"))
        end = num(r.get("end_time")) or num(times.get("end"))
        ec = r.get("exit_code")
        if isinstance(ec, dict):
            rc = num(ec.get("return_code"))
            sig = num((ec.get("signal") or {}).get("id")) if isinstance(ec.get("signal"), dict) else 0
            ec = f"{rc or 0}:{sig or 0}"
        out.append(JobInfo(
            job_id=str(r.get("job_id") or r.get("jobid") or "") or None,
            restart=int(num(r.get("restart_cnt")) or 0),
            cluster=r.get("cluster"),
            name=r.get("name"), user=r.get("user_name") or r.get("user"),
            partition=r.get("partition"), state=state,
            reason=r.get("state_reason") or (r.get("state") or {}).get("reason"),
            exit_code=ec, start=float(start) if start else None,
            end=float(end) if end else None,
            nodes=expand(r.get("nodes") or ""),
            num_tasks=num(r.get("tasks")) if not isinstance(r.get("tasks"), dict) else None,
            batch_host=r.get("batch_host"), own_run=bool(r.get("sattrib_run"))))
    return out


def merge(*infos: Optional[JobInfo]) -> JobInfo:
    out = JobInfo()
    for info in infos:
        if info is None:
            continue
        for f in out.__dataclass_fields__:
            if getattr(out, f) in (None, [], 0) and getattr(info, f) not in (None, []):
                setattr(out, f, getattr(info, f))
    return out
