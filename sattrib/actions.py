"""Acting on a stored diagnosis: escalation, drain, requeue around the culprit, notifications.

Run by the controller worker (and `sattrib collect`) after the diagnosis is stored. The engine's
diagnosis JSON stays a function of the evidence alone: what is decided here depends on the
cluster's state and history, so it is stored beside it (tables `actions` and `escalations`,
and `actions.json` in the bundle) and shown with it, never written into it.

Etiquette (after LBNL NHC): a node is drained only for an `attributed` diagnosis that is the
machine's fault (engine.taxonomy.machine_fault: blamed on the machine, not on job output alone)
and whose action takes the node out of service (engine.taxonomy.SERVICE), nor contradicted by a
second source on the node (the decision is then "held"); a node that is
already drained, down or reserved, or carries a reason, is left as it is; at most
`drain_max_per_hour` nodes an hour and `drain_max_partition_percent` of a partition (at least
one node) are drained, past that the decision is "would-drain"; only drains whose diagnosis
passes the trust checks count against those limits. A worker that cannot get the drain lock
records the decision as "held" and drains nothing. Every decision is recorded. Every scontrol
call ends by `action_timeout_s`; a failure is a recorded decision, never an exception.

Webhooks: at most `notify_max_per_hour`; past it, and for a task of a job array whose failure
was notified within the hour, the notification is "held", and the queue's last worker sends
one summary of what is held when the queue is empty.

A failure that a cross-job incident explains (sattrib.incidents) has its drain held and its
notification left to the incident's one webhook; one that an incident could still explain is
"deferred", and decided when the queue is empty (incidents.settle).
"""
from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

from .collectors import probe
from .engine.hostlist import compress, expand
from .engine.taxonomy import LADDER, blame_of, ladder_rank, machine_fault, out_of_service

log = logging.getLogger("sattrib.actions")

REASON_PREFIX = "sattrib:"
BUSY_STATES = ("DRAIN", "DOWN", "FAIL", "MAINT", "RESERVED", "REBOOT", "POWER")


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _machine_fault(cause: Optional[dict]) -> bool:
    """The cause is its node's: blamed on the machine, on evidence the job did not write."""
    return bool(cause and cause.get("node") and cause.get("trust")
                and machine_fault(blame_of(cause["category"], cause.get("blame")),
                                  cause["trust"]))


# -- repeat offenders ---------------------------------------------------------------------------
def culprit_key(root: dict) -> tuple[str, str, list]:
    """(label, SQL condition, args) naming the root cause's GPU, or its node without one."""
    if root.get("gpu_serial"):
        return (f"GPU serial {root['gpu_serial']} on {root['node']}", "gpu_serial = ?", [root["gpu_serial"]])
    if root.get("gpu_uuid"):
        return (f"GPU {root['gpu_uuid']} on {root['node']}", "gpu_uuid = ?", [root["gpu_uuid"]])
    if root.get("gpu"):
        return (f"GPU {root['gpu']} on {root['node']}", "culprit_node = ? AND culprit_gpu = ?",
                [root["node"], root["gpu"]])
    return (f"node {root['node']}", "culprit_node = ?", [root["node"]])


def escalation(conn, did: str, d: dict, st, now: float) -> Optional[dict]:
    """The same GPU (or node) as the culprit of `repeat_threshold` failed jobs that ended within
    `repeat_window_days`, each the machine's fault (store.cause_columns): the action moves up
    the ladder reset_gpu -> reboot_node -> drain_node one step at the threshold and one more
    at each further multiple of it."""
    root = d.get("root_cause")
    if d.get("outcome") != "attributed" or not _machine_fault(root):
        return None
    label, cond, args = culprit_key(root)
    since = _iso(now - st.repeat_window_days * 86400)
    rows = conn.execute(
        "SELECT cluster, job_id, restart, category, ended_at FROM diagnoses "
        f"WHERE {cond} AND machine_fault = 1 AND ended_at >= ? AND id != ? "
        "ORDER BY ended_at, id", args + [since, did]).fetchall()
    cluster, job_id = did.split("/")[0], d.get("job_id")
    earlier, seen = [], {(cluster, job_id)}
    for c, j, r, cat, at in rows:
        if (c, j) not in seen:
            seen.add((c, j))
            earlier.append({"cluster": c, "job_id": j, "restart": r, "category": cat,
                            "ended_at": at})
    failures = len(earlier) + 1
    k = st.repeat_threshold
    if failures < k:
        return None
    base = root["action_code"]
    # Below the ladder, a culprit without a GPU starts past the GPU reset.
    rank = ladder_rank(base) or (0 if root.get("gpu") else 1)
    to = LADDER[min(rank + (failures - k) // k, len(LADDER) - 1)]
    return {"culprit": label, "node": root["node"], "gpu": root.get("gpu"),
            "failures": failures, "threshold": k, "window_days": st.repeat_window_days,
            "from": base, "to": to, "earlier_jobs": earlier}


# -- Slurm ----------------------------------------------------------------------------------------
def _scontrol(args: list, timeout: float):
    return probe.run("scontrol", ["scontrol", *args], time.monotonic() + timeout,
                     max_bytes=4 << 20)


def _err(r) -> str:
    text = (r.err or r.out).decode("utf-8", "replace").strip()
    return (text.splitlines()[-1] if text else r.reason)[:300]


def _kv(line: str) -> dict:
    """`Key=Value Key=Value ...` of `scontrol -o show node`; Reason (the last key there) keeps
    its spaces, as does a value such as OS=Linux 6.1 #1 SMP."""
    out, key = {}, None
    for tok in line.split(" "):
        k, eq, v = tok.partition("=")
        if eq and re.fullmatch(r"[A-Za-z/:_]+", k) and key != "Reason":
            key, out[k] = k, v
        elif key:
            out[key] += " " + tok
    return out


def node_info(node: str, timeout: float) -> tuple[Optional[dict], str]:
    r = _scontrol(["show", "node", "-o", node], timeout)
    if not r.ok:
        return None, _err(r)
    line = r.out.decode("utf-8", "replace").strip().splitlines()
    return (_kv(line[0]) if line else None), ("" if line else "no output")


def reason_text(info: dict) -> str:
    """The reason without the `[user@time]` Slurm appends."""
    r = (info.get("Reason") or "").strip()
    return re.sub(r"\s*\[[^\]]*@[^\]]*\]$", "", r) if r not in ("(null)", "none") else ""


def drain_reason(d: dict, node: str) -> str:
    root = d["root_cause"]
    short = " ".join((root.get("summary") or "").replace('"', "'").split())
    return f"{REASON_PREFIX}{d.get('job_id')} {root['category']} {short}"[:120].rstrip()


class _Lock:
    """One drain (or notification) decision at a time across workers: the rate limits count
    each other's. `with _Lock(...) as held`: held is False when another worker kept the lock
    past `timeout`; the caller then records the decision as held and does nothing, since
    deciding without the lock could pass a limit."""

    def __init__(self, path: Path, timeout: float):
        self.path, self.timeout, self.fd = path, timeout, None

    def __enter__(self) -> bool:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o640)
        end = time.monotonic() + self.timeout
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except BlockingIOError:
                if time.monotonic() > end:
                    return False
                time.sleep(0.1)

    def __exit__(self, *exc):
        os.close(self.fd)


def _drain_refusal(d: dict, node: Optional[str]) -> Optional[str]:
    """Why the trust checks refuse to drain `node` for diagnosis `d`; None when they pass.
    The rate limits count only drains whose diagnosis passes them, so diagnoses made from what
    a user wrote never spend the drain budget."""
    if d.get("outcome") != "attributed":
        return (f"outcome {d.get('outcome')}: sattrib never drains on an ambiguous or "
                "unattributed diagnosis")
    root = d.get("root_cause") or {}
    if root.get("trust") == "job_output":
        return "the root cause rests on the job's own output only"
    if not _machine_fault(root):
        try:
            blame = blame_of(root["category"], root.get("blame")).value
        except (KeyError, ValueError):
            blame = "no known category"
        return f"{root.get('category')} is not the machine's fault ({blame})"
    job_nodes = (d.get("job") or {}).get("nodes") or []
    if not job_nodes:
        return "the job's node list is unknown: sattrib drains only a node that ran the job"
    if node not in job_nodes:
        return f"{node} did not run this job"
    return None


def _counted_drains(conn, did: str, since: float) -> list[str]:
    """The nodes of the drains (taken or dry-run) since `since` that spent the budget: those
    whose diagnosis, as stored now, passes the trust checks (one entry per drain)."""
    rows = conn.execute(
        "SELECT a.node, x.diagnosis_json FROM actions a JOIN diagnoses x ON x.id = "
        "a.diagnosis_id WHERE a.kind = 'drain' AND a.decision IN ('taken', 'dry-run') AND "
        "a.created_at >= ? AND a.diagnosis_id != ?", [_iso(since), did]).fetchall()
    return [n for n, dj in rows if _drain_refusal(_loads(dj), n) is None]


def _loads(text: Optional[str]) -> dict:
    try:
        d = json.loads(text or "{}")
    except ValueError:
        return {}
    return d if isinstance(d, dict) else {}


def drain_target(d: dict, action: str, st) -> Optional[str]:
    """The node a drain is proposed for (the culprit, when its action takes the node out of
    service and draining is on), or None."""
    root = d.get("root_cause")
    causes = [root] if root else d.get("candidates") or []
    if st.drain == "off" or not any(c.get("node") and out_of_service(
            action if c is root else c.get("action_code")) for c in causes):
        return None
    return (root or causes[0]).get("node")


def decide_drain(conn, did: str, d: dict, action: str, st, now: float,
                 locked: bool = True) -> Optional[dict]:
    """One recorded decision about draining the culprit, or None when nothing proposes it.
    `locked`: whether this worker holds the drain lock; without it the decision is held."""
    node = drain_target(d, action, st)
    if node is None:
        return None
    root = d.get("root_cause")

    def out(decision, detail, command=None):
        return {"kind": "drain", "decision": decision, "node": node, "detail": detail,
                "command": command, "created_at": _iso(now)}

    refusal = _drain_refusal(d, node)
    if refusal:
        return out("refused", refusal)
    if root.get("contradicted_by"):
        # A second source on the node says otherwise: the kernel line alone does not drain it.
        return out("held", f"{root['contradicted_by']}: the kernel line alone drains nothing")
    cluster, job_id = did.split("/")[0], d.get("job_id")
    done = conn.execute(
        "SELECT a.node FROM actions a JOIN diagnoses x ON x.id = a.diagnosis_id WHERE "
        "x.cluster = ? AND x.job_id = ? AND a.diagnosis_id != ? AND a.kind = 'drain' AND "
        "a.decision IN ('taken', 'dry-run')", [cluster, job_id, did]).fetchone()
    if done:
        return out("refused", f"this job already drained {done[0]} (once per job)")
    info, err = node_info(node, st.action_timeout_s)
    if info is None:
        return out("failed", f"cannot read the state of {node}: {err}")
    state, reason = info.get("State", ""), reason_text(info)
    if reason.startswith(REASON_PREFIX):
        return out("refused", f"{node} is already drained by sattrib ({reason})")
    if reason or any(s in state.upper() for s in BUSY_STATES):
        return out("refused", f"{node} left as it is: state {state}"
                              + (f", reason {reason!r} set by someone else" if reason else ""))
    if not locked:
        return out("held", "lock busy: another worker kept the drain lock; not drained "
                           "(deciding without it could pass the rate limits)")
    spent = _counted_drains(conn, did, now - 3600)
    hour = len(spent)              # drains, not nodes: a node drained twice counts twice
    if hour >= st.drain_max_per_hour:
        return out("would-drain", f"rate limit: {hour} drains in the last hour "
                                  f"(drain_max_per_hour = {st.drain_max_per_hour})")
    partition = ((d.get("job") or {}).get("partition") or info.get("Partitions") or "")
    partition = partition.split(",")[0]
    if partition:
        r = probe.run("sinfo", ["sinfo", "-h", "-N", "-p", partition, "-o", "%N|%E"],
                      time.monotonic() + st.action_timeout_s, max_bytes=8 << 20)
        if not r.ok:
            return out("failed", f"cannot read partition {partition}: {_err(r)}")
        members: dict = {}
        for ln in r.out.decode("utf-8", "replace").splitlines():
            n, _, why = ln.partition("|")
            members[n.strip()] = why.strip()
        ours = {n for n, why in members.items() if why.startswith(REASON_PREFIX)
                and _spends_budget(conn, n, why)}
        if st.drain == "dry-run":
            ours |= {n for n in spent if n in members}
        allowed = max(1, int(len(members) * st.drain_max_partition_percent / 100))
        if len(ours - {node}) + 1 > allowed:
            return out("would-drain", f"partition limit: {len(ours)} of {len(members)} nodes "
                       f"of {partition} drained by sattrib (drain_max_partition_percent = "
                       f"{st.drain_max_partition_percent:g}, at most {allowed})")
    reason = drain_reason(d, node)
    cmd = ["update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}"]
    shown = f'scontrol update NodeName={node} State=DRAIN Reason="{reason}"'
    if st.drain == "dry-run":
        return out("dry-run", "would drain (drain = \"dry-run\")", shown)
    r = _scontrol(cmd, st.action_timeout_s)
    if not r.ok:
        return out("failed", f"scontrol update failed: {_err(r)}", shown)
    return out("taken", f"drained ({action})", shown)


def _spends_budget(conn, node: str, reason: str) -> bool:
    """A node sattrib drained (its reason `sattrib:JOB ...`) counts against the partition's
    share unless every diagnosis of that job that drained it now fails the trust checks."""
    job = reason[len(REASON_PREFIX):].split(" ", 1)[0]
    rows = conn.execute(
        "SELECT x.diagnosis_json FROM actions a JOIN diagnoses x ON x.id = a.diagnosis_id "
        "WHERE a.kind = 'drain' AND a.decision = 'taken' AND a.node = ? AND x.job_id = ?",
        [node, job]).fetchall()
    return not rows or any(_drain_refusal(_loads(dj), node) is None for (dj,) in rows)


def requeue_around(d: dict, st, now: float) -> Optional[dict]:
    """The culprit of a machine's fault kept out of the job's next run, in a partition that
    opted in: for a run Slurm requeued itself (`requeue_exclude_partitions`), it joins the
    job's excluded nodes before the next run starts; for a run that ended failed
    (`requeue_partitions`), sattrib requeues the job itself with the culprit excluded, at most
    `requeue_max_restarts` times. (Slurm 22.05's `scontrol update` takes no `ExcNodeList+=`:
    the list is read, extended and set.)"""
    root = d.get("root_cause")
    partition = ((d.get("job") or {}).get("partition") or "").split(",")[0]
    exclude, requeue = (partition in st.requeue_exclude_partitions,
                        partition in st.requeue_partitions)
    if (not (exclude or requeue) or d.get("outcome") != "attributed"
            or not _machine_fault(root)):
        return None
    job = _settled_job(str(d.get("job_id")), st)
    if job is None:
        return None
    run = int(d.get("restart") or 0)
    restarts = int(job.get("Restarts") or 0) if (job.get("Restarts") or "").isdigit() else 0
    if job.get("JobState") in ("PENDING", "REQUEUED") and restarts > run:
        return _exclude(d, job, st, now) if exclude else None
    if requeue and restarts == run and job.get("JobState") in FAILED_STATES:
        return _requeue(d, job, restarts, st, now)
    return None                           # Slurm does not run this job again


# Final states of a run that failed (not completed, cancelled, timed out or preempted).
FAILED_STATES = ("FAILED", "NODE_FAIL", "BOOT_FAIL")


def _settled_job(job_id: str, st) -> Optional[dict]:
    """`scontrol show job` of the job once it has finished completing (its epilogs ran), or
    None when Slurm cannot say within `action_timeout_s`."""
    from .collectors.slurm_state import parse_kv
    end = time.monotonic() + st.action_timeout_s
    while True:
        r = _scontrol(["show", "job", job_id], st.action_timeout_s)
        if not r.ok:
            return None
        job = parse_kv(r.out.decode("utf-8", "replace"), job_id)   # no state if ambiguous
        if job.get("JobState") != "COMPLETING" or time.monotonic() > end:
            return job
        time.sleep(0.5)


def _excluded(job: dict, node: str) -> tuple[list, str]:
    exc = [n for n in expand(job.get("ExcNodeList") or "") if n and n != "(null)"]
    return exc, compress(sorted(set(exc) | {node}))


def _exclude(d: dict, job: dict, st, now: float) -> dict:
    node, job_id = d["root_cause"]["node"], d.get("job_id")
    exc, new = _excluded(job, node)
    shown = f"scontrol update JobId={job_id} ExcNodeList={new}"
    row = {"kind": "requeue", "node": node, "command": shown, "created_at": _iso(now)}
    if node in exc:
        return dict(row, decision="refused", detail=f"{node} is already excluded")
    r = _scontrol(["update", f"JobId={job_id}", f"ExcNodeList={new}"], st.action_timeout_s)
    if not r.ok:
        return dict(row, decision="failed", detail=f"scontrol update failed: {_err(r)}")
    return dict(row, decision="taken", detail=f"the next run of job {job_id} excludes {node}")


def _requeue(d: dict, job: dict, restarts: int, st, now: float) -> dict:
    """Requeue held, exclude the culprit, release: the job cannot start again on the culprit
    in between."""
    root, job_id = d["root_cause"], d.get("job_id")
    node = root["node"]
    _, new = _excluded(job, node)
    cmds = [["requeuehold", str(job_id)], ["update", f"JobId={job_id}", f"ExcNodeList={new}"],
            ["release", str(job_id)]]
    row = {"kind": "requeue", "node": node, "created_at": _iso(now),
           "command": "; ".join("scontrol " + " ".join(c) for c in cmds)}
    if root.get("contradicted_by"):
        return dict(row, decision="held", detail=f"{root['contradicted_by']}: not requeued")
    if restarts >= st.requeue_max_restarts:
        return dict(row, decision="refused", detail=f"job {job_id} ran {restarts + 1} times "
                    f"(requeue_max_restarts = {st.requeue_max_restarts})")
    r = _scontrol(cmds[0], st.action_timeout_s)
    if not r.ok:
        return dict(row, decision="failed", detail=f"scontrol requeuehold failed: {_err(r)}")
    excluded = _scontrol(cmds[1], st.action_timeout_s)
    released = _scontrol(cmds[2], st.action_timeout_s)
    if not excluded.ok or not released.ok:
        return dict(row, decision="failed", detail="requeued, but scontrol "
                    + ("update" if not excluded.ok else "release") + " failed: "
                    + _err(excluded if not excluded.ok else released))
    return dict(row, decision="taken", detail=f"requeued job {job_id} (run {restarts + 2}), "
                f"excluding {node}")


# -- notifications --------------------------------------------------------------------------------
def dashboard_link(st, did: str) -> Optional[str]:
    if not st.dashboard_url:
        return None
    from urllib.parse import quote
    cluster, job, restart = did.split("/")
    return (f"{st.dashboard_url.rstrip('/')}/diagnosis/{quote(cluster, safe='')}/"
            f"{quote(job, safe='')}/{restart}")


def payload(did: str, d: dict, acts: list, esc: Optional[dict], st) -> dict:
    """The webhook body: the diagnosis summary, no evidence text (that is admin-only)."""
    root = d.get("root_cause") or {}
    link = dashboard_link(st, did)
    summary = root.get("summary") or d.get("explanation") or d.get("outcome")
    culprit = {k: root.get(k) for k in ("node", "gpu", "rank")} if root else None
    done = [f"{a['kind']} {a['node'] or ''}: {a['decision']}".replace(" :", ":")
            for a in acts]
    text = (f"sattrib: job {d.get('job_id')} on {did.split('/')[0]}: {d.get('outcome')}"
            + (f" {root['category']} on {root.get('node')}" if root else "")
            + f" - {summary}. Action: {d.get('action')}"
            + (f". Repeat offender: {esc['culprit']}, {esc['failures']} failed jobs in "
               f"{esc['window_days']:g} days, escalated to {esc['to']}" if esc else "")
            + (f". {'; '.join(done)}" if done else "") + (f" <{link}>" if link else ""))
    return {"id": did, "job_id": d.get("job_id"), "restart": d.get("restart"),
            "cluster": did.split("/")[0], "outcome": d.get("outcome"),
            "category": root.get("category"), "culprit": culprit, "summary": summary,
            "action": d.get("action"), "action_code": d.get("action_code"),
            "escalation": esc, "actions": acts, "dashboard_url": link, "text": text}


def notify(body: dict, st) -> dict:
    """POST the body to notify_url, with a timeout and retries. Never raises."""
    import requests
    err = ""
    for attempt in range(st.notify_retries + 1):
        if attempt:
            time.sleep(min(2 ** (attempt - 1), 4))
        try:
            r = requests.post(st.notify_url, json=body, timeout=st.notify_timeout_s)
            if r.status_code < 300:
                return {"decision": "taken", "detail": f"sent: HTTP {r.status_code}"}
            err = f"HTTP {r.status_code}"
            if r.status_code < 500 and r.status_code != 429:
                break                    # the request itself is refused: retrying won't help
        except requests.RequestException as e:
            err = type(e).__name__ + (f": {e}"[:200] if str(e) else "")
    log.warning("notify %s failed: %s", body.get("id"), err)
    return {"decision": "failed", "detail": f"not sent after {attempt + 1} attempts: {err}"}


# At most notify_max_per_hour webhooks an hour; what is held goes out in one summary later.
SUMMARY_MAX = 500               # held notifications per summary (the rest: the next one)


def _notify_lock(st) -> tuple[Path, float]:
    """The lock every notification decision takes, and how long to wait for it: one whole
    notify() (each try, the pauses between them) and a margin."""
    wait = st.notify_timeout_s * (st.notify_retries + 1) + 4 * st.notify_retries + 5
    return Path(st.bundle_dir) / ".locks" / "notify", wait


def _webhooks_since(conn, since: float) -> int:
    """Webhooks sent or tried since `since`: the diagnoses' and the incidents' (one each)."""
    return conn.execute(
        "SELECT (SELECT count(*) FROM actions WHERE kind = 'notify' AND decision IN "
        "('taken', 'failed') AND created_at >= :t) + (SELECT count(*) FROM incidents WHERE "
        "notify_decision IN ('taken', 'failed') AND notified_at >= :t)",
        {"t": _iso(since)}).fetchone()[0]


def _array_of(bundle: Optional[Path], did: str) -> Optional[str]:
    """"<cluster>/<array job id>" when the run is a job array's task (the bundle's run record
    says so), else None."""
    try:
        rec = json.loads((bundle / "slurm" / "sattrib-run.json").read_text()) if bundle else {}
    except (OSError, ValueError):
        return None
    array = rec.get("array_job_id") if isinstance(rec, dict) else None
    return f"{did.split('/')[0]}/{array}" if array else None


def _array_notified(conn, group: Optional[str], since: float) -> Optional[str]:
    """The job id of a task of the same job array whose notification was decided since
    `since` (sent, held or failed), or None."""
    if not group:
        return None
    r = conn.execute(
        "SELECT x.job_id FROM actions a JOIN diagnoses x ON x.id = a.diagnosis_id WHERE "
        "a.kind = 'notify' AND a.group_key = ? AND a.created_at >= ? LIMIT 1",
        [group, _iso(since)]).fetchone()
    return r[0] if r else None


def _notify_or_hold(db, did: str, acts: list, esc: Optional[dict], body: dict, st,
                    now: float, group: Optional[str]) -> dict:
    """Send the webhook now, or hold it for the next summary: when notify_max_per_hour
    webhooks went out in the last hour, or another task of the same job array (`group`) was
    notified within the hour. Decided and recorded under the notification lock."""
    def row(decision: str, detail: str) -> dict:
        return {"kind": "notify", "decision": decision, "node": None, "detail": detail,
                "command": None, "created_at": _iso(now), "group_key": group}

    path, wait = _notify_lock(st)
    with _Lock(path, wait) as locked:
        if not locked:
            return row("held", "lock busy: another worker kept the notification lock; "
                               "in the next summary")
        conn = db.db.conn
        sent = _webhooks_since(conn, now - 3600)
        sibling = _array_notified(conn, group, now - 3600)
        if sent >= st.notify_max_per_hour:
            r = row("held", f"rate limit: {sent} webhooks in the last hour (notify_max_per_hour"
                            f" = {st.notify_max_per_hour}); in the next summary")
        elif sibling:
            r = row("held", f"job {sibling} of the same job array was notified within the "
                            "hour; in the next summary")
        else:
            r = dict(row("", ""), **notify(body, st))
        db.record_actions(did, acts + [r], esc)
        return r


def summary_payload(rows: list, st) -> dict:
    """The webhook body for held notifications: per job array (else per user), the jobs and
    their causes (category and culprit node); no job names and no evidence text."""
    groups: dict = {}
    for _did, _seq, group, cluster, job_id, user, category, node, outcome, _at in rows:
        g = groups.setdefault(group or (cluster, user), {
            "cluster": cluster, "user": user, "array_job_id": group.split("/")[-1] if group
            else None, "jobs": [], "causes": {}})
        g["jobs"].append(job_id)
        cause = f"{category} on {node}" if category and node else (category or outcome)
        g["causes"][cause] = g["causes"].get(cause, 0) + 1
    parts = []
    for g in groups.values():
        ids = ", ".join(g["jobs"][:10]) + (
            f" and {len(g['jobs']) - 10} more" if len(g["jobs"]) > 10 else "")
        causes = ", ".join(f"{c} x{n}" for c, n in sorted(g["causes"].items(),
                                                          key=lambda kv: (-kv[1], kv[0])))
        who = (f"job array {g['array_job_id']} of user {g['user'] or '?'}"
               if g["array_job_id"] else f"user {g['user'] or '?'}")
        parts.append(f"{who} on {g['cluster']}: {len(g['jobs'])} failed job(s) ({ids}): "
                     f"{causes}")
    link = st.dashboard_url or None
    since = rows[0][-1]
    text = (f"sattrib: {len(rows)} notifications held since {since} (rate limit or job "
            f"arrays): " + "; ".join(parts) + (f" <{link}>" if link else ""))
    return {"kind": "summary", "held": len(rows), "since": since,
            "groups": list(groups.values()), "dashboard_url": link, "text": text}


def send_held(db, st, now: Optional[float] = None) -> Optional[dict]:
    """One webhook summarising the held notifications (the SUMMARY_MAX oldest), when the
    hour's limit allows; they then become "summarised". The queue's last worker calls it when
    the queue is empty. The summary's own decision, or None when none was sent."""
    if not st.notify_url:
        return None
    now = time.time() if now is None else now
    conn = db.db.conn
    path, wait = _notify_lock(st)
    with _Lock(path, wait) as locked:
        rows = conn.execute(
            "SELECT a.diagnosis_id, a.seq, a.group_key, x.cluster, x.job_id, x.user, "
            "x.category, x.culprit_node, x.outcome, a.created_at FROM actions a JOIN diagnoses "
            "x ON x.id = a.diagnosis_id WHERE a.kind = 'notify' AND a.decision = 'held' "
            "ORDER BY a.created_at, a.diagnosis_id LIMIT ?", [SUMMARY_MAX]).fetchall()
        sent = _webhooks_since(conn, now - 3600)
        if not locked or not rows or sent >= st.notify_max_per_hour:
            if rows:
                log.info("%d notifications stay held (%s)", len(rows), "lock busy" if not
                         locked else f"{sent} webhooks in the last hour")
            return None
        r = dict(notify(summary_payload(rows, st), st), kind="notify", node=None,
                 command=None, created_at=_iso(now))
        r["detail"] = f"summary of {len(rows)} held notifications: {r['detail']}"
        done = [(did, seq, "summarised", f"in the summary sent at {_iso(now)}")
                for did, seq, *_ in rows] if r["decision"] == "taken" else []
        db.amend_actions(done, (rows[-1][0], r))
    log.info("%s", r["detail"])
    return r


# A user name as POSIX spells a portable one: never an option to mail_prog (no leading `-`).
MAIL_USER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*")


def mail(body: dict, user: str, st) -> dict:
    """`mail_prog -s SUBJECT USER` with the text on stdin, as Slurm's MailProg is run (with no
    `--`, which a site's MailProg script may not expect): USER is the job's user as slurmctld
    names it, and only a portable user name (MAIL_USER) is ever passed."""
    subject = f"sattrib: job {body['job_id']} {body['outcome']}" + (
        f" ({body['category']})" if body.get("category") else "")
    text = (f"{body['summary']}\n\nAction: {body['action']}\n\n"
            f"Details: sattrib {body['job_id']}\n"
            + (f"{body['dashboard_url']}\n" if body.get("dashboard_url") else ""))
    r = probe.run("mail", [st.mail_prog, "-s", subject, user],
                  time.monotonic() + st.action_timeout_s, input=text.encode(),
                  max_bytes=1 << 16)
    if r.ok:
        return {"decision": "taken", "detail": f"mailed {user}"}
    log.warning("mail to %s failed: %s", user, _err(r))
    return {"decision": "failed", "detail": f"mail to {user} failed: {_err(r)}"}


# -- the whole step -------------------------------------------------------------------------------
def act(db, did: str, diagnosis, st, bundle: Optional[Path] = None,
        now: Optional[float] = None, hold=None) -> dict:
    """Decide and record everything about one stored diagnosis; {"actions", "escalation",
    "incident"}. `hold`: how a cross-job incident holds its drain and notification
    (sattrib.incidents.act passes it). A run already acted on keeps its decisions (a replay
    never drains twice)."""
    conn = db.db.conn
    old = conn.execute("SELECT count(*) FROM actions WHERE diagnosis_id = ?", [did]).fetchone()
    if old[0]:
        return stored(conn, did)
    now = time.time() if now is None else now
    d = json.loads(diagnosis.model_dump_json()) if hasattr(diagnosis, "model_dump_json") \
        else diagnosis
    esc = escalation(conn, did, d, st, now)
    action = esc["to"] if esc else ((d.get("root_cause") or {}).get("action_code")
                                    or d.get("action_code"))
    acts: list = []
    node = drain_target(d, action, st)
    if hold and node:
        acts.append(hold.row("drain", node, now))
    elif not hold:
        lock = Path(st.bundle_dir) / did.split("/")[0] / ".locks" / "drain"
        with _Lock(lock, st.action_timeout_s * 3) as locked:
            dr = decide_drain(conn, did, d, action, st, now, locked)
            if dr:
                acts.append(dr)
                db.record_actions(did, acts, esc)   # seen by the next worker's rate limits
    rq = requeue_around(d, st, now)
    if rq:
        acts.append(rq)
    root = d.get("root_cause")
    body = payload(did, d, acts, esc, st)
    if st.notify_url and (_machine_fault(root) and d.get("outcome") == "attributed" or esc
                          or any(a["decision"] in ("taken", "would-drain") for a in acts)):
        acts.append(hold.row("notify", None, now) if hold else _notify_or_hold(
            db, did, acts, esc, body, st, now, _array_of(bundle, did)))
    user = (d.get("job") or {}).get("user")
    if st.mail_prog and user and MAIL_USER.fullmatch(user):
        acts.append(dict(mail(body, user, st), kind="mail", node=None, command=None,
                         created_at=_iso(now)))
    db.record_actions(did, acts, esc)
    for a in acts:
        log.info("%s %s %s: %s", did, a["kind"], a["decision"], a["detail"])
    result = {"actions": [{k: v for k, v in a.items() if k != "group_key"} for a in acts],
              "escalation": esc, "incident": hold.incident if hold else None}
    if bundle is not None:
        _write_bundle(bundle, result)
    return result


def _write_bundle(bundle: Path, result: dict) -> None:
    """actions.json next to diagnosis.json: the job's user reads it as they read that."""
    try:
        tmp = bundle / ".actions.json.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o640)
        with os.fdopen(fd, "w") as f:
            os.fchmod(fd, 0o640)              # like diagnosis.json: the bundle's group, ACL
            gid = os.stat(bundle).st_gid
            if gid != os.getegid():
                try:
                    os.fchown(fd, -1, gid)
                except PermissionError:
                    pass
            f.write(json.dumps(result, indent=2, sort_keys=True) + "\n")
        os.replace(tmp, bundle / "actions.json")
    except OSError as e:
        log.warning("cannot write %s/actions.json: %s", bundle, e)


def stored(conn, did: str) -> dict:
    """The recorded actions and escalation of one diagnosis (empty when none)."""
    try:
        acts = [dict(zip(("kind", "decision", "node", "detail", "command", "created_at"), r))
                for r in conn.execute(
                    "SELECT kind, decision, node, detail, command, created_at FROM actions "
                    "WHERE diagnosis_id = ? ORDER BY seq", [did])]
        e = conn.execute("SELECT culprit, node, gpu, failures, window_days, from_action, "
                         "to_action, earlier_jobs FROM escalations WHERE diagnosis_id = ?",
                         [did]).fetchone()
    except Exception:                   # a database from before the actions migration
        return {"actions": [], "escalation": None}
    esc = None
    if e:
        esc = {"culprit": e[0], "node": e[1], "gpu": e[2], "failures": e[3],
               "window_days": e[4], "from": e[5], "to": e[6], "earlier_jobs": json.loads(e[7])}
    return {"actions": acts, "escalation": esc}


def resume(node: str, timeout: float, db=None) -> str:
    """`sattrib resume NODE`: back to service only what sattrib drained; recorded in `db`
    (when given) beside the drain it undoes, so the node leaves the dashboard's drain list."""
    from .errors import UserError
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", node):
        raise UserError(f"not a node name: {node!r}", "give one node, e.g. sattrib resume gpu-a017")
    info, err = node_info(node, timeout)
    if info is None:
        raise UserError(f"cannot read the state of {node}: {err}",
                        "check the node name (scontrol show node NODE) and that slurmctld is up")
    reason, state = reason_text(info), info.get("State", "")
    if not reason.startswith(REASON_PREFIX):
        why = f"its reason is {reason!r}" if reason else "it has no reason set"
        raise UserError(f"{node} ({state}) was not drained by sattrib: {why}",
                        f"sattrib only resumes nodes whose reason starts with {REASON_PREFIX}; "
                        f"if you mean it: scontrol update NodeName={node} State=RESUME")
    r = _scontrol(["update", f"NodeName={node}", "State=RESUME"], timeout)
    if not r.ok:
        raise UserError(f"scontrol could not resume {node}: {_err(r)}",
                        "resuming a node needs SlurmUser or root")
    if db is not None:
        record_resume(db, node, reason, time.time())
    return f"{node}: resumed (was {state}, reason {reason!r})"


def record_resume(db, node: str, reason: str, now: float) -> None:
    """A resume, as a decision of the diagnosis whose drain it undoes (the job the reason
    `sattrib:JOB ...` names); nothing when no recorded drain matches."""
    job = reason[len(REASON_PREFIX):].split(" ", 1)[0]
    row = db.db.conn.execute(
        "SELECT a.diagnosis_id FROM actions a JOIN diagnoses x ON x.id = a.diagnosis_id "
        "WHERE a.kind = 'drain' AND a.decision = 'taken' AND a.node = ? AND x.job_id = ? "
        "ORDER BY a.created_at DESC LIMIT 1", [node, job]).fetchone()
    if row:
        db.amend_actions([], (row[0], {
            "kind": "resume", "decision": "taken", "node": node, "created_at": _iso(now),
            "detail": f"returned to service by sattrib resume (reason was {reason!r})",
            "command": f"scontrol update NodeName={node} State=RESUME"}))
