"""`sattrib serve`: the read-only Datasette dashboard on the diagnoses database.

Evidence text (log lines, the full diagnosis JSON, bundle paths) lives in the tables in
TEXT_TABLES; who may see them is a Datasette `allow` block on each of them, and arbitrary SQL
(which reaches every table) has the same block (serve_evidence_text, serve_admins). The
trusted proxy header and the proxy's addresses are handed to the plugin in the environment,
never in the metadata; the plugin's /-/metadata leaves the allow blocks (the admins' names)
out. uvicorn is told to believe no X-Forwarded-For, so the plugin sees each connection's own
peer address."""
from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

from .errors import UserError


def dashboard_dir() -> Path:
    """The datasette/ folder: installed as sattrib/dashboard/, or the source tree's own."""
    here = Path(__file__).resolve().parent
    for d in (here / "dashboard", here.parent / "datasette"):
        if (d / "metadata.yml").is_file():
            return d
    raise UserError("the dashboard files are missing from this installation",
                    "reinstall sattrib (install.sh)")


# The full-text index of the evidence lines holds their words: its table and every shadow table.
EVIDENCE_FTS = ("evidence_fts", "evidence_fts_data", "evidence_fts_idx", "evidence_fts_docsize",
                "evidence_fts_config")
TEXT_TABLES = ("diagnoses", "evidence", "evidence_timeline") + EVIDENCE_FTS
TEXT_QUERIES = ("search_evidence",)
HEADER_ENV = "SATTRIB_DASHBOARD_TRUSTED_USER_HEADER"
PROXY_ENV = "SATTRIB_DASHBOARD_TRUSTED_PROXY"
# The job's owner, proven by a MUNGE credential, sees their own evidence text: "on" or absent,
# and the munged socket to ask ("" the default one).
OWNER_ENV = "SATTRIB_DASHBOARD_OWNER_TEXT"
MUNGE_ENV = "SATTRIB_DASHBOARD_MUNGE_SOCKET"


def text_allow(settings):
    """The Datasette allow block of those who may read evidence text (True: everyone)."""
    return {"all": True, "none": False,
            "admins": {"id": list(settings.serve_admins)}}[settings.serve_evidence_text]


def metadata(db_path: Path, settings) -> dict:
    import yaml
    md = yaml.safe_load((dashboard_dir() / "metadata.yml").read_text())
    allow = text_allow(settings)
    md["allow_sql"] = allow if settings.serve_allow_sql else False
    if allow is not True:
        tables = md["databases"]["diagnoses"]["tables"]
        for t in TEXT_TABLES:
            tables.setdefault(t, {})["allow"] = allow
        for q in TEXT_QUERIES:
            md["databases"]["diagnoses"]["queries"][q]["allow"] = allow
    return md                     # the plugin serves the file as "diagnoses" whatever its name


def datasette_argv(settings, db_path: Path, metadata_file: Path,
                   root: bool = False) -> list[str]:
    d = dashboard_dir()
    argv = [sys.executable, "-m", "datasette", "serve", str(db_path),
            "--metadata", str(metadata_file),
            "--template-dir", str(d / "templates"),
            "--plugins-dir", str(d / "plugins"),
            "--host", settings.serve_host, "--port", str(settings.serve_port),
            "--setting", "sql_time_limit_ms", str(settings.serve_sql_time_limit_ms),
            "--setting", "default_page_size", "50",
            "--setting", "allow_download", "off",
            "--setting", "allow_csv_stream", "off",
            "--setting", "suggest_facets", "off"]
    if root:
        argv.append("--root")           # Datasette prints a one-time login URL for "root"
    if settings.serve_base_url not in ("", "/"):
        base = "/" + settings.serve_base_url.strip("/") + "/"
        argv += ["--setting", "base_url", base]
    return argv


def prepare(settings, root: bool = False) -> tuple[list[str], Path]:
    db_path = Path(os.path.expanduser(settings.database))
    if not db_path.is_file():
        raise UserError(f"no diagnoses database at {db_path}",
                        "run `sattrib demo` or point `database` at the controller's database")
    try:
        import datasette  # noqa: F401  (is it installed?)
    except ImportError:
        raise UserError("Datasette is not installed",
                        "pip install 'sattrib[dashboard]' (Datasette 0.65)") from None
    md = metadata(db_path, settings)
    tmp = Path(tempfile.mkdtemp(prefix="sattrib-serve-")) / "metadata.json"
    tmp.write_text(json.dumps(md, indent=1))
    return datasette_argv(settings, db_path, tmp, root), tmp


def environment(settings) -> dict:
    env = dict(os.environ)
    env.pop(HEADER_ENV, None)
    env.pop(PROXY_ENV, None)
    env.pop(OWNER_ENV, None)
    if settings.serve_evidence_text != "none":
        env[OWNER_ENV] = "on"
        env[MUNGE_ENV] = settings.munge_socket
    if settings.serve_trusted_user_header:
        env[HEADER_ENV] = settings.serve_trusted_user_header
        env[PROXY_ENV] = ",".join(settings.serve_trusted_proxy)
    env["FORWARDED_ALLOW_IPS"] = ""          # uvicorn: no client may name another address
    return env


def _loopback(host: str) -> bool:
    import ipaddress
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def warnings(settings) -> list[str]:
    """What `sattrib serve` says before it starts: where it is open to more than this machine
    with no reverse proxy named, and a user header that no proxy may send."""
    out = []
    where = f"{settings.serve_host}:{settings.serve_port}"
    if not _loopback(settings.serve_host) and not settings.serve_trusted_proxy:
        out.append(f"sattrib serve: warning: listening on {where}, beyond this machine, with no "
                   "serve_trusted_proxy: every client there is an anonymous visitor (diagnoses, "
                   "no evidence lines); put the site's reverse proxy in front and name its "
                   "address in serve_trusted_proxy, or keep serve_host = \"127.0.0.1\"")
    if settings.serve_trusted_user_header and not settings.serve_trusted_proxy:
        out.append(f"sattrib serve: warning: serve_trusted_user_header "
                   f"({settings.serve_trusted_user_header}) is ignored: no serve_trusted_proxy "
                   "names the proxy that may send it")
    return out


def check_port(host: str, port: int) -> None:
    """One clear line when the address is taken, rather than the web server's own report."""
    import errno
    import socket
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise UserError(f"cannot resolve serve_host {host!r}: {e.strerror}",
                        "use an address such as 127.0.0.1 or 0.0.0.0") from None
    fam, _, _, _, addr = infos[0]
    with socket.socket(fam, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(addr)
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise UserError(f"port {port} on {host} is already in use",
                                "stop what listens there (ss -ltnp) or pick another with "
                                "--port") from None
            raise UserError(f"cannot listen on {host}:{port}: {e.strerror}",
                            "pick another --host or --port") from None


def serve(settings, root: bool = False) -> None:
    argv, _ = prepare(settings, root)
    check_port(settings.serve_host, settings.serve_port)
    os.execve(argv[0], argv, environment(settings))
