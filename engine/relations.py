"""How one event changes what another means: a closed set of relation types and the table of
relations the pipeline applies, in order, once correlate has placed every event.

A row reads: a `subject` event, when an event that `by` picks stands to it in `scope`, takes
the relation's effect. Subjects and the events that change them are picked by what the rules,
catalog rows and Xid policy rows give them (typed tags, families, sources), never by a rule id,
an Xid number or a decoder name: a rule takes part in a relation through the tag or category
it gives its lines.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Callable, Optional

from .decode import Event
from .incident import earliest, precedes
from .taxonomy import FAMILY, Category, Role, Source, Tag


class Effect(str, Enum):
    """What a relation does to its subject."""
    context_alone = "context_alone"  # without a `by` event it is context, never a root
    decided = "decided"              # with one it proves its cause and is no last resort
    proven = "proven"                # with one it proves its cause
    doubted = "doubted"              # with one it only suggests its cause


class Scope(str, Enum):
    """Where the `by` event must be, seen from the subject."""
    node = "node"                    # on the subject's node
    job = "job"                      # anywhere in the job
    later_in_file = "later_in_file"  # after the subject, in the same file
    not_after = "not_after"          # anywhere, unless known to come after the subject


Pick = Callable[[Event], bool]


@dataclass(frozen=True)
class Relation:
    effect: Effect
    subject: Pick
    by: Pick
    scope: Scope
    why: str


def tagged(*tags: Tag) -> Pick:
    return lambda e: any(t in e.tags for t in tags)


def _other_xid(e: Event) -> bool:
    return Tag.gpu_xid in e.tags and Tag.channel_teardown not in e.tags


# The family a crash elsewhere may explain: a peer's reset connection.
DOUBTED_FAMILY = "network"


def _last_resort_network(e: Event) -> bool:
    return e.last_resort and e.category is not None and FAMILY[e.category] == DOUBTED_FAMILY


def crash(e: Event) -> bool:
    """A process known to have died of its own fault: a task srun reports dead, the scheduler's
    record of an OOM kill, or a rank's own fatal error (even one that names no cause alone, as
    CUDA's "unknown error")."""
    return Tag.teardown not in e.tags and (
        Tag.task_exit in e.tags
        or (e.source == Source.scheduler and e.category == Category.host_oom)
        or (e.source == Source.stderr and e.category is not None
            and e.role in (Role.root, Role.confirmation)
            and FAMILY[e.category] in ("gpu", "nvlink", "workload")))


RELATIONS = (
    Relation(Effect.context_alone, tagged(Tag.channel_teardown), _other_xid, Scope.node,
             "the driver tearing channels down after a process ended follows the node's other "
             "Xid; alone it is context (every killed CUDA program leaves one)"),
    Relation(Effect.decided, tagged(Tag.bare_cancel), tagged(Tag.cancel_record), Scope.job,
             "a cancel banner without a reason is a cancel when the scheduler's record says "
             "who cancelled; otherwise it is how srun or the memory enforcement ended the step"),
    Relation(Effect.proven, tagged(Tag.exit_code), tagged(Tag.bare_cancel, Tag.task_killed),
             Scope.later_in_file,
             "a task's exit code ended the step when srun's teardown follows it in the same "
             "output (the other tasks killed, the step cancelled), as --kill-on-bad-exit does"),
    Relation(Effect.doubted, _last_resort_network, crash, Scope.not_after,
             "a crash not known to come after a peer's reset connection may explain it"),
)


def _stands(rel: Relation, subject: Event, by: Event, skew: float) -> bool:
    if by is subject:
        return False
    if rel.scope == Scope.node:
        return by.node == subject.node
    if rel.scope == Scope.later_in_file:
        return by.line.doc == subject.line.doc and by.line.offset > subject.line.offset
    if rel.scope == Scope.not_after:
        return not precedes(subject, by, skew)
    return True


def apply(events: list[Event], skew: float) -> None:
    """Each relation in turn, over all events."""
    for rel in RELATIONS:
        subjects = [e for e in events if rel.subject(e)]
        if not subjects:
            continue
        by = [e for e in events if rel.by(e)]
        for e in subjects:
            found = any(_stands(rel, e, b, skew) for b in by)
            if rel.effect == Effect.context_alone and not found:
                e.role = Role.context
            elif found and rel.effect == Effect.decided:
                e.last_resort = e.suggests = False
            elif found and rel.effect == Effect.proven:
                e.suggests = False
            elif found and rel.effect == Effect.doubted:
                e.suggests = True


def first_doubter(family: str, subject: Event, crashes: list[Event],
                  skew: float) -> Optional[Event]:
    """For a network error left only possible: of the crashes that doubted it, the rank's own
    known to come before it, as possible a cause (the rank that died of a CUDA error before its
    peers saw their connections fail)."""
    if family != DOUBTED_FAMILY:
        return None
    before = [c for c in crashes if c.source == Source.stderr
              and c.category is not None and precedes(c, subject, skew)]
    return earliest(before, skew) if before else None
