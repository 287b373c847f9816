"""Paths shared by the tests (a plain module: `conftest` names clash across test folders)."""
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CASES = ROOT / "tests" / "cases"


def folder(root: Path, files: dict) -> Path:
    """An evidence folder under root: {relative path: text}."""
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root
