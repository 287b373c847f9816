"""Assembling the diagnosis: roles as reported, evidence ids in a deterministic order, causes,
grouped symptoms, completeness and the explanation."""
from __future__ import annotations

from collections import Counter, defaultdict
from typing import Optional

from . import public
from .decode import Event
from .incident import Incident
from .lineparse import iso_utc
from .models import (Bundle, Cause, Completeness, Diagnosis, Evidence, JobSummary, Metric,
                     SourceState, Symptom)
from .taxonomy import TRUST, Action, Fact, Outcome, Role, Source, Tag
from .verdict import (cause_action, cause_blame, cause_trust, contradicted_by, job_blame,
                      rank_list)
from .xid import meaning as xid_meaning

MAX_EVIDENCE_PER_GROUP = 3
MAX_INCIDENT_EVIDENCE = 40


def _summary(ev: Event, rules) -> str:
    """What anyone may read of a cause (engine/public.py): never the user's text."""
    c = rules.by_id.get(ev.rule.id)
    return public.summary(ev, public.recognised(ev, c.rows if c else ()))


def assemble(bundle, rules, st, events, links, winners, demoted, outcome, notes,
              engine_version, findings=(), suspects=(), possible=(),
              unproven: bool = False, located=()) -> Diagnosis:
    """`possible`: with no winner, the incidents whose lines only suggest their cause, shown
    as causes the evidence points at without proving them; `unproven`: the first candidate of
    an ambiguous diagnosis is only suggested by its lines; `located`: the events that say where
    the job stopped (engine/localize.py)."""
    job = bundle.job
    winners = list(winners) or list(possible)
    maybe: list = []
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
    chosen.extend(located)           # where the job stopped (engine/localize.py)
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
            id=e.id, role=e.role, source=e.source, trust=TRUST[e.source], node=e.node,
            path=e.line.doc,
            line=e.line.line, timestamp=_stamp(e),
            text=e.line.text[:1000], rule=e.rule.id, rank=e.rank, gpu=e.gpu,
            category=e.category, offset=e.line.offset if e.line.line is None else None,
            cursor=e.line.cursor, root=root_id if e.id != root_id else None,
            metric=Metric(**e.line.metric) if e.line.metric else None, because=e.why or None))

    causes = []
    for inc in winners:
        text, code = cause_action(inc, links)
        ev_ids = [e.id for e in inc.events if e.id]
        ident = links.gpu_identity.get((inc.node, inc.gpu), {}) if inc.gpu else {}
        causes.append(Cause(category=inc.category, node=inc.node, gpu=inc.gpu,
                            gpu_uuid=ident.get("uuid"), gpu_serial=ident.get("serial"),
                            rank=inc.rank(links), summary=_summary(inc.first, rules),
                            first_seen=_stamp(inc.first),
                            evidence=ev_ids, rule=inc.first.rule.id, action=text,
                            action_code=code, trust=cause_trust(inc),
                            blame=cause_blame(inc),
                            contradicted_by=contradicted_by(inc, events)))

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
                             if all(Tag.teardown in e.tags for e in g) else ""),
            evidence=[e.id for e in g if e.id], count=len(g), nodes=nodes, ranks=ranks,
            rule=first.rule.id))

    affected = sorted({e.node for e in events if e.node and e.role != Role.context})
    completeness = _completeness(bundle, events, notes)
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
        maybe = causes if possible else []
        look = ""
        if suspects:
            nodes = sorted({n for _, n in suspects if n})
            look = (f"; look first at rank(s) {rank_list(sorted(r for r, _ in suspects))}"
                    + (f" on {', '.join(nodes)}" if nodes else "") + " (py-spy dump, dataloader, I/O)")
        action = ("nothing in the evidence supports a cause; collect the missing evidence"
                  + (f" ({', '.join(miss)})" if miss else "")
                  + " and check for a hang (NCCL RAS, py-spy dumps)" + look)
        if maybe:
            action = (f"not proven: {_where(maybe[0])} is possible, but only suggested by its "
                      "lines; collect the missing evidence" + (f" ({', '.join(miss)})" if miss
                                                               else "")
                      + f" and check it ({maybe[0].action})")
        action_code = Action.collect_evidence
        explanation = ("No root cause is proven by the evidence." + (
            f" Possible: {maybe[0].summary} (its lines suggest it; nothing backs it)."
            if maybe else "")) + (
            f" Seen: {symptoms[0].count} x {symptoms[0].summary}." if symptoms else "") + (
            " " + " ".join(f[0].upper() + f[1:] + "." for f in findings) if findings else "")
    order_note = None
    if outcome == Outcome.ambiguous:
        order_note = ("the first candidate is only suggested by its lines; the others are "
                      "proven but came later" if unproven else
                      "timestamps of the candidates overlap at their resolution; the order "
                      "between them is unknown")
    return Diagnosis(
        job_id=job.job_id, restart=job.restart, outcome=outcome,
        blame=job_blame(outcome.value, [root] if root else cands), root_cause=root,
        candidates=cands, possible=maybe if outcome == Outcome.unattributed else [],
        affected_nodes=affected, symptoms=symptoms, evidence=evidence,
        completeness=completeness, action=action, action_code=action_code,
        explanation=explanation, order_note=order_note,
        job=JobSummary(cluster=job.cluster, name=job.name, user=job.user,
                       partition=job.partition, state=job.state, reason=job.reason,
                       exit_code=job.exit_code, start=iso_utc(job.start),
                       end=iso_utc(job.end), nodes=list(job.nodes)),
        rules_version=rules.version, engine_version=engine_version)


def _where(c: Cause) -> str:
    return c.category.value + (f" on {c.node}" if c.node else "")


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


def _completeness(bundle: Bundle, events, notes: Counter) -> Completeness:
    """Which sources each node (and the job) delivered and which it lacks, as the reader's
    registry counts them (Bundle.counting), the node probes that failed, and the notes; the
    same facts typed in `entries`."""
    job = bundle.job
    nodes = sorted(set(job.nodes) | set(bundle.node_dirs))
    have: dict[Optional[str], set] = defaultdict(set)      # node (None: the job) -> sources
    for d in bundle.documents:
        c = bundle.counting.get(d.kind)
        if c is not None:
            have[d.node if c.per == "node" else None].add(c.name)
    # Failed node probes (the probe.failed rule reads sattrib's own probe record): the first
    # one of a source says why it is missing.
    probes = [SourceState(source=e.caps.get("src", "probe"), node=e.node, state="probe_failed",
                          probe=e.caps.get("probe"), reason=e.caps.get("reason"))
              for e in events if e.rule.fact == Fact.probe_failed and e.node]
    why: dict = {}
    for p in probes:
        why.setdefault((p.source, p.node), p)

    def missing(name: str, n: Optional[str]) -> SourceState:
        p = why.get((name, n))
        return SourceState(source=name, node=n, state="missing", probe=p and p.probe,
                           reason=p and p.reason)
    entries = {(name, n): SourceState(source=name, node=n, state="present")
               for n in [None] + nodes for name in have[n]}
    for c in {c for c in bundle.counting.values() if c.required}:
        for n in ([None] if c.per == "job" else [] if c.name in have[None] else nodes):
            entries.setdefault((c.name, n), missing(c.name, n))
    for key in why:
        entries.setdefault(key, missing(*key))
    entries.update({("snapshot", n): SourceState(source="snapshot", node=n, state=state,
                                                 reason=reason)
                    for n, state, reason in job.snapshots})
    facts = sorted(list(entries.values()) + probes, key=lambda x: (
        x.source, x.node or "", x.state, x.probe or "", x.reason or ""))
    extra = list(bundle.notes)
    for d in bundle.documents:
        extra += [f"{d.path}: {x}" for x in d.notes]
    for k, v in sorted(notes.items()):
        extra.append(f"{k} ({v})" if v > 1 else k)
    if not job.start:
        extra.append("no job start time: events were not filtered by the job's time window")

    def tag(x: SourceState) -> str:
        return f"{x.source}:{x.node or 'job'}"
    return Completeness(
        present=sorted(tag(x) for x in facts if x.state == "present" and x.source != "snapshot"),
        missing=sorted(tag(x) for x in facts if x.state == "missing" and x.source != "snapshot"),
        notes=extra[:200],
        failed_probes=sorted(f"{x.probe}:{x.node} {x.reason}" for x in probes),
        entries=facts)
