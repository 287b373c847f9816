"""nvidia-smi output -> fact lines that rules can match, each tied to its original line.

`nvidia-smi -q` text, `-q -x` XML and `--query-gpu` CSV spell the same fields differently and
nest them by indentation or elements. The parsers below flatten every field of every GPU to one
normalized fact, `gpu=0000:52:00.0 ecc_errors.volatile.dram_uncorrectable=1`, and keep the
line number of the field in the original file, so the evidence still points at `path:line`.
Error output (`Failed to initialize NVML: ...`, `Unable to determine the device handle ...`)
passes through as it is. Pure functions; `take` runs the command with a deadline.
"""
from __future__ import annotations

import re
import xml.parsers.expat
from typing import TYPE_CHECKING, Iterator

from . import probe

if TYPE_CHECKING:
    from .node_snapshot import Take

PROBE = "nvidia-smi"
XML_NAME = "nvidia-smi.xml"      # `nvidia-smi -q -x`, as a node's Epilog takes it
ERROR_NAME = "nvidia-smi.txt"    # what it printed when it failed (evidence in itself)
FILES = (XML_NAME, ERROR_NAME)
MAX_BYTES = 16 << 20

Fact = tuple[int, str, str]   # (line number, original line, fact)

_GPU_HDR = re.compile(r"^GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])\s*$")
_FIELD = re.compile(r"^(\s*)([^:]+?)\s*:\s*(.*?)\s*$")


def key(s: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", s.strip().lower()).strip("_")


def pci(bus_id: str) -> str:
    """`00000000:1B:00.0` -> `0000:1b:00.0`."""
    b = bus_id.strip().lower()
    dom, rest = b.split(":", 1) if b.count(":") == 2 else ("0000", b)
    return f"{dom[-4:].rjust(4, '0')}:{rest}"


_RAW_ERR = re.compile(r"(Unable to determine|Failed to initialize|No devices were found|"
                      r"has failed|GPU is lost|Unknown Error|Reboot the system)", re.I)


def facts_from_q(text: str) -> Iterator[Fact]:
    gpu = None
    stack: list[tuple[int, str]] = []
    for n, raw in enumerate(text.split("\n"), 1):
        line = raw.rstrip("\r")
        if not line.strip() or line.startswith("====="):
            continue
        m = _GPU_HDR.match(line)
        if m:
            gpu, stack = pci(m.group(1)), []
            continue
        if _RAW_ERR.search(line) and not line.startswith(" "):
            yield n, line, line.strip()         # error text, not a field
            continue
        indent = len(line) - len(line.lstrip(" "))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        fm = _FIELD.match(line)
        if fm and fm.group(3) != "":
            path = ".".join([s for _, s in stack] + [key(fm.group(2))])
            yield n, line, (f"gpu={gpu} " if gpu else "") + f"{path}={fm.group(3)}"
        else:
            stack.append((indent, key(line.split(":")[0])))


def facts_from_xml(text: str) -> Iterator[Fact]:
    """`nvidia-smi -q -x`. Expat tracks line numbers and never fetches external entities."""
    out: list[Fact] = []
    lines = text.split("\n")
    path: list[str] = []
    gpu: list[str | None] = [None]
    buf: list[str] = []

    parser = xml.parsers.expat.ParserCreate()
    parser.SetParamEntityParsing(xml.parsers.expat.XML_PARAM_ENTITY_PARSING_NEVER)

    def start(name, attrs):
        if name == "gpu" and "id" in attrs:
            gpu[0] = pci(attrs["id"])
            path.clear()
            path.append("#gpu")
            return
        path.append(name)
        buf.clear()

    def end(name):
        value = "".join(buf).strip()
        buf.clear()
        if path and path[-1] == "#gpu" and name == "gpu":
            path.pop()
            gpu[0] = None
            return
        if value and path:
            ln = parser.CurrentLineNumber
            p = ".".join(x for x in path if x not in ("#gpu", "nvidia_smi_log"))
            orig = lines[ln - 1] if 0 < ln <= len(lines) else ""
            out.append((ln, orig, (f"gpu={gpu[0]} " if gpu[0] else "") + f"{p}={value}"))
        if path:
            path.pop()

    parser.StartElementHandler = start
    parser.EndElementHandler = end
    parser.CharacterDataHandler = buf.append
    try:
        parser.Parse(text, True)
    except xml.parsers.expat.ExpatError:
        out.append((parser.ErrorLineNumber, "", "xml=truncated"))
    yield from out


def facts_from_csv(text: str) -> Iterator[Fact]:
    rows = text.split("\n")
    if not rows:
        return
    head = [h.strip() for h in rows[0].split(",")]
    names = [re.sub(r"\s*\[.*?\]$", "", h) for h in head]
    for n, raw in enumerate(rows[1:], 2):
        line = raw.rstrip("\r")
        if not line.strip():
            continue
        vals = [v.strip() for v in line.split(",")]
        if len(vals) != len(names):
            yield n, line, line.strip()
            continue
        rec = dict(zip(names, vals))
        bus = rec.get("pci.bus_id") or rec.get("gpu_bus_id")
        g = f"gpu={pci(bus)} " if bus else ""
        for name, v in rec.items():
            if name and name != "pci.bus_id":
                yield n, line, f"{g}{name}={v}"


_NVL_GPU = re.compile(r"^GPU (\d+): .*\(UUID: (GPU-[0-9a-f-]+)\)")
_NVL_LINK = re.compile(r"^\s+Link (\d+): (.+)$")


def facts_from_nvlink(text: str) -> Iterator[Fact]:
    """`nvidia-smi nvlink -s`: per-GPU link speeds; `<inactive>` links become facts."""
    gpu = None
    for n, raw in enumerate(text.split("\n"), 1):
        line = raw.rstrip("\r")
        m = _NVL_GPU.match(line)
        if m:
            gpu = f"index={m.group(1)} uuid={m.group(2)}"
            continue
        m = _NVL_LINK.match(line)
        if m and gpu:
            yield n, line, f"nvlink {gpu} link={m.group(1)} state={m.group(2).strip()}"


def sniff(head: str) -> str | None:
    """Which nvidia-smi form this is, from the first bytes; None if not nvidia-smi."""
    h = head.lstrip()
    if "<nvidia_smi_log" in head[:4096]:
        return "xml"
    if "NVSMI LOG" in head[:2048] or re.search(r"^Attached GPUs\s*:", head, re.M):
        return "q"
    first = h.split("\n", 1)[0]
    if "," in first and ("pci.bus_id" in first or "driver_version" in first or
                         "uuid" in first.lower()):
        return "csv"
    if _NVL_GPU.match(h) and "Link 0:" in head:
        return "nvlink"
    if re.match(r"(Failed to initialize NVML|Unable to determine the device handle|"
                r"No devices were found|NVIDIA-SMI has failed)", h):
        return "error"
    return None


PARSERS = {"q": facts_from_q, "xml": facts_from_xml, "csv": facts_from_csv,
           "nvlink": facts_from_nvlink,
           "error": lambda t: ((n, ln, ln.strip()) for n, ln in enumerate(t.split("\n"), 1)
                               if ln.strip())}


def facts(text: str) -> Iterator[tuple[int, str, str]]:
    """(line, as printed, fact) for each field of any of the forms above."""
    return PARSERS[sniff(text[:65536]) or "error"](text)


def take(ctx: Take) -> dict[str, str]:
    r = probe.run(PROBE, [PROBE, "-q", "-x"], ctx.deadline(), max_bytes=MAX_BYTES)
    ctx.probes.append(r.record())
    if r.ok:
        return {XML_NAME: r.out.decode("utf-8", "replace")}
    # "Failed to initialize NVML: ..." and "Unable to determine the device handle ..." are
    # evidence in themselves.
    return {ERROR_NAME: (r.out + r.err).decode("utf-8", "replace")[-65536:]} if r.out or r.err \
        else {}
