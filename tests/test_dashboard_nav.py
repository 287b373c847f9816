"""Every page of the dashboard carries the same navigation in its header, in headless Chromium:
the home page, the canned queries, a diagnosis, a node, a Datasette table and an error page."""
import pytest

from test_dashboard import LAPTOP, _Served, db, launch_chromium, need_chromium  # noqa: F401

PAGES = ("/", "/diagnoses/recent_failures", "/diagnoses/drain_list", "/diagnosis/test/7001/0",
         "/diagnoses/node_history?node=gn02", "/diagnoses/rules", "/diagnoses/evidence")
LINKS = ["Home", "Drain list", "Recent failures", "Node hotspots", "GPU hotspots",
         "Repeat offenders", "Workload failures", "Over time", "Unexplained",
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
