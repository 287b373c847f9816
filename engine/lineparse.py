"""Log line prefixes: timestamps, hosts, ranks and syslog identifiers, in the common forms.

Pure functions over one line. `split_prefix` peels the prefixes that log paths add (srun -l,
pdsh's host tags, syslog / ISO / dmesg / kmsg, torch's `[rankN]:`) and reports what they said;
rules then match the remaining message. Timestamps come back as naive parts plus a resolution;
turning a year-less `Mon DD HH:MM:SS` into an instant needs a reference time, which
`TimeContext` holds.
"""
from __future__ import annotations

import calendar
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Optional

MONTHS = {m: i for i, m in enumerate(
    ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"], 1)}

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-Z\\-_]")
_CTRL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")

_SRUN = re.compile(r"^ {0,6}(\d{1,7}): ")
# pdsh (DeepSpeed's multi-node launcher, clush, pssh -i) tags each line with its host: "node-01: ".
_HOST_TAG = re.compile(r"^(?P<host>[A-Za-z0-9][\w.-]{0,63}): ")
# What a whole file's lines are tagged with (a file is sniffed once, `tagging`).
SRUN, HOST = "srun", "host"
_RANKTAG = re.compile(r"^\[rank(\d{1,7})\]: ?")
_ISO = (r"(?P<iso>(?P<y>\d{4})-(?P<mo>\d\d)-(?P<d>\d\d)[T ](?P<h>\d\d):(?P<mi>\d\d):(?P<s>\d\d)"
        r"(?:[.,](?P<frac>\d{1,9}))?(?P<tz>Z|[+-]\d\d:?\d\d)?)")
# Open MPI's --tag-output "[jobid,rank]<stdout>:" (after --timestamp-output's "ISO: ").
_MPI_TAG = re.compile(r"^(?:" + _ISO.replace("(?P<", "(?P<m_") + r": )?\[\d{1,7},(?P<mrank>\d{1,7})\]"
                      r"<(?:stdout|stderr|stddiag)>: ?")
# Launchers that tag each line with a worker name: torchrun --tee "[default0]:", Paddle's
# "[trainer3]:" / "[trainer0|0]:", Ray's "(pid=4242, ip=10.0.0.1) " / "(Worker pid=4242) ".
_WORKER_TAG = re.compile(r"^\[(?:default|trainer|worker|local_rank|localrank)\d{1,5}(?:\|\d{1,5})?\]: ?")
_RAY_TAG = re.compile(r"^\((?:[\w.:-]+ )?pid=\d+(?:, ip=(?P<rip>[\w.:-]+))?\) ")
# The labels above as a line opens with them, before any progress bar a program drew.
_LABEL = re.compile(r"^(?:\[\d{1,7},\d{1,7}\]<(?:stdout|stderr|stddiag)>:|\[(?:default|trainer|"
                    r"worker|local_rank|localrank)\d{1,5}(?:\|\d{1,5})?\]:|\[rank\d{1,7}\]:)")
_SYSLOG_TS = (r"(?P<mon>Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) {1,2}(?P<sd>\d{1,2}) "
              r"(?P<sh>\d\d):(?P<smi>\d\d):(?P<ss>\d\d)(?:\.(?P<sfrac>\d{1,9}))?")
_IDENT = r" (?P<host>[^\s:\[\]]+) (?P<ident>[^\s:\[\]]+)(?:\[(?P<pid>\d+)\])?: "
_SYSLOG = re.compile(r"^" + _SYSLOG_TS + _IDENT)
# rsyslog's and busybox's template without the host: "Mar 27 17:40:36 kernel: NVRM: ...".
_SYSLOG_NOHOST = re.compile(r"^" + _SYSLOG_TS + r" (?P<ident>[A-Za-z][\w.-]{0,63})"
                            r"(?:\[(?P<pid>\d+)\])?: ")
_ISOLOG = re.compile(r"^" + _ISO + _IDENT)
_DMESG_T = re.compile(r"^\[(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) " + _SYSLOG_TS + r" (?P<ty>\d{4})\] ")
_DMESG_MONO = re.compile(r"^\[ *\d+\.\d+\] (?:\[ *[TC]\d+\] )?")
_KMSG = re.compile(r"^\d+,\d+,\d+,[^;]*;")
# dmesg -H / --reltime: "[Jan27 23:04] " opens a minute, "[  +0.000844] " are the lines after.
_DMESG_REL = re.compile(r"^\[(?:(?P<mon>Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)"
                        r"(?P<sd>\d{1,2}) (?P<sh>\d\d):(?P<smi>\d\d)| *\+ *\d+\.\d+)\] ")
# dmesg -x ("kern  :err   : [  123.4] ...") and Talos' dmesg ("10.0.0.1: kern:  err:
# [2026-04-22T21:25:20.46Z]: ..."): facility and level before the message.
_FACILITY = re.compile(r"^(?:(?P<fhost>[\w.:-]{1,64}): )?(?P<fac>kern|user|daemon|syslog|auth|"
                       r"local\d) *: *(?:emerg|alert|crit|err|warning|warn|notice|info|debug) *: *"
                       r"(?:\[" + _ISO.replace("(?P<", "(?P<f_") + r"\]: )?")
_SLURMCTLD = re.compile(r"^\[" + _ISO + r"\] ")
_FABRIC = re.compile(r"^\[(?P<mon>Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) (?P<sd>\d\d) "
                     r"(?P<fy>\d{4}) (?P<sh>\d\d):(?P<smi>\d\d):(?P<ss>\d\d)\] ")
_GLOG = re.compile(r"^\[?(?P<sev>[IWEF])(?P<gmo>\d\d)(?P<gd>\d\d) (?P<gh>\d\d):(?P<gmi>\d\d):"
                   r"(?P<gs>\d\d)(?:\.(?P<gfrac>\d{1,9}))?(?: +\d+)? [\w./-]+:\d+\] ")
_PYLOG = re.compile(r"^" + _ISO + r"(?=[ \]|:])")
# A kernel line as admins paste it, without its time stamp: "kernel: NVRM: ..." or
# "node-01 kernel: NVRM: ...".
_BARE_KERNEL = re.compile(r"^(?:(?P<host>[A-Za-z0-9][\w.-]{0,63}) )?kernel: ")
# A tqdm progress bar frame ("desc:  45%|████▌     | 9/20 [00:01<00:02,  5.3it/s]") that a
# line was printed right after, with no newline between them: the line starts after it.
_BAR = re.compile(r"[^|\n]{0,100}?\d{1,3}%\|[^|\n]{0,300}\|[^\[\n]{0,60}\[[^\]\n]{0,160}\]")
_NCCL_HOST = re.compile(r"^(?:\[[^\]]{1,64}\] )?(?P<host>[A-Za-z0-9][\w.-]{0,253}):(?P<pid>\d+):"
                        r"(?P<tid>\d+) \[(?P<dev>\d+)\] ")


# First characters of every prefix split_prefix knows: digits (ISO, kmsg), '[' (dmesg,
# slurmctld, fabric manager, torch's [rankN]:), month names (syslog), glog severities.
_STAMP_FIRST = set("0123456789[(JFMASONDIWEkudsal")


@dataclass(slots=True)
class Stamp:
    """A wall-clock reading from a log line; `year` is None when the format has none."""
    year: Optional[int]
    month: int
    day: int
    hour: int
    minute: int
    second: int
    micro: int = 0
    offset: Optional[int] = None   # seconds east of UTC when the line said so
    res: float = 1.0


@dataclass(slots=True)
class Parsed:
    message: str
    stamp: Optional[Stamp] = None
    rank: Optional[int] = None
    host: Optional[str] = None
    ident: Optional[str] = None    # syslog identifier ("kernel" for kernel lines)
    kernel_form: bool = False      # dmesg / kmsg form: only the kernel prints these
    nccl_host: Optional[str] = None
    nccl_dev: Optional[int] = None
    tagged_host: Optional[str] = None   # the host a launcher's tag names (pdsh "node-01: ")


def clean(text: str) -> str:
    """Drop ANSI escapes and make other control characters visible, for matching and display."""
    if "\x1b" in text:
        text = _ANSI.sub("", text)
    return _CTRL.sub("\ufffd", text) if _CTRL.search(text) else text


def _frac(s: Optional[str]) -> tuple[int, float]:
    if not s:
        return 0, 1.0
    return int(s[:6].ljust(6, "0")), 10.0 ** -min(len(s), 6)


def _tz(s: Optional[str]) -> Optional[int]:
    if not s:
        return None
    if s == "Z":
        return 0
    sign = -1 if s[0] == "-" else 1
    digits = s[1:].replace(":", "")
    return sign * (int(digits[:2]) * 3600 + int(digits[2:4]) * 60)


def _iso(m, prefix: str = "") -> Stamp:
    """The stamp of an _ISO match; `prefix` for a copy of _ISO whose groups were renamed."""
    g = m.group
    micro, res = _frac(g(prefix + "frac"))
    return Stamp(int(g(prefix + "y")), int(g(prefix + "mo")), int(g(prefix + "d")),
                 int(g(prefix + "h")), int(g(prefix + "mi")), int(g(prefix + "s")), micro,
                 _tz(g(prefix + "tz")), res)


def _sys(m, year=None) -> Stamp:
    gd = m.groupdict()
    micro, res = _frac(gd.get("sfrac"))
    return Stamp(year, MONTHS[m.group("mon")], int(m.group("sd")), int(m.group("sh")),
                 int(m.group("smi")), int(m.group("ss")), micro, None, res)


def parse_stamp_text(s: str) -> Optional[Stamp]:
    """A timestamp standing alone (scontrol StartTime=, torchelastic `time :`, CANCELLED AT)."""
    s = s.strip()
    m = re.match(_ISO + r"$", s.replace("_", "T", 1) if "_" in s[:11] else s)
    if m:
        return _iso(m)
    return None


def _after_bars(line: str) -> str:
    """The line without the progress-bar frames glued before it."""
    while "%|" in line[:420] and (m := _BAR.match(line)):
        line = line[m.end():]
    return line


def tagging(lines: list[str]) -> str:
    """What a file's lines are tagged with, from its first lines: SRUN (`srun -l`: most start
    with a task number), HOST (pdsh: most start with a host name, which has a digit, so an
    exception's "RuntimeError: " is none) or ""."""
    lines = [ln for ln in lines[:60] if ln.strip()]
    if len(lines) < 3:
        return ""
    if sum(1 for ln in lines if _SRUN.match(ln)) * 2 >= len(lines):
        return SRUN
    hosts = [m.group("host") for ln in lines if (m := _HOST_TAG.match(ln))]
    if len(hosts) >= 3 and len(hosts) * 2 >= len(lines) and len(set(hosts)) <= 64 and all(
            any(c.isdigit() for c in h) and not h.isdigit() for h in hosts):
        return HOST
    return ""


def split_prefix(raw: str, tags: str = "") -> Parsed:
    """Peel log-path prefixes off one line (already cleaned) and say what they carried. `tags`
    is the file's tagging: the task number of `srun -l` or the host of pdsh opens the line."""
    line = raw
    rank = host = None
    if tags == SRUN:
        m = _SRUN.match(line)
        if m:
            rank = int(m.group(1))
            line = line[m.end():]
    elif tags == HOST:
        m = _HOST_TAG.match(line)
        if m:
            host = m.group("host")
            line = line[m.end():]
    if not _LABEL.match(line):
        # A progress bar glued before the line; a launcher's label stays before the bar (the
        # label is printed first, whatever the program then draws), and is peeled below.
        line = _after_bars(line)
    p = Parsed(message=line, rank=rank, tagged_host=host)
    if "kernel: " in line[:72] and (m := _BARE_KERNEL.match(line)):
        p.host, p.ident = m.group("host"), "kernel"
        p.message = line[m.end():]
        return p
    if not line or line[0] not in _STAMP_FIRST:
        # Fast path: no timestamp form starts with this character (NCCL host prefixes etc.).
        m = _NCCL_HOST.match(line)
        if m:
            p.nccl_host, p.nccl_dev = m.group("host"), int(m.group("dev"))
        return p

    m = _SYSLOG.match(line) or _ISOLOG.match(line) or _SYSLOG_NOHOST.match(line)
    if m:
        p.stamp = _iso(m) if m.groupdict().get("iso") else _sys(m)
        p.host, p.ident = m.groupdict().get("host"), m.group("ident")
        line = line[m.end():]
        mm = _DMESG_MONO.match(line)
        if mm:
            line = line[mm.end():]
    else:
        m = _DMESG_T.match(line)
        if m:
            p.stamp = _sys(m, int(m.group("ty")))
            p.kernel_form = True
            line = line[m.end():]
        elif (m := _KMSG.match(line)) or (m := _DMESG_MONO.match(line)):
            p.kernel_form = True
            line = line[m.end():]
        elif (m := _DMESG_REL.match(line)):
            p.kernel_form = True
            if m.group("mon"):
                p.stamp = Stamp(None, MONTHS[m.group("mon")], int(m.group("sd")),
                                int(m.group("sh")), int(m.group("smi")), 0, res=60.0)
            line = line[m.end():]
        elif (m := _FACILITY.match(line)):
            p.kernel_form = m.group("fac") == "kern"
            if m.group("f_iso"):
                p.stamp = _iso(m, "f_")
            if m.group("fhost") and not m.group("fhost")[0].isdigit():
                p.host = m.group("fhost")
            line = line[m.end():]
            mm = _DMESG_MONO.match(line) or _DMESG_T.match(line)
            if mm:
                if mm.re is _DMESG_T:
                    p.stamp = _sys(mm, int(mm.group("ty")))
                line = line[mm.end():]
        elif (m := _SLURMCTLD.match(line)):
            p.stamp = _iso(m)
            line = line[m.end():]
        elif (m := _FABRIC.match(line)):
            p.stamp = _sys(m, int(m.group("fy")))
            line = line[m.end():]
    if p.kernel_form and "kernel: " in line[:72] and (m := _BARE_KERNEL.match(line)):
        # A syslog export stamped dmesg-style: "[Sun Dec  1 14:54:40 2024] host kernel: ...".
        p.host, p.ident = m.group("host"), "kernel"
        line = line[m.end():]

    if line[:1] in "[(" or line[:1].isdigit():
        m = _MPI_TAG.match(line)
        if m:
            p.rank = int(m.group("mrank")) if p.rank is None else p.rank
            if m.group("m_iso") and p.stamp is None:
                p.stamp = _iso(m, "m_")
            line = line[m.end():]
        elif (m := _WORKER_TAG.match(line)) or (m := _RAY_TAG.match(line)):
            line = line[m.end():]
        line = _after_bars(line)
    m = _RANKTAG.match(line)
    if m:
        p.rank = int(m.group(1)) if p.rank is None else p.rank
        line = _after_bars(line[m.end():])
    if p.stamp is None:
        m = _GLOG.match(line)
        if m:
            micro, res = _frac(m.group("gfrac"))
            p.stamp = Stamp(None, int(m.group("gmo")), int(m.group("gd")), int(m.group("gh")),
                            int(m.group("gmi")), int(m.group("gs")), micro, None, res)
        else:
            m = _PYLOG.match(line)
            if m:
                p.stamp = _iso(m)
    m = _NCCL_HOST.match(line)
    if m:
        p.nccl_host = m.group("host")
        p.nccl_dev = int(m.group("dev"))
    p.message = line
    return p


class TimeContext:
    """Turns stamps into epoch seconds. Naive stamps are read in `utc_offset` (default UTC);
    year-less stamps take the year that puts them nearest the reference instant, so a
    `Dec 31` line and a `Jan 01` line of a job that ran over New Year stay in order."""

    def __init__(self, reference: Optional[float] = None, utc_offset: int = 0):
        self.reference = reference
        self.utc_offset = utc_offset

    def epoch(self, st: Optional[Stamp]) -> Optional[float]:
        if st is None:
            return None
        off = self.utc_offset if st.offset is None else st.offset
        if st.year is not None:
            return self._mk(st, st.year, off)
        if self.reference is None:
            return None
        ref_year = datetime.fromtimestamp(self.reference, timezone.utc).year
        best = None
        for y in (ref_year - 1, ref_year, ref_year + 1):
            t = self._mk(st, y, off)
            if t is not None and (best is None or abs(t - self.reference) < abs(best - self.reference)):
                best = t
        return best

    @staticmethod
    def _mk(st: Stamp, year: int, off: int) -> Optional[float]:
        try:
            base = calendar.timegm((year, st.month, st.day, st.hour, st.minute, st.second, 0, 0, 0))
            datetime(year, st.month, st.day)  # validates Feb 29 etc.
        except (ValueError, OverflowError):
            return None
        return base - off + st.micro / 1e6


def iso_utc(t: Optional[float]) -> Optional[str]:
    """Epoch seconds -> `2026-11-02T10:14:07Z` (microseconds only when present)."""
    if t is None:
        return None
    dt = datetime.fromtimestamp(t, timezone.utc)
    if dt.microsecond:
        return dt.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return dt.strftime("%Y-%m-%dT%H:%M:%SZ")


def nccl_host(message: str) -> Optional[tuple[str, int]]:
    m = _NCCL_HOST.match(message)
    return (m.group("host"), int(m.group("dev"))) if m else None
