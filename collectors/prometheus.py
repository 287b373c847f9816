"""Metrics as evidence: dcgm-exporter and node_exporter series from a site's Prometheus.

Two halves, like the other collectors:

- `fetch(settings, nodes, start, end, deadline)`: range queries over `/api/v1/query_range` for
  the job's nodes and window (start minus `prometheus_margin_s` to end plus it). One query per
  series for every node at once (nodes are batched into a regular expression on the node
  labels), so a 1,024-node job costs a few dozen requests. Every request has a timeout, the
  whole fetch a budget; a Prometheus that is down, slow or erroring leaves error entries (the
  reader turns them into `metrics:<node>` missing), never an exception.
- `lines(text, node, doc, ui_url)`: pure, `<node>/metrics.json` -> one synthetic evidence line
  per series that changed inside the window, which the rules in engine/rules/metrics/ read:

      DCGM_FI_DEV_XID_ERRORS{gpu="3",pci_bus_id="00000000:9A:00.0"} xid=79 at=2026-...Z start=0 end=79
      DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{gpu="0",pci_bus_id="..."} increase=2 start=0 end=2 at=... resets=0
      node_infiniband_link_downed_total{device="mlx5_0",port="1"} increase=1 start=3 end=4 at=...
      DCGM_FI_DEV_GPU_TEMP{gpu="1",pci_bus_id="..."} change=+21 start=70 end=91 max=91 at=...

`<node>/metrics.json` (the bundle contract): a list of {"query": PromQL, "result": the API's
`data.result` restricted to that node, "ui": the Prometheus UI for graph links} or {"query":
PromQL, "error": why it was not fetched}.
"""
from __future__ import annotations

import json
import math
import os
import stat
import time
from dataclasses import dataclass, field
from typing import Optional
from urllib.parse import urlencode, urlsplit, urlunsplit

from ..engine.models import METRIC_POINTS, Line
from ..engine.taxonomy import Source

METRICS_NAME = "metrics.json"
PROBE_NAME = "prometheus"
NODE_BATCH = 512           # nodes per query: a regular expression of a few kilobytes
MAX_POINTS = 600           # per series and query: the step grows with the window
MAX_BODY = 64 << 20        # bytes per answer: more is not a Prometheus answer we can use
# bytes of all answers of one fetch: parsed and kept until the bundle is written, a byte of
# JSON costs several of memory (14 answers just under MAX_BODY held 4.6 GB)
MAX_TOTAL_BODY = 128 << 20

# dcgm-exporter (etc/default-counters.csv) and node_exporter (collector/infiniband_linux.go)
# names. ECC DBE and NVLink CRC/replay are commented out in dcgm-exporter's default counters
# file: a site that enables them gets them; when absent they are missing, not healthy.
DEFAULT_SERIES = [
    "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE",
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_THERMAL_VIOLATION",
    "DCGM_FI_DEV_GPU_UTIL",
    "node_infiniband_link_downed_total",
    "node_infiniband_symbol_error_total",
    "node_infiniband_port_errors_received_total",
    "node_infiniband_link_error_recovery_total",
]
# How a series is read: counters by their increase, gauges by their change, the Xid gauge by
# its last value and time. Names not listed: `*_total` and `*_COUNTER` are counters.
_GAUGES = {"DCGM_FI_DEV_ROW_REMAP_FAILURE", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_MEMORY_TEMP",
           "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_GPU_UTIL", "node_infiniband_state_id",
           "node_infiniband_physical_state_id", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
           "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"}
_COUNTERS = {"DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
             "DCGM_FI_DEV_THERMAL_VIOLATION", "DCGM_FI_DEV_POWER_VIOLATION",
             "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
             "DCGM_FI_DEV_RETIRED_DBE", "DCGM_FI_DEV_RETIRED_SBE", "DCGM_FI_DEV_RETIRED_PENDING"}
XID_SERIES = "DCGM_FI_DEV_XID_ERRORS"
UTIL_SERIES = "DCGM_FI_DEV_GPU_UTIL"
UTIL_BUSY, UTIL_IDLE = 50.0, 5.0   # percent: working before, idle from the fall to the end
# Labels that are plumbing, not evidence (left out of the line, kept in metrics.json).
_QUIET_LABELS = {"__name__", "job", "DCGM_FI_DRIVER_VERSION", "modelName",
                 "Hostname", "hostname", "instance", "node", "UUID", "err_msg"}


def kind(name: str) -> str:
    if name == XID_SERIES:
        return "xid"
    if name in _GAUGES:
        return "gauge"
    if name in _COUNTERS or name.endswith(("_total", "_COUNTER", "_TOTAL")):
        return "counter"
    return "gauge"


def source(name: str) -> Source:
    return Source.ib if name.startswith("node_infiniband") else Source.gpu


# -- fetching ---------------------------------------------------------------------------------
@dataclass
class Fetched:
    per_node: dict = field(default_factory=dict)     # node -> [{"query", "result"|"error"}]
    notes: list = field(default_factory=list)
    queries: int = 0
    seconds: float = 0.0
    bytes: int = 0                                    # of every answer read


def redact_url(url: str) -> str:
    """The URL without a user:password part (it goes into notes and logs)."""
    p = urlsplit(url)
    if p.username or p.password:
        host = p.hostname or ""
        if p.port:
            host += f":{p.port}"
        return urlunsplit((p.scheme, host, p.path, p.query, p.fragment))
    return url


def read_secret(path: str, what: str) -> tuple[Optional[str], Optional[str]]:
    """(secret, None) or (None, why it is not used). A secret file must be a regular file owned
    by root or by the user running sattrib, with no access for group or others."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as e:
        return None, f"{what} {path}: cannot open ({e.strerror})"
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None, f"{what} {path}: not a regular file; not used"
        if st.st_uid not in (0, os.geteuid()):
            return None, f"{what} {path}: owned by uid {st.st_uid}, not root; not used"
        if st.st_mode & 0o077:
            return None, (f"{what} {path}: readable or writable by group or others "
                          f"(mode {stat.S_IMODE(st.st_mode):04o}); not used (chmod 600 it)")
        return os.read(fd, 4096).decode("utf-8", "replace").strip(), None
    finally:
        os.close(fd)


def _node_regex(nodes: list[str]) -> str:
    """An RE2 alternation of the node names, an optional `:port` (the `instance` label)."""
    alts = "|".join("".join("\\" + c if c in ".^$*+?()[]{}|\\" else c for c in n) for n in nodes)
    return f"(?:{alts})(?::[0-9]+)?"


def _promql_string(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def promql(name: str, node_labels: list[str], nodes: list[str]) -> str:
    """The series `name` for these nodes, selected on any of the node labels (`or` keeps each
    matching series once)."""
    rx = _promql_string(_node_regex(nodes))
    return " or ".join(f"{name}{{{lab}=~{rx}}}" for lab in node_labels)


def queries(series: list[str], node_labels: list[str],
            nodes: list[str]) -> list[tuple[str, str, list[str]]]:
    """(PromQL, series, its nodes): one query per series and batch of NODE_BATCH nodes."""
    out = []
    for i in range(0, len(nodes), NODE_BATCH):
        batch = nodes[i:i + NODE_BATCH]
        out += [(promql(name, node_labels, batch), name, batch) for name in series]
    return out


def node_of(metric: dict, node_labels: list[str]) -> Optional[str]:
    for lab in node_labels:
        v = metric.get(lab)
        if v:
            host = v.rsplit(":", 1)[0] if v.rsplit(":", 1)[-1].isdigit() else v
            return host
    return None


class _Overrun(Exception):
    pass


def _read_body(r, deadline: float, cap: int = MAX_BODY) -> bytes:
    """The answer's body, read as it arrives: a server that sends slowly (a byte at a time,
    each within the read timeout) is cut off at the connector's deadline, and a body larger
    than `cap` is refused, so neither can hold the worker past its budget."""
    import requests
    import urllib3

    buf = bytearray()
    while True:
        if time.monotonic() > deadline:
            raise _Overrun(f"the answer was still arriving when the connector's budget ran "
                           f"out ({len(buf)} bytes read)")
        try:
            chunk = r.raw.read1(1 << 16, decode_content=True)
        except urllib3.exceptions.ReadTimeoutError as e:      # as requests would raise them
            raise requests.Timeout(str(e)) from None
        except urllib3.exceptions.HTTPError as e:
            raise requests.ConnectionError(str(e)) from None
        if not chunk:
            return bytes(buf)
        buf += chunk
        if len(buf) > cap:
            raise _Overrun(f"the answer is larger than {MAX_BODY >> 20} MiB" if cap == MAX_BODY
                           else f"the answers passed {MAX_TOTAL_BODY >> 20} MiB in all")


def _error_text(status: int, body) -> str:
    """What went wrong, as anyone may read it: the status and Prometheus's errorType, never its
    message (a proxy's error page may echo the request's headers, credentials included)."""
    kind = body.get("errorType") if isinstance(body, dict) else None
    ok = isinstance(kind, str) and kind.replace("_", "").isalnum() and len(kind) <= 32
    return f"HTTP {status}" + (f" ({kind})" if ok else "")


def fetch(st, nodes: list[str], start: Optional[float], end: Optional[float],
          deadline: float) -> Fetched:
    """Never raises: what could not be fetched is an error entry for every node."""
    import requests

    t0 = time.monotonic()
    out = Fetched(per_node={n: [] for n in nodes})
    base = st.prometheus_url.rstrip("/")
    shown = redact_url(base)
    deadline = min(deadline, t0 + st.prometheus_budget_s)
    if end is None:
        end = time.time()
    if start is None:
        start = end - st.journal_lookback_s
    lo, hi = start - st.prometheus_margin_s, end + st.prometheus_margin_s
    step = max(st.prometheus_step_s, math.ceil((hi - lo) / MAX_POINTS))
    qs = queries(st.prometheus_series, st.prometheus_node_labels, nodes)
    headers = {"Accept": "application/json"}
    auth = None
    problem = None
    if st.prometheus_token_file:
        token, problem = read_secret(st.prometheus_token_file, "prometheus_token_file")
        if token:
            headers["Authorization"] = "Bearer " + token
    elif st.prometheus_user:
        password, problem = read_secret(st.prometheus_password_file, "prometheus_password_file") \
            if st.prometheus_password_file else ("", None)
        if password is not None:
            auth = (st.prometheus_user, password)
    verify = st.prometheus_ca_file or True
    ui = redact_url(st.prometheus_ui_url or base)

    # Each node's metrics.json names the query as it reads for that node alone (the batch's
    # regular expression would repeat every node name in every node's file).
    def own(name: str, n: str) -> str:
        return promql(name, st.prometheus_node_labels, [n])

    def fail_all(rest: list, why: str) -> None:
        for _, name, batch in rest:
            for n in batch:
                out.per_node[n].append({"query": own(name, n), "error": why})

    if problem:
        fail_all(qs, "credentials not used: " + problem)
        out.notes.append(f"metrics: not fetched from {shown} ({problem})")
        return out
    with requests.Session() as s:
        for i, (q, name, batch) in enumerate(qs):
            left = deadline - time.monotonic()
            if left < 0.2:
                why = f"the connector's budget ({st.prometheus_budget_s:g}s) ran out"
                fail_all(qs[i:], why)
                out.notes.append(f"metrics: {len(qs) - i} of {len(qs)} queries to {shown} "
                                 f"not made: {why}")
                break
            out.queries += 1
            err = None
            try:
                with s.post(base + "/api/v1/query_range", headers=headers, auth=auth,
                            verify=verify, allow_redirects=False, stream=True,
                            data={"query": q, "start": f"{lo:.3f}", "end": f"{hi:.3f}",
                                  "step": f"{step}"},
                            timeout=(min(st.prometheus_timeout_s, left),
                                     min(st.prometheus_timeout_s, left))) as r:
                    raw = _read_body(r, deadline, min(MAX_BODY, MAX_TOTAL_BODY - out.bytes))
                out.bytes += len(raw)
                body = json.loads(raw) if r.headers.get("Content-Type", "").startswith(
                    "application/json") else None
                del raw
                if r.status_code != 200 or not isinstance(body, dict) \
                        or body.get("status") != "success":
                    err = _error_text(r.status_code, body)
            except _Overrun as e:
                err = str(e)
            except requests.Timeout:
                err = f"no answer within {min(st.prometheus_timeout_s, left):g}s"
            except requests.exceptions.SSLError:
                err = ("TLS: its certificate is not signed by " +
                       (f"prometheus_ca_file {st.prometheus_ca_file}" if st.prometheus_ca_file
                        else "a CA the system trusts (set prometheus_ca_file)") +
                       " or does not name the host")
            except requests.RequestException as e:
                err = f"cannot reach it ({type(e).__name__})"
            except ValueError:
                err = "the answer is not valid JSON"
            if err is not None:
                if not err.startswith(("HTTP 400", "HTTP 422")):   # down, refusing or failing
                    fail_all(qs[i:], f"Prometheus {shown}: {err}")
                    out.notes.append(f"metrics: Prometheus {shown}: {err}; "
                                     f"{len(qs) - i} of {len(qs)} queries not answered")
                    break
                fail_all([qs[i]], f"Prometheus {shown}: {err}")
                out.notes.append(f"metrics: the query for {name} rejected: {err}")
                continue
            got: dict = {n: [] for n in batch}
            for series in (body.get("data") or {}).get("result") or []:
                n = node_of(series.get("metric") or {}, st.prometheus_node_labels)
                if n in got:
                    got[n].append(series)
            for n in batch:
                out.per_node[n].append({"query": own(name, n), "result": got[n], "ui": ui,
                                        "range": [lo, hi, step]})
    out.seconds = time.monotonic() - t0
    return out


def write_bundle(root, fetched: Fetched) -> None:
    """`<node>/metrics.json` for every node asked about (a node folder is made for a node that
    sent no snapshot: its metrics may be the only evidence left)."""
    for node, entries in sorted(fetched.per_node.items()):
        if not node or "/" in node or node.startswith((".", "_")) or node in (
                "slurm", "logs"):
            continue                  # not a folder name the bundle layout allows
        d = os.path.join(root, node)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, METRICS_NAME), "w", encoding="utf-8") as f:
            f.write(json.dumps(entries, separators=(",", ":")) + "\n")


# -- reading ----------------------------------------------------------------------------------
def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def _labels(name: str, metric: dict) -> str:
    # dcgm-exporter's `device` is the device file (nvidia0); node_exporter's is the HCA.
    quiet = _QUIET_LABELS | ({"device"} if name.startswith("DCGM_") else set())
    keep = {k: v for k, v in metric.items() if k not in quiet}
    order = sorted(keep, key=lambda k: (k not in ("gpu", "pci_bus_id", "device", "port"), k))
    return "{" + ",".join(f'{k}="{keep[k]}"' for k in order) + "}"


def _label_dict(name: str, metric: dict) -> dict:
    quiet = _QUIET_LABELS | ({"device"} if name.startswith("DCGM_") else set())
    return {str(k): str(v) for k, v in sorted(metric.items()) if k not in quiet}


def _points(values: list, at: float) -> list[tuple[float, float]]:
    """The samples around `at` for the evidence's chart: a third before, the rest after."""
    pts = [(t, v) for t, v in _numbers(values) if not math.isinf(v)]
    i = next((k for k, (t, _) in enumerate(pts) if t >= at), len(pts))
    lo = max(0, min(i - METRIC_POINTS // 3, len(pts) - METRIC_POINTS))
    return pts[lo:lo + METRIC_POINTS]


def _num(v) -> str:
    return str(int(v)) if float(v).is_integer() else f"{v:g}"


def graph_url(ui_url: str, query: str, lo: float, hi: float) -> str:
    """The Prometheus graph of `query` over [lo, hi] (the classic /graph page's parameters)."""
    params = {"g0.expr": query, "g0.tab": "0", "g0.range_input": f"{max(int(hi - lo), 60)}s",
              "g0.end_input": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(hi))}
    return ui_url.rstrip("/") + "/graph?" + urlencode(params)


def _numbers(values: list) -> list[tuple[float, float]]:
    """A series' [time, "value"] pairs as numbers, without the ones that are not (NaN, junk)."""
    pts = []
    for t, v in values:
        try:
            t, v = float(t), float(v)
        except (TypeError, ValueError):
            continue
        if not math.isnan(v):
            pts.append((t, v))
    return pts


def summarize(name: str, values: list, lo: Optional[float] = None,
              step: Optional[float] = None) -> Optional[dict]:
    """What a series did inside the window [lo, ...] queried at `step`, or None when it did
    nothing worth a line. Counters: the increase, resets handled (after a drop, the count starts
    again from the new value, as Prometheus's increase() does). Gauges: the change from start
    to end. Xid: the last non-zero value and when it appeared; a value already there when the
    window opened is an Xid from before the job, not this job's."""
    pts = _numbers(values)
    if not pts:
        return None
    k = kind(name)
    first, last = pts[0][1], pts[-1][1]
    if k == "counter":
        inc, resets, at = 0.0, 0, None
        for (_, a), (t, b) in zip(pts, pts[1:]):
            d = b - a if b >= a else b
            if b < a:
                resets += 1
            if d > 0:
                inc += d
                at = at or t
        if inc <= 0:
            return None
        return {"kind": k, "increase": inc, "start": first, "end": last, "at": at,
                "resets": resets}
    if k == "xid":
        at, code = None, None
        # A series that starts inside the window (dcgm-exporter's err_code label makes a new
        # series per Xid) appeared then; one there from the start has no change to show.
        appeared = lo is not None and step is not None and pts[0][0] > lo + 2 * step
        before = [(pts[0][0], 0.0)] if appeared else [pts[0]]
        for (_, a), (t, b) in zip(before + pts, pts):
            if b != a and b > 0:
                at, code = t, b
        if code is None:
            return None
        return {"kind": k, "xid": code, "start": first, "end": last, "at": at}
    at = None
    for (_, a), (t, b) in zip(pts, pts[1:]):
        if b != a:
            at = at or t
    if at is None:
        return None
    return {"kind": k, "change": last - first, "start": first, "end": last,
            "max": max(v for _, v in pts), "at": at}


def _series_name(query: str) -> str:
    return query.split("{", 1)[0].strip()


def _name_of(series: dict, query: str) -> str:
    """A series' metric name: its own `__name__` label, as Prometheus returns it for any
    selector (`{__name__=~"DCGM_FI_.*"}` included); the query's leading name only where the
    series carries none (a query through a function drops it)."""
    metric = series.get("metric") if isinstance(series.get("metric"), dict) else {}
    name = metric.get("__name__")
    return name if isinstance(name, str) and name else _series_name(query)


def _window(entry: dict, entries: list) -> tuple[Optional[float], Optional[float]]:
    """(start, step) of the window a query covered: its `range` as sattrib saves it; for a
    file collected by hand without one, the earliest sample in the file and the finest
    spacing between two samples of one series (a series that starts later than that was
    born inside the window)."""
    rng = entry.get("range")
    if isinstance(rng, list) and len(rng) == 3 and all(
            isinstance(x, (int, float)) for x in (rng[0], rng[2])):
        return float(rng[0]), float(rng[2])
    first, step = None, None
    for e in entries:
        for series in e.get("result") if isinstance(e, dict) and isinstance(
                e.get("result"), list) else []:
            pts = _numbers(series.get("values") or []) if isinstance(series, dict) else []
            if pts:
                first = pts[0][0] if first is None else min(first, pts[0][0])
            gaps = [b[0] - a[0] for a, b in zip(pts, pts[1:]) if b[0] > a[0]]
            if gaps:
                step = min(gaps) if step is None else min(step, min(gaps))
    return (first, step) if first is not None and step else (None, None)


def lines(text: str, node: str, doc: str, ui_url: str = "") -> tuple[list[Line], list[str]]:
    """Pure: `<node>/metrics.json` -> (evidence lines, notes). An error entry becomes a
    `probe=prometheus ... ok=false` line (the `probe.failed` rule makes it `metrics:<node>`
    missing); a series absent for the node is a note."""
    try:
        entries = json.loads(text)
    except ValueError:
        return [], [f"{doc}: not valid JSON; metrics ignored"]
    if not isinstance(entries, list):
        return [], [f"{doc}: not a list of queries; metrics ignored"]
    out: list[Line] = []
    notes: list[str] = []
    failed = None
    absent = []
    for n, e in enumerate(entries, 1):
        if not isinstance(e, dict) or not isinstance(e.get("query"), str):
            continue
        q = e["query"]
        if "error" in e:
            failed = failed or str(e["error"])[:300]
            continue
        result = e.get("result")
        if not isinstance(result, list):
            continue
        if not result:
            absent.append(_series_name(q) or q[:200])
        lo, step = _window(e, entries)
        for series in result:
            if not isinstance(series, dict):
                continue
            name = _name_of(series, q)
            metric = series.get("metric") if isinstance(series.get("metric"), dict) else {}
            values = series.get("values") or ([series["value"]] if "value" in series else [])
            if not name or not isinstance(values, list):
                continue
            s = None if name == UTIL_SERIES else summarize(name, values, lo, step)
            if s is None:
                continue
            lab = _labels(name, metric)
            if s["kind"] == "counter":
                body = (f"increase={_num(s['increase'])} start={_num(s['start'])} "
                        f"end={_num(s['end'])} at={_iso(s['at'])} resets={s['resets']}")
            elif s["kind"] == "xid":
                body = (f"xid={_num(s['xid'])} at={_iso(s['at'])} start={_num(s['start'])} "
                        f"end={_num(s['end'])}")
            else:
                body = (f"change={s['change']:+g} start={_num(s['start'])} "
                        f"end={_num(s['end'])} max={_num(s['max'])} at={_iso(s['at'])}")
            msg = f"{name}{lab} {body}"
            shown = msg
            ui = ui_url or (e.get("ui") if isinstance(e.get("ui"), str) else "")
            graph = None
            if ui.startswith(("http://", "https://")) and values:
                t_lo, t_hi = float(values[0][0]), float(values[-1][0])
                graph = graph_url(ui, q, t_lo, t_hi)
                shown += " graph=" + graph
            out.append(Line(doc=doc, line=n, offset=0, source=source(name), node=node,
                            rank=None, message=msg[:2000], shown=shown[:4000],
                            # it changed after the sample before: (at - step, at]
                            ts=s["at"] - step if step else s["at"], ts_res=step or 1.0,
                            metric={"series": name, "labels": _label_dict(name, metric),
                                    "start": s["start"], "end": s["end"], "graph": graph,
                                    "points": _points(values, s["at"])}))
    if failed:
        out.append(Line(doc=doc, line=0, offset=0, source=Source.probe, node=node, rank=None,
                        message=f"probe={PROBE_NAME} source=metrics ok=false "
                                f"reason={failed} seconds=0"))
    if absent:
        notes.append(f"{node}: no Prometheus series for {', '.join(sorted(set(absent)))} "
                     "(not exported for this node: missing, not healthy)")
    return out, notes


# -- the hang picture -------------------------------------------------------------------------
# Every GPU's utilisation falls to ~0 at about the same moment, except one that fell first:
# the others waited for it in a collective. The picture says where, not why (a stalled rank,
# a slow or stuck GPU, the host under it), so its rule (metrics.gpu_util_fell_first) names
# the node and GPU and asks to inspect them; it is a root only when nothing else is.

@dataclass(frozen=True)
class Fall:
    at: float                # the first idle sample (it fell in (at - step, at])
    step: float
    node: str
    doc: str
    line: int                # the query's entry in metrics.json (1-based)
    labels: str
    query: str
    ui: str
    before: float            # the last busy value and the value at the end
    after: float
    lo: float
    hi: float
    labels_dict: tuple = ()
    points: tuple = ()
    first: float = 0.0       # the value when the window opened


def _fall(values: list) -> Optional[tuple[float, float, float]]:
    """(when it fell, value before, value at the end): busy, then idle to the end."""
    pts = _numbers(values)
    i = len(pts)
    while i > 0 and pts[i - 1][1] <= UTIL_IDLE:
        i -= 1
    if i == len(pts) or i == 0 or pts[i - 1][1] < UTIL_BUSY:
        return None
    return pts[i][0], pts[i - 1][1], pts[-1][1]


def falls(text: str, node: str, doc: str) -> list[Fall]:
    """Pure: the GPUs of one node's metrics.json whose utilisation fell and stayed down."""
    try:
        entries = json.loads(text)
    except ValueError:
        return []
    out = []
    for n, e in enumerate(entries if isinstance(entries, list) else [], 1):
        if not isinstance(e, dict) or not isinstance(e.get("query"), str):
            continue
        rng = e.get("range")
        if not (isinstance(rng, list) and len(rng) == 3
                and all(isinstance(x, (int, float)) for x in rng)):
            lo, step = _window(e, entries)
            if lo is None:
                continue
            rng = [lo, max((v[0] for s in e.get("result") or [] if isinstance(s, dict)
                            for v in _numbers(s.get("values") or [])), default=lo), step]
        for series in e.get("result") if isinstance(e.get("result"), list) else []:
            if not isinstance(series, dict) or not isinstance(series.get("values"), list) \
                    or _name_of(series, e["query"]) != UTIL_SERIES:
                continue
            f = _fall(series["values"])
            if f is None:
                continue
            ui = e.get("ui") if isinstance(e.get("ui"), str) else ""
            out.append(Fall(at=f[0], step=float(rng[2]), node=node, doc=doc, line=n,
                            labels=_labels(UTIL_SERIES, series.get("metric") or {}),
                            query=e["query"], ui=ui, before=f[1], after=f[2],
                            lo=float(rng[0]), hi=float(rng[1]),
                            labels_dict=tuple(_label_dict(
                                UTIL_SERIES, series.get("metric") or {}).items()),
                            points=tuple(_points(series["values"], f[0])),
                            first=_points(series["values"], f[0] - 1e12)[0][1]))
    return out


def hang_lines(found: list[Fall]) -> list[Line]:
    """Pure: the GPU (or GPUs, when two fell first within the sampling resolution) whose
    utilisation fell clearly before the others', which fell together. Needs two or more
    GPUs in the crowd; nothing when the picture is not that."""
    if len(found) < 3:
        return []
    found = sorted(found, key=lambda f: (f.at, f.node, f.labels))
    step = max(f.step for f in found)
    first = [f for f in found if f.at <= found[0].at + step]
    crowd = found[len(first):]
    if len(crowd) < 2 or len(first) >= len(crowd):
        return []
    lead = crowd[0].at - first[-1].at
    spread = crowd[-1].at - crowd[0].at
    if lead <= 2 * step or spread > lead:
        return []        # not clearly first, or the others did not fall together
    out = []
    for f in first:
        msg = (f"{UTIL_SERIES}{f.labels} fell_first at={_iso(f.at)} "
               f"lead={_num(crowd[0].at - f.at)}s others={len(crowd)} "
               f"start={_num(f.before)} end={_num(f.after)}")
        shown, graph = msg, None
        if f.ui.startswith(("http://", "https://")):
            graph = graph_url(f.ui, f.query, f.lo, f.hi)
            shown += " graph=" + graph
        out.append(Line(doc=f.doc, line=f.line, offset=0, source=Source.gpu, node=f.node,
                        rank=None, message=msg, shown=shown[:4000], ts=f.at - f.step,
                        ts_res=f.step,
                        metric={"series": UTIL_SERIES, "labels": dict(f.labels_dict),
                                "start": f.first, "end": f.after, "graph": graph,
                                "points": list(f.points)}))
    return out
