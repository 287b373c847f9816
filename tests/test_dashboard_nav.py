"""Every page of the dashboard carries the same navigation in its header, in headless Chromium:
the home page, the canned queries, a diagnosis, a node, a Datasette table and an error page."""
import json

import pytest

from test_dashboard import LAPTOP, _Served, db, get, launch_chromium, need_chromium  # noqa: F401

PAGES = ("/", "/diagnoses/recent_failures", "/diagnoses/drain_list", "/diagnosis/test/7001/0",
         "/diagnoses/node_history?node=gn02", "/diagnoses/rules", "/diagnoses/evidence")
LINKS = ["Home", "Drain list", "Recent failures", "Node hotspots", "GPU hotspots",
         "Repeat offenders", "Incidents", "Workload failures", "Over time", "Unexplained",
         "Missing telemetry", "Hook health", "Tables"]


@pytest.mark.browser
def test_every_page_has_the_navigation_in_its_header(db):
    need_chromium()
    from playwright.sync_api import sync_playwright
    with _Served(db) as srv, sync_playwright() as pw:
        browser = launch_chromium(pw)
        page = browser.new_page(viewport=LAPTOP)
        for path in PAGES:
            page.goto(srv.base + path)
            nav = page.locator("header nav ul.sattrib-nav a")
            assert nav.all_inner_texts() == LINKS, path
            box = page.locator("header nav ul.sattrib-nav").bounding_box()
            assert box["y"] < 80, (path, box)                 # at the top, not below the page
        page.goto(srv.base + "/")
        assert page.locator("h2", has_text="Pages").count() == 0
        page.click("header nav >> text=Drain list")
        page.wait_for_url("**/diagnoses/drain_list")
        browser.close()


@pytest.mark.browser
def test_home_tiles_open_their_filtered_list(db):
    """A tile's count, outcome and family each open recent failures filtered to what they
    count, and the list shows as many rows as the tile says."""
    need_chromium()
    from playwright.sync_api import sync_playwright
    s = json.loads(get(db, "/-/summary.json")[1])["windows"]["7d"]
    with _Served(db) as srv, sync_playwright() as pw:
        browser = launch_chromium(pw)
        page = browser.new_page(viewport=LAPTOP)
        rows = page.locator("table.rows-and-columns tbody tr")
        for r in s["by_outcome"]:
            page.goto(srv.base + "/")
            page.locator(".tile").nth(1).locator(f"a.outcome-{r['outcome']}").click()
            page.wait_for_url(f"**/diagnoses/recent_failures?since=*&outcome={r['outcome']}")
            assert rows.count() == r["n"], r
            assert set(page.locator("td.col-outcome").all_inner_texts()) == {r["outcome"]}
        for r in s["by_family"]:
            page.goto(srv.base + "/")
            page.locator(".tile").nth(1).locator("table a", has_text=r["family"]).click()
            page.wait_for_url(f"**/diagnoses/recent_failures?since=*&family={r['family']}")
            assert rows.count() == r["n"], r
        page.goto(srv.base + "/")
        page.locator(".tile").nth(1).locator("h2 a").click()
        page.wait_for_url("**/diagnoses/recent_failures?since=*")
        assert rows.count() == s["failures"]
        browser.close()
    infra = json.loads(get(db, "/diagnoses/recent_failures.json?_shape=array&infra=1")[1])
    every = json.loads(get(db, "/diagnoses/diagnoses.json?_shape=array&machine_fault=1",
                           text="all")[1])
    assert infra and {r["job_id"] for r in infra} == {r["job_id"] for r in every}


@pytest.mark.browser
def test_the_node_page_says_whether_the_node_is_on_the_drain_list(db):
    need_chromium()
    from playwright.sync_api import sync_playwright
    with _Served(db) as srv, sync_playwright() as pw:
        browser = launch_chromium(pw)
        page = browser.new_page(viewport=LAPTOP)
        page.goto(srv.base + "/diagnoses/node_history?node=gn02")
        verdict = page.locator("p.verdict").inner_text()
        assert verdict.startswith("On the drain list since 20") and "job 7001" in verdict
        assert "action reboot_node; not acted on." in verdict
        page.goto(srv.base + "/diagnoses/node_history?node=node-01")   # took part only
        assert page.locator("p.verdict").inner_text().startswith("Not on the drain list")
        browser.close()


@pytest.mark.browser
def test_categories_are_chips_coloured_by_family_and_chosen_from_a_list(db):
    need_chromium()
    from playwright.sync_api import sync_playwright
    with _Served(db) as srv, sync_playwright() as pw:
        browser = launch_chromium(pw)
        page = browser.new_page(viewport=LAPTOP)
        page.goto(srv.base + "/diagnoses/recent_failures")
        colour = {c.inner_text(): c.evaluate("e => getComputedStyle(e).backgroundColor")
                  for c in page.locator("td.col-category span.chip").all()}
        assert colour["gpu_hardware"] == "rgb(179, 38, 30)"          # the gpu family
        assert colour["nvlink"] == "rgb(107, 63, 160)"
        assert page.locator("th.col-family").count() == 0              # only its colour
        options = page.locator("select[name=category] option").all_inner_texts()
        assert options[0] == "any" and "gpu_hardware" in options and "unattributed" in options
        page.select_option("select[name=category]", "nvlink")
        page.select_option("select[name=outcome]", "attributed")
        page.click("input[type=submit]")
        page.wait_for_url("**/recent_failures?*category=nvlink*")
        assert set(page.locator("td.col-category").all_inner_texts()) == {"nvlink"}
        browser.close()
