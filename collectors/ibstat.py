"""InfiniBand / RoCE port state -> fact lines.

Reads `ibstat` text, iproute2's `rdma link` (`link mlx5_7/1 ... state DOWN physical_state
POLLING`, one reading per line: a port polled over time shows its flaps) and the flattened
sysfs form sattrib's node snapshot writes (`take`: `mlx5_0/ports/1/state<TAB>4: ACTIVE`, one
file per line). Each port becomes one fact,
`ib hca=mlx5_3 port=1 state=Down phys=Polling layer=Ethernet`, tied to the line of its state;
error counters become `ib hca=mlx5_3 port=1 counter.link_downed=2`.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

if TYPE_CHECKING:
    from .node_snapshot import Take

NAME = "ibstat.txt"

_CA = re.compile(r"^CA '([^']+)'")
_PORT = re.compile(r"^\s+Port (\d+):")
_KV = re.compile(r"^\s+([A-Za-z ]+):\s*(.*?)\s*$")
_RDMA = re.compile(r"^link (?P<hca>[\w.-]+)/(?P<port>\d+) .*?\bstate (?P<state>[A-Z_]+) "
                   r"physical_state (?P<phys>[A-Z_]+)")
_SYSFS = re.compile(r"^([\w.-]+)/ports/(\d+)/(state|phys_state|link_layer|rate|counters/\w+)\t(.*)$")
_COUNTERS = {"link_downed", "link_error_recovery", "symbol_error", "port_rcv_errors",
             "local_link_integrity_errors", "port_rcv_remote_physical_errors",
             "excessive_buffer_overrun_errors", "port_xmit_discards"}


def sniff(text: str) -> bool:
    return bool(re.search(r"^CA '[^']+'", text, re.M) and "Port " in text) or \
        bool(re.search(r"^[\w.-]+/ports/\d+/(state|phys_state)\t", text, re.M)) or \
        bool(_RDMA.search(text.split("\n", 1)[0]))


def _fact(hca, port, f):
    parts = [f"ib hca={hca} port={port}"]
    for k in ("state", "phys", "layer", "rate"):
        if k in f:
            parts.append(f"{k}={f[k]}")
    return " ".join(parts)


def facts(text: str) -> Iterator[tuple[int, str, str]]:
    lines = text.split("\n")
    hca = port = None
    cur: dict = {}
    at = None

    def flush():
        if hca and port and at:
            yield at[0], at[1], _fact(hca, port, cur)

    sysfs: dict = {}
    for n, raw in enumerate(lines, 1):
        line = raw.rstrip("\r")
        m = _SYSFS.match(line)
        if m:
            h, p, k, v = m.groups()
            rec = sysfs.setdefault((h, p), {"_line": (n, line)})
            if k == "state":
                rec["state"] = v.split(":")[-1].strip().capitalize()
                rec["_line"] = (n, line)
            elif k == "phys_state":
                rec["phys"] = v.split(":")[-1].strip()
            elif k == "link_layer":
                rec["layer"] = v.strip()
            elif k.startswith("counters/") and k[9:] in _COUNTERS and v.strip().isdigit() \
                    and int(v) > 0:
                yield n, line, f"ib hca={h} port={p} counter.{k[9:]}={int(v)}"
            continue
        m = _RDMA.match(line)
        if m:
            phys = "".join(w.capitalize() for w in m["phys"].split("_"))     # ibstat's words
            yield n, line, _fact(m["hca"], m["port"], {"state": m["state"].capitalize(),
                                                       "phys": phys})
            continue
        m = _CA.match(line)
        if m:
            yield from flush()
            hca, port, cur, at = m.group(1), None, {}, None
            continue
        m = _PORT.match(line)
        if m:
            yield from flush()
            port, cur, at = m.group(1), {}, None
            continue
        m = _KV.match(line)
        if m and port:
            k, v = m.group(1).strip().lower(), m.group(2)
            if k == "state":
                cur["state"], at = v, (n, line)
            elif k == "physical state":
                cur["phys"] = v
            elif k == "link layer":
                cur["layer"] = v
            elif k == "rate":
                cur["rate"] = v
    yield from flush()
    for (h, p), rec in sorted(sysfs.items()):
        if "state" in rec:
            yield rec["_line"][0], rec["_line"][1], _fact(h, p, rec)


def ib_ports(root: str = "/sys/class/infiniband", max_files: int = 4000) -> str:
    """Port state and error counters of every HCA, flattened `path<TAB>value` per line."""
    base = Path(root)
    if not base.is_dir():
        return ""
    lines = []
    n = 0
    for hca in sorted(os.listdir(base)):
        ports = base / hca / "ports"
        try:
            port_names = sorted(os.listdir(ports))
        except OSError:
            continue
        for port in port_names:
            rel = f"{hca}/ports/{port}"
            files = ["state", "phys_state", "link_layer", "rate"] + [
                f"counters/{c}" for c in ("link_downed", "link_error_recovery", "symbol_error",
                                          "port_rcv_errors", "local_link_integrity_errors",
                                          "port_rcv_remote_physical_errors",
                                          "excessive_buffer_overrun_errors",
                                          "port_xmit_discards")]
            for f in files:
                n += 1
                if n > max_files:
                    return "\n".join(lines) + "\n"
                try:
                    with open(base / hca / "ports" / port / f, "rb") as fh:
                        val = fh.read(256).decode("utf-8", "replace").strip()
                except OSError:
                    continue
                lines.append(f"{rel}/{f}\t{val}")
    return "\n".join(lines) + ("\n" if lines else "")


def take(ctx: Take) -> dict[str, str]:
    ib = ib_ports(ctx.ib_root)
    return {NAME: ib} if ib else {}
