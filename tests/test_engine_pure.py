"""The engine core stays pure: no subprocess, network, Slurm, database or clock."""
import ast
from pathlib import Path

import pytest

ENGINE = Path(__file__).parent.parent / "engine"
PURE = ["models.py", "taxonomy.py", "pipeline.py", "extract.py", "window.py", "correlate.py",
        "incident.py", "refine.py", "verdict.py", "assemble.py", "catalog.py", "decode.py",
        "matcher.py", "lineparse.py", "hostlist.py", "xid.py"]
FORBIDDEN = {"subprocess", "socket", "requests", "sqlite3", "sqlite_utils", "time", "random",
             "os", "pyslurm", "urllib", "http", "shutil", "threading", "multiprocessing"}


@pytest.mark.parametrize("name", PURE)
def test_no_io_imports(name):
    tree = ast.parse((ENGINE / name).read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            mods = [a.name.split(".")[0] for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            mods = [(node.module or "").split(".")[0]] if node.level == 0 else []
        else:
            continue
        assert not set(mods) & FORBIDDEN, f"{name} imports {mods}"
    src = (ENGINE / name).read_text()
    assert "datetime.now" not in src and "time.time" not in src


def test_collectors_do_not_import_store_or_cli():
    for p in (ENGINE.parent / "collectors").glob("*.py"):
        src = p.read_text()
        assert "sattrib.store" not in src and "from ..store" not in src, p.name
