"""Cross-job incidents: a leaf switch, a rack, a PDU, an NVLink domain or a file system that takes
down every job behind it is one incident, not one failure per job.

Run by the controller worker (and `sattrib collect`) after a diagnosis is stored, like the
actions (sattrib.actions), and like them beside the diagnosis, never in it. A stored failure
whose cause an element could explain (a network fault or a node failure behind a switch, a
node failure, power or a lost GPU behind a rack, PDU or chassis, an NVLink fault in an NVLink
domain, a storage fault naming a file system; a failure with no cause at all behind a switch,
rack, PDU or chassis) joins the open incident of an element that covers it, or opens one when
the stored failures within `incident_window_s` of it behind one element are enough: at least
`incident_min_jobs` jobs on `incident_min_nodes` of its nodes, one of them naming a cause the
element explains, and (but for a file system, which every node uses) reaching at least
`incident_min_failed_share` of the element's nodes that ran jobs then: a switch whose other
ports' jobs ran on is not the suspect (Slurm's record of the jobs that ran, collectors/
node_jobs.py). Of the elements that qualify, the one covering the most failures wins, then the
narrowest: a leaf whose spine's other leaves ran on.

What it changes: a member's drain is held and its notification is left to the incident's one
webhook. A failure an element could explain but no incident holds yet waits ("deferred"): the
queue's last worker decides it when the queue is empty (`settle`), by then as a member of the
incident the rest of the storm opened, or as on its own. An incident opened after a member's
node was drained gives that node back (only a drain sattrib made for that job).
"""
from __future__ import annotations

import json
import logging
import os
import re
import time
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

from .collectors.topology import Element
from .engine.hostlist import compress, expand

log = logging.getLogger("sattrib.incidents")

NETWORK = frozenset({"network_ib", "network_config", "scheduler_node_failure"})
POWER = frozenset({"scheduler_node_failure", "thermal_power", "gpu_hardware"})
NVLINK = frozenset({"nvlink", "nvswitch_fabric"})
STORAGE = frozenset({"storage_io"})
# Each kind of element: the failures it explains, the incident's action code, what to do.
KINDS = {
    "leaf switch": (NETWORK, "inspect_network_link", "inspect {label} and its links to {nodes}"),
    "spine switch": (NETWORK, "inspect_network_link", "inspect {label} and its links to {nodes}"),
    "rack": (POWER, "check_cooling_power", "check the power and cooling of {label} ({nodes})"),
    "pdu": (POWER, "check_cooling_power", "check {label} and what it feeds ({nodes})"),
    "chassis": (POWER, "check_cooling_power", "check {label} ({nodes})"),
    "nvlink domain": (NVLINK, "inspect_nvlink", "inspect the NVLink fabric of {label} ({nodes})"),
    "filesystem": (STORAGE, "check_storage", "check {label}: its servers and mounts"),
}
EXPLAINED = frozenset().union(*(k[0] for k in KINDS.values()))
# A node cut off or without power may leave no evidence at all: a failure with no cause named
# may join these.
SILENT = frozenset({"leaf switch", "spine switch", "rack", "pdu", "chassis"})
# The jobs behind an element that ran on: they ran through the failures and did not fail.
RAN = frozenset({"RUNNING", "COMPLETING", "COMPLETED", "SUSPENDED"})


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _epoch(stamp) -> Optional[float]:
    try:
        return datetime.strptime(str(stamp)[:19], "%Y-%m-%dT%H:%M:%S").replace(
            tzinfo=timezone.utc).timestamp()
    except ValueError:
        return None


def span(seconds: float) -> str:
    """`within 40 seconds`, `within 2 minutes`, `within 3 hours`."""
    n, unit = ((round(seconds), "second") if seconds < 90 else
               (round(seconds / 60), "minute") if seconds < 5400 else
               (round(seconds / 3600), "hour"))
    return f"within {max(n, 1)} {unit}{'' if max(n, 1) == 1 else 's'}"


# -- one failure ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Failure:
    did: str
    job_id: str
    restart: int
    at: float                   # the job's end
    categories: frozenset       # the causes its diagnosis names (root, candidates, possible)
    nodes: frozenset            # where: those causes' nodes, else the affected, else the job's
    outcome: str
    filesystems: frozenset      # a storage fault's NFS server, Lustre file system or mount


_NFS = re.compile(r"nfs: server (\S+) not responding")
_LUSTRE = re.compile(r"\b([A-Za-z0-9_]{1,8})-(?:OST|MDT)[0-9a-fA-F]{4}\b")
_PATH = re.compile(r"'(/[^'\x00]{0,4096})'")


def filesystems(d: dict, causes: list, mounts: list) -> frozenset:
    """What a storage fault names: the NFS server or Lustre file system its kernel lines name,
    or the network mount (of `mounts`, the controller's) a path in its lines lies under. Paths
    a job printed are only ever matched against those mount points by name."""
    ev = {e["id"]: e for e in d.get("evidence") or []}
    out = set()
    for c in causes:
        if c.get("category") not in STORAGE:
            continue
        for e in (ev.get(i) for i in c.get("evidence") or []):
            text = (e or {}).get("text") or ""
            if (e or {}).get("source") in ("kernel", "system"):
                out |= {f"NFS server {m}" for m in _NFS.findall(text)}
                out |= {f"Lustre {m}" for m in _LUSTRE.findall(text)}
            for path in _PATH.findall(text):
                inside = [m for m in mounts if path == m or path.startswith(m.rstrip("/") + "/")]
                if inside:
                    out.add(max(inside, key=len))
    return frozenset(out)


def failure_of(did: str, d: dict, mounts: list = ()) -> Optional[Failure]:
    """The failure an element could explain, or None (a job's own fault, a scheduler's
    decision, a failure with no end time)."""
    root = d.get("root_cause")
    causes = [root] if root else (d.get("candidates") or []) + (d.get("possible") or [])
    cats = frozenset(c["category"] for c in causes if c.get("category"))
    named = cats & EXPLAINED
    job = d.get("job") or {}
    at = _epoch(job.get("end") or (root or {}).get("first_seen"))
    if at is None or not (named or (d.get("outcome") == "unattributed" and not cats)):
        return None
    nodes = ({c["node"] for c in causes if c.get("node") and c.get("category") in named}
             or set(d.get("affected_nodes") or []) or set(job.get("nodes") or []))
    return Failure(did, str(d.get("job_id")), int(d.get("restart") or 0), at, named,
                   frozenset(nodes), d.get("outcome") or "", filesystems(d, causes, list(mounts)))


def explains(kind: str, f: Failure) -> bool:
    return bool(f.categories & KINDS[kind][0]) or (not f.categories and kind in SILENT)


def covers(e: Element, f: Failure) -> bool:
    if e.kind == "filesystem":
        return e.name in f.filesystems
    return bool(f.nodes & e.nodes) and explains(e.kind, f)


def covering(f: Failure, elements: list) -> list:
    """The elements that could explain this failure: those behind which it failed, and the
    file systems its storage fault names."""
    return [e for e in elements if covers(e, f)] + [
        Element("filesystem", name, frozenset(), "the jobs' storage errors", name)
        for name in sorted(f.filesystems)]


# -- whether an element is the suspect ------------------------------------------------------------
@dataclass
class Verdict:
    element: Element
    members: list
    failed_nodes: frozenset
    ran_on: list                # Slurm's jobs behind it that ran through the failures
    why_not: str                # empty when it qualifies


def judge(e: Element, failures: list, ran: Optional[list], st) -> Verdict:
    """Whether the failures behind `e` make it the suspect (pure). `ran`: the jobs Slurm
    says ran on the nodes then (None: Slurm did not say; the failures alone decide)."""
    members = [f for f in failures if covers(e, f)]
    failed = frozenset().union(*(f.nodes & e.nodes if e.nodes else f.nodes for f in members))
    v = Verdict(e, members, failed, [], "")
    if len(members) < st.incident_min_jobs:
        v.why_not = f"{len(members)} jobs failed behind it (incident_min_jobs = {st.incident_min_jobs})"
    elif len(failed) < st.incident_min_nodes:
        v.why_not = (f"its failures were on {len(failed)} node(s) (incident_min_nodes = "
                     f"{st.incident_min_nodes})")
    elif not any(f.categories for f in members):
        v.why_not = "none of its failures names a cause it would explain"
    if v.why_not or not e.nodes or ran is None:
        return v
    first, last = min(f.at for f in members), max(f.at for f in members)
    ids = {f.job_id for f in members}
    v.ran_on = sorted((j for j in ran if j.job_id not in ids and j.state in RAN and j.nodes & e.nodes
                       and j.start is not None and j.start <= last
                       and (j.end is None or j.end >= first)), key=lambda j: j.job_id)
    healthy = frozenset().union(*(j.nodes & e.nodes for j in v.ran_on)) - failed
    busy = len(failed | healthy)
    if len(failed) < st.incident_min_failed_share * busy:
        v.why_not = (f"{len(failed)} of its {busy} busy nodes failed: jobs on "
                     f"{compress(sorted(healthy))} ran on ({len(v.ran_on)} jobs; "
                     f"incident_min_failed_share = {st.incident_min_failed_share:g})")
    return v


def choose(verdicts: list) -> Optional[Verdict]:
    """Of the elements that qualify, the one covering the most failures, then the narrowest."""
    ok = [v for v in verdicts if not v.why_not]
    return min(ok, key=lambda v: (-len(v.members), len(v.element.nodes) or 1 << 30,
                                  v.element.kind, v.element.name), default=None)


# -- what a member's decisions become -------------------------------------------------------------
@dataclass
class Hold:
    """How this run's drain and notification wait: for its incident ("held", "summarised") or
    for the queue to empty ("deferred")."""
    incident: Optional[dict]
    why: str

    @classmethod
    def member(cls, inc: dict) -> "Hold":
        return cls(inc, f"part of incident {inc['id']} ({inc['kind']} {inc['element']})")

    def row(self, kind: str, node: Optional[str], now: float) -> dict:
        if self.incident is None:
            decision = "deferred"
        else:
            decision = "held" if kind == "drain" else "summarised"
        detail = self.why + ("; the node did nothing" if kind == "drain" and self.incident
                             else "; in the incident's one notification" if self.incident
                             else "")
        return {"kind": kind, "decision": decision, "node": node, "detail": detail,
                "command": None, "created_at": _iso(now)}


def _line(inc: dict) -> str:
    return f"part of incident {inc['id']}: {inc['summary']}"


def summary(kind: str, element: str, jobs: int, first: str, last: str) -> str:
    """`leaf switch s3, 14 jobs within 2 minutes`."""
    secs = max(0.0, (_epoch(last) or 0) - (_epoch(first) or 0))
    return f"{kind} {element}, {jobs} job{'' if jobs == 1 else 's'} {span(secs)}"


def _shown(row) -> dict:
    """An incidents row as sattrib JOBID and the dashboard show it beside a diagnosis."""
    r = dict(row)
    r["summary"] = summary(r["kind"], r["element"], r["jobs"], r["first_failure_at"],
                           r["last_failure_at"])
    r["open"] = (_epoch(r["last_failure_at"]) or 0) + r["window_s"] > time.time()
    r["line"] = _line(r)
    return r


def of_diagnosis(conn, did: str) -> Optional[dict]:
    """The incident a diagnosis is part of: {id, kind, element, summary, open, line}; None."""
    try:
        cur = conn.execute("SELECT i.* FROM incidents i JOIN incident_jobs j ON j.incident_id "
                           "= i.id WHERE j.diagnosis_id = ?", [did])
    except Exception:                   # a database from before the incidents migration
        return None
    row = cur.fetchone()
    if row is None:
        return None
    r = _shown(zip([c[0] for c in cur.description], row))
    return {k: r[k] for k in ("id", "cluster", "kind", "element", "summary", "open", "line")}


# -- the step -------------------------------------------------------------------------------------
def act(db, did: str, d, st, bundle: Optional[Path] = None, now: Optional[float] = None) -> dict:
    """sattrib.actions.act on a stored diagnosis, its drain and notification held by the
    incident it is part of, or waiting for one that may form."""
    from .actions import act as decide
    now = time.time() if now is None else now
    doc = json.loads(d.model_dump_json()) if hasattr(d, "model_dump_json") else d
    return decide(db, did, doc, st, bundle, now, hold=correlate(db, did, doc, st, now))


def _lock(st, did: str):
    from .actions import _Lock
    return _Lock(Path(st.bundle_dir) / did.split("/")[0] / ".locks" / "incidents",
                 st.action_timeout_s * 3)


def _elements(st) -> list:
    from .collectors.topology import load
    got, notes = load(st.incident_topology, st.incident_site_file,
                      time.monotonic() + st.action_timeout_s)
    for n in notes:
        log.warning("topology: %s", n)
    return got


def correlate(db, did: str, d: dict, st, now: float) -> Optional[Hold]:
    """After diagnosis `did` is stored: its incident (joined or opened now), or why its
    decisions wait, or None when no element could explain it (it is decided on its own)."""
    from .mounts import network_mounts
    f = failure_of(did, d, network_mounts())
    mine = covering(f, _elements(st)) if f else []
    if not mine:
        return None
    opened = None
    with _lock(st, did) as locked:
        if not locked:
            return Hold(None, "the incidents lock was busy: decided when the queue is empty")
        inc = of_diagnosis(db.db.conn, did) or _join(db, f, mine, st)
        if inc is None:
            inc = opened = _open(db, f, mine, st, now)
    if opened:
        _tell(db, of_incident(db.db.conn, opened["id"]), st, now)
    if inc is None:
        labels = ", ".join(e.label for e in mine[:4])
        return Hold(None, f"may be part of an incident ({labels}): decided when the queue is "
                          "empty")
    return Hold.member(inc)


def _join(db, f: Failure, mine: list, st) -> Optional[dict]:
    """The open incident of an element covering `f` whose failures `f` falls among."""
    conn = db.db.conn
    for e in sorted(mine, key=lambda e: len(e.nodes) or 1 << 30):
        cur = conn.execute(
            "SELECT * FROM incidents WHERE cluster = ? AND kind = ? AND element = ? AND "
            "last_failure_at >= ? ORDER BY id DESC LIMIT 1",
            [f.did.split("/")[0], e.kind, e.name, _iso(f.at - st.incident_window_s)])
        row = cur.fetchone()
        if row is None:
            continue
        r = dict(zip([c[0] for c in cur.description], row))
        w = r["window_s"]
        if _epoch(r["first_failure_at"]) - w <= f.at <= _epoch(r["last_failure_at"]) + w:
            _write(db, lambda c: _add(c, r["id"], [f]))
            return of_diagnosis(conn, f.did)
    return None


def _window(conn, cluster: str, f: Failure, st) -> list:
    """The stored failures within incident_window_s of `f` that no incident holds."""
    from .mounts import network_mounts
    mounts = network_mounts()
    rows = conn.execute(
        "SELECT id, diagnosis_json FROM diagnoses WHERE cluster = ? AND job_end BETWEEN ? AND ? "
        "AND id NOT IN (SELECT diagnosis_id FROM incident_jobs)",
        [cluster, _iso(f.at - st.incident_window_s), _iso(f.at + st.incident_window_s)])
    out = [failure_of(did, json.loads(text), mounts) for did, text in rows]
    return [g for g in out if g is not None]


def _open(db, f: Failure, mine: list, st, now: float) -> Optional[dict]:
    """Open the incident the stored failures around `f` make, if any."""
    from .collectors.node_jobs import jobs_on
    conn = db.db.conn
    cluster = f.did.split("/")[0]
    failures = _window(conn, cluster, f, st)
    verdicts = [judge(e, failures, None, st) for e in mine]
    if not any(not v.why_not for v in verdicts):
        return None
    ran, said = None, ""
    nodes = frozenset().union(*(v.element.nodes for v in verdicts if not v.why_not))
    if nodes:
        ran, said = jobs_on(nodes, f.at - 2 * st.incident_window_s,
                            time.monotonic() + st.action_timeout_s)
    verdicts = [judge(e, failures, ran, st) for e in mine]
    best = choose(verdicts)
    if best is None:
        return None
    e, members = best.element, best.members
    cats = Counter(c for m in members for c in sorted(m.categories & KINDS[e.kind][0]))
    considered = [{"element": v.element.label, "why": v.why_not or "qualifies too, but covers "
                   "fewer failures or more nodes"} for v in verdicts if v is not best]
    if ran is None and e.nodes:
        considered.append({"element": e.label, "why": f"Slurm did not say which jobs ran on "
                                                      f"its nodes ({said}): failures alone"})
    row = {"cluster": cluster, "kind": e.kind, "element": e.name,
           "element_nodes": compress(sorted(e.nodes)) if e.nodes else None,
           "element_source": e.source, "declared": e.declared,
           "category": cats.most_common(1)[0][0],
           "action_code": KINDS[e.kind][1], "window_s": st.incident_window_s,
           "opened_at": _iso(now), "first_failure_at": _iso(min(m.at for m in members)),
           "last_failure_at": _iso(max(m.at for m in members)), "jobs": 0, "nodes": 0,
           "ran_on": json.dumps([{"job_id": j.job_id, "state": j.state,
                                  "nodes": compress(sorted(j.nodes))} for j in best.ran_on]),
           "considered": json.dumps(considered), "updated_at": _iso(now)}

    def write(c):
        n = c.execute(f"INSERT INTO incidents ({', '.join(row)}) VALUES "
                      f"({', '.join('?' * len(row))})", list(row.values())).lastrowid
        _add(c, n, members)
        return n
    n = _write(db, write)
    log.info("incident %d opened: %s, %d jobs", n, e.label, len(members))
    inc = of_diagnosis(conn, f.did)
    for m in members:
        if m.did != f.did:
            _amend_member(db, m.did, inc, st, now)
    return inc


def _add(c, n: int, members: list) -> None:
    """Members into incident `n`, and its counts and span brought up to date."""
    rows = c.execute("SELECT id, category, outcome FROM diagnoses WHERE id IN "
                     f"({', '.join('?' * len(members))})", [m.did for m in members]).fetchall()
    facts = {did: (cat, out) for did, cat, out in rows}
    c.executemany(
        "INSERT OR IGNORE INTO incident_jobs (incident_id, diagnosis_id, cluster, job_id, restart,"
        " failed_at, nodes, category, outcome) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [(n, m.did, m.did.split("/")[0], m.job_id, m.restart, _iso(m.at),
          compress(sorted(m.nodes)), *facts.get(m.did, (None, m.outcome))) for m in members])
    jobs, first, last = c.execute("SELECT count(*), min(failed_at), max(failed_at) FROM "
                                  "incident_jobs WHERE incident_id = ?", [n]).fetchone()
    nodes = set()
    for (hl,) in c.execute("SELECT nodes FROM incident_jobs WHERE incident_id = ?", [n]):
        nodes |= set(expand(hl or ""))
    scope = c.execute("SELECT element_nodes FROM incidents WHERE id = ?", [n]).fetchone()[0]
    if scope:
        nodes &= set(expand(scope))
    c.execute("UPDATE incidents SET jobs = ?, nodes = ?, failed_nodes = ?, first_failure_at = ?, "
              "last_failure_at = ?, updated_at = ? WHERE id = ?",
              [jobs, len(nodes), compress(sorted(nodes)), first, last, _iso(time.time()), n])


def _write(db, fn):
    """fn(conn) in one write transaction (retried when SQLite is busy)."""
    def tx():
        conn = db.db.conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            out = fn(conn)
            conn.execute("COMMIT")
            return out
        except BaseException:
            conn.execute("ROLLBACK")
            raise
    return db._retry(tx)


# -- the decisions of members and of failures that waited -----------------------------------------
def _acts(conn, did: str) -> list:
    cur = conn.execute("SELECT kind, decision, node, detail, command, created_at, group_key "
                       "FROM actions WHERE diagnosis_id = ? ORDER BY seq", [did])
    return [dict(zip([c[0] for c in cur.description], r)) for r in cur.fetchall()]


def _save(db, did: str, acts: list) -> None:
    """Record the decisions (keeping the escalation) and refresh the bundle's actions.json."""
    from .actions import _write_bundle, stored
    conn = db.db.conn
    esc = stored(conn, did)["escalation"]
    db.record_actions(did, acts, esc)
    row = conn.execute("SELECT bundle_path FROM diagnoses WHERE id = ?", [did]).fetchone()
    if row and row[0] and os.path.isdir(row[0]):
        _write_bundle(Path(row[0]), dict(stored(conn, did), incident=of_diagnosis(conn, did)))


def _amend_member(db, did: str, inc: dict, st, now: float) -> None:
    """A failure that became part of an incident after it was acted on: what waited becomes
    held, a notification held for the summary goes with the incident's, and a node sattrib
    drained for it is given back."""
    hold = Hold.member(inc)
    acts, out = _acts(db.db.conn, did), []
    for a in acts:
        if a["decision"] == "deferred" or (a["kind"], a["decision"]) in (
                ("notify", "held"), ("drain", "dry-run")):
            out.append(dict(hold.row(a["kind"], a["node"], now), group_key=a["group_key"]))
            continue
        out.append(a)
        if (a["kind"], a["decision"]) == ("drain", "taken"):
            out.append(_give_back(a["node"], did.split("/")[1], inc, st, now))
    if out != acts:
        _save(db, did, out)


def _give_back(node: str, job_id: str, inc: dict, st, now: float) -> dict:
    """Resume a node sattrib drained for this job, now known to be part of an incident."""
    from .actions import REASON_PREFIX, _err, _scontrol, node_info, reason_text
    row = {"kind": "resume", "node": node, "command": f"scontrol update NodeName={node} "
           "State=RESUME", "created_at": _iso(now)}
    info, err = node_info(node, st.action_timeout_s)
    reason = reason_text(info) if info else ""
    if info is None or not reason.startswith(f"{REASON_PREFIX}{job_id} "):
        return dict(row, decision="refused", detail=f"{node} left as it is: " + (
            f"cannot read its state: {err}" if info is None else f"its reason is {reason!r}"))
    r = _scontrol(["update", f"NodeName={node}", "State=RESUME"], st.action_timeout_s)
    if not r.ok:
        return dict(row, decision="failed", detail=f"scontrol update failed: {_err(r)}")
    return dict(row, decision="taken", detail=f"{_line(inc)}: the node did nothing")


def settle(db, st, now: Optional[float] = None, only: Optional[str] = None) -> int:
    """Decide what waited (the queue is empty; `only` one diagnosis: `sattrib collect` by
    hand): each deferred decision as part of its incident, else as on its own; then send the
    incidents' notifications still due. How many diagnoses were decided."""
    from .actions import _Lock, _array_of, decide_drain, payload, stored, _notify_or_hold
    now = time.time() if now is None else now
    conn = db.db.conn
    try:
        dids = [r[0] for r in conn.execute(
            "SELECT DISTINCT diagnosis_id FROM actions WHERE decision = 'deferred'"
            + (" AND diagnosis_id = ?" if only else "") + " ORDER BY diagnosis_id LIMIT 2000",
            [only] if only else [])]
    except Exception:                   # a database from before the actions migration
        return 0
    for did in dids:
        row = conn.execute("SELECT diagnosis_json, bundle_path FROM diagnoses WHERE id = ?",
                           [did]).fetchone()
        if row is None:
            continue
        d = json.loads(row[0])
        hold = correlate(db, did, d, st, now)
        if hold and hold.incident:
            _amend_member(db, did, hold.incident, st, now)
            continue
        acts, esc = _acts(conn, did), stored(conn, did)["escalation"]
        action = esc["to"] if esc else ((d.get("root_cause") or {}).get("action_code")
                                        or d.get("action_code"))
        out = []
        for i, a in enumerate(acts):
            if a["decision"] != "deferred":
                out.append(a)
            elif a["kind"] == "drain":
                lock = Path(st.bundle_dir) / did.split("/")[0] / ".locks" / "drain"
                with _Lock(lock, st.action_timeout_s * 3) as locked:
                    dr = decide_drain(conn, did, d, action, st, now, locked)
                    if dr:
                        out.append(dr)      # seen by the next decision's rate limits
                        db.record_actions(did, out + acts[i + 1:], esc)
            else:
                body = payload(did, d, out, esc, st)
                bundle = Path(row[1]) if row[1] else None
                out.append(_notify_or_hold(db, did, out, esc, body, st, now,
                                           _array_of(bundle, did)))
        _save(db, did, out)
    if st.notify_url:                   # a notification held within the last day
        for (n,) in conn.execute("SELECT id FROM incidents WHERE (notify_decision IS NULL OR "
                                 "notify_decision = 'held') AND opened_at >= ? ORDER BY id",
                                 [_iso(now - 86400)]).fetchall():
            _tell(db, of_incident(conn, n), st, now)
    return len(dids)


# -- the incident's one notification --------------------------------------------------------------
def of_incident(conn, n: int) -> Optional[dict]:
    cur = conn.execute("SELECT * FROM incidents WHERE id = ?", [n])
    row = cur.fetchone()
    return _shown(zip([c[0] for c in cur.description], row)) if row else None


def incident_payload(inc: dict, conn, st) -> dict:
    """The webhook body: the element, the jobs and nodes, no evidence text."""
    jobs = [r[0] for r in conn.execute("SELECT job_id FROM incident_jobs WHERE incident_id = ? "
                                       "ORDER BY failed_at, job_id LIMIT 20", [inc["id"]])]
    link = (f"{st.dashboard_url.rstrip('/')}/incident/{inc['id']}" if st.dashboard_url
            else None)
    ran = json.loads(inc.get("ran_on") or "[]")
    text = (f"sattrib: incident {inc['id']} on {inc['cluster']}: {inc['summary']} on "
            f"{inc['nodes']} node(s) ({inc['failed_nodes']}); "
            f"{len(ran)} job(s) behind it ran on. Action: {action(inc)}"
            + (f" <{link}>" if link else ""))
    return {"kind": "incident", "incident": inc["id"], "cluster": inc["cluster"],
            "element": {"kind": inc["kind"], "name": inc["element"],
                        "nodes": inc["element_nodes"]},
            "category": inc["category"], "summary": inc["summary"], "jobs": inc["jobs"],
            "job_ids": jobs, "nodes": inc["failed_nodes"], "ran_on": len(ran),
            "first_failure_at": inc["first_failure_at"],
            "last_failure_at": inc["last_failure_at"], "action": action(inc),
            "action_code": inc["action_code"], "dashboard_url": link, "text": text}


def action(inc: dict) -> str:
    what = KINDS[inc["kind"]][2].format(label=f"{inc['kind']} {inc['element']}",
                                        nodes=inc.get("element_nodes") or inc["failed_nodes"])
    return f"{what}; the drains of its jobs' nodes are held while it is open"


def _tell(db, inc: Optional[dict], st, now: float) -> None:
    """The incident's one webhook, within notify_max_per_hour (counted with the diagnoses');
    held when the hour is spent, and sent by a later `settle`."""
    from .actions import _Lock, _notify_lock, _webhooks_since, notify
    if not st.notify_url or inc is None:
        return
    conn = db.db.conn
    path, wait = _notify_lock(st)
    with _Lock(path, wait) as locked:
        sent = _webhooks_since(conn, now - 3600) if locked else 0
        if not locked:
            r = {"decision": "held", "detail": "lock busy: sent later"}
        elif sent >= st.notify_max_per_hour:
            r = {"decision": "held", "detail": f"rate limit: {sent} webhooks in the last hour "
                                               f"(notify_max_per_hour = {st.notify_max_per_hour})"}
        else:
            r = notify(incident_payload(inc, conn, st), st)
        _write(db, lambda c: c.execute(
            "UPDATE incidents SET notify_decision = ?, notify_detail = ?, notified_at = ? "
            "WHERE id = ?", [r["decision"], r["detail"], _iso(now), inc["id"]]))
    log.info("incident %d notification %s: %s", inc["id"], r["decision"], r["detail"])


# -- reading --------------------------------------------------------------------------------------
def listing(conn, since: str, cluster: Optional[str] = None, limit: int = 100) -> list:
    """Incidents whose last failure is at or after `since`, newest first."""
    try:
        cur = conn.execute("SELECT * FROM incidents WHERE last_failure_at >= ?"
                           + (" AND cluster = ?" if cluster else "")
                           + " ORDER BY last_failure_at DESC, id DESC LIMIT ?",
                           [since, *([cluster] if cluster else []), limit])
    except Exception:                   # a database from before the incidents migration
        return []
    cols = [c[0] for c in cur.description]
    return [_public(_shown(zip(cols, r))) for r in cur.fetchall()]


def _public(r: dict) -> dict:
    return {"id": r["id"], "cluster": r["cluster"], "status": "open" if r["open"] else "closed",
            "kind": r["kind"], "element": r["element"], "element_nodes": r["element_nodes"],
            "category": r["category"], "summary": r["summary"], "jobs": r["jobs"],
            "nodes": r["nodes"], "failed_nodes": r["failed_nodes"],
            "ran_on": len(json.loads(r["ran_on"] or "[]")),
            "first_failure_at": r["first_failure_at"], "last_failure_at": r["last_failure_at"],
            "opened_at": r["opened_at"], "notification": r["notify_decision"]}


def document(conn, n: int) -> Optional[dict]:
    """One incident as a diagnosis with evidence: the element and where it is declared, every
    job that failed behind it, the jobs behind it that ran on, the elements weighed against it."""
    inc = of_incident(conn, n)
    if inc is None:
        return None
    cur = conn.execute("SELECT diagnosis_id, job_id, restart, failed_at, nodes, category, outcome "
                       "FROM incident_jobs WHERE incident_id = ? ORDER BY failed_at, job_id",
                       [n])
    cols = [c[0] for c in cur.description]
    jobs = [dict(zip(cols, r)) for r in cur.fetchall()]
    ran = json.loads(inc["ran_on"] or "[]")
    evidence = [{"id": "t1", "role": "context", "source": inc["element_source"],
                 "text": inc["declared"]}]
    for i, j in enumerate(jobs, 1):
        j["evidence"] = f"j{i}"
        evidence.append({"id": f"j{i}", "role": "root", "source": "scheduler",
                         "timestamp": j["failed_at"], "diagnosis_id": j["diagnosis_id"],
                         "text": f"job {j['job_id']} failed on {j['nodes']}: "
                                 f"{j['category'] or j['outcome']}"})
    for i, j in enumerate(ran, 1):
        j["evidence"] = f"r{i}"
        evidence.append({"id": f"r{i}", "role": "context", "source": "scheduler",
                         "text": f"job {j['job_id']} ({j['state']}) on {j['nodes']} ran on"})
    out = _public(inc)
    return dict(out, declared={"source": inc["element_source"], "text": inc["declared"]},
                outcome="attributed",
                root_cause={"category": inc["category"],
                            "element": f"{inc['kind']} {inc['element']}",
                            "nodes": inc["failed_nodes"], "summary": inc["summary"],
                            "first_seen": inc["first_failure_at"],
                            "evidence": ["t1"] + [j["evidence"] for j in jobs]},
                failed_jobs=jobs, ran_on=ran, considered=json.loads(inc["considered"] or "[]"),
                window_s=inc["window_s"], action=action(inc), action_code=inc["action_code"],
                notification={"decision": inc["notify_decision"],
                              "detail": inc["notify_detail"], "at": inc["notified_at"]},
                evidence=evidence)
