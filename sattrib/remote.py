"""`sattrib JOBID` where there is no database to read (a login node): the controller's
dashboard answers over HTTP(S), `server_url`.

/job.json?id=JOB lists the job's runs on every cluster; /diagnosis/CLUSTER/JOB/RUN.json gives
one run's diagnosis and what was done about it. The CLI is an anonymous visitor: the dashboard
leaves out the evidence lines and the user's frames unless its site shows them to everyone, or
the job is the caller's own: each diagnosis is asked for with a MUNGE credential (`munge`, the
cluster's own authentication) that proves who asks (datasette/sattrib_dashboard/owner.py).
Every way the exchange can fail is one UserError naming the URL, with a hint. A redirect is
followed only while it stays on https (when server_url is https); a plain http:// server_url
beyond this machine is used with a warning."""
from __future__ import annotations

import json
import re
import time
from typing import Optional
from urllib.parse import quote, urljoin, urlsplit

from .errors import UserError

MAX_BODY = 64 << 20          # a diagnosis with every evidence line is a few MiB at most
MAX_REDIRECTS = 5
REDIRECTS = (301, 302, 303, 307, 308)
OUTCOMES = ("attributed", "ambiguous", "unattributed")
CHECK_URL = "check server_url (`sattrib config` shows it)"


MUNGE_TIMEOUT_S = 5.0
OWNER_HEADER = "X-Sattrib-Munge"


def munge_payload(did: str) -> str:
    """What a credential says it is for: one diagnosis (`cluster/job/run`); the dashboard
    checks the same words (datasette/sattrib_dashboard/owner.py)."""
    return f"sattrib diagnosis {did}"


class Dashboard:
    def __init__(self, url: str, timeout_s: float, ca_file: str = "", munge_socket: str = ""):
        self.url = url
        self.base = url.rstrip("/") + "/"
        self.timeout_s = timeout_s
        self.verify = ca_file or True
        self.munge_socket = munge_socket
        self.no_munge: Optional[str] = None      # why no credential could be made here

    def credential(self, did: str) -> Optional[str]:
        """A MUNGE credential of this user for one diagnosis (`cluster/job/run`), or None with
        the reason kept in no_munge."""
        import subprocess
        argv = ["munge", "--string", munge_payload(did)]
        if self.munge_socket:
            argv += ["--socket", self.munge_socket]
        try:
            r = subprocess.run(argv, capture_output=True, text=True, timeout=MUNGE_TIMEOUT_S,
                               stdin=subprocess.DEVNULL)
        except FileNotFoundError:
            self.no_munge = "munge is not installed on this host"
            return None
        except (OSError, subprocess.TimeoutExpired) as e:
            self.no_munge = f"munge did not answer ({type(e).__name__})"
            return None
        if r.returncode != 0 or not r.stdout.startswith("MUNGE:"):
            self.no_munge = "munge failed: " + (r.stderr.strip().splitlines() or ["?"])[-1][:160]
            return None
        return r.stdout.strip()

    def warning(self) -> Optional[str]:
        """One line when the answers would travel unencrypted beyond this machine."""
        import ipaddress
        p = urlsplit(self.url)
        try:
            here = p.hostname == "localhost" or ipaddress.ip_address(p.hostname).is_loopback
        except ValueError:
            here = False
        if p.scheme == "https" or here:
            return None
        return (f"sattrib: warning: server_url {self.url} is not https: the diagnosis travels "
                "unencrypted and anyone on the way can change it; use the dashboard's https "
                "address")

    def runs(self, job_id: str, cluster: Optional[str] = None,
             restart: Optional[int] = None) -> list[dict]:
        """The job's runs (cluster, restart), sorted as the local lookup sorts them, without
        their diagnoses (`diagnosis` fetches one)."""
        status, doc = self._get("job.json", {"id": job_id})
        if not isinstance(doc, dict) or not isinstance(doc.get("runs"), list):
            if status == 404:
                raise UserError(f"the sattrib dashboard at {self.url} has no /job.json",
                                f"{CHECK_URL}: it is the dashboard's base URL; a dashboard "
                                "older than this sattrib lacks it, upgrade the controller's")
            raise self._unexpected("job.json")
        if status == 404 or not doc["runs"]:
            raise UserError(f"no diagnosis for job {job_id} at {self.url}",
                            "sattrib diagnoses failed jobs only (one that completed or still "
                            f"runs has none); an admin can run `sattrib collect {job_id}` on "
                            "the controller")
        out = []
        for r in doc["runs"]:
            if not (isinstance(r, dict) and isinstance(r.get("cluster"), str)
                    and isinstance(r.get("restart"), int)):
                raise self._unexpected("job.json")
            if (cluster is None or r["cluster"] == cluster) and (
                    restart is None or r["restart"] == restart):
                out.append({"cluster": r["cluster"], "restart": r["restart"]})
        return sorted(out, key=lambda r: (r["cluster"], r["restart"]))

    def diagnosis(self, job_id: str, run: dict) -> dict:
        """One run's diagnosis, actions and escalation, as lookup.find gives them, and whether
        the dashboard withheld its evidence text."""
        path = (f"diagnosis/{quote(run['cluster'], safe='')}/{quote(job_id, safe='')}/"
                f"{int(run['restart'])}.json")
        cred = self.credential(f"{run['cluster']}/{job_id}/{int(run['restart'])}")
        status, doc = self._get(path, headers={OWNER_HEADER: cred} if cred else None)
        d = doc.get("diagnosis") if isinstance(doc, dict) else None
        if status == 404:
            raise UserError(f"no diagnosis {run['cluster']}/{job_id}/{run['restart']} at "
                            f"{self.url}, though /job.json lists it",
                            "was the database just replaced? run the command again")
        if not (isinstance(d, dict) and d.get("outcome") in OUTCOMES and all(
                isinstance(d.get(k), str) for k in ("action", "rules_version",
                                                    "engine_version"))):
            raise self._unexpected(path)
        return {"diagnosis": d, "actions": doc.get("actions") or [],
                "escalation": doc.get("escalation"),
                "withheld": doc.get("evidence_text") == "withheld"}

    def _get(self, path: str, params: Optional[dict] = None, headers: Optional[dict] = None):
        """(status, the JSON document) of a GET; 404 is returned, other failures raised."""
        import requests
        import urllib3
        url = self.base + path
        t = self.timeout_s
        deadline = time.monotonic() + t
        try:
            for _ in range(MAX_REDIRECTS + 1):
                with requests.get(url, params=params,
                                  headers={"Accept": "application/json", **(headers or {})},
                                  timeout=(t, t), verify=self.verify, stream=True,
                                  allow_redirects=False) as r:
                    status, reason = r.status_code, r.reason
                    if status in REDIRECTS and r.headers.get("Location"):
                        to = self._redirect(url, r.headers["Location"])
                        if urlsplit(to).netloc != urlsplit(url).netloc:
                            headers = None       # the credential is for the dashboard only
                        url, params = to, None
                        continue
                    body = bytearray()
                    while chunk := r.raw.read1(1 << 16, decode_content=True):
                        body += chunk
                        if len(body) > MAX_BODY:
                            raise UserError(f"the answer from {url} is larger than "
                                            f"{MAX_BODY >> 20} MiB", CHECK_URL)
                        if time.monotonic() > deadline:
                            raise requests.Timeout()
                    break
            else:
                raise UserError(f"the sattrib dashboard at {self.url} redirects more than "
                                f"{MAX_REDIRECTS} times", CHECK_URL)
        except (requests.Timeout, urllib3.exceptions.ReadTimeoutError):
            raise UserError(f"the sattrib dashboard at {self.url} did not answer within "
                            f"{t:g} s", "is the controller busy, or a firewall dropping the "
                            "packets? server_timeout_s sets the wait") from None
        except requests.exceptions.SSLError as e:
            raise UserError(f"cannot verify the TLS certificate of {self.url}: {_reason(e)}",
                            "set server_ca_file to the CA bundle that signed it") from None
        except (requests.RequestException, urllib3.exceptions.HTTPError) as e:
            raise UserError(f"cannot reach the sattrib dashboard at {self.url}: {_reason(e)}",
                            "is `sattrib serve` running on the controller and reachable from "
                            f"this host? {CHECK_URL}") from None
        if status in (401, 403):
            raise UserError(f"the sattrib dashboard at {self.url} refused the request "
                            f"({status} {reason})", "its proxy asks for a login: let /job.json "
                            "and /diagnosis/ through without one (they carry no evidence lines "
                            "for anonymous callers), or ask an admin")
        if status >= 500:
            raise UserError(f"the sattrib dashboard at {self.url} answered {status} {reason}",
                            "see its log on the controller (journalctl -u sattrib-dashboard)")
        try:
            doc = json.loads(bytes(body))
        except ValueError:
            if status == 404:
                return status, None
            raise UserError(f"the answer from {url} is not JSON ({status} {reason})",
                            f"{CHECK_URL}: it is the dashboard's base URL, as a browser opens "
                            "it") from None
        if status != 200 and status != 404:
            raise self._unexpected(path, f"{status} {reason}")
        return status, doc

    def _redirect(self, url: str, location: str) -> str:
        """Where a redirect leads, refused when it would leave https."""
        to = urljoin(url, location)
        if urlsplit(self.base).scheme == "https" and urlsplit(to).scheme != "https":
            raise UserError(f"the sattrib dashboard at {self.url} redirected to {to}: refused, "
                            "the answer would travel unencrypted",
                            f"{CHECK_URL}: its https address, as the redirect should keep")
        return to

    def _unexpected(self, path: str, what: str = "not a sattrib answer") -> UserError:
        return UserError(f"unexpected answer from {self.base + path}: {what}",
                         f"{CHECK_URL}; the dashboard may run another sattrib version")


def _reason(e: Exception) -> str:
    """The innermost reason of a requests error ("Connection refused"), not its wrappers'."""
    text = str(e)
    m = re.search(r"\[Errno -?\d+\] ([^)'\"\]]+)", text)
    if m:
        return m.group(1).strip().rstrip(".").lower()
    m = re.search(r"certificate verify failed: ([^()'\"]+)", text)
    if m:
        return "certificate verify failed: " + m.group(1).strip()
    return text.splitlines()[0][:200] if text else type(e).__name__
