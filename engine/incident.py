"""What the stages hand each other: an incident (root events grouped per node and family), the
order between events, and the sources whose facts about the machine are trusted."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional

from .decode import Event
from .taxonomy import INFRASTRUCTURE, Category, Role, Source, Tag

if TYPE_CHECKING:
    from .correlate import Links

TRUSTED = {Source.kernel, Source.system, Source.gpu, Source.dcgm, Source.ib, Source.scheduler}
# Plain program faults that no hardware fault produces.
PROGRAM = {Category.application_error, Category.cuda_oom}


def precedes(a: Event, b: Event, skew: float = 0.0) -> bool:
    """True when a is known to have happened before b: earlier in the same file, or its time
    interval ends before the other's begins (with `skew` of tolerance between nodes)."""
    if a.line.doc == b.line.doc:
        return a.line.offset < b.line.offset
    if a.hi is None or b.lo is None:
        return False
    tol = skew if (a.node != b.node) else 0.0
    return a.hi + tol <= b.lo


def earliest(events: list[Event], skew: float) -> Event:
    """An event no other one is known to precede (first in input order among those)."""
    for e in events:
        if not any(precedes(o, e, skew) for o in events if o is not e):
            return e
    return events[0]


def proven(inc: "Incident", events: list[Event]) -> bool:
    """Whether the evidence proves the incident's cause rather than only suggesting it: one of
    its own root or confirming lines proves (rule_spec.proves), or a confirming line of the same
    category elsewhere in the job backs it on its node (the scheduler's OUT_OF_MEMORY state
    under a SIGKILL, its record of who cancelled under a bare cancel banner)."""
    own = {id(e) for e in inc.events}
    if any(e.role in (Role.root, Role.confirmation) and not e.suggests for e in inc.events):
        return True
    return any(id(e) not in own and e.role == Role.confirmation and not e.suggests
               and e.category == inc.category and Tag.teardown not in e.tags
               and (e.node is None or inc.node is None or e.node == inc.node) for e in events)


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
        self.fixed = self._decide()

    @property
    def category(self) -> Category:
        return self.fixed if self.fixed is not None else self._decide()

    def _decide(self) -> Category:
        roots = [e for e in self.events if e.role == Role.root]
        trusted = [e for e in roots if not e.weak and e.source in TRUSTED]
        # A hardware fact outranks a program-level one in the same incident (an Xid 48 beside
        # the Xid 31 it caused on the same GPU in the same second).
        strong = [e for e in trusted if e.category in INFRASTRUCTURE] or trusted or roots \
            or self.events
        if any(Tag.device_lost in e.tags for e in self.events if e.source in TRUSTED):
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


