"""One time basis: `sattrib list`, `hotspots` and every list, page, chart and tile of the
dashboard filter, sort and count on when the job ended (its diagnosis time only when the end is
unknown), and the demo job ends now, so the first `sattrib list` after `sattrib demo` shows it."""
import json
import sqlite3
from datetime import datetime, timedelta, timezone
from urllib.parse import urlencode

import pytest
from click.testing import CliRunner

from sattrib.analysis import analyze_folder
from sattrib.cli import main
from sattrib.demo import write_demo
from sattrib.store import Store
from test_dashboard import get


def cli(*args):
    return CliRunner().invoke(main, list(args))


def test_the_demo_job_is_in_the_first_list(tmp_path):
    assert cli("demo").exit_code == 0
    r = cli("list")
    assert r.exit_code == 0 and "1001" in r.output and "nvlink" in r.output, r.output
    ended = r.output.splitlines()[1][:19]
    now = datetime.now(timezone.utc).replace(tzinfo=None)
    assert abs(datetime.fromisoformat(ended) - now) < timedelta(minutes=5)


def test_list_and_hotspots_count_a_job_on_the_day_it_ended(tmp_path):
    """A job that failed 40 days ago, diagnosed today (a replay, a backlog): in neither the
    last 30 days' list nor its hotspots; in the last 60 days' of both."""
    ended = datetime.now(timezone.utc) - timedelta(days=40)
    d, _ = analyze_folder(write_demo(tmp_path / "old", end=ended))
    db = tmp_path / "diagnoses.db"
    Store(db).upsert(d, "default")
    assert "1001" not in cli("list", "-S", "30d", "--database", str(db)).output
    assert "node-02" not in cli("hotspots", "-S", "30d", "--database", str(db)).output
    assert "1001" in cli("list", "-S", "60d", "--database", str(db)).output
    r = cli("hotspots", "-S", "60d", "--database", str(db))
    assert "LAST ENDED (UTC)" in r.output
    assert f"node-02  1         1     nvlink      {ended:%Y-%m-%d %H:%M:%S}" in r.output


def test_a_run_without_an_end_counts_from_its_diagnosis(tmp_path):
    d, _ = analyze_folder(write_demo(tmp_path / "demo"))
    db = Store(tmp_path / "diagnoses.db")
    did = db.upsert(d.model_copy(update={"job": d.job.model_copy(update={"end": None})}),
                    "default")
    row = sqlite3.connect(tmp_path / "diagnoses.db").execute(
        "SELECT ended_at, created_at FROM diagnoses WHERE id = ?", [did]).fetchone()
    assert row[0] == row[1]


# ---- the dashboard: the same basis on every list, page, chart and tile ----------------------

def _at(delta: timedelta) -> str:
    return (datetime.now(timezone.utc) + delta).strftime("%Y-%m-%dT%H:%M:%SZ")


@pytest.fixture(scope="module")
def two_jobs(tmp_path_factory):
    """Two runs of the demo's NVLink fault on node-02: job 2001 ended 40 days ago and was
    diagnosed today (a replay, a backlog); job 2002 ended 20 hours ago, its diagnosis written
    40 days ago (created_at is kept when a run is diagnosed again)."""
    tmp = tmp_path_factory.mktemp("basis")
    db = tmp / "diagnoses.db"
    store = Store(db)
    for job, days in (("2001", 40), ("2002", 20 / 24)):
        ended = datetime.now(timezone.utc) - timedelta(days=days)
        d, _ = analyze_folder(write_demo(tmp / job, end=ended))
        store.upsert(d.model_copy(update={"job_id": job}), "test")
    con = sqlite3.connect(db)
    con.execute("update diagnoses set created_at = ? where job_id = '2002'",
                [_at(-timedelta(days=40))])
    con.commit()
    con.close()
    return db


def _rows(db, page, **params):
    _, body = get(db, f"/diagnoses/{page}.json?_shape=array&" + urlencode(params))
    return json.loads(body)


def test_dashboard_lists_and_counts_a_job_by_its_end(two_jobs):
    month = _at(-timedelta(days=30))[:10]
    assert [r["job_id"] for r in _rows(two_jobs, "recent_failures", since=month)] == ["2002"]
    assert [r["job_id"] for r in _rows(two_jobs, "recent_failures")] == ["2002", "2001"]
    assert [r["job_id"] for r in _rows(two_jobs, "node_history", node="node-02")] == \
        ["2002", "2001"]
    for page in ("node_hotspots", "gpu_hotspots"):
        (row,) = _rows(two_jobs, page)
        assert row["failures"] == 1 and row["last"] > month, page
        assert _rows(two_jobs, page, days="60")[0]["failures"] == 2, page
    days = {r["day"]: r["failures"] for r in _rows(two_jobs, "failures_by_category")}
    assert sum(days.values()) == 1 and days[_at(-timedelta(hours=20))[:10]] == 1
    (drain,) = _rows(two_jobs, "drain_list")
    assert drain["job_id"] == "2002"
    s = json.loads(get(two_jobs, "/-/summary.json")[1])
    assert s["windows"]["24h"]["failures"] == s["windows"]["7d"]["failures"] == 1
    assert [r["job_id"] for r in s["drain"]] == ["2002"]


def test_dashboard_names_the_time_basis(two_jobs):
    _, html = get(two_jobs, "/diagnoses/recent_failures")
    assert '<th class="col-ended_at" scope="col" title="ended_at">Job ended (UTC)</th>' in html
    assert ">Diagnosed (UTC)</th>" in html
    assert "Job ended since (date)" in html
    _, html = get(two_jobs, "/diagnoses/node_history?node=node-02")
    assert "<th>job ended (UTC)</th>" in html


def _copies(db, n):
    """n more failed runs, copies of job 2002 (jobs 3000, 3001, ...)."""
    con = sqlite3.connect(db)
    cols = [r[1] for r in con.execute("pragma table_info(diagnoses)")]
    start = con.execute("select count(*) from diagnoses where cast(job_id as integer) >= 3000"
                        ).fetchone()[0]
    picked = ", ".join("'test/' || (3000 + c.i) || '/0'" if col == "id" else
                       "cast(3000 + c.i as text)" if col == "job_id" else col for col in cols)
    con.execute(f"with recursive c(i) as (select ? union all select i + 1 from c where i < ?) "
                f"insert into diagnoses ({', '.join(cols)}) select {picked} "
                f"from diagnoses, c where id = 'test/2002/0'", [start, start + n - 1])
    con.commit()
    con.close()


def test_recent_failures_says_how_many_match_when_cut(tmp_path, two_jobs):
    db = tmp_path / "diagnoses.db"
    with sqlite3.connect(two_jobs) as src, sqlite3.connect(db) as dst:
        src.backup(dst)                 # with what the writer's WAL still holds
    _, html = get(db, "/diagnoses/recent_failures")
    assert "<h3>2 rows" in html and " shown<" not in html
    _copies(db, 498)
    _, html = get(db, "/diagnoses/recent_failures")
    assert "<h3>500 rows" in html and " shown<" not in html
    _copies(db, 1)
    _, html = get(db, "/diagnoses/recent_failures")
    assert '<span class="rows-matched">500 of 501 shown</span>' in html
    _, html = get(db, "/diagnoses/recent_failures?since=" + _at(-timedelta(days=30))[:10])
    assert '<span class="rows-matched">500 of' not in html and "<h3>500 rows" in html
    _copies(db, 10_000 - 501)
    _, html = get(db, "/diagnoses/recent_failures?outcome=attributed")
    assert '<span class="rows-matched">500 of 10,000 shown</span>' in html
    _copies(db, 1)
    _, html = get(db, "/diagnoses/recent_failures?outcome=attributed")
    assert '<span class="rows-matched">500 of more than 10,000 shown</span>' in html
