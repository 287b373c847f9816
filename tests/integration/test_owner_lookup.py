"""`sattrib JOBID` on a login node, by the job's own user: a real failed job on the real Slurm
test cluster, diagnosed by the installed hooks, a real `sattrib serve` on that database, and
the installed CLI run as the job's user and as another user. Each proves who it is with a
credential from the cluster's own munged; the dashboard shows the evidence lines of a job to
its own user only."""
from __future__ import annotations

import json
import os
import shlex
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from test_hooks import (TEST_USER, cli_env, cluster, install, job_user, nodes,  # noqa: F401
                        timeout, wait_diagnosis, work)

SECRET = "loss-3f9a2c went NaN in my own code"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slurm
@timeout(240)
def test_the_jobs_own_user_sees_its_evidence_lines_through_munge(cluster, install, nodes, work,
                                                                 job_user):
    nodes.write_journals()
    udir = Path(tempfile.mkdtemp(prefix="sattrib-hooktest-owner-"))
    udir.chmod(0o755)
    os.chown(udir, job_user.pw_uid, job_user.pw_gid)
    port = _free_port()
    env = dict(cli_env(cluster, install), SATTRIB_SERVE_PORT=str(port),
               SATTRIB_SERVER_URL=f"http://127.0.0.1:{port}/")
    serve = None
    try:
        rank = f"echo \"RuntimeError: {SECRET}\" >&2; exit 3"
        script = f"#!/bin/sh\nsrun sh -c {shlex.quote(rank)}\nexit 3\n"
        r = subprocess.run(["runuser", "-u", TEST_USER, "--", "sbatch", "--parsable",
                            "--nodes=1", f"--chdir={udir}", f"--output={udir}/out-%j.txt"],
                           input=script, env=cluster.env, capture_output=True, text=True,
                           timeout=60, cwd=str(udir))
        assert r.returncode == 0, r.stderr
        jid = int(r.stdout.strip().split(";")[0])
        cluster.wait_job(jid, {"FAILED"}, timeout=60)
        diag, _ = wait_diagnosis(cluster, install, jid)
        assert any(SECRET in (e.get("text") or "") for e in diag["evidence"])

        serve = subprocess.Popen([str(install.sattrib), "serve"], env=env, cwd="/",
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        end = time.monotonic() + 90
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/-/summary.json",
                                       timeout=2).read()
                break
            except OSError:
                assert serve.poll() is None and time.monotonic() < end, "serve did not start"
                time.sleep(0.3)

        def as_user(uid, gid, path=None):
            # As on a login node: no database, no bundles; only the dashboard answers.
            e = dict(env, PATH=path or env.get("PATH", os.defpath),
                     SATTRIB_DATABASE="/nonexistent/diagnoses.db",
                     SATTRIB_BUNDLE_DIR="/nonexistent/bundles")
            return subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={gid}",
                                   "--init-groups" if uid == job_user.pw_uid else
                                   "--clear-groups", str(install.sattrib), str(jid), "--json"],
                                  env=e, capture_output=True, text=True, timeout=60, cwd="/")

        mine = as_user(job_user.pw_uid, job_user.pw_gid)
        assert mine.returncode == 0, mine.stderr
        doc = json.loads(mine.stdout)
        assert "evidence_text" not in doc, doc.get("evidence_text")
        assert any(SECRET in (e.get("text") or "") for e in doc["evidence"]), doc["evidence"]
        # file:line names the file the job wrote, not the bundle's copy of it
        mine_lines = [e for e in doc["evidence"] if SECRET in (e.get("text") or "")]
        assert all(e["source_path"] == f"{udir}/out-{jid}.txt" for e in mine_lines), mine_lines

        other = as_user(65534, 65534)                    # nobody: a valid credential, not theirs
        assert other.returncode == 0, other.stderr
        doc = json.loads(other.stdout)
        assert doc.get("evidence_text") == "withheld" and SECRET not in other.stdout

        bare = tempfile.mkdtemp(prefix="sattrib-nomunge-")   # no munge on PATH: one line says so
        os.chmod(bare, 0o755)
        os.symlink(shutil.which("setpriv"), Path(bare) / "setpriv")
        nomunge = as_user(job_user.pw_uid, job_user.pw_gid, path=bare)
        shutil.rmtree(bare)
        assert nomunge.returncode == 0, nomunge.stderr
        assert SECRET not in nomunge.stdout
        notes = [ln for ln in nomunge.stderr.splitlines() if "MUNGE" in ln]
        assert len(notes) == 1 and "munge is not installed" in notes[0], nomunge.stderr

        # A credential of the job's user works once, for the diagnosis it names only.
        did = f"{cluster.cluster_name}/{jid}/0"
        url = f"http://127.0.0.1:{port}/diagnosis/{did}.json"

        def cred(payload: str) -> str:
            r = subprocess.run(["setpriv", f"--reuid={job_user.pw_uid}",
                                f"--regid={job_user.pw_gid}", "--init-groups", "munge",
                                "--socket", str(cluster.munge_socket), "--string", payload],
                               capture_output=True, text=True, timeout=30)
            assert r.returncode == 0, r.stderr
            return r.stdout.strip()

        def shown(c: str) -> bool:
            req = urllib.request.Request(url, headers={"X-Sattrib-Munge": c})
            return json.loads(urllib.request.urlopen(req, timeout=10).read())[
                "evidence_text"] == "shown"
        good = cred(f"sattrib diagnosis {did}")
        assert shown(good)
        assert not shown(good), "a credential decoded twice must open nothing"
        assert not shown(cred(f"sattrib diagnosis {cluster.cluster_name}/{jid + 1}/0"))
        assert not shown("MUNGE:forged:")
    finally:
        if serve is not None:
            serve.terminate()
            serve.wait(timeout=10)
        shutil.rmtree(udir, ignore_errors=True)
