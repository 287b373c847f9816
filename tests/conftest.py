import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))


@pytest.fixture(autouse=True)
def _isolated_config(monkeypatch, tmp_path):
    """Never read the machine's /etc/sattrib or write the user's database from a test."""
    monkeypatch.setenv("SATTRIB_CONFIG", str(tmp_path / "no-such-config.toml"))
    monkeypatch.setenv("SATTRIB_DATABASE", str(tmp_path / "diagnoses.db"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))


@pytest.fixture(scope="session")
def rules():
    from sattrib.engine.rules import load_rules
    return load_rules()
