"""Settings: flag > SATTRIB_* environment > /etc/sattrib/sattrib.toml > default.

One model validates every key; `sattrib config` prints each effective value and where it came
from. Every key is documented in etc/sattrib.toml (a test keeps the two in step).
"""
from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .errors import UserError

from .paths import default_database as _default_database


class Settings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # -- where things live -------------------------------------------------------------------
    cluster: str = "default"
    database: str = Field(default_factory=_default_database)
    rules_dirs: list[str] = Field(default_factory=lambda: ["/etc/sattrib/rules.d"])
    bundle_dir: str = "/var/lib/sattrib/bundles"
    spool_dir: str = "/var/spool/sattrib"

    # -- analysis ----------------------------------------------------------------------------
    window_before_s: float = Field(600.0, ge=0)
    window_after_s: float = Field(300.0, ge=0)
    clock_skew_s: float = Field(0.0, ge=0)
    timezone: str = "UTC"
    file_cap_mb: int = Field(512, ge=1)
    max_hits_per_file: int = Field(4000, ge=10)

    # -- hooks (node Epilog and EpilogSlurmctld) ----------------------------------------------
    epilog_budget_s: float = Field(20.0, gt=0)
    probe_timeout_s: float = Field(8.0, gt=0)
    journal_dir: str = ""                      # read journals from here (journalctl --directory)
    journal_margin_s: float = Field(600.0, ge=0)
    journal_lookback_s: float = Field(86400.0, ge=0)   # when the job's start is unknown
    ib_sysfs_root: str = "/sys/class/infiniband"
    probe_path: str = ""        # prepended to PATH for probes (nvidia-smi, dcgmi, journalctl)
    log_dir: str = "/var/log/sattrib"
    spool_auth: Literal["munge", "owner"] = "munge"
    spool_writer_uid: int = Field(0, ge=0)
    munge_socket: str = ""
    collect_wait_s: float = Field(60.0, ge=0)  # controller waits this long for node snapshots
    job_states: list[str] = Field(default_factory=lambda: [
        "FAILED", "NODE_FAIL", "OUT_OF_MEMORY", "TIMEOUT", "CANCELLED", "PREEMPTED",
        "BOOT_FAIL", "DEADLINE"])
    extra_output_globs: list[str] = Field(default_factory=list)
    output_cap_mb: int = Field(256, ge=1)
    keep_bundles_days: int = Field(30, ge=0)

    # -- dashboard ---------------------------------------------------------------------------
    serve_host: str = "127.0.0.1"
    serve_port: int = Field(8001, ge=1, le=65535)
    serve_base_url: str = "/"
    serve_allow_sql: bool = False
    serve_sql_time_limit_ms: int = Field(1000, ge=10)
    serve_evidence_text: Literal["admins", "all", "none"] = "admins"
    serve_admins: list[str] = Field(default_factory=lambda: ["root"])
    serve_trusted_user_header: str = Field("", pattern=r"^([A-Za-z0-9][A-Za-z0-9-]*)?$")


ENV_PREFIX = "SATTRIB_"


def _coerce(name: str, raw: str) -> Any:
    field = Settings.model_fields[name]
    ann = field.annotation
    if ann in (list[str],):
        return [x for x in (s.strip() for s in raw.split(",")) if x]
    if ann is int:
        return int(raw) if raw.strip().lstrip("-").isdigit() else raw
    if ann is bool:
        return raw.strip().lower() in ("1", "true", "yes", "on")
    return raw


class Loaded:
    def __init__(self, settings: Settings, sources: dict[str, str], path: Optional[Path]):
        self.settings = settings
        self.sources = sources
        self.path = path


def load(flags: Optional[dict] = None, path: Optional[Path] = None,
         env: Optional[dict] = None) -> Loaded:
    from .paths import config_path
    env = os.environ if env is None else env
    path = config_path(path, env)
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    if path.is_file():
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except (OSError, tomllib.TOMLDecodeError) as e:
            raise UserError(f"cannot read {path}: {e}", "fix the TOML syntax") from None
        for k, v in data.items():
            if k not in Settings.model_fields:
                raise UserError(f"{path}: unknown key {k!r}",
                                "see etc/sattrib.toml for the list of keys")
            values[k] = v
            sources[k] = str(path)
    for k in Settings.model_fields:
        raw = env.get(ENV_PREFIX + k.upper())
        if raw is not None:
            values[k] = _coerce(k, raw)
            sources[k] = "env " + ENV_PREFIX + k.upper()
    for k, v in (flags or {}).items():
        if v is not None:
            values[k] = v
            sources[k] = "flag"
    try:
        st = Settings(**values)
    except ValidationError as e:
        first = e.errors()[0]
        key = ".".join(str(x) for x in first["loc"])
        raise UserError(f"invalid setting {key}: {first['msg']} (from {sources.get(key, '?')})",
                        "see `sattrib config` and etc/sattrib.toml") from None
    for k in Settings.model_fields:
        sources.setdefault(k, "default")
    return Loaded(st, sources, path if path.is_file() else None)


def utc_offset(tz: str, at: Optional[float]) -> int:
    """Seconds east of UTC for naive log timestamps, at the job's start."""
    if tz.upper() in ("UTC", "Z", ""):
        return 0
    import re
    m = re.fullmatch(r"([+-])(\d\d):?(\d\d)", tz)
    if m:
        sign = -1 if m.group(1) == "-" else 1
        return sign * (int(m.group(2)) * 3600 + int(m.group(3)) * 60)
    from datetime import datetime, timezone
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError
    try:
        zone = ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError):
        raise UserError(f"unknown timezone {tz!r}", "use an IANA name or +HH:MM") from None
    when = datetime.fromtimestamp(at or 0, timezone.utc)
    off = when.astimezone(zone).utcoffset()
    return int(off.total_seconds()) if off else 0
