"""The rules pipeline: (bundle, rules) -> Diagnosis. Pure: no I/O, no clock, no randomness.

Stages, top to bottom:

    extract    lines -> events: run the rules a line's literals point at, keep the ones whose
               source the rule trusts, apply the rule's decoder
    filter     drop events outside the job's time window and duplicates
    correlate  rank <-> node <-> GPU, peers named in errors, a rank's exit time
    refine     group root events into incidents per node; hardware/infrastructure incidents
               absorb the program-side errors they explain; teardown after a scheduler
               terminator is noise
    verdict    the earliest incident wins; two that cannot be ordered and fit equally make
               the diagnosis ambiguous; nothing supported leaves it unattributed

Order: within one file, lines are ordered by position. Across files, an event is known to come
before another only when its time interval ends before the other's begins; untimed lines take
the interval between the nearest timestamped lines around them.
"""
from __future__ import annotations

import re
import string
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Iterable, Optional

from . import decode
from .decode import Event, normalize_pci
from .xid import meaning as xid_meaning
from .lineparse import TimeContext, iso_utc, nccl_host, parse_stamp_text
from .models import (Bundle, Cause, Completeness, Diagnosis, Evidence, JobSummary, Line,
                     Symptom)
from .catalog import lookup
from .rules import RuleSet
from .taxonomy import (FAMILY, INFRASTRUCTURE, TERMINATORS, Action, Category, Outcome, Role,
                       Source)

TRUSTED = {Source.kernel, Source.system, Source.gpu, Source.dcgm, Source.ib, Source.scheduler}
ROLE_ORDER = {Role.root: 0, Role.confirmation: 1, Role.symptom: 2, Role.context: 3}
MAX_EVIDENCE_PER_GROUP = 3
MAX_INCIDENT_EVIDENCE = 40


@dataclass
class Settings:
    window_before: float = 600.0     # seconds before job start that still count
    window_after: float = 300.0      # seconds after job end that still count (clock skew)
    clock_skew: float = 0.0          # tolerance when ordering events of different nodes
    utc_offset: int = 0
    burst_gap: float = 6 * 3600.0    # without a job window: silence that separates failures


@dataclass
class Incident:
    node: Optional[str]
    family: str
    events: list = field(default_factory=list)
    tier: int = 2                    # 3 = infrastructure fact from a trusted source
    timed: bool = True

    @property
    def first(self) -> Event:
        return self.events[0]

    fixed: Optional[Category] = None

    def fix_category(self) -> None:
        """Decide the category from the events' roles as found, before the verdict turns the
        winner's other roots into confirmations."""
        self.fixed = None
        self.fixed = self.category

    @property
    def category(self) -> Category:
        if self.fixed is not None:
            return self.fixed
        roots = [e for e in self.events if e.role == Role.root]
        trusted = [e for e in roots if not e.weak and e.source in TRUSTED]
        # A hardware fact outranks a program-level one in the same incident (an Xid 48 beside
        # the Xid 31 it caused on the same GPU in the same second).
        strong = [e for e in trusted if e.category in INFRASTRUCTURE] or trusted or roots \
            or self.events
        if any("device_lost" in e.tags for e in self.events if e.source in TRUSTED):
            return Category.gpu_hardware
        return strong[0].category

    @property
    def gpu(self) -> Optional[str]:
        for e in self.events:
            if e.role == Role.root and e.gpu:
                return e.gpu
        for e in self.events:
            if e.gpu:
                return e.gpu
        return None

    def rank(self, links: "Links") -> Optional[int]:
        """The culprit rank: the rank that raised a program-side cause, or the rank whose GPU
        is the culprit GPU. None when no rank is tied to the cause."""
        if self.category in PROGRAM or self.category == Category.host_oom:
            for e in self.events:
                if e.rank is not None and e.source == Source.stderr:
                    return e.rank
        gpu = self.gpu
        if gpu:
            for e in self.events:
                if e.rank is not None and links.rank_gpu.get(e.rank) == gpu:
                    return e.rank
        return None


# ============================================================================================
# extract
# ============================================================================================


class _Fmt(string.Formatter):
    def get_value(self, key, args, kwargs):
        v = kwargs.get(key)
        return "?" if v is None or v == "" else v

    def format_field(self, value, spec):
        try:
            return super().format_field(value, spec)
        except (ValueError, TypeError):
            return str(value)


_FMT = _Fmt()


def _explain(ev: Event) -> str:
    vals = dict(ev.caps)
    vals.update(node=ev.node, rank=ev.rank, gpu=ev.gpu, detail=ev.detail, peer=ev.peer)
    try:
        text = _FMT.format(ev.rule.explain, **vals)
    except (ValueError, IndexError, KeyError, AttributeError):
        text = ev.rule.explain
    return " ".join(text.split())[:300]


def extract(lines: Iterable[Line], rules: RuleSet, tc: TimeContext,
            notes: Counter) -> list[Event]:
    by_source: dict[Source, list] = defaultdict(list)
    for c in rules.rules:
        for s in c.rule.source:
            by_source[s].append(c)
    events: list[Event] = []
    for ln in lines:
        cands = ([rules.by_id[r] for r in ln.candidates if r in rules.by_id]
                 if ln.candidates is not None else by_source.get(ln.source, []))
        hits = []
        for c in cands:
            if ln.source not in c.rule.source:
                # Looks like (say) a kernel line but came from rank output: not evidence.
                if c.rule.source == [Source.kernel] and c.search(ln.message):
                    notes[f"{ln.doc}: kernel-looking lines in {ln.source.value} output "
                          "ignored (kernel evidence comes only from kernel logs)"] += 1
                continue
            m = c.search(ln.message)
            if m:
                hits.append((c, m))
        if any(not c.rule.fallback for c, _ in hits):
            hits = [(c, m) for c, m in hits if not c.rule.fallback]
        elif any(not c.rule.catch_all for c, _ in hits):
            hits = [(c, m) for c, m in hits if not c.rule.catch_all]
        for c, m in hits:
            events.append(_event(ln, c, {k: v for k, v in m.groupdict().items()
                                         if v is not None}, tc))
    events.sort(key=Event.sort_key)
    return events


def _event(ln: Line, compiled, caps: dict, tc: TimeContext) -> Event:
    rule = compiled.rule
    ev = Event(rule=rule, line=ln, caps=caps, category=rule.category, role=rule.role,
               source=ln.source, node=ln.node, rank=ln.rank, action=rule.action,
               last_resort=rule.last_resort, explained_by=tuple(rule.explained_by))
    nh = nccl_host(ln.message)
    if nh and "nccl_host" not in caps:
        caps["nccl_host"], caps["nccl_dev"] = nh[0], str(nh[1])
    if "rank" in caps and caps["rank"].isdigit():
        ev.rank = int(caps["rank"])
    if "pci" in caps:
        ev.gpu = normalize_pci(caps["pci"])
    if "peer" in caps:
        ev.peer = caps["peer"]
    if "pid" in caps and caps["pid"].strip("'").isdigit():
        ev.pid = int(caps["pid"].strip("'"))
    if compiled.rows:
        _classify(ev, compiled.rows, caps.get(rule.catalog_key) or ln.message)
    if rule.decode:
        decode.DECODERS[rule.decode](ev, tc)
    if ev.when is None and caps.get("at"):
        ev.when = tc.epoch(parse_stamp_text(caps["at"]))
    if ln.ts is not None:
        ev.lo, ev.hi = ln.ts, ln.ts + ln.ts_res
    elif ev.when is not None:
        ev.lo, ev.hi = ev.when, ev.when + 1.0
    else:
        ev.lo = ln.after
        ev.hi = None if ln.before is None else ln.before + 1.0
    return ev


def _classify(ev: Event, rows, text: str) -> None:
    """The message catalog's row for this message, when one matches, says what it is."""
    row = lookup(rows, text)
    if row is None:
        return
    ev.role = row.role
    ev.category = row.category
    if row.action is not None:
        ev.action = row.action
    ev.weak = ev.weak or row.weak
    ev.last_resort = row.last_resort
    if row.explained_by:
        ev.explained_by = row.explained_by
    if row.teardown:
        ev.tag("teardown")
    ev.catalog_row = row.where
    if row.note:
        ev.detail = row.note


# ============================================================================================
# filter
# ============================================================================================


def filter_events(events: list[Event], bundle: Bundle, st: Settings,
                  notes: Counter) -> list[Event]:
    job = bundle.job
    lo = job.start - st.window_before if job.start else None
    hi = job.end + st.window_after if job.end else None
    if lo is None and hi is None:
        lo = _last_burst(events, st.burst_gap)
        if lo is not None:
            notes["no job time window: events before the last burst of errors (more than "
                  f"{int(st.burst_gap // 3600)} h before it) were taken as earlier failures "
                  "and ignored"] += 1
    out, seen = [], set()
    for ev in events:
        if lo is not None and ev.hi is not None and ev.hi < lo:
            notes[f"{ev.line.doc}: events before the job's time window ignored"] += 1
            continue
        if hi is not None and ev.lo is not None and ev.lo > hi:
            notes[f"{ev.line.doc}: events after the job's time window ignored"] += 1
            continue
        if ev.source in (Source.kernel, Source.system):
            # The same kernel line in journal.log and dmesg.txt of one node counts once.
            key = (ev.node, ev.rule.id, ev.line.message, None if ev.lo is None else int(ev.lo))
            if key in seen:
                continue
            seen.add(key)
        out.append(ev)
    return out


def _last_burst(events: list[Event], gap: float) -> Optional[float]:
    """Without the job's time window, the failure that ended the job is the latest burst: the
    start of the last run of time-stamped error events with no silence longer than `gap`
    inside it (minus the same margin a job window has). None when nothing is time-stamped or
    it is all one burst."""
    times = sorted(e.lo for e in events if e.lo is not None and e.role != Role.context)
    if len(times) < 2:
        return None
    start = times[0]
    for a, b in zip(times, times[1:]):
        if b - a > gap:
            start = b
    return None if start == times[0] else start - 600.0


# ============================================================================================
# correlate
# ============================================================================================


@dataclass
class Links:
    rank_node: dict = field(default_factory=dict)
    rank_gpu: dict = field(default_factory=dict)      # rank -> PCI address
    node_gpu_index: dict = field(default_factory=dict)  # (node, cuda dev) -> PCI address
    rank_exit: dict = field(default_factory=dict)     # rank -> (time, exit code)
    host_node: dict = field(default_factory=dict)     # host name or IP -> node
    pid_rank: dict = field(default_factory=dict)      # (node, pid) -> rank
    gpu_identity: dict = field(default_factory=dict)  # (node, pci) -> {"uuid", "serial"}


def _resolve_host(host: Optional[str], nodes: set) -> Optional[str]:
    if not host:
        return None
    h = host.strip().strip("[]")
    if "<" in h:
        h = h.split("<", 1)[0]
    if h in nodes:
        return h
    short = h.split(".")[0]
    if short in nodes and not short.isdigit():
        return short
    if not nodes and _PLAIN_HOST.match(h) and not _IP.match(h):
        # No node list and no node folders (one job-level log): the host the emitter's own
        # prefix or message names is the only word on where it happened.
        return short
    return None


def correlate(events: list[Event], bundle: Bundle) -> Links:
    job = bundle.job
    nodes = set(job.nodes) | set(bundle.node_dirs)
    L = Links()
    # Hosts named in NCCL line prefixes and torchelastic reports are nodes (or their FQDN).
    for ev in events:
        for h in (ev.caps.get("host"), ev.caps.get("nccl_host")):
            n = _resolve_host(h, nodes)
            if n:
                L.host_node[h] = n
    # rank -> node: a rank's line in a node folder, or a line whose prefix names the host.
    votes: dict[int, Counter] = defaultdict(Counter)
    for ev in events:
        if ev.rank is None:
            continue
        n = ev.line.node or _resolve_host(ev.caps.get("host") or ev.caps.get("nccl_host"), nodes)
        if n and ev.rule.decode != "childfailed":
            votes[ev.rank][n] += 1
        if ev.rule.decode == "childfailed":
            n = _resolve_host(ev.caps.get("host"), nodes)
            if n:
                votes[ev.rank][n] += 10
    for ev in events:                     # srun: error: <node>: tasks 32-35,37: ...
        if ev.rule.decode == "srun_exit" and ev.caps.get("tasks"):
            n = _resolve_host(ev.caps.get("node"), nodes)
            for r in _ranks(ev.caps["tasks"]):
                if n:
                    votes[r][n] += 5
    for r, c in votes.items():
        L.rank_node[r] = sorted(c.items(), key=lambda kv: (-kv[1], kv[0]))[0][0]
    if job.nodes and job.num_tasks and job.tasks_per_node and \
            job.num_tasks == len(job.nodes) * job.tasks_per_node:
        for r in range(job.num_tasks):   # block distribution, only where nothing else said
            L.rank_node.setdefault(r, job.nodes[r // job.tasks_per_node])
    # GPUs: NCCL's ncclCommInitRank line maps rank and CUDA device to a bus id.
    for ev in events:
        if ev.caps.get("busid") and ev.rank is not None:
            pci = normalize_pci(_busid(ev.caps["busid"]))
            L.rank_gpu[ev.rank] = pci
            node = ev.line.node or L.rank_node.get(ev.rank)
            if node and ev.caps.get("dev", "").isdigit():
                L.node_gpu_index[(node, int(ev.caps["dev"]))] = pci
    for ev in events:
        if ev.rule.decode == "childfailed" and ev.rank is not None and ev.when is not None:
            L.rank_exit[ev.rank] = (ev.when, ev.caps.get("exitcode"))
    # GPU identity: the kernel's "GPU at PCI:...: GPU-<uuid>" line (and the serial line right
    # after it) and nvidia-smi's serial/UUID fields, per (node, PCI address).
    last_pci: dict = {}
    for ev in sorted((e for e in events if e.rule.id in ("gpu.identity", "gpu.smi_identity")),
                     key=Event.sort_key):
        node = ev.node or ev.line.node
        key_doc = ev.line.doc
        if ev.gpu:
            last_pci[key_doc] = ev.gpu
        pci = ev.gpu or last_pci.get(key_doc)
        if not (node and pci):
            continue
        ident = L.gpu_identity.setdefault((node, pci), {})
        if ev.caps.get("uuid"):
            ident.setdefault("uuid", ev.caps["uuid"])
        if ev.caps.get("serial"):
            ident.setdefault("serial", ev.caps["serial"])
        what, value = ev.caps.get("what", ""), ev.caps.get("value", "")
        if "uuid" in what:
            ident.setdefault("uuid", value)
        elif "serial" in what and value.isdigit() and set(value) != {"0"}:
            ident.setdefault("serial", value)
    # Apply: fill node, GPU and time bounds that a single line could not know.
    for ev in events:
        if ev.node is None:
            n = _resolve_host(ev.caps.get("node"), nodes) or \
                _resolve_host(ev.caps.get("nccl_host"), nodes)
            if n is None and _PLAIN_HOST.match(ev.caps.get("node") or "") and (
                    ev.source == Source.scheduler or FAMILY.get(ev.category) == "workload"):
                # Slurm itself names the node. In job output the line could be the user's own
                # text, which is believed only where it cannot take a node out of service.
                n = ev.caps["node"]
            if n is None and ev.rank is not None:
                n = L.rank_node.get(ev.rank)
            ev.node = n
        if ev.gpu is None and ev.source == Source.stderr and ev.category in (
                Category.cuda_oom, Category.gpu_hardware, Category.gpu_memory_ecc,
                Category.nvlink):
            if ev.caps.get("gpu_index", "").isdigit() and ev.node:
                ev.gpu = L.node_gpu_index.get((ev.node, int(ev.caps["gpu_index"])))
            if ev.gpu is None and ev.rank is not None:
                ev.gpu = L.rank_gpu.get(ev.rank)
        if ev.peer:
            n = _resolve_host(ev.peer, nodes) or L.host_node.get(ev.peer.split("<")[0])
            if n:
                ev.tag(f"points_at:{n}")
        if ev.rank is not None and ev.rank in L.rank_exit and ev.source == Source.stderr:
            t = L.rank_exit[ev.rank][0] + 1.0
            # A rank's own error came before that rank's process exited.
            if ev.hi is None or ev.hi > t:
                ev.hi = t
    return L


_PLAIN_HOST = re.compile(r"^[A-Za-z0-9][\w.-]{0,63}$")
_IP = re.compile(r"^(?:\d{1,3}\.){3}\d{1,3}$|^[0-9a-fA-F:]*:[0-9a-fA-F:]*$")


def _busid(b: str) -> str:
    b = b.lower()
    if ":" in b:
        return b
    b = b.rjust(5, "0")        # NCCL prints busId 4e000 = bus 4e, device 00, function 0
    return f"{b[:-3]}:{b[-3:-1]}.{b[-1]}"


def _ranks(spec: str) -> list[int]:
    out = []
    for part in spec.split(","):
        if "-" in part:
            a, b = part.split("-", 1)
            if a.isdigit() and b.isdigit() and int(b) - int(a) < 100_000:
                out.extend(range(int(a), int(b) + 1))
        elif part.isdigit():
            out.append(int(part))
    return out


def _recast(events: list[Event]) -> None:
    """Context lines that say what a later error in the same file means (rule `recasts`)."""
    by_doc: dict[str, list[Event]] = defaultdict(list)
    for e in events:
        by_doc[e.line.doc].append(e)
    for doc in sorted(by_doc):
        evs = sorted(by_doc[doc], key=Event.sort_key)
        for i, ctx in enumerate(evs):
            rc = ctx.rule.recasts
            if rc is None:
                continue
            for e in evs[i + 1:]:
                if e.line.offset - ctx.line.offset > rc.within_bytes:
                    break
                if e.rule.id in rc.rules and e.role == Role.root:
                    e.category = rc.category
                    if rc.action != Action.none:
                        e.action = rc.action
                    e.why = rc.why


REPEAT_PROCESSES = 3


def _repeats_across_processes(events: list[Event]) -> None:
    """An application-level Xid (13, 31) that one GPU raised for several unrelated processes,
    and no other GPU of the node did, is that GPU's fault (NVIDIA's Xid 13/31 workflow)."""
    groups: dict[tuple, list[Event]] = defaultdict(list)
    for e in events:
        if "repeat_implicates_gpu" in e.tags and e.source in TRUSTED and e.gpu:
            groups[(e.node, e.caps.get("xid"))].append(e)
    for (node, code), evs in sorted(groups.items(), key=lambda kv: str(kv[0])):
        gpus = {e.gpu for e in evs}
        pids = {e.pid for e in evs if e.pid is not None}
        if len(gpus) != 1 or len(pids) < REPEAT_PROCESSES:
            continue
        for e in evs:
            e.category, e.role, e.weak = Category.gpu_hardware, Role.root, False
            e.action = Action.reset_gpu
            e.tags = e.tags - {"restart_app"}
            e.detail = (f"Xid {code} from {len(pids)} different processes on this GPU only: "
                        "the GPU, not one program")


# ============================================================================================
# refine
# ============================================================================================


def precedes(a: Event, b: Event, skew: float = 0.0) -> bool:
    """True when a is known to have happened before b."""
    if a.line.doc == b.line.doc:
        return a.line.offset < b.line.offset
    if a.hi is None or b.lo is None:
        return False
    tol = skew if (a.node != b.node) else 0.0
    return a.hi + tol <= b.lo


def _earliest(events: list[Event], skew: float) -> Event:
    """An event no other one is known to precede (first in input order among those)."""
    for e in events:
        if not any(precedes(o, e, skew) for o in events if o is not e):
            return e
    return events[0]


def _group(family: str) -> str:
    """A GPU's own faults and its NVLink faults are one incident: a lost GPU takes its links
    down, and a link fault surfaces as GPU errors."""
    return "gpu" if family == "nvlink" else family


def _joins(ev: Event, inc: Incident) -> bool:
    fam = _group(FAMILY[ev.category])
    if fam == inc.family:
        return True
    # Errors a rank sees that a trusted incident on its node explains (a CUDA error under a
    # GPU that fell off the bus): the rule or its catalog row says which families explain it.
    return inc.family in {_group(f) for f in ev.explained_by}


def build_incidents(events: list[Event], skew: float) -> list[Incident]:
    roots = [e for e in events if e.role == Role.root and e.category is not None
             and e.category not in TERMINATORS]
    strong = [e for e in roots if e.category in INFRASTRUCTURE and e.source in TRUSTED
              and not e.weak]
    strong_set = set(map(id, strong))
    incidents: dict[tuple, Incident] = {}
    for e in strong:
        key = (e.node, _group(FAMILY[e.category]))
        inc = incidents.setdefault(key, Incident(e.node, _group(FAMILY[e.category]), tier=3))
        inc.events.append(e)
    # Program-side errors join the incident on their node that explains them.
    for e in roots:
        if e in strong:
            continue
        target = None
        for key, inc in sorted(incidents.items(), key=lambda kv: str(kv[0])):
            node = key[0]
            if inc.tier == 3 and _joins(e, inc) and (node == e.node or (
                    e.node is None and e.category == inc.category)):
                target = inc
                break
        if target is None:
            tier = 1 if e.last_resort else 2
            key = (e.node, e.category.value, tier)
            target = incidents.setdefault(key, Incident(e.node, _group(FAMILY[e.category]),
                                                        tier=tier))
        target.events.append(e)
    # What a rank saw of a fault (a CUDA "unknown error" under a lost GPU) corroborates the
    # trusted incident on its node that explains it; alone it is no cause.
    for e in events:
        if e.role == Role.confirmation and e.category is not None and e.explained_by:
            for key, inc in sorted(incidents.items(), key=lambda kv: str(kv[0])):
                if inc.tier == 3 and key[0] == e.node and _joins(e, inc):
                    inc.events.append(e)
                    break
    out = []
    for inc in incidents.values():
        timed = [e for e in inc.events if e.lo is not None or e.hi is not None]
        inc.timed = bool(timed)
        lead = timed or inc.events
        if inc.tier == 3:
            # The infrastructure fact leads its incident; the program-side errors it explains
            # follow it even when printed a moment before it, within the same instant.
            # The infrastructure fact leads its incident: the program-side errors it explains
            # are its consequences even when a rank printed one a moment before it.
            lead = [e for e in lead if id(e) in strong_set] or lead
        first = _earliest(lead, skew)
        inc.events.sort(key=lambda e: (e is not first, not (e.role == Role.root), e.lo or 0,
                                       e.sort_key()))
        inc.fix_category()
        out.append(inc)
    out.sort(key=lambda i: (str(i.node), i.family, i.first.sort_key()))
    return out


def _incident_before(a: Incident, b: Incident, skew: float) -> bool:
    return precedes(a.first, b.first, skew)


PROGRAM = {Category.application_error, Category.cuda_oom}


def _normalized(message: str) -> str:
    """An error message with its numbers and addresses blanked, to compare across ranks."""
    return re.sub(r"0x[0-9a-fA-F]+|\d+", "#", message)[:300]


def _teardown(inc: Incident, why: str) -> None:
    for e in inc.events:
        e.tag("teardown")
        e.why = why


def select(incidents: list[Incident], terminator: Optional[Event], skew: float,
           soft_terminator: Optional[Event] = None):
    """Returns (winners, demoted). One winner: attributed; several: ambiguous.

    `terminator` is the scheduler ending the job by decision (time limit, preemption, a
    recorded cancel): what is not known to come before it is teardown. `soft_terminator` is a
    cancel banner without a reason or a record: what is known to come after it is teardown.
    Incidents of tier 1 (causes of last resort: a bare exit code, a network-or-peer error)
    count only when no other incident does."""
    live = list(incidents)
    demoted: list[Incident] = []
    if soft_terminator is not None:
        after = [i for i in live if precedes(soft_terminator, i.first, skew)]
        for inc in after:
            _teardown(inc, "after the step was cancelled")
        demoted += after
        live = [i for i in live if i not in after]
    if any(i.tier >= 2 for i in live):
        demoted += [i for i in live if i.tier < 2]
        live = [i for i in live if i.tier >= 2]
    else:
        # A cause of last resort names a culprit only when it is alone of its kind: the same
        # bare exit code on several nodes is every rank going down, not one rank failing.
        spread = Counter(i.category for i in live)
        alone = [i for i in live if spread[i.category] == 1]
        demoted += [i for i in live if i not in alone]
        live = alone
        if any(i.family == "workload" for i in live):
            # A process that exited explains a peer's "remote process exited or network
            # error".
            demoted += [i for i in live if i.family != "workload"]
            live = [i for i in live if i.family == "workload"]
    if terminator is not None:
        keep = []
        for inc in live:
            if precedes(inc.first, terminator, skew):
                keep.append(inc)
            else:
                for e in inc.events:
                    e.tag("teardown")
                    e.why = "after the scheduler ended the job"
                demoted.append(inc)
        live = keep
        if not live:
            return [], demoted
    # The untimed snapshot facts (nvidia-smi, ibstat) cannot be ordered: they count only when
    # no timed incident exists.
    timed = [i for i in live if i.timed]
    if timed and len(timed) < len(live):
        demoted += [i for i in live if not i.timed]
        live = timed
    minimal = [i for i in live if not any(_incident_before(o, i, skew)
                                          for o in live if o is not i)]
    later = [i for i in live if i not in minimal]
    demoted += later
    if len(minimal) > 1 and all(i.tier == 2 and i.category in PROGRAM for i in minimal):
        # The same error raised on several nodes is one cause in the program, not several.
        keys = {(i.category, _normalized(i.first.line.message)) for i in minimal}
        if len(keys) == 1:
            merged = Incident(None if len({i.node for i in minimal}) > 1 else minimal[0].node,
                              minimal[0].family, tier=2)
            for i in minimal:
                merged.events.extend(i.events)
            merged.events.sort(key=lambda e: (e.lo is None, e.lo or 0, e.sort_key()))
            minimal = [merged]
    if len(minimal) > 1 and any(i.tier == 3 for i in minimal):
        # A hardware incident explains program-side errors elsewhere that cannot be ordered
        # against it, except plain program bugs (an exception, a CUDA OOM) that no hardware
        # fault produces.
        keep = [i for i in minimal if i.tier == 3 or i.category in PROGRAM]
        demoted += [i for i in minimal if i not in keep]
        minimal = keep
    return minimal, demoted


# ============================================================================================
# verdict
# ============================================================================================


def _cause(inc: Incident, links: Links) -> tuple[str, Action]:
    cat = inc.category
    node = inc.node or "the node"
    gpu = inc.gpu
    g = f" GPU {gpu}" if gpu else ""
    details = [e.detail for e in inc.events if e.role == Role.root and e.detail]
    recovery = sorted({t for e in inc.events for t in e.tags if t.startswith("recovery")})
    roots = [e for e in inc.events if e.role == Role.root] or inc.events
    if cat in INFRASTRUCTURE and all("restart_app" in e.tags for e in roots):
        # NVIDIA's catalog: restart the application; the GPU needs no reset or drain for it.
        return (f"restart the job; the GPU stays in service (NVIDIA's action for this Xid). "
                f"If it recurs on{g or ' the same GPU'} of {node}, run DCGM diagnostics "
                "(dcgmi diag -r 3)", Action.resubmit)
    if cat == Category.gpu_hardware:
        lost = any("device_lost" in e.tags for e in inc.events)
        if lost or "recovery2" in recovery:
            return (f"drain {node}; reboot it and check{g} (fell off the bus / needs reboot); "
                    "replace the GPU or its slot if it recurs", Action.reboot_node)
        return f"drain {node}; reset{g} and run DCGM diagnostics (dcgmi diag -r 3)", \
            Action.reset_gpu
    if cat == Category.gpu_memory_ecc:
        return (f"drain {node}; reset{g} to apply row remapping; replace the GPU if "
                "remapping failed or errors recur", Action.drain_node)
    if cat in (Category.nvlink, Category.nvswitch_fabric):
        d = f" ({details[0]})" if details else ""
        return f"drain {node}; reset{g} and inspect its NVLink{d}", Action.inspect_nvlink
    if cat == Category.pcie:
        return f"drain {node}; check PCIe link of{g} (reseat, riser, slot)", Action.drain_node
    if cat == Category.thermal_power:
        return f"check cooling and power of {node}{g}", Action.check_cooling_power
    if cat == Category.network_ib:
        return (f"drain {node}; check the cable, transceiver and switch port of the failed "
                "network link", Action.inspect_network_link)
    if cat == Category.network_config:
        return f"fix the network configuration on {node} (interface, GID, RDMA settings)", \
            Action.fix_network_config
    if cat == Category.host_oom:
        r = f" (rank {inc.rank(links)})" if inc.rank(links) is not None else ""
        return (f"the job ran out of host memory on {node}{r}: request more memory (--mem) "
                "or reduce host memory use (dataloader workers, pinned memory)",
                Action.reduce_host_memory)
    if cat == Category.cuda_oom:
        r = f"rank {inc.rank(links)}" if inc.rank(links) is not None else node
        return (f"reduce GPU memory use on {r} (batch size, sequence length, activation "
                "checkpointing) or use more GPUs", Action.reduce_gpu_memory)
    if cat == Category.application_error:
        r = f"rank {inc.rank(links)} on {node}" if inc.rank(links) is not None else node
        return f"fix the error raised by {r} (see the evidence) and resubmit", \
            Action.fix_application
    if cat == Category.software_incompat:
        return (f"drain {node}; make its driver / CUDA / library versions consistent (reload "
                "the NVIDIA module or reboot after driver updates)", Action.fix_software)
    if cat == Category.storage_io:
        return (f"check the filesystem seen from {node} (server, OSTs, client eviction); "
                "resubmit from the last good checkpoint", Action.check_storage)
    if cat == Category.scheduler_node_failure:
        return (f"check {node} (Slurm marked it down); resubmit, excluding it until it is "
                "healthy", Action.drain_node)
    if cat == Category.scheduler_timelimit:
        return "resubmit with a longer --time, or checkpoint more often", \
            Action.extend_time_limit
    if cat == Category.scheduler_preemption:
        return "none needed: the job was preempted by a higher-priority job", Action.resubmit
    if cat == Category.scheduler_cancelled:
        return "none needed: the job was cancelled (scancel)", Action.none
    return "inspect the evidence", Action.contact_support


def progress_findings(events: list[Event], links: Links, job) -> tuple[list[str], list]:
    """What the ranks' own progress counters say when nothing names a cause: which ranks
    lagged behind (never reached the collective) and which never reported a timeout."""
    notes: list[str] = []
    enq: dict[int, int] = {}
    for e in events:
        if e.rule.id == "torch.progress" and e.rank is not None and "enq" in e.caps:
            enq[e.rank] = max(enq.get(e.rank, -1), int(e.caps["enq"]))
    suspects = []
    if len(enq) >= 2:
        top = max(enq.values())
        lag = sorted(r for r, v in enq.items() if v < top)
        if lag:
            where = sorted({links.rank_node.get(r) or "?" for r in lag})
            notes.append(f"rank(s) {_rank_list(lag)} on {', '.join(where)} lagged: last enqueued "
                         f"NCCL work {min(enq[r] for r in lag)} < {top}; they never reached the "
                         "collective the others waited in")
            suspects = [(r, links.rank_node.get(r)) for r in lag]
        else:
            notes.append(f"all {len(enq)} ranks that reported progress stopped at the same "
                         f"NCCL work ({top}): no rank lagged behind")
    timed_out = {e.rank for e in events if e.rule.id == "torch.watchdog_timeout"
                 and e.rank is not None}
    world = job.num_tasks or max((int(e.caps["nranks"]) for e in events
                                  if e.caps.get("nranks", "").isdigit()), default=0)
    if world and len(timed_out) >= world // 2 and len(timed_out) < world:
        silent = sorted(set(range(world)) - timed_out)
        notes.append(f"rank(s) {_rank_list(silent)} never reported a collective timeout "
                     "(they had exited or were stuck before the others timed out)")
    return notes, suspects


def _rank_list(ranks: list[int]) -> str:
    out, i = [], 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        out.append(str(ranks[i]) if i == j else f"{ranks[i]}-{ranks[j]}")
        i = j + 1
    return ",".join(out[:20]) + (",..." if len(out) > 20 else "")


def diagnose(bundle: Bundle, rules: RuleSet, settings: Optional[Settings] = None,
             engine_version: str = "0") -> Diagnosis:
    st = settings or Settings()
    job = bundle.job
    tc = TimeContext(job.start or job.end, st.utc_offset)
    notes: Counter = Counter()

    lines = sorted(bundle.lines, key=lambda ln: (ln.doc, ln.offset, ln.line or 0, ln.message))
    events = extract(lines, rules, tc, notes)
    events = filter_events(events, bundle, st, notes)
    links = correlate(events, bundle)
    _repeats_across_processes(events)
    _recast(events)

    # Xid 45 (channel teardown) is a root only when it is the node's only Xid.
    xid_nodes = Counter(e.node for e in events if e.rule.decode == "xid"
                        and "channel_teardown" not in e.tags)
    for e in events:
        if "channel_teardown" in e.tags and not xid_nodes.get(e.node):
            e.role = Role.context

    # A cancel banner without a reason is a user's cancel only when the scheduler's record says
    # who cancelled; otherwise it is how srun or the memory enforcement ended the step.
    if any("cancel_record" in e.tags for e in events):
        for e in events:
            if "bare_cancel" in e.tags:
                e.last_resort = False
    terminators = [e for e in events if e.role == Role.root and e.category in TERMINATORS
                   and not e.last_resort]
    terminator = _earliest(terminators, st.clock_skew) if terminators else None
    bare = [e for e in events if "bare_cancel" in e.tags and e.last_resort]
    soft = _earliest(bare, st.clock_skew) if bare and terminator is None else None
    incidents = build_incidents(events, st.clock_skew)
    winners, demoted = select(incidents, terminator, st.clock_skew, soft)
    if not winners and soft is not None and terminator is None:
        terminator = soft          # nothing else ended the job: the cancel is the cause

    if not winners and terminator is None and not incidents:
        # The scheduler's own record of a time limit / preemption / cancel, with no banner.
        recs = [e for e in events if e.category in TERMINATORS and e.source == Source.scheduler
                and e.role == Role.confirmation]
        if recs:
            terminator = recs[0]
            terminator.role = Role.root

    if len(winners) == 1:
        outcome = Outcome.attributed
    elif len(winners) > 1:
        outcome = Outcome.ambiguous
    elif terminator is not None:
        outcome = Outcome.attributed
        term = Incident(None, FAMILY[terminator.category], [terminator], tier=3)
        for e in events:
            if e.category == terminator.category and e is not terminator:
                term.events.append(e)
        winners = [term]
    else:
        outcome = Outcome.unattributed

    findings, suspects = progress_findings(events, links, job)
    return _assemble(bundle, rules, st, events, links, winners, demoted, outcome, notes,
                     engine_version, findings, suspects)


# ============================================================================================
# assembling the diagnosis
# ============================================================================================


def _assemble(bundle, rules, st, events, links, winners, demoted, outcome, notes,
              engine_version, findings=(), suspects=()) -> Diagnosis:
    job = bundle.job
    root_events = {id(e) for inc in winners for e in inc.events}
    win_first = [inc.first for inc in winners]
    # Roles as reported: the winners' events stay root/confirmation; everything else that
    # claimed to be a root is a symptom of the winner.
    for inc in demoted:
        for e in inc.events:
            if id(e) not in root_events:
                e.role = Role.symptom
    for inc in winners:
        for e in inc.events:
            if e is not inc.first and e.role == Role.root:
                e.role = Role.confirmation

    # Evidence ids: deterministic order (winners first, then by kind and position).
    chosen: list[Event] = []
    for inc in winners:
        chosen.extend(inc.events[:MAX_INCIDENT_EVIDENCE])
    groups: dict[tuple, list[Event]] = defaultdict(list)
    for e in events:
        if id(e) in root_events or e.role == Role.context:
            continue
        groups[(e.rule.id, e.category.value if e.category else "", e.caps.get("xid", ""))
               ].append(e)
    # Widest first: the errors most ranks saw lead, as a person reading the logs would meet them.
    group_keys = sorted(groups, key=lambda k: (
        -len({e.rank for e in groups[k] if e.rank is not None} or
             {e.node for e in groups[k] if e.node}), min(_t(e) for e in groups[k]), k))
    for k in group_keys:
        g = sorted(groups[k], key=lambda e: (_t(e), e.sort_key()))
        chosen.extend(g[:MAX_EVIDENCE_PER_GROUP])
    seen = set()
    ordered = []
    for e in chosen:
        if id(e) not in seen:
            seen.add(id(e))
            ordered.append(e)
    for i, e in enumerate(ordered, 1):
        e.id = f"e{i}"
    root_id = win_first[0].id if outcome == Outcome.attributed else None
    evidence = []
    for e in ordered:
        evidence.append(Evidence(
            id=e.id, role=e.role, source=e.source, node=e.node, path=e.line.doc,
            line=e.line.line, timestamp=_stamp(e),
            text=e.line.text[:1000], rule=e.rule.id, rank=e.rank, gpu=e.gpu,
            category=e.category, offset=e.line.offset if e.line.line is None else None,
            cursor=e.line.cursor, root=root_id if e.id != root_id else None))

    causes = []
    for inc in winners:
        text, code = _cause(inc, links)
        ev_ids = [e.id for e in inc.events if e.id]
        ident = links.gpu_identity.get((inc.node, inc.gpu), {}) if inc.gpu else {}
        causes.append(Cause(category=inc.category, node=inc.node, gpu=inc.gpu,
                            gpu_uuid=ident.get("uuid"), gpu_serial=ident.get("serial"),
                            rank=inc.rank(links), summary=_explain(inc.first),
                            first_seen=_stamp(inc.first),
                            evidence=ev_ids, rule=inc.first.rule.id, action=text,
                            action_code=code))

    symptoms = []
    for k in group_keys:
        g = sorted(groups[k], key=lambda e: (_t(e), e.sort_key()))
        if all(e.role == Role.context for e in g):
            continue
        nodes = sorted({e.node for e in g if e.node})
        ranks = sorted({e.rank for e in g if e.rank is not None})
        first = g[0]
        title = first.rule.title
        if k[2]:
            title = f"Xid {k[2]} ({xid_meaning(int(k[2]))})"
        symptoms.append(Symptom(
            category=k[1] or first.rule.id.split(".")[0], node=first.node, rank=first.rank,
            summary=title + (" (after the job was ended by the scheduler)"
                             if all("teardown" in e.tags for e in g) else ""),
            evidence=[e.id for e in g if e.id], count=len(g), nodes=nodes, ranks=ranks,
            rule=first.rule.id))

    affected = sorted({e.node for e in events if e.node and e.role != Role.context})
    completeness = _completeness(bundle, events, notes, winners)
    completeness.notes = list(findings) + completeness.notes
    if outcome == Outcome.attributed:
        root = causes[0]
        action, action_code = root.action, root.action_code
        explanation = _explain_attributed(root, winners[0], symptoms)
        cands = []
    elif outcome == Outcome.ambiguous:
        root = None
        cands = causes
        action = "inspect each candidate: " + "; ".join(
            f"{c.category.value} on {c.node or '?'}" for c in causes)
        action_code = Action.contact_support
        explanation = ("Several causes fit and their order cannot be established from the "
                       "timestamps: " + "; ".join(c.summary for c in causes))
    else:
        root, cands = None, []
        miss = completeness.missing[:6]
        look = ""
        if suspects:
            nodes = sorted({n for _, n in suspects if n})
            look = (f"; look first at rank(s) {_rank_list(sorted(r for r, _ in suspects))}"
                    + (f" on {', '.join(nodes)}" if nodes else "") + " (py-spy dump, dataloader, I/O)")
        action = ("nothing in the evidence supports a cause; collect the missing evidence"
                  + (f" ({', '.join(miss)})" if miss else "")
                  + " and check for a hang (NCCL RAS, py-spy dumps)" + look)
        action_code = Action.collect_evidence
        explanation = "No root cause is supported by the evidence." + (
            f" Seen: {symptoms[0].count} x {symptoms[0].summary}." if symptoms else "") + (
            " " + " ".join(f[0].upper() + f[1:] + "." for f in findings) if findings else "")
    order_note = None
    if outcome == Outcome.ambiguous:
        order_note = ("timestamps of the candidates overlap at their resolution; the order "
                      "between them is unknown")
    return Diagnosis(
        job_id=job.job_id, restart=job.restart, outcome=outcome, root_cause=root,
        candidates=cands, affected_nodes=affected, symptoms=symptoms, evidence=evidence,
        completeness=completeness, action=action, action_code=action_code,
        explanation=explanation, order_note=order_note,
        job=JobSummary(cluster=job.cluster, name=job.name, user=job.user,
                       partition=job.partition, state=job.state, reason=job.reason,
                       exit_code=job.exit_code, start=iso_utc(job.start),
                       end=iso_utc(job.end), nodes=list(job.nodes)),
        rules_version=rules.version, engine_version=engine_version)


def _stamp(e: Event) -> Optional[str]:
    """The event's own time, when its line (or its message) carried one."""
    return iso_utc(e.lo) if (e.line.ts is not None or e.when is not None) else None


def _t(e: Event) -> float:
    return e.lo if e.lo is not None else (e.hi if e.hi is not None else float("inf"))


def _explain_attributed(root: Cause, inc: Incident, symptoms: list[Symptom]) -> str:
    n = sum(s.count for s in symptoms)
    where = f" on {root.node}" if root.node else ""
    s = f"{root.category.value}{where}: {root.summary}."
    if n:
        s += f" {n} other error lines are downstream of it."
    return s


def _completeness(bundle: Bundle, events, notes: Counter, winners) -> Completeness:
    job = bundle.job
    nodes = sorted(set(job.nodes) | set(bundle.node_dirs) |
                   {e.node for e in events if e.node and e.node in set(job.nodes)})
    have: dict[str, set] = defaultdict(set)
    job_level_output = False
    for d in bundle.documents:
        kind = d.kind
        src = ("kernel" if kind in ("kernel_log", "journal_json") else
               "gpu" if kind.startswith("nvidia_smi") else
               "output" if kind == "rank_output" else
               "ib" if kind == "ibstat" else "dcgm" if kind == "dcgm" else
               "probe" if kind == "probe" else None)
        if src is None:
            continue
        if d.node:
            have[d.node].add(src)
        elif src == "output":
            job_level_output = True
    present, missing = [], []
    for n in nodes:
        for src in ("kernel", "gpu", "output", "ib", "dcgm"):
            tag = f"{src}:{n}"
            if src in have[n]:
                present.append(tag)
            elif src in ("kernel", "gpu") or (src == "output" and not job_level_output):
                missing.append(tag)
    if job_level_output:
        present.append("output:job")
    if any(d.source == Source.scheduler for d in bundle.documents):
        present.append("scheduler:job")
    else:
        missing.append("scheduler:job")
    failed_probes = []
    for e in events:
        if e.rule.id == "probe.failed" and e.node:
            failed_probes.append(f"{e.caps.get('probe')}:{e.node} {e.caps.get('reason')}")
            tag = f"{e.caps.get('src', 'probe')}:{e.node}"
            if tag not in missing and not (tag in present):
                missing.append(tag)
    extra = list(bundle.notes)
    for d in bundle.documents:
        extra += [f"{d.path}: {x}" for x in d.notes]
    for k, v in sorted(notes.items()):
        extra.append(f"{k} ({v})" if v > 1 else k)
    if not job.start:
        extra.append("no job start time: events were not filtered by the job's time window")
    return Completeness(present=sorted(present), missing=sorted(missing), notes=extra[:200],
                        failed_probes=sorted(failed_probes))
