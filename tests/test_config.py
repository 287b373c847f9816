"""Settings: one model, precedence flag > env > file > default, every key documented."""
import re
from pathlib import Path

import pytest

from sattrib.config import Settings, load, utc_offset
from sattrib.errors import UserError

ETC = Path(__file__).parent.parent / "etc" / "sattrib.toml"


def test_every_key_is_in_etc_reference():
    text = ETC.read_text()
    documented = set(re.findall(r"^# (\w+) = ", text, re.M))
    assert documented == set(Settings.model_fields)


def test_precedence(tmp_path):
    cfg = tmp_path / "s.toml"
    cfg.write_text('cluster = "file"\nclock_skew_s = 2.0\nrules_dirs = ["/a"]\n')
    env = {"SATTRIB_CLUSTER": "env", "SATTRIB_RULES_DIRS": "/x,/y"}
    got = load(flags={"cluster": "flag"}, path=cfg, env=env)
    assert got.settings.cluster == "flag" and got.sources["cluster"] == "flag"
    assert got.settings.rules_dirs == ["/x", "/y"]
    assert got.settings.clock_skew_s == 2.0 and got.sources["clock_skew_s"] == str(cfg)
    assert got.sources["window_before_s"] == "default"


def test_bad_file_and_values_are_user_errors(tmp_path):
    cfg = tmp_path / "s.toml"
    cfg.write_text("nope = 1\n")
    with pytest.raises(UserError, match="unknown key 'nope'"):
        load(path=cfg, env={})
    cfg.write_text("serve_port = 70000\n")
    with pytest.raises(UserError, match="serve_port"):
        load(path=cfg, env={})
    cfg.write_text("cluster = \n")
    with pytest.raises(UserError, match="TOML"):
        load(path=cfg, env={})


def test_timezones():
    assert utc_offset("UTC", None) == 0
    assert utc_offset("+02:00", None) == 7200
    assert utc_offset("Europe/Zurich", 1783000000) == 7200     # summer 2026
    assert utc_offset("Europe/Zurich", 1767000000) == 3600     # winter
    with pytest.raises(UserError):
        utc_offset("Mars/Olympus", 0)
