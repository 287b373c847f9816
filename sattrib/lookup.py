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


def find(conn: sqlite3.Connection, path: Path, job_id: str, cluster: Optional[str] = None,
         restart: Optional[int] = None) -> list[dict]:
    where, args = ["job_id = ?"], [job_id]
    if cluster:
        where.append("cluster = ?")
        args.append(cluster)
    if restart is not None:
        where.append("restart = ?")
        args.append(restart)
    try:
        rows = conn.execute(
            "SELECT cluster, restart, diagnosis_json FROM diagnoses WHERE "
            + " AND ".join(where) + " ORDER BY cluster, restart", args).fetchall()
    except sqlite3.OperationalError as e:
        raise UserError(f"cannot read {path}: {e}",
                        "is it a sattrib database? run `sattrib demo` to create one") from None
    return [{"cluster": c, "restart": r, "diagnosis": json.loads(j)} for c, r, j in rows]


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
            out.append({"cluster": cluster, "restart": r, "diagnosis": doc})
        if out:
            break
    return out
