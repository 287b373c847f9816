"""A node's page: the node_history canned query (metadata.yml) with its template
(query-diagnoses-node_history.html), so its JSON, CSV, time limit and `allow` blocks are
Datasette's own. Here: what the template draws from the query's rows (the history lanes, the
GPUs blamed, the telemetry it lacked), and /node/NAME, the page's old address."""
from datasette import hookimpl

from sattrib_dashboard.cells import moved_to, node_path
from sattrib_dashboard.charts import swimlane
from sattrib_dashboard.database import diagnoses
from sattrib_dashboard.summary import DRAIN_DAYS, drain_rows

# The part a node played in a failed job, as the query's `role` column says it (from the
# stored fault column, engine/taxonomy.py's word for whose fault). Each role is a lane of its
# history: (label, kind of mark).
NODE_ROLES = {"cause": ("caused (infra)", "infra"),
              "cause (unconfirmed)": ("job output only", "workload"),
              "cause (workload)": ("caused (job)", "workload"),
              "cause (site_environment)": ("caused (site)", "workload"),
              "cause (scheduler)": ("caused (scheduler)", "workload"),
              "took part": ("took part", "symptom")}


def node_view(rows) -> dict:
    """From the node's failed jobs: how many it caused (the machine's fault), its history (one
    lane per part it played, a mark per job at its end), the GPUs blamed for the faults
    it caused, and the telemetry it lacked (per source: diagnoses, the latest)."""
    jobs = [dict(r) for r in rows]
    history = swimlane(
        [(r["role"], r["ended_at"], NODE_ROLES[r["role"]][1],
          f"{r['ended_at']} · job {r['job_id']} · "
          f"{r['category'] or r['outcome']}") for r in jobs if r["role"] in NODE_ROLES],
        [(role, label, None) for role, (label, _) in NODE_ROLES.items()
         if any(r["role"] == role for r in jobs)])
    gpus: dict = {}
    missing: dict = {}
    for r in jobs:
        if r["role"] == "cause" and r["culprit_gpu"]:
            g = gpus.setdefault(r["culprit_gpu"], {"gpu": r["culprit_gpu"], "serial": None,
                                                   "uuid": None, "n": 0})
            g["n"] += 1
            g["serial"] = max(filter(None, (g["serial"], r["gpu_serial"])), default=None)
            g["uuid"] = max(filter(None, (g["uuid"], r["gpu_uuid"])), default=None)
        for source in (r["lacked"] or "").split(", "):
            if source:
                m = missing.setdefault(source, {"source": source, "n": 0, "last": ""})
                m["n"] += 1
                m["last"] = max(m["last"], r["ended_at"])
    return {"jobs": jobs, "history": history,
            "caused": sum(r["role"] == "cause" for r in jobs),
            "gpus": sorted(gpus.values(), key=lambda g: (-g["n"], g["gpu"])),
            "missing": sorted(missing.values(), key=lambda m: (-m["n"], m["source"]))}


@hookimpl
def extra_template_vars(template, datasette, request):
    """The node page's rows drawn (node_view) and its verdict: its row of the drain list, or
    None when it is not on it."""
    if template != "query-diagnoses-node_history.html":
        return {}

    async def node_vars():
        node = request.args.get("node") or ""
        rows = await drain_rows(datasette, diagnoses(datasette), node) if node else []
        return {"node_view": node_view, "on_drain_list": rows[0] if rows else None,
                "drain_days": DRAIN_DAYS}
    return node_vars


@hookimpl
def register_routes():
    return [(r"^/node/(?P<node>[^/]+?)(?P<format>\.json)?$", moved_to(node_path, "node"))]
