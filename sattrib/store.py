"""The diagnoses database: SQLite through sqlite-utils, schema only in migrations.

One row per (cluster, job, restart), upserted: storing the same run again replaces its row and
its evidence rows, never duplicates them. WAL mode so Datasette can read while the controller
writes; the database belongs on the controller's local disk (WAL does not work over NFS).

It holds every user's evidence lines: 0640 whatever the umask (SQLite gives its -wal and -shm
files the database's mode), readable by its owner (SlurmUser) and group (admins). Users read
their own jobs' diagnoses from their bundles (`sattrib JOBID`, lookup.find_in_bundles).
"""
from __future__ import annotations

import json
import os
import sqlite3
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

import sqlite_utils
from sqlite_utils import Migrations

from .errors import UserError

migrations = Migrations("sattrib")
BUSY_TIMEOUT_MS = 30_000
DB_MODE = 0o640


def _private(path: Path) -> None:
    """Create the database file 0640, and take the world bits off one made before."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, DB_MODE))
        os.chmod(path, DB_MODE)
    except FileExistsError:
        for p in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
            try:
                st = os.stat(p)
                if st.st_uid == os.geteuid() and st.st_mode & 0o007:
                    os.chmod(p, st.st_mode & 0o770)
            except OSError:
                pass


@migrations()
def m001_diagnoses(db: sqlite_utils.Database):
    db["diagnoses"].create({
        "id": str,                 # "<cluster>/<job_id>/<restart>"
        "cluster": str, "job_id": str, "restart": int,
        "outcome": str, "category": str, "family": str,
        "culprit_node": str, "culprit_gpu": str, "culprit_rank": int,
        "summary": str, "action": str, "action_code": str, "first_seen": str,
        "job_name": str, "user": str, "partition": str, "job_state": str, "exit_code": str,
        "job_start": str, "job_end": str, "nodes": str, "node_count": int,
        "affected_nodes": str, "symptom_count": int, "missing": str,
        "rules_version": str, "engine_version": str,
        "created_at": str, "updated_at": str, "bundle_path": str, "diagnosis_json": str,
    }, pk="id", not_null={"cluster", "job_id", "restart", "outcome"})
    db["diagnoses"].create_index(["cluster", "job_id", "restart"], unique=True)
    db["diagnoses"].create_index(["created_at"])
    db["diagnoses"].create_index(["culprit_node", "created_at"])
    db["diagnoses"].create_index(["category", "created_at"])
    db["diagnoses"].create_index(["outcome", "created_at"])
    db["evidence"].create({
        "diagnosis_id": str, "eid": str, "role": str, "source": str, "node": str,
        "path": str, "line": int, "timestamp": str, "text": str, "rule": str,
        "rank": int, "gpu": str, "category": str,
    }, pk=("diagnosis_id", "eid"), foreign_keys=[("diagnosis_id", "diagnoses", "id")])
    db["candidates"].create({
        "diagnosis_id": str, "idx": int, "category": str, "node": str, "gpu": str,
        "summary": str,
    }, pk=("diagnosis_id", "idx"), foreign_keys=[("diagnosis_id", "diagnoses", "id")])
    db["missing_evidence"].create({
        "diagnosis_id": str, "source": str, "node": str,
    }, pk=("diagnosis_id", "source", "node"), foreign_keys=[("diagnosis_id", "diagnoses", "id")])
    db["missing_evidence"].create_index(["node"])


@migrations()
def m002_dashboard(db: sqlite_utils.Database):
    """Columns, the rules table and the views the dashboard reads."""
    for col in ("gpu_uuid", "gpu_serial", "root_rule"):
        db["diagnoses"].add_column(col, str)
    db["rules"].create({
        "id": str, "domain": str, "title": str, "category": str, "role": str, "source": str,
        "explain": str, "action": str, "refs": str, "file": str,
    }, pk="id")
    db.create_view("recent_failures", """
        select id, cluster, job_id, restart, job_name, user, partition, job_state, node_count,
               outcome, category, culprit_node, culprit_gpu, culprit_rank, summary, action,
               first_seen, job_end, created_at
        from diagnoses order by created_at desc, id""")
    db.create_view("evidence_timeline", """
        select e.diagnosis_id, d.cluster, d.job_id, d.restart, e.eid, e.role, e.source,
               e.node, e.rank, e.gpu, e.timestamp, e.path, e.line, e.rule,
               r.title as rule_title, e.category, e.text
        from evidence e join diagnoses d on d.id = e.diagnosis_id
        left join rules r on r.id = e.rule""")
    db.create_view("gpu_culprits", """
        select culprit_node as node, culprit_gpu as gpu, gpu_uuid, gpu_serial, category,
               id as diagnosis_id, job_id, created_at
        from diagnoses where outcome = 'attributed' and culprit_gpu is not null""")
    db.create_view("missing_by_node", """
        select m.node, m.source, count(*) as diagnoses, max(d.created_at) as last_seen
        from missing_evidence m join diagnoses d on d.id = m.diagnosis_id
        where m.node != 'job' group by m.node, m.source""")
    db["evidence"].create_index(["rule"])
    db["evidence"].create_index(["node"])
    db["meta"].create({"key": str, "value": str}, pk="key")


@migrations()
def m003_lookup_indexes(db: sqlite_utils.Database):
    """`sattrib <jobid>` looks up by job id alone; lists page newest first."""
    db["diagnoses"].create_index(["job_id", "cluster", "restart"])
    db["diagnoses"].create_index(["created_at", "id"])


@migrations()
def m004_search(db: sqlite_utils.Database):
    """Full-text search (SQLite FTS5, kept in step by triggers): the summaries and actions for
    everyone, the evidence lines for those who may read them (serve.TEXT_TABLES)."""
    db["diagnoses"].enable_fts(["summary", "action"], create_triggers=True)
    db["evidence"].enable_fts(["text"], create_triggers=True)


@migrations()
def m005_job_nodes(db: sqlite_utils.Database):
    """Which nodes each diagnosed job ran on, one row per node, so a node's page finds every job
    it took part in by index (the `nodes` column is a JSON list)."""
    db["job_nodes"].create({"diagnosis_id": str, "node": str}, pk=("diagnosis_id", "node"),
                           foreign_keys=[("diagnosis_id", "diagnoses", "id")])
    db["job_nodes"].create_index(["node"])
    db.execute("insert or ignore into job_nodes (diagnosis_id, node) "
               "select d.id, j.value from diagnoses d, json_each(d.nodes) j "
               "where json_valid(d.nodes) and j.value is not null")


@migrations()
def m006_actions(db: sqlite_utils.Database):
    """What the worker did about a diagnosis (sattrib.actions): one row per decision (a drain
    taken, dry-run or refused and why, a requeue around the culprit, a notification), and the
    repeat-offender escalation, kept apart from the engine's diagnosis JSON."""
    db["actions"].create({
        "diagnosis_id": str, "seq": int, "kind": str, "decision": str, "node": str,
        "detail": str, "command": str, "created_at": str,
    }, pk=("diagnosis_id", "seq"), foreign_keys=[("diagnosis_id", "diagnoses", "id")])
    db["actions"].create_index(["kind", "decision", "created_at"])
    db["actions"].create_index(["node", "created_at"])
    db["escalations"].create({
        "diagnosis_id": str, "culprit": str, "node": str, "gpu": str, "failures": int,
        "window_days": float, "from_action": str, "to_action": str, "earlier_jobs": str,
        "created_at": str,
    }, pk="diagnosis_id", foreign_keys=[("diagnosis_id", "diagnoses", "id")])
    db["escalations"].create_index(["node", "created_at"])
    db["escalations"].create_index(["created_at"])


@migrations()
def m007_hook_health(db: sqlite_utils.Database):
    """Hook health: whether each node's Epilog snapshot reached the diagnosis
    (job_nodes.snapshot: 1 it did, 0 it was expected and did not, null none was expected), the
    node probes that failed (failed_probes, from completeness.failed_probes), and GPU lookups by
    serial or UUID. Filled from the diagnoses a database already holds: they name sources as
    `src:node` strings and the worker's notes say when no snapshot was due or came (diagnoses
    since carry the same as typed `completeness.entries`: see snapshots())."""
    db["job_nodes"].add_column("snapshot", int)
    db["failed_probes"].create({
        "diagnosis_id": str, "node": str, "probe": str, "reason": str,
    }, pk=("diagnosis_id", "node", "probe"), foreign_keys=[("diagnosis_id", "diagnoses", "id")])
    db["failed_probes"].create_index(["node"])
    db["diagnoses"].create_index(["gpu_serial"])
    db["diagnoses"].create_index(["gpu_uuid"])
    db.execute("""
        update job_nodes set snapshot = (
          select case
            when exists (select 1 from json_each(d.diagnosis_json, '$.completeness.present') p
                         where substr(p.value, instr(p.value, ':') + 1) = job_nodes.node
                           and substr(p.value, 1, instr(p.value, ':') - 1)
                               in ('kernel', 'gpu', 'ib', 'dcgm'))
              or exists (select 1 from json_each(d.diagnosis_json,
                                                 '$.completeness.failed_probes') f
                         where substr(f.value || ' ', instr(f.value, ':') + 1,
                                      length(job_nodes.node) + 1) = job_nodes.node || ' ')
              then 1
            when exists (select 1 from json_each(d.diagnosis_json, '$.completeness.notes') n
                         where substr(n.value, 1, length(:none) + length(job_nodes.node) + 2)
                               = :none || ' ' || job_nodes.node || ' ')
              then 0
            when exists (select 1 from json_each(d.diagnosis_json, '$.completeness.notes') n
                         where substr(n.value, 1, length(:quiet)) = :quiet)
              then null
            else 0 end
          from diagnoses d where d.id = job_nodes.diagnosis_id and json_valid(d.diagnosis_json))""",
               {"quiet": "the job's exit status was 0 (a scheduler-ended run)",
                "none": "no snapshot from"})
    db.execute("""
        insert or ignore into failed_probes (diagnosis_id, node, probe, reason)
        select diagnosis_id, substr(rest, 1, instr(rest || ' ', ' ') - 1),
               probe, substr(rest, instr(rest || ' ', ' ') + 1)
        from (select d.id as diagnosis_id, substr(f.value, 1, instr(f.value, ':') - 1) as probe,
                     substr(f.value, instr(f.value, ':') + 1) as rest
              from diagnoses d, json_each(d.diagnosis_json, '$.completeness.failed_probes') f
              where json_valid(d.diagnosis_json) and instr(f.value, ':') > 0)""")


def failed_probes(completeness: dict) -> list[dict]:
    """The node probes that failed, as rows (typed completeness entries)."""
    return [{"probe": e["probe"], "node": e["node"], "reason": e.get("reason") or ""}
            for e in completeness.get("entries") or []
            if e["state"] == "probe_failed" and e.get("probe") and e.get("node")]


def snapshots(completeness: dict, nodes) -> dict:
    """For each node: 1 when its Epilog snapshot reached the diagnosis, 0 when it did not, None
    when none was due (a scheduler-ended run: the Epilogs take none), as the worker's record of
    the run says (completeness entries of source `snapshot`). A node it does not name (a folder
    collected by hand): 1 when a source its snapshot would deliver is present or a probe of it
    failed, else 0."""
    from .collectors.sources import SNAPSHOT_SOURCES
    entries = completeness.get("entries") or []
    said = {e["node"]: e["state"] for e in entries if e["source"] == "snapshot"}
    got = {e["node"] for e in entries if e["state"] == "probe_failed" or (
        e["state"] == "present" and e["source"] in SNAPSHOT_SOURCES)}
    state = {"present": 1, "missing": 0, "not_due": None}
    return {n: state[said[n]] if n in said else 1 if n in got else 0 for n in nodes}


@migrations()
def m008_filter_scan_index(db: sqlite_utils.Database):
    """The failure lists filter by partition, user, category and node, newest first: with these
    columns in the index they scan, a filter that matches few rows reads the index alone
    (1,000,000 diagnoses: 3.4 s -> 0.2 s), not every row."""
    db["diagnoses"].create_index(["created_at", "id", "partition", "user", "category",
                                  "outcome", "culprit_node"], index_name="idx_diagnoses_filter")


@migrations()
def m009_blame(db: sqlite_utils.Database):
    """Whose fault each root cause is, written from engine/taxonomy.py so that the hotspots,
    `sattrib list --infra`, the node and GPU pages and the drain list read one stored answer:
    blame and trust of the root cause, machine_fault (blamed on the machine, on evidence the job
    did not write) and out_of_service (its action code empties the node). Rows already stored
    are filled from their diagnosis: one made before causes carried a blame takes its
    category's, and one made before they carried a trust takes its evidence's sources."""
    for col, kind in (("blame", str), ("trust", str), ("machine_fault", int),
                      ("out_of_service", int)):
        db["diagnoses"].add_column(col, kind)
    rows = db.execute("""
        select d.id, d.category, d.action_code,
               json_extract(d.diagnosis_json, '$.root_cause.blame'),
               json_extract(d.diagnosis_json, '$.root_cause.trust'),
               case when json_extract(d.diagnosis_json, '$.root_cause.trust') is null then
                 (select group_concat(e.source) from evidence e
                  where e.diagnosis_id = d.id and e.eid in (
                    select value from json_each(d.diagnosis_json, '$.root_cause.evidence')))
               end
        from diagnoses d where json_valid(d.diagnosis_json)""").fetchall()
    db.conn.executemany(
        "update diagnoses set blame = :blame, trust = :trust, machine_fault = :machine_fault, "
        "out_of_service = :out_of_service where id = :id",
        [dict(cause_columns(category and {"category": category, "blame": blame,
                                          "trust": trust or _trust_of(sources)}, action_code),
              id=did)
         for did, category, action_code, blame, trust, sources in rows])


def cause_columns(root: Optional[dict], action_code: Optional[str]) -> dict:
    """The stored columns that say whose fault a root cause is (see m009_blame, m012_fault)."""
    from .engine.taxonomy import blame_of, out_of_service
    blame = blame_of(root["category"], root.get("blame")).value if root else None
    trust = (root or {}).get("trust")
    return {"blame": blame, "trust": trust,
            **fault_columns(root and root["category"], blame, trust),
            "out_of_service": int(out_of_service(action_code))}


def fault_columns(category: Optional[str], blame: Optional[str], trust: Optional[str]) -> dict:
    """machine_fault, fault and gpu_fault of a root cause, each decided by engine/taxonomy.py."""
    from .engine.taxonomy import fault, gpu_fault, machine_fault
    return {"machine_fault": int(bool(trust) and machine_fault(blame, trust)),
            "fault": fault(blame, trust), "gpu_fault": int(gpu_fault(category, blame, trust))}


def _trust_of(sources: Optional[str]) -> Optional[str]:
    """The most trusted of a cause's evidence sources (comma list), as the engine decides it."""
    from .engine.taxonomy import TRUST, Source, most_trusted
    known = {s.value for s in Source}
    trust = most_trusted(TRUST[Source(s)] for s in (sources or "").split(",") if s in known)
    return trust.value if trust else None


@migrations()
def m010_public_summaries(db: sqlite_utils.Database):
    """Summaries stored before they were built from fields can quote a user's line (an
    exception's value, a path) to every dashboard visitor: each stored cause's summary, the
    explanation and the summary column are rewritten from the cause's fields. Re-analysing a
    kept bundle (`sattrib analyze BUNDLE --store`) gives the full summary back."""
    conn, last = db.conn, -1
    while True:
        rows = conn.execute("SELECT rowid, id, diagnosis_json FROM diagnoses WHERE rowid > ? "
                            "AND diagnosis_json IS NOT NULL ORDER BY rowid LIMIT 1000",
                            [last]).fetchall()
        if not rows:
            return
        for rowid, did, text in rows:
            last = rowid
            try:
                d = json.loads(text)
            except ValueError:
                continue
            causes = ([d["root_cause"]] if d.get("root_cause") else []) + (
                d.get("candidates") or [])
            if not causes:
                continue
            for c in causes:
                c["summary"] = _field_summary(c)
            said = "; ".join(c["summary"] for c in causes)
            d["explanation"] = f"{said}." if d.get("root_cause") else f"Several causes fit: {said}."
            conn.execute("UPDATE diagnoses SET summary = ?, diagnosis_json = ? WHERE rowid = ?",
                         [(d.get("root_cause") or {}).get("summary") or d["explanation"],
                          json.dumps(d, sort_keys=True), rowid])
            conn.executemany("UPDATE candidates SET summary = ? WHERE diagnosis_id = ? "
                             "AND idx = ?", [(c["summary"], did, i) for i, c in
                                             enumerate(d.get("candidates") or [])])


def _field_summary(cause: dict) -> str:
    """A cause as its fields say it: `application_error on node-02 rank 3`."""
    from .engine.public import WITHHELD, shown
    node, gpu = shown("name", cause.get("node")), shown("pci", cause.get("gpu"))
    parts = [str(cause.get("category") or "cause"), f"on {node}" if node != WITHHELD else "",
             f"GPU {gpu}" if gpu != WITHHELD else "",
             f"rank {cause['rank']}" if isinstance(cause.get("rank"), int) else ""]
    return " ".join(p for p in parts if p)


@migrations()
def m011_notify_groups(db: sqlite_utils.Database):
    """The job array a notification belongs to (actions.group_key, "<cluster>/<array job id>"):
    one array's failures make one webhook, the rest go out in a summary."""
    db["actions"].add_column("group_key", str)
    db["actions"].create_index(["group_key", "created_at"])


@migrations()
def m012_fault(db: sqlite_utils.Database):
    """Whose fault a root cause is in the dashboard's words (fault: infrastructure, unconfirmed,
    workload, site_environment, scheduler) and whether it is the GPU's own (gpu_fault), written
    from engine/taxonomy.py like machine_fault: the node and GPU pages and the hotspots read
    them instead of deciding it in their SQL. Rows already stored are filled from their blame,
    trust and category (m009)."""
    db["diagnoses"].add_column("fault", str)
    db["diagnoses"].add_column("gpu_fault", int)
    rows = db.execute("select id, category, blame, trust from diagnoses").fetchall()
    db.conn.executemany(
        "update diagnoses set fault = :fault, gpu_fault = :gpu_fault where id = :id",
        [dict(fault_columns(category, blame, trust), id=did)
         for did, category, blame, trust in rows])


@migrations()
def m013_ended_at(db: sqlite_utils.Database):
    """One time basis for every list, page and filter: when the job ended (its diagnosis time
    for a run whose end is unknown), indexed, so "since" means the same everywhere and a
    diagnosis made days later (a replay, a backlog) lands on the day its job failed."""
    db["diagnoses"].add_column("ended_at", str)
    db.execute("UPDATE diagnoses SET ended_at = COALESCE(job_end, created_at)")
    db["diagnoses"].create_index(["ended_at", "id"])
    db["diagnoses"].create_index(["culprit_node", "ended_at"])


@migrations()
def m014_incidents(db: sqlite_utils.Database):
    """Cross-job incidents (sattrib.incidents): one switch, rack, PDU, chassis, NVLink domain
    or file system behind the failures of several jobs. `incidents` holds the element, the
    failures' span and the jobs behind it that ran on; `incident_jobs` the member diagnoses
    (a diagnosis belongs to one incident at most). Failures are found by their job's end."""
    db["incidents"].create({
        "id": int, "cluster": str, "kind": str, "element": str, "element_nodes": str,
        "element_source": str, "declared": str, "category": str, "action_code": str,
        "window_s": float, "opened_at": str, "first_failure_at": str, "last_failure_at": str,
        "jobs": int, "nodes": int, "failed_nodes": str, "ran_on": str, "considered": str,
        "notify_decision": str, "notify_detail": str, "notified_at": str, "updated_at": str,
    }, pk="id", not_null={"cluster", "kind", "element"})
    db["incidents"].create_index(["cluster", "kind", "element", "last_failure_at"])
    db["incidents"].create_index(["last_failure_at"])
    db["incidents"].create_index(["notified_at"])
    db["incident_jobs"].create({
        "incident_id": int, "diagnosis_id": str, "cluster": str, "job_id": str,
        "restart": int, "failed_at": str, "nodes": str, "category": str, "outcome": str,
    }, pk=("incident_id", "diagnosis_id"), foreign_keys=[("incident_id", "incidents", "id"),
                                                         ("diagnosis_id", "diagnoses", "id")])
    db["incident_jobs"].create_index(["diagnosis_id"], unique=True)
    db["diagnoses"].create_index(["cluster", "job_end"])


@migrations()
def m015_dashboard_ended_at(db: sqlite_utils.Database):
    """The dashboard lists, filters and counts failures by when the job ended, as the CLI does
    (m013): m008's filter index moves to ended_at (the failure list filtered by partition,
    user and category on 1,000,000 diagnoses: 0.8 s without it, 0.1 s with it), and so do
    m001's category and outcome indexes (without them the home page's count by outcome walked
    every row in outcome order: 25 s); the views list by the job's end. Nothing filters
    diagnoses by created_at with those columns any more, so their created_at indexes go."""
    db["diagnoses"].create_index(["ended_at", "id", "partition", "user", "category",
                                  "outcome", "culprit_node"],
                                 index_name="idx_diagnoses_ended_filter")
    db["diagnoses"].create_index(["category", "ended_at"])
    db["diagnoses"].create_index(["outcome", "ended_at"])
    for old in ("idx_diagnoses_filter", "idx_diagnoses_category_created_at",
                "idx_diagnoses_outcome_created_at"):
        db.execute(f"DROP INDEX IF EXISTS {old}")
    db.create_view("recent_failures", """
        select id, cluster, job_id, restart, job_name, user, partition, job_state, node_count,
               outcome, category, culprit_node, culprit_gpu, culprit_rank, summary, action,
               first_seen, job_end, ended_at, created_at
        from diagnoses order by ended_at desc, id""", replace=True)
    db.create_view("gpu_culprits", """
        select culprit_node as node, culprit_gpu as gpu, gpu_uuid, gpu_serial, category,
               id as diagnosis_id, job_id, ended_at, created_at
        from diagnoses where outcome = 'attributed' and culprit_gpu is not null""",
                   replace=True)
    db.create_view("missing_by_node", """
        select m.node, m.source, count(*) as diagnoses, max(d.ended_at) as last_seen
        from missing_evidence m join diagnoses d on d.id = m.diagnosis_id
        where m.node != 'job' group by m.node, m.source""", replace=True)


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class Store:
    def __init__(self, path: str | Path, readonly: bool = False):
        self.path = Path(path)
        if readonly:
            from .lookup import connect_readonly
            conn = connect_readonly(self.path)
        else:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                _private(self.path)
                conn = sqlite3.connect(str(self.path), timeout=BUSY_TIMEOUT_MS / 1000,
                                       isolation_level=None)
            except (OSError, sqlite3.Error) as e:
                raise UserError(f"cannot open database {self.path}: {e}",
                                "check the `database` setting and directory permissions") from None
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        self.db = sqlite_utils.Database(conn)
        if not readonly:
            self._retry(self._setup)

    def _setup(self):
        if self.db.journal_mode != "wal":
            self.db.enable_wal()
        migrations.apply(self.db)

    @staticmethod
    def _retry(fn, attempts: int = 50):
        """SQLite can report "locked" on a schema change race despite busy_timeout; retry."""
        for i in range(attempts):
            try:
                return fn()
            except sqlite3.OperationalError as e:
                if "locked" not in str(e) and "busy" not in str(e) or i == attempts - 1:
                    raise
                time.sleep(min(0.05 * (i + 1), 1.0))

    # -- writing ------------------------------------------------------------------------------
    def upsert(self, diagnosis, cluster: str, bundle_path: Optional[str] = None) -> str:
        d = json.loads(diagnosis.model_dump_json())
        job_id = d.get("job_id") or "unknown"
        restart = int(d.get("restart") or 0)
        did = f"{cluster}/{job_id}/{restart}"
        root = d.get("root_cause") or {}
        job = d.get("job") or {}
        now = _now()
        row = {
            "id": did, "cluster": cluster, "job_id": job_id, "restart": restart,
            "outcome": d["outcome"], "category": root.get("category"),
            "family": _family(root.get("category")),
            "culprit_node": root.get("node"), "culprit_gpu": root.get("gpu"),
            "culprit_rank": root.get("rank"),
            "summary": root.get("summary") or d.get("explanation"),
            "action": d.get("action"), "action_code": d.get("action_code"),
            "first_seen": root.get("first_seen"),
            "job_name": job.get("name"), "user": job.get("user"),
            "partition": job.get("partition"), "job_state": job.get("state"),
            "exit_code": job.get("exit_code"), "job_start": job.get("start"),
            "job_end": job.get("end"), "nodes": json.dumps(job.get("nodes") or []),
            "node_count": len(job.get("nodes") or []),
            "affected_nodes": json.dumps(d.get("affected_nodes") or []),
            "symptom_count": sum(s.get("count", 1) for s in d.get("symptoms") or []),
            "missing": json.dumps(d["completeness"]["missing"]),
            "rules_version": d.get("rules_version"), "engine_version": d.get("engine_version"),
            "gpu_uuid": root.get("gpu_uuid"), "gpu_serial": root.get("gpu_serial"),
            "root_rule": root.get("rule"),
            **cause_columns(d.get("root_cause"), d.get("action_code")),
            "updated_at": now, "bundle_path": bundle_path,
            "diagnosis_json": json.dumps(d, sort_keys=True),
        }
        ev_rows = [{"diagnosis_id": did, "eid": e["id"], "role": e["role"],
                    "source": e["source"], "node": e.get("node"), "path": e.get("path"),
                    "line": e.get("line"), "timestamp": e.get("timestamp"),
                    "text": e.get("text"), "rule": e.get("rule"), "rank": e.get("rank"),
                    "gpu": e.get("gpu"), "category": e.get("category")}
                   for e in d.get("evidence") or []]
        cand_rows = [{"diagnosis_id": did, "idx": i, "category": c.get("category"),
                      "node": c.get("node"), "gpu": c.get("gpu"), "summary": c.get("summary")}
                     for i, c in enumerate(d.get("candidates") or [])]
        snap = snapshots(d["completeness"], dict.fromkeys(job.get("nodes") or []))
        node_rows = [{"diagnosis_id": did, "node": n, "snapshot": v} for n, v in snap.items()]
        probe_rows = [dict(p, diagnosis_id=did) for p in failed_probes(d["completeness"])]
        miss_rows = [{"diagnosis_id": did, "source": e["source"], "node": e["node"] or "job"}
                     for e in d["completeness"]["entries"]
                     if e["state"] == "missing" and e["source"] != "snapshot"]

        def write():
            conn = self.db.conn
            conn.execute("BEGIN IMMEDIATE")
            try:
                old = conn.execute("SELECT created_at FROM diagnoses WHERE id = ?",
                                   [did]).fetchone()
                row["created_at"] = old[0] if old else now
                row["ended_at"] = row["job_end"] or row["created_at"]
                for t in ("evidence", "candidates", "missing_evidence", "job_nodes",
                          "failed_probes"):
                    conn.execute(f"DELETE FROM {t} WHERE diagnosis_id = ?", [did])
                self.db["diagnoses"].upsert(row, pk="id")
                if ev_rows:
                    self.db["evidence"].insert_all(ev_rows)
                if cand_rows:
                    self.db["candidates"].insert_all(cand_rows)
                if miss_rows:
                    self.db["missing_evidence"].insert_all(miss_rows, ignore=True)
                if node_rows:
                    self.db["job_nodes"].insert_all(node_rows)
                if probe_rows:
                    self.db["failed_probes"].insert_all(probe_rows, ignore=True)
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        self._retry(write)
        return did

    def sync_rules(self, ruleset) -> None:
        """The rules table mirrors the rule files, so the dashboard can explain each rule.
        Rewritten only when the rules changed (many writers share the database)."""
        row = self.db.execute("SELECT value FROM meta WHERE key = 'rules_version'").fetchone()
        if row and row[0] == ruleset.version:
            return
        rows = [{"id": c.rule.id, "domain": c.rule.id.split(".")[0], "title": c.rule.title,
                 "category": c.rule.category.value if c.rule.category else None,
                 "role": c.rule.role.value, "source": ",".join(x.value for x in c.rule.source),
                 "explain": c.rule.explain, "action": c.rule.action.value,
                 "refs": json.dumps(c.rule.references), "file": c.path}
                for c in ruleset.rules]

        def write():
            conn = self.db.conn
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.execute("DELETE FROM rules")
                self.db["rules"].insert_all(rows)
                self.db["meta"].upsert({"key": "rules_version", "value": ruleset.version},
                                       pk="key")
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        self._retry(write)

    def record_actions(self, did: str, actions: list[dict], escalation: Optional[dict]) -> None:
        """Store what was done about diagnosis `did` (replacing what an earlier run stored)."""
        now = _now()
        rows = [{"diagnosis_id": did, "seq": i, "kind": a["kind"], "decision": a["decision"],
                 "node": a.get("node"), "detail": a.get("detail"), "command": a.get("command"),
                 "created_at": a.get("created_at") or now, "group_key": a.get("group_key")}
                for i, a in enumerate(actions)]

        def write():
            conn = self.db.conn
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.execute("DELETE FROM actions WHERE diagnosis_id = ?", [did])
                conn.execute("DELETE FROM escalations WHERE diagnosis_id = ?", [did])
                if rows:
                    self.db["actions"].insert_all(rows)
                if escalation:
                    self.db["escalations"].insert({
                        "diagnosis_id": did, "culprit": escalation["culprit"],
                        "node": escalation.get("node"), "gpu": escalation.get("gpu"),
                        "failures": escalation["failures"],
                        "window_days": escalation["window_days"],
                        "from_action": escalation["from"], "to_action": escalation["to"],
                        "earlier_jobs": json.dumps(escalation["earlier_jobs"]),
                        "created_at": now})
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        self._retry(write)

    def amend_actions(self, updates: list[tuple], append: Optional[tuple] = None) -> None:
        """In one transaction: set the decision and detail of recorded actions, each given as
        (diagnosis_id, seq, decision, detail), and add `append` = (diagnosis_id, action) after
        that diagnosis's own (the summary of held notifications)."""
        def write():
            conn = self.db.conn
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.executemany("UPDATE actions SET decision = ?, detail = ? WHERE "
                                 "diagnosis_id = ? AND seq = ?",
                                 [(dec, det, did, seq) for did, seq, dec, det in updates])
                if append:
                    did, a = append
                    seq = conn.execute("SELECT coalesce(max(seq), -1) + 1 FROM actions WHERE "
                                       "diagnosis_id = ?", [did]).fetchone()[0]
                    conn.execute("INSERT INTO actions (diagnosis_id, seq, kind, decision, node, "
                                 "detail, command, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                                 [did, seq, a["kind"], a["decision"], a.get("node"),
                                  a.get("detail"), a.get("command"), a["created_at"]])
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        self._retry(write)

    # -- reading ------------------------------------------------------------------------------
    def find(self, job_id: str, cluster: Optional[str] = None,
             restart: Optional[int] = None) -> list[dict]:
        from .lookup import find
        return find(self.db.conn, self.path, job_id, cluster, restart)


def _family(cat: Optional[str]) -> Optional[str]:
    if not cat:
        return None
    from .engine.taxonomy import FAMILY, Category
    return FAMILY.get(Category(cat))


def open_store(path: str, readonly: bool = False) -> Store:
    return Store(os.path.expanduser(path), readonly=readonly)
