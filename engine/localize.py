"""localize: where a hung job stopped, whatever its cause.

A hang ends with every rank's watchdog reporting a timeout, and none of those lines says who
stopped first. These sources can, read in this order; the first that singles out ranks or nodes
decides, the others join it with their evidence where they agree or are named where they point
elsewhere:

- PyTorch's NCCL flight recorder (collectors/flight_recorder.py, one `torch.flight_recorder`
  line per rank and process group): per group, the collective each rank reached. Ranks that
  never scheduled the collective the others wait in, whose dump is missing or records nothing
  in flight there, are where the job stopped; ranks that scheduled it and wait are not. A
  point-to-point send or receive waits for the peer that posted nothing towards it. Followed
  from rank to rank, the ranks that others wait for and that wait for no one are named; a rank
  whose own view is stale (it never saw complete the collectives its peers completed: its GPU
  or its watchdog stopped) is named for that, and its own waiting counts for nothing. When more
  ranks of a group are missing than arrived, the few that arrived are the odd ones: they
  entered a collective the rest never called.
- the desync report (torch.desync_report), the ranks' progress counters (the lagging ranks of
  verdict.progress_findings), NCCL RAS (nccl.ras_peer_dead) and the GPU utilisation picture
  (metrics.gpu_util_fell_first).

Pure: no I/O. A rank the evidence does not single out is never named: when more than half of
the ranks would be, nothing is.
"""
from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Optional

from .correlate import Links
from .decode import Event
from .hostlist import compress
from .models import Localization
from .taxonomy import Action, Fact, Outcome
from .verdict import rank_list

PREFIX = "flight_recorder rank="
MAX_EVIDENCE = 12
MAX_MEMBERS = 1 << 17


# -- the flight recorder's lines: written by the reader, read here --------------------------------
def fr_lines(dump: dict) -> list[tuple[str, str]]:
    """(text shown as evidence, message the rule reads) for one dump's facts
    (collectors/flight_recorder.facts): a line for the dump, one per process group of two or
    more ranks."""
    rank = dump.get("rank")
    if dump.get("note"):
        return [(f"flight-recorder dump of rank {rank} not read: {dump['note']}",
                 f"{PREFIX}{rank} unreadable")]
    groups = [g for g in dump.get("groups") or [] if isinstance(g, dict)]
    out = [(f"flight-recorder dump of rank {rank} (format {dump.get('version') or '?'}): "
            f"{dump.get('entries', 0)} entries, {len(groups)} process groups",
            f"{PREFIX}{rank} dump version={_w(dump.get('version'))} "
            f"entries={_n(dump.get('entries'))}")]
    for g in groups:
        ranks = g.get("ranks") or []
        if len(ranks) < 2 and not g.get("pending") and not g.get("p2p"):
            continue
        pend = ",".join(f"{lo}-{hi}:{op}:{st}" if hi != lo else f"{lo}:{op}:{st}"
                        for lo, hi, op, st in g.get("pending") or [])
        p2p = ",".join(f"{k}:{peer}:{seq}:{n}:{st}" for k, peer, seq, n, st in g.get("p2p") or [])
        msg = (f"{PREFIX}{rank} pg={_w(g.get('pg'))} desc={_w(g.get('desc'))} "
               f"ranks={ranks_text(ranks)} scheduled={_n(g.get('scheduled'))} "
               f"started={_n(g.get('started'))} completed={_n(g.get('completed'))} "
               f"pending={pend or '-'} p2p={p2p or '-'}")
        out.append((_shown(rank, g), msg[:16384]))
    return out


def _w(v) -> str:
    return str(v) if v not in (None, "") else "-"


def _n(v) -> str:
    return str(v) if isinstance(v, int) and not isinstance(v, bool) else "-"


def _shown(rank, g: dict) -> str:
    s = (f"rank {rank} in process group {g.get('pg')} {g.get('desc') or ''} "
         f"(ranks {ranks_text(g.get('ranks') or []) or '?'}): ")
    done = g.get("completed")
    if g.get("scheduled") is None:
        s += "no collective recorded"
    else:
        s += f"scheduled to #{g['scheduled']}" + (f", completed to #{done}"
                                                   if done is not None else "")
    runs = g.get("pending") or []
    if runs:
        s += "; in flight: " + ", ".join(
            f"{op} #{lo}" + (f"-{hi}" if hi != lo else "") + f" ({st})"
            for lo, hi, op, st in runs[:4]) + (", ..." if len(runs) > 4 else "")
    if g.get("p2p"):
        s += "; waiting: " + ", ".join(
            f"{k} {'to' if k == 'send' else 'from'} rank {peer} (#{seq})"
            for k, peer, seq, _, _ in g["p2p"][:4]) + (", ..." if len(g["p2p"]) > 4 else "")
    return s


def ranks_text(ranks: list) -> str:
    """[0, 1, 2, 3, 8, 16, 24] -> "0-3,8-24/8": runs of equal steps."""
    r = sorted(set(ranks))
    out, i = [], 0
    while i < len(r):
        j = i
        if i + 2 < len(r) and r[i + 1] - r[i] == r[i + 2] - r[i + 1]:
            step = r[i + 1] - r[i]
            while j + 1 < len(r) and r[j + 1] - r[j] == step:
                j += 1
            out.append(f"{r[i]}-{r[j]}" + (f"/{step}" if step != 1 else ""))
        else:
            out.append(str(r[i]))
        i = j + 1
    return ",".join(out)


def parse_ranks(text: str) -> Optional[tuple]:
    """ranks_text's inverse; None for text that is not one or names too many ranks."""
    out: list = []
    for part in text.split(","):
        a, _, step = part.partition("/")
        lo, _, hi = a.partition("-")
        if not (lo.isdigit() and (not hi or hi.isdigit()) and (not step or step.isdigit())):
            return None
        lo_i, hi_i, st = int(lo), int(hi or lo), int(step or 1)
        if st < 1 or hi_i < lo_i or len(out) + (hi_i - lo_i) // st >= MAX_MEMBERS:
            return None
        out.extend(range(lo_i, hi_i + 1, st))
    return tuple(sorted(set(out))) or None


@dataclass
class _View:
    """One rank's view of one process group (one torch.flight_recorder line)."""
    rank: int
    pg: str
    desc: str
    members: Optional[tuple]
    scheduled: Optional[int]
    started: Optional[int]
    completed: Optional[int]
    runs: list                  # (lo, hi, op, state) of the collectives in flight
    p2p: list                   # (kind, peer, first seq, count, state)
    ev: Event

    def waits(self, seq: int) -> bool:
        """It scheduled collective `seq` and has not seen it complete."""
        if self.scheduled is None or self.scheduled < seq:
            return False
        if self.completed is not None:
            return self.completed < seq
        return any(lo <= seq <= hi for lo, hi, _, _ in self.runs)

    def op(self, seq: int) -> Optional[str]:
        return next((op for lo, hi, op, _ in self.runs if lo <= seq <= hi), None)

    def state(self, seq: int) -> Optional[str]:
        return next((st for lo, hi, _, st in self.runs if lo <= seq <= hi), None)


def _int(v: str) -> Optional[int]:
    return int(v) if v.lstrip("-").isdigit() and len(v) < 20 else None


def _view(ev: Event, kv: dict) -> Optional[_View]:
    runs, p2p = [], []
    for part in filter(None, kv.get("pending", "-").strip("-").split(",")):
        seqs, _, rest = part.partition(":")
        op, _, st = rest.partition(":")
        lo, _, hi = seqs.partition("-")
        if _int(lo) is not None and (not hi or _int(hi) is not None):
            runs.append((int(lo), int(hi or lo), op, st))
    for part in filter(None, kv.get("p2p", "-").strip("-").split(",")):
        f = part.split(":")
        if len(f) == 5 and f[0] in ("send", "recv") and all(_int(x) is not None for x in f[1:4]):
            p2p.append((f[0], int(f[1]), int(f[2]), int(f[3]), f[4]))
    num = {k: _int(kv.get(k, "-")) for k in ("scheduled", "started", "completed")}
    return _View(ev.rank, kv.get("pg", "-"), kv.get("desc", "-"),
                 parse_ranks(kv.get("ranks", "")), num["scheduled"], num["started"],
                 num["completed"], sorted(runs), sorted(p2p), ev)


def _read_lines(events: list[Event]):
    """{(pg, rank): view}, {rank: "read" | "empty" | "unreadable"} from the rule's lines; a
    rank read twice (two copies of its dump) keeps its first, in path order."""
    views, dumps = {}, {}
    for ev in sorted((e for e in events if e.rule.fact == Fact.flight_recorder and e.rank is not None),
                     key=lambda e: (e.line.doc, e.line.message)):
        words = ev.line.message.split(" ")
        kv = dict(w.split("=", 1) for w in words[2:] if "=" in w)
        if "unreadable" in words[2:3]:
            dumps.setdefault(ev.rank, "unreadable")
        elif "dump" in words[2:3]:
            dumps.setdefault(ev.rank, "empty" if kv.get("entries") == "0" else "read")
        elif "pg" in kv:
            v = _view(ev, kv)
            views.setdefault((v.pg, v.rank), v)
    return views, dumps


# -- the flight recorder across ranks ---------------------------------------------------------
@dataclass
class _Finding:
    """In group `pg`, `waiting` ranks wait in `seq` (a collective, or a send/receive) for
    `missing` ranks; `arrived`: the ranks that scheduled it."""
    kind: str                   # collective | start | p2p
    pg: str
    desc: str
    seq: int
    op: str
    waiting: list
    arrived: list
    missing: list

    def where(self) -> str:
        if self.kind == "p2p":
            return f"a {self.op} of {self.desc} (#{self.seq})"
        return f"{self.op} #{self.seq} of {self.desc}"


@dataclass
class Located:
    ranks: list
    nodes: list
    how: str
    events: list = field(default_factory=list)


def _collective(pg: str, desc: str, members: tuple, views: dict,
                unknown: set) -> Optional[_Finding]:
    """The first collective of the group that some member waits in and some member never
    scheduled (or, all scheduled, some started and some did not)."""
    vs = {r: views.get((pg, r)) for r in members if r not in unknown}
    seqs = set()
    for v in filter(None, vs.values()):
        seqs.update(s + 1 for s in (v.scheduled, v.completed) if s is not None)
        seqs.update(lo for lo, _, _, _ in v.runs[:1])
    for seq in sorted(seqs):
        waiting = sorted(r for r, v in vs.items() if v and v.waits(seq))
        if not waiting:
            continue
        op = next((o for r in waiting if (o := vs[r].op(seq))), None) or "collective"
        arrived = sorted(r for r, v in vs.items() if v and v.scheduled is not None
                         and v.scheduled >= seq)
        missing = sorted(set(vs) - set(arrived))
        if missing:
            return _Finding("collective", pg, desc, seq, op, waiting, arrived, missing)
        started = [r for r in waiting if vs[r].state(seq) == "started"]
        idle = [r for r in waiting if vs[r].state(seq) == "scheduled"]
        if started and idle and len(idle) <= len(started):
            return _Finding("start", pg, desc, seq, op, started, arrived, idle)
    return None


def _p2p(pg: str, desc: str, members: tuple, views: dict, unknown: set) -> list[_Finding]:
    """A send or receive waiting on a peer that posted nothing towards this rank."""
    out = []
    for r in members:
        v = views.get((pg, r))
        for kind, peer, seq, _, _ in (v.p2p if v else ()):
            if peer in unknown or peer == r:
                continue
            pv = views.get((pg, peer))
            other = "recv" if kind == "send" else "send"
            if pv and any(k == other and p == r for k, p, _, _, _ in pv.p2p):
                continue
            out.append(_Finding("p2p", pg, desc, seq, kind, [r], [r], [peer]))
    return out


def _stalled(config: dict, views: dict) -> dict:
    """rank -> (collectives its peers completed that it never saw complete, its view, the
    peer's view) where that count is 2 or more, over all its groups (its biggest lag kept)."""
    found: dict = {}
    total: Counter = Counter()
    for pg, (_, members) in sorted(config.items()):
        vs = [v for r in members if (v := views.get((pg, r)))]
        # the two members that saw the most complete: any other's best peer is the first
        top = sorted((v for v in vs if v.completed is not None),
                     key=lambda p: (-p.completed, p.rank))[:2]
        for v in vs:
            best = next((p for p in top if p is not v), None)
            if best is None or not v.runs:
                continue
            n = sum(max(0, min(hi, best.completed) - lo + 1) for lo, hi, _, _ in v.runs)
            if n:
                total[v.rank] += n
                if n > found.get(v.rank, (0,))[0]:
                    found[v.rank] = (n, v, best)
    return {r: found[r] for r in found if total[r] >= 2}


def _terminal_sccs(edges: dict) -> list[list]:
    """The strongly connected groups of ranks with no edge out of the group (Kosaraju)."""
    nodes = sorted(set(edges) | {m for t in edges.values() for m in t})
    order, seen = [], set()
    for s in nodes:
        if s in seen:
            continue
        seen.add(s)
        stack = [(s, iter(sorted(edges.get(s, ()))))]
        while stack:
            u, it = stack[-1]
            nxt = next((w for w in it if w not in seen), None)
            if nxt is None:
                order.append(u)
                stack.pop()
            else:
                seen.add(nxt)
                stack.append((nxt, iter(sorted(edges.get(nxt, ())))))
    back = defaultdict(set)
    for u, t in edges.items():
        for w in t:
            back[w].add(u)
    comp: dict = {}
    for s in reversed(order):
        if s in comp:
            continue
        comp[s], todo = s, [s]
        while todo:
            u = todo.pop()
            for w in back[u]:
                if w not in comp:
                    comp[w] = s
                    todo.append(w)
    groups = defaultdict(list)
    for u, c in comp.items():
        groups[c].append(u)
    return [sorted(g) for g in groups.values()
            if len(g) > 1 and all(comp[w] == comp[g[0]] for u in g for w in edges.get(u, ()))]


def _flight(events: list[Event], links: Links, notes: Counter) -> Optional[Located]:
    views, dumps = _read_lines(events)
    if not dumps:
        return None
    by_pg: dict = defaultdict(Counter)
    for v in views.values():
        if v.members:
            by_pg[v.pg][(v.desc, v.members)] += 1
    config = {pg: sorted(c.items(), key=lambda kv: (-kv[1], kv[0]))[0][0]
              for pg, c in by_pg.items()}
    unknown = {r for r, s in dumps.items() if s == "unreadable"}
    world = (set(dumps) | {r for _, m in config.values() for r in m}) - unknown
    stalled = _stalled(config, views)
    edges: dict = defaultdict(dict)          # waiter -> {rank waited for: finding}
    ahead: dict = {}
    for pg, (desc, members) in sorted(config.items()):
        f = _collective(pg, desc, members, views, unknown) if len(members) > 1 else None
        if f and len(f.missing) > len(f.arrived):
            for r in f.arrived:
                ahead.setdefault(r, f)
        elif f:
            for w in f.waiting:
                for m in f.missing:
                    edges[w].setdefault(m, f)
        for p in _p2p(pg, desc, members, views, unknown):
            edges[p.waiting[0]].setdefault(p.missing[0], p)
    witnesses = {w: t for w, t in edges.items() if w not in stalled and t}
    waited = {m for t in witnesses.values() for m in t}
    sinks = sorted(m for m in waited if m not in witnesses)
    # A rank with work in flight may itself be waiting, below what the dumps show (its GPU
    # stream behind another's): where some rank the others wait for has nothing in flight (or
    # its own view stalled), that one is where the job stopped.
    busy = {v.rank for v in views.values() if v.runs or v.p2p} - set(stalled)
    sinks = [m for m in sinks if m not in busy] or sinks
    cycles = [] if sinks else _terminal_sccs(witnesses)
    named = set(sinks) | {r for c in cycles for r in c} | set(ahead) | set(stalled)
    if not named:
        return None
    if 2 * len(named) > len(world):
        notes[f"the flight-recorder dumps do not single out where the job stopped "
              f"({len(named)} of {len(world)} ranks would be named)"] += 1
        return None
    where = _Words(links, views, dumps, edges)
    parts = [where.stopped(sinks, witnesses)] if sinks else []
    parts += [where.cycle(c, witnesses) for c in cycles]
    parts += where.ahead(ahead)
    parts += where.stalled({r: v for r, v in stalled.items() if r not in set(sinks) | set(ahead)})
    ranks = sorted(named)
    return Located(ranks, sorted({n for r in ranks if (n := links.rank_node.get(r))}),
                   "; ".join(p for p in parts if p), where.events[:MAX_EVIDENCE])


class _Words:
    """The sentences that say where, and the evidence lines they stand on."""

    def __init__(self, links: Links, views: dict, dumps: dict, edges: dict):
        self.links, self.views, self.dumps, self.edges = links, views, dumps, edges
        self.events: list = []

    def who(self, ranks: list) -> str:
        nodes = sorted({n for r in ranks if (n := self.links.rank_node.get(r))})
        where = f" ({compress(nodes)})" if nodes else ""
        return (f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {rank_list(ranks)}") + where

    def cite(self, *views) -> None:
        for v in views:
            if v is not None and v.ev not in self.events:
                self.events.append(v.ev)

    def why(self, r: int, f: _Finding) -> str:
        """What the rank's own dump says of the collective the others wait in."""
        if r not in self.dumps:
            return "left no flight-recorder dump"
        if self.dumps[r] == "empty":
            return "recorded nothing in flight"
        v = self.views.get((f.pg, r))
        if f.kind == "start":
            return "scheduled it, but the GPU never started it"
        if f.kind == "p2p":
            return "posted nothing towards it"
        if v is None or v.scheduled is None:
            return "recorded nothing of that group in flight"
        return f"never scheduled it (last scheduled: #{v.scheduled})"

    def waiters(self, ranks: set) -> int:
        """How many ranks wait for these, directly or through others."""
        back = defaultdict(set)
        for w, t in self.edges.items():
            for m in t:
                back[m].add(w)
        seen, todo = set(ranks), list(ranks)
        while todo:
            for w in back[todo.pop()]:
                if w not in seen:
                    seen.add(w)
                    todo.append(w)
        return len(seen - set(ranks))

    def stopped(self, sinks: list, witnesses: dict) -> str:
        """The ranks the others wait for, grouped by where most of their waiters wait."""
        into: dict = defaultdict(dict)
        for t in witnesses.values():
            for m, f in t.items():
                into[m][id(f)] = f
        main = {m: sorted(into[m].values(), key=lambda f: (
            -len(f.waiting), f.kind != "collective", -len(f.arrived) - len(f.missing), f.pg,
            f.seq))[0] for m in sinks}
        groups: dict = defaultdict(list)
        for m in sinks:
            groups[(id(main[m]), self.why(m, main[m]))].append(m)
        parts = []
        for (_, why), ranks in sorted(groups.items(), key=lambda kv: kv[1]):
            f = main[ranks[0]]
            n, k = self.waiters(set(ranks)), len(f.waiting)
            it = "it" if len(ranks) == 1 else "them"
            s = (f"{'and at' if parts else 'the job stopped at'} {self.who(ranks)}: "
                 f"{n} rank{'s' if n != 1 else ''} waited for {it}")
            s += f" ({k} in {f.where()})" if k < n else f" in {f.where()}"
            parts.append(s + f"; {'it' if len(ranks) == 1 else 'they'} {why}")
            self.cite(*(self.views.get((f.pg, r)) for r in ranks),
                      self.views.get((f.pg, f.waiting[0])))
        return "; ".join(parts)

    def cycle(self, ranks: list, witnesses: dict) -> str:
        fs = sorted({id(f): f for r in ranks for f in witnesses.get(r, {}).values()}.values(),
                    key=lambda f: (f.pg, f.seq))
        self.cite(*(self.views.get((f.pg, f.waiting[0])) for f in fs[:3]))
        return (f"{self.who(ranks)} wait for each other (in "
                f"{', '.join(f.where() for f in fs[:3])})")

    def ahead(self, ahead: dict) -> list[str]:
        groups: dict = defaultdict(list)
        for r, f in sorted(ahead.items()):
            groups[id(f)].append(r)
        parts = []
        for ranks in sorted(groups.values()):
            f = ahead[ranks[0]]
            parts.append(f"{self.who(ranks)} entered {f.where()}, which the other "
                         f"{len(f.missing)} ranks of that group never entered")
            self.cite(*(self.views.get((f.pg, r)) for r in ranks),
                      self.views.get((f.pg, f.missing[0])))
        return parts

    def stalled(self, stalled: dict) -> list[str]:
        parts = []
        for r, (n, v, peer) in sorted(stalled.items()):
            lo = v.runs[0][0]
            op = v.op(lo) or "collective"
            parts.append(f"{self.who([r])} never saw complete {n} collectives its peers "
                         f"completed (from {op} #{lo} of {v.desc}, which rank {peer.rank} "
                         "completed): its GPU or its watchdog stopped")
            self.cite(v, peer)
        return parts


# -- the other sources ----------------------------------------------------------------------------
def _ranks_in(text: str) -> set:
    return {int(x) for x in text.replace(",", " ").split() if x.isdigit()}


def _desync(events: list[Event], links: Links, world: int) -> Optional[Located]:
    evs = [e for e in events if e.rule.fact == Fact.desync_report
           and any(e.caps.get(k) for k in ("lagging", "started", "ended"))]
    ranks = sorted({r for e in evs for k in ("lagging", "started", "ended")
                    for r in _ranks_in(e.caps.get(k, ""))})
    if not ranks or (world and 2 * len(ranks) > world):
        return None
    return Located(ranks, _nodes(ranks, links),
                   f"PyTorch's desync report names {_who(ranks, links)} as the lagging "
                   "ranks (they never joined or never finished the collective the others "
                   "waited in)", evs[:2])


def _progress(events: list[Event], links: Links, suspects: list) -> Optional[Located]:
    ranks = sorted(r for r, _ in suspects)
    if not ranks:
        return None
    evs = [e for e in events if e.rule.fact == Fact.rank_progress and e.rank in set(ranks)]
    return Located(ranks, _nodes(ranks, links),
                   f"the ranks' progress counters show {_who(ranks, links)} behind the others "
                   "(fewer NCCL work items enqueued): the others waited for "
                   f"{'it' if len(ranks) == 1 else 'them'}", evs[:3])


def _ras(events: list[Event]) -> Optional[Located]:
    """The nodes NCCL RAS declared dead (the peers correlate placed on a node)."""
    evs = [e for e in events if e.rule.fact == Fact.peer_dead]
    nodes = sorted({e.points_at for e in evs if e.points_at})
    if not nodes:
        return None
    return Located([], nodes, f"NCCL RAS declared {compress(nodes)} dead or unresponsive",
                   evs[:2])


def _metrics(events: list[Event]) -> Optional[Located]:
    evs = sorted((e for e in events if e.rule.fact == Fact.util_fell_first and e.node),
                 key=Event.sort_key)
    if not evs:
        return None
    nodes = sorted({e.node for e in evs})
    if len(evs) == 1:
        e = evs[0]
        how = (f"GPU {e.gpu} on {e.node} went idle {e.caps.get('lead')} s before the other "
               f"{e.caps.get('others')} GPUs of the job, which then idled together")
    else:
        how = (f"GPUs on {compress(nodes)} went idle first, within one sampling step of each "
               "other, before the rest of the job's GPUs")
    return Located([], nodes, how, evs[:4])


def _nodes(ranks: list, links: Links) -> list:
    return sorted({n for r in ranks if (n := links.rank_node.get(r))})


def _who(ranks: list, links: Links) -> str:
    nodes = _nodes(ranks, links)
    return ((f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {rank_list(ranks)}")
            + (f" ({compress(nodes)})" if nodes else ""))


SOURCES = ("flight recorder", "desync report", "progress counters", "NCCL RAS",
           "GPU utilisation")


def localize(events: list[Event], links: Links, suspects: list, notes: Counter,
             world: int = 0) -> Optional[Located]:
    """Where the job stopped: the first source that says; the others agree or are named."""
    found = [_flight(events, links, notes), _desync(events, links, world),
             _progress(events, links, suspects), _ras(events), _metrics(events)]
    first = next((i for i, f in enumerate(found) if f is not None), None)
    if first is None:
        return None
    loc = found[first]
    for label, other in zip(SOURCES[first + 1:], found[first + 1:]):
        if other is None:
            continue
        agree = (set(other.ranks) & set(loc.ranks) if other.ranks and loc.ranks
                 else set(other.nodes) & set(loc.nodes))
        if agree:
            loc.events += [e for e in other.events if e not in loc.events]
        else:
            loc.how += (f"; the {label} point{'' if label.endswith('s') else 's'} at "
                        f"{_who(other.ranks, links) if other.ranks else compress(other.nodes)}"
                        " instead")
    loc.events = loc.events[:MAX_EVIDENCE]
    return loc


def report(d, loc: Optional[Located]) -> None:
    """The diagnosis says where (its evidence ids are assigned by now); with no cause, where is
    what there is to act on."""
    if loc is None:
        return
    d.localization = Localization(ranks=loc.ranks, nodes=loc.nodes, how=loc.how,
                                  evidence=[e.id for e in loc.events if e.id])
    if d.outcome != Outcome.unattributed:
        return
    those = "that node" if len(loc.nodes) == 1 else "those nodes" if loc.nodes else \
        "the nodes of those ranks"
    d.explanation = f"{loc.how[0].upper()}{loc.how[1:]}; nothing says why: check {those}. " \
        + d.explanation
    target = compress(loc.nodes) if loc.nodes else f"the node of {_who(loc.ranks, Links())}"
    d.action = (f"check {target}, where the job stopped (nothing says why): its kernel log, "
                "the stuck rank's stack (py-spy dump --pid) and DCGM diagnostics "
                "(dcgmi diag -r 3); resubmit without it if it does not pass")
    d.action_code = Action.inspect_node
