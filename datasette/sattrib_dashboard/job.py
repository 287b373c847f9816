"""The home page's job-id box, /job?id=JOBID, and `sattrib JOBID`'s question to the dashboard,
/job.json?id=JOBID."""
from datasette import hookimpl
from datasette.utils.asgi import Response

from sattrib_dashboard.cells import diagnosis_path
from sattrib_dashboard.database import diagnoses


async def job_page(datasette, request):
    """/job?id=1001 (or 1001.batch, 1001_3 as sacct prints them) goes to the diagnosis of
    the run that ended last; a job id known to two clusters lists both. /job.json?id=1001 lists every run of
    the job on every cluster, each with its diagnosis's page and JSON (what `sattrib JOBID`
    asks on a login node); 404 when there is none."""
    raw = (request.args.get("id") or "").strip()
    job = raw.split(".")[0]
    runs = (await diagnoses(datasette).execute(
        "select cluster, job_id, restart, outcome, category, ended_at, created_at from diagnoses "
        "where job_id = ? order by ended_at desc, restart desc", [job])).rows if job else []
    page = lambda r: datasette.urls.path(diagnosis_path(r["cluster"], r["job_id"],  # noqa: E731
                                                        r["restart"]))
    if request.url_vars.get("format"):
        listed = [{"cluster": r["cluster"], "job_id": r["job_id"], "restart": r["restart"],
                   "outcome": r["outcome"], "category": r["category"],
                   "ended_at": r["ended_at"], "created_at": r["created_at"], "url": page(r),
                   "json": page(r) + ".json"}
                  for r in sorted(runs, key=lambda r: (r["cluster"], r["restart"]))]
        return Response.json({"job_id": job, "runs": listed}, status=200 if listed else 404)
    latest = {}
    for r in runs:
        latest.setdefault(r["cluster"], r)
    if len(latest) == 1:
        return Response.redirect(page(next(iter(latest.values()))))
    return Response.html(await datasette.render_template(
        "sattrib_job.html", {"job": raw, "runs": list(latest.values())}, request=request),
        status=200 if latest else 404)


@hookimpl
def register_routes():
    return [(r"^/job(?P<format>\.json)?$", job_page)]
