"""The home page, the admin's first five seconds: the figures of sattrib_dashboard.summary,
a job-id box and a search box; each tile's figures link to the failures they count. The
links to every page are in every page's header (templates/_crumbs.html)."""
from datasette import hookimpl
from datasette.utils.asgi import Response

from sattrib_dashboard.database import DB_NAME, diagnoses
from sattrib_dashboard.guards import may_read_text
from sattrib_dashboard.summary import figures


async def home_page(datasette, request):
    return Response.html(await datasette.render_template(
        "sattrib_home.html", {
            "s": await figures(datasette), "database": DB_NAME,
            "show_text": await may_read_text(datasette, request.actor, diagnoses(datasette)),
        }, request=request))


@hookimpl
def register_routes():
    return [(r"^/$", home_page)]
