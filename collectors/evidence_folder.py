"""The evidence-folder reader: a folder of logs -> documents and matched lines.

Layout: `slurm/` (scheduler facts), `logs/` (job-level output), one folder per node (the folder
name is the node name); sattrib's own manifests (`diagnosis.json`, `actions.json`), a scored
case's `expected.json`, a person's notes (`README*`, `NOTES*`, `*.md`) and names starting with
`_` or `.` are ignored. Files are classified by
their content, not their name, by the rows of collectors/sources.py: a kernel log is recognised
by its line prefixes, an nvidia-smi dump by its header. One exception, for safety: a file whose
name says it is rank output (`*.stderr`, `*.err`, `*.out`, `rank*`) is always read as rank
output, so a user's program cannot make its own output count as kernel evidence by imitating
kernel lines.
"""
from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Callable, NamedTuple, Optional, Union

from ..engine.extract import captures, found_for, line_rules, rules_by_source
from ..engine.lineparse import SRUN, TimeContext, clean, split_prefix, tagging
from ..engine.localize import fr_lines
from ..engine.models import Bundle, Document, JobInfo, Line
from ..engine.rules import RuleSet
from ..engine.matcher import ShapeSearch, search_all
from ..engine.taxonomy import Kind, Source
from . import flight_recorder, output_lines, probes_file, prometheus, slurm_state, sources
from .reader import EveryLine, Limits, SkipFile, open_regular, read_head, scan
from .sources import PERSONS_NOTE, RESERVED, Read, Where

def job_id_from_names(paths) -> Optional[str]:
    """The job id in Slurm's default output names (`slurm-<id>.out`, `slurm-<array>_<task>.out`)
    when no scheduler record says it: one id only, never a guess between two."""
    ids = {m.group(1) for p in paths
           if (m := re.fullmatch(r"slurm-(\d+(?:_\d+)?)\.(?:out|err)", Path(p).name))}
    return ids.pop() if len(ids) == 1 else None


MAX_FILES_PER_DIR = 5000
MAX_DEPTH = 3
STRUCTURED_CAP = 32 << 20     # nvidia-smi / ibstat / dcgm dumps are read whole up to this

_RANK_IN_NAME = re.compile(r"rank[-_.]?(\d+)", re.I)
# A flight-recorder dump as NVIDIA's resiliency library names it (TORCH_FR_DUMP_TEMP_FILE ending
# in /_dump_): read in a node's folder although its name starts with "_".
_NVRX_DUMP = re.compile(r"_dump_\d{1,7}$")


class Opened(NamedTuple):
    """A file open for reading, and the head the reader sniffed it by."""
    path: Path
    fd: int
    size: int
    head: bytes


def _tagging(head: bytes) -> str:
    """How the job output's lines are tagged (lineparse.tagging), from its first lines."""
    return tagging([ln.decode("utf-8", "replace") for ln in head.split(b"\n", 60)[:60]])


def _kernel_record(kind: str, p) -> bool:
    """Whether a kernel log's line (split_prefix's `p`) is the kernel's own: only what the
    kernel printed is kernel evidence, and it is read from the record's start. A line with no
    prefix at all in a file named as a kernel log is the message alone, as `journalctl -k -o
    cat` and `dmesg -t` print it (contract section 1); a line another program logged carries
    its identifier."""
    return kind == Kind.kernel_log and (p.kernel_form or p.ident == "kernel" or (
        p.ident is None and p.stamp is None and p.host is None))


def _walk(root: Path, rel: str, depth: int, out: list, notes: list) -> None:
    try:
        # A node's extract of a file (`X.lines`) sorts where X would.
        entries = sorted(os.scandir(root), key=lambda e: e.name.removesuffix(".lines"))
    except OSError as e:
        notes.append(f"{rel or '.'}: cannot list: {e.strerror}")
        return
    if len(entries) > MAX_FILES_PER_DIR:
        # Rank output cannot crowd out the node's own logs: those are kept first.
        system = [e for e in entries if not sources.RANK_NAME.search(e.name)]
        ranks = [e for e in entries if sources.RANK_NAME.search(e.name)]
        keep = system[:MAX_FILES_PER_DIR]
        keep += ranks[:MAX_FILES_PER_DIR - len(keep)]
        notes.append(f"{rel}: {len(entries)} entries, read {len(keep)} (logs and tool output "
                     "first, then rank output by name)")
        entries = sorted(keep, key=lambda e: e.name.removesuffix(".lines"))
    for e in entries:
        if e.name.startswith((".", "_")) and not (depth and _NVRX_DUMP.match(e.name)):
            continue
        if PERSONS_NOTE.search(e.name) and e.is_file(follow_symlinks=False):
            continue
        path = f"{rel}/{e.name}" if rel else e.name
        if e.is_symlink():
            notes.append(f"{path}: is a symbolic link (not followed)")
        elif e.is_dir(follow_symlinks=False):
            if depth < MAX_DEPTH:
                _walk(Path(e.path), path, depth + 1, out, notes)
        else:
            out.append((Path(e.path), path))


class FolderReader:
    def __init__(self, rules: RuleSet, limits: Optional[Limits] = None,
                 utc_offset: Union[int, Callable[[Optional[float]], int]] = 0,
                 owner: Optional[int] = None, reference: bool = False):
        self.rules = rules
        # reference: no prefilter, one process, every rule on every line (see reader.EveryLine)
        self.reference = reference
        self.lim = limits or Limits()
        self.utc_offset = utc_offset
        self.offset = 0
        self.job_line_cap = 200_000
        self.clock: dict = {}
        self.job_id: Optional[str] = None   # whose scheduler records the rules read
        self._cands: dict = {}    # one tuple object per distinct set of candidate rules
        self._founds: dict = {}   # one Line.found per distinct search result (see _line)
        self._shapes = ShapeSearch(rules.by_id)     # each message shape searched once
        self._no_stamps = 0
        self.owner = owner
        # Called as files are read: (files read, files in all, bytes read, bytes in all).
        self.progress: Optional[Callable[[int, int, int, int], None]] = None
        self.lit_rules = ([tuple(c.rule.id for c in rules.rules)] if reference
                          else rules.literal_rules)
        self._by_source = rules_by_source(rules)
        self._context_rules = {c.rule.id for c in rules.rules if c.rule.role.value == "context"}
        self.lines_after = {c.rule.id: c.rule.lines_after for c in rules.rules
                            if c.rule.lines_after}

    def read(self, root: Path, name: Optional[str] = None) -> Bundle:
        root = Path(root)
        bundle = Bundle(name=name or root.name, job=JobInfo(), counting=sources.COUNTING)
        top: list[tuple[Path, str]] = []
        _walk(root, "", 0, top, bundle.notes)
        slurm_files = [(p, r) for p, r in top if r.startswith("slurm/")]
        other = [(p, r) for p, r in top if not r.startswith("slurm/") and r not in RESERVED]
        lone = self._lone_node(root, other, bundle)
        bundle.job = self._job(slurm_files, bundle)
        self.job_id = bundle.job.job_id
        offset = self.utc_offset
        if callable(offset):
            # A named zone: its offset at the job's start (scontrol prints local time).
            offset = offset(bundle.job.start or bundle.job.end)
            for f in ("start", "end"):
                if getattr(bundle.job, f) is not None:
                    setattr(bundle.job, f, getattr(bundle.job, f) - offset)
        self.offset = offset
        ref = bundle.job.start or bundle.job.end or self._reference(other)
        tc = TimeContext(ref, offset)
        try:
            bundle.node_dirs = [lone] if lone else sorted(
                e.name for e in os.scandir(root) if e.is_dir(follow_symlinks=False)
                and e.name not in RESERVED and not e.name.startswith((".", "_")))
        except OSError:
            bundle.node_dirs = []
        for path, rel in slurm_files:
            if (row := sources.manifest(rel)) is not None and row.read == Read.notes:
                # What the controller could not collect (written by sattrib.collect).
                try:
                    fd, _ = open_regular(str(path), owner=self.owner)
                    bundle.notes.extend(os.pread(fd, 1 << 20, 0).decode(
                        "utf-8", "replace").splitlines()[:200])
                    os.close(fd)
                except SkipFile:
                    pass
        self.clock = self._clock_offsets(other, bundle)
        jobs = []
        for path, rel in slurm_files + other:
            if sources.manifest(rel) is not None:
                continue
            first = rel.split("/", 1)[0]
            node = first if ("/" in rel and first not in RESERVED) else lone
            jobs.append((path, rel, node, rel.startswith("slurm/")))
        done = self._read_dumps(jobs, bundle)
        jobs = [j for j in jobs if j[1] not in done]
        for part in self._read_all(jobs, tc):
            bundle.documents.extend(part.documents)
            bundle.lines.extend(part.lines)
            bundle.notes.extend(part.notes)
        bundle.lines.extend(self._hang(root, bundle))
        self._cap_job(bundle)
        if not bundle.job.job_id:
            bundle.job.job_id = job_id_from_names(d.path for d in bundle.documents)
        return bundle

    def _lone_node(self, root: Path, files, bundle: Bundle) -> Optional[str]:
        """One node's folder handed in on its own (its files at the top, no slurm/, logs/ or
        node folders, and at least one of them the node's own: a kernel log, nvidia-smi,
        DCGM, ibstat): the name of that node, else None. The node is the one host its kernel
        log names, or the folder's name (contract: the folder name is the node name)."""
        if not files or any("/" in rel for _, rel in files):
            return None
        hosts, own = set(), False
        for rel, head in self._heads(files, self.lim.sniff_bytes):
            if rel.endswith(output_lines.SUFFIX):
                continue                              # a node's extract of job output
            row = sources.classify(Path(rel).name, head, Where.node)
            if row.trust == Source.stderr:
                continue                              # the job's, not the node's own record
            own = True
            if row.kind == Kind.kernel_log:
                for ln in head.decode("utf-8", "replace").split("\n")[:300]:
                    h = split_prefix(clean(ln)).host
                    if h and not h[0].isdigit() and h != "localhost":
                        hosts.add(h.split(".")[0])
        if not own:
            return None
        named = hosts.pop() if len(hosts) == 1 else None
        node = named or Path(os.path.abspath(root)).name
        why = "the host its kernel log names" if named else "the folder's name"
        bundle.notes.append(f"one node's folder: its files are read as node {node}'s ({why})")
        return node

    def _hang(self, root: Path, bundle: Bundle) -> list[Line]:
        """The hang picture is across nodes: every node's GPU utilisation, read together."""
        found = []
        for doc in bundle.documents:
            if doc.kind != Kind.metrics or doc.node is None:
                continue
            try:
                fd, _ = open_regular(str(root / doc.path), owner=self.owner)
            except SkipFile:
                continue
            try:
                text = os.pread(fd, STRUCTURED_CAP, 0).decode("utf-8", "replace")
            finally:
                os.close(fd)
            found += prometheus.falls(text, doc.node, doc.path)
        return prometheus.hang_lines(found)

    PARALLEL_MIN_BYTES = 64 << 20
    CLOCK_TOLERANCE = 10.0     # below this, an offset is epilog start delay, not clock skew

    def _clock_offsets(self, files, bundle: Bundle) -> dict:
        """Per node, how far its clock ran from the others', from sattrib's own snapshots:
        each records the node's time when its Epilog started, which is when the job ended.
        Epilogs start together, so a node far from the median of its peers has a clock that is
        off; the common part (Epilog start delay, or every clock off alike) is left alone.
        Needs three nodes to tell; corrections are whole seconds, 10 s or more."""
        found = {}
        for path, rel in files:
            if not rel.endswith("/" + probes_file.NAME) or rel.count("/") != 1:
                continue
            try:
                fd, _ = open_regular(str(path), owner=self.owner)
            except SkipFile:
                continue
            try:
                text = os.pread(fd, 1 << 16, 0).decode("utf-8", "replace")
            finally:
                os.close(fd)
            offset = probes_file.parse(text).clock_offset
            if offset is not None:
                found[rel.split("/", 1)[0]] = offset
        if len(found) < 3:
            return {}
        ordered = sorted(found.values())
        mid = len(ordered) // 2
        median = ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
        out = {}
        for node, off in sorted(found.items()):
            skew = float(round(off - median))
            if abs(skew) >= self.CLOCK_TOLERANCE:
                out[node] = skew
                bundle.notes.append(f"{node}: its clock ran {skew:+.0f} s from the other "
                                    "nodes'; its time stamps were corrected")
        return out

    def _read_all(self, jobs: list, tc: TimeContext) -> list:
        """Read every file; big jobs are spread over processes (files are independent).
        Results come back in file order, so the bundle is the same either way."""
        sizes = []
        for path, *_ in jobs:
            try:
                sizes.append(os.lstat(path).st_size)
            except OSError:
                sizes.append(0)
        total = sum(sizes)
        done = [0, 0]

        def step(parts: list) -> list:
            if self.progress:
                done[0] += len(parts)
                done[1] += sum(sizes[done[0] - len(parts):done[0]])
                self.progress(done[0], len(jobs), done[1], total)
            return parts
        workers = 1 if self.reference else min(os.cpu_count() or 1, 8, len(jobs))
        if workers > 1 and total >= self.PARALLEL_MIN_BYTES and hasattr(os, "fork"):
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor
            self.rules.prefilter                 # build once; forked workers share it
            global _FORK_STATE
            _FORK_STATE = (self, jobs, tc)
            # Small batches stream back in order: no worker holds, and no single message
            # carries, more than a few dozen files' lines at a time.
            batches = [list(range(i, min(i + 32, len(jobs)))) for i in range(0, len(jobs), 32)]
            out = []
            try:
                with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context(
                        "fork")) as ex:
                    for res in ex.map(_read_in_worker, batches):
                        out.extend(step(res))
            finally:
                _FORK_STATE = None
            return out
        return [part for job in jobs for part in step([self._read_one(*job, tc)])]

    def _read_one(self, path, rel, node, in_slurm, tc) -> Bundle:
        part = Bundle(name=rel, job=JobInfo())
        self._read_file(path, rel, node, in_slurm, tc, part)
        if not self.reference:
            # Lines the confirm step did not search (journal records, tool facts, probes): the
            # rules extract would run on them run here, in the worker, once.
            for ln in part.lines:
                if ln.found is None:
                    cands = line_rules(ln, self.rules, self._by_source)
                    kernel = ln.source is Source.kernel
                    caps = {c.rule.id: cp for c in cands
                            if (cp := captures(c, ln.message, kernel=kernel)) is not None}
                    ln.found = found_for(ln, cands, caps)
        return part

    def _cap_job(self, bundle: Bundle) -> None:
        """Bound the whole job: past `job_line_cap` matching lines, later files keep only the
        first and last few of theirs (in file order, so the result does not depend on how the
        reading was spread)."""
        if len(bundle.lines) <= self.job_line_cap:
            return
        kept, per_doc, seen = [], {}, 0
        for ln in bundle.lines:
            per_doc.setdefault(ln.doc, []).append(ln)
        cut_docs = 0
        for doc, lines in per_doc.items():
            if seen + len(lines) > self.job_line_cap and len(lines) > 40:
                lines = lines[:30] + lines[-10:]
                cut_docs += 1
            seen += len(lines)
            kept.extend(lines)
        bundle.lines = kept
        bundle.notes.append(f"more than {self.job_line_cap} matching lines in the job: "
                            f"{cut_docs} later files keep their first 30 and last 10")

    # -- scheduler facts --------------------------------------------------------------------
    def _job(self, files, bundle: Bundle) -> JobInfo:
        scon, sacct, js = [], [], []
        for path, rel in files:
            try:
                fd, st = open_regular(str(path), owner=self.owner)
            except SkipFile as e:
                bundle.notes.append(f"{rel}: {e}")
                continue
            try:
                text = os.pread(fd, STRUCTURED_CAP, 0).decode("utf-8", "replace")
            finally:
                os.close(fd)
            kind = sources.classify(Path(rel).name, text[:65536].encode(), Where.slurm).kind
            if kind == Kind.slurm_job:
                found: list = []
                scon += slurm_state.parse_scontrol(text, found)
                bundle.notes += [f"{rel}: {n}" for n in found]
            elif kind == Kind.sacct:
                sacct += slurm_state.parse_sacct(text)
            elif kind in (Kind.slurm_json, Kind.run_record):
                js += slurm_state.parse_json(text)
        own = [j for j in js if j.own_run]
        other = [j for j in js if not j.own_run]
        job = slurm_state.merge(*(scon[:1] + other[:1]))
        runs = [j for j in sacct if j.start and j.end]
        if own:
            # sattrib's own record of the run it collected: its restart count and times win
            # over scontrol's, which may already describe the next run of a requeued job, and
            # so do whose job it is, its name and partition (what slurmctld passed the hook).
            run = own[0]
            for f in ("job_id", "cluster", "name", "user", "partition"):
                setattr(job, f, getattr(run, f) or getattr(job, f))
            job.restart = run.restart
            job.start = run.start or job.start
            job.end = run.end or job.end
            job.nodes = run.nodes or job.nodes
            job.snapshots = run.snapshots
            if job.state in ("PENDING", "REQUEUED"):
                job.state = "REQUEUED"
        elif job.state == "PENDING" and runs:
            # Requeued: the record now describes the next run; the run that ended is in sacct.
            last = runs[-1]
            job.state, job.start, job.end, job.nodes = last.state, last.start, last.end, \
                last.nodes
            job.restart = max(job.restart - 1, 0)
        return slurm_state.merge(job, *(sacct[:1]))

    def _heads(self, files, size: int):
        """(name, first `size` bytes) of each file that may be read (see reader.open_regular); of
        a node's extract (output_lines), its stamped head lines."""
        for path, rel in files:
            try:
                fd, _ = open_regular(str(path), owner=self.owner)
            except SkipFile:
                continue
            try:
                head = read_head(fd, size)
                if rel.endswith(output_lines.SUFFIX) and output_lines.is_lines(head):
                    rep = output_lines.read(fd)        # a node's extract: its stamped lines
                    head = "\n".join(rep.header["stamps"] if rep else []).encode()
                yield rel, head
            finally:
                os.close(fd)

    def _reference(self, files) -> Optional[float]:
        """No job record: take the first full timestamp found at the head of any file."""
        tc = TimeContext(None, self.offset)
        for _, raw in self._heads(files, 16384):
            head = raw.decode("utf-8", "replace")
            for ln in head.split("\n")[:50]:
                t = tc.epoch(split_prefix(clean(ln), SRUN).stamp)
                if t is not None:
                    return t
        return None

    def wants_time(self, lits) -> bool:
        """Only a line that may become a root needs its time bounded by its neighbours:
        symptoms are never ordered against each other."""
        by_id = self.rules.by_id
        return any((c := by_id.get(r)) is not None and (
            c.rule.role.value == "root" or c.rule.decode) for r in lits)

    def needs_neighbours(self, h) -> bool:
        """Whether `_line` may bound this line's time by its neighbours': only a line a root or
        decode rule matched, and only if its own stamp does not give the time whatever the
        controller's time zone and reference year. The scanner cuts out no neighbour lines for
        the others, and a node ships them without (output_lines)."""
        if not self.wants_time(h.lits):
            return False
        stamp = h.meta[1].stamp if h.meta is not None else None
        return not (stamp is not None and stamp.year is not None
                    and TimeContext._mk(stamp, stamp.year, 0) is not None)

    @staticmethod
    def stamped_head(head: bytes) -> list[str]:
        """The lines among the first 50 of a file's head that carry a time stamp: what
        `_reference` reads of it (a node ships them with its extract)."""
        return [ln for ln in head[:16384].decode("utf-8", "replace").split("\n")[:50]
                if split_prefix(clean(ln), SRUN).stamp is not None]

    # -- one file ---------------------------------------------------------------------------
    def _read_file(self, path: Path, rel: str, node: Optional[str], in_slurm: bool,
                   tc: TimeContext, bundle: Bundle) -> None:
        try:
            fd, st = open_regular(str(path), owner=self.owner)
        except SkipFile as e:
            bundle.notes.append(f"{rel}: {e}")
            return
        try:
            head = read_head(fd, self.lim.sniff_bytes)
            if (not in_slurm and rel.endswith(output_lines.SUFFIX)
                    and output_lines.is_lines(head) and self._replay(fd, rel, node, tc, bundle)):
                return
            if node is None and not in_slurm:
                # logs/ holds what the job printed: job output whatever its name or content
                # (contract §1), so it never counts as kernel or GPU evidence.
                row = sources.BY_KIND[Kind.rank_output]
            else:
                row = sources.classify(Path(rel).name, head, Where.slurm if in_slurm
                                       else Where.node)
            if row.kind is None:
                return                                 # a manifest of sattrib's own
            doc = Document(path=rel, node=node, kind=row.kind, source=row.trust,
                           size=st.st_size)
            bundle.documents.append(doc)
            self.READERS[row.read](self, Opened(path, fd, st.st_size, head), doc, row, tc,
                                   bundle)
        finally:
            os.close(fd)

    def _scan(self, f: Opened, doc: Document, row, tc: TimeContext,
              bundle: Bundle) -> None:
        res, tags = self.scan_output(f.fd, f.size, f.head, kind=doc.kind)
        self._add_hits(doc, res.hits, res.cut, res.notes, tags, tc, bundle)

    def _record(self, f: Opened, doc: Document, row, tc: TimeContext,
                bundle: Bundle) -> None:
        """What the job's user wrote into its record is no scheduler evidence: the rules read
        Slurm's own fields only (slurm_state.rule_view)."""
        view = slurm_state.rule_view(doc.kind, os.pread(f.fd, STRUCTURED_CAP, 0).decode(
            "utf-8", "replace"), self.job_id).encode()
        res, tags = self.scan_output(f.fd, len(view), view[:self.lim.sniff_bytes],
                                     pread=lambda n, off: view[off:off + n], kind=doc.kind)
        self._add_hits(doc, res.hits, res.cut, res.notes, tags, tc, bundle)

    def _facts(self, f: Opened, doc: Document, row, tc: TimeContext,
               bundle: Bundle) -> None:
        """A structured file, read whole up to STRUCTURED_CAP: one line per fact its parser
        finds, tied to the line it came from."""
        text = os.pread(f.fd, STRUCTURED_CAP, 0).decode("utf-8", "replace")
        if f.size > STRUCTURED_CAP:
            doc.truncated_bytes = f.size - STRUCTURED_CAP
        for n, orig, fact in row.parse(text):
            bundle.lines.append(Line(doc=doc.path, line=n, offset=0, source=doc.source,
                                     node=doc.node, rank=None, shown=clean(orig)[:2000],
                                     message=clean(fact)[:2000]))

    def _metrics(self, f: Opened, doc: Document, row, tc: TimeContext,
                 bundle: Bundle) -> None:
        """Prometheus series saved by the collector."""
        found, notes = prometheus.lines(os.pread(f.fd, STRUCTURED_CAP, 0).decode(
            "utf-8", "replace"), doc.node, doc.path)
        bundle.lines.extend(found)
        bundle.notes.extend(notes)
        if any(ln.source == Source.probe for ln in found):
            doc.kind = Kind.metrics_failed      # missing, said by its probe line

    def _dump(self, f: Opened, doc: Document, row, tc: TimeContext,
              bundle: Bundle) -> None:
        """A dump the node folders' pass (_read_dumps) did not take."""
        self._flight_lines(doc, flight_recorder.read_all(
            [str(f.path)], self.owner, flight_recorder.MAX_BYTES, time.monotonic() + 60), bundle)

    def _dump_facts(self, f: Opened, doc: Document, row, tc: TimeContext,
                    bundle: Bundle) -> None:
        dumps, notes = flight_recorder.read_facts(os.pread(
            f.fd, flight_recorder.MAX_FACTS_BYTES + 1, 0))
        doc.notes.extend(notes)
        self._flight_lines(doc, dumps, bundle)

    READERS = {Read.scan: _scan, Read.record: _record, Read.facts: _facts,
               Read.metrics: _metrics, Read.dump: _dump, Read.dump_facts: _dump_facts}

    def _read_dumps(self, jobs: list, bundle: Bundle) -> set:
        """The flight-recorder dumps in the node folders, read all at once in child processes
        before the rest (collectors/flight_recorder.read_all), and their lines; the paths
        taken. A file named as a dump that cannot be opened (a FIFO, another user's) is a dump
        not read, not a missing one."""
        found, failed = [], []
        for path, rel, node, in_slurm in jobs:
            name = Path(rel).name
            if in_slurm or node is None or flight_recorder.rank_of(name) is None:
                continue
            try:
                fd, st = open_regular(str(path), owner=self.owner)
            except SkipFile as e:
                if flight_recorder.sniff(name, b"") == "dump":
                    failed.append((rel, node, 0, {"rank": flight_recorder.rank_of(name),
                                                  "note": str(e)}))
                continue
            try:
                if flight_recorder.sniff(name, read_head(fd, 4096)) == "dump":
                    found.append((rel, node, st.st_size, str(path)))
            finally:
                os.close(fd)
        workers = 1 if self.reference else min(os.cpu_count() or 1, 8, len(found) // 16 + 1)
        got = flight_recorder.read_all([f[3] for f in found], self.owner,
                                       flight_recorder.MAX_BYTES,
                                       time.monotonic() + 60 + len(found), workers)
        for (rel, node, size, _), dump in list(zip(found, got)) + [(f, f[3]) for f in failed]:
            doc = Document(path=rel, node=node, kind=Kind.flight_recorder,
                           source=sources.BY_KIND[Kind.flight_recorder].trust, size=size)
            bundle.documents.append(doc)
            self._flight_lines(doc, [dump], bundle)
        return {f[0] for f in found + failed}

    def _flight_lines(self, doc: Document, dumps: list, bundle: Bundle) -> None:
        """One line for each dump (a rank's own, or those a node shipped the facts of) and each
        of its process groups (engine.localize.fr_lines); what could not be read, as notes."""
        for d in dumps:
            rank = d.get("rank")
            if not isinstance(rank, int):
                doc.notes.append(f"{d.get('note') or 'a dump'}: no rank in its name")
                continue
            src = f"{d['source']}: " if isinstance(d.get("source"), str) else ""
            doc.notes.extend(f"{src}{n}" for n in ([d["note"]] if d.get("note") else [])
                             + [n for n in d.get("notes") or [] if isinstance(n, str)])
            # When the rank last enqueued work, by its own entries: a dump left over from an
            # earlier job falls outside this one's window (a copy's file time says nothing).
            t = d.get("time_ns")
            ts = (t / 1e9 - self.clock.get(doc.node, 0.0)
                  if isinstance(t, int) and not isinstance(t, bool) else None)
            for shown, msg in fr_lines(d):
                lits = None if self.reference else tuple(sorted(
                    {r for _, k in self.rules.prefilter.scan(msg.encode())
                     for r in self.lit_rules[k]}))
                bundle.lines.append(Line(doc=doc.path, line=None, offset=0, source=doc.source,
                                         node=doc.node, rank=rank, message=msg, ts=ts,
                                         shown=(src + shown)[:2000], candidates=lits))

    FOUND_CACHE = 4096    # distinct search results remembered for sharing

    def scan_output(self, fd: int, size: int, head: bytes, pread=None,
                    kind: Kind = Kind.rank_output):
        """(ScanResult, tagging) for an open file: the prefilter, then the rules
        on each line it found. Also what a node runs on its own ranks' files
        (collectors/output_lines.py)."""
        tags = _tagging(head) if kind == Kind.rank_output else ""
        prefilter = EveryLine() if self.reference else self.rules.prefilter
        res = scan(fd, size, prefilter, self.lit_rules, self.lines_after, self.lim,
                   confirm=self._confirmer(kind, tags), pread=pread,
                   neighbours=None if self.reference else self.needs_neighbours)
        return res, tags

    def _add_hits(self, doc: Document, hits: list, cut: int, notes: list, tags: str,
                  tc: TimeContext, bundle: Bundle) -> None:
        doc.truncated_bytes = cut
        doc.notes.extend(notes)
        rank_hint = None
        m = _RANK_IN_NAME.search(Path(doc.path).name)
        if m and doc.kind == Kind.rank_output:
            rank_hint = int(m.group(1))
        self._no_stamps = 0
        for h in hits:
            ln = self._line(doc, h, tc, tags, rank_hint)
            if ln is not None:
                bundle.lines.append(ln)

    def _replay(self, fd: int, rel: str, node: Optional[str], tc: TimeContext,
                bundle: Bundle) -> bool:
        """A node's extract of a rank output file (`X.lines`, collectors/output_lines.py):
        the lines a scan of X would have kept, under X's name. False: not one."""
        rep = output_lines.read(fd)
        if rep is None:
            return False
        if rep.header.get("rules") != self.rules.version:
            rep.notes.append(f"extracted on the node with rules {rep.header.get('rules')}, "
                             f"not these ({self.rules.version}): lines only these rules "
                             "match are not in it")
        doc = Document(path=rel[:-len(output_lines.SUFFIX)], node=node, kind=Kind.rank_output,
                       source=sources.BY_KIND[Kind.rank_output].trust, size=rep.header["size"])
        bundle.documents.append(doc)
        # The node kept the lines its rules confirmed; confirming them again here, in order,
        # gives the same matches (and the same context-rule counts) the scan had.
        confirm = self._confirmer(Kind.rank_output, rep.header["tags"])
        hits = []
        for h in rep.hits:
            h.lits, h.meta = confirm(h.data, h.lits)
            if h.lits:
                hits.append(h)
        self._add_hits(doc, hits, rep.header["cut"], rep.notes, rep.header["tags"], tc, bundle)
        return True

    CONTEXT_CAP = 2       # lines per file kept for a rule that only locates (role context)

    def _confirmer(self, kind: Kind, tags: str):
        """Runs the rules a line's literals point at; the scanner drops lines none matches."""
        by_id = self.rules.by_id
        if kind == Kind.journal_json:
            return None                    # JSON records are confirmed after decoding
        context = self._context_rules
        context_count: dict[str, int] = {}
        capped: set = set()       # context rules this file already keeps CONTEXT_CAP lines of

        def confirm(data: bytes, lits):
            if lits <= capped:
                return set(), None     # whatever matches, the line would be dropped: no work
            text = clean(data.decode("utf-8", "replace"))
            p = split_prefix(text, tags)
            msg = p.message.encode("utf-8", "replace")
            kernel = _kernel_record(kind, p)
            hit = search_all(by_id, msg, lits, kernel) if self.reference else \
                self._shapes(msg, lits, kernel)
            if hit and hit.keys() <= context:
                first = min(hit)
                n = context_count[first] = context_count.get(first, 0) + 1
                if n >= self.CONTEXT_CAP:
                    capped.add(first)
                if n > self.CONTEXT_CAP:
                    return set(), None
            return set(hit), (text, p, hit)     # the matches are kept: extract reuses them
        return confirm

    def _line(self, doc: Document, h, tc: TimeContext, tags: str,
              rank_hint: Optional[int]) -> Optional[Line]:
        if doc.kind == Kind.journal_json:
            return self._journal_line(doc, h, h.data.decode("utf-8", "replace"),
                                      self.clock.get(doc.node, 0.0) if doc.node else 0.0)
        matches = None
        if h.meta is not None:
            text, p, matches = h.meta
        else:
            text = clean(h.data.decode("utf-8", "replace"))
            p = split_prefix(text, tags)
        source = doc.source
        if doc.kind == Kind.kernel_log:
            source = Source.kernel if _kernel_record(doc.kind, p) else Source.system
        rank = p.rank if p.rank is not None else rank_hint
        ts = tc.epoch(p.stamp)
        skew = self.clock.get(doc.node, 0.0) if doc.node else 0.0
        if ts is not None:
            ts -= skew
        after = before = None
        by_id = self.rules.by_id
        wants_time = self.wants_time(h.lits)
        if ts is None and wants_time and self._no_stamps < 32:
            # A file whose lines carry no time stamps (NCCL output) stops being searched.
            after = self._neighbour(h.prev, tc, tags, p.rank)
            before = self._neighbour(h.next, tc, tags, p.rank)
            after = after - skew if after is not None else None
            before = before - skew if before is not None else None
            self._no_stamps = 0 if (after or before) else self._no_stamps + 1
        following = tuple(clean(b.decode("utf-8", "replace")) for b in h.following)
        if tags:
            following = tuple(split_prefix(f, tags).message for f in following)
        cands = tuple(sorted(h.lits))
        ln = Line(doc=doc.path, line=h.line, offset=h.offset, source=source, node=doc.node,
                  rank=rank, message=p.message, prefix=text[:len(text) - len(p.message)],
                  tagged_host=p.tagged_host,
                  ts=ts,
                  ts_res=p.stamp.res if p.stamp else 1.0, after=after, before=before,
                  candidates=self._cands.setdefault(cands, cands), following=following)
        if matches is not None and not self.reference:
            # The confirm step's matches: extract builds the events from them.
            found = found_for(ln, [by_id[r] for r in ln.candidates], {
                r: {k: v for k, v in m.groupdict().items() if v is not None}
                for r, m in sorted(matches.items())})
            # Most of a kept line's memory is this; lines that say the same thing (a warning
            # every rank prints) share one copy, read-only (extract copies what it keeps).
            key = tuple((r, tuple(cp.items()), row) for r, (cp, row) in found.items())
            if len(self._founds) >= self.FOUND_CACHE:
                self._founds.clear()
            ln.found = self._founds.setdefault(key, found)
        return ln

    @staticmethod
    def _neighbour(lines, tc: TimeContext, tags: str, rank: Optional[int]) -> Optional[float]:
        for b in lines:
            p = split_prefix(clean(b.decode("utf-8", "replace")), tags)
            if tags and rank is not None and p.rank is not None and p.rank != rank:
                continue
            t = tc.epoch(p.stamp)
            if t is not None:
                return t
        return None

    @staticmethod
    def _journal_line(doc: Document, h, raw: str, skew: float = 0.0) -> Optional[Line]:
        try:
            rec = json.loads(raw)
        except ValueError:
            doc.notes.append(f"line {h.line}: not valid JSON (truncated?), skipped")
            return None
        if not isinstance(rec, dict):
            return None
        msg = rec.get("MESSAGE")
        if isinstance(msg, list):          # journald emits non-UTF-8 messages as byte arrays
            msg = bytes(x & 0xFF for x in msg if isinstance(x, int)).decode("utf-8", "replace")
        if not isinstance(msg, str):
            return None
        try:
            ts = int(rec.get("__REALTIME_TIMESTAMP")) / 1e6 - skew
        except (TypeError, ValueError):
            ts = None
        kernel = rec.get("_TRANSPORT") == "kernel"
        text = clean(msg)
        return Line(doc=doc.path, line=h.line, offset=h.offset,
                    source=Source.kernel if kernel else Source.system, node=doc.node, rank=None,
                    message=text, ts=ts, ts_res=1e-6,
                    cursor=rec.get("__CURSOR"), candidates=tuple(sorted(h.lits)))


# What forked reader processes inherit (set only while they run): fork shares the compiled rules
# and prefilter with them instead of pickling them per task.
_FORK_STATE = None


def _read_in_worker(indexes: list) -> list:
    reader, jobs, tc = _FORK_STATE
    return [reader._read_one(*jobs[i], tc) for i in indexes]
