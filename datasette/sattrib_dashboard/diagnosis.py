"""The diagnosis page, /diagnosis/CLUSTER/JOB/RUN (and .json): the root cause, the timeline of
the evidence across nodes (a swimlane and the table), the symptoms, what sattrib did. Evidence
text, metrics, the user's frames and the bundle path only for those who may read evidence, and
for the job's own user proven by MUNGE (owner.py)."""
import json
import re

from datasette import hookimpl
from datasette.utils.asgi import NotFound, Response

from sattrib.lookup import output_sources, with_sources
from sattrib_dashboard.cells import node_path
from sattrib_dashboard.charts import epoch, metric_chart, swimlane
from sattrib_dashboard.database import diagnoses
from sattrib_dashboard.guards import may_read_text
from sattrib_dashboard.owner import is_owner

XID = re.compile(r"NVRM: Xid \([^)]*\): (\d+),")
# What an evidence item says of the job (the log line, a metric's series and samples): shown
# to those who may read evidence text only.
PRIVATE = ("text", "metric")


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
    timed = [e for e in timeline if e.get("timestamp") and epoch(e["timestamp"]) is not None]
    first: dict = {}
    for e in timed:
        n = e.get("node") or "job"
        at = (e["id"] not in cause_ids, epoch(e["timestamp"]))
        first[n] = min(first.get(n, at), at)
    lanes = [(n, n, None if n == "job" else datasette.urls.path(node_path(n)))
             for n in sorted(first, key=lambda n: (first[n], n))]
    items = [(e.get("node") or "job", e["timestamp"], kind(e),
              " · ".join(str(v) for v in (e.get("node") or "job", e["timestamp"], e["role"],
                                          e.get("category")) if v))
             for e in timed]
    return swimlane(items, lanes)


def _when(e):
    return e.get("timestamp") or ""


async def diagnosis_page(datasette, request):
    db = diagnoses(datasette)
    p = request.url_vars
    did = f"{p['cluster']}/{p['job']}/{p['restart']}"
    res = await db.execute("select diagnosis_json, bundle_path, created_at, updated_at, user "
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
    show_text = (await may_read_text(datasette, request.actor, db)
                 or await is_owner(request, did, row["user"]))
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
            with_sources(d, output_sources(row["bundle_path"]))
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
    return Response.html(await datasette.render_template(
        "sattrib_diagnosis.html", {
            "swim": evidence_swimlane(datasette, timeline, root_ids, cause_ids),
            "acted": await _acted(db, did),
            "d": d, "causes": causes, "timeline": timeline, "root_ids": root_ids,
            "cause_ids": cause_ids, "symptoms": symptoms, "rules": rules,
            "did": did, "bundle_path": row["bundle_path"] if show_text else None,
            "show_text": show_text, "created_at": row["created_at"],
            "updated_at": row["updated_at"], "database": db.name,
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


@hookimpl
def register_routes():
    return [(r"^/diagnosis/(?P<cluster>[^/]+)/(?P<job>[^/]+)/(?P<restart>\d+)"
             r"(?P<format>\.json)?$", diagnosis_page)]
