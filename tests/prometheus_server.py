"""A real Prometheus for the tests: recorded exporter series backfilled into a fresh TSDB with
`promtool tsdb create-blocks-from openmetrics`, then `prometheus` serving it on a free loopback
port (optionally over TLS with basic auth, as sites deploy it). Also the broken servers a
connector must survive: one that answers 500, one that accepts and never answers, one that
trickles its answer a byte at a time."""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Optional

import requests

DATA = Path(__file__).parent / "data" / "prometheus"
STEP = 15


def exposition() -> dict[str, str]:
    """Recorded series (tests/data/prometheus/exposition.txt), by metric name (the first
    line of each name; the Xid series with err_code under the key `xid79`)."""
    out: dict[str, str] = {}
    for ln in (DATA / "exposition.txt").read_text().splitlines():
        if not ln or ln.startswith("#"):
            continue
        key = "xid79" if 'err_code="79"' in ln else ln.split("{", 1)[0]
        out.setdefault(key, ln)
    return out


def openmetrics(samples: list[tuple[str, str, list[tuple[float, float]]]]) -> str:
    """(series template, node, [(t, value)]) -> OpenMetrics text for promtool."""
    lines = []
    for template, node, points in samples:
        series = template.replace("{node}", node)
        lines += [f"{series} {v:g} {t:.3f}" for t, v in points]
    return "\n".join(lines) + "\n# EOF\n"


def steps(lo: float, hi: float, value) -> list[tuple[float, float]]:
    """A sample every STEP seconds over [lo, hi]; `value(t)` gives each one."""
    out, t = [], lo
    while t <= hi:
        out.append((t, float(value(t))))
        t += STEP
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def self_signed_ca(tmp: Path, name: str) -> tuple[Path, Path]:
    """A CA of our own (openssl): (certificate, key)."""
    crt, key = tmp / f"{name}.crt", tmp / f"{name}.key"
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", crt,
             "-days", "2", "-subj", f"/CN={name}",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    return crt, key


def server_cert(tmp: Path, ca: tuple[Path, Path]) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 signed by `ca`: (certificate, key)."""
    crt, key, csr, ext = (tmp / "server.crt", tmp / "server.key", tmp / "server.csr",
                          tmp / "server.ext")
    ext.write_text("subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n"
                   "keyUsage=critical,digitalSignature,keyEncipherment\n"
                   "extendedKeyUsage=serverAuth\n")
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", csr,
             "-subj", "/CN=127.0.0.1")
    _openssl("x509", "-req", "-in", csr, "-CA", ca[0], "-CAkey", ca[1], "-CAcreateserial",
             "-out", crt, "-days", "2", "-extfile", ext)
    return crt, key


def _openssl(*args) -> None:
    r = subprocess.run(["openssl", *map(str, args)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]


class Prometheus:
    """`secure=(user, password)`: served over TLS with a certificate from a CA of its own
    (`self.ca`), basic auth required (the password's bcrypt hash in --web.config.file)."""

    def __init__(self, tmp: Path, text: str, secure: Optional[tuple[str, str]] = None):
        self.dir = tmp
        self.data = tmp / "tsdb"
        self.data.mkdir(parents=True)
        web, self.ca, auth = [], None, None
        if secure:
            import bcrypt
            self.ca = self_signed_ca(tmp, "sattrib-test-ca")[0]
            crt, key = server_cert(tmp, (self.ca, tmp / "sattrib-test-ca.key"))
            digest = bcrypt.hashpw(secure[1].encode(), bcrypt.gensalt(rounds=10)).decode()
            (tmp / "web.yml").write_text(
                f"tls_server_config:\n  cert_file: {crt}\n  key_file: {key}\n"
                f"basic_auth_users:\n  {secure[0]}: '{digest}'\n")
            web, auth = [f"--web.config.file={tmp / 'web.yml'}"], secure
        (tmp / "samples.om").write_text(text)
        r = subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics",
                            str(tmp / "samples.om"), str(self.data)],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr[-2000:]
        (tmp / "prometheus.yml").write_text("global:\n  scrape_interval: 15s\n")
        self.port = free_port()
        self.url = f"{'https' if secure else 'http'}://127.0.0.1:{self.port}"
        self.log = open(tmp / "prometheus.log", "w")
        self.proc = subprocess.Popen(
            ["prometheus", f"--config.file={tmp / 'prometheus.yml'}",
             f"--storage.tsdb.path={self.data}", "--storage.tsdb.retention.time=20y",
             f"--web.listen-address=127.0.0.1:{self.port}", *web],
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 30
        while True:
            try:
                if requests.get(self.url + "/-/ready", timeout=1, auth=auth,
                                verify=str(self.ca) if self.ca else True).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise AssertionError("prometheus did not start: " +
                                     (tmp / "prometheus.log").read_text()[-2000:])
            time.sleep(0.2)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.log.close()


def have_prometheus() -> bool:
    return bool(shutil.which("prometheus") and shutil.which("promtool"))


class _Local:
    """A loopback HTTP server on a free port, in a thread."""

    def _serve(self, handler) -> None:
        self.srv = HTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.srv.server_address[1]}"
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()

    def stop(self):
        self.srv.shutdown()
        self.srv.server_close()


class Answers500(_Local):
    """An HTTP server on a free loopback port that answers every request 500."""

    def __init__(self):
        class H(BaseHTTPRequestHandler):
            def do_POST(self):
                self.send_response(500)
                self.send_header("Content-Type", "text/plain")
                self.end_headers()
                self.wfile.write(b"internal error\n")
            do_GET = do_POST

            def log_message(self, *a):
                pass
        self._serve(H)


class NeverAnswers:
    """Accepts connections and reads them, never writes a byte (a hung Prometheus)."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.conns = []
        self.stopping = False
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self):
        while not self.stopping:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(c)

    def stop(self):
        self.stopping = True
        for c in self.conns:
            c.close()
        self.sock.close()


def closed_port_url() -> str:
    return f"http://127.0.0.1:{free_port()}"


def token_file(tmp: Path, token: str, mode: int = 0o600) -> str:
    p = tmp / "prom.token"
    p.write_text(token + "\n")
    os.chmod(p, mode)
    return str(p)


class Trickles(_Local):
    """Answers 200 with a JSON body it sends one byte every `gap` seconds (each byte well
    within any read timeout, the whole answer far beyond any budget)."""

    def __init__(self, gap: float = 0.1, size: int = 4000):
        self.stopping = threading.Event()
        stopping = self.stopping
        body = (b'{"status":"success","data":{"resultType":"matrix","result":[]}}'
                .ljust(size, b" "))

        class H(BaseHTTPRequestHandler):
            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                for i in range(len(body)):
                    if stopping.wait(gap):
                        return
                    self.wfile.write(body[i:i + 1])
                    self.wfile.flush()

            def log_message(self, *a):
                pass
        self._serve(H)

    def stop(self):
        self.stopping.set()
        super().stop()


class Answers(_Local):
    """Answers every query with `status` and a JSON body: an empty success padded to `size`
    bytes, or an error whose message echoes the request's Authorization header (as a proxy's
    error page may). Keeps each request's Authorization header in `auth`."""

    def __init__(self, status: int = 200, size: int = 0, error_type: str = "unavailable"):
        seen = self.auth = []

        class H(BaseHTTPRequestHandler):
            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                seen.append(self.headers.get("Authorization"))
                if status == 200:
                    body = (b'{"status":"success","data":{"resultType":"matrix","result":[]}}'
                            .ljust(size, b" "))
                else:
                    body = json.dumps({"status": "error", "errorType": error_type,
                                       "error": "upstream refused the request with headers "
                                                f"Authorization: {self.headers.get('Authorization')}"
                                       }).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a):
                pass
        self._serve(H)
