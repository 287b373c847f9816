"""The README's screenshots of the dashboard, taken in headless Chromium (Debian's chromium,
playwright) on the demo job and the test cases, stored as if their jobs had just ended (the
dashboard lists failures by their job's end), with a drain decided for two of them:

    .venv/bin/python docs/screenshots.py          # writes docs/dashboard-*.png

The pages: the home page, the demo job's diagnosis, the drain list and a node's page."""
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from helpers import ended_now  # noqa: E402
from sattrib.analysis import analyze_folder, load_rules  # noqa: E402
from sattrib.demo import write_demo  # noqa: E402
from sattrib.store import Store  # noqa: E402
from test_dashboard import LAPTOP, _Served, launch_chromium  # noqa: E402

PAGES = {"home": "/", "diagnosis": "/diagnosis/test/1001/0",
         "drain-list": "/diagnoses/drain_list", "node": "/diagnoses/node_history?node=gn02"}


def database(folder: Path) -> Path:
    """The demo job and every test case, diagnosed and stored, and the drain decisions of two."""
    path = folder / "diagnoses.db"
    store, rules = Store(path), load_rules()
    cases = [write_demo(folder / "demo")] + sorted(
        p for p in (ROOT / "tests" / "cases").iterdir() if p.is_dir())
    for f in cases:
        store.upsert(ended_now(analyze_folder(f, rules=rules)[0]), "test", bundle_path=str(f))
    store.sync_rules(rules)
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    reason = 'Reason="sattrib:7001 gpu_hardware"'
    store.record_actions("test/7001/0", [{
        "kind": "drain", "decision": "taken", "node": "gn02", "created_at": now,
        "detail": "drained (drain_node)",
        "command": f"scontrol update NodeName=gn02 State=DRAIN {reason}"}], None)
    store.record_actions("test/1001/0", [{
        "kind": "drain", "decision": "dry-run", "node": "node-02", "created_at": now,
        "detail": 'would drain (drain = "dry-run")', "command": None}], None)
    return path


def main() -> None:
    from playwright.sync_api import sync_playwright
    with tempfile.TemporaryDirectory() as tmp, _Served(database(Path(tmp))) as srv, \
            sync_playwright() as pw:
        page = launch_chromium(pw).new_page(viewport=LAPTOP)
        for name, path in PAGES.items():
            page.goto(srv.base + path)
            page.screenshot(path=str(ROOT / "docs" / f"dashboard-{name}.png"))


if __name__ == "__main__":
    main()
