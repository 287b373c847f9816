"""The read-only dashboard: every canned query and page answers on a database built by the real
migrations and filled by the real pipeline; log text is always shown as text."""
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from helpers import CASES, ROOT
from sattrib.analysis import analyze_folder, load_rules
from sattrib.config import Settings
from sattrib.demo import write_demo
from sattrib.serve import dashboard_dir, datasette_argv, metadata
from sattrib.store import Store

ARTIFACTS = ROOT / "tests" / "artifacts"
QUERIES = sorted(yaml.safe_load((dashboard_dir() / "metadata.yml").read_text())
                 ["databases"]["diagnoses"]["queries"])


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    d = tmp_path_factory.mktemp("dash")
    path = d / "diagnoses.db"
    rules = load_rules()
    store = Store(path)
    folders = [write_demo(d / "demo")] + sorted(p for p in CASES.iterdir() if p.is_dir())
    for f in folders:
        diag, _ = analyze_folder(f, rules=rules)
        store.upsert(diag, "test", bundle_path=str(f))
    store.sync_rules(rules)
    return path


def _argv(db, allow_sql=False, text="admins"):
    md = db.parent / f"metadata-{allow_sql}-{text}.json"
    st = Settings(database=str(db), serve_allow_sql=allow_sql, serve_evidence_text=text)
    md.write_text(json.dumps(metadata(db, st)))
    argv = datasette_argv(st, db, md)
    return argv[: argv.index("--host")] + argv[argv.index("--setting"):]


def get(db, path, allow_sql=False, text="admins"):
    r = subprocess.run([*_argv(db, allow_sql, text), "--get", path], capture_output=True,
                       text=True, timeout=120)
    return r.returncode, r.stdout


@pytest.mark.parametrize("query", QUERIES)
def test_every_canned_query_runs(db, query):
    rc, html = get(db, f"/diagnoses/{query}")
    assert rc == 0, html[-500:]
    # Datasette shows a failed query as an error message on the page, with status 200.
    assert "message-error" not in html and "<h1>Error" not in html, html[-800:]
    rc, body = get(db, f"/diagnoses/{query}.json?_shape=array")
    assert rc == 0
    rows = json.loads(body)
    assert isinstance(rows, list)
    if query in ("recent_failures", "node_hotspots", "failures_by_category", "unexplained",
                 "missing_telemetry", "gpu_hotspots"):
        assert rows, f"{query} returned no rows"


def test_hotspots_name_the_culprits(db):
    _, body = get(db, "/diagnoses/node_hotspots.json?_shape=array&days=3650")
    nodes = {r["node"] for r in json.loads(body)}
    assert {"node-02", "gn02", "hx2", "r1n1"} <= nodes
    _, body = get(db, "/diagnoses/gpu_hotspots.json?_shape=array&days=3650")
    gpus = {(r["node"], r["gpu"]) for r in json.loads(body)}
    assert ("node-02", "0000:9d:00.0") in gpus
    row = [r for r in json.loads(body) if r["node"] == "node-02"][0]
    assert row["serial"] == "1650000000032" and row["uuid"].startswith("GPU-c41e7f93")


def test_hotspots_count_infrastructure_faults_only(db):
    # A user's exception or OOM names a node and often a GPU: never the node's or GPU's fault.
    import sqlite3
    con = sqlite3.connect(db)
    workload = {r[0] for r in con.execute(
        "select culprit_node from diagnoses where outcome = 'attributed' and family = 'workload'"
        " and category != 'software_incompat' and culprit_node is not null")}
    infra = {r[0] for r in con.execute(
        "select culprit_node from diagnoses where outcome = 'attributed' and"
        " (family in ('gpu', 'nvlink', 'network', 'storage')"
        "  or category in ('software_incompat', 'scheduler_node_failure'))")}
    user_gpus = {r for r in con.execute(
        "select culprit_node, culprit_gpu from diagnoses where outcome = 'attributed'"
        " and family = 'workload' and culprit_gpu is not null")}
    con.close()
    assert workload - infra and user_gpus, "the test database needs workload culprits"
    _, body = get(db, "/diagnoses/node_hotspots.json?_shape=array&days=3650")
    rows = json.loads(body)
    assert {r["node"] for r in rows} == infra
    assert all("application_error" not in (r["categories"] or "") for r in rows)
    _, body = get(db, "/diagnoses/gpu_hotspots.json?_shape=array&days=3650")
    assert not user_gpus & {(r["node"], r["gpu"]) for r in json.loads(body)}


def test_diagnosis_and_node_pages(db):
    rc, html = get(db, "/diagnosis/test/1001/0")
    assert rc == 0
    for text in ("Root cause", "nvlink", "node-02", "0000:9d:00.0", "Timeline across nodes",
                 "Downstream symptoms", "Completeness", "Recommended action", "rules sha256:",
                 "role-root"):
        assert text in html, text
    assert 'href="/node/node-02"' in html and 'href="/diagnoses/rules/gpu~2Exid"' in html
    rc, html = get(db, "/node/node-02")
    assert rc == 0 and "/diagnosis/test/1001/0" in html
    rc, _ = get(db, "/diagnosis/test/999999/0")
    assert rc != 0
    rc, html = get(db, "/diagnoses/recent_failures")
    assert 'href="/diagnosis/test/7001/0"' in html


def test_links_in_tables_and_rules_pages(db):
    rc, html = get(db, "/diagnoses/rules/gpu~2Exid")
    assert rc == 0 and "NVIDIA Xid error" in html
    rc, html = get(db, "/diagnoses/evidence_timeline?diagnosis_id=test%2F7001%2F0",
                   text="all")
    assert rc == 0 and 'href="/diagnosis/test/7001/0"' in html and 'href="/node/gn02"' in html


def test_log_text_is_escaped_everywhere(db):
    marker = "window.__sattrib_pwned"
    for path in ("/diagnosis/test/7015/0", "/diagnoses/unexplained",
                 "/diagnoses/evidence?diagnosis_id=test%2F7015%2F0",
                 "/diagnoses/diagnoses/test~2F7015~2F0"):
        rc, html = get(db, path, text="all")
        assert rc == 0, path
        assert "<script>" + marker not in html and "<img src=x" not in html, path
        if path != "/diagnoses/unexplained":
            assert "&lt;script&gt;" in html or "&amp;lt;script" in html, path


def test_read_only_and_sql_switch(db):
    rc, _ = get(db, "/diagnoses.json?sql=select+1")
    assert rc != 0                                     # arbitrary SQL off by default
    rc, body = get(db, "/diagnoses.json?sql=select+count(*)+as+n+from+diagnoses", allow_sql=True,
                   text="all")
    assert rc == 0 and json.loads(body)["rows"]
    rc, _ = get(db, "/diagnoses.json?sql=delete+from+diagnoses", allow_sql=True, text="all")
    assert rc != 0                                     # the database is opened read-only
    assert Store(db).find("1001")                      # and nothing was deleted


def _free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.mark.browser
def test_browser(db, tmp_path):
    chromium = Path("/usr/bin/chromium")
    if not chromium.exists():
        pytest.skip("Debian's chromium is not installed (tests/integration/setup-system.sh)")
    from playwright.sync_api import sync_playwright
    port = _free_port()
    env = dict(os.environ, SATTRIB_DATABASE=str(db), SATTRIB_SERVE_PORT=str(port))
    srv = subprocess.Popen([sys.executable, "-m", "sattrib", "serve"], env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=str(chromium), args=[
                "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update",
                "--disable-sync"])
            page = browser.new_page(viewport={"width": 1300, "height": 1000})
            page.goto(base + "/diagnoses/recent_failures")
            assert "Recent failures" in page.title() + page.inner_text("h1")
            links = page.locator('a[href="/diagnosis/test/1001/0"]')
            assert "1001" in links.all_inner_texts()
            link = links.first
            page.screenshot(path=str(ARTIFACTS / "recent-failures.png"))
            link.click()
            page.wait_for_url("**/diagnosis/test/1001/0")
            cause = page.locator("div.cause").first.inner_text()
            assert "nvlink" in cause and "node-02" in cause and "0000:9d:00.0" in cause
            root_row = page.locator("tr.root-line").first.inner_text()
            assert "Xid 149" in root_row and "node-02/journal.log:6" in root_row
            page.screenshot(path=str(ARTIFACTS / "diagnosis.png"), full_page=False)
            page.goto(base + "/diagnoses/node_hotspots?days=3650")
            assert page.locator('a[href="/node/node-02"]').count() >= 1
            page.screenshot(path=str(ARTIFACTS / "node-hotspots.png"))
            page.goto(base + "/diagnosis/test/7015/0")
            text = page.locator("div.cause").first.inner_text()
            assert "<script>window.__sattrib_pwned = 1</script>" in text
            assert page.evaluate("typeof window.__sattrib_pwned") == "undefined"
            page.screenshot(path=str(ARTIFACTS / "hostile-markup.png"))
            browser.close()
    finally:
        srv.terminate()
        srv.wait(timeout=10)


def test_every_table_and_view_column_is_described(db):
    """The dashboard explains every column it shows."""
    md = yaml.safe_load((dashboard_dir() / "metadata.yml").read_text())["databases"]["diagnoses"]
    conn = __import__("sqlite3").connect(db)
    names = [r[0] for r in conn.execute(
        "select name from sqlite_master where type in ('table', 'view') and name not like "
        "'sqlite_%' and name not like '\\_%' escape '\\'")]
    for name in names:
        t = md["tables"].get(name)
        assert t is not None and t.get("description") or (t or {}).get("hidden"), name
        if t.get("hidden"):
            continue
        cols = [r[1] for r in conn.execute(f"pragma table_info({name})")]
        missing = [c for c in cols if c not in (t.get("columns") or {})]
        assert not missing, (name, missing)


def test_base_url_for_a_reverse_proxy(db):
    st = Settings(database=str(db), serve_base_url="/sattrib")
    argv = datasette_argv(st, db, db.parent / "m.json")
    assert argv[argv.index("base_url") - 1:argv.index("base_url") + 2] == [
        "--setting", "base_url", "/sattrib/"]
    md = db.parent / "metadata-bu.json"
    md.write_text(json.dumps(metadata(db, st)))
    base = _argv(db)
    r = subprocess.run([*base, "--setting", "base_url", "/sattrib/", "--get",
                        "/diagnosis/test/1001/0"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and 'href="/sattrib/node/node-02"' in r.stdout


def test_a_database_of_any_file_name_keeps_every_link(db, tmp_path):
    import shutil
    other = tmp_path / "gpu-failures.db"
    shutil.copy(db, other)
    rc, html = get(other, "/")
    assert rc == 0 and 'href="diagnoses/recent_failures"' in html
    for path in ("/diagnoses/recent_failures.json?_shape=array",
                 "/diagnoses/failures_by_category.json?_shape=array&days=3650",
                 "/diagnoses/node_hotspots.json?_shape=array&days=3650"):
        rc, body = get(other, path)
        assert rc == 0 and json.loads(body), path
