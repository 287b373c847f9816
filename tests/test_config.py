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


BROKEN = {"syntax": ('database = "/tmp/x.db\n', "cannot read", "fix the TOML syntax"),
          "unknown key": ('databse = "/tmp/x.db"\n', "unknown key 'databse'", "etc/sattrib.toml"),
          "bad value": ('drain = "maybe"\n', "invalid setting drain", "sattrib config")}
COMMANDS = [["1001"], ["show", "1001"], ["verdict", "1001"], ["list"], ["hotspots"],
            ["resume", "node-01"], ["config"]]


def _cli(*args, env=None):
    from click.testing import CliRunner
    from sattrib.cli import main
    return CliRunner().invoke(main, list(args), env=env)


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
@pytest.mark.parametrize("problem", BROKEN)
def test_every_command_stops_at_a_broken_config(tmp_path, command, problem):
    text, error, hint = BROKEN[problem]
    cfg = tmp_path / "s.toml"
    cfg.write_text(text)
    for how in (["--config", str(cfg)], []):          # the flag, or SATTRIB_CONFIG
        r = _cli(*how, *command, env=None if how else {"SATTRIB_CONFIG": str(cfg)})
        lines = r.output.strip().splitlines()
        assert r.exit_code == 1 and len(lines) == 2, r.output
        assert lines[0].startswith("sattrib: error:") and error in lines[0]
        assert lines[1].startswith("hint:") and hint in lines[1]


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_every_command_refuses_a_config_flag_naming_no_file(tmp_path, command):
    r = _cli("--config", str(tmp_path / "nope.toml"), *command)
    assert r.exit_code == 1
    nope = tmp_path / "nope.toml"
    assert r.output.splitlines() == [f"sattrib: error: no config file at {nope}",
                                     "hint: give the path of an existing file, or leave out "
                                     "--config to read $SATTRIB_CONFIG or /etc/sattrib/sattrib.toml"]


def test_the_config_flag_beats_the_environment(tmp_path, monkeypatch):
    from sattrib.demo import write_demo
    from sattrib.analysis import analyze_folder
    from sattrib.store import Store
    monkeypatch.delenv("SATTRIB_DATABASE")
    d, _ = analyze_folder(write_demo(tmp_path / "demo"))
    Store(tmp_path / "flag.db").upsert(d, "default")
    (tmp_path / "flag.toml").write_text(f'database = "{tmp_path / "flag.db"}"\n')
    (tmp_path / "env.toml").write_text(f'database = "{tmp_path / "env.db"}"\n')
    monkeypatch.setenv("SATTRIB_CONFIG", str(tmp_path / "env.toml"))
    r = _cli("--config", str(tmp_path / "flag.toml"), "1001")
    assert r.exit_code == 0 and r.output.startswith("Job 1001"), r.output
    r = _cli("--config", str(tmp_path / "flag.toml"), "config")
    assert f"# config file: {tmp_path / 'flag.toml'}" in r.output
    assert f"database = '{tmp_path / 'flag.db'}'    # {tmp_path / 'flag.toml'}" in r.output
    (tmp_path / "env.toml").write_text("nope = 1\n")     # a broken file the flag replaces
    assert _cli("--config", str(tmp_path / "flag.toml"), "1001").exit_code == 0
