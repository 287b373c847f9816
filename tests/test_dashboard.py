"""The read-only dashboard: every canned query and page answers on a database built by the real
migrations and filled by the real pipeline; log text is always shown as text."""
import json
import os
import shlex
import socket
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest
import yaml

from helpers import CASES, ROOT, ended_now
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
    now = datetime.now(timezone.utc)
    for f in folders:
        diag, _ = analyze_folder(f, rules=rules)
        store.upsert(ended_now(diag, now), "test", bundle_path=str(f))
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


# The pages about one node or GPU, opened on one the test database names.
SUBJECTS = {"node_history": "node=node-02", "gpu_history": "gpu=1650000000032"}


@pytest.mark.parametrize("query", QUERIES)
def test_every_canned_query_runs(db, query):
    text = "all" if query == "search_evidence" else "admins"     # evidence lines: admins
    args = SUBJECTS.get(query, "")
    rc, html = get(db, f"/diagnoses/{query}?{args}", text=text)
    assert rc == 0, html[-500:]
    # Datasette shows a failed query as an error message on the page, with status 200.
    assert "message-error" not in html and "<h1>Error" not in html, html[-800:]
    rc, body = get(db, f"/diagnoses/{query}.json?_shape=array&{args}", text=text)
    assert rc == 0
    rows = json.loads(body)
    assert isinstance(rows, list)
    if query in ("recent_failures", "node_hotspots", "failures_by_category", "unexplained",
                 "missing_telemetry", "gpu_hotspots", "hook_health", "workload_failures",
                 *SUBJECTS):
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
    # A user's exception or OOM names a node and often a GPU: never the node's or GPU's fault;
    # nor a hardware fault that only the job's output reports.
    import sqlite3
    con = sqlite3.connect(db)
    cause = "json_extract(diagnosis_json, '$.root_cause.{}')".format
    workload = {r[0] for r in con.execute(
        f"select culprit_node from diagnoses where outcome = 'attributed' and {cause('blame')}"
        " = 'workload' and culprit_node is not null")}
    infra = {r[0] for r in con.execute(
        f"select culprit_node from diagnoses where outcome = 'attributed' and {cause('blame')}"
        f" = 'machine' and {cause('trust')} != 'job_output'")}
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
    assert 'href="/diagnoses/node_history?node=node-02"' in html
    assert 'href="/diagnoses/rules/gpu~2Exid"' in html
    rc, html = get(db, "/diagnoses/node_history?node=node-02")
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
    assert rc == 0 and 'href="/diagnosis/test/7001/0"' in html
    assert 'href="/diagnoses/node_history?node=gn02"' in html


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


class _Served:
    """`sattrib serve` on a free port, stopped on exit."""

    def __init__(self, db):
        self.port = _free_port()
        env = dict(os.environ, SATTRIB_DATABASE=str(db), SATTRIB_SERVE_PORT=str(self.port))
        self.proc = subprocess.Popen([sys.executable, "-m", "sattrib", "serve"], env=env,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.base = f"http://127.0.0.1:{self.port}"

    def __enter__(self):
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        return self

    def __exit__(self, *exc):
        self.proc.terminate()
        self.proc.wait(timeout=10)


LAPTOP = {"width": 1366, "height": 768}
CHROMIUM = Path("/usr/bin/chromium")


def need_chromium() -> None:
    """Skip without Debian's Chromium; make the folder the screenshots go to."""
    if not CHROMIUM.exists():
        pytest.skip("Debian's chromium is not installed (tests/integration/setup-system.sh)")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)


def launch_chromium(pw):
    """Headless Chromium for playwright, quiet: no sandbox (root), no GPU, no network of its own."""
    return pw.chromium.launch(executable_path=str(CHROMIUM), args=[
        "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"])


@pytest.mark.browser
def test_browser(db, tmp_path):
    need_chromium()
    from playwright.sync_api import sync_playwright
    empty = tmp_path / "empty.db"
    Store(empty)
    with _Served(db) as srv, _Served(empty) as srv_empty, sync_playwright() as pw:
        base = srv.base
        browser = launch_chromium(pw)
        page = browser.new_page(viewport=LAPTOP)
        page.goto(base + "/")
        assert "Drain list" in page.inner_text("body")
        drain = page.locator("table.drain code.copy").all_inner_texts()
        assert 'scontrol update NodeName=gn02 State=DRAIN Reason="sattrib:7001 gpu_hardware"' \
            in drain
        page.screenshot(path=str(ARTIFACTS / "home.png"))
        page.fill("#job-id", "1001.batch")
        page.click("form.jobbox input[type=submit]")
        page.wait_for_url("**/diagnosis/test/1001/0")

        page.goto(base + "/diagnoses/recent_failures")
        assert "Recent failures" in page.title() + page.inner_text("h1")
        headers = page.locator("table.rows-and-columns th").all_inner_texts()
        assert headers[0] == "Job ended (UTC)" and "Action" in headers and "Culprit node" in headers
        # On a laptop screen: nothing runs off to the right (the action and the time are
        # visible) and more than four rows fit under the filters.
        assert page.evaluate("document.documentElement.scrollWidth") <= LAPTOP["width"]
        action = page.locator("td.col-action").first.bounding_box()
        assert action["x"] + action["width"] <= LAPTOP["width"]
        rows = page.locator("table.rows-and-columns tbody tr")
        visible = sum(1 for i in range(rows.count())
                      if rows.nth(i).bounding_box()["y"] + rows.nth(i).bounding_box()["height"]
                      <= LAPTOP["height"])
        assert visible > 4, visible
        page.screenshot(path=str(ARTIFACTS / "recent-failures.png"))
        links = page.locator('a[href="/diagnosis/test/1001/0"]')
        assert "1001" in links.all_inner_texts()
        page.fill("input[name=node]", "node-03")
        page.click("form.sql input[type=submit]")
        page.wait_for_url("**node=node-03**")
        assert page.locator("table.rows-and-columns tbody tr").count() == 1
        page.locator('a[href="/diagnosis/test/1001/0"]').first.click()
        page.wait_for_url("**/diagnosis/test/1001/0")
        cause = page.locator("div.cause").first.inner_text()
        assert "nvlink" in cause and "node-02" in cause and "0000:9d:00.0" in cause
        root_row = page.locator("tr.root-line").first.inner_text()
        assert "Xid 149" in root_row and "node-02/journal.log:6" in root_row
        page.screenshot(path=str(ARTIFACTS / "diagnosis.png"), full_page=False)
        page.goto(base + "/diagnoses/node_hotspots?days=3650")
        assert page.locator('a[href="/diagnoses/node_history?node=node-02"]').count() >= 1
        page.screenshot(path=str(ARTIFACTS / "node-hotspots.png"))
        page.goto(base + "/diagnoses/failures_by_category")
        assert page.locator("svg rect.bar").count() >= 7
        page.screenshot(path=str(ARTIFACTS / "failures-by-category.png"))
        page.goto(base + "/diagnosis/test/7015/0")
        text = page.locator("div.cause").first.inner_text()
        assert "raised ValueError" in text and "<script>" not in text     # the summary is
        # built from fields: the markup stays in the evidence line, for admins only
        assert page.evaluate("typeof window.__sattrib_pwned") == "undefined"
        page.screenshot(path=str(ARTIFACTS / "hostile-markup.png"))

        page.goto(srv_empty.base + "/")
        body = page.inner_text("body")
        assert "No diagnoses yet" in body and "sattrib demo" in body and "0 results" not in body
        page.screenshot(path=str(ARTIFACTS / "home-empty.png"))
        browser.close()


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
    assert r.returncode == 0 and 'href="/sattrib/diagnoses/node_history?node=node-02"' in r.stdout


def test_a_database_of_any_file_name_keeps_every_link(db, tmp_path):
    import shutil
    other = tmp_path / "gpu-failures.db"
    shutil.copy(db, other)
    rc, html = get(other, "/")
    assert rc == 0 and 'href="/diagnoses/recent_failures"' in html and "Drain list" in html
    for path in ("/diagnoses/recent_failures.json?_shape=array",
                 "/diagnoses/failures_by_category.json?_shape=array&days=3650",
                 "/diagnoses/node_hotspots.json?_shape=array&days=3650"):
        rc, body = get(other, path)
        assert rc == 0 and json.loads(body), path


def _client(db, requests):
    """Datasette in this process with `sattrib serve`'s metadata and plugin: for redirects."""
    import asyncio
    from datasette.app import Datasette
    st = Settings(database=str(db))
    d = dashboard_dir()

    async def go():
        ds = Datasette(files=[str(db)], metadata=metadata(db, st),
                       template_dir=str(d / "templates"), plugins_dir=str(d / "plugins"))
        await ds.invoke_startup()
        return await requests(ds.client)
    return asyncio.run(go())


def _add(con, did, created_at, **cols):
    """A run without a recorded end: it counts from its diagnosis time (store.m013_ended_at)."""
    cluster, job, restart = did.split("/")
    row = dict(id=did, cluster=cluster, job_id=job, restart=int(restart), created_at=created_at,
               updated_at=created_at, ended_at=created_at, nodes="[]", **cols)
    con.execute(f"insert into diagnoses ({', '.join(row)}) values "
                f"({', '.join('?' * len(row))})", list(row.values()))


@pytest.fixture(scope="module")
def busy_db(db, tmp_path_factory):
    """The test database plus an old failure, a later workload fault on a node that had an
    infrastructure fault, and a node name that is not a Slurm name."""
    import shutil
    import sqlite3
    path = tmp_path_factory.mktemp("busy") / "diagnoses.db"
    shutil.copy(db, path)
    con = sqlite3.connect(path)
    _add(con, "test/9001/0", "2000-01-01T00:00:00Z", outcome="unattributed")
    con.execute("update diagnoses set created_at = strftime('%Y-%m-%dT%H:%M:%SZ', 'now', "
                "'-3 days') where id = 'test/9001/0'")
    con.execute("update diagnoses set ended_at = created_at where id = 'test/9001/0'")
    _add(con, "test/9002/0", "2999-01-01T00:00:00Z", outcome="attributed",
         category="application_error", family="workload", culprit_node="gn02",
         action_code="fix_application", blame="workload", trust="job_output", machine_fault=0,
         fault="workload", gpu_fault=0, out_of_service=0)
    _add(con, "test/9003/0", "2999-01-01T00:00:00Z", outcome="attributed",
         category="gpu_hardware", family="gpu", culprit_node="x;reboot", action_code="drain_node",
         blame="machine", trust="kernel", machine_fault=1, fault="infrastructure", gpu_fault=1,
         out_of_service=1)
    con.commit()
    con.close()
    return path


def test_home_page_sums_up_the_day_and_week_and_lists_nodes_to_drain(db, busy_db):
    rc, body = get(db, "/-/summary.json")
    s = json.loads(body)
    assert rc == 0 and s["diagnoses"] == 16
    drain = {r["node"]: r for r in s["drain"]}
    # The machine's faults whose action takes the node out, the demo's NVLink fault and the IB
    # ports (inspect_nvlink, inspect_network_link: each begins with a drain) included; no
    # workload fault's node.
    assert set(drain) == {"gn02", "hx2", "j2", "nf3", "node-02", "r1n1", "ny2"}
    assert drain["gn02"]["scontrol"] == \
        'scontrol update NodeName=gn02 State=DRAIN Reason="sattrib:7001 gpu_hardware"'
    assert s["unexplained_7d"] == 2 and s["unexplained_share_7d"] == 0.125
    assert s["missing_telemetry_7d"][0]["source"] == "gpu"
    rc, html = get(db, "/")
    assert rc == 0 and "Drain list" in html and 'href="/diagnoses/missing_telemetry"' in html
    assert "scontrol update NodeName=gn02 State=DRAIN Reason=&#34;sattrib:7001 gpu_hardware&#34;" in html
    assert "12%</strong> of failed runs" in html and 'action="/job"' in html

    s = json.loads(get(busy_db, "/-/summary.json")[1])
    assert s["windows"]["24h"]["failures"] == 18 and s["windows"]["7d"]["failures"] == 19
    assert {"outcome": "unattributed", "n": 2} in s["windows"]["7d"]["by_outcome"]
    drain = {r["node"]: r for r in s["drain"]}
    assert "gn02" not in drain                   # its latest diagnosis is the user's bug
    assert drain["x;reboot"]["scontrol"] is None  # never a shell line from an odd name
    assert "not a Slurm name" in get(busy_db, "/")[1]


def test_an_empty_database_says_so_and_what_to_check(tmp_path):
    empty = tmp_path / "diagnoses.db"
    Store(empty)
    rc, html = get(empty, "/")
    assert rc == 0 and "No diagnoses yet" in html and "sattrib demo" in html
    assert "EpilogSlurmctld" in html and "0 results" not in html
    rc, html = get(empty, "/diagnoses/recent_failures")
    assert rc == 0 and "0 results" not in html and "No failed runs match" in html


def test_recent_failures_reads_as_a_table_for_people(db):
    rc, html = get(db, "/diagnoses/recent_failures")
    assert rc == 0
    for label in ("Job ended (UTC)", ">Job<", ">Culprit node<", ">Action<", "Diagnosed (UTC)"):
        assert label in html, label
    assert ">culprit_node<" not in html and ">cluster<" not in html
    import sqlite3
    with sqlite3.connect(db) as con:
        (end,) = con.execute("select ended_at from diagnoses where job_id = '1001'").fetchone()
    assert f'<time datetime="{end}">{end[:10]} {end[11:16]}</time>' in html
    assert 'id="sql-query"' not in html                  # the SQL is one click away
    rows = json.loads(get(db, "/diagnoses/recent_failures.json?_shape=array")[1])
    assert rows[0].keys() >= {"ended_at", "job_id", "cluster", "restart", "action"}


def _jobs(db, page, **params):
    from urllib.parse import urlencode
    _, body = get(db, f"/diagnoses/{page}.json?_shape=array&" + urlencode(params))
    return json.loads(body)


def test_filters_empty_means_all(db):
    import sqlite3
    con = sqlite3.connect(db)
    every = {r[0] for r in con.execute("select job_id from diagnoses")}
    con.execute("update diagnoses set partition = 'debug', user = 'bob' where job_id = '7004'")
    con.commit()
    try:
        assert {r["job_id"] for r in _jobs(db, "recent_failures")} == every
        assert {r["job_id"] for r in _jobs(db, "recent_failures", partition="", user="")} == every
        assert [r["job_id"] for r in _jobs(db, "recent_failures", partition="debug")] == ["7004"]
        assert [r["job_id"] for r in _jobs(db, "recent_failures", user="bob")] == ["7004"]
        assert {r["job_id"] for r in _jobs(db, "recent_failures", category="nvlink")} == {"1001"}
        assert {r["job_id"] for r in _jobs(db, "recent_failures", category="ambiguous")} == {"7009"}
        # node: every node of the job, not only the culprit
        assert [r["job_id"] for r in _jobs(db, "recent_failures", node="node-03")] == ["1001"]
        assert _jobs(db, "recent_failures", since="2999-01-01") == []
        assert _jobs(db, "recent_failures", until="2000-01-01") == []
        today = con.execute("select substr(max(ended_at), 1, 10) from diagnoses").fetchone()[0]
        assert len(_jobs(db, "recent_failures", since=today, until=today)) == len(every)
        assert [r["node"] for r in _jobs(db, "node_hotspots", partition="debug")] == ["r1n1"]
        assert [r["node"] for r in _jobs(db, "node_hotspots", node="gn02")] == ["gn02"]
        assert _jobs(db, "node_hotspots", until="2000-01-01") == []
        assert {r["node"] for r in _jobs(db, "gpu_hotspots", category="nvlink")} == {"node-02"}
        assert _jobs(db, "gpu_hotspots", user="nobody") == []
    finally:
        con.execute("update diagnoses set partition = 'gpu', user = 'alice' where job_id = '7004'")
        con.commit()
        con.close()
    rc, html = get(db, "/diagnoses/recent_failures?user=nobody")
    assert rc == 0 and "No failed runs match these filters" in html
    assert 'name="partition"' in html and 'name="since"' in html


def test_job_id_box_goes_to_the_diagnosis(db):
    async def requests(client):
        return [await client.get(p) for p in ("/job?id=1001", "/job?id=1001.batch",
                                               "/job?id=+7004+", "/job?id=424242", "/job?id=")]
    ok, step, spaced, unknown, empty = _client(db, requests)
    assert ok.status_code == 302 and ok.headers["location"] == "/diagnosis/test/1001/0"
    assert step.headers["location"] == "/diagnosis/test/1001/0"
    assert spaced.headers["location"] == "/diagnosis/test/7004/0"
    assert unknown.status_code == 404 and "No diagnosis for job 424242" in unknown.text
    assert empty.status_code == 404


def test_a_node_page_lists_every_job_it_took_part_in(db):
    jobs = _jobs(db, "node_history", node="node-01")
    assert [(j["job_id"], j["role"]) for j in jobs] == [("1001", "took part")]
    jobs = _jobs(db, "node_history", node="node-02")
    assert [(j["job_id"], j["role"]) for j in jobs] == [("1001", "cause")]
    assert jobs[0]["gpu_serial"] == "1650000000032"
    rc, html = get(db, "/diagnoses/node_history?node=node-01")
    assert rc == 0 and 'href="/diagnosis/test/1001/0"' in html and "took part" in html
    assert "<p>None.</p>" in html.split("GPUs blamed")[1].split("<h2>")[0]
    rc, html = get(db, "/diagnoses/node_history?node=node-02")
    blamed = html.split("GPUs blamed")[1].split("<h2>")[0]
    assert "0000:9d:00.0" in blamed and 'href="/diagnoses/gpu_history?gpu=1650000000032"' in blamed
    assert {j["role"] for j in _jobs(db, "node_history", node="m2")} == {"cause (workload)"}


def test_diagnosis_page_as_json(db):
    rc, body = get(db, "/diagnosis/test/1001/0.json", text="all")
    page = json.loads(body)
    assert rc == 0 and page["id"] == "test/1001/0" and page["evidence_text"] == "shown"
    d = page["diagnosis"]
    assert d["root_cause"]["node"] == "node-02" and d["evidence"][0]["text"]
    assert page["bundle_path"]
    rc, _ = get(db, "/diagnosis/test/999999/0.json")
    assert rc != 0


def test_unexplained_shows_missing_evidence_as_words(db):
    rows = {r["job_id"]: r for r in _jobs(db, "unexplained")}
    assert rows["7009"]["missing"] == "gpu: f1, f2"
    rc, html = get(db, "/diagnoses/unexplained")
    assert rc == 0 and "gpu: f1, f2" in html and "[&#34;" not in html and '["' not in html


def test_chart_has_every_day_a_y_axis_and_a_colour_per_family(db):
    import re
    rows = _jobs(db, "failures_by_category", days="10")
    days = sorted({r["day"] for r in rows})
    assert len(days) == 10 and sum(r["failures"] for r in rows) == 16
    assert all(r["failures"] == 0 and r["family"] is None for r in rows if r["day"] != days[-1])
    rc, html = get(db, "/diagnoses/failures_by_category?days=10")
    assert rc == 0
    ticks = [int(t) for t in re.findall(r'class="y-tick"[^>]*>(\d+)<', html)]
    assert ticks[0] == 0 and ticks[-1] >= 16 and len(ticks) >= 3
    bars = re.findall(r'<rect class="bar"[^>]*fill="(#[0-9a-f]{6})"><title>\S+ (\w+): ', html)
    fams = {f for _, f in bars}
    assert fams == {"gpu", "nvlink", "network", "scheduler", "workload", "ambiguous",
                    "unattributed"}
    assert len({c for c, _ in bars}) == len(fams)          # one colour each, none reused


def test_search_summaries_and_evidence_lines(db, tmp_path):
    found = _jobs(db, "recent_failures", q="NETIR_LINK_EVT")
    assert [r["job_id"] for r in found] == ["1001"]
    rc, html = get(db, "/diagnoses/recent_failures?q=%22unbalanced")
    assert rc == 0 and "message-error" not in html
    _, body = get(db, "/diagnoses/search_evidence.json?_shape=array&q=Xid+149", text="all")
    rows = json.loads(body)
    assert rows and {r["job_id"] for r in rows} == {"1001"}
    assert all("Xid" in r["text"] for r in rows)
    # The index follows the rows: a diagnosis stored again is found once, with its new words.
    import shutil
    other = tmp_path / "diagnoses.db"
    shutil.copy(db, other)
    store = Store(other)
    diag, _ = analyze_folder(write_demo(tmp_path / "demo"), rules=load_rules())
    diag.root_cause.summary = "now says zanzibar"
    store.upsert(diag, "test")
    assert [r["job_id"] for r in _jobs(other, "recent_failures", q="zanzibar")] == ["1001"]
    assert len(_jobs(other, "recent_failures", q="NETIR_LINK_EVT")) == 1   # in the action
    _, body = get(other, "/diagnoses/search_evidence.json?_shape=array&q=Xid+149", text="all")
    assert len(json.loads(body)) == len(rows)


def test_workload_failures_have_a_page_of_their_own(db):
    # What the hotspots leave out (the jobs' own faults) is listed by user and category.
    import sqlite3
    con = sqlite3.connect(db)
    want = {(u, c) for u, c in con.execute(
        "select user, category from diagnoses where outcome = 'attributed' and "
        "json_extract(diagnosis_json, '$.root_cause.blame') = 'workload'")}
    con.close()
    _, body = get(db, "/diagnoses/workload_failures.json?_shape=array&days=3650")
    rows = json.loads(body)
    assert {(r["user"], r["category"]) for r in rows} == want and want
    assert {"application_error", "cuda_oom", "host_oom"} <= {c for _, c in want}
    _, body = get(db, "/diagnoses/workload_failures.json?_shape=array&days=3650"
                      "&category=cuda_oom")
    assert {r["category"] for r in json.loads(body)} == {"cuda_oom"}


def test_a_node_page_draws_its_history_by_the_part_it_played(db):
    # gn02 caused job 7001 (Xid 79): one mark on the infrastructure lane; a node that only
    # took part in failed jobs has marks on that lane alone.
    _, html = get(db, "/diagnoses/node_history?node=gn02")
    svg = html[html.index('<svg class="swimlane"'):html.index("</svg>")]
    assert "caused (infra)" in svg and svg.count('class="mark infra"') >= 1
    assert "job 7001" in svg
    _, html = get(db, "/diagnoses/node_history?node=gn01")
    svg = html[html.index('<svg class="swimlane"'):html.index("</svg>")]
    assert "took part" in svg and "caused (infra)" not in svg
    assert 'class="mark symptom"' in svg and 'class="mark infra"' not in svg


@pytest.mark.slow
def test_an_installed_copy_serves_the_dashboard_in_parts(db, tmp_path):
    """pip installs datasette/ as sattrib/dashboard/ with every file (the plugin's parts
    included, no __init__.py), and Datasette run from that copy alone, as `sattrib serve` runs
    it, registers each part and serves the pages."""
    import shutil
    keep = ("pyproject.toml", "README.md", "sattrib", "engine", "collectors", "slurm_hooks",
            "datasette")
    src = tmp_path / "src"                      # a copy: the build writes beside its sources
    shutil.copytree(ROOT, src, ignore=lambda d, names: [
        n for n in names if n == "__pycache__" or d == str(ROOT) and n not in keep])
    site = tmp_path / "site"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                        "--disable-pip-version-check", "--target", str(site), str(src)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    shipped = {p.relative_to(site / "sattrib/dashboard") for p in
               (site / "sattrib/dashboard").rglob("*") if p.is_file() and p.suffix != ".pyc"}
    ours = {p.relative_to(ROOT / "datasette") for p in (ROOT / "datasette").rglob("*")
            if p.is_file() and p.suffix != ".pyc"}
    assert shipped == ours and not any(p.name == "__init__.py" for p in ours)
    env = dict(os.environ, PYTHONPATH=str(site))
    r = subprocess.run([sys.executable, "-m", "sattrib", "serve", "--print-command",
                        "--database", str(db)], env=env, capture_output=True, text=True,
                       timeout=60, cwd=tmp_path)
    argv = shlex.split(r.stdout)
    assert argv[argv.index("--plugins-dir") + 1] == str(site / "sattrib/dashboard/plugins")
    argv = argv[: argv.index("--host")] + argv[argv.index("--setting"):]
    for path, want in (("/-/plugins.json", '"sattrib_dashboard.guards"'), ("/", "Drain list"),
                       ("/diagnoses/node_history?node=node-02", "Node node-02"),
                       ("/diagnoses/gpu_history?gpu=1650000000032", "Where it was seen (1)")):
        r = subprocess.run([*argv, "--get", path], env=env, capture_output=True, text=True,
                           timeout=120, cwd=tmp_path)
        assert r.returncode == 0 and want in r.stdout, (path, r.stdout[-500:], r.stderr[-500:])
