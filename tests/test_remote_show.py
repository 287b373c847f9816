"""`sattrib JOBID` on a login node: no database there, `server_url` points at the controller's
dashboard. A real `sattrib serve` on a seeded database and the real CLI in a subprocess: the
same text and JSON as the local lookup (evidence lines only where the dashboard shows them to
everyone), and one line with a hint for every way the exchange fails."""
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from helpers import CASES, ROOT
from sattrib.analysis import analyze_folder, load_rules
from sattrib.demo import write_demo
from sattrib.store import Store

REAL = ROOT / "tests" / "cases-real" / "wl-paimegatron-rank3-nan-grad-norm-assert"
DEMO_LINE = "NVRM: Xid (PCI:0000:9d:00): 149"             # the demo's root evidence line


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    """Job 1001 (the demo) on clusters test and daint, job 7002 run twice on alps (requeued),
    job 5005 an application error with the user's frames."""
    d = tmp_path_factory.mktemp("remote")
    path = d / "diagnoses.db"
    rules = load_rules()
    store = Store(path)
    demo, _ = analyze_folder(write_demo(d / "demo"), rules=rules)
    store.upsert(demo, "test")
    store.upsert(demo, "daint")
    ecc, _ = analyze_folder(CASES / "xid48_ecc_nvidia_smi_xml", rules=rules)
    store.upsert(ecc, "alps")
    store.upsert(ecc.model_copy(update={"restart": 1}), "alps")
    app, _ = analyze_folder(REAL, rules=rules)
    assert app.root_cause.user_frames
    store.upsert(app.model_copy(update={"job_id": "5005"}), "alps")
    store.sync_rules(rules)
    return path


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Served:
    """`sattrib serve` on a free port until the block ends."""

    def __init__(self, db, **env):
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sattrib", "serve"],
            env=dict(os.environ, SATTRIB_DATABASE=str(db), SATTRIB_SERVE_PORT=str(self.port),
                     **env),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def __enter__(self):
        end = time.monotonic() + 90
        while True:
            try:
                urllib.request.urlopen(self.url + "-/summary.json", timeout=2).read()
                return self
            except OSError:
                assert self.proc.poll() is None and time.monotonic() < end, "serve did not start"
                time.sleep(0.2)

    def __exit__(self, *exc):
        self.proc.terminate()
        self.proc.wait(timeout=10)


@pytest.fixture(scope="module")
def anonymous(db):
    with Served(db) as s:                 # serve_evidence_text = "admins": the CLI is not one
        yield s.url


@pytest.fixture(scope="module")
def open_to_all(db):
    with Served(db, SATTRIB_SERVE_EVIDENCE_TEXT="all") as s:
        yield s.url


def sattrib(*args, server=None, timeout_s=None, database=None, **more):
    env = dict(os.environ, **more)
    env.pop("SATTRIB_SERVER_URL", None)
    if server:
        env["SATTRIB_SERVER_URL"] = server
    if timeout_s:
        env["SATTRIB_SERVER_TIMEOUT_S"] = str(timeout_s)
    if database:
        env["SATTRIB_DATABASE"] = str(database)
    assert not Path(env["SATTRIB_DATABASE"]).exists() or database  # no local database
    return subprocess.run([sys.executable, "-m", "sattrib", *args], capture_output=True,
                          text=True, env=env, timeout=120)


def one_line_error(r, *words):
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith("sattrib: error:"), r.stderr
    assert lines[1].startswith("hint:")
    for w in words:
        assert w in r.stderr, r.stderr


def test_same_text_and_json_as_the_local_lookup(db, open_to_all):
    for args in (["7002"], ["7002", "--all"], ["show", "7002.batch", "--restart", "0"],
                 ["1001", "--cluster", "daint"], ["5005"], ["7002", "--json"],
                 ["7002", "--all", "--json"], ["1001", "--cluster", "test", "--json"]):
        local = sattrib(*args, database=db)
        remote = sattrib(*args, server=open_to_all)
        assert local.returncode == 0, local.stderr
        assert (remote.returncode, remote.stdout, remote.stderr) == (
            0, local.stdout, local.stderr), args


def test_a_requeued_job_two_clusters_and_the_json_shapes(anonymous):
    r = sattrib("7002", server=anonymous)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("Job 7002 (run 2 of 2) on alps")
    assert "Root cause: gpu_memory_ecc on hx2" in r.stdout
    assert "ran 2 times; --all shows every run" in r.stderr
    r = sattrib("7002", "--all", server=anonymous)
    assert "Job 7002 (run 1 of 2) on alps" in r.stdout and "(run 2 of 2)" in r.stdout
    r = sattrib("7002", "--restart", "0", server=anonymous)
    assert r.stdout.startswith("Job 7002 on alps") and "ran 2 times" not in r.stderr
    r = sattrib("7002", "--json", server=anonymous)
    d = json.loads(r.stdout)
    assert d["job_id"] == "7002" and d["restart"] == 1 and d["actions"] == []
    r = sattrib("7002", "--all", "--json", server=anonymous)
    assert [d["restart"] for d in json.loads(r.stdout)] == [0, 1]
    r = sattrib("1001", server=anonymous)
    one_line_error(r, "known to clusters daint, test", "--cluster daint")
    r = sattrib("show", "1001.batch", "--cluster", "daint", "--json", server=anonymous)
    assert r.returncode == 0 and json.loads(r.stdout)["root_cause"]["node"] == "node-02"
    r = sattrib("1001", "--cluster", "test", server=anonymous)
    assert r.stdout.startswith("Job 1001 on test") and "nvlink on node-02" in r.stdout


def test_anonymous_callers_get_no_evidence_text_nor_user_frames(anonymous, open_to_all):
    page = json.loads(urllib.request.urlopen(anonymous + "diagnosis/test/1001/0.json").read())
    assert page["evidence_text"] == "withheld" and DEMO_LINE not in json.dumps(page)
    assert all("text" not in e for e in page["diagnosis"]["evidence"])
    r = sattrib("1001", "--cluster", "test", server=anonymous)
    assert r.returncode == 0 and DEMO_LINE not in r.stdout
    assert "  e1 node-02/journal.log:6\n" in r.stdout
    assert "Evidence lines: withheld by the dashboard" in r.stdout
    r = sattrib("1001", "--cluster", "test", "--json", server=anonymous)
    d = json.loads(r.stdout)
    assert d["evidence_text"] == "withheld" and DEMO_LINE not in r.stdout
    r = sattrib("5005", server=anonymous)
    assert r.returncode == 0 and "application_error" in r.stdout
    assert "in your code:" not in r.stdout and "pretrain_megatron_baichuan.py" not in r.stdout
    r = sattrib("5005", server=open_to_all)               # the site shows them to everyone
    assert "in your code:" in r.stdout and "pretrain_megatron_baichuan.py" in r.stdout
    assert "withheld" not in r.stdout


def test_the_users_own_bundle_comes_first(db, tmp_path):
    """A login node with the bundles exported to it: the job's own bundle, with its lines;
    the dashboard (here: down) is not asked."""
    import sqlite3
    (doc,) = sqlite3.connect(db).execute(
        "select diagnosis_json from diagnoses where id = 'alps/5005/0'").fetchone()
    run = tmp_path / "bundles" / "alps" / "5005.0"
    run.mkdir(parents=True)
    (run / "diagnosis.json").write_text(doc)
    down = f"http://127.0.0.1:{_free_port()}/"
    r = sattrib("5005", server=down, SATTRIB_BUNDLE_DIR=str(tmp_path / "bundles"),
                SATTRIB_CLUSTER="alps")
    assert r.returncode == 0, r.stderr
    assert "in your code:" in r.stdout and "withheld" not in r.stdout
    one_line_error(sattrib("5006", server=down, SATTRIB_BUNDLE_DIR=str(tmp_path / "bundles"),
                           SATTRIB_CLUSTER="alps"), "cannot reach the sattrib dashboard")


def test_a_readable_database_is_read_first(db):
    """The dashboard is asked only for what the local database does not know, and never with
    --database."""
    down = f"http://127.0.0.1:{_free_port()}/"
    r = sattrib("7002", server=down, database=db)
    assert r.returncode == 0 and r.stdout.startswith("Job 7002 (run 2 of 2) on alps")
    one_line_error(sattrib("4242", server=down, database=db), "cannot reach")
    one_line_error(sattrib("4242", "--database", str(db), server=down),
                   f"no diagnosis for job 4242 in {db}")


def test_job_json_lists_every_run_with_its_diagnosis(anonymous):
    page = json.loads(urllib.request.urlopen(anonymous + "job.json?id=7002.batch").read())
    assert [(r["cluster"], r["restart"], r["json"]) for r in page["runs"]] == [
        ("alps", 0, "/diagnosis/alps/7002/0.json"), ("alps", 1, "/diagnosis/alps/7002/1.json")]
    page = json.loads(urllib.request.urlopen(anonymous + "job.json?id=1001").read())
    assert [r["cluster"] for r in page["runs"]] == ["daint", "test"]
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(anonymous + "job.json?id=424242")
    assert e.value.code == 404 and json.loads(e.value.read())["runs"] == []


def test_an_unknown_job_is_one_line(anonymous):
    one_line_error(sattrib("424242", server=anonymous), "no diagnosis for job 424242 at "
                   + anonymous, "sattrib collect 424242")
    one_line_error(sattrib("7002", "--cluster", "daint", server=anonymous),
                   "no diagnosis for job 7002 in " + anonymous)


def test_a_server_that_is_down_is_one_line():
    url = f"http://127.0.0.1:{_free_port()}/"
    one_line_error(sattrib("1001", server=url), f"cannot reach the sattrib dashboard at {url}: "
                   "connection refused", "sattrib serve")


@pytest.fixture
def silent():
    """A socket that accepts and never answers; or answers the headers, then a byte a second."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    held = []

    def serve():
        while True:
            try:
                c, _ = srv.accept()
            except OSError:
                return
            held.append(c)
            if c.recv(4096).startswith(b"GET /slow/"):
                c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                          b"Content-Length: 1000\r\n\r\n")
                try:
                    for _ in range(60):
                        c.sendall(b" ")
                        time.sleep(0.3)
                except OSError:
                    pass
    threading.Thread(target=serve, daemon=True).start()
    yield f"http://127.0.0.1:{srv.getsockname()[1]}/"
    srv.close()
    for c in held:
        c.close()


def test_a_server_that_never_answers_times_out_within_the_setting(silent):
    for url in (silent, silent + "slow/"):
        t0 = time.monotonic()
        r = sattrib("1001", server=url, timeout_s=1.5)
        took = time.monotonic() - t0
        one_line_error(r, f"the sattrib dashboard at {url} did not answer within 1.5 s",
                       "server_timeout_s")
        assert took < 1.5 + 6, took                   # the wait, plus Python's start


class Answering:
    """A web server that answers every path the same way, `answer` = (status, content type,
    body); over TLS with `tls` = (certificate, key)."""

    def __init__(self, tls=None):
        self.answer = (200, "application/json", b"{}")
        self.location = None                  # a redirect's Location, when set
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                status, ctype, body = outer.answer
                self.send_response(status)
                if outer.location:
                    self.send_header("Location", outer.location)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a):
                pass
        self.srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        scheme = "http"
        if tls:
            import ssl
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(*tls)
            self.srv.socket = ctx.wrap_socket(self.srv.socket, server_side=True)
            scheme = "https"
        self.url = f"{scheme}://127.0.0.1:{self.srv.server_port}/"
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()

    def close(self):
        self.srv.shutdown()
        self.srv.server_close()


@pytest.fixture
def broken():
    srv = Answering()
    yield srv
    srv.close()


def test_errors_and_odd_answers_are_one_line(broken):
    url = broken.url
    broken.answer = (500, "text/plain", b"boom")
    one_line_error(sattrib("1001", server=url), f"dashboard at {url} answered 500",
                   "journalctl -u sattrib-dashboard")
    broken.answer = (200, "text/html", b"<html>a login page</html>")
    one_line_error(sattrib("1001", server=url), "is not JSON", "server_url")
    broken.answer = (404, "text/html", b"<h1>Not found</h1>")      # not a sattrib dashboard
    one_line_error(sattrib("1001", server=url), f"dashboard at {url} has no /job.json")
    broken.answer = (401, "text/html", b"login")
    one_line_error(sattrib("1001", server=url), "refused the request (401", "without one")
    broken.answer = (200, "application/json", b'{"runs": [{"cluster": "a", "restart": 0}]}')
    one_line_error(sattrib("1001", server=url), "unexpected answer from "
                   f"{url}diagnosis/a/1001/0.json")
    one_line_error(sattrib("1001", server="ftp://x/"), "server_url", "must be an http")



def _self_signed(tmp_path):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    return cert, key


def test_a_redirect_from_https_to_http_is_refused(tmp_path):
    """The dashboard's https address redirects to plain http: refused in one line (the answer
    would travel unencrypted); a redirect to another https address is followed."""
    cert, key = _self_signed(tmp_path)
    secure, other, plain = Answering(tls=(cert, key)), Answering(tls=(cert, key)), Answering()
    no_runs = (404, "application/json", b'{"job_id": "1001", "runs": []}')
    other.answer = plain.answer = no_runs
    secure.answer = (302, "text/plain", b"")
    try:
        secure.location = plain.url + "job.json?id=1001"
        one_line_error(sattrib("1001", server=secure.url, SATTRIB_SERVER_CA_FILE=str(cert)),
                       f"redirected to {plain.url}job.json?id=1001: refused", "https")
        secure.location = other.url + "job.json?id=1001"
        one_line_error(sattrib("1001", server=secure.url, SATTRIB_SERVER_CA_FILE=str(cert)),
                       f"no diagnosis for job 1001 at {secure.url}")
    finally:
        for srv in (secure, other, plain):
            srv.close()


def test_a_plain_http_server_url_beyond_this_machine_is_named(tmp_path):
    r = sattrib("1001", server="http://192.0.2.1:9/", timeout_s=1)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 1 and lines[0] == (
        "sattrib: warning: server_url http://192.0.2.1:9/ is not https: the diagnosis travels "
        "unencrypted and anyone on the way can change it; use the dashboard's https address")
    assert lines[1].startswith("sattrib: error:")
    assert "warning" not in sattrib("1001", server="http://127.0.0.1:9/").stderr


def test_tls_is_verified_and_server_ca_file_trusts_the_sites_ca(tmp_path):
    """A dashboard with a certificate of the site's own CA (here: self-signed): refused in one
    line until server_ca_file names it."""
    cert, key = _self_signed(tmp_path)
    srv = Answering(tls=(cert, key))
    srv.answer = (404, "application/json", b'{"job_id": "1001", "runs": []}')
    try:
        one_line_error(sattrib("1001", server=srv.url),
                       f"cannot verify the TLS certificate of {srv.url}", "server_ca_file")
        one_line_error(sattrib("1001", server=srv.url, SATTRIB_SERVER_CA_FILE=str(cert)),
                       f"no diagnosis for job 1001 at {srv.url}")
    finally:
        srv.close()
