"""Reading diagnoses back: `sattrib <jobid>`. sqlite3 only, read-only, indexed by job id.

The database is readable by SlurmUser's group (admins) only. A user who cannot open it reads
the diagnosis.json of their own job's evidence bundle instead: the worker grants the job's user
read on that bundle (a POSIX ACL), and the kernel decides what the caller may open."""
from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path
from typing import Optional

from .errors import UserError


def connect_readonly(path: Path) -> sqlite3.Connection:
    if not path.exists():
        raise UserError(f"no diagnoses database at {path}",
                        "run `sattrib demo` or set `database` in /etc/sattrib/sattrib.toml")
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
    try:
        conn.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()
    except sqlite3.OperationalError:
        # A user who may read the file but not create its WAL index (-shm) next to it:
        # read the file as it is (what the writer last checkpointed).
        conn.close()
        conn = sqlite3.connect(f"file:{path}?immutable=1", uri=True)
    return conn


RUN_RECORD = "slurm/sattrib-run.json"      # sattrib's own record of the run (collect.py)
MAX_RUN_RECORD = 4 << 20


def output_sources(bundle) -> dict:
    """{bundle copy of a job output file: the path the job wrote it to}, from sattrib's own
    record of the run in the bundle; {} when there is none or this caller may not read it."""
    if not bundle:
        return {}
    try:
        with open(Path(bundle) / RUN_RECORD, "rb") as f:
            rec = json.loads(f.read(MAX_RUN_RECORD))
    except (OSError, ValueError):
        return {}
    out = {}
    for o in rec.get("outputs") or [] if isinstance(rec, dict) else []:
        copy = o.get("copy") or str(o.get("extract") or "").removesuffix(".lines")
        if copy and isinstance(o.get("source"), str):
            out[copy] = o["source"]
    return out


def with_sources(doc: dict, sources: dict) -> dict:
    """The diagnosis with each evidence line read from a copy of the job's output naming the
    file the job wrote (`source_path`): the path its user knows, not the bundle's copy."""
    for e in doc.get("evidence") or []:
        if isinstance(e, dict) and e.get("path") in sources:
            e["source_path"] = sources[e["path"]]
    return doc


def find(conn: sqlite3.Connection, path: Path, job_id: str, cluster: Optional[str] = None,
         restart: Optional[int] = None) -> list[dict]:
    where, args = ["job_id = ?"], [job_id]
    if cluster:
        where.append("cluster = ?")
        args.append(cluster)
    if restart is not None:
        where.append("restart = ?")
        args.append(restart)
    rows = _rows(conn, path, "SELECT id, cluster, restart, diagnosis_json, bundle_path "
                 "FROM diagnoses WHERE "
                 + " AND ".join(where) + " ORDER BY cluster, restart", args)
    from .actions import stored
    from .incidents import of_diagnosis
    return [{"cluster": r["cluster"], "restart": r["restart"],
             "diagnosis": with_sources(json.loads(r["diagnosis_json"]),
                                       output_sources(r["bundle_path"])),
             **stored(conn, r["id"]),
             "incident": of_diagnosis(conn, r["id"])} for r in rows]


MAX_RESTARTS = 256


def readable(path: Path) -> bool:
    """Can this caller open the database? (A missing one is reported by connect_readonly.)"""
    try:
        os.stat(path)
    except FileNotFoundError:
        return True
    except OSError:
        return False              # a folder on the way is closed to this caller
    return os.access(path, os.R_OK)


def missing(path: Path) -> bool:
    """Is there no such file? (Not: may this caller not look, see `readable`.)"""
    try:
        os.stat(path)
    except FileNotFoundError:
        return True
    except OSError:
        pass
    return False


def find_in_bundles(bundle_dir: Path, clusters: list[str], job_id: str,
                    restart: Optional[int] = None) -> list[dict]:
    """The runs of a job whose <bundle_dir>/<cluster>/<job>.<restart>/diagnosis.json this
    caller may read. The folders above the bundles cannot be listed (0751): each run's path is
    tried by name."""
    if "/" in job_id or job_id.startswith("."):
        return []
    out = []
    for cluster in clusters:
        if not cluster or "/" in cluster or cluster.startswith("."):
            continue
        runs = [restart] if restart is not None else range(MAX_RESTARTS)
        for r in runs:
            try:
                with open(bundle_dir / cluster / f"{job_id}.{r}" / "diagnosis.json",
                          "rb") as f:
                    doc = json.loads(f.read())
            except (OSError, ValueError):
                continue          # no such run, or not this caller's job
            acted = {"actions": [], "escalation": None}
            try:
                with open(bundle_dir / cluster / f"{job_id}.{r}" / "actions.json", "rb") as f:
                    acted.update(json.loads(f.read()))
            except (OSError, ValueError):
                pass              # nothing was done about it (or not recorded there)
            doc = with_sources(doc, output_sources(bundle_dir / cluster / f"{job_id}.{r}"))
            out.append({"cluster": cluster, "restart": r, "diagnosis": doc, **acted})
        if out:
            break
    return out


def _rows(conn: sqlite3.Connection, path: Path, sql: str, args: list) -> list[dict]:
    """The query's rows as dicts; a file that is not a sattrib database is a user error."""
    try:
        cur = conn.execute(sql, args)
    except sqlite3.OperationalError as e:
        hint = ("it was written by an older sattrib: the controller's worker upgrades it when "
                "it next stores a diagnosis" if "no such column" in str(e) else
                "is it a sattrib database? run `sattrib demo` to create one")
        raise UserError(f"cannot read {path}: {e}", hint) from None
    cols = [c[0] for c in cur.description]
    return [dict(zip(cols, r)) for r in cur.fetchall()]


def parse_since(text: str, now: Optional[float] = None) -> str:
    """`today`, `yesterday`, `now-7d` / `7d` / `12h`, or a local date or time (YYYY-MM-DD,
    YYYY-MM-DDTHH:MM[:SS]), as sacct -S takes them -> an ISO UTC stamp like those stored."""
    import re
    import time
    from datetime import datetime, timedelta, timezone
    now = time.time() if now is None else now
    t = text.strip().lower()
    local = datetime.fromtimestamp(now).astimezone()
    midnight = local.replace(hour=0, minute=0, second=0, microsecond=0)
    m = re.fullmatch(r"(?:now-?)?(\d+)\s*([dhm])", t)
    if t == "today":
        when = midnight
    elif t == "yesterday":
        when = midnight - timedelta(days=1)
    elif m:
        n, unit = int(m.group(1)), m.group(2)
        when = local - timedelta(**{{"d": "days", "h": "hours", "m": "minutes"}[unit]: n})
    else:
        try:
            when = datetime.fromisoformat(text.strip())
        except ValueError:
            raise UserError(f"cannot read the time {text!r}",
                            "use today, yesterday, 7d, 12h, 2026-11-02 or 2026-11-02T08:00")
        if when.tzinfo is None:
            when = when.astimezone()              # a local time, as sacct reads it
    return when.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def list_failures(conn: sqlite3.Connection, path: Path, since: str, until: Optional[str] = None,
                  cluster=None, user=None, partition=None, category=None, node=None,
                  outcome=None, state=None, infra: bool = False,
                  limit: int = 100) -> list[dict]:
    """Diagnosed runs whose job ended (or, without an end, was diagnosed) in [since, until),
    newest first."""
    when = "ended_at"                                   # store.m013_ended_at
    where, args = [f"{when} >= ?"], [since]
    if until:
        where.append(f"{when} < ?")
        args.append(until)
    for col, val in (("cluster", cluster), ("user", user), ("partition", partition),
                     ("category", category), ("outcome", outcome),
                     ("UPPER(job_state)", state and state.upper())):
        if val:
            where.append(f"{col} = ?")
            args.append(val)
    if node:
        where.append("(culprit_node = ? OR EXISTS (SELECT 1 FROM json_each(nodes) "
                     "WHERE value = ?))")
        args += [node, node]
    if infra:
        where.append("machine_fault = 1")        # store.cause_columns: the machine's fault
    sql = ("SELECT cluster, job_id, restart, user, partition, job_name, job_state, outcome, "
           "category, "
           f"culprit_node, culprit_gpu, culprit_rank, action_code, summary, {when} AS ended "
           f"FROM diagnoses WHERE {' AND '.join(where)} ORDER BY ended DESC, id DESC LIMIT ?")
    return _rows(conn, path, sql, args + [limit])


def hotspot_rows(conn: sqlite3.Connection, path: Path, since: str, gpu: bool = False,
                 cluster=None, limit: int = 20) -> list[dict]:
    """Culprits of the machine's faults (blamed on the machine, on evidence the job did not
    write) in jobs that ended since `since`, most often first (the dashboard's hotspot pages,
    on the command line)."""
    where = ["ended_at >= ?", "outcome = 'attributed'", "machine_fault = 1"]
    args: list = [since]
    if cluster:
        where.append("cluster = ?")
        args.append(cluster)
    if gpu:
        where.append("culprit_gpu IS NOT NULL AND gpu_fault = 1")   # store.cause_columns
        sql = ("SELECT culprit_node AS node, culprit_gpu AS gpu, count(*) AS failures, "
               "group_concat(DISTINCT category) AS categories, max(ended_at) AS last "
               f"FROM diagnoses WHERE {' AND '.join(where)} GROUP BY culprit_node, culprit_gpu "
               "ORDER BY failures DESC, node, gpu LIMIT ?")
    else:
        where.append("culprit_node IS NOT NULL")
        sql = ("SELECT culprit_node AS node, count(*) AS failures, "
               "count(DISTINCT culprit_gpu) AS gpus, group_concat(DISTINCT category) AS "
               f"categories, max(ended_at) AS last FROM diagnoses WHERE {' AND '.join(where)}"
               " GROUP BY culprit_node ORDER BY failures DESC, node LIMIT ?")
    return _rows(conn, path, sql, args + [limit])
