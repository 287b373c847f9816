"""The dashboard on a database of 1,000,000 diagnoses, in headless Chromium: every page answers
within a query time limit (a query over it shows an error, which fails the test) and shows what
it shows on a small database. Page times go to tests/artifacts/.

The limit here is twice the 1 s default, for a test machine busy with other work: the queries
take 0.2-0.6 s alone, and the failure list filtered by partition, user and category took 3.4 s
before its index."""
import json
import time

import pytest

from helpers import CASES
from sattrib.analysis import analyze_folder, load_rules
from sattrib.store import Store
from test_dashboard import ARTIFACTS, LAPTOP, _Served, launch_chromium, need_chromium

ROWS = 1_000_000

# Deterministic rows made by SQLite itself (a Python loop takes twice as long): 2,000 nodes,
# eight kinds of outcome, a year of failures, two partitions, 300 users.
FILL = """
with recursive c(i) as (select 0 union all select i + 1 from c where i < :n - 1),
kinds(k, category, family, action_code, blame, machine_fault, fault, gpu_fault,
      out_of_service) as (values
  (0, 'gpu_hardware', 'gpu', 'drain_node', 'machine', 1, 'infrastructure', 1, 1),
  (1, 'gpu_memory_ecc', 'gpu', 'reset_gpu', 'machine', 1, 'infrastructure', 1, 1),
  (2, 'nvlink', 'nvlink', 'inspect_nvlink', 'machine', 1, 'infrastructure', 1, 1),
  (3, 'network_ib', 'network', 'drain_node', 'machine', 1, 'infrastructure', 0, 1),
  (4, 'application_error', 'workload', 'fix_application', 'workload', 0, 'workload', 0, 0),
  (5, 'cuda_oom', 'workload', 'fix_application', 'workload', 0, 'workload', 0, 0),
  (6, 'scheduler_timelimit', 'scheduler', 'none', 'scheduler', 0, 'scheduler', 0, 0),
  (7, null, null, null, null, 0, null, 0, 0)),
r as (select i, printf('gpu-%04d', (i * 7919) % 2000) as node, (i * 31) % 8 as k,
             strftime('%Y-%m-%dT%H:%M:%SZ', 'now',
                      printf('-%d seconds', 3600 + (i * 104729) % 31536000)) as t
      from c)
insert into diagnoses (id, cluster, job_id, restart, outcome, category, family, culprit_node,
                       summary, action_code, partition, user, created_at, updated_at, missing,
                       node_count, diagnosis_json, blame, machine_fault, fault, gpu_fault,
                       out_of_service, job_end, ended_at)
select 'big/' || i || '/0', 'big', cast(100000 + i as text), 0,
       case when kinds.category is null then 'unattributed' else 'attributed' end,
       kinds.category, kinds.family, case when kinds.category is null then null else node end,
       coalesce(kinds.category, 'no cause') || ' on ' || node, kinds.action_code,
       case when i % 5 = 0 then 'debug' else 'gpu' end, 'u' || (i % 300), t, t, '[]', 1, '{}',
       kinds.blame, kinds.machine_fault, kinds.fault, kinds.gpu_fault, kinds.out_of_service, t, t
from r join kinds on kinds.k = r.k"""


@pytest.fixture(scope="module")
def million(tmp_path_factory):
    path = tmp_path_factory.mktemp("million") / "diagnoses.db"
    rules = load_rules()
    store = Store(path)
    for case in ("xid79_srun_combined_log", "xid48_ecc_nvidia_smi_xml"):
        d, _ = analyze_folder(CASES / case, rules=rules)
        store.upsert(d, "test", bundle_path=str(CASES / case))
    store.sync_rules(rules)
    conn = store.db.conn
    for p in ("journal_mode=off", "synchronous=off", "cache_size=-200000"):
        conn.execute("pragma " + p)       # a scratch database: no crash to survive
    with conn:
        conn.execute(FILL, {"n": ROWS})
        conn.execute("insert or ignore into job_nodes (diagnosis_id, node, snapshot) "
                     "select id, culprit_node, 1 from diagnoses "
                     "where cluster = 'big' and culprit_node is not null")
    conn.execute("pragma journal_mode=delete")
    conn.execute("analyze")
    conn.close()
    return path


@pytest.mark.browser
def test_every_page_answers_on_a_million_diagnoses(million, monkeypatch):
    need_chromium()
    from playwright.sync_api import sync_playwright
    times = {}
    monkeypatch.setenv("SATTRIB_SERVE_SQL_TIME_LIMIT_MS", "2000")
    with _Served(million) as srv, sync_playwright() as pw:
        browser = launch_chromium(pw)
        page = browser.new_page(viewport=LAPTOP)

        def visit(name, path):
            t = time.monotonic()
            resp = page.goto(srv.base + path, timeout=120_000)
            times[name] = round(time.monotonic() - t, 2)
            body = page.inner_text("body")
            assert resp.status == 200, (path, resp.status, body[:300])
            # Datasette shows a query over its time limit as an error on the page.
            assert page.locator(".message-error").count() == 0, (path, body[:500])
            assert "interrupted" not in body.lower(), (path, body[:500])
            return body

        body = visit("home", "/")
        # About 1/365 of a year of failures a day, all of them in the last 7 days' count.
        s = json.loads(page.context.request.get(srv.base + "/-/summary.json").text())
        assert s["diagnoses"] == ROWS + 2
        assert 2_000 < s["windows"]["24h"]["failures"] < 4_000
        assert 17_000 < s["windows"]["7d"]["failures"] < 22_000
        assert "Drain list" in body and s["drain"]
        assert s["hook_health"]["nodes"] and "Hook health" in body
        page.screenshot(path=str(ARTIFACTS / "million-home.png"))

        body = visit("recent_failures", "/diagnoses/recent_failures")
        assert page.locator("table.rows-and-columns tbody tr").count() >= 20
        assert "500 of more than 10,000 shown" in body       # a bounded count
        page.screenshot(path=str(ARTIFACTS / "million-recent-failures.png"))
        visit("recent_failures_filtered",
              "/diagnoses/recent_failures?partition=debug&category=nvlink&user=u10")
        rows = page.locator("table.rows-and-columns tbody tr")
        assert rows.count() >= 1
        assert all("nvlink" in t and "u10" in t for t in rows.all_inner_texts())

        visit("node_hotspots", "/diagnoses/node_hotspots?days=30")
        table = page.locator("table.rows-and-columns").inner_text()   # the filters list them all
        assert "gpu-" in table and "application_error" not in table
        visit("gpu_hotspots", "/diagnoses/gpu_hotspots?days=30")
        visit("failures_by_category", "/diagnoses/failures_by_category")
        assert page.locator("svg rect.bar").count() >= 30
        page.screenshot(path=str(ARTIFACTS / "million-failures-by-category.png"))
        visit("hook_health", "/diagnoses/hook_health")
        assert page.locator("table.rows-and-columns tbody tr").count() >= 100
        visit("unexplained", "/diagnoses/unexplained")
        visit("missing_telemetry", "/diagnoses/missing_telemetry")

        visit("recent_failures_node", "/diagnoses/recent_failures?node=gpu-0001")
        rows = page.locator("table.rows-and-columns tbody tr")
        assert rows.count() >= 100
        body = visit("node_page", "/diagnoses/node_history?node=gpu-0001")
        assert "/diagnosis/big/" in page.content()
        body = visit("search", "/diagnoses/recent_failures?q=nvlink")
        assert page.locator("table.rows-and-columns tbody tr").count() >= 1

        visit("job_box", "/job?id=7001.batch")
        page.wait_for_url("**/diagnosis/test/7001/0")
        assert "gpu_hardware" in page.locator("div.cause").first.inner_text()
        browser.close()
    (ARTIFACTS / "million-rows-timings.json").write_text(json.dumps(times, indent=2) + "\n")
