"""Cross-job incidents on the dashboard (plugin sattrib_incidents.py): the list, the incident
page and its JSON, the home page's block and the line on each member job's diagnosis page,
served by the real Datasette (and seen in headless Chromium) from a database the real
incidents step filled."""
import json

import pytest

from test_dashboard import ARTIFACTS, LAPTOP, _Served, get, launch_chromium, need_chromium
from test_incidents import T0, burst, settings, slurm  # noqa: F401  (slurm: the fixture)


def incident(tmp_path):
    """A database holding incident 1: three jobs behind leaf switch s1 within 20 seconds."""
    st = settings(tmp_path)
    burst(tmp_path, st, [(1101, "gn01", 10), (1102, "gn02", 20), (1103, "gn03", 30)],
          now=T0 + 60)
    return tmp_path / "d.db"


def test_incidents_have_a_list_a_page_a_home_block_and_a_line_on_each_job(tmp_path, slurm):
    db = incident(tmp_path)
    rc, html = get(db, "/incidents?days=3650")
    assert rc == 0 and "leaf switch <strong>s1</strong>" in html and '/incident/1"' in html
    rc, body = get(db, "/incidents.json?days=3650")
    assert [(r["id"], r["summary"]) for r in json.loads(body)] == [
        (1, "leaf switch s1, 3 jobs within 20 seconds")]
    rc, html = get(db, "/incident/1")
    assert rc == 0 and "SwitchName=s1 Nodes=gn[01-04]" in html
    assert '/diagnosis/c1/1102/0"' in html and "spine switch spine" in html
    assert "Link down" not in html                      # no log text: everyone sees it
    rc, body = get(db, "/incident/1.json")
    doc = json.loads(body)
    assert (doc["kind"], doc["element"], doc["jobs"]) == ("leaf switch", "s1", 3)
    assert get(db, "/incident/2")[0] == 1               # 404
    rc, html = get(db, "/diagnosis/c1/1101/0")
    assert rc == 0 and "Part of" in html and "leaf switch s1, 3 jobs within 20 seconds" in html
    assert '/incident/1"' in html
    rc, html = get(db, "/")
    assert rc == 0 and "<h2>Incidents" in html and '/incident/1"' in html
    assert get(db, "/diagnosis/c1/1101/0.json")[0] == 0


def test_a_database_without_incidents_says_so(tmp_path):
    """No incident yet: the list says so, an incident page is a 404, the home page answers."""
    from sattrib.store import Store
    db = tmp_path / "empty.db"
    Store(db)
    rc, html = get(db, "/incidents")
    assert rc == 0 and "No incident in the last 30 days." in html
    assert get(db, "/incident/1")[0] == 1 and get(db, "/")[0] == 0


@pytest.mark.browser
def test_browser_from_the_home_block_to_the_incident_and_its_jobs(tmp_path, slurm):
    """In Chromium: the home page's block links the incident; its page names the switch, lists
    the three jobs inside the window's width, and each links its diagnosis page, which links
    back."""
    need_chromium()
    from playwright.sync_api import sync_playwright
    db = incident(tmp_path)
    with _Served(db) as srv, sync_playwright() as pw:
        browser = launch_chromium(pw)
        page = browser.new_page(viewport=LAPTOP)
        page.goto(srv.base + "/")
        block = page.locator("table.incidents tbody tr")
        assert block.count() == 1
        assert "leaf switch s1" in block.first.inner_text()
        block.first.scroll_into_view_if_needed()
        page.screenshot(path=str(ARTIFACTS / "home-incidents.png"))

        block.first.locator('a[href="/incident/1"]').click()
        page.wait_for_url("**/incident/1")
        assert page.locator("h1").inner_text().startswith("Incident 1")
        status = page.evaluate("s => getComputedStyle(document.querySelector(s))"
                               ".backgroundColor", "h1 .outcome")
        assert status == "rgb(85, 85, 85)", status                  # closed, legible
        jobs = page.locator("table.failed-jobs tbody tr")
        assert jobs.count() == 3
        box = page.locator("table.failed-jobs").bounding_box()
        assert box["x"] >= 0 and box["x"] + box["width"] <= LAPTOP["width"]
        body = page.inner_text("body")
        assert "SwitchName=s1 Nodes=gn[01-04]" in body and "spine switch spine" in body
        page.screenshot(path=str(ARTIFACTS / "incident.png"), full_page=True)

        jobs.nth(1).locator("a").click()
        page.wait_for_url("**/diagnosis/c1/1102/0")
        note = page.locator("p.incident")
        assert "Part of incident 1: leaf switch s1, 3 jobs within 20 seconds" in note.inner_text()
        page.screenshot(path=str(ARTIFACTS / "diagnosis-incident.png"))
        note.locator("a").click()
        page.wait_for_url("**/incident/1")
        browser.close()
