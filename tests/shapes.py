"""The shapes the same evidence can arrive in, for the shape-invariance tests.

`make(case, shape)` rewrites a real case folder (CONTRACT §1) so that the same evidence arrives
the way another real emitter prints it: kernel lines as journalctl, dmesg or syslog print them,
rank lines with another launcher's prefix or none, an errno as a framework prints it, CRLF line
ends, a progress bar glued before a line, other node names. The generator reads the few line
forms the corpora hold by itself, without the engine, so that a reader's mistake cannot hide in
both sides of the comparison.

Only what a real emitter could print is written: a kernel line keeps its instant in every
shape (dmesg's monotonic clock is derived from one fixed boot time per boot), and a file whose
lines carry no wall-clock time is given one only when nothing else in the case has a clock to
compare it with. A shape that drops something the diagnosis may need says so in
`Variant.lost`, and such a variant can only be held to "no confident wrong answer":
  journal-cat, dmesg, dmesg-t   the wall clock, where another file has one to be ordered against
  journal-cat                   the non-kernel lines (it is `journalctl -k -o cat`)
  launcher-none                 the rank a prefix named, in a file whose name names none
  launcher-torchrun             the global rank an srun or mpirun label named ([defaultN] is local)
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import cached_property
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Optional

from sattrib.engine.lineparse import HOST, tagging

ANSWER_FILES = {"expected.json", "source.md", "README.md", "INDEX.md"}
RESERVED = {"slurm", "logs"}
MONTHS = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]
_MON = "(?P<mon>" + "|".join(MONTHS) + ")"
US = 1_000_000

# A boot time for logs whose lines carry no wall clock, used only when nothing else in the case
# has one; the uptime a derived monotonic clock starts at; the start of `dmesg -H` offsets.
FREE_BOOT_US = int(datetime(2024, 6, 3, 8, 0, tzinfo=timezone.utc).timestamp()) * US
UPTIME_US = 86_400 * US
RELTIME_BASE_US = 1_000 * US


@dataclass
class Case:
    """A case folder's evidence, by path relative to it (answer files left out)."""
    root: Path
    files: dict[str, bytes]
    expected: dict

    @property
    def nodes(self) -> list[str]:
        return sorted({rel.split("/", 1)[0] for rel in self.files
                       if "/" in rel and rel.split("/", 1)[0] not in RESERVED})

    @property
    def size(self) -> int:
        return sum(len(b) for b in self.files.values())

    @cached_property
    def kernel_logs(self) -> dict:
        """Each kernel log's records with both clocks filled in (journal JSON is left as it is)."""
        ref = reference_us(self)
        out = {}
        for rel in kernel_files(self):
            t = text(self.files[rel])
            if t is not None and not t.lstrip().startswith("{"):
                out[rel] = read_kernel(t, ref)
                _walls(out[rel])
        return out

    @cached_property
    def clocked(self) -> set:
        """The files with a wall clock in them."""
        return {rel for rel, data in self.files.items()
                if (t := text(data)) is not None and _CLOCK_ANY.search(t)}


@dataclass
class Variant:
    shape: str
    files: dict[str, bytes]
    lost: str = ""                  # what the shape drops that the diagnosis may need
    rename: dict[str, str] = field(default_factory=dict)
    injected_ranks: frozenset = frozenset()   # ranks a prefix now says where nothing said one

    def write(self, dest: Path) -> Path:
        for rel, data in sorted(self.files.items()):
            p = dest / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(data)
        return dest


def load(root: Path) -> Case:
    files = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if p.is_file() and not p.is_symlink() and rel not in ANSWER_FILES:
            files[rel] = p.read_bytes()
    exp = root / "expected.json"
    return Case(root, files, json.loads(exp.read_text()) if exp.is_file() else {})


def text(data: bytes) -> Optional[str]:
    """A file's text, byte for byte recoverable; None for a binary file (a pickle): kept as is."""
    return None if b"\0" in data else data.decode("utf-8", "surrogateescape")


def encode(s: str) -> bytes:
    return s.encode("utf-8", "surrogateescape")


# -- which file is what -----------------------------------------------------------------------

_KERNEL_NAME = re.compile(r"^(?:journal\.(?:log|txt)|dmesg.*|kern\.log.*|messages.*|syslog.*)$")
_JOB_NAME = re.compile(r"(?:^rank[-_.]?\d+|\.(?:out|err|stderr|stdout|log)(?:\.\d+)?$)")
# A package manager's log in a node's folder is the node's record, not the job's output.
_NODE_LOG = re.compile(r"^(?:apt|dpkg|yum|dnf)\b")
_RANK_IN_NAME = re.compile(r"rank[-_.]?(\d+)", re.I)


def kernel_files(case: Case) -> list[str]:
    return [rel for rel in case.files if rel.count("/") == 1 and not rel.startswith("slurm/")
            and not rel.startswith("logs/") and _KERNEL_NAME.match(rel.split("/")[1])]


def job_files(case: Case) -> list[str]:
    out = []
    for rel in case.files:
        top, _, name = rel.rpartition("/")
        if rel.startswith("slurm/") or text(case.files[rel]) is None:
            continue
        if rel.startswith("logs/") or (top and _JOB_NAME.search(name) and not
                                      _KERNEL_NAME.match(name) and not _NODE_LOG.match(name)):
            out.append(rel)
    return sorted(out)


# -- time ---------------------------------------------------------------------------------------

_ISO_ANY = re.compile(r"(\d{4})-(\d\d)-(\d\d)[T ](\d\d):(\d\d):(\d\d)")
# Any wall clock a reader could order lines by: ISO, syslog at a line's start, ctime (dmesg -T,
# nvidia-smi's Timestamp).
_CLOCK_ANY = re.compile(r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d|^" + _MON + r" [ \d]\d \d\d:\d\d:\d\d"
                        r"|\w{3} \w{3} [ \d]\d \d\d:\d\d:\d\d \d{4}", re.M)


def reference_us(case: Case) -> Optional[int]:
    """The case's first full date (the scheduler's record first): what a year-less syslog stamp
    is read against, as the logs' own reader would."""
    for rel in sorted(case.files, key=lambda r: (not r.startswith("slurm/"), r)):
        t = text(case.files[rel])
        m = _ISO_ANY.search(t) if t else None
        if m:
            y, mo, d, h, mi, s = map(int, m.groups())
            return int(datetime(y, mo, d, h, mi, s, tzinfo=timezone.utc).timestamp()) * US
    return None


def _epoch_us(y, mo, d, h, mi, s, frac: str = "") -> int:
    base = int(datetime(y, mo, d, h, mi, s, tzinfo=timezone.utc).timestamp()) * US
    return base + int((frac or "0")[:6].ljust(6, "0"))


def _year_near(mon: int, day: int, ref_us: Optional[int]) -> int:
    if ref_us is None:
        return 2025
    ref = datetime.fromtimestamp(ref_us / US, timezone.utc)
    return min((ref.year - 1, ref.year, ref.year + 1), key=lambda y: abs(
        datetime(y, mon, min(day, 28), tzinfo=timezone.utc).timestamp() - ref.timestamp()))


# -- kernel logs: read ------------------------------------------------------------------------

@dataclass
class Rec:
    """One record of a kernel/system log: what every shape prints, in its own way."""
    msg: str = ""
    wall_us: Optional[int] = None
    precise: bool = False           # the source gave the wall clock below the second
    mono_us: Optional[int] = None
    host: Optional[str] = None
    ident: str = "kernel"
    pid: Optional[str] = None
    cont: list = field(default_factory=list)     # further lines of the same record
    boot: int = 0
    raw: Optional[str] = None       # a line kept as it is: blank, "...", journal separators

    @property
    def kernel(self) -> bool:
        return self.raw is None and self.ident == "kernel"


_HOST_IDENT = r" (?P<host>[^\s:\[\]]+) (?P<ident>[^\s:\[\]]+)(?:\[(?P<pid>\d+)\])?: (?P<msg>.*)$"
_SYSLOG = re.compile(r"^" + _MON + r" (?P<d>[ \d]?\d) (?P<t>\d\d:\d\d:\d\d)(?:\.(?P<f>\d{1,9}))?"
                     + _HOST_IDENT)
# rsyslog's template without the host: "Mar 27 17:40:36 kernel: ...".
_SYSLOG_NOHOST = re.compile(r"^" + _MON + r" (?P<d>[ \d]?\d) (?P<t>\d\d:\d\d:\d\d)"
                            r"(?:\.(?P<f>\d{1,9}))? (?P<ident>kernel): (?P<msg>.*)$")
_ISOLOG = re.compile(r"^(?P<date>\d{4}-\d\d-\d\d)T(?P<t>\d\d:\d\d:\d\d)(?:\.(?P<f>\d{1,9}))?"
                     r"(?P<tz>Z|[+-]\d\d:?\d\d)" + _HOST_IDENT)
_TALOS = re.compile(r"^(?P<host>[\w.:-]+): kern: *\w+: \[(?P<date>\d{4}-\d\d-\d\d)T"
                    r"(?P<t>\d\d:\d\d:\d\d)(?:\.(?P<f>\d{1,9}))?Z\]: (?P<msg>.*)$")
_DMESG_T = re.compile(r"^\[\w{3} " + _MON + r" (?P<d>[ \d]?\d) (?P<t>\d\d:\d\d:\d\d) "
                      r"(?P<y>\d{4})\] (?P<msg>.*)$")
# A kernel line as admins paste it, without its time stamp: "kernel: NVRM: ...".
_PASTED = re.compile(r"^(?:(?P<host>[A-Za-z0-9][\w.-]{0,63}) )?kernel: (?P<msg>.*)$")
_MONO = re.compile(r"^\[ *(?P<s>\d+)\.(?P<f>\d{1,9})\] (?P<msg>.*)$")
_RELTIME = re.compile(r"^\[ *\+ *(?P<s>\d+)\.(?P<f>\d{1,9})\] (?P<msg>.*)$")
_SEPARATOR = re.compile(r"^-- (?:Boot [0-9a-f]+|Logs begin at .*|No entries|Reboot) --$")
_ELISION = re.compile(r"^\s*(?:\.\.\.|…|\[\.\.\.\])\s*$")


def _tz_us(tz: str) -> int:
    if tz == "Z":
        return 0
    sign = -1 if tz[0] == "-" else 1
    d = tz[1:].replace(":", "")
    return sign * (int(d[:2]) * 3600 + int(d[2:4]) * 60) * US


def _clock(t: str) -> tuple[int, int, int]:
    h, mi, s = t.split(":")
    return int(h), int(mi), int(s)


def _mono_us(s: str, f: str) -> int:
    return int(s) * US + int(f[:6].ljust(6, "0"))


def _parse_line(line: str, ref_us: Optional[int], rel_us: list) -> Rec:
    if (m := _SYSLOG.match(line) or _SYSLOG_NOHOST.match(line)):
        mon = MONTHS.index(m["mon"]) + 1
        y = _year_near(mon, int(m["d"]), ref_us)
        g = m.groupdict()
        rec = Rec(m["msg"], _epoch_us(y, mon, int(m["d"]), *_clock(m["t"]), m["f"]), bool(m["f"]),
                  host=g.get("host"), ident=m["ident"], pid=g.get("pid"))
    elif (m := _ISOLOG.match(line)):
        y, mo, d = map(int, m["date"].split("-"))
        rec = Rec(m["msg"], _epoch_us(y, mo, d, *_clock(m["t"]), m["f"]) - _tz_us(m["tz"]),
                  bool(m["f"]), host=m["host"], ident=m["ident"], pid=m["pid"])
    elif (m := _TALOS.match(line)):
        y, mo, d = map(int, m["date"].split("-"))
        rec = Rec(m["msg"], _epoch_us(y, mo, d, *_clock(m["t"]), m["f"]), bool(m["f"]),
                  host=m["host"])
    elif (m := _DMESG_T.match(line)):
        mon = MONTHS.index(m["mon"]) + 1
        rec = Rec(m["msg"], _epoch_us(int(m["y"]), mon, int(m["d"]), *_clock(m["t"])))
    elif (m := _MONO.match(line)):
        return Rec(m["msg"], mono_us=_mono_us(m["s"], m["f"]))
    elif (m := _RELTIME.match(line)):
        rel_us[0] += _mono_us(m["s"], m["f"])
        return Rec(m["msg"], mono_us=rel_us[0])
    elif (m := _PASTED.match(line)):
        return Rec(m["msg"], host=m["host"])
    else:
        return Rec(line)
    if rec.ident == "kernel" and (m := _MONO.match(rec.msg)):
        rec.msg, rec.mono_us = m["msg"], _mono_us(m["s"], m["f"])
    return rec


@dataclass
class KernelLog:
    recs: list
    clock: str                      # "wall", "mono" or "none": what its lines' stamps give
    boots: int
    ends_newline: bool


def read_kernel(t: str, ref_us: Optional[int]) -> KernelLog:
    recs: list[Rec] = []
    boot = 0
    rel_us = [RELTIME_BASE_US]
    lines = t.split("\n")
    ends = lines[-1] == ""
    for line in lines[:-1] if ends else lines:
        line = line.rstrip("\r")
        if _SEPARATOR.match(line):
            boot += line.startswith("-- Boot")
            recs.append(Rec(raw=line, boot=boot))
        elif not line.strip() or _ELISION.match(line):
            recs.append(Rec(raw=line, boot=boot))
        elif line[:1].isspace() and recs and recs[-1].raw is None:
            recs[-1].cont.append(line.strip())
        else:
            rec = _parse_line(line, ref_us, rel_us)
            rec.boot = boot
            recs.append(rec)
    real = [r for r in recs if r.raw is None]
    clock = ("wall" if any(r.wall_us is not None for r in real) else
             "mono" if any(r.mono_us is not None for r in real) else "none")
    _fill_gaps(real, clock)
    return KernelLog(recs, clock, boot + 1, ends)


def _fill_gaps(recs: list, clock: str) -> None:
    """A line the source printed without its stamp (pasted alone) takes its neighbour's: the
    emitter printed one, and order within the file is all the source said. A file with no
    stamps at all gets a monotonic clock one microsecond a line."""
    attr = {"wall": "wall_us", "mono": "mono_us"}.get(clock)
    if attr is None:
        for i, r in enumerate(recs):
            r.mono_us = RELTIME_BASE_US + i
        return
    known = [getattr(r, attr) for r in recs if getattr(r, attr) is not None]
    last = known[0]
    for r in recs:
        if getattr(r, attr) is None:
            setattr(r, attr, last)
        last = getattr(r, attr)


# -- kernel logs: write -----------------------------------------------------------------------

def _walls(log: KernelLog) -> None:
    """Every record's wall clock to the microsecond, and its monotonic clock, consistent: one
    boot time per boot (from a line that gave both, else the first line less a fixed uptime)."""
    real = [r for r in log.recs if r.raw is None]
    if log.clock != "wall":
        for r in real:
            r.wall_us, r.precise = FREE_BOOT_US + r.mono_us, True
        return
    for r in real:
        if not r.precise and r.mono_us is not None:
            r.wall_us += r.mono_us % US       # the printk time's fraction, inside the same second
            r.precise = True
    for b in range(log.boots):
        seg = [r for r in real if r.boot == b]
        both = [r for r in seg if r.mono_us is not None]
        boot = both[0].wall_us - both[0].mono_us if both else (
            seg[0].wall_us // US * US - UPTIME_US if seg else 0)
        for r in seg:
            if r.mono_us is None:
                r.mono_us = r.wall_us - boot


def _fmt_us(us: int, fmt: str) -> str:
    return datetime.fromtimestamp(us // US, timezone.utc).strftime(fmt)


def _day(us: int, pad: str) -> str:
    d = datetime.fromtimestamp(us // US, timezone.utc).day
    return f"{d:02d}" if pad == "0" else f"{d:>2}"


def _mono_text(us: int) -> str:
    return f"[{us // US:5d}.{us % US:06d}]"


def _stamp(r: Rec, shape: str) -> str:
    w = r.wall_us
    if shape == "journal-short":
        return _fmt_us(w, "%b ") + _day(w, "0") + _fmt_us(w, " %H:%M:%S")
    if shape == "journal-short-iso":
        return _fmt_us(w, "%Y-%m-%dT%H:%M:%S+0000")
    if shape == "journal-short-precise":
        return _fmt_us(w, "%b ") + _day(w, "0") + _fmt_us(w, " %H:%M:%S") + f".{w % US:06d}"
    if shape == "syslog":
        return _fmt_us(w, "%b ") + _day(w, " ") + _fmt_us(w, " %H:%M:%S")
    if shape == "dmesg-T":
        return _fmt_us(w, "[%a %b ") + _day(w, " ") + _fmt_us(w, " %H:%M:%S %Y]")
    if shape == "dmesg":
        return _mono_text(r.mono_us)
    return ""


def _line(r: Rec, shape: str, host: str) -> list[str]:
    if shape in ("journal-cat", "dmesg-t"):
        return [r.msg] + r.cont
    stamp = _stamp(r, shape)
    who = ""
    if shape.startswith("dmesg"):
        head = stamp + " "
    else:
        who = "kernel" if r.kernel else r.ident + (f"[{r.pid}]" if r.pid else "")
        mono = _mono_text(r.mono_us) + " " if shape == "syslog" and r.kernel else ""
        head = f"{stamp} {host} {who}: {mono}"
    if shape == "syslog":
        # syslog writes each further line of a record as a line of its own, stamped the same
        return [head + r.msg] + [f"{stamp} {host} {who}: {c}" for c in r.cont]
    # dmesg and journalctl indent a record's further lines under its first one
    return [head + r.msg] + [" " * len(head) + c for c in r.cont]


def _json(r: Rec, host: str, n: int, boot_id: str) -> str:
    rec = {"__CURSOR": f"s=shape;i={n:x}", "__REALTIME_TIMESTAMP": str(r.wall_us),
           "__MONOTONIC_TIMESTAMP": str(r.mono_us), "_BOOT_ID": boot_id,
           "_TRANSPORT": "kernel" if r.kernel else "syslog", "PRIORITY": "4" if r.kernel else "6",
           "SYSLOG_FACILITY": "0" if r.kernel else "3",
           "SYSLOG_IDENTIFIER": "kernel" if r.kernel else r.ident, "_HOSTNAME": host,
           "MESSAGE": "\n".join([r.msg] + r.cont)}
    if r.pid and not r.kernel:
        rec["_PID"] = r.pid
    return json.dumps(rec, ensure_ascii=False)


KERNEL_SHAPES = ("journal-short", "journal-short-iso", "journal-short-precise", "journal-json",
                 "journal-cat", "dmesg", "dmesg-T", "dmesg-t", "syslog")
_NEEDS_WALL = {"journal-short", "journal-short-iso", "journal-short-precise", "journal-json",
               "dmesg-T", "syslog"}
_NO_WALL = {"journal-cat", "dmesg", "dmesg-t"}          # no wall clock: orders one file only
_JOURNAL_TEXT = {"journal-short", "journal-short-iso", "journal-short-precise"}
_KERNEL_ONLY = {"journal-cat", "dmesg", "dmesg-T", "dmesg-t"}   # -k / the ring buffer


def _host(r: Rec, rel: str) -> str:
    """The host a journal or syslog names: the source's, or the node the folder is named after."""
    if r.host and not r.host[0].isdigit() and r.host != "localhost":
        return r.host
    return rel.split("/")[0]


def _other_clocks(case: Case, rel: str) -> bool:
    return bool(case.clocked - {rel})


def kernel_shape(case: Case, shape: str) -> Optional[Variant]:
    files, lost = dict(case.files), []
    for rel, log in case.kernel_logs.items():
        real = [r for r in log.recs if r.raw is None]
        others = _other_clocks(case, rel)
        if not real or (shape in _NEEDS_WALL and log.clock != "wall" and others):
            continue            # the emitter would print a wall clock nothing here can give
        if shape in _KERNEL_ONLY and shape != "journal-cat" and (
                log.boots > 1 or not all(r.kernel for r in real)):
            continue            # dmesg prints this boot's ring buffer only
        out = encode(_write_kernel(log, shape, rel))
        if out == case.files[rel]:
            continue
        if shape in _NO_WALL and log.clock == "wall" and others:
            lost.append(f"{rel}: the wall clock that orders it against the other files")
        if shape == "journal-cat" and not all(r.kernel for r in real):
            lost.append(f"{rel}: its non-kernel lines (journalctl -k)")
        name = rel if shape != "journal-json" else re.sub(r"(?:\.log|\.txt)?$", ".jsonl", rel, 1)
        del files[rel]
        files[name] = out
    if files == case.files:
        return None
    return Variant(shape, files, "; ".join(lost))


def _write_kernel(log: KernelLog, shape: str, rel: str) -> str:
    out = []
    for n, r in enumerate(log.recs):
        if r.raw is not None:
            # blank and elided lines stay; only journalctl's text shapes print its separators
            if shape != "journal-json" and (shape in _JOURNAL_TEXT or not _SEPARATOR.match(r.raw)):
                out.append(r.raw)
            continue
        if shape in _KERNEL_ONLY and not r.kernel:
            continue
        host = _host(r, rel)
        if shape == "journal-json":
            out.append(_json(r, host, n + 1, f"{r.boot + 1:032x}"))
        else:
            out.extend(_line(r, shape, host))
    return "\n".join(out) + ("\n" if log.ends_newline or shape == "journal-json" else "")


# -- job output: launcher prefixes ------------------------------------------------------------

_SRUN = re.compile(r"^ {0,6}(\d{1,7}): ")
_MPI = re.compile(r"^\[\d{1,7},(\d{1,7})\]<(?:stdout|stderr|stddiag)>: ?")
_DEFAULT = re.compile(r"^\[default(\d{1,5})\]: ?")
_HOST = re.compile(r"^[A-Za-z0-9][\w.-]{0,63}: ")       # pdsh: a host, not a rank
_TORCH_RANK = re.compile(r"^\[rank(\d{1,7})\]: ?")
LAUNCHERS = ("srun", "mpi", "torchrun", "torch-rank", "none")
_OWN = {"srun": _SRUN, "mpi": _MPI, "torchrun": _DEFAULT}


def _outer(lines: list) -> Optional[re.Pattern]:
    """The prefix a launcher put on this file's lines: srun -l labels (most) lines, Open MPI's
    --tag-output and torchrun's worker tags are unmistakable on any line."""
    body = [ln for ln in lines if ln.strip()]
    if body and sum(1 for ln in body if _SRUN.match(ln)) * 2 >= len(body):
        return _SRUN
    for pat in (_MPI, _DEFAULT):
        if any(pat.match(ln) for ln in body):
            return pat
    return None


def _prefix(target: str, rank: int, width: int) -> str:
    return {"srun": f"{rank:>{width}}: ", "mpi": f"[1,{rank}]<stderr>:",
            "torchrun": f"[default{rank}]:", "torch-rank": f"[rank{rank}]: "}[target]


# Lines the launcher or Slurm print themselves (srun's own messages, slurmstepd, a daemon's
# log): no task prefix is ever put on them.
_OWN_LINE = re.compile(r"^(?:srun|salloc|sbatch|slurmstepd(?:-[\w.-]+)?|slurmd)(?:\[\d+\])?: "
                       r"|^\[\d{4}-\d\d-\d\dT")


def _relabel(lines: list, outer, rank: Optional[int], target: str) -> tuple[list, bool]:
    """(lines with `target`'s prefix where a rank is known, whether a rank was dropped)."""
    ranks = [int(m.group(1)) for ln in lines if outer and (m := outer.match(ln))]
    width = len(str(max(ranks + [rank or 0])))
    out, dropped = [], False
    for ln in lines:
        m = outer.match(ln) if outer else None
        if m:
            r, body = int(m.group(1)), ln[m.end():]
        elif outer is None and ln.strip() and not _OWN_LINE.match(ln):
            r, body = rank, ln
        else:
            out.append(ln)                   # the batch script's own lines carry no label
            continue
        inner = _TORCH_RANK.match(body)
        if target in ("none", "torch-rank") and inner and (r is None or int(inner[1]) == r):
            r, body = int(inner[1]), body[inner.end():]
        if target == "none":
            dropped |= (m is not None and r is not None) or inner is not None
            out.append(body)
        elif r is None:
            out.append(ln)
        else:
            out.append(_prefix(target, r, width) + body)
    return out, dropped


def launcher_shape(case: Case, target: str) -> Optional[Variant]:
    files, lost, injected = dict(case.files), [], set()
    unlabelled = [rel for rel in job_files(case) if not rel.startswith("logs/")
                  and not _RANK_IN_NAME.search(rel.rsplit("/", 1)[1])]
    for rel in job_files(case):
        t = text(case.files[rel])
        lines = t.split("\n")
        outer = _outer(lines)
        if outer is not None and outer is _OWN.get(target):
            continue                              # already in this launcher's shape
        m = _RANK_IN_NAME.search(rel.rsplit("/", 1)[1])
        rank = int(m.group(1)) if m else None
        if outer is None and rank is None and rel in unlabelled and target != "none":
            rank = unlabelled.index(rel)          # one task's output: srun -l says task N
        out, dropped = _relabel(lines, outer, rank, target)
        if out == lines:
            continue
        if outer is None and m is None and rank is not None:
            injected.add(rank)
        if dropped and m is None:
            lost.append(f"{rel}: the ranks its prefixes named")
        if target == "torchrun" and outer is not None:
            lost.append(f"{rel}: global ranks ([defaultN] is the local rank)")
        files[rel] = encode("\n".join(out))
    if files == case.files:
        return None
    return Variant(f"launcher-{target}", files, "; ".join(lost),
                   injected_ranks=frozenset(injected))


# -- job output: errno, progress bars, line ends ----------------------------------------------

_ERRNO = re.compile(r"(?:\b(?P<exc>\w*(?:Error|Exception)): )?\[Errno \d+\] ")


def errno_shape(case: Case) -> Optional[Variant]:
    """Python's `OSError: [Errno 5] Input/output error` as a framework raises the same failure:
    `RuntimeError: ... failed with Input/output error` (the strerror text only)."""
    files = dict(case.files)
    for rel in job_files(case):
        t = text(case.files[rel])
        if "[Errno " not in t:
            continue
        new = _ERRNO.sub(lambda m: ("RuntimeError: " if m["exc"] else "") + "I/O failed with ",
                         t)
        if new != t:
            files[rel] = encode(new)
    return None if files == case.files else Variant("errno-strerror", files)


BAR = ("\r  0%|          | 0/250 [00:00<?, ?it/s]"
       "\r 42%|████▏     | 105/250 [00:31<00:43,  3.35it/s]")


def progress_shape(case: Case, focus: set) -> Optional[Variant]:
    """tqdm's bar, redrawn with `\\r` and never ended with a newline, glued before the line
    printed next: before each cited job-output line (`focus`: (path, 1-based line)), else before
    each job-output file's last line. A launcher's label stays first, it labels whole lines."""
    files = dict(case.files)
    jobs = job_files(case)
    want = {(p, n) for p, n in focus if p in jobs}
    for rel in jobs:
        lines = text(case.files[rel]).split("\n")
        outer = _outer(lines) or (_HOST if tagging(lines) == HOST else None)
        targets = {n - 1 for p, n in want if p == rel}
        if not want:
            filled = [i for i, ln in enumerate(lines) if ln.strip()]
            targets = set(filled[-1:])
        for i in sorted(t for t in targets if t < len(lines)):
            m = outer.match(lines[i]) if outer else None
            cut = m.end() if m else 0
            lines[i] = lines[i][:cut] + BAR + lines[i][cut:]
        if targets:
            files[rel] = encode("\n".join(lines))
    return None if files == case.files else Variant("progress-bar", files)


def crlf_shape(case: Case) -> Optional[Variant]:
    """Every text file with Windows line ends, as logs copied through a Windows desktop are."""
    files = {}
    for rel, data in case.files.items():
        t = text(data)
        files[rel] = data if t is None else encode(re.sub(r"(?<!\r)\n", "\r\n", t))
    return Variant("crlf", files)


# -- node names -------------------------------------------------------------------------------

# A host list standing as a field's value (`NodeList=gpu-a[017-024]`, a sacct column).
_HOSTLIST = re.compile(r"(?:(?<=[=|\s])|^)([A-Za-z][\w-]*?)\[([\d,\-]+)\](?=$|[\s|,])", re.M)
_NAMED = re.compile(r"\b(?:NodeList|BatchHost|Nodes|ReqNodeList|SchedNodeList)="
                    r"([A-Za-z][\w.-]*)(?=$|\s)", re.M)


def _expand(prefix: str, spec: str) -> list[str]:
    out = []
    for part in spec.split(","):
        a, _, b = part.partition("-")
        for i in range(int(a), int(b or a) + 1):
            out.append(f"{prefix}{i:0{len(a)}d}")
    return out


# Hosts the job's own output names: NCCL's `host:pid:tid [dev]`, srun's and slurmstepd's errors.
_OUTPUT_HOST = re.compile(r"^(?:\s*\d+: |\[[^\]]{1,40}\]:? ?)*([A-Za-z][\w.-]*):\d+:\d+ \[\d+\] "
                          r"|srun: error: ([A-Za-z][\w.-]*): task|\*\*\* (?:STEP|JOB) \S+ ON "
                          r"([A-Za-z][\w.-]*) CANCELLED", re.M)


def node_names(case: Case, extra=()) -> set:
    """The job's node names: its folders, the scheduler's host lists, the hosts its output
    names, the expected culprits and whatever the caller knows (the names a diagnosis gave)."""
    names = set(case.nodes) | {n for n in extra if n}
    names |= {n for n in case.expected.get("culprit_nodes") or []}
    for rel, data in case.files.items():
        if rel.startswith("slurm/") and (t := text(data)):
            for m in _HOSTLIST.finditer(t):
                names.update(_expand(m[1], m[2]))
            names.update(m[1] for m in _NAMED.finditer(t) if "[" not in m[1])
    for rel in job_files(case):
        names.update(h for m in _OUTPUT_HOST.finditer(text(case.files[rel])) for h in m.groups()
                     if h)
    return {n.split(".")[0] for n in names if n not in ("localhost", "(null)", "None")}


def rename_map(names: set) -> tuple[dict, dict]:
    """Old name -> new name, and old host-list prefix -> new: each name keeps its number and
    gets a new stem, so `gpu-a[017-024]` stays a host list of the same nodes, in the same order."""
    parts = {n: re.match(r"^(.*?)(\d*)$", n).groups() for n in names}
    stems = sorted({p for p, _ in parts.values()})
    new = {s: f"rn{chr(ord('a') + i)}-" if i < 26 else f"rn{i}-" for i, s in enumerate(stems)}
    return {n: new[p] + (d or "x") for n, (p, d) in parts.items()}, new


def rename_shape(case: Case, extra=()) -> Optional[Variant]:
    names = node_names(case, extra)
    if not names:
        return None
    mapping, stems = rename_map(names)
    word = re.compile(r"(?<![A-Za-z0-9])(" + "|".join(
        re.escape(n) for n in sorted(names, key=len, reverse=True)) + r")(?![A-Za-z0-9])")
    lists = [s for s in sorted(stems, key=len, reverse=True) if s]
    stem = re.compile(r"(?<![\w.-])(" + "|".join(map(re.escape, lists)) +
                      r")(?=\[[\d,\-]+\](?:$|[\s|,]))", re.M) if lists else None

    def sub(s: str) -> str:
        s = word.sub(lambda m: mapping[m[1]], s)
        return stem.sub(lambda m: stems[m[1]], s) if stem else s
    files = {}
    for rel, data in case.files.items():
        t = text(data)
        files["/".join(sub(p) for p in rel.split("/"))] = data if t is None else encode(sub(t))
    return Variant("rename-nodes", files, rename=mapping)


# -- all shapes -------------------------------------------------------------------------------

SHAPES: dict[str, Callable] = {
    **{s: (lambda case, focus, names, s=s: kernel_shape(case, s)) for s in KERNEL_SHAPES},
    **{f"launcher-{t}": (lambda case, focus, names, t=t: launcher_shape(case, t))
       for t in LAUNCHERS},
    "errno-strerror": lambda case, focus, names: errno_shape(case),
    "progress-bar": lambda case, focus, names: progress_shape(case, focus),
    "crlf": lambda case, focus, names: crlf_shape(case),
    "rename-nodes": lambda case, focus, names: rename_shape(case, names),
}
def make(case: Case, shape: str, focus=(), names=()) -> Optional[Variant]:
    """The case in `shape`, or None where the shape changes nothing in it."""
    return SHAPES[shape](case, set(focus), tuple(names))


def applies(case: Case, shape: str) -> bool:
    """Whether the shape changes something in the case (one that needs the original's diagnosis
    applies wherever the case has what it rewrites: job output, node names of its own)."""
    if shape == "progress-bar":
        return bool(job_files(case))
    if shape == "rename-nodes":
        return bool(node_names(case))
    return make(case, shape) is not None


def applicable(case: Case) -> list[str]:
    return [shape for shape in SHAPES if applies(case, shape)]
