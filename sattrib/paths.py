"""Where things are, resolved without the settings model: `sattrib <jobid>` is typed by people
and must not pay for importing the validation machinery to find one file."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

SYSTEM_CONFIG = Path("/etc/sattrib/sattrib.toml")
SYSTEM_DATA = Path("/var/lib/sattrib")
SYSTEM_LOG = "/var/log/sattrib"


def default_database() -> str:
    if SYSTEM_DATA.is_dir():
        return str(SYSTEM_DATA / "diagnoses.db")
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return str(Path(base) / "sattrib" / "diagnoses.db")


def config_path(explicit: Optional[Path] = None, env=os.environ) -> Path:
    """The config file: --config > SATTRIB_CONFIG > /etc/sattrib/sattrib.toml."""
    if explicit:
        return Path(explicit)
    return Path(env["SATTRIB_CONFIG"]) if env.get("SATTRIB_CONFIG") else SYSTEM_CONFIG


def setting(key: str, flag: Optional[str] = None, config: Optional[Path] = None,
            env=os.environ) -> Optional[str]:
    """One string setting: flag > SATTRIB_<KEY> > the config file > None (as the settings do)."""
    if flag:
        return flag
    if env.get("SATTRIB_" + key.upper()):
        return env["SATTRIB_" + key.upper()]
    path = config_path(config, env)
    if path.is_file():
        import tomllib
        try:
            value = tomllib.loads(path.read_text(encoding="utf-8")).get(key)
        except (OSError, tomllib.TOMLDecodeError):
            value = None          # the full settings loader reports the error properly
        if isinstance(value, str) and value:
            return value
    return None


def database(flag: Optional[str] = None, config: Optional[Path] = None, env=os.environ) -> str:
    return setting("database", flag, config, env) or default_database()


def bundle_dir(config: Optional[Path] = None, env=os.environ) -> str:
    return setting("bundle_dir", None, config, env) or str(SYSTEM_DATA / "bundles")


def log_dir(config: Optional[Path] = None, env=os.environ) -> str:
    return setting("log_dir", None, config, env) or SYSTEM_LOG
