"""Datasette plugin for the sattrib dashboard: a page per diagnosis and per node, links between
them, and the guards that keep the instance read-only and its evidence private.

Everything shown comes from the diagnoses database through read-only connections (the
dashboard's user may only read the file). Text from logs is written by users; it reaches the
page only through Jinja's autoescaping or markupsafe.escape, and only for actors that may view
the evidence table (the `allow` blocks `sattrib serve` writes; serve_evidence_text). Writes
answer 405; /-/databases shows no file paths; an actor comes from `--root` or, when the site
names one, from its reverse proxy's user header.
"""
import asyncio
import json
import os
import re
import sqlite3
from urllib.parse import quote

from datasette import hookimpl
from datasette.database import Database
from datasette.utils import tilde_encode
from datasette.utils.asgi import NotFound, Response
from markupsafe import Markup, escape

XID = re.compile(r"NVRM: Xid \([^)]*\): (\d+),")
WRITE_ACTIONS = {"insert-row", "delete-row", "update-row", "create-table", "drop-table",
                 "alter-table", "upsert-row", "view-query-write"}


def _db(datasette):
    names = [n for n in datasette.databases if n != "_internal"]
    if not names:
        raise NotFound("no database")
    return datasette.get_database(names[0])


def _link(datasette, path, text):
    return Markup('<a href="{}">{}</a>').format(datasette.urls.path(path), text)


def _rule_path(datasette, rule_id):
    # Datasette row URLs tilde-encode the key: "gpu.xid" -> "gpu~2Exid".
    return f"/{_db(datasette).name}/rules/{tilde_encode(rule_id)}"


def _diag_path(cluster, job, restart):
    return f"/diagnosis/{quote(str(cluster), safe='')}/{quote(str(job), safe='')}/{int(restart)}"


HEADER_ENV = "SATTRIB_DASHBOARD_TRUSTED_USER_HEADER"      # set by `sattrib serve`
DB_NAME = "diagnoses"
READ_METHODS = ("GET", "HEAD")


@hookimpl
def permission_allowed(action):
    if action in WRITE_ACTIONS:
        return False
    return None


@hookimpl
def actor_from_request(request):
    header = os.environ.get(HEADER_ENV, "").lower()
    user = request.headers.get(header, "").strip() if header else ""
    return {"id": user, "via": "proxy header"} if user else None


@hookimpl
def asgi_wrapper():
    """Nothing here writes: every method but GET and HEAD is 405 (logging out excepted)."""
    def wrap(app):
        async def read_only(scope, receive, send):
            if (scope["type"] == "http" and scope["method"] not in READ_METHODS
                    and not scope["path"].endswith("/-/logout")):
                await Response.text("405 Method Not Allowed: the sattrib dashboard is "
                                    "read-only\n", status=405,
                                    headers={"Allow": ", ".join(READ_METHODS)}).asgi_send(send)
                return
            await app(scope, receive, send)
        return read_only
    return wrap


class ReadOnlyDatabase(Database):
    """The diagnoses file, read by a user who may not write it nor create its WAL index (-shm)
    beside it. While a writer is connected SQLite shares its WAL index read-only (mode=ro);
    when none is, the file holds everything (the last writer checkpointed it) and is read as it
    is (immutable=1). A fresh connection per query, so new diagnoses show at once."""

    def connect(self, write=False):
        if write:
            raise sqlite3.OperationalError("the sattrib dashboard is read-only")
        conn = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, check_same_thread=False)
        try:
            conn.execute("select 1 from sqlite_master limit 1").fetchall()
        except sqlite3.OperationalError:
            conn.close()
            conn = sqlite3.connect(f"file:{self.path}?immutable=1", uri=True,
                                   check_same_thread=False)
        return conn

    async def execute_fn(self, fn):
        def in_thread():
            conn = self.connect()
            try:
                self.ds._prepare_connection(conn, self.name)
                return fn(conn)
            finally:
                conn.close()
        if self.ds.executor is None:
            return in_thread()
        return await asyncio.get_event_loop().run_in_executor(self.ds.executor, in_thread)


@hookimpl
def startup(datasette):
    # Served as "diagnoses" whatever the file is called (`--database /data/gpu-failures.db`):
    # the metadata, the home page's links and the templates name it so.
    for name, db in list(datasette.databases.items()):
        if db.path and not db.is_memory and not isinstance(db, ReadOnlyDatabase):
            datasette.remove_database(name)
            datasette.add_database(ReadOnlyDatabase(datasette, path=db.path), name=DB_NAME,
                                   route=DB_NAME)


async def databases_page(datasette, request):
    """/-/databases without the file system paths Datasette shows there."""
    data = [{k: v for k, v in d.items() if k != "path"} for d in datasette._connected_databases()]
    if request.url_vars.get("format") == "json":
        return Response.json(data)
    return Response.html(await datasette.render_template(
        "show_json.html", {"filename": "databases.json",
                           "data_json": json.dumps(data, indent=4)}, request=request))


async def may_read_text(datasette, actor, db) -> bool:
    return await datasette.permission_allowed(actor, "view-table", (db.name, "evidence"),
                                              default=True)


@hookimpl
def render_cell(row, value, column, table, database, datasette):
    if value is None or value == "":
        return None
    keys = row.keys() if hasattr(row, "keys") else []
    if column == "job_id" and "cluster" in keys and "restart" in keys:
        return _link(datasette, _diag_path(row["cluster"], value, row["restart"]), escape(value))
    if column in ("id", "diagnosis_id") and isinstance(value, str) and value.count("/") == 2:
        cluster, job, restart = value.split("/")
        if restart.isdigit():
            return _link(datasette, _diag_path(cluster, job, restart), escape(value))
    if column in ("culprit_node", "node") and isinstance(value, str) and value != "job":
        return _link(datasette, f"/node/{quote(value, safe='')}", escape(value))
    if column in ("rule", "root_rule") and isinstance(value, str):
        return _link(datasette, _rule_path(datasette, value), escape(value))
    return None


def _when(e):
    return e.get("timestamp") or ""


async def diagnosis_page(datasette, request):
    db = _db(datasette)
    p = request.url_vars
    did = f"{p['cluster']}/{p['job']}/{p['restart']}"
    res = await db.execute("select diagnosis_json, bundle_path, created_at, updated_at "
                           "from diagnoses where id = ?", [did])
    row = res.first()
    if row is None:
        raise NotFound(f"no diagnosis {did}")
    d = json.loads(row["diagnosis_json"])
    rules = {r["id"]: dict(r) for r in (await db.execute(
        "select id, title, refs from rules")).rows}
    evidence = d.get("evidence") or []
    by_id = {e["id"]: e for e in evidence}
    causes = [d["root_cause"]] if d.get("root_cause") else (d.get("candidates") or [])
    root_ids = {i for c in causes for i in (c.get("evidence") or [])[:1]}
    cause_ids = {i for c in causes for i in c.get("evidence") or []}
    timeline = sorted(evidence, key=lambda e: (_when(e) == "", _when(e), e["node"] or "",
                                               e["path"], e.get("line") or 0))
    show_text = await may_read_text(datasette, request.actor, db)
    for e in timeline:
        title = (rules.get(e["rule"]) or {}).get("title") or e["rule"]
        m = XID.search(e.get("text") or "") if e["rule"] == "gpu.xid" else None
        e["label"] = f"Xid {m.group(1)}" if m else title
        if not show_text:
            e["text"] = None
    symptoms = []
    for s in d.get("symptoms") or []:
        first = by_id.get((s.get("evidence") or [None])[0])
        symptoms.append(dict(s, first=first))
    for c in causes:
        r = rules.get(c.get("rule"))
        c["rule_title"] = r["title"] if r else None
        c["refs"] = json.loads(r["refs"]) if r and r.get("refs") else []
    return Response.html(await datasette.render_template(
        "sattrib_diagnosis.html", {
            "d": d, "causes": causes, "timeline": timeline, "root_ids": root_ids,
            "cause_ids": cause_ids, "symptoms": symptoms, "rules": rules,
            "did": did, "bundle_path": row["bundle_path"] if show_text else None,
            "show_text": show_text, "created_at": row["created_at"],
            "updated_at": row["updated_at"], "database": db.name,
            "nodes_page": lambda n: datasette.urls.path(f"/node/{quote(n, safe='')}"),
            "rule_page": lambda r: datasette.urls.path(_rule_path(datasette, r)),
        }, request=request))


async def node_page(datasette, request):
    db = _db(datasette)
    node = request.url_vars["node"]
    culprit = (await db.execute(
        "select id, cluster, job_id, restart, job_name, outcome, category, culprit_gpu, "
        "summary, created_at from diagnoses where culprit_node = ? "
        "order by created_at desc limit 100", [node])).rows
    missing = (await db.execute(
        "select m.source, count(*) as n, max(d.created_at) as last from missing_evidence m "
        "join diagnoses d on d.id = m.diagnosis_id where m.node = ? group by m.source "
        "order by n desc", [node])).rows
    gpus = (await db.execute(
        "select culprit_gpu as gpu, max(gpu_serial) as serial, max(gpu_uuid) as uuid, "
        "count(*) as n from diagnoses where culprit_node = ? and culprit_gpu is not null "
        "group by culprit_gpu order by n desc", [node])).rows
    return Response.html(await datasette.render_template(
        "sattrib_node.html", {
            "node": node, "culprit": culprit, "missing": missing, "gpus": gpus,
            "diag_page": lambda r: datasette.urls.path(
                _diag_path(r["cluster"], r["job_id"], r["restart"])),
        }, request=request))


@hookimpl
def register_routes():
    return [
        (r"^/diagnosis/(?P<cluster>[^/]+)/(?P<job>[^/]+)/(?P<restart>\d+)$", diagnosis_page),
        (r"^/node/(?P<node>[^/]+)$", node_page),
        (r"^/-/databases(\.(?P<format>json))?$", databases_page),
    ]
