"""The dashboard shows what sattrib did: the diagnosis page's decisions and escalation, the
home page's repeat offenders and drain list, the repeat_offenders and drain_list canned
queries."""
import json
import sqlite3
import time

import pytest

from helpers import ended_now
from sattrib.actions import act, resume
from sattrib.store import open_store

from test_actions import diagnose, settings, slurm  # noqa: F401  (fixture)
from test_dashboard import LAPTOP, _add, _Served, get, launch_chromium, need_chromium


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


def _ago(seconds: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - seconds))


@pytest.mark.browser
def test_the_drain_list_is_a_to_do_list(tmp_path, slurm):
    """What sattrib did about each node, repeat offenders first with the escalated action, 20
    rows and a link to all; a node sattrib resumed, or that ran a later job, leaves it."""
    need_chromium()
    from playwright.sync_api import sync_playwright
    st = settings(tmp_path)
    db = open_store(st.database)
    for j in ("101", "102", "103"):                  # gn02 three times: a repeat offender
        d = ended_now(diagnose("xid79_srun_combined_log", j))
        act(db, db.upsert(d, "c1"), d, st)
    slurm.node("hx2", "NodeName=hx2 State=IDLE+DRAIN Partitions=gpu Reason=fan [adm@2026-12-01]")
    d = ended_now(diagnose("xid48_ecc_nvidia_smi_xml", "201"))
    act(db, db.upsert(d, "c1"), d, st)
    con = sqlite3.connect(st.database)
    for i in range(25):                              # diagnosed by hand: nothing was done
        _add(con, f"c1/{300 + i}/0", _ago(600 + i), outcome="attributed",
             category="gpu_hardware", family="gpu", culprit_node=f"n{i:02d}",
             action_code="drain_node", blame="machine", trust="kernel", machine_fault=1,
             fault="infrastructure", gpu_fault=1, out_of_service=1)
    con.commit()
    path = tmp_path / "d.db"
    s = json.loads(get(path, "/-/summary.json")[1])
    assert s["drain_total"] == 27 and len(s["drain"]) == 20
    first = s["drain"][0]
    assert (first["node"], first["job_id"], first["action_code"], first["repeat_failures"]) \
        == ("gn02", "103", "drain_node", 3)
    assert first["status"].startswith("drained by sattrib at 20")
    status = {r["node"]: r["status"] for r in s["drain"]}
    assert status["hx2"].startswith("refused: hx2 left as it is: state IDLE+DRAIN")
    assert status["n00"] == "not acted on"
    rows = json.loads(get(path, "/diagnoses/drain_list.json?_shape=array")[1])
    assert len(rows) == 27

    with _Served(path) as srv, sync_playwright() as pw:
        browser = launch_chromium(pw)
        page = browser.new_page(viewport=LAPTOP)
        page.goto(srv.base + "/")
        table = page.locator("table.drain tbody tr")
        assert table.count() == 20
        assert "repeat offender: 3 failed jobs" in table.first.inner_text()
        assert "done" in table.first.inner_text()              # nothing left to copy
        assert "20 of 27 shown" in page.inner_text("#drain-list + p + table + p")
        page.click("text=all 27")
        page.wait_for_url("**/diagnoses/drain_list")
        assert page.locator("table.rows-and-columns tbody tr").count() == 27
        browser.close()

    slurm.node("gn02", "NodeName=gn02 State=IDLE+DRAIN Partitions=gpu "
                       "Reason=sattrib:103 gpu_hardware gpu 0000:3b:00.0")
    assert resume("gn02", 5, db).startswith("gn02: resumed")
    _add(con, "c1/400/0", _ago(0), outcome="attributed", category="application_error",
         family="workload", culprit_node="n99", action_code="fix_application",
         blame="workload", trust="job_output", machine_fault=0, fault="workload", gpu_fault=0,
         out_of_service=0)
    con.execute("insert into job_nodes (diagnosis_id, node, snapshot) values ('c1/400/0', "
                "'hx2', 1)")                         # hx2 ran a later job: it was repaired
    con.commit()
    s = json.loads(get(path, "/-/summary.json")[1])
    assert s["drain_total"] == 25
    assert not {"gn02", "hx2"} & {r["node"] for r in s["drain"]}


@pytest.mark.browser
def test_repeat_offenders_are_one_row_per_culprit_with_links_to_its_jobs(tmp_path, slurm):
    need_chromium()
    from playwright.sync_api import sync_playwright
    st = settings(tmp_path, drain="dry-run")
    db = open_store(st.database)
    for j in ("101", "102", "103", "104"):           # escalated at 103 and again at 104
        d = diagnose("xid79_srun_combined_log", j)
        act(db, db.upsert(d, "c1"), d, st)
    path = tmp_path / "d.db"
    rows = json.loads(get(path, "/diagnoses/repeat_offenders.json?_shape=array")[1])
    assert [(r["job_id"], r["failures"]) for r in rows] == [("104", 4)]
    with _Served(path) as srv, sync_playwright() as pw:
        browser = launch_chromium(pw)
        page = browser.new_page(viewport=LAPTOP)
        page.goto(srv.base + "/diagnoses/repeat_offenders")
        assert page.locator("table.rows-and-columns tbody tr").count() == 1
        earlier = page.locator("td.col-earlier_jobs a")
        assert earlier.all_inner_texts() == ["101", "102", "103"]
        earlier.first.click()
        page.wait_for_url("**/diagnosis/c1/101/0")
        browser.close()
