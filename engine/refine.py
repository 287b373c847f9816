"""refine and select: root events grouped into incidents; trusted infrastructure incidents absorb
the errors they explain; a scheduler terminator makes what follows it teardown; causes of last
resort count only when nothing else does; the earliest incident wins."""
from __future__ import annotations

import re
from collections import Counter
from typing import Optional

from .decode import Event
from .incident import PROGRAM, TRUSTED, Incident, earliest, precedes
from .taxonomy import (EXPLAINS_LAST_RESORT, FAMILY, INCIDENT_FAMILY, INFRASTRUCTURE, TERMINATORS,
                       Role, Tag)


def _group(family: str) -> str:
    """The family whose incident a fault of this family joins (taxonomy.INCIDENT_FAMILY)."""
    return INCIDENT_FAMILY.get(family, family)


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
    # A line that names no node (slurmstepd's "Detected 1 oom_kill event in StepId=...") and
    # another of the same fault that does (srun's "node-01: task 0: Out Of Memory") are one
    # fault on that node, when only one node is named for it.
    for key, inc in sorted(incidents.items(), key=lambda kv: str(kv[0])):
        if inc.node is not None or inc.tier == 3 or not inc.events:
            continue
        cat = inc.events[0].category
        named = [o for o in incidents.values() if o.node is not None and o.tier == inc.tier
                 and o.events and o.events[0].category == cat]
        if len(named) == 1:
            named[0].events.extend(inc.events)
            inc.events = []
    out = []
    for inc in incidents.values():
        if not inc.events:
            continue
        timed = [e for e in inc.events if e.lo is not None or e.hi is not None]
        inc.timed = bool(timed)
        lead = timed or inc.events
        if inc.tier == 3:
            # The infrastructure fact leads its incident; the program-side errors it explains
            # follow it even when printed a moment before it, within the same instant.
            # The infrastructure fact leads its incident: the program-side errors it explains
            # are its consequences even when a rank printed one a moment before it.
            lead = [e for e in lead if id(e) in strong_set] or lead
        first = earliest(lead, skew)
        inc.events.sort(key=lambda e: (e is not first, not (e.role == Role.root), e.lo or 0,
                                       e.sort_key()))
        inc.fix_category()
        out.append(inc)
    out.sort(key=lambda i: (str(i.node), i.family, i.first.sort_key()))
    return out


def _incident_before(a: Incident, b: Incident, skew: float) -> bool:
    return precedes(a.first, b.first, skew)


def _normalized(message: str) -> str:
    """An error message with its numbers and addresses blanked, to compare across ranks."""
    return re.sub(r"0x[0-9a-fA-F]+|\d+", "#", message)[:300]


def _teardown(inc: Incident, why: str) -> None:
    for e in inc.events:
        e.tag(Tag.teardown)
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
        if any(i.family in EXPLAINS_LAST_RESORT for i in live):
            # A process that exited explains a peer's "remote process exited or network
            # error".
            demoted += [i for i in live if i.family not in EXPLAINS_LAST_RESORT]
            live = [i for i in live if i.family in EXPLAINS_LAST_RESORT]
    if terminator is not None:
        keep = []
        for inc in live:
            if precedes(inc.first, terminator, skew):
                keep.append(inc)
            else:
                for e in inc.events:
                    e.tag(Tag.teardown)
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


