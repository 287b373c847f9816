"""Scheduler facts: `scontrol show job`, `sacct -P` and `--json` output -> JobInfo.

Pure parsers over text. Several sources may be present; `merge` keeps the first value seen for
each field in the order given (scontrol first: it describes this run of the job).

Read by structure, never by pattern: the job's user writes some of these fields (its name,
comment, command, working directory, output paths, mail address), so a name such as
`x UserId=root(0) StdOut=/root/note` must stay a name. `scontrol show job` prints each record
as lines of keys in an order fixed by Slurm (`_LINES`); a value a user writes runs to the end of
its line, or to the last key Slurm prints after it on that line, so nothing inside it can start
a key. A line break inside such a value can still imitate whole lines: a line printed twice or
out of Slurm's order makes the record ambiguous, and an ambiguous record yields its job id only.
`rule_view` is what the rules read of these files: Slurm's own fields, with every byte a user
chose blanked out and the line numbers kept.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Optional

from ..engine.hostlist import expand
from ..engine.lineparse import TimeContext, parse_stamp_text
from ..engine.models import JobInfo

_TC = TimeContext()


def parse_time(s: Optional[str]) -> Optional[float]:
    """A Slurm time field (`2026-04-12T09:00:00`, `Unknown`, epoch seconds from --json)
    -> epoch seconds or None."""
    if not s or s in ("Unknown", "None", "N/A"):
        return None
    if s.isdigit():
        return float(s) or None
    return _TC.epoch(parse_stamp_text(s))


_t = parse_time

# -- scontrol show job ------------------------------------------------------------------------

# The lines of one record in Slurm's order, 22.05 .. 25.11 (slurm_sprint_job_info in
# src/api/job_info.c; src/scontrol/info_job.c since 24.11), each with its keys in order.
_LINES = (
    "JobId ArrayJobId ArrayTaskId ArrayTaskThrottle HetJobId HetJobOffset JobName",
    "SLUID", "HetJobIdSet", "UserId GroupId MCS_label", "Priority Nice Account QOS WCKey",
    "JobState Reason FailedNode Dependency", "Requeue Restarts BatchFlag Reboot ExitCode",
    "DerivedExitCode", "RunTime TimeLimit TimeMin", "SubmitTime EligibleTime", "AccrueTime",
    "ResizeTime", "StartTime EndTime Deadline", "CronJob CrontabSpec",
    "PreemptEligibleTime PreemptTime", "SuspendTime SecsPreSuspend LastSchedEval Scheduler",
    "Partition AllocNode:Sid", "ReqNodeList ExcNodeList", "NodeList SchedNodeList",
    "BatchFeatures BatchHost", "StepMgrEnabled", "FedOrigin FedViableSiblings FedActiveSiblings",
    "NumNodes NumCPUs NumTasks CPUs/Task ReqB:S:C:T", "TRES", "ReqTRES", "AllocTRES",
    "Socks/Node NtasksPerN:B:S:C CoreSpec ThreadSpec", "JOB_GRES", "Nodes CPU_IDs Mem GRES",
    "MinCPUsNode MinMemoryNode MinMemoryCPU MinTmpDiskNode", "Features DelayBoot",
    "ClusterFeatures", "Prefer", "Reservation",
    "OverSubscribe Contiguous Licenses LicensesAlloc Network", "Command", "SubmitLine",
    "WorkDir", "AdminComment", "SystemComment", "Comment", "Extra", "StdErr", "StdIn", "StdOut",
    "SegmentSize SpreadSegments ConsolidateSegments", "Switches", "BurstBuffer",
    "BurstBufferState", "CPU_min_freq CPU_max_freq Governor", "Power",
    "GresAllowTaskSharing GresEnforceBind GresOneTaskPerSharing KillOInInvalidDependent "
    "KillOnInvalidDependent SpreadJob ExpeditedRequeue", "OOMKillStep", "CpusPerTres",
    "MemPerTres", "TresBind", "TresFreq", "TresPerJob", "TresPerNode", "TresPerSocket",
    "TresPerTask", "MailUser MailType", "NtasksPerTRES", "Container ContainerID",
    "SELinuxContext", "ResvPorts",
)
_LINE_OF = {k: i for i, line in enumerate(_LINES) for k in line.split()}
# Keys that start a line: the first of each, and those whose line starts with them when the
# keys before them are not printed.
_STARTS = {line.split()[0] for line in _LINES} | {
    "CrontabSpec", "BatchHost", "CPU_max_freq", "Governor", "GresEnforceBind",
    "GresOneTaskPerSharing", "KillOInInvalidDependent", "KillOnInvalidDependent", "SpreadJob",
    "ExpeditedRequeue"}
# Values the user (or the client they run) writes as any text, spaces and line breaks included.
_FREE_TEXT = frozenset(
    "JobName MCS_label Account QOS WCKey CrontabSpec AllocNode:Sid Network Command SubmitLine "
    "WorkDir AdminComment SystemComment Comment Extra StdErr StdIn StdOut BurstBuffer MailUser "
    "Container ContainerID SELinuxContext".split())
# Values the user chooses within Slurm's own syntax (no spaces): the rules read none of them.
_USER_CHOSEN = _FREE_TEXT | frozenset(
    "BatchFeatures Features ClusterFeatures Prefer Licenses LicensesAlloc CpusPerTres MemPerTres "
    "TresBind TresFreq TresPerJob TresPerNode TresPerSocket TresPerTask MailType".split())
_TRAILING_SPACE = {"AdminComment", "SystemComment", "Comment"}   # printed as "Comment=%s "
_KEY = re.compile(r"([A-Za-z][\w:/]*)=")
_TOKEN = re.compile(r"\S*")
_RECORD = re.compile(r"^JobId=\d", re.M)
_INDENTED = re.compile(r" {2,}([A-Za-z][\w:/]*)=")
_SPACED_KEY = re.compile(r" +([A-Za-z][\w:/]*)=")


@dataclass
class _Field:
    key: str
    at: int           # where `key=` starts in the text
    start: int        # the value: text[start:end]
    end: int


@dataclass
class JobRecord:
    """One `scontrol show job` record: its fields in the order printed, and why it cannot be
    read safely (empty when it can)."""
    text: str
    fields: list = field(default_factory=list)
    ambiguous: str = ""

    def values(self) -> dict:
        out: dict = {}
        for f in self.fields:
            if f.key not in out:
                v = self.text[f.start:f.end]
                out[f.key] = v[:-1] if f.key in _TRAILING_SPACE and v.endswith(" ") else v
        return out

    @property
    def job_id(self) -> str:
        return next((self.text[f.start:f.end] for f in self.fields if f.key == "JobId"), "")


def job_records(text: str) -> list[JobRecord]:
    """Every record of `scontrol show job [-d] [-o]` text (one starts at a line `JobId=N`).
    Two records of one job are both ambiguous: one was written into a field of the other."""
    starts = [m.start() for m in _RECORD.finditer(text)]
    recs = [_record(text, a, b) for a, b in zip(starts, starts[1:] + [len(text)])]
    ids = [r.job_id for r in recs]
    for r in recs:
        if ids.count(r.job_id) > 1:
            r.ambiguous = r.ambiguous or f"{ids.count(r.job_id)} records of job {r.job_id}"
    return recs


def _record(text: str, a: int, b: int) -> JobRecord:
    rec = JobRecord(text)
    body = text[a:b].rstrip()
    b = a + len(body)
    lines = _logical_lines(text, a, b) if "\n" in body else _one_liner_lines(text, a, b)
    last = -1
    for s, e in lines:
        fields = _line_fields(text, s, e)
        if not fields:
            continue
        index = _LINE_OF[fields[0].key]          # a line starts with a key of _STARTS
        if index < last or (index == last and fields[0].key != "Nodes"):
            rec.ambiguous = rec.ambiguous or (
                f"{fields[0].key}= appears out of Slurm's order or twice: a field the user "
                "wrote holds a line break or a field name")
        last = max(last, index)
        rec.fields += fields
    return rec


def _logical_lines(text: str, a: int, b: int) -> list[tuple[int, int]]:
    """The lines of a multi-line record: an indented physical line that starts with a key of
    `_STARTS` begins one; any other physical line continues the value before it (a line break
    inside a value the user wrote)."""
    out: list[list[int]] = []
    pos = a
    while pos < b:
        nl = text.find("\n", pos, b)
        end = b if nl < 0 else nl
        m = _INDENTED.match(text, pos, end)
        if pos == a:
            out.append([pos, end])
        elif m and m.group(1) in _STARTS:
            out.append([m.start(1), end])
        else:
            out[-1][1] = end
        pos = end + 1
    return [(s, e) for s, e in out]


def _one_liner_lines(text: str, a: int, b: int) -> list[tuple[int, int]]:
    """`scontrol -o`: Slurm's lines joined by one space; each begins at ` Key=` of `_STARTS`."""
    cuts = [a] + [m.start(1) for m in _SPACED_KEY.finditer(text, a, b) if m.group(1) in _STARTS]
    return [(s, e - 1) for s, e in zip(cuts, cuts[1:])] + [(cuts[-1], b)]


def _line_fields(text: str, s: int, e: int) -> list[_Field]:
    """The fields of one line. A token ends at white space; a free-text value runs to the last
    ` Key=` of a key Slurm prints after it on this line, else to the end of the line."""
    out: list[_Field] = []
    pos = s
    keys: list[str] = []
    while pos < e:
        m = _KEY.match(text, pos, e)
        if not m:
            break
        key = m.group(1)
        if not out:
            keys = _LINES[_LINE_OF[key]].split() if key in _LINE_OF else []
        if key in _FREE_TEXT:
            end = e
            for later in keys[keys.index(key) + 1:] if key in keys else []:
                i = text.rfind(f" {later}=", m.end(), e)
                if i >= 0:
                    end = i
                    break
        else:
            end = m.end() + len(_TOKEN.match(text, m.end(), e).group())
        out.append(_Field(key, m.start(), m.end(), end))
        pos = end
        while pos < e and text[pos] in " \t\n":
            pos += 1
    return out


def _identity(kv: dict) -> dict:
    """User and Uid split out of `UserId=alice(41001)`; the output paths only where Slurm
    prints them (batch jobs): on any other job such a line was written into another field."""
    user = kv.get("UserId", "")
    m = re.fullmatch(r"(.*)\((\d+)\)", user)
    kv["User"], kv["Uid"] = (m.group(1), m.group(2)) if m else (user, "")
    if kv.get("BatchFlag") == "0":
        for k in ("StdErr", "StdIn", "StdOut"):
            kv.pop(k, None)
    return kv


def parse_kv(text: str, job_id: Optional[str] = None) -> dict:
    """The record of `job_id` (else the first) in `scontrol show job` text or --json, keyed as
    scontrol names the fields, plus User and Uid. A record that cannot be read safely (see
    `job_records`) gives {"JobId", "Ambiguous": why}."""
    if text.lstrip().startswith("{"):
        return _json_kv(text, job_id)
    recs = job_records(text)
    want = str(job_id) if job_id is not None else (recs[0].job_id if recs else "")
    rec = next((r for r in recs if _is_job(r.values(), want)), None)
    if rec is None:
        return {}
    if rec.ambiguous:
        return {"JobId": rec.job_id, "Ambiguous": rec.ambiguous}
    return _identity(rec.values())


def _is_job(kv: dict, want: str) -> bool:
    """`want` names this job: its id, or `ARRAYJOB_TASK` (both printed before any user text)."""
    return want in (kv.get("JobId"), f"{kv.get('ArrayJobId')}_{kv.get('ArrayTaskId')}")


def _int(s) -> Optional[int]:
    try:
        return int(str(s).split("(")[0])
    except (TypeError, ValueError):
        return None


def parse_scontrol(text: str, notes: Optional[list] = None) -> list[JobInfo]:
    """`scontrol show job [-d]` text: one JobInfo per record (its job id only when ambiguous,
    and then a line in `notes` says why)."""
    out = []
    for rec in job_records(text):
        if rec.ambiguous and notes is not None:
            notes.append(f"the record of job {rec.job_id} cannot be read safely "
                         f"({rec.ambiguous}): only its job id is used")
        out.append(JobInfo(job_id=rec.job_id) if rec.ambiguous
                   else _from_kv(_identity(rec.values())))
    return out


def _from_kv(kv: dict) -> JobInfo:
    tpn = kv.get("NtasksPerN:B:S:C", "").split(":")[0]
    return JobInfo(
        job_id=kv.get("JobId"),
        restart=_int(kv.get("Restarts")) or 0,
        name=kv.get("JobName"),
        user=kv.get("User") or None,
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


# -- sacct -P -----------------------------------------------------------------------------------

# Columns whose value the user writes (any text, `|` and line breaks included); the rules read
# none of them.
_SACCT_FREE = frozenset(
    "jobname comment admincomment systemcomment workdir submitline constraints container extra "
    "wckey mcslabel stdout stderr stdin account qos reservation".split())


def _sacct_rows(text: str):
    """(header, its (start, end), [[(column start, end)] of each row]) of `sacct -P` text (the
    header is its first line with a `|`). A row cut short by a line break inside a value goes on over the
    next lines; a `|` inside a value is given to the one free-text column of the row (with
    several, the columns between them stay unknown)."""
    lines, pos = [], 0
    for ln in text.split("\n"):
        lines.append((pos, ln))
        pos += len(ln) + 1
    head_at = next((i for i, (_, ln) in enumerate(lines) if "|" in ln), None)
    head = [h.strip().lower() for h in lines[head_at][1].split("|")] if head_at is not None \
        else []
    if not {"jobid", "jobidraw"} & set(head):
        return [], None, []
    free = [i for i, h in enumerate(head) if h in _SACCT_FREE]
    rows, i = [], head_at + 1
    while i < len(lines):
        start, row = lines[i]
        while (row.count("|") < len(head) - 1 and row[:1].isdigit()
               and i + 1 < len(lines)):
            i += 1
            row += "\n" + lines[i][1]
        i += 1
        if row.count("|") < len(head) - 1:
            continue
        rows.append(_sacct_columns(row, start, len(head), free))
    at = lines[head_at][0]
    return head, (at, at + len(lines[head_at][1])), rows


def _sacct_columns(row: str, start: int, n: int, free: list) -> list:
    """(start, end) of each column of one row, None for a column that cannot be told."""
    bounds, pos = [], start
    for part in row.split("|"):
        bounds.append((pos, pos + len(part)))
        pos += len(part) + 1
    extra = len(bounds) - n
    if not extra:
        return bounds
    if len(free) == 1:
        f = free[0]
        return bounds[:f] + [(bounds[f][0], bounds[f + extra][1])] + bounds[f + extra + 1:]
    lo, hi = (free[0], free[-1]) if free else (0, n - 1)
    return bounds[:lo] + [None] * (hi - lo + 1) + bounds[len(bounds) - (n - hi - 1):]


def parse_sacct(text: str) -> list[JobInfo]:
    """`sacct -P` (pipe-separated, with header) -> one JobInfo per top-level job record."""
    head, _, rows = _sacct_rows(text)
    idx = {h: i for i, h in enumerate(head)}
    out = []
    for cols in rows:
        def g(*names):
            for n in names:
                i = idx.get(n.lower())
                if i is not None and cols[i] is not None and text[slice(*cols[i])].strip():
                    return text[slice(*cols[i])].strip()
            return None
        jid = g("JobID", "JobIDRaw") or ""
        if "." in jid or not re.fullmatch(r"[\d_+\[\]-]+", jid):
            continue  # steps, and what is no job id
        out.append(JobInfo(job_id=jid, name=g("JobName"), user=g("User"),
                           partition=g("Partition"), state=g("State"),
                           exit_code=g("ExitCode"), start=_t(g("Start")), end=_t(g("End")),
                           nodes=expand(g("NodeList") or "")))
    return out


# -- --json ------------------------------------------------------------------------------------

def _num(v):
    """A --json number: plain, or {"set": true, "number": N} (data_parser v0.0.39 on)."""
    if isinstance(v, dict):
        return v.get("number") if v.get("set", True) else None
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _str(v) -> Optional[str]:
    return v if isinstance(v, str) and v else None


def _json_records(text: str) -> list[dict]:
    try:
        data = json.loads(text)
    except ValueError:
        return []
    recs = data.get("jobs") if isinstance(data, dict) and "jobs" in data else [data]
    return [r for r in recs or [] if isinstance(r, dict)]


def _json_state(r: dict) -> tuple[Optional[str], Optional[str]]:
    """(state, reason) of a --json job: scontrol's `job_state` is a string or a list of flags
    (scontrol's text names a job with COMPLETING among them COMPLETING), sacct's `state` is
    {"current", "reason"}."""
    st = r.get("state") if isinstance(r.get("state"), dict) else {}
    state = r.get("job_state") or st.get("current")
    if isinstance(state, list):
        state = "COMPLETING" if "COMPLETING" in state else (state[0] if state else None)
    return _str(state), _str(r.get("state_reason") or st.get("reason"))


def _json_exit(ec) -> Optional[str]:
    if isinstance(ec, dict):
        sig = ec.get("signal")
        sig = _num(sig.get("id")) if isinstance(sig, dict) else 0
        return f"{_num(ec.get('return_code')) or 0}:{sig or 0}"
    return _str(ec)


def parse_json(text: str) -> list[JobInfo]:
    """`scontrol show job --json` / `sacct --json` (data_parser v0.0.3x on) or a flat record."""
    out = []
    for r in _json_records(text):
        times = r.get("time") if isinstance(r.get("time"), dict) else {}
        start = _num(r.get("start_time")) or _num(times.get("start"))
        end = _num(r.get("end_time")) or _num(times.get("end"))
        state, reason = _json_state(r)
        tasks = _num(r.get("tasks"))
        out.append(JobInfo(
            job_id=str(_num(r.get("job_id")) or _str(r.get("job_id")) or _num(r.get("jobid"))
                       or "") or None,
            restart=int(_num(r.get("restart_cnt")) or 0),
            cluster=_str(r.get("cluster")),
            name=_str(r.get("name")), user=_str(r.get("user_name")) or _str(r.get("user")),
            partition=_str(r.get("partition")), state=state, reason=reason,
            exit_code=_json_exit(r.get("exit_code")), start=float(start) if start else None,
            end=float(end) if end else None,
            nodes=expand(_str(r.get("nodes")) or ""),
            num_tasks=int(tasks) if tasks is not None else None,
            batch_host=_str(r.get("batch_host")), own_run=bool(r.get("sattrib_run")),
            snapshots=_snapshots(r.get("snapshots")) if r.get("sattrib_run") else []))
    return out


SNAPSHOT_STATES = ("present", "missing", "not_due")


def _snapshots(v) -> list:
    """sattrib's record of the run: [{"node", "state", "reason"}] -> (node, state, reason)."""
    if not isinstance(v, list):
        return []
    return [(s["node"][:256], s["state"], _str(s.get("reason"))) for s in v[:100_000]
            if isinstance(s, dict) and isinstance(s.get("node"), str)
            and s.get("state") in SNAPSHOT_STATES]


# scontrol's names of the --json fields (data_parser v0.0.38 .. v0.0.44, and pyslurm's record).
_JSON_KEYS = {"name": "JobName", "user_name": "User", "partition": "Partition",
              "batch_host": "BatchHost", "nodes": "NodeList",
              "current_working_directory": "WorkDir", "standard_output": "StdOut",
              "standard_error": "StdErr", "excluded_nodes": "ExcNodeList"}
_JSON_NUMBERS = {"job_id": "JobId", "user_id": "Uid", "restart_cnt": "Restarts",
                 "array_job_id": "ArrayJobId", "array_task_id": "ArrayTaskId",
                 "tasks": "NumTasks", "start_time": "StartTime", "end_time": "EndTime"}


def _json_kv(text: str, job_id: Optional[str]) -> dict:
    """A --json job record keyed as `parse_kv` keys scontrol's text."""
    for r in _json_records(text):
        kv = {k: r[j] for j, k in _JSON_KEYS.items() if _str(r.get(j))}
        kv.update({k: str(int(_num(r.get(j)))) for j, k in _JSON_NUMBERS.items()
                   if _num(r.get(j)) is not None})
        if job_id is not None and not _is_job(kv, str(job_id)):
            continue
        state, reason = _json_state(r)
        kv.update({k: v for k, v in (("JobState", state), ("Reason", reason),
                                     ("ExitCode", _json_exit(r.get("exit_code")))) if v})
        if isinstance(r.get("batch_flag"), bool):
            kv["BatchFlag"] = str(int(r["batch_flag"]))
        if kv.get("ArrayJobId") == "0":
            kv.pop("ArrayJobId")
        return kv
    return {}


# -- what the rules read -----------------------------------------------------------------------

def _blank(s: str) -> str:
    return re.sub(r"[^\n]", " ", s)


def _keep(text: str, spans) -> str:
    """`text` with everything outside `spans` ((start, end), sorted) blanked, lines kept."""
    out, pos = [], 0
    for s, e in spans:
        out += [_blank(text[pos:s]), text[s:e]]
        pos = e
    return "".join(out + [_blank(text[pos:])])


def record_kind(text: str) -> Optional[str]:
    """Which scheduler record a file under slurm/ holds ("slurm_json", "sacct", "slurm_job"),
    None for none (a log): by its first line (a job's name may hold a line `JobId=...`), then
    by a record anywhere in it (whatever is pasted above the record, it is read as one)."""
    if text.lstrip().startswith("{"):
        return "slurm_json"
    if re.match(r"\s*JobID(?:Raw)?\|", text):
        return "sacct"
    if re.search(r"^\s*JobId=\d", text, re.M):
        return "slurm_job"
    if re.search(r"^JobID(?:Raw)?\|", text, re.M):
        return "sacct"
    return None


def rule_view(kind: str, text: str, job_id: Optional[str] = None) -> str:
    """What the rules may read of a scheduler record (`kind` as the evidence folder names it):
    the same lines, Slurm's own fields only. Of `scontrol show job` text the keys and values
    Slurm writes in the records of `job_id` (a record of another job may be one a user wrote
    into a field); of `sacct -P` every column but the free-text ones; of --json one
    `JobState=S Reason=R` line per job at its `"job_state"`. A record that cannot be read
    safely shows nothing past its job id."""
    if kind == "slurm_job":
        spans = []
        for rec in job_records(text):
            mine = job_id is None or rec.job_id == job_id
            spans += [(f.at, f.end) for f in rec.fields
                      if f.key in _LINE_OF and f.key not in _USER_CHOSEN
                      and ((mine and not rec.ambiguous) or f.key == "JobId")]
        return _keep(text, spans)
    if kind == "sacct":
        head, at, rows = _sacct_rows(text)
        spans = [at] if at else []
        for cols in rows:
            spans += [c for h, c in zip(head, cols) if c is not None and h not in _SACCT_FREE]
            # The column separators stay: a blanked name still leaves the State column third.
            spans += [(c[1], c[1] + 1) for c in cols[:-1] if c is not None]
        return _keep(text, sorted(spans))
    if kind in ("slurm_json", "run_record"):
        return _json_view(text, job_id)
    return text


def _json_view(text: str, job_id: Optional[str]) -> str:
    lines = [""] * (text.count("\n") + 1)
    at = [text.count("\n", 0, m.start()) for m in re.finditer(r'"job_state"\s*:', text)]
    for n, r in zip(at, _json_records(text)):
        if job_id is not None and str(_num(r.get("job_id")) or r.get("job_id")) != job_id:
            continue
        state, reason = _json_state(r)
        if state and re.fullmatch(r"[A-Z_]+", state):
            lines[n] = f"JobState={state}" + (
                f" Reason={reason}" if reason and re.fullmatch(r"\S+", reason) else "")
    return "\n".join(lines)


def merge(*infos: Optional[JobInfo]) -> JobInfo:
    out = JobInfo()
    for info in infos:
        if info is None:
            continue
        for f in out.__dataclass_fields__:
            if getattr(out, f) in (None, [], 0) and getattr(info, f) not in (None, []):
                setattr(out, f, getattr(info, f))
    return out
