"""A GPU's page, by board serial or UUID wherever it was installed: the gpu_history canned
query (metadata.yml) with its template (query-diagnoses-gpu_history.html), so its JSON, CSV,
time limit and `allow` blocks are Datasette's own. Here: what the template draws from the
query's rows (the serials and UUIDs, the nodes and PCI addresses it was seen at, its history
by placement), and /gpu/KEY, the page's old address."""
from datasette import hookimpl

from sattrib_dashboard.cells import gpu_path, moved_to, node_path
from sattrib_dashboard.charts import swimlane


def _lane(r) -> str:
    return f"{r['node'] or '?'} {r['pci'] or ''}".strip()


def gpu_view(datasette, rows) -> dict:
    """From the diagnoses naming the GPU: its serials and UUIDs, where it was seen (node and
    PCI address, first and last failure there, the machine's faults among them) in the order it
    went there, and its history, one lane per placement."""
    found = [dict(r) for r in rows]
    placements: dict = {}
    for r in sorted(found, key=lambda r: (r["ended_at"], r["id"])):
        p = placements.setdefault((r["node"], r["pci"]), {
            "node": r["node"], "pci": r["pci"], "first": r["ended_at"], "diagnoses": 0,
            "infrastructure": 0})
        p["last"] = r["ended_at"]
        p["diagnoses"] += 1
        p["infrastructure"] += r["fault"] == "infrastructure"
    placed = sorted(placements.values(),
                    key=lambda p: (p["first"], p["node"] or "", p["pci"] or ""))
    history = swimlane(
        [(_lane(r), r["ended_at"], "infra" if r["fault"] == "infrastructure" else "workload",
          f"{r['ended_at']} · job {r['job_id']} · {r['category'] or r['outcome']}")
         for r in found],
        [(_lane(p), _lane(p), datasette.urls.path(node_path(p["node"])) if p["node"] else None)
         for p in placed])
    return {"diagnoses": found, "placements": placed, "history": history,
            "serials": sorted({r["serial"] for r in found if r["serial"]}),
            "uuids": sorted({r["uuid"] for r in found if r["uuid"]})}


@hookimpl
def extra_template_vars(template, datasette):
    if template == "query-diagnoses-gpu_history.html":
        return {"gpu_view": lambda rows: gpu_view(datasette, rows)}
    return {}


@hookimpl
def register_routes():
    return [(r"^/gpu/(?P<gpu>[^/]+?)(?P<format>\.json)?$", moved_to(gpu_path, "gpu"))]
