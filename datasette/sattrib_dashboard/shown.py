"""How many failed runs a list's filters match when its page is cut at the query's row limit:
"500 of 1,234 shown" where Datasette would say "500 rows". The count is the page's own query
(same filters, same index) stopped at COUNT_MAX + 1 rows ("more than 10,000"): on a database
of millions an unfiltered list counts no further than that, and a filter that matches few rows
costs the count one more walk of the index, as it cost the page. It runs only when the page is
full."""
import re

from datasette import hookimpl
from datasette.database import QueryInterrupted

from sattrib_dashboard.database import diagnoses

# The canned queries whose pages say how many rows their filters match.
COUNTED = ("recent_failures",)
COUNT_MAX = 10_000
LIMIT = re.compile(r"\s+limit\s+(\d+)\s*$", re.IGNORECASE)
PARAM = re.compile(r"(?<!:):(\w+)")


def split_limit(sql: str) -> tuple[str, int | None]:
    """A query without its trailing `limit N`, and N (None when it has none)."""
    m = LIMIT.search(sql)
    return (sql[:m.start()], int(m.group(1))) if m else (sql, None)


async def matched(datasette, request, query: str, shown: int) -> dict | None:
    """{"n": rows the page's filters match, "more": True past COUNT_MAX} when the page of
    canned query `query` shows `shown` rows and was cut at its limit; None when it shows them
    all. {"n": None} when counting took longer than the dashboard's query time limit."""
    if query not in COUNTED:
        return None
    canned = await datasette.get_canned_query(diagnoses(datasette).name, query, request.actor)
    sql, limit = split_limit(canned["sql"]) if canned else ("", None)
    if limit is None or shown < limit:
        return None
    params = {p: request.args.get(p) or "" for p in set(PARAM.findall(sql))}
    try:
        n = (await diagnoses(datasette).execute(
            f"select count(*) from (select 1 from ({sql}) limit {COUNT_MAX + 1})",
            params)).rows[0][0]
    except QueryInterrupted:
        return {"n": None, "more": False}
    return {"n": min(n, COUNT_MAX), "more": n > COUNT_MAX} if n > shown else None


@hookimpl
def extra_template_vars(datasette, request):
    async def rows_matched(query, shown):
        return await matched(datasette, request, query, shown)
    return {"rows_matched": rows_matched}
