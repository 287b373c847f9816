"""The application package has no import circle, and the Slurm hook path needs no CLI code."""
import ast
import subprocess
import sys
from pathlib import Path

import sattrib

PKG = Path(sattrib.__file__).parent


def _imports(path: Path) -> set[str]:
    """Sibling modules of sattrib/ that a module imports (at any depth of the file)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
            out.add(node.module.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.level == 1:
            out.update(a.name for a in node.names)
    return {m for m in out if (PKG / f"{m}.py").exists()}


def test_no_import_circle_in_the_application_package():
    graph = {p.stem: _imports(p) for p in PKG.glob("*.py")}

    def reach(start):
        seen, todo = set(), [start]
        while todo:
            for nxt in graph.get(todo.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    circles = sorted(m for m in graph if m in reach(m))
    assert circles == []


def test_the_hook_path_does_not_load_click():
    code = ("import sys, sattrib.collect, sattrib.slurm_hooks.epilog_slurmctld; "
            "print('click' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_analyze_on_a_warm_rule_cache_loads_neither_pydantic_nor_yaml(tmp_path):
    """Rule files are validated (pydantic) and parsed (YAML) only when the rule cache misses:
    the two imports cost more than half of the start time otherwise."""
    job = tmp_path / "job"
    (job / "slurm").mkdir(parents=True)
    (job / "slurm" / "job.txt").write_text("JobId=7 JobState=FAILED ExitCode=1:0\n")
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache"), "HOME": str(tmp_path),
           "PATH": "/usr/bin:/bin", "SATTRIB_CONFIG": str(tmp_path / "none.toml")}
    code = ("import sys; from sattrib.cli import main\n"
            "try:\n    main(['analyze', sys.argv[1], '--json'])\n"
            "except SystemExit:\n    pass\n"
            "print(sorted(m for m in ('pydantic', 'yaml') if m in sys.modules), file=sys.stderr)")
    runs = [subprocess.run([sys.executable, "-c", code, str(job)], capture_output=True,
                           text=True, env=env, check=True) for _ in range(2)]
    assert '"job_id": "7"' in runs[1].stdout
    assert runs[1].stderr.strip().splitlines()[-1] == "[]"     # the first run warmed the cache
