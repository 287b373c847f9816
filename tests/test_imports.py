"""No import circle in any of sattrib's packages, and the Slurm hook path needs no CLI code."""
import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Each source folder and the name it installs as (pyproject's package-dir).
PACKAGES = {"sattrib": "sattrib", "engine": "sattrib.engine",
            "collectors": "sattrib.collectors", "slurm_hooks": "sattrib.slurm_hooks"}


def _modules() -> dict:
    """Installed module name -> its file, for every module of every package."""
    out = {}
    for folder, name in PACKAGES.items():
        for p in sorted((ROOT / folder).glob("*.py")):
            out[name if p.stem == "__init__" else f"{name}.{p.stem}"] = p
    return out


def _targets(module: str, node, modules: dict) -> list:
    """The modules of ours an import statement names (`from . import a` names module a;
    `from .a import f` names module a)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = module if modules[module].stem == "__init__" else module.rsplit(".", 1)[0]
    for _ in range(node.level - 1):
        base = base.rsplit(".", 1)[0]
    base = node.module if node.level == 0 else ".".join(filter(None, (base, node.module)))
    return [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]


def import_graph() -> dict:
    """module -> the modules of ours it imports, anywhere in the file (inside functions too:
    an import deferred into a function still closes a circle when it runs). Imports under
    `if TYPE_CHECKING:` never run and are left out."""
    modules = _modules()
    graph = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text())
        typing_only = {id(n) for top in ast.walk(tree) if isinstance(top, ast.If)
                       and "TYPE_CHECKING" in ast.unparse(top.test)
                       for stmt in top.body for n in ast.walk(stmt)}
        graph[name] = {t for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
                       and id(n) not in typing_only
                       for t in _targets(name, n, modules) if t in modules and t != name}
    return graph


def circles(graph: dict) -> list:
    """The modules that reach themselves through their imports."""
    def reach(start):
        seen, todo = set(), [start]
        while todo:
            for nxt in graph.get(todo.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen
    return sorted(m for m in graph if m in reach(m))


def test_the_graph_sees_every_package_and_imports_inside_functions():
    graph = import_graph()
    assert {m.rsplit(".", 1)[0] for m in graph} >= set(PACKAGES.values())
    # analysis imports the evidence reader inside a function only
    assert "sattrib.collectors.evidence_folder" in graph["sattrib.analysis"]
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c"]


def test_no_import_circle_in_any_package():
    assert circles(import_graph()) == []


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
