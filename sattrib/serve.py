"""`sattrib serve`: the read-only Datasette dashboard on the diagnoses database."""
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


def metadata(db_path: Path, allow_sql: bool) -> dict:
    import yaml
    md = yaml.safe_load((dashboard_dir() / "metadata.yml").read_text())
    md["allow_sql"] = bool(allow_sql)
    name = db_path.stem
    if name != "diagnoses":
        md["databases"] = {name: md["databases"].pop("diagnoses")}
    return md


def datasette_argv(settings, db_path: Path, metadata_file: Path) -> list[str]:
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
    if settings.serve_base_url not in ("", "/"):
        base = "/" + settings.serve_base_url.strip("/") + "/"
        argv += ["--setting", "base_url", base]
    return argv


def prepare(settings) -> tuple[list[str], Path]:
    db_path = Path(os.path.expanduser(settings.database))
    if not db_path.is_file():
        raise UserError(f"no diagnoses database at {db_path}",
                        "run `sattrib demo` or point `database` at the controller's database")
    try:
        import datasette  # noqa: F401  (is it installed?)
    except ImportError:
        raise UserError("Datasette is not installed",
                        "pip install 'sattrib[dashboard]' (Datasette 0.65)") from None
    md = metadata(db_path, settings.serve_allow_sql)
    tmp = Path(tempfile.mkdtemp(prefix="sattrib-serve-")) / "metadata.json"
    tmp.write_text(json.dumps(md, indent=1))
    return datasette_argv(settings, db_path, tmp), tmp


def serve(settings) -> None:
    argv, _ = prepare(settings)
    os.execv(argv[0], argv)
