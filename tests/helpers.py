"""Paths shared by the tests (a plain module: `conftest` names clash across test folders)."""
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CASES = ROOT / "tests" / "cases"
