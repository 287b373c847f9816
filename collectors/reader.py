"""Reading untrusted files safely and scanning them for rule literals in bounded memory.

`open_regular` looks at what a name is before it opens it (O_PATH, no symlink followed) and
opens only a regular file (optionally: owned by a given uid): a FIFO, a device or a socket is
never opened, so no driver runs and no writer is released, whoever the caller is. `become`
gives a child process the job's user's identity before it reads that user's files.

`scan` reads in chunks, runs the literal prefilter over each chunk and cuts out only the lines
that hit, with a little context: the timestamp prefixes of neighbouring lines (to bound the time
of a line that has none) and, for rules that ask, the next few lines. Files above the size cap
are read as head and tail; lines longer than `segment_max` are cut around the hit. Memory stays
at a few chunks whatever the input.
"""
from __future__ import annotations

import gzip
import os
import pwd
import re
import stat
import sys
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Optional

MiB = 1 << 20


class SkipFile(Exception):
    """The file is not read; the message says why (shown as a completeness note)."""


@dataclass
class Limits:
    file_cap: int = 512 * MiB        # files above this are read as head + tail halves
    chunk: int = 8 * MiB
    segment_max: int = 16 * 1024     # bytes of one line kept around a hit
    max_hits: int = 4000             # hit lines kept per file (first 3/4 and last 1/4)
    context_lines: int = 6           # neighbour lines looked at for timestamps
    context_bytes: int = 200         # of each neighbour, only the prefix matters
    sniff_bytes: int = 64 * 1024


@dataclass(slots=True)
class RawHit:
    offset: int
    line: Optional[int]
    data: bytes
    lits: set
    prev: list = field(default_factory=list)    # nearest first
    next: list = field(default_factory=list)    # nearest first
    following: list = field(default_factory=list)
    need: int = 0               # neighbour / following lines still wanted from the next chunk
    need_following: int = 0
    next_from: int = 0
    partial: bool = False       # the last neighbour line taken continues in the next chunk
    neighbours: bool = True     # its neighbour lines may bound its time (else none are cut out)
    meta: object = None         # what the confirm step learnt about the line (reused later)


@dataclass
class ScanResult:
    hits: list
    size: int
    scanned: int
    cut: int = 0
    hits_dropped: int = 0
    compressed: bool = False
    notes: list = field(default_factory=list)


def _size(n: int) -> str:
    for unit, div in (("GiB", 1 << 30), ("MiB", MiB), ("KiB", 1024)):
        if n >= div:
            return f"{n / div:.1f} {unit}"
    return f"{n} bytes"


def open_regular(path: str, *, dir_fd: Optional[int] = None,
                 owner: Optional[int] = None) -> tuple[int, os.stat_result]:
    """Open a regular file for reading, having looked at what it is first: the name is opened
    with O_PATH (which opens nothing: no device driver runs, no FIFO is joined) and without
    following a last-component link; only a regular file (owned by `owner`, when given) is
    then opened for reading, through /proc/self/fd, so it is the very file that was checked."""
    flags = os.O_PATH | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        pfd = os.open(path, flags, dir_fd=dir_fd)
    except OSError as e:
        raise SkipFile(f"cannot open: {e.strerror}") from None
    try:
        st = os.fstat(pfd)
        if not stat.S_ISREG(st.st_mode):
            raise SkipFile(_not_regular(st.st_mode))
        if owner is not None and st.st_uid != owner:
            raise SkipFile(f"is owned by uid {st.st_uid}, not the job's user {owner} (not read)")
        try:
            fd = os.open(f"/proc/self/fd/{pfd}", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC
                         | getattr(os, "O_NOCTTY", 0))
        except OSError as e:
            raise SkipFile(f"cannot open: {e.strerror}") from None
    finally:
        os.close(pfd)
    return fd, st


def _open_dirs(folder: Path, path: str):
    """(descriptor of the folder holding `path`, its last name), every folder on the way
    opened without following links, as the reader does; None when one cannot be."""
    dir_fd = None
    try:
        dir_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        for part in Path(path).parts[:-1]:
            nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                          dir_fd=dir_fd)
            os.close(dir_fd)
            dir_fd = nxt
    except OSError:
        if dir_fd is not None:
            os.close(dir_fd)
        return None
    return dir_fd, Path(path).parts[-1]


def open_under(folder: Path, path: str, owner: Optional[int]) -> Optional[int]:
    """A descriptor on the regular file at `path` under `folder`, opened as the reader opens
    evidence (no links followed on the way or at the end, owner checked); None when it cannot
    be safely."""
    d = _open_dirs(folder, path)
    if d is None:
        return None
    dir_fd, name = d
    try:
        return open_regular(name, dir_fd=dir_fd, owner=owner)[0]
    except SkipFile:
        return None
    finally:
        os.close(dir_fd)


def _not_regular(mode: int) -> str:
    kind = ("a symbolic link" if stat.S_ISLNK(mode) else "a FIFO" if stat.S_ISFIFO(mode)
            else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
            else "a socket" if stat.S_ISSOCK(mode) else "not a regular file")
    return f"is {kind} (not followed)" if stat.S_ISLNK(mode) else f"is {kind} (not opened)"


NOGROUP = 65534      # the primary group of a user this host does not know


def become(uid: Optional[int], gid: Optional[int] = None) -> None:
    """Give up root for good, in a child process about to read a job's files: the job's uid,
    its gid (the job's, else the user's own from the password database, else NOGROUP) and the
    user's supplementary groups (none when this host does not know the user). The kernel then
    checks every path as that user would be checked: a link into a folder the user cannot
    enter, or a device only root may open, fails as it would for them. Not root: nothing to
    give up (the kernel already checks this process's own, lesser, permissions). Raises
    PermissionError when the job's user is unknown, rather than read as root."""
    if os.geteuid() != 0 or uid == 0:
        return
    if uid is None:
        raise PermissionError("the job's user is not known: its files are not read as root")
    try:
        pw = pwd.getpwuid(uid)
    except KeyError:
        pw = None
    if gid is None:
        gid = pw.pw_gid if pw else NOGROUP
    os.setgroups(os.getgrouplist(pw.pw_name, gid) if pw else [])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    sys.meta_path.insert(0, _NoImports)


class _NoImports:
    """After become, no module is loaded: the job's user may not be able to read the Python
    installation (a pyenv under /root), so an import there would work on one host and kill the
    reader on the next. Refused on every host, such an import shows up in the tests."""
    @staticmethod
    def find_spec(name, path=None, target=None):
        raise ImportError(f"{name} is imported after giving up root: import it at the top")


def read_head(fd: int, n: int) -> bytes:
    try:
        data = os.pread(fd, n, 0)
    except OSError:
        return b""
    if data[:2] == b"\x1f\x8b":
        try:
            return zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(
                os.pread(fd, min(n, 4 * MiB), 0), n)
        except zlib.error:
            return b""
    return data


def _chunks(pread, start: int, length: int, chunk: int) -> Iterator[bytes]:
    pos, end = start, start + length
    while pos < end:
        data = pread(min(chunk, end - pos), pos)
        if not data:
            return
        pos += len(data)
        yield data


def _gz_chunks(fd: int, cap: int, chunk: int, res: ScanResult) -> Iterator[bytes]:
    raw = os.fdopen(os.dup(fd), "rb")
    total = 0
    try:
        with gzip.GzipFile(fileobj=raw) as gz:
            while total < cap:
                data = gz.read(min(chunk, cap - total))
                if not data:
                    return
                total += len(data)
                yield data
            if gz.read(1):
                res.notes.append(f"decompressed text cut at {_size(cap)}")
    except (OSError, EOFError, zlib.error) as e:
        res.notes.append(f"gzip stream broken after {total} bytes: {e}")
    finally:
        raw.close()
        res.scanned = total


# A launcher's label that opens a line ("[1,1]<stderr>:", srun's "0: ", pdsh's "node-01: ",
# torchrun's "[default0]:"), printed before whatever the program drew with CRs after it.
_LABEL = re.compile(rb"(?: {0,6}\d{1,7}: ?|\[\d{1,7},\d{1,7}\]<(?:stdout|stderr|stddiag)>: ?|"
                    rb"\[(?:default|trainer|worker|local_rank|localrank)\d{1,5}(?:\|\d{1,5})?\]: ?|"
                    rb"[A-Za-z0-9][\w.-]{0,63}: ?)[ \t]*")


def _label(buf, ls: int, cs: int) -> bytes:
    """The label of a line whose hit lies after a CR: its first CR-separated part, when that is
    only a launcher's label, so the part keeps the task or host the whole line belongs to."""
    first = buf.find(b"\r", ls, cs + 1)
    head = bytes(buf[ls:first])
    return head if len(head) <= 80 and _LABEL.fullmatch(head) else b""


class EveryLine:
    """The reference path's stand-in for the literal prefilter: every line (each CR-separated
    part of one) is a hit of literal 0, so every rule runs on every line. Slow; it defines the
    answer the prefilter must give (tests compare the two)."""
    max_len = 1
    _PART = re.compile(rb"[^\r\n]+")

    def scan(self, buf) -> list[tuple[int, int]]:
        return [(m.end(), 0) for m in self._PART.finditer(bytes(buf))]


class _Scanner:
    def __init__(self, prefilter, lit_rules, lines_after: dict, limits: Limits, confirm=None,
                 neighbours=None):
        self.confirm = confirm
        self.neighbours = neighbours
        self.pf = prefilter
        self.lit_rules = lit_rules
        self.lines_after = lines_after
        self.lim = limits
        self.hits: list[RawHit] = []
        self.tail: list[RawHit] = []     # ring of the latest hits once the head quota is full
        self.dropped = 0
        self.pending: list[RawHit] = []
        self.scanned_abs = -1        # absolute offset up to which literals were reported

    def _keep(self, h: RawHit):
        head_quota = self.lim.max_hits * 3 // 4
        if len(self.hits) < head_quota:
            self.hits.append(h)
            return
        self.tail.append(h)
        if len(self.tail) > self.lim.max_hits - head_quota:
            self.tail.pop(0)
            self.dropped += 1

    def run(self, chunks: Iterator[bytes], lineno: Optional[int], base: int,
            skip_partial: bool, length: Optional[int] = None) -> None:
        """Scan the chunks in turn. `length`, when known, is how many bytes they hold: the
        round that reaches it is the last one (no newline after its last kept hit is counted)."""
        lim = self.lim
        buf = b""
        scan_from = 0           # index in buf where the prefilter has not run yet
        overlap = max(self.pf.max_len - 1, 0)
        it = iter(chunks)
        eof = False
        first = skip_partial
        got = 0
        while not eof:
            data = next(it, b"")
            got += len(data)
            eof = not data or (length is not None and got >= length)
            buf = buf + data if buf else data
            if first:
                nl = buf.find(b"\n")
                if nl < 0 and not eof:
                    if len(buf) > lim.segment_max:
                        base += len(buf)
                        buf = b""
                    continue
                cut = nl + 1 if nl >= 0 else len(buf)
                base += cut
                buf = buf[cut:]
                first = False
            if eof:
                end = len(buf)
            else:
                nl = buf.rfind(b"\n")
                if nl >= scan_from and len(buf) - nl - 1 <= lim.segment_max:
                    end = nl + 1
                elif len(buf) - scan_from <= lim.segment_max + overlap:
                    continue          # a line longer than a chunk: read more first
                else:
                    end = len(buf) - lim.segment_max   # long line: scan most of it now
            self._complete_pending(buf, scan_from, end, eof)
            counted_to, newlines = self._scan(buf, scan_from, end, base, lineno, eof)
            if eof:
                break         # no line after the last kept one needs its number
            # Keep some lines before `end` as context for the next round, bounded in size.
            keep = end
            for _ in range(lim.context_lines):
                if keep <= 0:
                    break
                keep = buf.rfind(b"\n", 0, keep - 1) + 1
            keep = max(keep, end - lim.segment_max, 0)
            if lineno is not None:
                # _scan counted the newlines up to its last kept hit; count only the rest once.
                if counted_to <= keep:
                    lineno += newlines + buf.count(b"\n", counted_to, keep)
                else:
                    lineno += buf.count(b"\n", 0, keep)
            base += keep
            new_from = end - keep
            if end < len(buf) and buf.rfind(b"\n", 0, end) < end - 1:
                new_from = max(new_from - overlap, 0)   # literal may straddle a cut
            buf = buf[keep:]
            scan_from = new_from
        for h in self.pending:
            h.need = 0
        self.pending = []

    def _complete_pending(self, buf: bytes, start: int, end: int, eof: bool) -> None:
        if not self.pending:
            return
        still = []
        for h in self.pending:
            p = start
            while h.need > 0 and p < end:
                le = buf.find(b"\n", p, end)
                if le < 0 and not eof and (end >= len(buf) or buf[end - 1:end] != b"\n"):
                    # The line goes on past this round: keep its start, skip the rest of it.
                    if not h.partial:
                        self._add_next(h, buf[p:end])
                        h.partial = True
                    break
                le = end if le < 0 else le
                if h.partial:
                    h.partial = False          # the end of a line whose start we already have
                else:
                    self._add_next(h, buf[p:le])
                p = le + 1
            if h.need > 0 and not eof:
                still.append(h)
        self.pending = still

    def _add_next(self, h: RawHit, line: bytes) -> None:
        lim = self.lim
        line = line.rstrip(b"\r")
        context = lim.context_lines if h.neighbours else 0
        if len(h.next) < context:
            h.next.append(line[:lim.context_bytes])
        if len(h.following) < h.need_following:
            h.following.append(line[: 4096])
        h.need = max(context - len(h.next), h.need_following - len(h.following), 0)

    def _scan(self, buf: bytes, start: int, end: int, base: int, lineno: Optional[int],
              eof: bool) -> tuple[int, int]:
        """Finds and cuts out the hits in buf[start:end]. Returns how far into buf it counted
        newlines, and how many it found there (so the caller does not count them again)."""
        if end <= start:
            return 0, 0
        lim = self.lim
        found = self.pf.scan(memoryview(buf)[start:end] if start else
                             (buf if end == len(buf) else memoryview(buf)[:end]))
        if not found:
            return 0, 0
        cur = None
        new_hits: list[RawHit] = []
        prev_end = self.scanned_abs
        self.scanned_abs = max(self.scanned_abs, base + end)
        for end_off, lit in found:
            p = start + end_off - 1              # last byte of the literal
            if base + p < prev_end:
                continue                         # in the overlap after a cut: reported already
            if cur is not None and cur.offset - base <= p < cur.offset - base + len(cur.data):
                cur.lits.update(self.lit_rules[lit])
                continue
            ls = buf.rfind(b"\n", 0, p) + 1
            le = buf.find(b"\n", p)
            le = len(buf) if le < 0 else le
            # The segment: this line, or the CR-separated part of it, cut to segment_max.
            cs = buf.rfind(b"\r", ls, p)
            ss = max(ls, p - lim.segment_max // 2, cs + 1)
            se = min(le, p + lim.segment_max // 2)
            cr = buf.find(b"\r", p, se)
            if cr >= 0:
                se = cr
            data = buf[ss:se]
            if cs >= ls:
                data = _label(buf, ls, cs) + data
            cur = RawHit(offset=base + ss, line=None, data=data,
                         lits=set(self.lit_rules[lit]), next_from=min(le + 1, len(buf)))
            new_hits.append(cur)
        kept = []
        count_pos, count_line = 0, lineno
        for cur in new_hits:
            if self.confirm is not None:
                # Only lines a rule really matches get their context cut out and kept.
                cur.lits, cur.meta = self.confirm(cur.data, cur.lits)
                if not cur.lits:
                    continue
            kept.append(cur)
            if self.neighbours is not None:
                cur.neighbours = self.neighbours(cur)
            ls = cur.offset - base
            ls = buf.rfind(b"\n", 0, ls) + 1 if ls > 0 and buf[ls - 1:ls] != b"\n" else ls
            if count_line is not None:
                # Newlines are counted only up to lines that are kept: most hits are not.
                count_line += buf.count(b"\n", count_pos, ls)
                count_pos = ls
                cur.line = count_line
            # Previous lines, nearest first (their prefixes only).
            q = ls if cur.neighbours else 0
            while q > 0 and len(cur.prev) < lim.context_lines:
                qs = buf.rfind(b"\n", 0, q - 1) + 1
                cur.prev.append(buf[qs:min(q - 1, qs + lim.context_bytes)].rstrip(b"\r"))
                q = qs
        for h in kept:
            self._keep(h)
            h.need_following = max((self.lines_after.get(r, 0) for r in h.lits), default=0)
            h.need = max(lim.context_lines if h.neighbours else 0, h.need_following)
            p = h.next_from
            while h.need > 0 and p < len(buf):
                le = buf.find(b"\n", p)
                if le < 0:
                    if not eof:
                        break
                    le = len(buf)
                if le >= end and not eof:
                    break
                self._add_next(h, buf[p:le])
                p = le + 1
            if h.need > 0 and not eof:
                self.pending.append(h)
        if count_line is None:
            return 0, 0
        return count_pos, count_line - lineno


def scan(fd: int, size: int, prefilter, lit_rules, lines_after: dict,
         limits: Limits, confirm=None, pread=None, neighbours=None) -> ScanResult:
    """Scan an open file for prefilter literals. Gzip files are decompressed on the fly.

    `confirm(line_bytes, rule_ids) -> (rule_ids, meta)`, when given, runs the rules on each
    line the prefilter found and drops the line when none matches. `pread(n, offset)`, when
    given, reads the file instead of `os.pread(fd, ...)` (a view of part of it: see
    output_lines.copy_view); such a view is never gzip-decoded. `neighbours(hit)`, when given,
    says whether a kept line's neighbour lines may be needed (for its time); when it says no,
    none are cut out for it."""
    res = ScanResult(hits=[], size=size, scanned=0)
    sc = _Scanner(prefilter, lit_rules, lines_after, limits, confirm, neighbours)
    view = pread is not None
    pread = pread or (lambda n, off: os.pread(fd, n, off))
    head = b"" if view else pread(2, 0)
    if head == b"\x1f\x8b":
        res.compressed = True
        sc.run(_gz_chunks(fd, limits.file_cap, limits.chunk, res), 1, 0, False)
    elif size <= limits.file_cap:
        sc.run(_chunks(pread, 0, size, limits.chunk), 1, 0, False, size)
        res.scanned = size
    else:
        half = limits.file_cap // 2
        sc.run(_chunks(pread, 0, half, limits.chunk), 1, 0, False)
        at_line_start = pread(1, size - half - 1) == b"\n"
        sc.run(_chunks(pread, size - half, half, limits.chunk), None, size - half,
               not at_line_start, half)
        res.scanned = 2 * half
        res.cut = size - 2 * half
        res.notes.append(f"read first and last {_size(half)} of {_size(size)}; "
                         f"{_size(res.cut)} in the middle not read")
    res.hits = sc.hits + sc.tail
    res.hits_dropped = sc.dropped
    if sc.dropped:
        res.notes.append(f"{sc.dropped} matching lines in the middle dropped (kept first "
                         f"{len(sc.hits)} and last {len(sc.tail)})")
    return res
