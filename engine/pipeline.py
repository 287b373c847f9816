"""The rules pipeline: (bundle, rules) -> Diagnosis. Pure: no I/O, no clock, no randomness.

Stages, top to bottom:

    extract    lines -> events: run the rules a line's literals point at, keep the ones whose
               source the rule trusts, apply the rule's decoder
    filter     drop events outside the job's time window and duplicates
    correlate  rank <-> node <-> GPU, peers named in errors, a rank's exit time
    relate     one event changes what another means (relations.RELATIONS: an Xid 45 alone is
               context, a cancel record decides a bare banner, ...)
    refine     group root events into incidents per node; hardware/infrastructure incidents
               absorb the program-side errors they explain; teardown after a scheduler
               terminator is noise
    verdict    the earliest incident wins; two that cannot be ordered and fit equally make
               the diagnosis ambiguous; nothing supported leaves it unattributed
    localize   where a hang stopped (flight recorder, desync report, progress counters, NCCL
               RAS, GPU utilisation), whatever the outcome

Order: within one file, lines are ordered by position. Across files, an event is known to come
before another only when its time interval ends before the other's begins; untimed lines take
the interval between the nearest timestamped lines around them.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Optional

from . import relations
from .assemble import assemble
from .correlate import correlate, recast, repeats_across_processes, version_skew
from .extract import extract
from .incident import Incident, earliest, proven
from .lineparse import TimeContext
from .localize import localize, report
from .models import Bundle, Diagnosis
from .refine import build_incidents, select
from .rules import RuleSet
from .taxonomy import FAMILY, TERMINATORS, Outcome, Role, Source, Tag
from .verdict import progress_findings
from .window import filter_events


@dataclass
class Settings:
    window_before: float = 600.0     # seconds before job start that still count
    window_after: float = 300.0      # seconds after job end that still count (clock skew)
    clock_skew: float = 0.0          # tolerance when ordering events of different nodes
    utc_offset: int = 0
    burst_gap: float = 6 * 3600.0    # without a job window: silence that separates failures



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
    repeats_across_processes(events)
    recast(events)
    version_skew(events)

    relations.apply(events, st.clock_skew)
    # What a network error's doubters were, before the verdict marks teardown.
    crashes = [e for e in events if relations.crash(e)]
    terminators = [e for e in events if e.role == Role.root and e.category in TERMINATORS
                   and not e.last_resort]
    terminator = earliest(terminators, st.clock_skew) if terminators else None
    bare = [e for e in events if Tag.bare_cancel in e.tags and e.last_resort]
    soft = earliest(bare, st.clock_skew) if bare and terminator is None else None
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
    # A cause whose lines only suggest it is a candidate, never the answer: ambiguous beside
    # the proven causes of another kind the verdict set aside, else unattributed naming it.
    possible: list = []
    unproven = outcome == Outcome.attributed and not proven(winners[0], events)
    if unproven:
        alternatives = [i for i in demoted if i.family != winners[0].family
                        and proven(i, events) and not all(Tag.teardown in e.tags
                                                          for e in i.events)]
        if alternatives:
            winners, outcome = winners + alternatives[:3], Outcome.ambiguous
        else:
            possible, winners, outcome = winners, [], Outcome.unattributed
            # A peer's network error that a rank's own crash may explain: that crash, when it
            # came first, is as possible a cause and named first.
            c = relations.first_doubter(FAMILY[possible[0].category], possible[0].first,
                                        crashes, st.clock_skew)
            if c is not None:
                possible.insert(0, Incident(c.node, FAMILY[c.category], [c]))

    findings, suspects = progress_findings(events, links, job)
    located = localize(events, links, suspects, notes, job.num_tasks or 0)
    d = assemble(bundle, rules, st, events, links, winners, demoted, outcome, notes,
                 engine_version, findings, suspects, possible, unproven,
                 located.events if located else ())
    report(d, located)
    # A site rule file that did not load: this diagnosis was made without it.
    d.completeness.notes[:0] = [f"site rules: {p}" for p in getattr(rules, "problems", ())]
    return d


