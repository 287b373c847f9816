"""How the dashboard reads the diagnoses file: read-only, a fresh connection per query, served
as "diagnoses" whatever the file is called; and a page about a node or GPU that no diagnosis
names answers 404, not an empty page."""
import asyncio
import sqlite3
import threading

from datasette import hookimpl
from datasette.database import Database, Results
from datasette.utils.asgi import NotFound

DB_NAME = "diagnoses"


def diagnoses(datasette) -> Database:
    """The diagnoses database (startup serves the file under DB_NAME)."""
    names = [n for n in datasette.databases if n != "_internal"]
    if not names:
        raise NotFound("no database")
    return datasette.get_database(names[0])


# What the query running in this thread is about (`:_subject_node`), read when it is bound.
_asked = threading.local()


def subject(key, request):
    """`:_subject_node` in a canned query is the request's `node` argument, and says the page is
    about that node: when the query finds no row, nothing names it and the page answers 404 (an
    empty page with 200 would hide a mistyped name from a person and from `curl -f`)."""
    value = request.args.get(key) or ""
    _asked.subject = (key, value)
    return value


@hookimpl
def register_magic_parameters():
    return [("subject", subject)]


class ReadOnlyDatabase(Database):
    """The diagnoses file, read by a user who may not write it nor create its WAL index (-shm)
    beside it. While a writer is connected SQLite shares its WAL index read-only (mode=ro);
    when none is, the file holds everything (the last writer checkpointed it) and is read as it
    is (immutable=1). A fresh connection per query, so new diagnoses show at once."""

    def connect(self, write=False):
        if write:
            raise sqlite3.OperationalError("the sattrib dashboard is read-only")
        conn = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, check_same_thread=False)
        try:
            conn.execute("select 1 from sqlite_master limit 1").fetchall()
        except sqlite3.OperationalError:
            conn.close()
            conn = sqlite3.connect(f"file:{self.path}?immutable=1", uri=True,
                                   check_same_thread=False)
        return conn

    async def execute_fn(self, fn):
        def in_thread():
            _asked.subject = None
            conn = self.connect()
            try:
                self.ds._prepare_connection(conn, self.name)
                result = fn(conn)
            finally:
                conn.close()
            if _asked.subject and isinstance(result, Results) and not result.rows:
                raise NotFound("no diagnosis names {} {}".format(*_asked.subject))
            return result
        if self.ds.executor is None:
            return in_thread()
        return await asyncio.get_event_loop().run_in_executor(self.ds.executor, in_thread)


@hookimpl
def startup(datasette):
    # Served as "diagnoses" whatever the file is called (`--database /data/gpu-failures.db`):
    # the metadata, the home page's links and the templates name it so.
    for name, db in list(datasette.databases.items()):
        if db.path and not db.is_memory and not isinstance(db, ReadOnlyDatabase):
            datasette.remove_database(name)
            datasette.add_database(ReadOnlyDatabase(datasette, path=db.path), name=DB_NAME,
                                   route=DB_NAME)
