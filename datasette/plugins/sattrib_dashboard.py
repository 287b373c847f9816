"""Datasette plugin for the sattrib dashboard: a page per diagnosis and per node, links between
them, and the guards that keep the instance read-only and its evidence private.

Everything shown comes from the diagnoses database through read-only connections (the
dashboard's user may only read the file). Text from logs is written by users; it reaches the
page only through Jinja's autoescaping or markupsafe.escape, and only for actors that may view
the evidence table (the `allow` blocks `sattrib serve` writes; serve_evidence_text). Writes
answer 405; /-/databases shows no file paths and /-/metadata no actor names; an actor comes
from `--root` or, when the site names one, from its reverse proxy's user header, believed only
on a request that the proxy itself made (its address in serve_trusted_proxy).
"""
import asyncio
import ipaddress
import json
import os
import re
import sqlite3
import time
from urllib.parse import quote

from datasette import hookimpl
from datasette.database import Database
from datasette.utils import tilde_encode
from datasette.utils.asgi import NotFound, Response
from markupsafe import Markup, escape

from sattrib.engine.taxonomy import Action, out_of_service

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
PROXY_ENV = "SATTRIB_DASHBOARD_TRUSTED_PROXY"            # its addresses, comma-separated
DB_NAME = "diagnoses"
READ_METHODS = ("GET", "HEAD")


@hookimpl
def permission_allowed(action):
    if action in WRITE_ACTIONS:
        return False
    return None


def from_trusted_proxy(request) -> bool:
    """Did the site's reverse proxy itself make this request? The socket's peer address (uvicorn
    is told to believe no X-Forwarded-For) against serve_trusted_proxy; none named: never."""
    client = request.scope.get("client")
    try:
        peer = ipaddress.ip_address(client[0])
    except (TypeError, IndexError, ValueError):
        return False                      # a Unix socket, or no peer at all
    peer = getattr(peer, "ipv4_mapped", None) or peer
    for net in os.environ.get(PROXY_ENV, "").split(","):
        try:
            if net.strip() and peer in ipaddress.ip_network(net.strip(), strict=False):
                return True
        except ValueError:
            continue
    return False


@hookimpl
def actor_from_request(request):
    header = os.environ.get(HEADER_ENV, "").lower()
    if not header or not from_trusted_proxy(request):
        return None                       # anyone else may send that header too
    user = request.headers.get(header, "").strip()
    return {"id": user, "via": "proxy header"} if user else None


@hookimpl
def asgi_wrapper():
    """Nothing here writes: every method but GET and HEAD is 405 (logging out excepted). CSV
    answers have their formula cells defused."""
    def wrap(app):
        async def read_only(scope, receive, send):
            if (scope["type"] == "http" and scope["method"] not in READ_METHODS
                    and not scope["path"].endswith("/-/logout")):
                await Response.text("405 Method Not Allowed: the sattrib dashboard is "
                                    "read-only\n", status=405,
                                    headers={"Allow": ", ".join(READ_METHODS)}).asgi_send(send)
                return
            if scope["type"] == "http" and scope["path"].endswith(".csv"):
                await app(scope, receive, csv_defuser(send))
                return
            await app(scope, receive, send)
        return read_only
    return wrap


def defuse_csv(data: bytes) -> bytes:
    """The CSV with every cell a spreadsheet would run as a formula (`=`, `+`, `-`, `@`...
    first: a job name, a user, a summary) given a `'` before it (sattrib.escape)."""
    import csv
    import io
    from sattrib.escape import spreadsheet_cell
    out = io.StringIO()
    writer = csv.writer(out)                      # the dialect Datasette writes
    for row in csv.reader(io.StringIO(data.decode("utf-8", "surrogateescape"), newline="")):
        writer.writerow([spreadsheet_cell(cell) for cell in row])
    return out.getvalue().encode("utf-8", "surrogateescape")


def csv_defuser(send):
    """An ASGI `send` that holds a CSV answer (one page of rows: CSV streaming is off) and
    sends it defused. Datasette writes CSV itself and has no hook for its cells; answers that
    are not CSV (an error page) pass unchanged."""
    held: dict = {"start": None, "body": []}

    async def hold(message):
        start = held["start"]
        if message["type"] == "http.response.start":
            held["start"] = message
            return
        if message["type"] != "http.response.body" or start is None:
            await send(message)
            return
        held["body"].append(message.get("body", b""))
        if message.get("more_body"):
            return
        data = b"".join(held["body"])
        kind = dict(start.get("headers") or []).get(b"content-type", b"")
        if start["status"] == 200 and kind.startswith((b"text/plain", b"text/csv")):
            data = defuse_csv(data)
        headers = [(k, v) for k, v in start.get("headers") or [] if k.lower() != b"content-length"]
        await send(dict(start, headers=headers + [(b"content-length", str(len(data)).encode())]))
        await send({"type": "http.response.body", "body": data})
    return hold


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


def _without_allow(md):
    """Metadata without its `allow` blocks: they name the admins, whom a visitor could then
    impersonate wherever a proxy header is believed."""
    if isinstance(md, dict):
        return {k: _without_allow(v) for k, v in md.items() if k not in ("allow", "allow_sql")}
    if isinstance(md, list):
        return [_without_allow(v) for v in md]
    return md


async def metadata_page(datasette, request):
    """/-/metadata without the names of those who may read evidence text."""
    await datasette.ensure_permissions(request.actor, ["view-instance"])
    data = _without_allow(datasette.metadata())
    if request.url_vars.get("format") == "json":
        return Response.json(data)
    return Response.html(await datasette.render_template(
        "show_json.html", {"filename": "metadata.json",
                           "data_json": json.dumps(data, indent=4)}, request=request))


async def may_read_text(datasette, actor, db) -> bool:
    return await datasette.permission_allowed(actor, "view-table", (db.name, "evidence"),
                                              default=True)


# Column headers of the canned queries' pages (the JSON keeps the column names).
LABELS = {"failed_at": "Failed at (UTC)", "created_at": "Diagnosed (UTC)", "job_id": "Job",
          "culprit_node": "Culprit node", "culprit_gpu": "Culprit GPU", "gpu": "GPU",
          "uuid": "UUID", "gpus": "GPUs", "last_seen": "Last seen (UTC)",
          "first": "First (UTC)", "last": "Last (UTC)", "id": "Diagnosis",
          "not_counted": "Not the node's fault (not counted)",
          "last_snapshot_at": "Last snapshot (UTC)", "last_diagnosis_at": "Last diagnosis (UTC)",
          "last_diagnosis": "Last diagnosis", "missed": "Snapshots missed since",
          "q": "Search", "since": "Since (date)", "until": "Until (date)", "node": "Node", "days": "Days"}
TIME_COLUMNS = {"failed_at", "created_at", "last_seen", "first", "last", "job_end",
                "last_snapshot_at", "last_diagnosis_at"}
ISO = re.compile(r"^(\d{4}-\d\d-\d\d)T(\d\d:\d\d)(:\d\d(\.\d+)?)?Z?$")


def column_label(name: str) -> str:
    return LABELS.get(name) or name.replace("_", " ").capitalize()


@hookimpl
def extra_template_vars():
    return {"column_label": column_label}


@hookimpl
def render_cell(row, value, column, table, database, datasette):
    if value is None or value == "":
        return None
    keys = row.keys() if hasattr(row, "keys") else []
    if column == "job_id" and "cluster" in keys and "restart" in keys:
        text = escape(value) if not row["restart"] else escape(f"{value} (run {row['restart'] + 1})")
        return _link(datasette, _diag_path(row["cluster"], value, row["restart"]), text)
    if column in TIME_COLUMNS and table is None and isinstance(value, str) and ISO.match(value):
        m = ISO.match(value)
        return Markup('<time datetime="{}">{} {}</time>').format(value, m.group(1), m.group(2))
    if column in ("id", "diagnosis_id", "last_diagnosis") and isinstance(value, str) \
            and value.count("/") == 2:
        cluster, job, restart = value.split("/")
        if restart.isdigit():
            return _link(datasette, _diag_path(cluster, job, restart), escape(value))
    if column in ("culprit_node", "node") and isinstance(value, str) and value != "job":
        return _link(datasette, f"/node/{quote(value, safe='')}", escape(value))
    if column in ("serial", "uuid", "gpu_serial", "gpu_uuid") and isinstance(value, str):
        return Markup('<a href="{}">{}</a>').format(gpu_path(datasette, value), value)
    if column in ("rule", "root_rule") and isinstance(value, str):
        return _link(datasette, _rule_path(datasette, value), escape(value))
    return None


# What an evidence item says of the job (the log line, a metric's series and samples): shown
# to those who may read evidence text only.
PRIVATE = ("text", "metric")
CHART_W, CHART_H = 240, 48


def metric_chart(metric: dict, stamp) -> dict | None:
    """An inline SVG chart of a metric's samples around the change (the failures-per-day
    chart's style, no script): polyline points in a CHART_W x CHART_H box, the value range,
    and where the evidence's time stamp falls."""
    pts = [(float(t), float(v)) for t, v in metric.get("points") or []]
    if len(pts) < 2:
        return None
    t0, t1 = pts[0][0], pts[-1][0]
    lo, hi = min(v for _, v in pts), max(v for _, v in pts)
    span_t, span_v = (t1 - t0) or 1.0, (hi - lo) or 1.0

    def x(t):
        return round(2 + (CHART_W - 4) * (t - t0) / span_t, 1)

    def y(v):
        return round(CHART_H - 2 - (CHART_H - 4) * (v - lo) / span_v, 1)
    mark = None
    if stamp:
        try:
            from datetime import datetime
            at = datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
            mark = x(at) if t0 <= at <= t1 else None
        except ValueError:
            pass
    fmt = lambda v: f"{v:g}"  # noqa: E731
    return {"w": CHART_W, "h": CHART_H, "mark": mark, "lo": fmt(lo), "hi": fmt(hi),
            "points": " ".join(f"{x(t)},{y(v)}" for t, v in pts),
            "from": time.strftime("%H:%M", time.gmtime(t0)),
            "to": time.strftime("%H:%M", time.gmtime(t1))}


# The swimlane (the job page's evidence across nodes, the GPU page's history): one row per lane,
# a mark per item at its time, drawn here as inline SVG like the metric chart (no script).
LANE_H, LANE_LABEL_W, LANE_W, MAX_LANES = 16, 130, 560, 32
# Drawn in this order (later on top), and how each looks: (fill, width, height, opacity).
MARK_STYLE = {"symptom": ("#8a8a8a", 3, 8, 0.55), "workload": ("#8a8a8a", 5, 10, 0.7),
              "context": ("#3a5a97", 3, 8, 0.8), "confirmation": ("#e08a00", 4, 10, 1),
              "infra": ("#b3261e", 6, 12, 1), "root": ("#b3261e", 7, 14, 1)}


def _epoch(stamp) -> float | None:
    """An ISO-8601 time stamp as epoch seconds (UTC when it names no zone), or None."""
    from datetime import datetime, timezone
    try:
        at = datetime.fromisoformat(str(stamp).replace("Z", "+00:00"))
    except ValueError:
        return None
    return (at if at.tzinfo else at.replace(tzinfo=timezone.utc)).timestamp()


def swimlane(items: list[tuple], lanes: list[tuple], max_lanes: int = MAX_LANES) -> dict | None:
    """An inline SVG swimlane: `lanes` is [(key, label, href)] top to bottom, `items` is
    [(lane key, ISO time, kind, title)] with kind a key of MARK_STYLE. Items without a time,
    or on a lane past max_lanes, are not drawn; marks that fall on the same pixel of a lane
    and kind are drawn once, their title counting them. None when nothing has a time."""
    timed = [(k, at, kind, title) for k, stamp, kind, title in items
             if stamp and (at := _epoch(stamp)) is not None]
    if not timed:
        return None
    keys = [k for k, _, _ in lanes]
    row = {k: i for i, k in enumerate(keys[:max_lanes])}
    t0, t1 = min(t for _, t, _, _ in timed), max(t for _, t, _, _ in timed)
    span = t1 - t0

    def x(t):
        return round(LANE_W / 2 if not span else 6 + (LANE_W - 12) * (t - t0) / span, 1)
    marks: dict = {}
    order = list(MARK_STYLE)
    for k, t, kind, title in timed:
        if k not in row:
            continue
        key = (row[k], x(t), kind)
        if key in marks:
            marks[key]["n"] += 1
        else:
            marks[key] = {"title": title, "n": 1}
    drawn = []
    for (i, at, kind), m in sorted(marks.items(), key=lambda kv: (order.index(kv[0][2]),
                                                                 kv[0][0], kv[0][1])):
        fill, w, h, opacity = MARK_STYLE[kind]
        drawn.append({"cls": kind, "x": round(at - w / 2, 1), "y": i * LANE_H + (LANE_H - h) / 2,
                      "w": w, "h": h, "fill": fill, "opacity": opacity,
                      "title": m["title"] + (f" (x{m['n']})" if m["n"] > 1 else "")})
    fmt = "%H:%M:%S" if time.gmtime(t0)[:3] == time.gmtime(t1)[:3] else "%Y-%m-%d %H:%M"
    shown = lanes[:max_lanes]
    return {"w": LANE_W, "label_w": LANE_LABEL_W, "lane_h": LANE_H,
            "h": len(shown) * LANE_H, "marks": drawn,
            "lanes": [{"label": label, "href": href, "y": i * LANE_H}
                      for i, (_, label, href) in enumerate(shown)],
            "more": max(0, len(lanes) - max_lanes),
            "from": time.strftime(fmt, time.gmtime(t0)),
            "to": time.strftime(fmt, time.gmtime(t1)),
            "span": _span(span)}


def _span(s: float) -> str:
    if s < 120:
        return f"{s:.0f} s" if s >= 1 or not s else f"{s * 1000:.0f} ms"
    if s < 7200:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.0f} h" if s < 172800 else f"{s / 86400:.0f} days"


def evidence_swimlane(datasette, timeline, root_ids, cause_ids) -> dict | None:
    """The job page's swimlane: one lane per node with timed evidence (the cause's nodes first,
    then by their first line), the root line marked apart, symptoms muted. Titles say node,
    time, role and category only: no evidence text, so it is shown to everyone."""
    def kind(e):
        if e["id"] in root_ids:
            return "root"
        if e["role"] == "symptom":
            return "symptom"
        return "confirmation" if e["role"] == "confirmation" or e["id"] in cause_ids \
            else "context"
    timed = [e for e in timeline if e.get("timestamp") and _epoch(e["timestamp"]) is not None]
    first: dict = {}
    for e in timed:
        n = e.get("node") or "job"
        at = (e["id"] not in cause_ids, _epoch(e["timestamp"]))
        first[n] = min(first.get(n, at), at)
    lanes = [(n, n, None if n == "job" else datasette.urls.path(f"/node/{quote(n, safe='')}"))
             for n in sorted(first, key=lambda n: (first[n], n))]
    items = [(e.get("node") or "job", e["timestamp"], kind(e),
              " · ".join(str(v) for v in (e.get("node") or "job", e["timestamp"], e["role"],
                                          e.get("category")) if v))
             for e in timed]
    return swimlane(items, lanes)


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
    if not show_text:
        # The user's frames are read from the job's output, like evidence text: admins only.
        for c in causes:
            c.pop("user_frames", None)
    if request.url_vars.get("format"):
        if not show_text:
            d["evidence"] = [{k: v for k, v in e.items() if k not in PRIVATE} for e in evidence]
        out = {"id": did, "created_at": row["created_at"], "updated_at": row["updated_at"],
               "evidence_text": "shown" if show_text else "withheld", "diagnosis": d,
               **(await _acted(db, did))}
        if show_text:
            out["bundle_path"] = row["bundle_path"]
        return Response.json(out)
    for e in timeline:
        title = (rules.get(e["rule"]) or {}).get("title") or e["rule"]
        m = XID.search(e.get("text") or "") if e["rule"] == "gpu.xid" else None
        e["label"] = f"Xid {m.group(1)}" if m else title
        if not show_text:
            for k in PRIVATE:
                e[k] = None
        elif e.get("metric"):
            e["chart"] = metric_chart(e["metric"], e.get("timestamp"))
            if not str(e["metric"].get("graph") or "").startswith(("http://", "https://")):
                e["metric"]["graph"] = None
    symptoms = []
    for s in d.get("symptoms") or []:
        first = by_id.get((s.get("evidence") or [None])[0])
        symptoms.append(dict(s, first=first))
    for c in causes:
        r = rules.get(c.get("rule"))
        c["rule_title"] = r["title"] if r else None
        c["refs"] = json.loads(r["refs"]) if r and r.get("refs") else []
    acted = await _acted(db, did)
    return Response.html(await datasette.render_template(
        "sattrib_diagnosis.html", {
            "swim": evidence_swimlane(datasette, timeline, root_ids, cause_ids),
            "gpu_page": lambda g: gpu_path(datasette, g),
            "acted": acted, "diag_page": lambda r: datasette.urls.path(
                _diag_path(r["cluster"], r["job_id"], r["restart"])),
            "d": d, "causes": causes, "timeline": timeline, "root_ids": root_ids,
            "cause_ids": cause_ids, "symptoms": symptoms, "rules": rules,
            "did": did, "bundle_path": row["bundle_path"] if show_text else None,
            "show_text": show_text, "created_at": row["created_at"],
            "updated_at": row["updated_at"], "database": db.name,
            "nodes_page": lambda n: datasette.urls.path(f"/node/{quote(n, safe='')}"),
            "rule_page": lambda r: datasette.urls.path(_rule_path(datasette, r)),
        }, request=request))


async def _acted(db, did):
    """What the worker did about a diagnosis: the actions and escalations tables (none in a
    database from before them)."""
    names = set(await db.table_names())
    if "actions" not in names:
        return {"actions": [], "escalation": None}
    acts = [dict(r) for r in (await db.execute(
        "select kind, decision, node, detail, command, created_at from actions "
        "where diagnosis_id = ? order by seq", [did])).rows]
    e = (await db.execute("select culprit, node, gpu, failures, window_days, from_action, "
                          "to_action, earlier_jobs from escalations where diagnosis_id = ?",
                          [did])).first()
    esc = None
    if e:
        esc = {"culprit": e["culprit"], "node": e["node"], "gpu": e["gpu"],
               "failures": e["failures"], "window_days": e["window_days"],
               "from": e["from_action"], "to": e["to_action"],
               "earlier_jobs": json.loads(e["earlier_jobs"])}
    return {"actions": acts, "escalation": esc}


# The part a node played in a failed job. Whether a cause is the node's is the stored
# machine_fault column (sattrib/store.py, from engine/taxonomy.py), as the hotspots count it;
# another cause on it is the job's own, the site's, the scheduler's, or a machine fault that only
# the job's output reports ("unconfirmed"). Each role is a lane of its history: (label, kind).
NODE_ROLES = {"cause": ("caused (infra)", "infra"),
              "cause (unconfirmed)": ("job output only", "workload"),
              "cause (workload)": ("caused (job)", "workload"),
              "cause (site_environment)": ("caused (site)", "workload"),
              "cause (scheduler)": ("caused (scheduler)", "workload"),
              "took part": ("took part", "symptom")}
NODE_JOBS = """
    select id, cluster, job_id, restart, job_name, user, partition, outcome, category,
           culprit_node, culprit_gpu, summary, job_end, created_at,
           case when culprit_node is not :node then 'took part'
                when machine_fault then 'cause'
                when blame = 'machine' then 'cause (unconfirmed)'
                else 'cause (' || blame || ')' end as role
    from diagnoses
    where culprit_node = :node
       or id in (select diagnosis_id from job_nodes where node = :node)
    order by created_at desc, id desc limit 500"""


async def node_page(datasette, request):
    db = _db(datasette)
    node = request.url_vars["node"]
    jobs = [dict(r) for r in (await db.execute(NODE_JOBS, {"node": node})).rows]
    missing = [dict(r) for r in (await db.execute(
        "select m.source, count(*) as n, max(d.created_at) as last from missing_evidence m "
        "join diagnoses d on d.id = m.diagnosis_id where m.node = ? group by m.source "
        "order by n desc", [node])).rows]
    gpus = [dict(r) for r in (await db.execute(
        "select culprit_gpu as gpu, max(gpu_serial) as serial, max(gpu_uuid) as uuid, "
        "count(*) as n from diagnoses where culprit_node = ? and culprit_gpu is not null "
        "and machine_fault group by culprit_gpu order by n desc", [node])).rows]
    if request.url_vars.get("format"):
        return Response.json({"node": node, "jobs": jobs, "gpus_blamed": gpus,
                              "missing_telemetry": missing})
    # Its history: one lane per part it played, a mark per failed job at its failure time.
    history = swimlane(
        [(r["role"], r["job_end"] or r["created_at"], NODE_ROLES[r["role"]][1],
          f"{r['job_end'] or r['created_at']} · job {r['job_id']} · "
          f"{r['category'] or r['outcome']}") for r in jobs],
        [(role, label, None) for role, (label, _) in NODE_ROLES.items()
         if any(r["role"] == role for r in jobs)])
    return Response.html(await datasette.render_template(
        "sattrib_node.html", {
            "node": node, "jobs": jobs, "missing": missing, "gpus": gpus, "history": history,
            "caused": sum(j["role"] == "cause" for j in jobs),
            "gpu_page": lambda g: gpu_path(datasette, g),
            "diag_page": lambda r: datasette.urls.path(
                _diag_path(r["cluster"], r["job_id"], r["restart"])),
        }, request=request))


# -- a GPU by serial or UUID, wherever it was installed -----------------------------------------
GPU_DIAGNOSES = """
    select id, cluster, job_id, restart, outcome, category, family,
           culprit_node as node, culprit_gpu as pci, gpu_serial as serial, gpu_uuid as uuid,
           coalesce(first_seen, job_end, created_at) as failed_at, summary, action_code,
           user, partition, created_at,
           case when machine_fault then 'infrastructure'
                when blame = 'machine' then 'unconfirmed' else blame end as fault
    from diagnoses
    where gpu_serial in (select value from json_each(:serials))
       or gpu_uuid in (select value from json_each(:uuids))
    order by created_at desc, id desc limit 500"""


async def gpu_page(datasette, request):
    """Every diagnosis naming a GPU by its board serial or UUID (root_cause.gpu_serial,
    gpu_uuid), the nodes and PCI addresses it was seen at, and its history. A serial leads to
    the UUIDs logged with it and back, so rows that logged only one of them are found too."""
    db = _db(datasette)
    key = request.url_vars["gpu"]
    ids = (await db.execute("select distinct gpu_serial, gpu_uuid from diagnoses "
                            "where gpu_serial = :k or gpu_uuid = :k", {"k": key})).rows
    if not ids:
        raise NotFound(f"no diagnosis names GPU {key}")
    serials = sorted({r["gpu_serial"] for r in ids if r["gpu_serial"]})
    uuids = sorted({r["gpu_uuid"] for r in ids if r["gpu_uuid"]})
    rows = [dict(r) for r in (await db.execute(GPU_DIAGNOSES, {
        "serials": json.dumps(serials), "uuids": json.dumps(uuids)})).rows]
    placements: dict = {}
    for r in sorted(rows, key=lambda r: (r["failed_at"], r["id"])):
        p = placements.setdefault((r["node"], r["pci"]), {
            "node": r["node"], "pci": r["pci"], "first": r["failed_at"], "diagnoses": 0,
            "infrastructure": 0})
        p["last"] = r["failed_at"]
        p["diagnoses"] += 1
        p["infrastructure"] += r["fault"] == "infrastructure"
    placed = sorted(placements.values(),
                    key=lambda p: (p["first"], p["node"] or "", p["pci"] or ""))
    out = {"gpu": key, "serials": serials, "uuids": uuids, "placements": placed,
           "diagnoses": rows}
    if request.url_vars.get("format"):
        return Response.json(out)
    lane = lambda r: f"{r['node'] or '?'} {r['pci'] or ''}".strip()  # noqa: E731
    history = swimlane(
        [(lane(r), r["failed_at"], "infra" if r["fault"] == "infrastructure" else "workload",
          f"{r['failed_at']} · job {r['job_id']} · {r['category'] or r['outcome']}")
         for r in rows],
        [(lane(p), lane(p), datasette.urls.path(f"/node/{quote(p['node'], safe='')}")
          if p["node"] else None) for p in placed])
    return Response.html(await datasette.render_template(
        "sattrib_gpu.html", dict(out, history=history, diag_page=lambda r: datasette.urls.path(
            _diag_path(r["cluster"], r["job_id"], r["restart"])),
            nodes_page=lambda n: datasette.urls.path(f"/node/{quote(n, safe='')}")),
        request=request))


def gpu_path(datasette, key) -> str:
    return datasette.urls.path(f"/gpu/{quote(str(key), safe='')}")


# -- the home page: the admin's first five seconds ----------------------------------------------
# Actions that take a node or GPU out of service (engine/taxonomy.py, stored as the
# out_of_service column): these put a node on the drain list, as they make the worker drain it.
DRAIN_ACTIONS = tuple(a.value for a in Action if out_of_service(a))
DRAIN_DAYS = 7
SLURM_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
SINCE = "strftime('%Y-%m-%dT%H:%M:%SZ', 'now', :ago)"


async def summary(db) -> dict:
    async def rows(sql, params=None):
        return [dict(r) for r in (await db.execute(sql, params or {})).rows]
    total = (await rows("select count(*) as n, max(updated_at) as last from diagnoses"))[0]
    windows = {}
    for key, ago in (("24h", "-1 day"), ("7d", "-7 days")):
        p = {"ago": ago}
        windows[key] = {
            "failures": (await rows(f"select count(*) as n from diagnoses "
                                    f"where created_at >= {SINCE}", p))[0]["n"],
            "by_outcome": await rows(
                f"select outcome, count(*) as n from diagnoses where created_at >= {SINCE} "
                f"group by outcome order by n desc, outcome", p),
            "by_family": await rows(
                f"select coalesce(family, outcome) as family, count(*) as n from diagnoses "
                f"where created_at >= {SINCE} group by 1 order by n desc, 1", p),
        }
    w = windows["7d"]
    unexplained = sum(r["n"] for r in w["by_outcome"] if r["outcome"] != "attributed")
    drain = await rows(f"""
        with latest as (
          select *, row_number() over (partition by culprit_node
                                       order by created_at desc, id desc) as n
          from diagnoses
          where outcome = 'attributed' and culprit_node is not null and created_at >= {SINCE})
        select l.culprit_node as node, l.culprit_gpu as gpu, l.cluster, l.job_id, l.restart,
               l.category, coalesce(e.to_action, l.action_code) as action_code, l.action,
               l.created_at
        from latest l left join escalations e on e.diagnosis_id = l.id
        where l.n = 1 and l.machine_fault and (l.out_of_service or e.to_action is not null)
        order by l.created_at desc, node""", {"ago": f"-{DRAIN_DAYS} days"})
    for r in drain:
        ok = SLURM_NAME.match(r["node"]) and SLURM_NAME.match(str(r["job_id"]))
        r["scontrol"] = (f'scontrol update NodeName={r["node"]} State=DRAIN '
                         f'Reason="sattrib:{r["job_id"]} {r["category"]}"') if ok else None
    missing = await rows(f"""
        select m.source, count(distinct m.diagnosis_id) as diagnoses,
               count(distinct m.node) as nodes
        from diagnoses d join missing_evidence m on m.diagnosis_id = d.id
        where d.created_at >= {SINCE} and m.node != 'job'
        group by m.source order by diagnoses desc, m.source limit 5""", {"ago": "-7 days"})
    repeat = []
    if "escalations" in set(await db.table_names()):
        repeat = await rows(f"""
            select e.culprit, e.node, e.failures, e.to_action, e.earlier_jobs, d.cluster,
                   d.job_id, d.restart, e.created_at
            from escalations e join diagnoses d on d.id = e.diagnosis_id
            where e.created_at >= {SINCE} and e.created_at = (
                select max(x.created_at) from escalations x where x.culprit = e.culprit)
            order by e.failures desc, e.created_at desc limit 20""",
            {"ago": f"-{DRAIN_DAYS} days"})
        for r in repeat:
            r["earlier"] = json.loads(r.pop("earlier_jobs") or "[]")
    return {"diagnoses": total["n"], "last_diagnosis_at": total["last"], "windows": windows,
            "repeat_offenders": repeat,
            "unexplained_7d": unexplained,
            "unexplained_share_7d": round(unexplained / w["failures"], 3) if w["failures"]
            else None,
            "drain_days": DRAIN_DAYS, "drain_actions": list(DRAIN_ACTIONS), "drain": drain,
            "missing_telemetry_7d": missing}


# Hook health on the home page: the nodes named by diagnoses in the last HEALTH_DAYS, those
# whose snapshots stopped arriving first; the full list is the hook_health canned query.
HEALTH_DAYS = 7
HEALTH_ROWS = 20


async def hook_health(datasette, db) -> dict | None:
    """Per node: its last Epilog snapshot that reached a diagnosis, the last diagnosis naming
    it, the diagnoses since that lacked its snapshot, its failed probes and missing evidence.
    None for a database from before migration m007 (the controller's worker adds it)."""
    if "failed_probes" not in set(await db.table_names()):
        return None
    q = await datasette.get_canned_query(db.name, "hook_health", None)
    rows = [dict(r) for r in (await db.execute(
        q["sql"], {"days": str(HEALTH_DAYS), "node": ""})).rows]
    for r in rows:
        cluster, job, restart = r["last_diagnosis"].rsplit("/", 2)
        r.update(cluster=cluster, job_id=job, restart=int(restart))
    return {"days": HEALTH_DAYS, "nodes": len(rows),
            "silent": sum(bool(r["missed"]) for r in rows),
            "shown": rows[:HEALTH_ROWS], "more": max(0, len(rows) - HEALTH_ROWS)}


async def home_page(datasette, request):
    db = _db(datasette)
    s = await summary(db)
    s["hook_health"] = await hook_health(datasette, db)
    if request.url_vars.get("format"):
        return Response.json(s)
    return Response.html(await datasette.render_template(
        "sattrib_home.html", {
            "s": s, "database": DB_NAME,
            "show_text": await may_read_text(datasette, request.actor, db),
            "diag_page": lambda r: datasette.urls.path(
                _diag_path(r["cluster"], r["job_id"], r["restart"])),
            "nodes_page": lambda n: datasette.urls.path(f"/node/{quote(n, safe='')}"),
        }, request=request))


async def job_page(datasette, request):
    """The home page's job-id box: /job?id=1001 (or 1001.batch, 1001_3 as sacct prints them)
    goes to the latest run's diagnosis; a job id known to two clusters lists both.
    /job.json?id=1001 lists every run of the job on every cluster, each with its diagnosis's
    page and JSON (what `sattrib JOBID` asks on a login node); 404 when there is none."""
    raw = (request.args.get("id") or "").strip()
    job = raw.split(".")[0]
    db = _db(datasette)
    runs = (await db.execute(
        "select cluster, job_id, restart, outcome, category, created_at from diagnoses "
        "where job_id = ? order by created_at desc, restart desc", [job])).rows if job else []
    if request.url_vars.get("format"):
        listed = [{"cluster": r["cluster"], "job_id": r["job_id"], "restart": r["restart"],
                   "outcome": r["outcome"], "category": r["category"],
                   "created_at": r["created_at"],
                   "url": datasette.urls.path(_diag_path(r["cluster"], r["job_id"],
                                                         r["restart"])),
                   "json": datasette.urls.path(_diag_path(r["cluster"], r["job_id"],
                                                          r["restart"]) + ".json")}
                  for r in sorted(runs, key=lambda r: (r["cluster"], r["restart"]))]
        return Response.json({"job_id": job, "runs": listed}, status=200 if listed else 404)
    latest = {}
    for r in runs:
        latest.setdefault(r["cluster"], r)
    if len(latest) == 1:
        r = next(iter(latest.values()))
        return Response.redirect(datasette.urls.path(
            _diag_path(r["cluster"], r["job_id"], r["restart"])))
    return Response.html(await datasette.render_template(
        "sattrib_job.html", {
            "job": raw, "runs": list(latest.values()),
            "diag_page": lambda r: datasette.urls.path(
                _diag_path(r["cluster"], r["job_id"], r["restart"])),
        }, request=request), status=200 if latest else 404)


@hookimpl
def register_routes():
    return [
        (r"^/$", home_page),
        (r"^/-/summary(?P<format>\.json)$", home_page),
        (r"^/job(?P<format>\.json)?$", job_page),
        (r"^/diagnosis/(?P<cluster>[^/]+)/(?P<job>[^/]+)/(?P<restart>\d+)(?P<format>\.json)?$",
         diagnosis_page),
        (r"^/node/(?P<node>[^/]+?)(?P<format>\.json)?$", node_page),
        (r"^/gpu/(?P<gpu>[^/]+?)(?P<format>\.json)?$", gpu_page),
        (r"^/-/databases(\.(?P<format>json))?$", databases_page),
        (r"^/-/metadata(\.(?P<format>json))?$", metadata_page),
    ]
