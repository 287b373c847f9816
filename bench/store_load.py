"""The diagnoses store under load.

1. N concurrent writer processes (default 200) upsert diagnoses into one database: counts lost
   or duplicated rows and "database is locked" failures, reports p50/p99 write latency.
2. A database of M diagnoses (default 1,000,000): times `sattrib <jobid>` and every dashboard
   query (the tests check their plans; this shows the time).

    python bench/store_load.py --writers 200 --rows 1000000
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import random
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _diag():
    from sattrib.analysis import analyze_folder
    d, _ = analyze_folder(ROOT / "tests" / "cases" / "xid79_srun_combined_log")
    return d


def _write(args):
    path, i, payload = args
    from sattrib.engine.models import Diagnosis
    from sattrib.store import Store
    d = Diagnosis.model_validate_json(payload).model_copy(update={"job_id": str(10_000 + i % 150)})
    t0 = time.monotonic()
    try:
        Store(path).upsert(d, "load")
        return time.monotonic() - t0, ""
    except Exception as e:        # reported, not raised: the point is to count them
        return time.monotonic() - t0, f"{type(e).__name__}: {e}"


def writers(n: int, tmp: Path) -> dict:
    from sattrib.store import Store
    db = tmp / "load.db"
    Store(db).db.conn.close()        # never fork with an open SQLite connection
    payload = _diag().model_dump_json()
    ctx = multiprocessing.get_context("fork")
    t0 = time.monotonic()
    with ctx.Pool(n) as pool:       # n processes, all started before the writes
        res = pool.map(_write, [(str(db), i, payload) for i in range(n)], chunksize=1)
    wall = time.monotonic() - t0
    lat = sorted(r[0] for r in res)
    errors = [r[1] for r in res if r[1]]
    c = sqlite3.connect(db)
    rows = c.execute("select count(*) from diagnoses").fetchone()[0]
    return {"writers": n, "wall_s": round(wall, 2), "rows": rows,
            "expected_rows": min(n, 150), "errors": errors[:5], "error_count": len(errors),
            "p50_ms": round(1000 * statistics.median(lat), 1),
            "p99_ms": round(1000 * lat[min(len(lat) - 1, int(len(lat) * 0.99))], 1)}


def big(rows: int, tmp: Path) -> dict:
    from sattrib.store import Store
    db = tmp / "big.db"
    s = Store(db)
    d = json.loads(_diag().model_dump_json())
    conn = s.db.conn
    nodes = [f"gpu-{i:04d}" for i in range(2000)]
    cats = ["gpu_hardware", "gpu_memory_ecc", "nvlink", "network_ib", "application_error",
            "cuda_oom", "host_oom", "scheduler_timelimit", None]
    rnd = random.Random(1)
    t0 = time.monotonic()
    conn.execute("BEGIN")
    batch = []
    for i in range(rows):
        cat = rnd.choice(cats)
        node = rnd.choice(nodes)
        created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - rnd.random() * 365 * 86400))
        batch.append((f"c/{i}/0", "c", str(i), 0, "attributed" if cat else "unattributed", cat,
                      node if cat else None, "0000:1b:00.0" if cat and "gpu" in cat else None,
                      created, created, "[]", "{}"))
        if len(batch) == 10000:
            conn.executemany("insert into diagnoses (id, cluster, job_id, restart, outcome, "
                             "category, culprit_node, culprit_gpu, created_at, updated_at, "
                             "missing, diagnosis_json) values (?,?,?,?,?,?,?,?,?,?,?,?)", batch)
            conn.executemany("insert into missing_evidence values (?, 'gpu', ?)",
                             [(b[0], rnd.choice(nodes)) for b in batch[::3]])
            batch = []
    conn.execute("COMMIT")
    fill = time.monotonic() - t0
    conn.execute("update diagnoses set diagnosis_json = ? where id = 'c/424242/0'",
                 [json.dumps(dict(d, job_id="424242"))])
    conn.execute("ANALYZE")
    import yaml
    md = yaml.safe_load((ROOT / "datasette" / "metadata.yml").read_text())
    out = {"rows": rows, "fill_s": round(fill, 1), "queries_ms": {}}
    ro = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    for name, q in md["databases"]["diagnoses"]["queries"].items():
        t = time.monotonic()
        ro.execute(q["sql"], {"days": "30"}).fetchall()
        out["queries_ms"][name] = round(1000 * (time.monotonic() - t), 1)
    t = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "sattrib", "424242", "--database", str(db)],
                       capture_output=True, text=True)
    out["sattrib_jobid_ms"] = round(1000 * (time.monotonic() - t), 1)
    out["sattrib_jobid_ok"] = r.returncode == 0
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--writers", type=int, default=200)
    ap.add_argument("--rows", type=int, default=1_000_000)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="sattrib-store-") as tmp:
        res = {"writers": writers(a.writers, Path(tmp)), "big": big(a.rows, Path(tmp))}
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
