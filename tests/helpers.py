"""Paths and a webhook server shared by the tests (a plain module: `conftest` names clash
across test folders)."""
import json
import threading
import time
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CASES = ROOT / "tests" / "cases"


def ended_now(d, now: datetime | None = None):
    """Diagnosis d as if its job had just ended (at `now`): the recorded cases and the demo
    ended months ago, and the dashboard lists, windows and counts failures by their job's end."""
    at = (now or datetime.now(timezone.utc)).strftime("%Y-%m-%dT%H:%M:%SZ")
    return d.model_copy(update={"job": d.job.model_copy(update={"end": at})})


def folder(root: Path, files: dict) -> Path:
    """An evidence folder under root: {relative path: text}."""
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root


class Hook:
    """A real local HTTP server that keeps every JSON body POSTed to it."""

    def __init__(self):
        self.bodies: list = []
        hook = self

        class H(BaseHTTPRequestHandler):
            def do_POST(self):
                n = int(self.headers.get("Content-Length") or 0)
                hook.bodies.append(json.loads(self.rfile.read(n)))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *a):
                pass
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def wait(self, job_id, timeout: float = 30) -> dict:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            for b in self.bodies:
                if b.get("job_id") == str(job_id):
                    return b
            time.sleep(0.2)
        raise AssertionError(f"no webhook for job {job_id}: got {self.bodies}")
