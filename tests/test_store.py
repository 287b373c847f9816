"""The diagnoses database: migrations, idempotent upserts, read-only lookups."""
import json
import sqlite3

import pytest

from helpers import CASES
from sattrib.analysis import analyze_folder
from sattrib.errors import UserError
from sattrib.store import Store


@pytest.fixture()
def diag(rules):
    d, _ = analyze_folder(CASES / "xid79_srun_combined_log", rules=rules)
    return d


def counts(path):
    c = sqlite3.connect(path)
    return {t: c.execute(f"select count(*) from {t}").fetchone()[0]
            for t in ("diagnoses", "evidence", "candidates", "missing_evidence", "job_nodes",
                      "failed_probes", "diagnoses_fts", "evidence_fts")}


def test_upsert_is_idempotent(tmp_path, diag):
    db = tmp_path / "d.db"
    s = Store(db)
    did = s.upsert(diag, "c1")
    first = counts(db)
    s.upsert(diag, "c1")
    Store(db).upsert(diag, "c1")          # a second process opening it: migrations not re-run
    assert counts(db) == first and first["diagnoses"] == 1 and first["evidence"] == len(diag.evidence)
    row = sqlite3.connect(db).execute(
        "select outcome, category, culprit_node, rules_version, diagnosis_json from diagnoses "
        "where id = ?", [did]).fetchone()
    assert row[:3] == ("attributed", "gpu_hardware", "gn02")
    assert json.loads(row[4]) == json.loads(diag.model_dump_json())
    assert sqlite3.connect(db).execute("pragma journal_mode").fetchone()[0] == "wal"


def test_runs_and_clusters_are_separate_rows(tmp_path, diag):
    s = Store(tmp_path / "d.db")
    s.upsert(diag, "c1")
    s.upsert(diag.model_copy(update={"restart": 1}), "c1")
    s.upsert(diag, "c2")
    assert counts(tmp_path / "d.db")["diagnoses"] == 3
    assert len(s.find("7001")) == 3 and len(s.find("7001", cluster="c1")) == 2
    assert [r["restart"] for r in s.find("7001", "c1", 1)] == [1]


def test_created_at_survives_an_update(tmp_path, diag):
    s = Store(tmp_path / "d.db")
    did = s.upsert(diag, "c1")
    c = sqlite3.connect(tmp_path / "d.db")
    c.execute("update diagnoses set created_at = '2000-01-01T00:00:00Z' where id = ?", [did])
    c.commit()
    s.upsert(diag, "c1")
    assert c.execute("select created_at from diagnoses").fetchone()[0] == "2000-01-01T00:00:00Z"


def test_readonly_open_of_missing_db_is_a_user_error(tmp_path):
    with pytest.raises(UserError) as e:
        Store(tmp_path / "nope.db", readonly=True)
    assert "sattrib demo" in e.value.hint


def test_migrations_recorded(tmp_path):
    Store(tmp_path / "d.db")
    names = [r[0] for r in sqlite3.connect(tmp_path / "d.db").execute(
        "select name from _sqlite_migrations where migration_set = 'sattrib'")]
    assert names and names[0] == "m001_diagnoses"


def test_job_nodes_and_search_indexes_follow_the_rows(tmp_path, diag):
    assert len(diag.job.nodes) >= 2
    db = tmp_path / "d.db"
    Store(db).upsert(diag, "c1")
    c = sqlite3.connect(db)
    assert sorted(r[0] for r in c.execute("select node from job_nodes")) == sorted(diag.job.nodes)
    assert c.execute("select count(*) from evidence_fts where evidence_fts match 'Xid'"
                     ).fetchone()[0] >= 1
    # A database from before these migrations gets them, filled from the rows it holds.
    c.execute("drop table job_nodes")
    c.execute("delete from _sqlite_migrations where name = 'm005_job_nodes'")
    c.commit()
    c.close()
    Store(db)
    c = sqlite3.connect(db)
    assert sorted(r[0] for r in c.execute("select node from job_nodes")) == sorted(diag.job.nodes)


def test_blame_columns_are_filled_for_rows_stored_before_them(tmp_path, rules):
    """A database written before the blame columns gets them from the rows it holds: a
    diagnosis from before causes carried a blame takes its category's, one from before they
    carried a trust takes its evidence's sources."""
    db = tmp_path / "d.db"
    s = Store(db)
    for case, job in (("xid79_srun_combined_log", "1"), ("host_oom_cgroup_kill", "2"),
                      ("app_exception_fake_kernel_lines", "3"), ("hang_all_ranks_unattributed", "4")):
        d, _ = analyze_folder(CASES / case, rules=rules)
        s.upsert(d.model_copy(update={"job_id": job}), "c1")
    c = sqlite3.connect(db)
    want = c.execute("select job_id, blame, trust, machine_fault, out_of_service from diagnoses "
                     "order by job_id").fetchall()
    assert want == [("1", "machine", "kernel", 1, 1), ("2", "workload", "kernel", 0, 0),
                    ("3", "workload", "job_output", 0, 0), ("4", None, None, 0, 0)]
    for col in ("blame", "trust", "machine_fault", "out_of_service"):
        c.execute(f"alter table diagnoses drop column {col}")
    c.execute("update diagnoses set diagnosis_json = json_remove(diagnosis_json, "
              "'$.root_cause.blame')")
    c.execute("update diagnoses set diagnosis_json = json_remove(diagnosis_json, "
              "'$.root_cause.trust') where job_id = '1'")
    c.execute("delete from _sqlite_migrations where name = 'm009_blame'")
    c.commit()
    c.close()
    Store(db)
    c = sqlite3.connect(db)
    assert c.execute("select job_id, blame, trust, machine_fault, out_of_service from diagnoses "
                     "order by job_id").fetchall() == want


def test_fault_columns_are_filled_for_rows_stored_before_them(tmp_path, rules):
    """A database written before the fault and gpu_fault columns gets them from the blame,
    trust and category its rows hold (engine/taxonomy.py decides them)."""
    db = tmp_path / "d.db"
    s = Store(db)
    for case, job in (("xid79_srun_combined_log", "1"), ("host_oom_cgroup_kill", "2"),
                      ("app_exception_fake_kernel_lines", "3"), ("hang_all_ranks_unattributed", "4"),
                      ("ib_port_down_roce", "5")):
        d, _ = analyze_folder(CASES / case, rules=rules)
        s.upsert(d.model_copy(update={"job_id": job}), "c1")
    c = sqlite3.connect(db)
    c.execute("update diagnoses set trust = 'job_output', machine_fault = 0 where job_id = '5'")
    c.commit()
    query = "select job_id, fault, gpu_fault from diagnoses order by job_id"
    assert c.execute(query).fetchall()[:4] == [
        ("1", "infrastructure", 1), ("2", "workload", 0), ("3", "workload", 0), ("4", None, 0)]
    for col in ("fault", "gpu_fault"):
        c.execute(f"alter table diagnoses drop column {col}")
    c.execute("delete from _sqlite_migrations where name = 'm012_fault'")
    c.commit()
    c.close()
    Store(db)
    c = sqlite3.connect(db)
    assert c.execute(query).fetchall() == [
        ("1", "infrastructure", 1), ("2", "workload", 0), ("3", "workload", 0), ("4", None, 0),
        ("5", "unconfirmed", 0)]


def test_summaries_stored_before_they_were_public_are_rewritten(tmp_path, rules):
    """A database holding summaries from before they were built from fields (one quoting an
    exception's secret value, one ambiguous pair) gets them rewritten from each cause's
    fields once; the evidence line keeps its text for those who may read it."""
    from dataclasses import replace
    from test_public_text import analyze
    secret = "sk-live-SECRET123"
    d = analyze(tmp_path / "a", {"logs/job.out": f"[rank3]: KeyError: 'api_token={secret}'"},
                rules)
    old = d.model_copy(update={"job_id": "1", "root_cause": replace(
        d.root_cause, summary=f"rank 3 raised KeyError: 'api_token={secret}'"),
        "explanation": f"application_error: rank 3 raised KeyError: '{secret}'."})
    two = d.model_copy(update={"job_id": "2", "outcome": type(d.outcome)("ambiguous"),
                               "root_cause": None, "candidates": [
                                   replace(d.root_cause, summary=secret, node="n1"),
                                   replace(d.root_cause, summary=secret, node="n'2", rank=None)]})
    db = tmp_path / "d.db"
    s = Store(db)
    s.upsert(old, "c")
    s.upsert(two, "c")
    c = sqlite3.connect(db)
    c.execute("delete from _sqlite_migrations where name = 'm010_public_summaries'")
    c.commit()
    Store(db)
    rows = dict(c.execute("select job_id, summary from diagnoses"))
    assert rows == {"1": "application_error rank 3",
                    "2": "Several causes fit: application_error on n1 rank 3; application_error."}
    assert [r[0] for r in c.execute("select summary from candidates order by idx")] == [
        "application_error on n1 rank 3", "application_error"]
    stored = json.loads(c.execute("select diagnosis_json from diagnoses where job_id = '1'")
                        .fetchone()[0])
    assert stored["root_cause"]["summary"] == "application_error rank 3"
    assert stored["explanation"] == "application_error rank 3."
    public = " ".join(r[0] or "" for r in c.execute(
        "select diagnosis_json from diagnoses union all select summary from diagnoses_fts "
        "union all select summary from candidates"))
    assert secret not in public.replace(stored["evidence"][0]["text"], "")
    assert c.execute("select count(*) from diagnoses_fts where diagnoses_fts match 'SECRET123'"
                     ).fetchone()[0] == 0
    assert any(secret in r[0] for r in c.execute("select text from evidence"))


def test_the_failure_list_reads_the_index_on_the_jobs_end(tmp_path, diag):
    """Recent failures, filtered by partition, user and category, walks m015's covering index
    in the order it lists (the job's end) rather than every row (the million-row dashboard
    test times it)."""
    import yaml
    from sattrib.serve import dashboard_dir
    Store(tmp_path / "d.db").upsert(diag, "c1")
    sql = yaml.safe_load((dashboard_dir() / "metadata.yml").read_text())[
        "databases"]["diagnoses"]["queries"]["recent_failures"]["sql"]
    con = sqlite3.connect(tmp_path / "d.db")
    con.create_function("escape_fts", 1, str)        # the dashboard's own, for the plan only
    params = dict.fromkeys(("q", "since", "until", "node", "outcome", "family", "infra"), "")
    params.update(partition="debug", user="u10", category="nvlink")
    plan = " ".join(r[3] for r in con.execute("explain query plan " + sql, params))
    assert "SCAN diagnoses USING INDEX idx_diagnoses_ended_filter" in plan, plan
    assert "idx_diagnoses_filter" not in {r[0] for r in con.execute(
        "select name from sqlite_master where type = 'index'")}
