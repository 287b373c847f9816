"""The home page's figures, also /-/summary.json: failed runs whose job ended in the last day
and week (ended_at, the time basis of every list) by outcome and family, the drain list,
repeat offenders, the telemetry most often missing and hook health. The drain list (the drain_list canned query) reads the stored machine_fault and
out_of_service columns (sattrib/store.py, from engine/taxonomy.py), the columns the drain
policy decides by, and the actions table, what the policy did."""
import json
import re

from datasette import hookimpl
from datasette.utils.asgi import Response

from sattrib.engine.taxonomy import Action, out_of_service
from sattrib_dashboard.database import diagnoses

# Actions that take a node or GPU out of service, as the page names them.
DRAIN_ACTIONS = tuple(a.value for a in Action if out_of_service(a))
DRAIN_DAYS = 7
DRAIN_ROWS = 20     # the home page's share of the drain list; the drain_list page has them all
SLURM_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
SINCE = "strftime('%Y-%m-%dT%H:%M:%SZ', 'now', :ago)"
# Hook health on the home page: the nodes named by diagnoses in the last HEALTH_DAYS, those
# whose snapshots stopped arriving first; the full list is the hook_health canned query.
HEALTH_DAYS = 7
HEALTH_ROWS = 20


async def summary(db) -> dict:
    async def rows(sql, params=None):
        return [dict(r) for r in (await db.execute(sql, params or {})).rows]
    total = (await rows("select count(*) as n, max(updated_at) as last from diagnoses"))[0]
    windows = {}
    for key, ago in (("24h", "-1 day"), ("7d", "-7 days")):
        p = {"ago": ago}
        windows[key] = {
            "since": (await rows(f"select {SINCE} as t", p))[0]["t"],
            "failures": (await rows(f"select count(*) as n from diagnoses "
                                    f"where ended_at >= {SINCE}", p))[0]["n"],
            "by_outcome": await rows(
                f"select outcome, count(*) as n from diagnoses where ended_at >= {SINCE} "
                f"group by outcome order by n desc, outcome", p),
            "by_family": await rows(
                f"select coalesce(family, outcome) as family, count(*) as n from diagnoses "
                f"where ended_at >= {SINCE} group by 1 order by n desc, 1", p),
        }
    w = windows["7d"]
    unexplained = sum(r["n"] for r in w["by_outcome"] if r["outcome"] != "attributed")
    missing = await rows(f"""
        select m.source, count(distinct m.diagnosis_id) as diagnoses,
               count(distinct m.node) as nodes
        from diagnoses d join missing_evidence m on m.diagnosis_id = d.id
        where d.ended_at >= {SINCE} and m.node != 'job'
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
            "drain_days": DRAIN_DAYS, "drain_actions": list(DRAIN_ACTIONS),
            "missing_telemetry_7d": missing}


async def drain_rows(datasette, db, node: str = "") -> list:
    """The drain_list canned query's rows over the home page's window (of one node, when
    given), each with the line to copy."""
    q = await datasette.get_canned_query(db.name, "drain_list", None)
    rows = [dict(r) for r in (await db.execute(
        q["sql"], {"days": str(DRAIN_DAYS), "node": node})).rows]
    for r in rows:
        ok = SLURM_NAME.match(r["node"]) and SLURM_NAME.match(str(r["job_id"]))
        r["scontrol"] = (f'scontrol update NodeName={r["node"]} State=DRAIN '
                         f'Reason="sattrib:{r["job_id"]} {r["category"]}"') if ok else None
    return rows


async def drain_list(datasette, db) -> dict:
    """The drain list as a to-do list (repeat offenders first, each with what sattrib did about
    it; resumed and repaired nodes gone): its first DRAIN_ROWS rows and how many there are."""
    rows = await drain_rows(datasette, db)
    return {"drain": rows[:DRAIN_ROWS], "drain_total": len(rows)}


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


async def figures(datasette) -> dict:
    """Everything the home page shows, as /-/summary.json gives it."""
    db = diagnoses(datasette)
    return dict(await summary(db), **await drain_list(datasette, db),
                hook_health=await hook_health(datasette, db))


async def summary_json(datasette):
    return Response.json(await figures(datasette))


@hookimpl
def register_routes():
    return [(r"^/-/summary\.json$", summary_json)]
