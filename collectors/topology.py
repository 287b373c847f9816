"""What several nodes depend on at once: Slurm's switches and the site's racks, PDUs, chassis
and NVLink domains (the elements a cross-job incident can name, sattrib.incidents).

Switches come from Slurm's own tree topology (TopologyPlugin=topology/tree): `topology.conf`
beside slurm.conf, or, where the controller has no such file, slurmctld's answer to `scontrol
show topology` (the same keys, plus Level= and every switch's Nodes=). A switch with Nodes= and
no Switches= is a leaf; one with Switches= is a spine and covers the nodes of the switches below
it. The rest is the site's own file (`incident_site_file`), TOML or CSV, one hostlist per
element:

    [rack]                                kind,name,nodes
    r12 = "gpu-a[001-018]"                rack,r12,"gpu-a[001-018]"
    [nvlink_domain]                       nvlink_domain,nvl72-01,"gb-[001-018]"
    nvl72-01 = "gb-[001-018]"

Parsing is pure (`switches`, `site`); `load` reads the files and asks scontrol with a deadline.
What cannot be read is a note, never an exception: without elements, failures are simply not
grouped.
"""
from __future__ import annotations

import csv
import io
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from . import probe
from ..engine.hostlist import compress, expand

# The site file's kinds, as the incident names them.
SITE_KINDS = {"rack": "rack", "pdu": "pdu", "chassis": "chassis",
              "nvlink_domain": "nvlink domain"}
MAX_BYTES = 4 << 20


@dataclass(frozen=True)
class Element:
    kind: str                   # leaf switch, spine switch, rack, pdu, chassis, nvlink domain
    name: str
    nodes: frozenset
    source: str                 # where it is declared: a file, or `scontrol show topology`
    declared: str               # the declaration, as the incident's evidence

    @property
    def label(self) -> str:
        return f"{self.kind} {self.name}"


def _fields(line: str) -> dict:
    """`SwitchName=s1 Nodes=gn[01-18] LinkSpeed=100` -> {"switchname": ..., "nodes": ...}."""
    out = {}
    for tok in line.split():
        k, eq, v = tok.partition("=")
        if eq:
            out[k.lower()] = v
    return out


def switches(text: str, source: str) -> tuple[list[Element], list[str]]:
    """The switches of a topology.conf or of `scontrol show topology`; notes on what was
    skipped. A spine's nodes are those of the switches below it (followed to any depth)."""
    decl, notes = {}, []
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        f = _fields(line)
        if not f.get("switchname"):
            continue
        decl[f["switchname"]] = (f, line)
    nodes: dict = {}

    def under(name: str, seen: frozenset) -> frozenset:
        if name in nodes:
            return nodes[name]
        f, _ = decl.get(name, ({}, ""))
        got = set(expand(f.get("nodes", "")))
        for child in expand(f.get("switches", "")):
            if child in seen or child not in decl:
                notes.append(f"{source}: switch {name} names {child}, which is "
                             + ("above it" if child in seen else "not declared"))
                continue
            got |= under(child, seen | {child})
        nodes[name] = frozenset(got)
        return nodes[name]

    out = []
    for name, (f, line) in decl.items():
        kind = "spine switch" if f.get("switches") else "leaf switch"
        covered = under(name, frozenset({name}))
        if covered:
            out.append(Element(kind, name, covered, source, line))
    return out, notes


def site(text: str, path: str) -> tuple[list[Element], list[str]]:
    """The site file's elements (TOML when its name ends in .toml, else CSV with the header
    kind,name,nodes); notes on what was skipped."""
    rows, notes = [], []
    if path.endswith(".toml"):
        import tomllib
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            return [], [f"{path}: not TOML ({e}): no site elements"]
        for kind, table in data.items():
            if not isinstance(table, dict):
                notes.append(f"{path}: {kind} is not a table of name = hostlist: skipped")
                continue
            rows += [(kind, str(name), hl) for name, hl in table.items()]
    else:
        reader = csv.DictReader(io.StringIO(text))
        if not {"kind", "name", "nodes"} <= set(reader.fieldnames or ()):
            return [], [f"{path}: the CSV needs the header kind,name,nodes: no site elements"]
        rows = [(r["kind"], r["name"], r["nodes"]) for r in reader]
    out = []
    for kind, name, hostlist in rows:
        kind = (kind or "").strip().lower()
        if kind not in SITE_KINDS:
            notes.append(f"{path}: unknown kind {kind!r} (known: {', '.join(SITE_KINDS)}): "
                         "skipped")
            continue
        nodes = frozenset(expand(hostlist)) if isinstance(hostlist, str) else frozenset()
        if not nodes or not name:
            notes.append(f"{path}: {kind} {name!r} has no nodes: skipped")
            continue
        out.append(Element(SITE_KINDS[kind], name.strip(), nodes, path,
                           f"{kind} {name.strip()} = {compress(sorted(nodes))}"))
    return out, notes


def _read(path: Path) -> Optional[str]:
    try:
        with open(path, "rb") as f:
            return f.read(MAX_BYTES).decode("utf-8", "replace")
    except OSError:
        return None


def topology_file(setting: str, env: dict) -> Optional[Path]:
    """The topology.conf to read: the setting's path, or with "auto" the one beside slurm.conf
    ($SLURM_CONF, else Slurm's default /etc/slurm/slurm.conf); None for "off"."""
    if setting == "off":
        return None
    if setting != "auto":
        return Path(setting)
    return Path(env.get("SLURM_CONF") or "/etc/slurm/slurm.conf").parent / "topology.conf"


def load(topology: str, site_file: str, deadline: float,
         env: Optional[dict] = None) -> tuple[list[Element], list[str]]:
    """Every element the controller knows of; notes on what could not be read."""
    env = os.environ if env is None else env
    out, notes = [], []
    path = topology_file(topology, env)
    text = _read(path) if path else None
    if text is not None:
        got, why = switches(text, str(path))
    elif topology == "auto":
        r = probe.run("scontrol", ["scontrol", "show", "topology"], deadline, max_bytes=MAX_BYTES)
        got, why = switches(r.out.decode("utf-8", "replace"), "scontrol show topology") \
            if r.ok else ([], [])
    else:
        got, why = [], [f"{path}: cannot be read: no switches"] if path else []
    out += got
    notes += why
    if site_file:
        text = _read(Path(site_file))
        if text is not None:
            got, why = site(text, site_file)
            out += got
            notes += why
    return out, notes
