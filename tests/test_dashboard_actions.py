"""The dashboard shows what sattrib did: the diagnosis page's decisions and escalation, the
home page's repeat offenders, the repeat_offenders canned query."""
import json

from sattrib.actions import act
from sattrib.store import open_store

from test_actions import diagnose, settings, slurm  # noqa: F401  (fixture)
from test_dashboard import get


def test_decisions_and_repeat_offenders_are_shown(tmp_path, slurm):
    st = settings(tmp_path, drain="dry-run")
    db = open_store(st.database)
    for j in ("101", "102", "103"):
        d = diagnose("xid79_srun_combined_log", j)
        act(db, db.upsert(d, "c1"), d, st)
    db.sync_rules(__import__("sattrib.analysis", fromlist=["x"]).load_rules([]))
    path = tmp_path / "d.db"
    rc, html = get(path, "/diagnosis/c1/103/0")
    assert rc == 0, html[-500:]
    assert "What sattrib did" in html and "dry-run" in html
    assert "Repeat offender" in html and 'href="/diagnosis/c1/101/0"' in html
    rc, body = get(path, "/diagnosis/c1/103/0.json")
    doc = json.loads(body)
    assert doc["escalation"]["to"] == "drain_node" and doc["actions"][0]["kind"] == "drain"
    rc, html = get(path, "/")
    assert "Repeat offenders" in html
    assert 'href="/diagnosis/c1/102/0"' in html.split("Repeat offenders", 1)[1]
    rc, body = get(path, "/diagnoses/repeat_offenders.json?_shape=array")
    rows = json.loads(body)
    assert [r["job_id"] for r in rows] == ["103"] and rows[0]["to_action"] == "drain_node"
