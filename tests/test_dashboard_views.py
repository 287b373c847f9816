"""Three dashboard views: hook health on the home page, a GPU's page across the nodes it moved
between, and the job page's swimlane. A database made by the real pipeline and Store from the
demo job, varied the way the cluster varies it (a node whose snapshot stopped arriving, a probe
that timed out, the same GPU on another node, evidence with no time, a wide job)."""
import asyncio
import copy
import csv
import dataclasses
import io
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
NODE = "/diagnoses/node_history?node="                    # a node's page, and a GPU's
GPU = "/diagnoses/gpu_history?gpu="
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
        # each job ended when it was diagnosed: the dashboard lists a failure by its end
        con.execute("update diagnoses set job_end = created_at, ended_at = created_at "
                    "where job_id = ?", [job])
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
    assert body.index(f'href="{NODE}node-03"') < body.index(f'href="{NODE}node-01"')
    assert f'<tr class="stale"><td><a href="{NODE}node-03">' in body
    assert "nvidia-smi timed out after 8.0s (1)" in body
    assert 'href="/diagnosis/test/1002/0"' in body
    assert 'href="/diagnoses/hook_health?days=7"' in html and "1 stopped delivering" in html
    # the full list: the canned query, in the same order
    full = _json(db, "/diagnoses/hook_health.json?_shape=array")
    assert [r["node"] for r in full] == [r["node"] for r in h["shown"]]
    rc, html = get(db, "/diagnoses/hook_health")
    assert rc == 0 and 'href="/diagnosis/test/1002/0"' in html and "Last snapshot (job ended, UTC)" in html


def _placements(html) -> list[list[str]]:
    """The GPU page's "Where it was seen" table, as its cells' text."""
    table = html.split('<table class="timeline placements">')[1].split("</table>")[0]
    return [[re.sub(r"<[^>]+>", "", c) for c in re.findall(r"<td[^>]*>(.*?)</td>", row)]
            for row in table.split("<tbody>")[1].split("</tr>")[:-1]]


def test_a_gpu_page_lists_its_diagnoses_on_every_node_it_was_in(db):
    rows = _json(db, f"/diagnoses/gpu_history.json?_shape=array&gpu={SERIAL}")
    assert {r["serial"] for r in rows} == {SERIAL, None} and {r["uuid"] for r in rows} == {UUID}
    assert {r["job_id"] for r in rows} >= {"1001", "1002", "1003", "1004"}
    # by UUID: the same GPU, the same diagnoses (1004 logged no serial)
    assert _json(db, f"/diagnoses/gpu_history.json?_shape=array&gpu={UUID}") == rows
    assert {r["job_id"]: r["serial"] for r in rows}["1004"] is None
    rc, html = get(db, f"{GPU}{SERIAL}")
    assert rc == 0
    assert f"serial {SERIAL} &middot; {UUID}" in html
    # where it went, in order: node, PCI address, first, last, diagnoses, the machine's faults
    placed = _placements(html)
    assert [p[:2] for p in placed] == [["node-02", "0000:9d:00.0"], ["node-07", "0000:3b:00.0"]]
    assert placed[1][2:] == [_created(db, "1003"), _created(db, "1004"), "2", "2"]
    for want in (f'href="{NODE}node-02"', f'href="{NODE}node-07"', "0000:3b:00.0",
                 'href="/diagnosis/test/1003/0"', 'href="/diagnosis/test/1004/0"',
                 f'href="/diagnoses/gpu_history.json?gpu={SERIAL}"', '<svg class="swimlane"'):
        assert want in html, want
    history = html.split('<svg class="swimlane"')[1].split("</svg>")[0]
    assert len(re.findall(r'<g class="lane">', history)) == 2


def test_the_gpu_page_is_linked_from_the_diagnosis_node_and_hotspot_pages(db):
    link = f'href="{GPU}{SERIAL}"'
    for path in ("/diagnosis/test/1001/0", f"{NODE}node-02",
                 "/diagnoses/gpu_hotspots?days=3650"):
        rc, html = get(db, path)
        assert rc == 0 and link in html, path
    assert f'href="{GPU}{UUID}"' in get(db, "/diagnosis/test/1001/0")[1]


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
    rows = f"/diagnoses/gpu_history.json?_shape=array&gpu={SERIAL}"
    paths = [rows, f"{GPU}{SERIAL}", f"/diagnoses/gpu_history.csv?gpu={UUID}",
             "/diagnosis/test/1001/0", "/-/summary.json", "/"]
    pages = _anonymous(db, paths)
    for p in paths:
        r = pages[p]
        assert r.status_code == 200, p
        assert LINE not in r.text and "diagnosis_json" not in r.text, p
        assert str(Path(db).parent) not in r.text, p           # nor the bundle path
    rows = pages[rows].json()
    assert rows and not any({"text", "evidence", "bundle_path"} & set(r) for r in rows)
    page = pages["/diagnosis/test/1001/0"].text
    assert '<svg class="swimlane"' in page and "admins only" in page


def _swim(html):
    return html.split('<svg class="swimlane"')[1].split("</svg>")[0]


def test_the_swimlane_has_a_row_per_node_and_the_root_mark_apart(db):
    rc, html = get(db, "/diagnosis/test/1001/0")
    assert rc == 0
    svg = _swim(html)
    labels = re.findall(r'<text class="lane-label"[^>]*><a href="/diagnoses/node_history\?node='
                        r'([^"]+)">', svg)
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
    assert re.search(r'<text class="lane-label"[^>]*><a href="' + re.escape(NODE) + 'node-02">',
                     svg)
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

        page.locator(f'a[href="{GPU}{SERIAL}"]').first.click()
        page.wait_for_url(re.compile(re.escape(GPU + SERIAL) + "$"))
        body = page.inner_text("body")
        assert "node-02" in body and "node-07" in body and "Where it was seen (2)" in body
        assert page.locator("svg.swimlane g.lane").count() == 2
        page.screenshot(path=str(ARTIFACTS / "gpu.png"), full_page=True)
        browser.close()


# -- the node and GPU pages are canned queries: JSON, CSV, the time limit, 404 -------------------
def test_node_and_gpu_pages_answer_json_and_csv_with_their_parameters(db):
    """node_history and gpu_history, as any canned query: Datasette's JSON (each shape) and CSV
    for the node or GPU named, the same rows the page draws."""
    paths = ["/diagnoses/node_history.json?node=node-03",
             "/diagnoses/node_history.json?node=node-03&_shape=array",
             "/diagnoses/node_history.csv?node=node-03", f"{NODE}node-03",
             f"/diagnoses/gpu_history.json?_shape=objects&gpu={UUID}",
             f"/diagnoses/gpu_history.csv?gpu={SERIAL}"]
    pages = _anonymous(db, paths)
    assert all(pages[p].status_code == 200 for p in paths), {p: pages[p].status_code for p in paths}
    full = pages[paths[0]].json()
    assert full["ok"] and full["query_name"] == "node_history" and "role" in full["columns"]
    assert full["query"]["params"]["node"] == "node-03"
    rows = pages[paths[1]].json()
    assert [r["job_id"] for r in rows] == [r[full["columns"].index("job_id")]
                                           for r in full["rows"]]
    # node-03's Epilog sent nothing for job 1002: the kernel log it lacked is in its row
    late = {r["job_id"]: r for r in rows}["1002"]
    assert late["role"] == "took part" and "kernel" in late["lacked"].split(", ")
    table = list(csv.DictReader(io.StringIO(pages[paths[2]].text)))
    assert [(r["job_id"], r["role"], r["lacked"]) for r in table] == [
        (r["job_id"], r["role"], r["lacked"] or "") for r in rows]
    missing = pages[f"{NODE}node-03"].text.split("<h2>Missing telemetry</h2>")[1]
    kernel = sum("kernel" in (r["lacked"] or "") for r in rows)
    assert f"<td>kernel</td><td>{kernel}</td>" in missing
    by_uuid = pages[paths[4]].json()["rows"]
    by_serial = list(csv.DictReader(io.StringIO(pages[paths[5]].text)))
    assert {r["job_id"] for r in by_serial} == {r["job_id"] for r in by_uuid} >= {
        "1001", "1002", "1003", "1004"}
    assert {r["fault"] for r in by_uuid} == {"infrastructure"}


def test_an_unknown_node_or_gpu_answers_404(db):
    """A page about a node or GPU that no diagnosis names is 404 in every format (it was an
    empty page with 200 for a node): a mistyped name says so, and `curl -f` fails."""
    paths = [f"{NODE}no-such-node", "/diagnoses/node_history.json?node=no-such-node",
             "/diagnoses/node_history.csv?node=no-such-node", "/diagnoses/node_history",
             f"{GPU}no-such-gpu", "/diagnoses/gpu_history.json?gpu=no-such-gpu",
             "/diagnoses/gpu_history.csv?gpu=no-such-gpu", f"{GPU}0000:9d:00.0",
             "/node/no-such-node", "/gpu/no-such-gpu.json"]
    pages = _anonymous(db, paths)
    for p in paths[:-2]:
        assert pages[p].status_code == 404, (p, pages[p].status_code)
    assert "no diagnosis names node no-such-node" in pages[paths[0]].text
    assert pages[paths[1]].json()["error"] == "no diagnosis names node no-such-node"
    assert pages[paths[5]].json()["error"] == "no diagnosis names gpu no-such-gpu"
    # The old addresses lead there.
    assert pages["/node/no-such-node"].headers["location"] == f"{NODE}no-such-node"
    assert pages["/gpu/no-such-gpu.json"].headers["location"] == \
        "/diagnoses/gpu_history.json?gpu=no-such-gpu&_shape=array"


def test_the_old_node_and_gpu_addresses_redirect_to_their_canned_queries(db):
    paths = ["/node/node-02", "/node/node-02.json", f"/gpu/{SERIAL}", f"/gpu/{UUID}.json",
             "/node/odd%20name"]
    pages = _anonymous(db, paths)
    assert {p: (pages[p].status_code, pages[p].headers["location"]) for p in paths} == {
        "/node/node-02": (302, f"{NODE}node-02"),
        "/node/node-02.json": (302, "/diagnoses/node_history.json?node=node-02&_shape=array"),
        f"/gpu/{SERIAL}": (302, f"{GPU}{SERIAL}"),
        f"/gpu/{UUID}.json": (302, f"/diagnoses/gpu_history.json?gpu={UUID}&_shape=array"),
        "/node/odd%20name": (302, f"{NODE}odd+name")}


@pytest.fixture(scope="module")
def busy_db(db, tmp_path_factory):
    """The views database and 40,000 failed jobs on node busy-01, each naming GPU BUSY-1."""
    path = tmp_path_factory.mktemp("busy") / "diagnoses.db"
    src, con = sqlite3.connect(db), sqlite3.connect(path)
    src.backup(con)                               # the rows still in the WAL too
    src.close()
    with con:
        con.execute("""
            with recursive c(i) as (select 0 union all select i + 1 from c where i < 39999)
            insert into diagnoses (id, cluster, job_id, restart, outcome, category, family,
                                   culprit_node, culprit_gpu, gpu_serial, summary, created_at,
                                   ended_at, updated_at, nodes, blame, machine_fault, fault,
                                   gpu_fault, out_of_service)
            select 'busy/' || i || '/0', 'busy', cast(500000 + i as text), 0, 'attributed',
                   'gpu_hardware', 'gpu', 'busy-01', '0000:3b:00.0', 'BUSY-1', 'Xid 79',
                   strftime('%Y-%m-%dT%H:%M:%SZ', 'now', printf('-%d seconds', i)),
                   strftime('%Y-%m-%dT%H:%M:%SZ', 'now', printf('-%d seconds', i)),
                   strftime('%Y-%m-%dT%H:%M:%SZ', 'now'), '["busy-01"]', 'machine', 1,
                   'infrastructure', 1, 1
            from c""")
        con.execute("insert into job_nodes (diagnosis_id, node, snapshot) select id, "
                    "'busy-01', 1 from diagnoses where cluster = 'busy'")
    con.close()
    return path


def _served_get(db, path, limit_ms):
    """`datasette --get` as `sattrib serve` runs it, with serve_sql_time_limit_ms = limit_ms."""
    import subprocess
    from sattrib.serve import datasette_argv
    st = Settings(database=str(db), serve_sql_time_limit_ms=limit_ms)
    md = Path(db).parent / f"metadata-{limit_ms}.json"
    md.write_text(json.dumps(metadata(db, st)))
    argv = datasette_argv(st, db, md)
    argv = argv[: argv.index("--host")] + argv[argv.index("--setting"):]
    r = subprocess.run([*argv, "--get", path], capture_output=True, text=True, timeout=120)
    return r.returncode, r.stdout


@pytest.mark.parametrize("page", ["/diagnoses/node_history{}?node=busy-01",
                                  "/diagnoses/gpu_history{}?gpu=BUSY-1"])
def test_node_and_gpu_pages_keep_to_the_time_limit(busy_db, page):
    """serve_sql_time_limit_ms bounds these pages as every canned query: over it the page is
    Datasette's "SQL Interrupted" (400), within it the newest 500 rows."""
    rc, body = _served_get(busy_db, page.format(".json") + "&_shape=array", 1000)
    assert rc == 0 and len(json.loads(body)) == 500
    rc, body = _served_get(busy_db, page.format(".json"), 10)
    assert rc == 1 and json.loads(body)["title"] == "SQL Interrupted"
    rc, html = _served_get(busy_db, page.format(""), 10)
    assert rc == 1 and "SQL query took too long" in html


@pytest.mark.browser
def test_browser_node_and_gpu_pages(db):
    """A node's page (reached by its old address), its GPU's page across the two nodes it was
    in, the other node's page, another node from the form, and an unknown node."""
    need_chromium()
    from playwright.sync_api import sync_playwright
    with _Served(db) as srv, sync_playwright() as pw:
        browser = launch_chromium(pw)
        page = browser.new_page(viewport=LAPTOP)
        page.goto(srv.base + "/node/node-02")
        assert page.url == srv.base + f"{NODE}node-02"
        assert page.inner_text("h1") == "Node node-02"
        lanes = page.locator("svg.swimlane g.lane text.lane-label").all_text_contents()
        assert lanes == ["caused (infra)", "took part"]
        svg = page.locator("svg.swimlane").bounding_box()
        assert svg["x"] + svg["width"] <= LAPTOP["width"]
        assert page.locator("svg.swimlane rect.mark.infra").count() >= 1
        assert "cause" in page.locator("table.jobs tbody tr.role-root").first.inner_text()
        page.screenshot(path=str(ARTIFACTS / "node-page.png"), full_page=True)
        href = page.locator("p.muted a", has_text="JSON").get_attribute("href")
        rows = page.context.request.get(srv.base + href + "&_shape=array").json()
        assert {r["role"] for r in rows} == {"cause", "took part"}

        page.locator(f'a.gpu[href="{GPU}{SERIAL}"]').click()
        page.wait_for_url(re.compile(re.escape(GPU + SERIAL) + "$"))
        assert "Where it was seen (2)" in page.inner_text("body")
        placed = page.locator("table.placements tbody tr")
        assert [placed.nth(i).locator("td").first.inner_text() for i in range(2)] == [
            "node-02", "node-07"]
        assert page.locator("svg.swimlane g.lane").count() == 2
        assert page.evaluate("document.documentElement.scrollWidth") <= LAPTOP["width"]
        page.screenshot(path=str(ARTIFACTS / "gpu-across-nodes.png"), full_page=True)

        placed.nth(1).locator("a").click()
        page.wait_for_url(re.compile(re.escape(NODE) + "node-07$"))
        jobs = page.locator("table.jobs tbody tr").all_inner_texts()
        assert sorted(re.search(r"\b100[34]\b", j).group() for j in jobs) == ["1003", "1004"]
        assert all("\tcause\t" in j for j in jobs)

        page.fill("input#node", "node-03")
        page.click("form.jobbox input[type=submit]")
        page.wait_for_url(re.compile(re.escape(NODE) + "node-03$"))
        missing = page.locator("h2:has-text('Missing telemetry') + table").inner_text()
        assert "kernel" in missing

        resp = page.goto(srv.base + f"{NODE}no-such-node")
        assert resp.status == 404 and "no diagnosis names node no-such-node" in \
            page.inner_text("body")
        browser.close()
