"""Datasette plugin: cross-job incidents (sattrib.incidents) on the dashboard.

/incidents lists them (`days=N`, default 30), /incident/N shows one as a diagnosis with its
evidence (the element and where it is declared, every job that failed behind it, the jobs
behind it that ran on, the elements weighed against it), both also as JSON. The home page gets
a block of the last 7 days' incidents and each member job's diagnosis page the line "Part of
incident N: leaf switch s3, 14 jobs within 2 minutes", through template variables this plugin
adds to those two templates. An incident holds no log text: everyone sees it.
"""
from urllib.parse import quote

from datasette import hookimpl
from datasette.utils.asgi import NotFound, Response

from sattrib import incidents

DB_NAME = "diagnoses"          # the name the dashboard serves the database under
HOME_DAYS, HOME_ROWS = 7, 10


def _since(days: int) -> str:
    import time
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - days * 86400))


def _diag_path(datasette, cluster, job, restart) -> str:
    return datasette.urls.path(f"/diagnosis/{quote(str(cluster), safe='')}/"
                               f"{quote(str(job), safe='')}/{int(restart)}")


async def _listing(datasette, days: int, limit: int) -> list:
    rows = await datasette.get_database(DB_NAME).execute_fn(
        lambda conn: incidents.listing(conn, _since(days), None, limit))
    for r in rows:
        r["url"] = datasette.urls.path(f"/incident/{r['id']}")
    return rows


async def incidents_page(datasette, request):
    try:
        days = max(1, min(int(request.args.get("days") or 30), 3650))
    except ValueError:
        days = 30
    rows = await _listing(datasette, days, 500)
    if request.url_vars.get("format"):
        return Response.json(rows)
    return Response.html(await datasette.render_template(
        "sattrib_incidents.html", {"rows": rows, "days": days}, request=request))


async def incident_page(datasette, request):
    n = int(request.url_vars["n"])
    db = datasette.get_database(DB_NAME)
    if "incidents" not in set(await db.table_names()):
        raise NotFound(f"no incident {n}")
    doc = await db.execute_fn(lambda conn: incidents.document(conn, n))
    if doc is None:
        raise NotFound(f"no incident {n}")
    if request.url_vars.get("format"):
        return Response.json(doc)
    for j in doc["failed_jobs"]:
        j["url"] = _diag_path(datasette, doc["cluster"], j["job_id"], j["restart"])
    return Response.html(await datasette.render_template(
        "sattrib_incident.html", {"inc": doc}, request=request))


@hookimpl
def extra_template_vars(template, datasette, request):
    """The home page's block of recent incidents; on a diagnosis page, its job's incident."""
    if template == "sattrib_home.html":
        async def home():
            return {"incidents_recent": await _listing(datasette, HOME_DAYS, HOME_ROWS),
                    "incidents_days": HOME_DAYS}
        return home
    if template == "sattrib_diagnosis.html" and request is not None:
        p = request.url_vars
        did = f"{p.get('cluster')}/{p.get('job')}/{p.get('restart')}"

        async def diagnosis():
            inc = await datasette.get_database(DB_NAME).execute_fn(
                lambda conn: incidents.of_diagnosis(conn, did))
            if inc:
                inc["url"] = datasette.urls.path(f"/incident/{inc['id']}")
            return {"incident": inc}
        return diagnosis
    return None


@hookimpl
def register_routes():
    return [
        (r"^/incidents(?P<format>\.json)?$", incidents_page),
        (r"^/incident/(?P<n>\d+)(?P<format>\.json)?$", incident_page),
    ]
