"""Reading diagnoses back: `sattrib <jobid>`. sqlite3 only, read-only, indexed by job id."""
from __future__ import annotations

import json
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
