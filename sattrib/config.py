"""Settings: flag > SATTRIB_* environment > /etc/sattrib/sattrib.toml > default.

One dataclass declares every key with its type and bounds, and checks them when it is made;
`sattrib config` prints each effective value and where it came from. Every key is documented in
etc/sattrib.toml (a test keeps the two in step). The checks are written out here rather than
left to pydantic: every command reads the settings, and importing pydantic would cost about a
third of `sattrib analyze`'s start time.
"""
from __future__ import annotations

import dataclasses
import os
import re
import tomllib
import typing
from pathlib import Path
from typing import Any, Literal, Optional

from .errors import UserError

from .paths import SYSTEM_LOG, default_database as _default_database
from .collectors.prometheus import DEFAULT_SERIES as _PROM_SERIES


def Field(default: Any = dataclasses.MISSING, *, default_factory: Any = dataclasses.MISSING,
          ge: Optional[float] = None, gt: Optional[float] = None, le: Optional[float] = None,
          pattern: Optional[str] = None, one_or_many: Optional[bool] = None):
    """A setting's default and bounds (the subset of pydantic's `Field` used here);
    `one_or_many`: a list setting that may also be given as its one string."""
    bounds = {k: v for k, v in (("ge", ge), ("gt", gt), ("le", le), ("pattern", pattern),
                                ("one_or_many", one_or_many)) if v is not None}
    return dataclasses.field(default=default, default_factory=default_factory, metadata=bounds)


class InvalidSettings(ValueError):
    """One or more settings have the wrong type or are out of bounds: `errors` lists
    (name, message) pairs."""

    def __init__(self, errors: list[tuple[str, str]]):
        self.errors = errors
        super().__init__("; ".join(f"{k}: {m}" for k, m in errors))


@dataclasses.dataclass
class Settings:

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
    journal_dir: str = ""                      # journalctl --directory; %n = the node
    journal_margin_s: float = Field(600.0, ge=0)
    journal_lookback_s: float = Field(3600.0, ge=0, le=3600)   # when the job's start is unknown
    ib_sysfs_root: str = "/sys/class/infiniband"
    probe_path: str = ""        # prepended to PATH for probes (nvidia-smi, dcgmi, journalctl)
    log_dir: str = SYSTEM_LOG
    spool_auth: Literal["munge", "owner"] = "munge"
    spool_writer_uid: int = Field(0, ge=0)
    munge_socket: str = ""
    collect_wait_s: float = Field(60.0, ge=0)  # controller waits this long for node snapshots
    job_states: list[str] = Field(default_factory=lambda: [
        "FAILED", "NODE_FAIL", "OUT_OF_MEMORY", "TIMEOUT", "CANCELLED", "PREEMPTED",
        "BOOT_FAIL", "DEADLINE"])
    extra_output_globs: list[str] = Field(default_factory=list)
    output_cap_mb: int = Field(256, ge=1)
    # PyTorch NCCL flight-recorder dumps the node Epilog reads (as the job's user) and ships
    # the facts of; %j job id, %u user, %N this node. [] turns it off.
    flight_recorder_globs: list[str] = Field(default_factory=lambda: ["/tmp/nccl_trace_rank_*"])
    flight_recorder_cap_mb: int = Field(64, ge=1)
    keep_bundles_days: int = Field(30, ge=0)
    worker_deadline_s: float = Field(300.0, gt=0)  # the whole EpilogSlurmctld worker run
    worker_concurrency: int = Field(2, ge=1)       # controller workers at once (the queue)
    queue_max_attempts: int = Field(3, ge=1)       # then a queued job is set aside

    # -- metrics from Prometheus (EpilogSlurmctld worker and `sattrib collect`) ---------------
    prometheus_url: str = ""                   # empty: metrics are not fetched
    prometheus_ui_url: str = ""                # graph links in the evidence (default: the URL)
    prometheus_timeout_s: float = Field(10.0, gt=0)
    prometheus_budget_s: float = Field(60.0, gt=0)
    prometheus_margin_s: float = Field(300.0, ge=0)
    prometheus_step_s: int = Field(15, ge=1)
    prometheus_token_file: str = ""            # bearer token; root-only (mode 0600)
    prometheus_user: str = ""                  # basic auth
    prometheus_password_file: str = ""         # root-only (mode 0600)
    prometheus_ca_file: str = ""               # TLS: the CA bundle that signed the server
    prometheus_node_labels: list[str] = Field(default_factory=lambda: [
        "Hostname", "hostname", "node", "instance"])
    prometheus_series: list[str] = Field(default_factory=lambda: list(_PROM_SERIES))

    # -- acting on a diagnosis (EpilogSlurmctld worker and `sattrib collect`) -----------------
    drain: Literal["off", "dry-run", "on"] = "dry-run"
    drain_max_per_hour: int = Field(5, ge=0)
    drain_max_partition_percent: float = Field(10.0, ge=0, le=100)
    action_timeout_s: float = Field(10.0, gt=0)    # each scontrol call and each mail
    repeat_threshold: int = Field(3, ge=2)
    repeat_window_days: float = Field(7.0, gt=0)
    requeue_exclude_partitions: list[str] = Field(default_factory=list)
    requeue_partitions: list[str] = Field(default_factory=list)
    requeue_max_restarts: int = Field(1, ge=0)
    notify_url: str = ""                       # webhook; empty: none
    notify_timeout_s: float = Field(5.0, gt=0)
    notify_retries: int = Field(2, ge=0, le=5)
    notify_max_per_hour: int = Field(10, ge=1)     # webhooks; past it: held, summarised later
    dashboard_url: str = ""                    # links in notifications
    mail_prog: str = ""                        # e.g. /usr/bin/mail; empty: no mail to users

    # -- cross-job incidents (EpilogSlurmctld worker and `sattrib collect`) -------------------
    incident_window_s: float = Field(300.0, gt=0)  # failures this close together group
    incident_min_jobs: int = Field(3, ge=2)        # ... when this many jobs failed
    incident_min_nodes: int = Field(2, ge=1)       # ... on this many nodes behind one element
    incident_min_failed_share: float = Field(0.75, gt=0, le=1)   # of its busy nodes
    incident_topology: str = "auto"            # "auto" (beside slurm.conf), "off", or a path
    incident_site_file: str = "/etc/sattrib/site.toml"   # racks, PDUs, chassis, NVLink domains

    # -- dashboard ---------------------------------------------------------------------------
    serve_host: str = "127.0.0.1"
    serve_port: int = Field(8001, ge=1, le=65535)
    serve_base_url: str = "/"
    serve_allow_sql: bool = False
    serve_sql_time_limit_ms: int = Field(1000, ge=10)
    serve_evidence_text: Literal["admins", "all", "none"] = "admins"
    serve_admins: list[str] = Field(default_factory=lambda: ["root"])
    serve_trusted_user_header: str = Field("", pattern=r"^([A-Za-z0-9][A-Za-z0-9-]*)?$")
    serve_trusted_proxy: list[str] = Field(default_factory=list, one_or_many=True)

    # -- login nodes: `sattrib JOBID` through the controller's dashboard -----------------------
    server_url: str = ""                       # the dashboard's base URL; empty: local only
    server_timeout_s: float = Field(5.0, gt=0)  # to connect, and for each whole answer
    server_ca_file: str = ""                   # TLS: the CA bundle that signed the dashboard

    def __post_init__(self):
        errors = []
        for f in dataclasses.fields(self):
            try:
                setattr(self, f.name, _checked(f, _HINTS[f.name], getattr(self, f.name)))
            except ValueError as e:
                errors.append((f.name, str(e)))
        if errors:
            raise InvalidSettings(errors)

    def model_dump(self) -> dict:
        return dataclasses.asdict(self)

    def model_copy(self, update: Optional[dict] = None) -> "Settings":
        return dataclasses.replace(self, **(update or {}))


def _plain_url(url: str, instead: str = ": use prometheus_user and prometheus_password_file"
               ) -> str:
    from urllib.parse import urlsplit
    if not url:
        return url
    p = urlsplit(url)
    if p.scheme not in ("http", "https") or not p.hostname:
        raise ValueError("must be an http:// or https:// URL")
    if p.username or p.password:
        raise ValueError("must not carry a user or password (it would be shown and "
                         "logged)" + instead)
    return url


def _addresses(values: list[str]) -> list[str]:
    import ipaddress
    for v in values:
        try:
            ipaddress.ip_network(v, strict=False)
        except ValueError:
            raise ValueError(f"{v!r} is not an IP address (or network)") from None
    return values


def _known_zone(tz: str) -> str:
    try:
        utc_offset(tz, 0)
    except UserError as e:
        raise ValueError(e.message) from None
    return tz


_VALIDATORS = {"prometheus_url": _plain_url, "prometheus_ui_url": _plain_url,
               "notify_url": _plain_url, "dashboard_url": _plain_url,
               "server_url": lambda url: _plain_url(url, instead=""),
               "timezone": _known_zone, "serve_trusted_proxy": _addresses}
_HINTS = typing.get_type_hints(Settings)
Settings.model_fields = {f.name: f for f in dataclasses.fields(Settings)}


def _checked(f: dataclasses.Field, hint: Any, v: Any) -> Any:
    """The value as the setting's type (a number may be given as text, as the environment
    does), within its bounds; ValueError says what is wrong."""
    if typing.get_origin(hint) is Literal:
        choices = typing.get_args(hint)
        if v not in choices:
            raise ValueError("must be one of " + ", ".join(repr(c) for c in choices))
    elif hint is bool:
        if not isinstance(v, bool):
            raise ValueError("must be true or false")
    elif hint in (int, float):
        if isinstance(v, str):
            try:
                v = hint(v.strip())
            except ValueError:
                raise ValueError(f"must be {'an integer' if hint is int else 'a number'}") from None
        if isinstance(v, bool) or not isinstance(v, (int, float)) or (
                hint is int and isinstance(v, float) and not v.is_integer()):
            raise ValueError(f"must be {'an integer' if hint is int else 'a number'}")
        v = hint(v)
        m = f.metadata
        if "ge" in m and not v >= m["ge"]:
            raise ValueError(f"must be at least {m['ge']}")
        if "gt" in m and not v > m["gt"]:
            raise ValueError(f"must be more than {m['gt']}")
        if "le" in m and not v <= m["le"]:
            raise ValueError(f"must be at most {m['le']}")
    elif hint is str:
        if not isinstance(v, str):
            raise ValueError("must be a string")
        if "pattern" in f.metadata and not re.match(f.metadata["pattern"], v):
            raise ValueError(f"must match {f.metadata['pattern']}")
    elif typing.get_origin(hint) is list:
        if isinstance(v, str) and f.metadata.get("one_or_many"):
            v = [v]
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            raise ValueError("must be a list of strings")
        v = list(v)
    check = _VALIDATORS.get(f.name)
    return check(v) if check else v


ENV_PREFIX = "SATTRIB_"


def _coerce(name: str, raw: str) -> Any:
    ann = _HINTS[name]
    if ann in (list[str],):
        return [x for x in (s.strip() for s in raw.split(",")) if x]
    if ann is int:
        return int(raw) if raw.strip().lstrip("-").isdigit() else raw
    if ann is bool:
        return raw.strip().lower() in ("1", "true", "yes", "on")
    return raw


class Loaded:
    def __init__(self, settings: Settings, sources: dict[str, str], path: Optional[Path],
                 problems: Optional[list[str]] = None):
        self.settings = settings
        self.sources = sources
        self.path = path
        self.problems = problems or []      # what a lenient load ignored, one line each


def load(flags: Optional[dict] = None, path: Optional[Path] = None,
         env: Optional[dict] = None, lenient: bool = False,
         env_keys: Optional[tuple] = None) -> Loaded:
    """The effective settings. Strict (the CLI): the first problem is a UserError. Lenient
    (the hooks): a problem drops only what it concerns (an unreadable file, an unknown key,
    an invalid value), that setting keeps its default, and `problems` says so. `env_keys`
    limits which settings are read from SATTRIB_* variables (None: all of them)."""
    from .paths import config_path
    env = os.environ if env is None else env
    path = config_path(path, env)
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    problems: list[str] = []

    def problem(msg: str, hint: str, ignored: str) -> None:
        if not lenient:
            raise UserError(msg, hint)
        problems.append(f"{msg}: {ignored}")

    if path.is_file():
        data: dict = {}
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
            problem(f"cannot read {path}: {e}", "fix the TOML syntax",
                    "the whole file ignored, defaults used")
        for k, v in data.items():
            if k not in Settings.model_fields:
                problem(f"{path}: unknown key {k!r}", "see etc/sattrib.toml for the list of keys",
                        "ignored; defaults used")
                continue
            values[k] = v
            sources[k] = str(path)
    for k in Settings.model_fields:
        if env_keys is not None and k not in env_keys:
            continue
        raw = env.get(ENV_PREFIX + k.upper())
        if raw is not None:
            values[k] = _coerce(k, raw)
            sources[k] = "env " + ENV_PREFIX + k.upper()
    for k, v in (flags or {}).items():
        if v is not None:
            values[k] = v
            sources[k] = "flag"
    while True:
        try:
            st = Settings(**values)
            break
        except InvalidSettings as e:
            before = len(values)
            for key, msg in e.errors:
                problem(f"invalid setting {key}: {msg} (from {sources.get(key, '?')})",
                        "see `sattrib config` and etc/sattrib.toml", "its default used")
                values.pop(key, None)
                sources.pop(key, None)
            if len(values) == before:           # nothing left to drop: never loop
                raise UserError(f"invalid settings: {e.errors[0][1]}",
                                "see `sattrib config` and etc/sattrib.toml") from None
    for k in Settings.model_fields:
        sources.setdefault(k, "default")
    return Loaded(st, sources, path if path.is_file() else None, problems)


def load_for_hook(env: Optional[dict] = None) -> Loaded:
    """The settings as the hooks read them: never fails, and reads from the environment only
    SATTRIB_CONFIG (the installed wrappers set it). Root runs the hooks, and every setting
    (probe_path is prepended to root's PATH, journal_dir chooses which journal root reads and
    hands on) belongs in the root-owned config file, not in whatever environment slurmd or
    slurmctld, or a wrapper around them, passes on. One host standing in for several nodes
    names each node's journal with `%n` in journal_dir."""
    return load(env=os.environ if env is None else env, lenient=True, env_keys=())


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
