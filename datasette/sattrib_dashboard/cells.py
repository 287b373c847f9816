"""Cell rendering: job ids, diagnosis ids, nodes, GPUs and rules become links to their pages,
times read as times, column names as words. The same links are handed to every template
(`diag_page`, `nodes_page`, `gpu_page`, `rule_page`), so a page's address is built here only.

Text from logs reaches a page only through Jinja's autoescaping or markupsafe.escape."""
import json
import re
from urllib.parse import quote, unquote, urlencode

from datasette import hookimpl
from datasette.utils import tilde_encode
from datasette.utils.asgi import Response
from markupsafe import Markup, escape

from sattrib.engine.taxonomy import Category
from sattrib_dashboard.database import DB_NAME

# Column headers of the canned queries' pages (the JSON keeps the column names). Failures are
# listed, filtered and counted by when the job ended (ended_at, store.m013_ended_at); when
# sattrib diagnosed a run (created_at) is shown under its own name and filters nothing.
LABELS = {"ended_at": "Job ended (UTC)", "created_at": "Diagnosed (UTC)", "job_id": "Job",
          "culprit_node": "Culprit node", "culprit_gpu": "Culprit GPU", "gpu": "GPU",
          "uuid": "UUID", "gpus": "GPUs", "last_seen": "Last job ended (UTC)",
          "first": "First job ended (UTC)", "last": "Last job ended (UTC)", "id": "Diagnosis",
          "not_counted": "Not the node's fault (not counted)",
          "last_snapshot_at": "Last snapshot (job ended, UTC)",
          "last_diagnosis_at": "Last failure (job ended, UTC)",
          "last_diagnosis": "Last diagnosis", "missed": "Snapshots missed since",
          "q": "Search", "since": "Job ended since (date)", "until": "Job ended until (date)",
          "node": "Node", "days": "Days",
          "infra": "Infrastructure (1)"}
TIME_COLUMNS = {"ended_at", "created_at", "last_seen", "first", "last", "job_end",
                "last_snapshot_at", "last_diagnosis_at"}
# A family's colour, the same on the chart of failures over time and on every category cell.
FAMILY_COLOURS = {"gpu": "#b3261e", "nvlink": "#6b3fa0", "network": "#0f7b8a",
                  "storage": "#8a6d0f", "scheduler": "#2f6f3e", "workload": "#3a5a97",
                  "ambiguous": "#d98300", "unattributed": "#888888"}
# The filters with a closed set of values, offered as a drop-down: a typo cannot match nothing.
CHOICES = {"category": sorted(c.value for c in Category) + ["ambiguous", "unattributed"],
           "family": sorted(FAMILY_COLOURS), "outcome": ["attributed", "ambiguous", "unattributed"]}
ISO = re.compile(r"^(\d{4}-\d\d-\d\d)T(\d\d:\d\d)(:\d\d(\.\d+)?)?Z?$")


def column_label(name: str) -> str:
    return LABELS.get(name) or name.replace("_", " ").capitalize()


def diagnosis_path(cluster, job, restart) -> str:
    return f"/diagnosis/{quote(str(cluster), safe='')}/{quote(str(job), safe='')}/{int(restart)}"


def node_path(node, ext: str = "") -> str:
    """A node's page (ext ".json": its rows): the node_history canned query for it."""
    return f"/{DB_NAME}/node_history{ext}?" + urlencode({"node": node})


def gpu_path(key, ext: str = "") -> str:
    """A GPU's page by board serial or UUID (ext ".json": its rows): the gpu_history canned
    query for it."""
    return f"/{DB_NAME}/gpu_history{ext}?" + urlencode({"gpu": key})


def moved_to(page_path, var: str):
    """The route for a page's address before it was a canned query (/node/NAME, /gpu/KEY, and
    .json for its rows as an array): a redirect to `page_path(the name)`."""
    async def moved(datasette, request):
        name = unquote(request.url_vars[var])          # the route sees the path as sent
        if request.url_vars.get("format"):
            path = page_path(name, ".json") + "&_shape=array"
        else:
            path = page_path(name)
        return Response.redirect(datasette.urls.path(path))
    return moved


def rule_path(rule_id) -> str:
    # Datasette row URLs tilde-encode the key: "gpu.xid" -> "gpu~2Exid".
    return f"/{DB_NAME}/rules/{tilde_encode(rule_id)}"


def _link(datasette, path, text):
    return Markup('<a href="{}">{}</a>').format(datasette.urls.path(path), text)


@hookimpl
def extra_template_vars(datasette):
    path = datasette.urls.path
    return {"column_label": column_label, "family_colours": FAMILY_COLOURS, "choices": CHOICES,
            "diag_page": lambda r: path(diagnosis_path(r["cluster"], r["job_id"], r["restart"])),
            "nodes_page": lambda n: path(node_path(n)),
            "gpu_page": lambda g: path(gpu_path(g)),
            "rule_page": lambda r: path(rule_path(r))}


@hookimpl
def render_cell(row, value, column, table, datasette):
    if value is None or value == "":
        return None
    keys = row.keys() if hasattr(row, "keys") else []
    if column == "job_id" and "cluster" in keys and "restart" in keys:
        text = escape(value) if not row["restart"] else escape(f"{value} (run {row['restart'] + 1})")
        return _link(datasette, diagnosis_path(row["cluster"], value, row["restart"]), text)
    if column in TIME_COLUMNS and table is None and isinstance(value, str) and ISO.match(value):
        m = ISO.match(value)
        return Markup('<time datetime="{}">{} {}</time>').format(value, m.group(1), m.group(2))
    if column in ("id", "diagnosis_id", "last_diagnosis") and isinstance(value, str) \
            and value.count("/") == 2:
        cluster, job, restart = value.split("/")
        if restart.isdigit():
            return _link(datasette, diagnosis_path(cluster, job, restart), escape(value))
    if column in ("culprit_node", "node") and isinstance(value, str) and value != "job":
        return _link(datasette, node_path(value), escape(value))
    if column in ("serial", "uuid", "gpu_serial", "gpu_uuid") and isinstance(value, str):
        return _link(datasette, gpu_path(value), escape(value))
    if column in ("rule", "root_rule") and isinstance(value, str):
        return _link(datasette, rule_path(value), escape(value))
    if column == "category" and "family" in keys and isinstance(value, str):
        colour = FAMILY_COLOURS.get(row["family"] or "", "#555555")
        return Markup('<span class="chip" style="background: {}">{}</span>').format(
            colour, escape(value))
    if column == "earlier_jobs" and isinstance(value, str):
        return _job_links(datasette, value)
    return None


def _job_links(datasette, value: str):
    """A JSON list of runs ({cluster, job_id, restart}) as links to their diagnoses; None
    (the text as it is) for anything else."""
    try:
        jobs = json.loads(value)
    except ValueError:
        return None
    if not isinstance(jobs, list) or not all(
            isinstance(j, dict) and {"cluster", "job_id", "restart"} <= set(j) for j in jobs):
        return None
    return Markup(", ").join(
        _link(datasette, diagnosis_path(j["cluster"], j["job_id"], j["restart"]),
              escape(j["job_id"])) for j in jobs)
