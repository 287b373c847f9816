"""Scale and load properties that are checked by structure, not by timers: query plans use
indexes, concurrent writers lose nothing, matching stays linear on pathological lines."""
import json
import multiprocessing
import re
import sqlite3
import time
from pathlib import Path

import pytest
import yaml

from helpers import CASES
from sattrib.serve import dashboard_dir
from sattrib.store import Store

QUERIES = yaml.safe_load((dashboard_dir() / "metadata.yml").read_text())[
    "databases"]["diagnoses"]["queries"]
# Pages' own lookups (plugin routes and `sattrib <jobid>`); the node and GPU pages are
# canned queries (node_history, gpu_history).
LOOKUPS = {
    "sattrib <jobid>": "SELECT cluster, restart, diagnosis_json FROM diagnoses WHERE job_id = :j "
                       "ORDER BY cluster, restart",
    "diagnosis page": "select diagnosis_json from diagnoses where id = :j",
    "evidence of a diagnosis": "select * from evidence where diagnosis_id = :j",
}


def plan(conn, sql):
    # Every filter empty (= all), as a page first opens, and the window of 30 days.
    params = dict.fromkeys(re.findall(r":(\w+)", sql), "")
    params.update({"days": "30", "j": "1", "node": "n1"})
    return [r[3] for r in conn.execute("EXPLAIN QUERY PLAN " + sql, params)]


@pytest.mark.parametrize("name", sorted(QUERIES) + sorted(LOOKUPS))
def test_every_page_query_uses_an_index(tmp_path, name):
    Store(tmp_path / "d.db")
    conn = sqlite3.connect(tmp_path / "d.db")
    from datasette.utils import escape_fts
    conn.create_function("escape_fts", 1, escape_fts)         # as Datasette does
    sql = QUERIES[name]["sql"] if name in QUERIES else LOOKUPS[name]
    steps = plan(conn, sql)
    # A full scan of a big table is only acceptable as an index walk in the order asked for,
    # under a LIMIT (newest first): it stops after the page.
    for s in steps:
        if re.match(r"SCAN (diagnoses|evidence|missing_evidence|d|m|e)\b", s):
            assert "USING" in s and "INDEX" in s and "limit" in sql.lower(), (name, steps)
            assert "RIGHT PART OF ORDER BY" not in " ".join(steps), (name, steps)


def _writer(args):
    path, i = args
    d = json.loads(Path(path).with_name("diag.json").read_text())
    from sattrib.engine.models import Diagnosis
    diag = Diagnosis.model_validate(d)
    t0 = time.monotonic()
    # Half the writers write the same runs again: upserts, never duplicates.
    Store(path).upsert(diag.model_copy(update={"job_id": str(1000 + i % 100)}), "load")
    return time.monotonic() - t0


def test_concurrent_writers_lose_nothing(tmp_path, rules):
    from sattrib.analysis import analyze_folder
    d, _ = analyze_folder(CASES / "xid79_srun_combined_log", rules=rules)
    db = tmp_path / "d.db"
    # No connection may be open when forking: a child closing an inherited SQLite descriptor
    # drops its own POSIX locks on the file.
    Store(db).db.conn.close()
    (tmp_path / "diag.json").write_text(d.model_dump_json())
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(40) as pool:
        times = pool.map(_writer, [(str(db), i) for i in range(200)], chunksize=1)
    conn = sqlite3.connect(db)
    assert conn.execute("select count(*) from diagnoses").fetchone()[0] == 100
    assert conn.execute("select count(distinct job_id) from diagnoses").fetchone()[0] == 100
    per = conn.execute("select count(*) from evidence group by diagnosis_id").fetchall()
    assert {n for (n,) in per} == {len(d.evidence)}
    assert len(times) == 200


def test_pathological_line_is_linear(tmp_path):
    """A site rule written the way that makes backtracking engines explode, on lines of
    10 MB and 100 MB: RE2 and the bounded segment keep the time proportional."""
    from sattrib.analysis import analyze_folder
    from sattrib.engine.rules import load_rules
    site = tmp_path / "rules" / "site"
    site.mkdir(parents=True)
    (site / "evil.yaml").write_text("""id: site.evil
title: nested quantifiers
category: application_error
role: root
source: stderr
pattern: 'BOOM: (a|aa)*(a|aa)*c'
explain: boom
examples:
  match:
    - line: 'BOOM: aac'
  no_match:
    - line: 'BOOM: aab'
""")
    rules = load_rules([tmp_path / "rules"])
    times = {}
    for mb in (10, 100):
        case = tmp_path / f"c{mb}"
        (case / "n1").mkdir(parents=True)
        with open(case / "n1" / "rank-0.stderr", "wb") as f:
            f.write(b"BOOM: ")
            block = b"a" * (1 << 20)
            for _ in range(mb):
                f.write(block)
            f.write(b"b\n")
        t0 = time.monotonic()
        d, _ = analyze_folder(case, rules=rules)
        times[mb] = time.monotonic() - t0
        assert d.outcome.value == "unattributed"
    assert times[100] < 60
    assert times[100] < 25 * max(times[10], 0.2), times
