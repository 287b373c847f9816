"""Three dashboard views: hook health on the home page, a GPU's page across the nodes it moved
between, and the job page's swimlane. A database made by the real pipeline and Store from the
demo job, varied the way the cluster varies it (a node whose snapshot stopped arriving, a probe
that timed out, the same GPU on another node, evidence with no time, a wide job)."""
import asyncio
import copy
import dataclasses
import json
import re
import sqlite3
from pathlib import Path

import pytest

from sattrib.analysis import analyze_folder, load_rules
from sattrib.config import Settings
from sattrib.demo import write_demo
from sattrib.serve import dashboard_dir, metadata
from sattrib.collect import QUIET_NOTE
from sattrib.engine.models import SourceState
from sattrib.store import Store, failed_probes, snapshots
from test_dashboard import (ARTIFACTS, LAPTOP, _Served, get, launch_chromium,
                            need_chromium)

SERIAL = "1650000000032"                                  # the demo's culprit GPU
UUID = "GPU-c41e7f93-2a6d-4b8e-8f05-3d7a9c1e5b03"
LINE = "NVRM: Xid (PCI:0000:9d:00): 149"                  # the demo's root evidence line
PROBES = ("probe=journalctl source=kernel ok=true reason=- seconds=0.05\n"
          "probe=nvidia-smi source=gpu ok=false reason=timed out after 8.0s seconds=8.00\n"
          "snapshot trusted by owner uid 0\n")


def _as(diag, job_id, **root):
    d = copy.deepcopy(diag)
    d.job_id = job_id
    for k, v in root.items():
        setattr(d.root_cause, k, v)
    return d


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    d = tmp_path_factory.mktemp("views")
    rules = load_rules()
    demo, _ = analyze_folder(write_demo(d / "demo"), rules=rules)
    # Job 1002: node-03's Epilog sent nothing, node-04's nvidia-smi timed out.
    silent = write_demo(d / "silent")
    (silent / "node-03" / "journal.log").unlink()
    (silent / "node-04" / "sattrib-probes.txt").write_text(PROBES)
    late, _ = analyze_folder(silent, rules=rules)
    assert "nvidia-smi:node-04 timed out after 8.0s" in late.completeness.failed_probes
    untimed = _as(demo, "1005")
    untimed.evidence = [dataclasses.replace(e, timestamp=None) for e in untimed.evidence]
    wide = _as(demo, "1006")
    root = [e for e in demo.evidence if e.id == demo.root_cause.evidence[0]]
    sym = [e for e in demo.evidence if e.role.value == "symptom" and e.timestamp][0]
    wide.evidence = root + [dataclasses.replace(sym, id=f"w{i}", node=f"n{i:02d}")
                            for i in range(40)]
    # Job 1007 ended by the scheduler (a NODE_FAIL exits 0): no snapshot was due, and node-01,
    # which Slurm reports down, is noted as silent.
    quiet = _as(demo, "1007")
    quiet.completeness.present = [t for t in demo.completeness.present
                                  if not t.startswith(("kernel:", "gpu:"))]
    quiet.completeness.notes = [f"{QUIET_NOTE}: the node Epilogs did not take snapshots",
                                "no snapshot from node-01 (Slurm reports it down)"]
    quiet.completeness.entries = [e for e in demo.completeness.entries
                                  if e.source not in ("kernel", "gpu")] + [
        SourceState(source="snapshot", node="node-01", state="missing",
                    reason="Slurm reports it down")] + [
        SourceState(source="snapshot", node=n, state="not_due", reason=QUIET_NOTE)
        for n in ("node-02", "node-03", "node-04")]
    path = d / "diagnoses.db"
    store = Store(path)
    for diag in (demo, _as(late, "1002"),
                 # the same GPU moved to node-07; one diagnosis there logged its UUID only
                 _as(demo, "1003", node="node-07", gpu="0000:3b:00.0",
                     first_seen="2026-11-20T08:00:00Z"),
                 _as(demo, "1004", node="node-07", gpu="0000:3b:00.0", gpu_serial=None,
                     first_seen="2026-11-25T16:30:00Z"),
                 untimed, wide, quiet):
        store.upsert(diag, "test", bundle_path=str(d / "demo"))
    store.sync_rules(rules)
    con = sqlite3.connect(path)
    for job, ago in (("1001", "-2 days"), ("1003", "-1 day"), ("1004", "-1 day"),
                     ("1005", "-1 day"), ("1006", "-1 day"), ("1007", "-1 day"),
                     ("1002", "-1 minute")):
        con.execute("update diagnoses set created_at = strftime('%Y-%m-%dT%H:%M:%SZ', 'now', ?)"
                    " where job_id = ?", [ago, job])
    con.commit()
    con.close()
    return path


def _json(db, path):
    rc, body = get(db, path)
    assert rc == 0, body[-400:]
    return json.loads(body)


def _created(db, job):
    con = sqlite3.connect(db)
    try:
        return con.execute("select created_at from diagnoses where job_id = ?", [job]).fetchone()[0]
    finally:
        con.close()


def test_snapshot_delivery_is_stored_per_node():
    """From the typed completeness entries: the worker's record of each node's snapshot where
    it says one, else whether a source the snapshot delivers came (a folder collected by
    hand); no note is parsed."""
    def e(source, node, state, probe=None, reason=None):
        return dict(source=source, node=node, state=state, probe=probe, reason=reason)
    hand = {"entries": [e("kernel", "a", "present"), e("output", "b", "present"),
                        e("gpu", "a", "present"), e("metrics", "c", "present"),
                        e("gpu", "d", "probe_failed", probe="nvidia-smi",
                          reason="timed out after 8.0s")],
            "notes": ["no snapshot from b (Slurm reports it down)"]}
    assert snapshots(hand, ["a", "b", "c", "d"]) == {"a": 1, "b": 0, "c": 0, "d": 1}
    assert failed_probes(hand) == [{"probe": "nvidia-smi", "node": "d",
                                    "reason": "timed out after 8.0s"}]
    worker = {"entries": hand["entries"] + [
        e("snapshot", "a", "present"), e("snapshot", "b", "not_due", reason=QUIET_NOTE),
        e("snapshot", "e", "missing", reason="Slurm reports it down")]}
    assert snapshots(worker, ["a", "b", "e"]) == {"a": 1, "b": None, "e": 0}


def test_a_database_from_before_hook_health_gets_it_filled_in(db, tmp_path):
    old = tmp_path / "diagnoses.db"
    src, con = sqlite3.connect(db), sqlite3.connect(old)
    src.backup(con)                               # the rows still in the WAL too
    src.close()
    want = con.execute("select * from job_nodes order by 1, 2").fetchall()
    probes = con.execute("select * from failed_probes order by 1, 2, 3").fetchall()
    con.execute("drop table failed_probes")
    con.execute("alter table job_nodes drop column snapshot")
    con.execute("drop index idx_diagnoses_gpu_serial")
    con.execute("drop index idx_diagnoses_gpu_uuid")
    con.execute("delete from _sqlite_migrations where name = 'm007_hook_health'")
    con.commit()
    con.close()
    Store(old)
    con = sqlite3.connect(old)
    assert con.execute("select * from job_nodes order by 1, 2").fetchall() == want
    assert con.execute("select * from failed_probes order by 1, 2, 3").fetchall() == probes
    assert ("test/1002/0", "node-03", 0) in want and ("test/1002/0", "node-04", 1) in want
    assert ("test/1007/0", "node-01", 0) in want and ("test/1007/0", "node-02", None) in want
    con.close()


def test_home_page_shows_hook_health_with_the_silent_node_first(db):
    h = _json(db, "/-/summary.json")["hook_health"]
    first = h["shown"][0]
    assert first["node"] == "node-03" and first["missed"] == 1 and h["silent"] == 1
    # its last snapshot is from the day before; the latest diagnosis naming it is job 1002
    assert first["last_snapshot_at"] == _created(db, "1003") < first["last_diagnosis_at"]
    assert first["last_diagnosis"] == "test/1002/0" and "kernel (1)" in first["missing"]
    rows = {r["node"]: r for r in h["shown"]}
    assert set(rows) == {"node-01", "node-02", "node-03", "node-04"}
    assert rows["node-04"]["failed_probes"] == "nvidia-smi timed out after 8.0s (1)"
    assert rows["node-04"]["missed"] == 0 and rows["node-04"]["last_snapshot_at"] == \
        _created(db, "1002")
    rc, html = get(db, "/")
    assert rc == 0
    table = html.split('<table class="timeline hook-health">')[1].split("</table>")[0]
    body = table.split("<tbody>")[1]
    assert body.index('href="/node/node-03"') < body.index('href="/node/node-01"')
    assert '<tr class="stale"><td><a href="/node/node-03">' in body
    assert "nvidia-smi timed out after 8.0s (1)" in body
    assert 'href="/diagnosis/test/1002/0"' in body
    assert 'href="/diagnoses/hook_health?days=7"' in html and "1 stopped delivering" in html
    # the full list: the canned query, in the same order
    full = _json(db, "/diagnoses/hook_health.json?_shape=array")
    assert [r["node"] for r in full] == [r["node"] for r in h["shown"]]
    rc, html = get(db, "/diagnoses/hook_health")
    assert rc == 0 and 'href="/diagnosis/test/1002/0"' in html and "Last snapshot (UTC)" in html


def test_a_gpu_page_lists_its_diagnoses_on_every_node_it_was_in(db):
    page = _json(db, f"/gpu/{SERIAL}.json")
    assert page["serials"] == [SERIAL] and page["uuids"] == [UUID]
    assert {r["job_id"] for r in page["diagnoses"]} >= {"1001", "1002", "1003", "1004"}
    assert [(p["node"], p["pci"]) for p in page["placements"]] == [
        ("node-02", "0000:9d:00.0"), ("node-07", "0000:3b:00.0")]      # where it went, in order
    at = {p["node"]: p for p in page["placements"]}
    assert at["node-07"]["diagnoses"] == 2 and at["node-07"]["infrastructure"] == 2
    assert (at["node-07"]["first"], at["node-07"]["last"]) == ("2026-11-20T08:00:00Z",
                                                               "2026-11-25T16:30:00Z")
    # by UUID: the same GPU, the same diagnoses (1004 logged no serial)
    by_uuid = _json(db, f"/gpu/{UUID}.json")
    assert by_uuid["diagnoses"] == page["diagnoses"]
    assert {r["job_id"]: r["serial"] for r in page["diagnoses"]}["1004"] is None
    rc, html = get(db, f"/gpu/{SERIAL}")
    assert rc == 0
    for want in ('href="/node/node-02"', 'href="/node/node-07"', "0000:3b:00.0",
                 'href="/diagnosis/test/1003/0"', 'href="/diagnosis/test/1004/0"',
                 f'href="/gpu/{SERIAL}.json"', '<svg class="swimlane"'):
        assert want in html, want
    history = html.split('<svg class="swimlane"')[1].split("</svg>")[0]
    assert len(re.findall(r'<g class="lane">', history)) == 2
    rc, _ = get(db, "/gpu/no-such-gpu")
    assert rc != 0


def test_the_gpu_page_is_linked_from_the_diagnosis_node_and_hotspot_pages(db):
    link = f'href="/gpu/{SERIAL}"'
    for path in ("/diagnosis/test/1001/0", "/node/node-02",
                 "/diagnoses/gpu_hotspots?days=3650"):
        rc, html = get(db, path)
        assert rc == 0 and link in html, path
    assert f'href="/gpu/{UUID}"' in get(db, "/diagnosis/test/1001/0")[1]


def _anonymous(db, paths):
    from datasette.app import Datasette
    st = Settings(database=str(db))            # evidence text: admins only (the default)
    d = dashboard_dir()

    async def go():
        ds = Datasette(files=[str(db)], metadata=metadata(db, st),
                       template_dir=str(d / "templates"), plugins_dir=str(d / "plugins"))
        await ds.invoke_startup()
        return {p: await ds.client.get(p) for p in paths}
    return asyncio.run(go())


def test_anonymous_gpu_and_swimlane_pages_hold_no_evidence_text(db):
    paths = [f"/gpu/{SERIAL}.json", f"/gpu/{SERIAL}", f"/gpu/{UUID}.json",
             "/diagnosis/test/1001/0", "/-/summary.json", "/"]
    pages = _anonymous(db, paths)
    for p in paths:
        r = pages[p]
        assert r.status_code == 200, p
        assert LINE not in r.text and "diagnosis_json" not in r.text, p
        assert str(Path(db).parent) not in r.text, p           # nor the bundle path
    rows = pages[f"/gpu/{SERIAL}.json"].json()["diagnoses"]
    assert rows and not any({"text", "evidence", "bundle_path"} & set(r) for r in rows)
    page = pages["/diagnosis/test/1001/0"].text
    assert '<svg class="swimlane"' in page and "admins only" in page


def _swim(html):
    return html.split('<svg class="swimlane"')[1].split("</svg>")[0]


def test_the_swimlane_has_a_row_per_node_and_the_root_mark_apart(db):
    rc, html = get(db, "/diagnosis/test/1001/0")
    assert rc == 0
    svg = _swim(html)
    labels = re.findall(r'<text class="lane-label"[^>]*><a href="/node/([^"]+)">', svg)
    assert labels[0] == "node-02" and sorted(labels) == ["node-01", "node-02", "node-03",
                                                          "node-04"]
    roots = re.findall(r'<rect class="mark root"[^>]*fill="(#\w+)" fill-opacity="([\d.]+)">'
                       r'<title>([^<]*)</title>', svg)
    assert len(roots) == 1
    fill, _, title = roots[0]
    assert title == "node-02 · 2026-11-02T10:14:07Z · root · nvlink"
    muted = re.findall(r'<rect class="mark symptom"[^>]*fill="(#\w+)" fill-opacity="([\d.]+)">',
                       svg)
    assert muted and all(f != fill and float(o) < 1 for f, o in muted)
    assert LINE not in svg and "journal.log" not in svg          # never the line itself


def test_the_swimlane_is_absent_without_timed_evidence_and_capped_for_wide_jobs(db):
    rc, html = get(db, "/diagnosis/test/1005/0")
    assert rc == 0 and '<svg class="swimlane"' not in html and "Timeline across nodes" in html
    rc, html = get(db, "/diagnosis/test/1006/0")
    svg = _swim(html)
    assert svg.count('<g class="lane">') == 32
    assert re.search(r'<text class="lane-label"[^>]*><a href="/node/node-02">', svg)
    assert "+9 more nodes not drawn" in html                      # 41 nodes: the root's + 40


@pytest.mark.browser
def test_browser_views(db):
    need_chromium()
    from playwright.sync_api import sync_playwright
    with _Served(db) as srv, sync_playwright() as pw:
        browser = launch_chromium(pw)
        page = browser.new_page(viewport=LAPTOP)
        page.goto(srv.base + "/")
        rows = page.locator("table.hook-health tbody tr")
        assert rows.first.get_attribute("class") == "stale"
        assert rows.first.locator("td").first.inner_text() == "node-03"
        page.locator("#hook-health").scroll_into_view_if_needed()
        page.screenshot(path=str(ARTIFACTS / "home-hook-health.png"))

        page.goto(srv.base + "/diagnosis/test/1001/0")
        svg = page.locator("svg.swimlane")
        box = svg.bounding_box()
        assert box["width"] > 300 and box["x"] + box["width"] <= LAPTOP["width"]
        assert page.locator("svg.swimlane g.lane").count() == 4
        root = page.locator("svg.swimlane rect.mark.root")
        assert root.count() == 1
        rb = root.bounding_box()
        assert box["x"] <= rb["x"] and rb["x"] + rb["width"] <= box["x"] + box["width"]
        colour = page.evaluate("s => getComputedStyle(document.querySelector(s)).fill",
                               "svg.swimlane rect.mark.root")
        other = page.evaluate("s => getComputedStyle(document.querySelector(s)).fill",
                              "svg.swimlane rect.mark.symptom")
        assert colour != other
        svg.scroll_into_view_if_needed()
        page.screenshot(path=str(ARTIFACTS / "diagnosis-swimlane.png"))

        page.locator(f'a[href="/gpu/{SERIAL}"]').first.click()
        page.wait_for_url(f"**/gpu/{SERIAL}")
        body = page.inner_text("body")
        assert "node-02" in body and "node-07" in body and "Where it was seen (2)" in body
        assert page.locator("svg.swimlane g.lane").count() == 2
        page.screenshot(path=str(ARTIFACTS / "gpu.png"), full_page=True)
        browser.close()
