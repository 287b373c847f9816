"""PyTorch's NCCL flight recorder: each rank's dump -> where that rank stood in each process group.

With TORCH_NCCL_TRACE_BUFFER_SIZE>0 (TORCH_FR_BUFFER_SIZE in newer releases) and
TORCH_NCCL_DUMP_ON_TIMEOUT=1 every rank writes, when a collective times out, its last collectives
to `<prefix><rank>` (the prefix is TORCH_NCCL_DEBUG_INFO_TEMP_FILE, TORCH_FR_DUMP_TEMP_FILE in
newer releases, default `/tmp/nccl_trace_rank_`). Format 2.x, as FlightRecorderDetail.hpp writes
it: a pickle of plain data,

    {"version": "2.9", "pg_config": {name: {"name", "desc", "ranks": "[0, 1, 2]"}},
     "pg_status": {pg_id: {"last_enqueued_collective", "last_started_collective",
                           "last_completed_collective"}},
     "entries": [{"pg_id", "process_group": (name, desc), "collective_seq_id", "p2p_seq_id",
                  "is_p2p", "profiling_name": "nccl:all_reduce", "state", ...}]}

(the same in JSON where a site dumps JSON). The job wrote it, so it is read with an unpickler
that refuses every class and every persistent id, at most `cap` bytes of it, and in a child
process (slurm_job.in_child) that dies at PER_FILE_S per file or past MEMORY_HEADROOM of new
memory: the C unpickler is quadratic on a dict of colliding keys and allocates gigabytes for a
large memo index, neither of which an in-process check can stop. A dump that breaks any of this
gives a note and nothing else. What comes out (`facts`) is a few numbers per process group:
the rank's last scheduled, started and completed collective, the runs of collectives still in
flight, and the point-to-point operations still waiting on a peer. engine/localize.py reads them
across ranks; the node's Epilog ships them (`ship`, FACTS_NAME) instead of the pickles.
"""
from __future__ import annotations

import gc
import glob
import io
import json
import os
import pickle
import re
import resource
import signal
import time
from collections import Counter
from itertools import islice
from typing import Optional

from .reader import SkipFile, open_regular

FACTS_NAME = "flight-recorder.json"       # what a node ships, in its snapshot
FACTS_FORMAT = "sattrib-flight-recorder/1"
PER_FILE_S = 5.0                          # a dump not read in this long is given up
MEMORY_HEADROOM = 1 << 30                 # new memory the reading child may take
MAX_BYTES = 64 << 20                      # default cap of one dump
MAX_ENTRIES = 65536                       # the last entries read of one dump
MAX_GROUPS = 4096
MAX_MEMBERS = 1 << 17
MAX_RUNS = 64                             # runs of in-flight collectives kept per group
MAX_FACTS_BYTES = 16 << 20                # of a shipped facts file read back

# A dump's name ends in its rank: nccl_trace_rank_12, _dump_12 (NVRx), <prefix>12.
_RANK_AT_END = re.compile(r"(\d{1,7})$")
_DUMP_NAME = re.compile(r"(?:nccl_trace_rank_|_dump_|fr_trace_|flight_recorder_?)\d{1,7}$")
_RANKS_TEXT = re.compile(r"\[\s*(?:\d+\s*(?:,\s*\d+\s*)*)?\]")
_P2P = re.compile(r"(?:nccl:)?(send|recv) (\d+)(?:->|<-)(\d+)$")
_UNSAFE = re.compile(r"[^A-Za-z0-9_.<>-]+")
STATES = ("scheduled", "started", "completed")


def rank_of(name: str) -> Optional[int]:
    """The rank a dump is of, from its file name (PyTorch appends it to the prefix)."""
    m = _RANK_AT_END.search(name)
    return int(m.group(1)) if m else None


def sniff(name: str, head: bytes) -> Optional[str]:
    """"dump" for a flight-recorder dump (a pickle, or PyTorch's JSON form, whose name ends in
    a rank), "facts" for a node's shipped facts, else None."""
    if head.startswith(b'{"format": "' + FACTS_FORMAT.encode()):
        return "facts"
    if rank_of(name) is None:
        return None
    if _DUMP_NAME.search(name):       # named as one: read as one (a note if it is not)
        return "dump"
    if head[:1] == b"\x80" and head[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"):
        return "dump" if b"pg_config" in head or b"entries" in head else None
    if head.lstrip()[:1] == b"{" and b'"pg_config"' in head[:65536]:
        return "dump"
    return None


# -- reading one dump (in the child) ------------------------------------------------------------
class _PlainData(pickle.Unpickler):
    """The format is dicts, lists, tuples, strings and numbers: any class is refused."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"it refers to {module[:60]}.{name[:60]}")

    def persistent_load(self, pid):
        raise pickle.UnpicklingError("it refers to a persistent object")


def loads(data: bytes):
    """A dump's content (a pickle, or JSON): plain data, or an exception saying why not."""
    if data.lstrip()[:1] == b"{":
        return json.loads(data.decode("utf-8", "replace"))
    gc.disable()                  # millions of small containers: the collector would rescan them
    try:
        # A buffered reader: the C unpickler then reads ahead instead of calling read() for
        # each opcode (three times slower).
        return _PlainData(io.BufferedReader(io.BytesIO(data))).load()
    finally:
        gc.enable()


def _int(v) -> Optional[int]:
    if isinstance(v, bool):
        return None
    if isinstance(v, int) and -(1 << 62) < v < 1 << 62:
        return v
    if isinstance(v, str) and 0 < len(v) < 20 and v.lstrip("-").isdigit():
        return int(v)
    return None


def _word(v, n: int = 80) -> Optional[str]:
    """A name from the dump as a word of safe characters (the job chose it)."""
    if not isinstance(v, str):
        return None
    w = _UNSAFE.sub("_", v[:n])
    return w if w.strip("_") else None


def _members(v) -> Optional[list]:
    if isinstance(v, str) and len(v) < 16 * MAX_MEMBERS and _RANKS_TEXT.fullmatch(v):
        ranks = [int(x) for x in re.findall(r"\d+", v)]
    elif isinstance(v, (list, tuple)) and len(v) <= MAX_MEMBERS:
        ranks = [r for r in map(_int, v) if r is not None]
    else:
        return None
    return ranks if 0 < len(ranks) <= MAX_MEMBERS and len(set(ranks)) == len(ranks) else None


class _Group:
    def __init__(self, name: str, desc: Optional[str], members: Optional[list]):
        self.name, self.desc, self.members = name, desc, members
        self.scheduled = self.started = self.completed = None
        self.pending: dict = {}           # seq -> (op, state)
        self.p2p: dict = {}               # (kind, peer) -> [first seq, count, state]
        self.has_p2p = False

    def see(self, seq: int, op: str, state: str) -> None:
        if self.scheduled is None or seq > self.scheduled:
            self.scheduled = seq
        if state == "completed":
            if self.completed is None or seq > self.completed:
                self.completed = seq
            return
        if state == "started" and (self.started is None or seq > self.started):
            self.started = seq
        self.pending[seq] = (op, state)

    def status(self, st: dict) -> None:
        """pg_status counters: only for a group with no point-to-point work on this rank (its
        counters then mix collective and point-to-point sequence numbers)."""
        if self.has_p2p:
            return
        for key, field in (("last_enqueued_collective", "scheduled"),
                           ("last_started_collective", "started"),
                           ("last_completed_collective", "completed")):
            v = _int(st.get(key))
            if v is not None and v >= 0:
                cur = getattr(self, field)
                setattr(self, field, v if cur is None else max(cur, v))

    def out(self) -> dict:
        runs: list = []
        for seq in sorted(self.pending):
            op, state = self.pending[seq]
            if runs and runs[-1][1] == seq - 1 and runs[-1][2:] == [op, state]:
                runs[-1][1] = seq
            else:
                runs.append([seq, seq, op, state])
        p2p = [[k, peer, *v] for (k, peer), v in sorted(self.p2p.items())]
        return {"pg": self.name, "desc": self.desc, "ranks": self.members,
                "scheduled": self.scheduled, "started": self.started,
                "completed": self.completed, "pending": runs[:MAX_RUNS],
                "pending_cut": max(0, len(runs) - MAX_RUNS), "p2p": p2p[:MAX_RUNS]}


def facts(dump, rank: int) -> dict:
    """A loaded dump -> {"rank", "version", "entries", "groups": [...], "notes": [...]}: for each
    process group this rank is in, how far it got. Reads only known fields at known depths, of
    at most MAX_ENTRIES entries and MAX_GROUPS groups (what the job wrote is never walked)."""
    if not isinstance(dump, dict) or not isinstance(dump.get("pg_config"), dict):
        raise ValueError("it is not a flight-recorder dump (no dict of process groups)")
    notes: list = []
    version = dump.get("version")
    version = version if isinstance(version, str) and len(version) < 16 else None
    if version is None or not version.startswith("2."):
        notes.append(f"format version {version or 'unknown'}: read as version 2.x")
    config = dump.get("pg_config")
    groups: dict = {}
    if isinstance(config, dict):
        for key, c in islice(config.items(), MAX_GROUPS):
            name = _word(c.get("name") if isinstance(c, dict) else None) or _word(key, 64)
            if name and isinstance(c, dict):
                groups[name] = _Group(name, _word(c.get("desc")), _members(c.get("ranks")))
        if len(config) > MAX_GROUPS:
            notes.append(f"{len(config)} process groups: the first {MAX_GROUPS} read")
    entries = dump.get("entries")
    if entries is None:
        entries = []
    if not isinstance(entries, list):
        raise ValueError("its entries are not a list")
    if len(entries) > MAX_ENTRIES:
        notes.append(f"{len(entries)} entries: the last {MAX_ENTRIES} read")
    pg_ids, bad = {}, Counter()
    newest = _entries(entries[-MAX_ENTRIES:], groups, pg_ids, bad)
    status = dump.get("pg_status")
    if isinstance(status, dict):
        for key, st in islice(status.items(), MAX_GROUPS):
            name = pg_ids.get(_int(key))
            if name in groups and isinstance(st, dict):
                groups[name].status(st)
    notes += [f"{n} entries skipped: {why}" for why, n in sorted(bad.items())]
    return {"rank": rank, "version": version, "entries": len(entries), "time_ns": newest,
            "groups": [groups[n].out() for n in sorted(groups)], "notes": notes}


def _entries(entries: list, groups: dict, pg_ids: dict, bad: Counter) -> Optional[int]:
    """Record each entry in its group; when the newest was created (ns since the epoch, the
    rank's own clock). A dump holds thousands: the group and operation names are looked up
    once per distinct value, the fields by exact type."""
    by_pg: dict = {}                  # process_group value -> _Group, or a reason to skip
    ops: dict = {}                    # profiling_name -> the operation's word
    newest = None
    for e in entries:
        if type(e) is not dict:
            bad["not a dict"] += 1
            continue
        get = e.get
        pg = get("process_group")
        try:
            g = by_pg[pg]
        except KeyError:
            g = by_pg[pg] = _group_of(pg, groups)
        except TypeError:             # a list (JSON dumps) or something unhashable
            g = _group_of(pg, groups)
        state = get("state")
        if type(g) is str or state not in STATES:
            bad[g if type(g) is str else "no state"] += 1
            continue
        pid = get("pg_id")
        if type(pid) is int:
            pg_ids[pid] = g.name
        t = get("time_created_ns")
        if type(t) is int and 0 < t < 1 << 62 and (newest is None or t > newest):
            newest = t
        if get("is_p2p") is True:
            why = _p2p_entry(g, get("profiling_name"), _int(get("p2p_seq_id")), state)
            if why:
                bad[why] += 1
            continue
        seq = get("collective_seq_id")
        if type(seq) is not int:
            seq = _int(seq)
        if seq is None or seq < 0:
            bad["no collective sequence id"] += 1
            continue
        if state == "completed":
            g.see(seq, "", state)
            continue
        raw = get("profiling_name")
        try:
            op = ops[raw]
        except (KeyError, TypeError):
            op = (_word(raw.removeprefix("nccl:"), 40) if isinstance(raw, str) else None) \
                or "collective"
            if isinstance(raw, str):
                ops[raw] = op
        g.see(seq, op, state)
    return newest


def _group_of(pg, groups: dict):
    """The group of an entry's process_group (name, desc), or why there is none."""
    if not (isinstance(pg, (tuple, list)) and len(pg) == 2):
        return "no process group"
    name = _word(pg[0], 64)
    if name is None:
        return "no process group name"
    g = groups.get(name)
    if g is None:
        if len(groups) >= MAX_GROUPS:
            return "too many process groups"
        g = groups[name] = _Group(name, _word(pg[1]), None)
    return g


def _p2p_entry(g: _Group, label, seq: Optional[int], state: str) -> Optional[str]:
    """A send or receive still in flight, by the peer it waits on (`nccl:send 0->3`,
    `nccl:recv 0<-1`: group-local ranks, this one first); why it was skipped, or None."""
    g.has_p2p = True
    m = _P2P.match(label) if isinstance(label, str) else None
    if m is None or seq is None:
        return "a point-to-point entry without its peer"
    if state == "completed":
        return None
    local = int(m.group(3))
    if g.members is None or local >= len(g.members):
        return "a point-to-point peer outside its group"
    slot = g.p2p.setdefault((m.group(1), g.members[local]), [seq, 0, state])
    slot[1] += 1
    if seq < slot[0]:
        slot[0], slot[2] = seq, state
    return None


def read_one(path: str, owner: Optional[int], cap: int) -> dict:
    """One dump's facts, or {"note": why not}. The only place a dump is opened: as the job's
    user where the caller runs as root (slurm_job.in_child), never following a link."""
    rank = rank_of(os.path.basename(path))
    try:
        fd, st = open_regular(path, owner=owner)
    except SkipFile as e:
        return {"rank": rank, "note": str(e)}
    try:
        if st.st_size > cap:
            return {"rank": rank, "note": f"{st.st_size} bytes, above the cap of {cap} (not read)"}
        data = os.pread(fd, cap + 1, 0)
    except OSError as e:
        return {"rank": rank, "note": f"cannot read: {e.strerror}"}
    finally:
        os.close(fd)
    try:
        return facts(loads(data), rank)
    except (pickle.UnpicklingError, ValueError, EOFError, TypeError, KeyError, IndexError,
            AttributeError, MemoryError, RecursionError, OverflowError, UnicodeError) as e:
        return {"rank": rank, "note": f"not read: not a plain-data flight-recorder dump "
                                      f"({type(e).__name__}: {str(e)[:160]})"}


_guarded = False


def _guard() -> None:
    """In the reading child, once: the memory it may take, and death (the default action of
    SIGALRM) for a read that does not end; a C-level loop never returns to check a flag."""
    global _guarded
    if _guarded:
        return
    _guarded = True
    try:
        with open("/proc/self/statm") as f:
            size = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        want = size + MEMORY_HEADROOM
        if hard == resource.RLIM_INFINITY or want < hard:
            resource.setrlimit(resource.RLIMIT_AS, (want, hard))
    except (OSError, ValueError):
        pass
    signal.signal(signal.SIGALRM, signal.SIG_DFL)


def _read_guarded(path: str, owner: Optional[int], cap: int) -> dict:
    _guard()
    signal.setitimer(signal.ITIMER_REAL, PER_FILE_S)
    try:
        return read_one(path, owner, cap)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def read_all(paths: list, owner: Optional[int], cap: int, deadline: float,
             workers: int = 1, as_user: Optional[tuple] = None) -> list:
    """read_one for each path, in one child process at a time (slurm_job.in_child); a dump
    that kills its child (too slow, too big) is noted and the next child goes on after it.
    `workers` > 1: that many such sequences side by side, on consecutive slices of the paths
    (a 1,024-rank job's dumps are a second of CPU per 40 ranks). `as_user` = (uid, gid): the
    children read as that user, never as root (a node's Epilog reading the job's dumps)."""
    if workers > 1 and len(paths) > 1:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor
        n = min(workers, len(paths))
        cut = [len(paths) * i // n for i in range(n + 1)]
        parts = [paths[a:b] for a, b in zip(cut, cut[1:])]
        with ProcessPoolExecutor(n, mp_context=multiprocessing.get_context("fork")) as ex:
            return [r for got in ex.map(read_all, parts, [owner] * n, [cap] * n,
                                        [deadline] * n, [1] * n, [as_user] * n) for r in got]
    from .slurm_job import in_child
    out: dict = {}
    start = 0
    while start < len(paths) and time.monotonic() < deadline:
        base = start
        try:
            done, timed_out = in_child(len(paths) - base,
                                       lambda i: _read_guarded(paths[base + i], owner, cap),
                                       deadline, as_user=as_user)
        except OSError as e:
            for i in range(base, len(paths)):
                out[i] = {"note": f"not read: cannot start the reader ({e.strerror})"}
            break
        out.update((base + i, r) for i, r in done.items())
        stuck = next((i for i in range(base, len(paths)) if i not in out), None)
        if stuck is None or timed_out:
            break
        out[stuck] = {"rank": rank_of(os.path.basename(paths[stuck])),
                      "note": f"not read: reading it took longer than {PER_FILE_S:.0f} s or "
                              f"more than {MEMORY_HEADROOM >> 20} MiB"}
        start = stuck + 1
    return [out.get(i) or {"rank": rank_of(os.path.basename(p)),
                           "note": "not read: no time left"} for i, p in enumerate(paths)]


# -- a node's facts, shipped by its Epilog ------------------------------------------------------
def facts_text(dumps: list) -> str:
    """The file a node ships: [{"source": path, "rank", facts... or "note"}] under a header."""
    return json.dumps({"format": FACTS_FORMAT, "dumps": dumps}) + "\n"      # the format first


def read_facts(data: bytes) -> tuple[list, list]:
    """(dumps, notes) of a shipped facts file: each dump's facts as `facts` gave them (a dump
    without its groups is kept with its note); anything else is skipped with a note."""
    if len(data) > MAX_FACTS_BYTES:
        return [], [f"more than {MAX_FACTS_BYTES >> 20} MiB (not read)"]
    try:
        doc = json.loads(data.decode("utf-8", "replace"))
    except (ValueError, RecursionError) as e:
        return [], [f"not valid JSON ({str(e)[:120]})"]
    dumps = doc.get("dumps") if isinstance(doc, dict) else None
    if not isinstance(dumps, list):
        return [], ["no list of dumps in it"]
    out, bad = [], 0
    for d in dumps[:MAX_GROUPS]:
        if isinstance(d, dict) and _int(d.get("rank")) is not None and isinstance(
                d.get("groups", []), list):
            out.append(d)
        else:
            bad += 1
    return out, [f"{bad} dumps without a rank skipped"] if bad else []


def ship(globs: list, job, cap: int, deadline: float, notes: list,
         gid: Optional[int] = None) -> Optional[str]:
    """What a node's Epilog ships for the job's flight-recorder dumps: the facts file's text,
    or None when there are none. A dump counts when it matches one of `globs` (%j = job id,
    %u = user, %N = this node), is a regular file owned by the job's user and was written after the job
    started; the globbing and the reading run in children with deadlines (a hung mount), as the
    job's user (uid, `gid`), never as root."""
    from .slurm_job import expand_pattern, in_child

    def find(_):
        since = (job.start or 0) - 60          # written while the job ran (clocks a minute off)
        found = set()
        for g in globs:
            g = expand_pattern(g, glob.escape(job.job_id), user=glob.escape(job.user or ""),
                               node=glob.escape(job.node or ""))
            for p in sorted(glob.glob(g))[:4096]:
                try:
                    if (os.lstat(p).st_mtime >= since
                            and rank_of(os.path.basename(p)) is not None):
                        found.add(p)
                except OSError:
                    continue
        return {"paths": sorted(found)}
    if deadline - time.monotonic() < 1.0:
        notes.append("flight-recorder dumps not looked for: no time left in the Epilog's budget")
        return None
    try:
        done, timed_out = in_child(1, find, deadline, as_user=(job.uid, gid))
    except OSError as e:
        notes.append(f"flight-recorder dumps not looked for: {e.strerror}")
        return None
    if not done:
        notes.append("flight-recorder dumps not looked for: "
                     + ("their folders did not answer" if timed_out else "the search failed"))
        return None
    paths = done[0]["paths"]
    if not paths:
        return None
    got = read_all(paths, job.uid, cap, deadline, as_user=(job.uid, gid))
    dumps = [dict(r, source=p) for p, r in zip(paths, got)]
    notes.extend(f"{p}: {r['note']}" for p, r in zip(paths, got) if r.get("note"))
    return facts_text(dumps)
