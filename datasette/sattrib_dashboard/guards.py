"""The guards that keep the dashboard read-only and its evidence private.

Writes answer 405 and no permission to write is granted; /-/databases shows no file paths and
/-/metadata no actor names; an actor comes from `--root` or, when the site names one, from its
reverse proxy's user header, believed only on a request that the proxy itself made (its address
in serve_trusted_proxy). Evidence text is for actors that may view the evidence table (the
`allow` blocks `sattrib serve` writes; serve_evidence_text); CSV cells never start a formula.
"""
import csv
import io
import ipaddress
import json
import os

from datasette import hookimpl
from datasette.utils.asgi import Response

from sattrib.escape import spreadsheet_cell
from sattrib.serve import HEADER_ENV, PROXY_ENV      # how `sattrib serve` hands them over

WRITE_ACTIONS = {"insert-row", "delete-row", "update-row", "create-table", "drop-table",
                 "alter-table", "upsert-row", "view-query-write"}
READ_METHODS = ("GET", "HEAD")


@hookimpl
def permission_allowed(action):
    if action in WRITE_ACTIONS:
        return False
    return None


async def may_read_text(datasette, actor, db) -> bool:
    """May this actor see evidence text (log lines, metrics, frames, bundle paths)?"""
    return await datasette.permission_allowed(actor, "view-table", (db.name, "evidence"),
                                              default=True)


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


@hookimpl
def register_routes():
    return [
        (r"^/-/databases(\.(?P<format>json))?$", databases_page),
        (r"^/-/metadata(\.(?P<format>json))?$", metadata_page),
    ]
